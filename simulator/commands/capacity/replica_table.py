"""The GPU-count table of ``kvplan capacity --target-rate``: one row per (point, allocator, target).

A row folds one (point, allocator, target rate)'s per-seed replica searches
(:mod:`simulator.commands.capacity.replicas`)::

    replicas   the most any seed needed: the count that held every seed's traffic
    range      [fewest any seed needed, most any seed needed] (counts are exact: no tolerance)
    GPUs       replicas × tensor_parallel (× data_parallel_size)
    $/h        price per GPU-hour × GPUs
    $/M tok    $/h / (3600 × output tok/s) × 10⁶, the output tok/s at the target (mean over seeds)
    req/s/GPU  target rate / GPUs
    layout     agg TP2 ×3 (3 replicas of TP 2), or disagg P2×TP2 : D4×TP2 (2 prefill replicas of
               TP 2, 4 decode replicas of TP 2): replicas and GPUs then count both pools, $/h
               prices each pool's GPUs, and the range is in replicas of both pools
    tok/s/GPU  output tok/s at the target / GPUs
    tok/s/user 1 / mean TPOT at the target (mean over seeds): the token rate one stream sees,
               as NVIDIA's AIConfigurator reports "tokens/s/user" (1000 / TPOT in ms: its README's
               worked example, ai-dynamo/aiconfigurator README.md, TPOT 8.07 ms <-> 123.92)

The latencies, output tok/s and goodput are each seed's at its own smallest count, averaged over
seeds (a seed that needed fewer replicas than the row's count is measured at its fewer: the
latencies are those of the tightest deployment that held).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from simulator.commands.capacity.disagg_search import aggregated_kind, layout_label
from simulator.commands.capacity.replicas import ReplicaResult
from simulator.commands.capacity.search import limited_by
from simulator.commands.capacity.sweep import SweepPoint, csv_cell, gpu_price, usd_per_m_tokens, window_caveats
from simulator.commands.capacity.table import Column, print_fitted

TITLE = "fewest replicas that hold the target rate under the SLO"
# the rows' statuses: ok (every seed held with at most --max-replicas), over-max (some seed did
# not), slo-unmet (rejections fail the SLO at every count), failed (the point cannot be built)
BLANK_STATUSES = ("failed", "slo-unmet", "over-max")


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One (point, allocator, target rate); ``None`` = not applicable (no answer)."""

    point_index: int
    knobs: dict[str, Any]
    allocator: str
    target_rate_req_s: float | None
    status: str  # ok | over-max | slo-unmet | failed (BLANK_STATUSES)
    layout: str = ""  # agg TP2 ×3 | disagg P2×TP2 : D4×TP2 (module docstring)
    layout_kind: str = ""  # the layout without counts: agg TP2 | disagg 1:2 TP2/TP2 (prefill/decode TP)
    num_replicas: int | None = None  # the most any seed needed (disaggregated: both pools)
    replicas_ci_low: int | None = None  # the fewest any seed needed
    replicas_ci_high: int | None = None
    num_gpus: int | None = None  # num_replicas × tensor_parallel × data_parallel_size
    gpus_per_replica: int | None = None  # the point's tensor_parallel (disaggregated: None)
    bound_replicas: int | None = None  # ⌈R / U₁⌉, the analytic lower bound the searches started at
    max_replicas: int | None = None  # disaggregated: both pools' at the largest scale searched
    usd_per_hour: float | None = None
    usd_per_m_output_tokens: float | None = None
    price_usd_per_gpu_hour: float | None = None
    rate_per_gpu_req_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    throughput_tok_s: float | None = None
    goodput_req_s: float | None = None
    limited_by: str | None = None
    kv_used_peak: float | None = None
    num_seeds: int = 0
    num_probes: int = 0  # simulations the seeds' searches asked for (cached or not)
    window_s: float | None = None
    message: str = ""
    window_note: str = ""
    max_gpus: int | None = None  # the GPUs at max_replicas: where a layout that held nothing stops
    prefill_replicas: int | None = None  # disaggregated layouts only
    decode_replicas: int | None = None
    tok_s_per_gpu: float | None = None
    tok_s_per_user: float | None = None  # 1 / mean TPOT (module docstring)
    # a disaggregated layout's prefill:decode ratio, reduced ("1:2"; None: aggregated); the
    # pd_ratio knob's column, when swept, holds it as written
    pool_ratio: str | None = None
    setup: str = ""  # model and GPU ("Llama-3.1-70B on H100"; disaggregated: prefill -> decode GPU)
    router: str = ""  # the routing policy the replicas ran behind (the scenario's router.policy)


