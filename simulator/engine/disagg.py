"""Prefill/decode disaggregation (``disaggregation:`` in a scenario): a request prefills on a
prefill replica, its prompt's KV moves over that replica's link, and it decodes on a decode
replica, as vLLM's disaggregated serving with NixlConnector (and NVIDIA Dynamo, llm-d on it) runs.

The whole simulator is reused, in two passes and a link model between them:

1. **Prefill pool.** :func:`simulator.engine.core.simulate` replays the requests with
   ``output_tokens = 1`` on the prefill deployment (its GPU, tensor parallelism, replicas and
   router): each request's prefill replica, admission and first token come from it. The prefill
   side frees a request's KV when its first token is out. vLLM keeps those blocks until the
   decode side has pulled them (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
   ``NixlConnectorScheduler.request_finished`` returns ``delay_free_blocks``; the blocks are
   freed when the worker reports the send finished): this model gives the prefill pool that
   memory back a transfer early, which understates its KV pressure when the link queues.
2. **Link.** Each prefill replica sends one transfer at a time, in the order its requests' first
   tokens came out: ``start = max(first token, link free)``, ``done = start + latency_s +
   bytes / bandwidth``, ``bytes = prompt tokens × β`` where β is the whole request's KV per
   token in the *decode* side's layout (its KV dtype; ``bytes_per_token`` is per rank,
   simulator/kv/sizing.py ``KVCapacity``, so × its tensor-parallel ranks: every decode rank
   pulls its heads' share). The whole prompt moves: vLLM's decode side pulls only what its own
   prefix cache lacks (``get_num_new_matched_tokens`` counts tokens beyond the local hits),
   which the link cannot know before the decode side admits the request.
3. **Decode pool.** ``simulate`` again, on the decode deployment: each request arrives when its
   transfer is done, with ``kv_ready_tokens`` = its prompt (simulator/scheduler/v1.py: blocks
   for every token, the last prompt token recomputed, as vLLM's decode side does). vLLM's decode
   side allocates those blocks when it admits the request, before the pull
   (WAITING_FOR_REMOTE_KVS); here they are taken when the pull is done, so the decode pool's KV
   pressure is understated by the blocks held during transfers.
4. **Merge** into one run of allocator ``paged``: a request's arrival is its original arrival,
   its admission the prefill side's, its first token the *prefill* side's (the disaggregated
   TTFT: the prefill replica's first token, before the transfer; the decode side's first token
   is what a client behind vLLM's toy proxy sees, reported beside it as
   ``disaggregation.ttft_decode_side_s``), its finish the decode side's; TPOT is the decode
   side's (decode first token to last, over output - 1 tokens). A request rejected on either
   side is rejected with that side's reason. Step rows hold both pools, replicas numbered
   prefill first, then decode. The summary's step and KV figures (``kv``, ``num_steps``,
   ``busy_fraction``, batch sizes) describe the decode pool (``kv_pool: decode``); its
   preemption count sums both pools and its prefix-hit rate is the prefill pool's (where
   prompts are computed). ``disaggregation`` in the summary has each pool's figures, the
   transfers and the bytes moved.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from array import array
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import numpy as np

from simulator.config.deployment import Deployment, build_deployment
from simulator.config.scenario import LinkSpec, PoolSpec, Scenario
from simulator.engine import metrics
from simulator.engine.core import SimResult, TimesTable
from simulator.engine.runs import AllocatorRun, run_allocator
from simulator.errors import KvplanError
from simulator.scheduler import Status
from simulator.engine.steps import DEFAULT_BIN_S
from workloads.clients import OPEN_LOOP, Clients
from workloads.request import Request

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress


def build_pools(scenario: Scenario, base_dir: Path, *, force_profile: bool = False,
                where: str = "scenario") -> tuple[Deployment, Deployment]:
    """The prefill and decode deployments of ``scenario.disaggregation``: the scenario with each
    side's GPU, tensor parallelism and replicas; each sizes its own KV pool and latency model."""
    spec = scenario.disaggregation
    if spec is None:
        raise KvplanError(f"{where}: no disaggregation: key")

    def side(pool: PoolSpec, name: str) -> Deployment:
        update = {"gpu": pool.gpu or scenario.gpu,
                  "tensor_parallel": pool.tensor_parallel or scenario.tensor_parallel,
                  "num_replicas": pool.replicas, "disaggregation": None}
        return build_deployment(scenario.model_copy(update=update), base_dir,
                                force_profile=force_profile, where=f"{where}: disaggregation.{name}")

    return side(spec.prefill, "prefill"), side(spec.decode, "decode")


def kv_bytes_per_token(decode: Deployment) -> int:
    """β moved per prompt token: the decode side's per-rank bytes per token × its ranks."""
    return decode.capacity.bytes_per_token * decode.capacity.tp


@dataclasses.dataclass(frozen=True)
class Transfers:
    """The link's schedule: per request (by position in the workload), when its transfer started
    and ended (NaN: not transferred, rejected on the prefill side), and the bytes moved in all."""

    start_s: np.ndarray
    done_s: np.ndarray
    bytes_moved: int


