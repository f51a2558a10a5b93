"""Sweeps: a capacity scenario's ``sweep:`` section (or ``--sweep``) -> resolved points -> table rows.

A capacity scenario is an ordinary scenario plus an optional ``sweep:`` mapping of knob -> values;
the points are the cartesian product, in the order the knobs are written::

    sweep:
      gpu: [a100-80gb, h100, h200]
      block_size: [8, 16, 32, 128]
      model+tensor_parallel:        # knobs joined by '+' vary together (zipped), not crossed
        - [llama-3.1-8b, 1]
        - [llama-3.1-70b, 4]

A knob is any scenario key, dotted for nested ones (``latency.mem_efficiency``,
``workload.num_requests``), except the rate (that is what the search varies) and the seed (see
``--seeds``). A point whose scenario is invalid or whose deployment is impossible (the weights
do not fit) becomes a failed point carrying its message; it does not stop the sweep.

``engine`` is a knob like the others (``sweep: {engine: [vllm-v1, vllm-v0, sglang]}``), and a
scenario listing several engines (``engine: [vllm-v1, sglang]``) is swept over them; an SGLang
or TensorRT-LLM point runs the engine's own paged pool (allocator ``paged``) whatever the
allocators listed.
"""

from __future__ import annotations

import copy
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from simulator.commands.capacity.disagg_search import PD_RATIO_KNOB, parse_pd_ratio, scenario_at_scale
from simulator.commands.capacity.search import Probe, SearchResult, limited_by
from simulator.config.deployment import Deployment, build_deployment
from simulator.engine.disagg import build_pools
from simulator.errors import KvplanError, unknown_name
from simulator.kv.gpus import get_gpu
from simulator.config.scenario import POOL_ENGINES, Scenario, parse_scenario, set_dotted
from simulator.yamlfile import parse_yaml, read_yaml
from workloads.spec import FixedLengths

SWEEP_KEY = "sweep"
NOT_SWEEPABLE = {"seed": "use --seeds", "workload.rate": "the search varies the rate",
                 "workload.rate_scale": "the search varies the rate",
                 "workload.arrival.rate": "the search varies the rate",
                 "workload.concurrency": "--search concurrency varies the clients",
                 "name": "", "description": ""}
# A steady window shorter than two request lifetimes (p99 E2E) is mostly ramp-up: the load never
# settled, and an SLO may hold only because the workload ended first.
MIN_WINDOW_PER_E2E = 2.0


@dataclass(frozen=True, slots=True)
class CapacityFile:
    """A capacity scenario as read: the scenario mapping (sweep removed) and the sweep."""

    data: dict[str, Any]
    sweep: dict[str, list[Any]]
    base_dir: Path
    where: str


def read_capacity_scenario(path: str | Path, overrides: dict[str, object] | None = None) -> CapacityFile:
    """Read ``path``, split off ``sweep:``, apply dotted ``overrides`` and check the rest is a
    valid scenario with an ``slo:`` that bounds at least one latency. Errors -> KvplanError."""
    p, where = Path(path), str(path)
    data = read_yaml(p, "scenario")
    if not isinstance(data, dict):
        raise KvplanError(f"{where}: a scenario is a mapping of keys (model, gpu, workload, ...)")
    sweep = data.pop(SWEEP_KEY, None) or {}
    if not isinstance(sweep, dict):
        raise KvplanError(f"{where}: sweep: a mapping of knob -> list of values")
    for key, values in sweep.items():
        check_knob(str(key), f"{where}: sweep")
        if not isinstance(values, list) or not values:
            raise KvplanError(f"{where}: sweep.{key}: a non-empty list of values")
    data.setdefault("name", p.stem)
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    scenario = parse_scenario(copy.deepcopy(data), where)
    swept = {part for key in sweep for part in str(key).split("+")}
    if len(scenario.engines) > 1 and "engine" not in swept:
        # several engines (as simulate runs them side by side) are a sweep over them
        sweep = {"engine": list(scenario.engines), **sweep}
        data["engine"] = scenario.engines[0]
    slo = scenario.slo
    if slo is None:
        raise KvplanError(f"{where}: capacity needs an 'slo:' section "
                          "(e.g. slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.1})")
    if slo.ttft_p99_s is None and slo.tpot_p99_s is None and slo.e2e_p99_s is None:
        raise KvplanError(f"{where}: slo: give at least one of ttft_p99_s, tpot_p99_s, e2e_p99_s")
    return CapacityFile(data, {str(k): v for k, v in sweep.items()}, p.parent, where)


