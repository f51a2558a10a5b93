"""Disaggregated layouts in the GPU-count search (``kvplan capacity --target-rate``).

A disaggregated layout is the scenario's ``disaggregation:`` — each pool's GPU and tensor
parallelism and the KV link (:mod:`simulator.engine.disagg`) — at a fixed prefill:decode replica ratio
``p:d``. The search (:func:`simulator.commands.capacity.replicas.run_replica_search`) finds the smallest
*scale* ``k`` whose layout, ``k·p`` prefill and ``k·d`` decode replicas, holds the SLO at the
target rate; its GPUs are ``k·p·TP_prefill + k·d·TP_decode``. Several ratios, and the aggregated
layout beside them, come from the sweep knob ``pd_ratio`` (:data:`PD_RATIO_KNOB`)::

    sweep:
      pd_ratio: [agg, "1:1", "1:2", "2:1"]   # agg: the scenario without disaggregation:

Without the knob, a scenario with ``disaggregation:`` is searched at its own ratio,
``prefill.replicas : decode.replicas``. A ratio is reduced by its greatest common divisor
(``2:4`` is ``1:2``: scale 2 of it is ``2:4``), so that scale 1 is the smallest layout of it.

**Why a scale at a fixed ratio, not each pool on its own.** In this model TTFT is the prefill
pool's alone (the prefill side's first token, :mod:`simulator.engine.disagg`), so the fewest prefill
replicas that hold the TTFT bound could be searched with the decode pool left out. TPOT and E2E,
though, are the decode pool's *fed by the prefill pool*: its arrivals are the prefill side's
first tokens plus the transfer, and a larger prefill pool sends them sooner and burstier. The
fewest decode replicas is then a function ``D*(P)`` of the prefill count, and the fewest GPUs is
``min over P ≥ P* of P·TP_p + D*(P)·TP_d``, which a search of each side at ``P*`` finds only when
``D*`` does not fall as ``P`` grows — a property of the trace, not of the model. The scale ``k``
at a fixed ratio has none of that: "the SLO holds" is monotone in ``k`` for the same reason as in
replicas for an aggregated layout (every pool only gains replicas, least-outstanding routing only
takes work off the others), so :func:`simulator.commands.capacity.replicas.smallest_holding` finds the
smallest ``k`` exactly; the ratios listed are the P:D choices compared.

The search starts from the analytic ceiling (:mod:`simulator.commands.capacity.bound`) of each pool at
scale 1: the decode pool's ``d`` replicas on the whole requests, the prefill pool's ``p`` on the
requests with one output token (its pass, :mod:`simulator.engine.disagg`); ``k₀ = ⌈R / min(U_p, U_d)⌉``.
Both are ceilings on what the pool can serve, so fewer than ``k₀`` cannot hold ``R``.

A probe runs :func:`simulator.engine.disagg.simulate_disaggregated` (both pools and the link) and
checks the SLO on the merged run as an aggregated probe does
(:func:`simulator.commands.capacity.search.probe_of_run`); its KV figures are the decode pool's. Its cache
key is the scenario mapping with the pools' replicas set, so the disaggregation spec (pools,
GPUs, TP, link) names the probe. A probe whose prefill pass certainly breaks the TTFT or E2E bound
stops there (:func:`prefill_stopped`); one that fails only on the decode side runs to the end.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pandas as pd

from simulator.engine import metrics
from simulator.commands.capacity.bound import RateBound, rate_bound
from simulator.commands.capacity.search import Probe, probe_of_run, stopped_probe
from simulator.commands.capacity.stop import SloStopRule
from simulator.config.deployment import Deployment
from simulator.engine.disagg import simulate_disaggregated
from simulator.engine.core import simulate
from simulator.errors import KvplanError
from simulator.config.scenario import LinkSpec, SLOSpec
from workloads.clients import Clients
from workloads.request import Request

PD_RATIO_KNOB = "pd_ratio"  # the sweep knob: "agg", or "P:D" replicas of each pool
AGGREGATED = "agg"


def parse_pd_ratio(value: Any, where: str) -> tuple[int, int] | None:
    """``"1:2"`` -> ``(1, 2)`` (reduced by the gcd: ``"2:4"`` -> ``(1, 2)``); ``"agg"`` -> None.
    Anything else, a count below 1 included, is a one-line KvplanError."""
    if isinstance(value, int) and not isinstance(value, bool):
        raise KvplanError(f"{where}: {PD_RATIO_KNOB} {value}: quote a P:D ratio in YAML (\"1:2\"), "
                          "which reads 1:2 unquoted as the base-60 number 62")
    text = str(value).strip()
    if text == AGGREGATED:
        return None
    p_text, sep, d_text = text.partition(":")
    try:
        p, d = int(p_text), int(d_text)
    except ValueError:
        p = d = 0
        sep = ""
    if not sep or p < 1 or d < 1:
        raise KvplanError(f"{where}: {PD_RATIO_KNOB} expects '{AGGREGATED}' or P:D, prefill and "
                          f"decode replicas, each a whole number ≥ 1 (e.g. 1:2), got '{value}'")
    g = math.gcd(p, d)
    return p // g, d // g


def scenario_at_scale(data: dict[str, Any], ratio: tuple[int, int], scale: int) -> dict[str, Any]:
    """A copy of the scenario mapping ``data`` (with ``disaggregation:``) whose pools hold
    ``scale × ratio`` replicas."""
    out = copy.deepcopy(data)
    pools = out["disaggregation"]
    for name, count in zip(("prefill", "decode"), ratio):
        pools.setdefault(name, {})["replicas"] = scale * count
    return out


def layout_label(ratio: tuple[int, int] | None, replicas: int | None, tp: int, *,
                 prefill_tp: int | None = None, decode_tp: int | None = None, dp: int = 1,
                 expert_parallel: bool = False) -> str:
    """``agg TP2 ×3`` (3 replicas of TP 2; ``agg DP8×TP1 EP ×1`` for a replica of 8 data-parallel
    engines with expert parallelism) or ``disagg P2×TP2 : D3×TP4`` (``replicas``: the scale of the
    ratio); ``×?`` when no count held."""
    if ratio is None:
        return f"{aggregated_kind(tp, dp, expert_parallel)} ×{replicas if replicas is not None else '?'}"
    if replicas is None:
        return f"disagg {ratio[0]}:{ratio[1]} P×TP{prefill_tp} : D×TP{decode_tp} ×?"
    return f"disagg P{ratio[0] * replicas}×TP{prefill_tp} : D{ratio[1] * replicas}×TP{decode_tp}"


def aggregated_kind(tp: int, dp: int = 1, expert_parallel: bool = False) -> str:
    """``agg TP2``, or ``agg DP8×TP1 EP`` for data-parallel engines (with expert parallelism)."""
    engines = f"DP{dp}×TP{tp}" if dp > 1 else f"TP{tp}"
    return f"agg {engines}" + (" EP" if expert_parallel else "")


def pools_bound(prefill: Deployment, decode: Deployment, requests: list[Request],
                slo: SLOSpec) -> RateBound:
    """The ceiling of the layout (module docstring): the lower of the two pools' ceilings, each
    on the requests its pass serves. ``prefill``/``decode``: the pools at scale 1. The prefill
    pass decodes nothing (one output token: no TPOT), so its batch is not bounded by the TPOT
    bound, which would lower its ceiling below what it can serve."""
    first_tokens = [dataclasses.replace(r, output_tokens=1) for r in requests]
    prefill_bound = rate_bound(prefill, "paged", first_tokens, slo.model_copy(update={"tpot_p99_s": None}))
    return min(prefill_bound, rate_bound(decode, "paged", requests, slo), key=lambda b: b.rate_req_s)


def prefill_stopped(prefill: Deployment, rate_req_s: float, seed: int, slo: SLOSpec,
                    requests: list[Request], clients: Clients) -> Probe | None:
    """The prefill pass alone, stopped as soon as its TTFT or E2E bound is certainly broken
    (:class:`simulator.commands.capacity.stop.SloStopRule`): the failed probe, or None when it ran to the
    end. Sound for the whole layout: the merged run's TTFT *is* the prefill pass's, and each
    request's merged E2E (its decode side's last token) is at least its prefill pass's (its
    first token), so a bound the prefill pass certainly breaks the layout breaks too. TPOT is
    the decode side's: not counted here. None also when the SLO bounds neither."""
    first_tokens = [dataclasses.replace(r, output_tokens=1) for r in requests]
    rule = SloStopRule(slo.model_copy(update={"tpot_p99_s": None}), first_tokens,
                       warmup_requests=clients.warmup_requests,
                       request_overhead_s=float(getattr(prefill.latency, "request_overhead_s", 0.0)))
    if not rule.active:
        return None
    # the pass simulate_disaggregated runs (simulator.engine.runs.run_allocator), without step rows
    result = simulate(first_tokens, prefill.replica_factory("paged"), prefill.latency,
                      num_replicas=prefill.scenario.num_replicas, clients=clients, record_steps=False,
                      stop_if=rule, router=prefill.scenario.router.config())
    if result.stopped is None:
        return None
    refusals = sum(rep.scheduler.num_kv_refusals for rep in result.replicas)
    return stopped_probe(result, rate_req_s, seed, result.totals().max_batch, refusals)