ROW_FIELDS = tuple(f.name for f in dataclasses.fields(ReplicaRow) if f.name not in ("knobs", "point_index"))


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """What one step of a point's count adds: replicas and GPUs (aggregated: one replica of TP
    GPUs; disaggregated: ``p`` prefill and ``d`` decode replicas) and their USD per hour (None
    when a GPU has no price)."""

    ratio: tuple[int, int] | None
    replicas: int
    gpus: int
    usd_per_hour: float | None
    tp: int
    prefill_tp: int | None = None
    decode_tp: int | None = None
    dp: int = 1  # data-parallel engines per replica (aggregated)
    expert_parallel: bool = False


def point_shape(point: SweepPoint, prices: dict[str, float]) -> Shape:
    """The :class:`Shape` of a built point (``prices``: the ``--price`` overrides)."""
    assert point.deployment is not None
    if point.pools is None or point.ratio is None:
        tp = point.deployment.capacity.tp
        dp = point.deployment.capacity.dp
        gpus = tp * dp  # a replica is dp engines of tp GPUs each
        price = gpu_price(point.deployment, prices)
        return Shape(None, 1, gpus, price * gpus if price else None, tp, dp=dp,
                     expert_parallel=point.deployment.capacity.ep > 1)
    (p, d), (prefill, decode) = point.ratio, point.pools
    tp_p, tp_d = prefill.capacity.tp, decode.capacity.tp
    price_p, price_d = gpu_price(prefill, prices), gpu_price(decode, prices)
    usd = p * tp_p * price_p + d * tp_d * price_d if price_p and price_d else None
    return Shape((p, d), p + d, p * tp_p + d * tp_d, usd, tp_d, tp_p, tp_d)


def point_setup(point: SweepPoint) -> str:
    """``"<model> on <GPU>"``; a disaggregated layout on two GPU types: ``"<model> on <prefill
    GPU> -> <decode GPU>"``. The panels of the agg-vs-disagg plot."""
    assert point.deployment is not None
    gpus = [point.deployment.gpu.name]
    if point.pools is not None and point.pools[0].gpu.name != gpus[0]:
        gpus.insert(0, point.pools[0].gpu.name)
    return f"{point.deployment.model.name} on {' -> '.join(gpus)}"