def check_knob(key: str, where: str) -> None:
    """Raise KvplanError unless ``key`` (or each part of an ``a+b`` key) is a sweepable knob."""
    for part in key.split("+"):
        head = part.split(".")[0]
        if part == PD_RATIO_KNOB:  # not a scenario key: the GPU-count search's (disagg_search)
            continue
        if part in NOT_SWEEPABLE or head in ("name", "description", "seed"):
            why = NOT_SWEEPABLE.get(part) or NOT_SWEEPABLE.get(head, "")
            raise KvplanError(f"{where}: '{part}' cannot be swept" + (f" ({why})" if why else ""))
        if head not in Scenario.model_fields:
            raise KvplanError(f"{where}: {unknown_name('sweep knob', head, Scenario.model_fields)}")


def parse_sweep_arg(text: str) -> tuple[str, list[Any]]:
    """``"block_size=8,16,32"`` -> ``("block_size", [8, 16, 32])`` (values read as YAML scalars)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    items = [v.strip() for v in values.split(",")]
    if not sep or not key or not all(items):
        raise KvplanError(f"--sweep expects KEY=V1,V2,..., got '{text}'")
    if "+" in key:
        raise KvplanError(f"--sweep {key}: zipped knobs (a+b) go in the scenario's sweep: section")
    check_knob(key, "--sweep")
    if key == PD_RATIO_KNOB:  # "1:2" as YAML would be a base-60 integer (62)
        return key, items
    return key, [parse_yaml(v, f"--sweep {key}", lines=False) for v in items]  # YAML scalars; bad ones name the flag


def expand_sweep(sweep: dict[str, list[Any]], where: str) -> list[dict[str, Any]]:
    """The cartesian product as a list of ``{knob: value}`` (zipped knobs split), in order:
    the last knob varies fastest. No sweep -> one empty point."""
    axes: list[list[dict[str, Any]]] = []
    seen: set[str] = set()
    for key, values in sweep.items():
        parts = key.split("+")
        if seen & set(parts):
            raise KvplanError(f"{where}: sweep: '{sorted(seen & set(parts))[0]}' is swept twice")
        seen.update(parts)
        if len(parts) == 1:
            axes.append([{key: v} for v in values])
            continue
        axis = []
        for v in values:
            if not isinstance(v, list) or len(v) != len(parts):
                raise KvplanError(f"{where}: sweep.{key}: each value is a list of {len(parts)} "
                                  f"({', '.join(parts)}), got {v!r}")
            axis.append(dict(zip(parts, v)))
        axes.append(axis)
    return [{k: v for knobs in combo for k, v in knobs.items()} for combo in itertools.product(*axes)]


# --- resolved points ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One point: its knobs and either a resolved scenario and deployment, or an error.

    A disaggregated layout (:mod:`simulator.commands.capacity.disagg_search`) has ``pools``, its prefill
    and decode deployments at scale 1 of ``ratio``; ``deployment`` is then the decode pool's
    (where the KV figures come from, as in :mod:`simulator.engine.disagg`)."""

    index: int
    knobs: dict[str, Any]
    where: str
    data: dict[str, Any] | None
    scenario: Scenario | None
    deployment: Deployment | None
    error: str | None = None
    pools: tuple[Deployment, Deployment] | None = None
    ratio: tuple[int, int] | None = None  # prefill:decode replicas (None: aggregated)


def resolve_points(file: CapacityFile, *, disaggregated: bool = False) -> list[SweepPoint]:
    """Apply each point's knobs to the base scenario, validate it and size its deployment.

    ``disaggregated`` (the GPU-count search): a point with ``disaggregation:`` is a disaggregated
    layout, sized as its two pools at scale 1 of its P:D ratio (knob ``pd_ratio``, else the
    pools' own replicas); ``pd_ratio: agg`` drops ``disaggregation:``. Otherwise such a point
    fails as ``build_deployment`` says (the rate search has no disaggregated probe)."""
    points = []
    for i, knobs in enumerate(expand_sweep(file.sweep, file.where)):
        where = file.where + (f" [{format_knobs(knobs)}]" if knobs else "")
        data = copy.deepcopy(file.data)
        try:
            for key, value in knobs.items():
                if key != PD_RATIO_KNOB:
                    set_dotted(data, key, value)
            if "engine" in knobs and data.get("engine") in POOL_ENGINES and "allocators" not in knobs:
                # a sweep over engines: SGLang's and TensorRT-LLM's points run their own paged
                # pool (neither has contiguous KV), the others every listed allocator
                # (Scenario.allocators_of)
                data["allocators"] = ["paged"]
            ratio = _pd_ratio(data, knobs, where) if disaggregated else None
            if ratio is not None:
                data = scenario_at_scale(data, ratio, 1)
            scenario = parse_scenario(copy.deepcopy(data), where)
            if ratio is not None:
                pools = build_pools(scenario, file.base_dir, where=where)
                points.append(SweepPoint(i, knobs, where, data, scenario, pools[1], pools=pools, ratio=ratio))
                continue
            dep = build_deployment(scenario, file.base_dir)
        except KvplanError as err:
            points.append(SweepPoint(i, knobs, where, None, None, None, str(err)))
            continue
        points.append(SweepPoint(i, knobs, where, data, scenario, dep))
    return points