def simulate_disagg_probe(prefill: Deployment, decode: Deployment, link: LinkSpec, rate_req_s: float,
                          seed: int, slo: SLOSpec, requests: list[Request], *, record_steps: bool,
                          clients: Clients) -> Probe:
    """Replay ``requests`` (already at ``rate_req_s``) through both pools and the link and check
    ``slo`` on the merged run (module docstring). ``max_batch_size`` is the decode pool's.

    The prefill pass runs first on its own, stopped early once TTFT or E2E certainly fails
    (:func:`prefill_stopped`): an overloaded prefill pool, the commonest failure, costs only its
    pass up to the stop. A probe that gets past it runs the prefill pass again inside
    :func:`simulator.engine.disagg.simulate_disaggregated` (the same simulation, a fraction of the
    probe: one output token per request)."""
    stopped = prefill_stopped(prefill, rate_req_s, seed, slo, requests, clients)
    if stopped is not None:
        return stopped
    run, _, run_d = simulate_disaggregated(prefill, decode, link, requests, clients=clients,
                                           record_steps=False)
    # the merged columns (TPOT the decode side's), not requests_frame(run.result), which would
    # time TPOT from the prefill side's first token
    frame = pd.DataFrame(run.request_columns, columns=list(metrics.REQUEST_COLUMNS))
    refusals = sum(rep.scheduler.num_kv_refusals for rep in run.result.replicas)
    return probe_of_run(run.result, frame, run.summary, rate_req_s, seed, slo, clients,
                        record_steps=record_steps, capacity_tokens=decode.capacity_tokens,
                        max_batch_size=run_d.result.totals().max_batch, num_kv_refusals=refusals)