def summarize_replicas(point: SweepPoint, allocator: str, results: Sequence[ReplicaResult],
                       prices: dict[str, float], note: str | None = None) -> ReplicaRow:
    """Fold one (point, allocator, target)'s per-seed searches into a row (module docstring).
    A seed's count is a number of replicas (aggregated) or a scale of the P:D ratio."""
    assert point.deployment is not None and results
    shape = point_shape(point, prices)
    rate = results[0].target_rate_req_s

    def label(count: int | None) -> str:
        return layout_label(shape.ratio, count, shape.tp, prefill_tp=shape.prefill_tp,
                            decode_tp=shape.decode_tp, dp=shape.dp, expert_parallel=shape.expert_parallel)

    def counts(scale: int) -> str:  # "4", or a disaggregated layout's "P4 : D8"
        return f"P{shape.ratio[0] * scale} : D{shape.ratio[1] * scale}" if shape.ratio else str(scale)

    base: dict[str, Any] = dict(
        point_index=point.index, knobs=point.knobs, allocator=allocator, target_rate_req_s=rate,
        pool_ratio=f"{shape.ratio[0]}:{shape.ratio[1]}" if shape.ratio else None, setup=point_setup(point),
        router=point.scenario.router.policy if point.scenario is not None else "",
        layout_kind=(f"disagg {shape.ratio[0]}:{shape.ratio[1]} TP{shape.prefill_tp}/TP{shape.decode_tp}"
                     if shape.ratio else aggregated_kind(shape.tp, shape.dp, shape.expert_parallel)),
        gpus_per_replica=None if shape.ratio else shape.gpus,
        bound_replicas=max(r.start for r in results) * shape.replicas,
        max_replicas=results[0].max_replicas * shape.replicas, max_gpus=results[0].max_replicas * shape.gpus,
        price_usd_per_gpu_hour=shape.usd_per_hour / shape.gpus if shape.usd_per_hour else None,
        num_seeds=len(results), num_probes=sum(len(r.counts) for r in results))
    messages = [note] if note else []
    unmet = [r for r in results if r.num_replicas is None]
    if unmet:
        first = unmet[0]  # the first seed without an answer says why
        last = first.probes[-1]
        if first.everywhere:
            status, why = "slo-unmet", (f"SLO fails at {rate:.4g} req/s with any number of replicas: "
                                        + "; ".join(last.failures))
        else:
            most = first.max_replicas
            status, why = "over-max", (f"cannot hold {rate:.4g} req/s with up to {counts(most)} replicas "
                                       f"({most * shape.gpus} GPUs): at {counts(first.counts[-1])}, "
                                       + "; ".join(last.failures))
        return ReplicaRow(**base, status=status, layout=label(None), message="; ".join([*messages, why]))
    counts = [r.num_replicas for r in results if r.num_replicas is not None]
    at = [r.at_answer for r in results if r.at_answer is not None]
    scale = max(counts)
    gpus = scale * shape.gpus
    usd_per_hour = shape.usd_per_hour * scale if shape.usd_per_hour else None
    tok_s = statistics.fmean(p.throughput_tok_s for p in at)
    tpot_mean = _mean([p.tpot_mean_s for p in at])
    max_num_seqs = point.deployment.scheduler_config.max_num_seqs
    return ReplicaRow(
        **base, status="ok", layout=label(scale), num_replicas=scale * shape.replicas,
        replicas_ci_low=min(counts) * shape.replicas, replicas_ci_high=scale * shape.replicas,
        prefill_replicas=scale * shape.ratio[0] if shape.ratio else None,
        decode_replicas=scale * shape.ratio[1] if shape.ratio else None,
        num_gpus=gpus, usd_per_hour=usd_per_hour,
        usd_per_m_output_tokens=usd_per_m_tokens(usd_per_hour / gpus if usd_per_hour else None, gpus, tok_s),
        rate_per_gpu_req_s=rate / gpus, ttft_p99_s=_mean([p.ttft_p99_s for p in at]),
        tpot_p99_s=_mean([p.tpot_p99_s for p in at]), throughput_tok_s=tok_s,
        tok_s_per_gpu=tok_s / gpus, tok_s_per_user=1.0 / tpot_mean if tpot_mean else None,
        goodput_req_s=statistics.fmean(p.goodput_req_s for p in at),
        limited_by="/".join(sorted({limited_by(p, max_num_seqs) for p in at})),
        kv_used_peak=max((p.kv_used_peak for p in at if p.kv_used_peak is not None), default=None),
        window_s=statistics.fmean(p.window_s for p in at), message="; ".join(messages),
        window_note="; ".join(window_caveats(at)))