def _pd_ratio(data: dict[str, Any], knobs: dict[str, Any], where: str) -> tuple[int, int] | None:
    """The point's P:D ratio (None: aggregated); ``pd_ratio: agg`` removes ``disaggregation:``
    from ``data``. A ratio without ``disaggregation:`` (the pools' GPUs and link) is an error."""
    if PD_RATIO_KNOB not in knobs:
        pools = data.get("disaggregation")
        if not pools:
            return None
        return parse_pd_ratio(f"{pools.get('prefill', {}).get('replicas', 1)}:"
                              f"{pools.get('decode', {}).get('replicas', 1)}", where)
    ratio = parse_pd_ratio(knobs[PD_RATIO_KNOB], where)
    if ratio is None:
        data.pop("disaggregation", None)
    elif not data.get("disaggregation"):
        raise KvplanError(f"{where}: {PD_RATIO_KNOB} {knobs[PD_RATIO_KNOB]} needs disaggregation: in the "
                          "scenario (each pool's gpu and tensor_parallel, and the link)")
    return ratio


def format_knobs(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_text(v)}" for k, v in knobs.items())


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def seeds_for(scenario: Scenario, num_seeds: int, search: str = "rate") -> tuple[list[int], str | None]:
    """The seeds to search with, and a note when fewer than asked make sense: a trace's arrivals
    do not depend on the seed (only beam search draws from it), so it gets one seed; nor do
    fixed lengths sent without arrival times (a burst, or closed-loop clients)."""
    if num_seeds < 1:
        raise KvplanError(f"--seeds must be at least 1, got {num_seeds}")
    spec = scenario.workload
    if spec.trace is not None and spec.beam_width == 1 and num_seeds > 1:
        return [scenario.seed], "trace workload: the seed changes nothing, so 1 seed per point"
    untimed = spec.untimed or search == "concurrency"
    fixed = (untimed and spec.shared_prefix is None and spec.beam_width == 1
             and isinstance(spec.prompt_tokens, FixedLengths)
             and isinstance(spec.output_tokens, FixedLengths))
    if fixed and num_seeds > 1:
        return [scenario.seed], ("fixed lengths sent without arrival times: the seed changes nothing, "
                                 "so 1 seed")
    return [scenario.seed + k for k in range(num_seeds)], None