def link_schedule(first_token_s: np.ndarray, replica: np.ndarray, prompt_tokens: np.ndarray,
                  sent: np.ndarray, bytes_per_token: int, link: LinkSpec) -> Transfers:
    """One transfer at a time per prefill replica, in the order the first tokens came out (ties:
    workload order): ``start = max(first token, link free)``, ``done = start + latency_s +
    prompt × β / bandwidth``. ``sent``: which requests transfer."""
    n = len(first_token_s)
    start = np.full(n, math.nan)
    done = np.full(n, math.nan)
    rate = link.bandwidth_gb_s * 1e9
    free: dict[int, float] = {}
    moved = 0
    idx = np.flatnonzero(sent)
    for i in idx[np.argsort(first_token_s[idx], kind="stable")].tolist():
        rep = int(replica[i])
        nbytes = int(prompt_tokens[i]) * bytes_per_token
        s = max(float(first_token_s[i]), free.get(rep, 0.0))
        start[i] = s
        done[i] = free[rep] = s + link.latency_s + nbytes / rate
        moved += nbytes
    return Transfers(start, done, moved)


def _stats(values: np.ndarray) -> dict[str, float | None]:
    v = values[~np.isnan(values)]
    if not len(v):
        return {"mean": None, "p50": None, "p99": None, "max": None}
    p50, p99 = np.percentile(v, [50, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p99": float(p99), "max": float(v.max())}


def _pool_figures(dep: Deployment, summary: dict[str, Any]) -> dict[str, Any]:
    kv = summary["kv"]
    return {
        "replicas": dep.scenario.num_replicas,
        "gpu": dep.gpu.name,
        "tensor_parallel": dep.capacity.tp,
        "gpus": dep.scenario.num_replicas * dep.capacity.tp,
        "kv_capacity_tokens": dep.capacity_tokens,
        "kv_peak_token_state": kv["peak_token_state"],
        "kv_mean_token_state": kv["token_state"],
        "num_preemptions": summary["num_preemptions"],
        "busy_fraction": summary["busy_fraction"],
        "num_steps": summary["num_steps"],
        "prefix_hit_rate": summary["prefix_hit_rate"],
        "completed": summary["completed"],
        "rejected": summary["rejected"],
    }


CLOSED_LOOP_REFUSED = ("disaggregation: open-loop workloads only (the decode side's arrivals come from the "
                       "prefill side's run): drop workload.concurrency, or give an arrival rate")


def simulate_disaggregated(prefill: Deployment, decode: Deployment, link: LinkSpec,
                           requests: list[Request], *, clients: Clients = OPEN_LOOP,
                           progress: Progress | None = None, record_steps: bool | str = True,
                           step_bin_s: float = DEFAULT_BIN_S) -> tuple[AllocatorRun, AllocatorRun, AllocatorRun]:
    """Run the two passes and the link (module docstring) and merge them: the merged
    :class:`simulator.engine.runs.AllocatorRun` (named ``paged``), and the two passes' runs."""
    if clients.gated:
        raise KvplanError(CLOSED_LOOP_REFUSED)
    n = len(requests)
    first = [dataclasses.replace(r, output_tokens=1) for r in requests]
    run_p = run_allocator(prefill, "paged", first, progress=progress, record_steps=record_steps,
                          step_bin_s=step_bin_s, name="prefill")
    res_p, cols_p = run_p.result, run_p.request_columns
    times_p = res_p.times
    first_token = np.frombuffer(times_p.first_token_s, dtype=np.float64)
    prefilled = np.array([g is not None and g.status is Status.FINISHED for g in res_p.groups],
                         dtype=bool)
    beta = kv_bytes_per_token(decode)
    transfers = link_schedule(first_token, cols_p["replica"], cols_p["prompt_tokens"], prefilled,
                              beta, link)
    moved = np.flatnonzero(prefilled)
    order = moved[np.argsort(transfers.done_s[moved], kind="stable")]
    second = [dataclasses.replace(requests[i], arrival_s=float(transfers.done_s[i]),
                                  kv_ready_tokens=requests[i].prompt_tokens) for i in order.tolist()]
    run_d = run_allocator(decode, "paged", second, progress=progress, record_steps=record_steps,
                          step_bin_s=step_bin_s, name="decode")
    res_d, cols_d = run_d.result, run_d.request_columns
    decoded = np.zeros(n, dtype=bool)
    decoded[order] = True

    def from_decode(values: Any, fill: Any, dtype: Any) -> np.ndarray:
        """A decode-pass column laid out by workload position (``fill`` where not decoded)."""
        out = np.full(n, fill, dtype=dtype)
        out[order] = np.asarray(values, dtype=dtype)
        return out

    def either(name: str, dtype: Any = None) -> np.ndarray:  # the decode side's where it got there
        p = np.asarray(cols_p[name], dtype=dtype)
        return np.where(decoded, from_decode(cols_d[name], 0, p.dtype), p)

    def both(name: str) -> np.ndarray:
        return np.asarray(cols_p[name]) + from_decode(cols_d[name], 0, np.int64)

    front = res_p.request_overhead_s
    arrival = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n)
    status = either("status", object)
    done = status == Status.FINISHED.value
    finished = from_decode(np.frombuffer(res_d.times.finished_s, dtype=np.float64), -1.0, np.float64)
    first_decode = from_decode(np.frombuffer(res_d.times.first_token_s, dtype=np.float64), -1.0,
                               np.float64)
    num_prefill = prefill.scenario.num_replicas
    replica = np.where(decoded, from_decode(cols_d["replica"], 0, np.int64) + num_prefill,
                       cols_p["replica"])
    with np.errstate(invalid="ignore"):
        columns = {
            "request_id": cols_p["request_id"],
            "replica": replica,
            "arrival_s": arrival,
            "prompt_tokens": cols_p["prompt_tokens"],
            "output_tokens": np.fromiter((r.output_tokens for r in requests), np.int64, count=n),
            "n": cols_p["n"], "beam_width": cols_p["beam_width"],
            "status": status.tolist(),
            "reject_reason": either("reject_reason", object).tolist(),
            "queue_delay_s": cols_p["queue_delay_s"],
            "ttft_s": np.where(done, cols_p["ttft_s"], math.nan),
            "tpot_s": np.where(done, from_decode(cols_d["tpot_s"], math.nan, np.float64), math.nan),
            "e2e_s": np.where(done, finished - arrival + front, math.nan),
            "num_preemptions": both("num_preemptions"), "num_swaps": both("num_swaps"),
            "prefix_hit_tokens": cols_p["prefix_hit_tokens"],
            "readmission_hit_tokens": both("readmission_hit_tokens"),
        }
    times = TimesTable(n)
    times.admitted_s[:] = times_p.admitted_s
    times.first_token_s[:] = times_p.first_token_s
    times.finished_s[:] = array("d", finished.tolist())
    times.replica[:] = array("i", replica.tolist())
    groups = list(res_p.groups)
    for j, i in enumerate(order.tolist()):
        groups[i] = res_d.groups[j]
    rows = list(res_p.steps) + [(r[0] + num_prefill, *r[1:]) for r in res_d.steps]
    merged = SimResult(requests, groups, times, rows, max(res_p.end_s, res_d.end_s),  # type: ignore[arg-type]
                       res_p.replicas + res_d.replicas, clients=clients, request_overhead_s=front,
                       step_totals=res_d.totals())
    # the step and KV figures of the decode pool (its replicas, its totals)
    summary = metrics.summarize(dataclasses.replace(merged, replicas=res_d.replicas, groups=res_d.groups),
                                columns, None, decode.capacity_tokens)
    summary["num_preemptions"] = run_p.summary["num_preemptions"] + run_d.summary["num_preemptions"]
    summary["prefix_hit_rate"] = run_p.summary["prefix_hit_rate"]
    summary["kv_pool"] = "decode"
    transferred = ~np.isnan(transfers.done_s)
    with np.errstate(invalid="ignore"):
        ttft_decode = np.where(done, first_decode - arrival + front, math.nan)
    summary["disaggregation"] = {
        "prefill": _pool_figures(prefill, run_p.summary),
        "decode": _pool_figures(decode, run_d.summary),
        "link": {"bandwidth_gb_s": link.bandwidth_gb_s, "latency_s": link.latency_s},
        "num_transfers": int(transferred.sum()),
        "bytes_per_token": beta,
        "bytes_moved": transfers.bytes_moved,
        # first token out on the prefill side -> KV on the decode side, link queueing included
        "transfer_s": _stats(transfers.done_s - first_token),
        "link_wait_s": _stats(transfers.start_s - first_token),
        "ttft_decode_side_s": _stats(ttft_decode[done]),
    }
    return AllocatorRun("paged", merged, columns, summary), run_p, run_d


def transfer_line(section: dict[str, Any]) -> str:
    """One line on the pools and the link, for the terminal."""
    p, d, t = section["prefill"], section["decode"], section["transfer_s"]
    gib = section["bytes_moved"] / (1 << 30)
    return (f"disaggregation: {p['replicas']} prefill × {p['gpu']} TP {p['tensor_parallel']} "
            f"({p['gpus']} GPUs), {d['replicas']} decode × {d['gpu']} TP {d['tensor_parallel']} "
            f"({d['gpus']} GPUs); {section['num_transfers']:,} transfers, {gib:.2f} GiB moved, "
            f"transfer p50 {_ms(t['p50'])} p99 {_ms(t['p99'])} max {_ms(t['max'])}; decode KV "
            f"peak {d['kv_peak_token_state']:.0%}, mean {d['kv_mean_token_state']:.0%}; "
            f"preemptions {p['num_preemptions']} prefill, {d['num_preemptions']} decode")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms"
