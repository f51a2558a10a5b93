"""The fewest replicas that hold a target rate under the SLO: one search per (point, allocator,
seed, target rate).

The rate search (:mod:`simulator.commands.capacity.search`) asks what rate a deployment sustains; this
asks the inverse: at a fixed mean rate ``R``, how many *replicas* — data-parallel copies of the
point's tensor-parallel group, behind the engine's least-outstanding-requests router
(:func:`simulator.engine.core.simulate`) — the scenario's ``slo:`` needs. GPUs = replicas × TP.

A probe is the rate search's probe (the same requests at ``R``, the same SLO check, the same
early stop once a p99 bound is certainly broken, the same on-disk cache) with ``num_replicas``
set. The search assumes "the SLO holds" is monotone in the number of replicas: at a fixed rate,
adding a replica to least-outstanding routing only takes work off the others. So the answer is
the smallest count that holds, found exactly (counts are integers, there is no tolerance)::

    n₀ = ⌈R / U₁⌉                     U₁: the analytic ceiling on one replica's rate
                                      (simulator.commands.capacity.bound; U(n) = n · U₁), so fewer
                                      than n₀ replicas cannot hold R
    n₀ fails:  2n₀, 4n₀, ... (capped at max_replicas) until one holds,
               then bisect (failing lo, holding hi) until hi = lo + 1
    n₀ holds:  probe n₀ − 1, which the bound says fails: one probe confirms n₀. The bound rests on
               mean lengths (a pool holds more short requests than mean-sized ones), so if
               n₀ − 1 holds too, halve down to the first failure and bisect as above

That is ``1 + ⌈log2(answer / n₀)⌉`` probes to bracket the answer plus the bisection of the last
doubling; a point that still fails at ``max_replicas`` is reported as such after
``1 + ⌈log2(max_replicas / n₀)⌉`` probes.
A disaggregated layout (:mod:`simulator.commands.capacity.disagg_search`) is searched the same way on
its scale ``k`` at a fixed prefill:decode ratio ``p:d`` (``k·p`` prefill and ``k·d`` decode
replicas), from the lower of its two pools' ceilings; there ``counts`` are scales.

A probe that rejects more requests than the SLO allows (longer than ``max_model_len``, more KV
than a replica's pool) ends the search: the requests, not the replicas, are the problem, and
every count would reject them alike.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.commands.capacity.bound import RateBound, rate_bound
from simulator.commands.capacity.disagg_search import pools_bound, scenario_at_scale, simulate_disagg_probe
from simulator.commands.capacity.search import Probe, RateWorkload, cached_probe, rejects_too_many, simulate_probe
from simulator.config.deployment import Deployment, build_deployment
from simulator.engine.disagg import build_pools
from simulator.config.scenario import parse_scenario


@dataclass(frozen=True, slots=True)
class Count:
    """Result of :func:`smallest_holding`: ``smallest`` holds and ``smallest − 1`` does not (or is
    0); ``smallest`` None when even ``most`` failed or ``fails_everywhere`` said every count
    would. ``counts`` lists the probes in order."""

    smallest: int | None
    counts: tuple[int, ...]


def smallest_holding(holds: Callable[[int], bool], start: int, most: int, *,
                     fails_everywhere: Callable[[int], bool] | None = None) -> Count:
    """The smallest ``n`` in ``[1, most]`` with ``holds(n)``, for ``holds`` monotone (False below
    the answer, True from it on), searched as the module docstring says from ``start`` (a lower
    bound that may be wrong by a little). ``holds`` is called once per distinct count, in the
    order of ``Count.counts``; ``fails_everywhere(n)``, asked after ``n`` fails: True ends the
    search with no answer."""
    if not 1 <= start <= most:
        raise ValueError(f"start {start} is outside [1, {most}]")
    counts: list[int] = []

    def probe(n: int) -> bool:
        counts.append(n)
        return holds(n)

    lo, hi = 0, None  # lo fails (0: no replica), hi holds
    if probe(start):
        hi = start
        nxt = start - 1  # the bound says this fails: one probe confirms it
        while nxt >= 1:
            if not probe(nxt):
                lo = nxt
                break
            hi, nxt = nxt, nxt // 2
    else:
        lo = start
        while hi is None:
            if (fails_everywhere is not None and fails_everywhere(lo)) or lo >= most:
                return Count(None, tuple(counts))
            nxt = min(2 * lo, most)
            if probe(nxt):
                hi = nxt
            else:
                lo = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            hi = mid
        else:
            lo = mid
    return Count(hi, tuple(counts))


@dataclass(frozen=True, slots=True)
class ReplicaTask:
    """Everything a worker needs, as plain data (it crosses process and Ray boundaries): the
    point's resolved scenario mapping with ``allocators`` set to this allocator and ``seed`` to
    this seed (``num_replicas`` is what varies), and the target rate."""

    point_index: int
    scenario: dict[str, Any]
    where: str  # for error messages: the file and the sweep point
    base_dir: str
    allocator: str
    seed: int
    target_rate_req_s: float
    max_replicas: int
    record_steps: bool  # KV data at the answer (as the rate search's at_max)
    cache_dir: str | None
    ratio: tuple[int, int] | None = None  # a disaggregated layout's P:D (None: aggregated)


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    """One seed's answer at one target rate: the smallest count that held (None: none up to
    ``max_replicas`` did, or rejections fail the SLO at every count), every probe in order with
    its count, and the probe at the answer with KV data (None without an answer).

    ``bound`` is the analytic ceiling of one replica, ``start`` the count it gave (⌈R / U₁⌉,
    within ``[1, max_replicas]``). With ``ratio`` (a disaggregated layout) every count —
    ``num_replicas``, ``counts``, ``start``, ``max_replicas`` (the largest scale whose pools stay
    within ``--max-replicas``) — is a scale of the P:D ratio, and ``bound`` the layout's at
    scale 1."""

    point_index: int
    allocator: str
    seed: int
    target_rate_req_s: float
    num_replicas: int | None
    counts: tuple[int, ...]
    probes: tuple[Probe, ...]
    at_answer: Probe | None
    bound: RateBound | None
    start: int
    max_replicas: int
    everywhere: bool = False  # no answer because rejections fail the SLO at every count
    ratio: tuple[int, int] | None = None  # disaggregated: counts are scales of this P:D


def start_count(target_rate_req_s: float, bound: RateBound | None, most: int) -> int:
    """``⌈R / U₁⌉`` within ``[1, most]`` (1 without a bound). The ceiling is rounded down to 12
    significant digits first, so that a target of exactly ``k × U₁`` starts at ``k``."""
    if bound is None or bound.rate_req_s <= 0:
        return 1
    return max(1, min(most, math.ceil(float(f"{target_rate_req_s / bound.rate_req_s:.12g}"))))


def run_replica_search(task: ReplicaTask) -> ReplicaResult:
    """Search one (point, allocator, seed, target rate); probes come from the cache when there.

    The requests are built once (the count changes only the deployment); a deployment (or, for
    a disaggregated layout, a pair of pools) is built per count tried."""
    base_dir = Path(task.base_dir)
    scenario = parse_scenario(task.scenario, task.where)
    assert scenario.slo is not None, "the caller checks the slo section"
    slo = scenario.slo
    rate = task.target_rate_req_s
    workload = RateWorkload(scenario.workload, seed=scenario.seed, base_dir=base_dir, where=task.where)
    requests = workload.at_rate(rate)
    clients = scenario.workload.client_policy(len(requests))
    memo: dict[tuple[int, bool], Probe] = {}
    ratio = task.ratio

    def scenario_with(n: int) -> dict[str, Any]:
        if ratio is None:
            data = copy.deepcopy(task.scenario)
            data["num_replicas"] = n
        else:
            data = scenario_at_scale(task.scenario, ratio, n)
        data["workload"].pop("rate_scale", None)
        data["workload"]["rate"] = rate
        return data

    @functools.cache
    def deployment(n: int) -> Deployment:
        return build_deployment(parse_scenario(scenario_with(n), task.where), base_dir)

    @functools.cache
    def pools(n: int) -> tuple[Deployment, Deployment]:
        return build_pools(parse_scenario(scenario_with(n), task.where), base_dir, where=task.where)

    def simulate_at(n: int, record_steps: bool) -> Probe:
        if ratio is None:
            return simulate_probe(deployment(n), task.allocator, rate, task.seed, slo, requests,
                                  record_steps=record_steps, clients=clients, stop_early=True)
        assert scenario.disaggregation is not None
        prefill, decode = pools(n)
        return simulate_disagg_probe(prefill, decode, scenario.disaggregation.link, rate, task.seed, slo,
                                     requests, record_steps=record_steps, clients=clients)

    def probe(n: int, record_steps: bool) -> Probe:
        if (n, record_steps) not in memo:
            memo[n, record_steps] = cached_probe(
                task.cache_dir, scenario_with(n), task.base_dir, task.allocator, rate, task.seed,
                record_steps, lambda: simulate_at(n, record_steps))
        return memo[n, record_steps]

    def fails_everywhere(n: int) -> bool:
        """Run to the end and rejected too many: the same requests at every count are rejected
        alike (a request is rejected on arrival for what it is, never for the load)."""
        p = memo[n, task.record_steps]
        return p.stopped_at_s is None and rejects_too_many(slo, num_requests=p.num_requests,
                                                           rejected=p.rejected)

    bound = None
    if requests:
        bound = (rate_bound(deployment(1), task.allocator, requests, slo) if ratio is None
                 else pools_bound(*pools(1), requests, slo))
    most = task.max_replicas if ratio is None else max(1, task.max_replicas // max(ratio))
    start = start_count(rate, bound, most)
    found = smallest_holding(lambda n: probe(n, task.record_steps).ok, start, most,
                             fails_everywhere=fails_everywhere)
    probes = tuple(memo[n, task.record_steps] for n in found.counts)
    at_answer = probe(found.smallest, True) if found.smallest is not None else None
    everywhere = found.smallest is None and fails_everywhere(found.counts[-1])
    return ReplicaResult(task.point_index, task.allocator, task.seed, rate, found.smallest, found.counts,
                         probes, at_answer, bound, start, most, everywhere, ratio)