# --- table rows -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One (point, allocator) of the capacity table; metrics are over seeds at each seed's
    maximum rate (means; concurrency and KV peak: maxima). ``None`` = not applicable. Throughput,
    goodput and $/M tok are over each probe's steady window (:mod:`simulator.commands.capacity.search`),
    of ``window_s`` seconds (mean over seeds)."""

    point_index: int
    knobs: dict[str, Any]
    allocator: str
    status: str  # ok | unbounded | slo-unmet | failed
    max_rate_req_s: float | None = None  # mean over seeds of the highest passing rate
    rate_ci_low_req_s: float | None = None  # lowest passing rate of any seed
    rate_ci_high_req_s: float | None = None  # highest failing rate of any seed (None: unbounded)
    num_seeds: int = 0
    throughput_tok_s: float | None = None
    goodput_req_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    kv_capacity_tokens: int | None = None
    max_concurrency: int | None = None
    limited_by: str | None = None
    kv_used_peak: float | None = None
    num_gpus: int | None = None
    rate_per_gpu_req_s: float | None = None
    price_usd_per_gpu_hour: float | None = None
    usd_per_m_output_tokens: float | None = None
    message: str = ""
    # concurrency search (``search == "concurrency"``); max_rate_req_s is then the rate achieved
    search: str = "rate"
    max_clients: float | None = None  # mean over seeds of the most clients that passed
    clients_ci_low: int | None = None  # fewest of those over seeds
    clients_ci_high: int | None = None  # most clients that failed, over seeds (None: unbounded)
    tok_s_per_gpu: float | None = None  # output tok/s per GPU at the max
    tok_s_per_user: float | None = None  # output tok/s per client at the max (vLLM's tokens/s/user)
    window_s: float | None = None  # the steady window the rates are over (mean over seeds)
    window_note: str = ""  # none, or too short a steady window: the rates deserve a caveat


RATE_ONLY_FIELDS = ("rate_ci_low_req_s", "rate_ci_high_req_s")
CONCURRENCY_ONLY_FIELDS = ("max_clients", "clients_ci_low", "clients_ci_high", "tok_s_per_gpu",
                           "tok_s_per_user")


def failed_row(point: SweepPoint, allocator: str, search: str = "rate") -> CapacityRow:
    return CapacityRow(point.index, point.knobs, allocator, "failed", message=point.error or "",
                       search=search)


def summarize_searches(point: SweepPoint, allocator: str, results: Sequence[SearchResult],
                       price_usd_per_gpu_hour: float | None, note: str | None = None) -> CapacityRow:
    """Fold one (point, allocator)'s per-seed searches into a table row."""
    assert point.deployment is not None and point.scenario is not None and results
    if results[0].search == "concurrency":
        return _summarize_clients(point, allocator, results, price_usd_per_gpu_hour, note)
    dep = point.deployment
    num_gpus = dep.capacity.tp * point.scenario.num_replicas
    los = [r.lo_rate_req_s for r in results]
    his = [r.hi_rate_req_s for r in results]
    at_max = [r.at_max for r in results if r.at_max is not None]
    base = dict(point_index=point.index, knobs=point.knobs, allocator=allocator, num_seeds=len(results),
                kv_capacity_tokens=dep.capacity_tokens, num_gpus=num_gpus,
                price_usd_per_gpu_hour=price_usd_per_gpu_hour)
    if not at_max:
        lowest = min((p for r in results for p in r.probes), key=lambda p: p.rate_req_s)
        return CapacityRow(**base, status="slo-unmet", max_rate_req_s=0.0, rate_ci_low_req_s=0.0,
                           rate_ci_high_req_s=min(h for h in his if h is not None),
                           message=f"SLO fails even at {lowest.rate_req_s:.4g} req/s: "
                                   + "; ".join(lowest.failures))
    rate = statistics.fmean(los)
    tok_s = statistics.fmean(p.throughput_tok_s for p in at_max)
    usd = usd_per_m_tokens(price_usd_per_gpu_hour, num_gpus, tok_s)
    unbounded = any(h is None for h in his)
    messages = [note] if note else []
    if unbounded:
        messages.append(f"SLO holds at every rate tried (up to {max(los):.4g} req/s): the workload "
                        "is too short to load the system; raise workload.num_requests")
    return CapacityRow(
        **base, status="unbounded" if unbounded else "ok", max_rate_req_s=rate,
        rate_ci_low_req_s=min(los),
        rate_ci_high_req_s=None if unbounded else max(h for h in his if h is not None),
        throughput_tok_s=tok_s, goodput_req_s=statistics.fmean(p.goodput_req_s for p in at_max),
        ttft_p99_s=_mean([p.ttft_p99_s for p in at_max]), tpot_p99_s=_mean([p.tpot_p99_s for p in at_max]),
        max_concurrency=max(p.max_batch_size for p in at_max),
        limited_by="/".join(sorted({limited_by(p, dep.scheduler_config.max_num_seqs) for p in at_max})),
        kv_used_peak=max((p.kv_used_peak for p in at_max if p.kv_used_peak is not None), default=None),
        rate_per_gpu_req_s=rate / num_gpus, usd_per_m_output_tokens=usd, message="; ".join(messages),
        window_s=statistics.fmean(p.window_s for p in at_max),
        window_note="; ".join(window_caveats(at_max)),
    )