def failed_row(point: SweepPoint) -> ReplicaRow:
    """A point that could not be built (no allocator, no target: its workload was not read)."""
    return ReplicaRow(point.index, point.knobs, "", None, "failed", message=point.error or "")


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def write_replica_csv(path: Path, rows: Sequence[ReplicaRow]) -> None:
    """One line per row: ``point``, the knobs (their union, in sweep order), then every field."""
    knobs = list(dict.fromkeys(k for r in rows for k in r.knobs if k != "allocators"))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["point", *knobs, *ROW_FIELDS])
        for r in rows:
            writer.writerow([r.point_index, *(csv_cell(r.knobs.get(k)) for k in knobs),
                             *(csv_cell(getattr(r, name)) for name in ROW_FIELDS)])


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _range(r: ReplicaRow) -> str:
    return f"[{r.replicas_ci_low}, {r.replicas_ci_high}]"


# In display order; the answer (replicas, GPUs) never goes, then cost, then latency.
COLUMNS: tuple[Column, ...] = (
    Column("layout", 0, lambda r: r.layout),
    Column("replicas", 0, lambda r: str(r.num_replicas)),
    Column("range", 6, _range),
    Column("GPUs", 0, lambda r: str(r.num_gpus)),
    Column("$/h", 1, lambda r: _num(r.usd_per_hour, ",.2f")),
    Column("$/M tok", 2, lambda r: _num(r.usd_per_m_output_tokens, ".3f")),
    Column("TTFT p99", 3, lambda r: _num(r.ttft_p99_s)),
    Column("TPOT p99", 4, lambda r: _num(r.tpot_p99_s)),
    Column("req/s/GPU", 5, lambda r: _num(r.rate_per_gpu_req_s)),
    Column("tok/s/GPU", 5, lambda r: _num(r.tok_s_per_gpu, ".4g")),
    Column("tok/s/user", 5, lambda r: _num(r.tok_s_per_user, ".4g")),
    Column("bound", 7, lambda r: str(r.bound_replicas)),
)
TARGET_COLUMN = Column("target req/s", 0, lambda r: _num(r.target_rate_req_s, ".4g"))


def routing_text(rows: Sequence[ReplicaRow]) -> str:
    """How the rows' replicas were routed: ``round-robin routing``, or, where points ran behind
    different policies, each (``routing per point: least-outstanding, round-robin``)."""
    policies = list(dict.fromkeys(r.router for r in rows if r.router))
    if not policies:  # no point could be built: none was routed
        return ""
    if len(policies) == 1:
        return f"{policies[0]} routing"
    return f"routing per point (capacity.csv's router column): {', '.join(policies)}"


def print_replica_table(console: Console, rows: Sequence[ReplicaRow], notes: dict[int, str],
                        out_dir: Path | None, elapsed_s: float) -> list[str]:
    """Print the table fitted to the console (one target: it goes to the title), the lines
    under it (rows without an answer and why, window caveats, notes) and where the files went.
    Returns the headers left out for width."""
    targets = list(dict.fromkeys(r.target_rate_req_s for r in rows))
    heading = TITLE
    columns = COLUMNS
    if len(targets) == 1 and targets[0] is not None:
        heading += f" — target {targets[0]:.4g} req/s"
    else:
        columns = (TARGET_COLUMN, *COLUMNS)
    dropped = print_fitted(console, heading, columns, rows, BLANK_STATUSES)
    routing = routing_text(rows)
    console.print(f"replicas: data-parallel copies of the TP group{', ' + routing if routing else ''}; GPUs = "
                  "replicas × TP (disagg: prefill and decode pools together); latencies measured at "
                  "the target rate; tok/s/user = 1 / mean TPOT", markup=False)
    for r in rows:
        who = f"point {r.point_index}" + (f" {r.allocator}" if r.allocator else "")
        who += f" at {r.target_rate_req_s:.4g} req/s" if len(targets) > 1 and r.target_rate_req_s else ""
        if r.status != "ok":
            console.print(f"{who} {r.status}: {r.message}", markup=False)
        if r.window_note:
            console.print(f"{who}: {r.window_note}", markup=False)
    for note in sorted(set(notes.values())):
        console.print(f"note: {note}", markup=False)
    if out_dir is not None:
        console.print(f"wrote {out_dir / 'capacity.csv'} and capacity.json ({elapsed_s:.1f} s)", markup=False)
    return dropped