def _summarize_clients(point: SweepPoint, allocator: str, results: Sequence[SearchResult],
                       price_usd_per_gpu_hour: float | None, note: str | None) -> CapacityRow:
    """:func:`summarize_searches` for a concurrency search: the answer is a number of clients."""
    assert point.deployment is not None and point.scenario is not None
    dep = point.deployment
    num_gpus = dep.capacity.tp * point.scenario.num_replicas
    los = [r.lo_concurrency or 0 for r in results]
    his = [r.hi_concurrency for r in results]
    at_max = [r.at_max for r in results if r.at_max is not None]
    base = dict(point_index=point.index, knobs=point.knobs, allocator=allocator, num_seeds=len(results),
                kv_capacity_tokens=dep.capacity_tokens, num_gpus=num_gpus,
                price_usd_per_gpu_hour=price_usd_per_gpu_hour, search="concurrency")
    if not at_max:
        first = min((p for r in results for p in r.probes), key=lambda p: p.concurrency or 0)
        return CapacityRow(**base, status="slo-unmet", max_clients=0.0, clients_ci_low=0,
                           clients_ci_high=min(h for h in his if h is not None),
                           message=f"SLO fails even with {first.concurrency} client(s): "
                                   + "; ".join(first.failures))
    tok_s = statistics.fmean(p.throughput_tok_s for p in at_max)
    usd = usd_per_m_tokens(price_usd_per_gpu_hour, num_gpus, tok_s)
    unbounded = any(h is None for h in his)
    messages = [note] if note else []
    if unbounded:
        messages.append(f"SLO holds with every number of clients tried (up to {max(los)}): more "
                        "only wait in the server's queue or exceed the workload's requests")
    rate = statistics.fmean(p.rate_req_s for p in at_max)
    return CapacityRow(
        **base, status="unbounded" if unbounded else "ok", max_rate_req_s=rate,
        max_clients=statistics.fmean(los), clients_ci_low=min(los),
        clients_ci_high=None if unbounded else max(h for h in his if h is not None),
        throughput_tok_s=tok_s, goodput_req_s=statistics.fmean(p.goodput_req_s for p in at_max),
        ttft_p99_s=_mean([p.ttft_p99_s for p in at_max]), tpot_p99_s=_mean([p.tpot_p99_s for p in at_max]),
        max_concurrency=max(p.max_batch_size for p in at_max),
        limited_by="/".join(sorted({limited_by(p, dep.scheduler_config.max_num_seqs) for p in at_max})),
        kv_used_peak=max((p.kv_used_peak for p in at_max if p.kv_used_peak is not None), default=None),
        rate_per_gpu_req_s=rate / num_gpus, usd_per_m_output_tokens=usd, message="; ".join(messages),
        tok_s_per_gpu=tok_s / num_gpus,
        tok_s_per_user=statistics.fmean(p.throughput_tok_s / (p.concurrency or 1) for p in at_max),
        window_s=statistics.fmean(p.window_s for p in at_max),
        window_note="; ".join(window_caveats(at_max)),
    )


def window_caveats(at_max: Sequence[Probe]) -> list[str]:
    """What the table must say about the windows its rates were measured over: none at all
    (every measured request sent at once), or one too short to have settled."""
    caveats = []
    if any(not p.steady for p in at_max):
        caveats.append("no steady window (every measured request was sent at once): rates are over "
                       "the whole run, drain included")
    short = [p for p in at_max if p.steady and p.e2e_p99_s is not None
             and p.window_s < MIN_WINDOW_PER_E2E * p.e2e_p99_s]
    if short:
        p = min(short, key=lambda q: q.window_s / (q.e2e_p99_s or 1.0))
        caveats.append(f"the steady window ({p.window_s:.3g} s) is shorter than {MIN_WINDOW_PER_E2E:g} × "
                       f"the p99 E2E ({p.e2e_p99_s:.3g} s): the load never settled and the SLO may hold "
                       "only because the workload ended; raise workload.num_requests")
    return caveats


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(present) if present else None


def parse_price_arg(text: str) -> tuple[str, float]:
    """``"h100=2.49"`` -> ``("H100-80GB", 2.49)``: a GPU's price per GPU-hour in USD."""
    name, sep, value = text.partition("=")
    try:
        price = float(value)
    except ValueError:
        price = math.nan
    if not sep or not name.strip() or not (price > 0 and math.isfinite(price)):
        raise KvplanError(f"--price expects GPU=USD_PER_HOUR (a positive number), got '{text}'")
    return get_gpu(name.strip()).name, price


def gpu_price(dep: Deployment, overrides: dict[str, float]) -> float | None:
    """USD per GPU-hour: ``--price`` first, else the GPU catalog's typical on-demand price
    (sources in simulator/kv/gpus.py); None when neither is known."""
    price = overrides.get(dep.gpu.name, dep.gpu.price_usd_per_hour)
    return price if price and price > 0 else None


def usd_per_m_tokens(price_usd_per_gpu_hour: float | None, num_gpus: int, tok_s: float) -> float | None:
    """$ per million generated tokens: price per GPU-hour × GPUs / (3600 × tok/s) × 10^6."""
    if price_usd_per_gpu_hour is None or tok_s <= 0:
        return None
    return price_usd_per_gpu_hour * num_gpus / (3600.0 * tok_s) * 1e6


def csv_cell(value: Any) -> str:
    """One CSV cell: empty for None, 6 significant digits for floats, commas between list items."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)
