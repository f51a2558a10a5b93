"""The maximum request rate a deployment sustains under an SLO: one search per (point, allocator, seed).

A *probe* replays the scenario's workload rescaled to one mean rate (``workload.rate``) and checks
the SLO on the result. The search brackets the threshold by doubling (or halving) the rate from a
start guess, then bisects the bracket ``[lo, hi]`` until ``hi − lo ≤ tolerance × lo``::

    start ──×2──×2──×2 (fails)          lo = last passing rate, hi = first failing rate
                 lo ├───────────┤ hi    bisect: mid passes -> lo = mid, fails -> hi = mid
                     lo ├─────┤ hi      ... until (hi − lo) / lo ≤ tolerance; the answer is lo

Bisection assumes "the SLO holds" is monotone in the rate (true of the analytic cases; with noisy
workloads the seeds' spread is the honest error bar). "The SLO holds" means every bound of the
scenario's ``slo:`` section holds *and* the system is stable: the queueing delay does not grow
along the trace (its least-squares slope against arrival time is at most
:data:`MAX_QUEUE_GROWTH` seconds per second). A TTFT bound already implies it for long traces;
the slope catches overload when the SLO bounds only TPOT.

Probes are cached as JSON files keyed by a hash of the resolved scenario (rate and seed included),
the allocator and whether KV data was recorded, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator import metrics
from simulator.deployment import Deployment, build_deployment
from simulator.engine import simulate
from simulator.errors import KvplanError
from simulator.kv.allocator import Allocation, KVAllocator
from simulator.latency import LatencyModel
from simulator.plan import StepPlan
from simulator.scenario import SLOSpec, parse_scenario
from simulator.scheduler import Scheduler, Status
from workloads import synthetic
from workloads.request import Request
from workloads.spec import WorkloadSpec, build_requests

MAX_QUEUE_GROWTH = 0.05  # s of extra queueing per s of trace: an overload of ~5% or more is unstable
MAX_DOUBLINGS = 24  # start × 2^24: beyond that the SLO holds "at every rate" (too short a trace)
MAX_HALVINGS = 16  # start / 2^16: below that the SLO fails "at every rate"
CACHE_VERSION = 1  # bump when a probe's meaning changes, so old cache files are not reused


@dataclass(frozen=True, slots=True)
class Bracket:
    """Result of :func:`bracket_and_bisect`: the threshold lies in ``[lo_rate, hi_rate]``.

    ``lo_rate`` is the highest rate that passed (0.0 when none did); ``hi_rate`` the lowest that
    failed (``None`` when every rate tried passed). ``rates`` lists the probes in order.
    """

    lo_rate: float
    hi_rate: float | None
    rates: tuple[float, ...]


def bracket_and_bisect(holds: Callable[[float], bool], start_rate: float, tolerance: float, *,
                       max_doublings: int = MAX_DOUBLINGS, max_halvings: int = MAX_HALVINGS) -> Bracket:
    """Find the largest rate for which ``holds(rate)`` is True, to relative ``tolerance``.

    Contract: when a rate passes and another fails, the result has ``lo < hi`` and
    ``hi − lo ≤ tolerance × lo``; ``holds`` is called once per distinct rate, in the order of
    ``Bracket.rates``. Deterministic: the rates depend only on the answers.
    """
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise ValueError(f"start_rate must be positive and finite, got {start_rate}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    rates: list[float] = []

    def probe(rate: float) -> bool:
        rates.append(rate)
        return holds(rate)

    lo: float = 0.0
    hi: float | None = None
    if probe(start_rate):
        lo = start_rate
        for _ in range(max_doublings):
            if not probe(lo * 2):
                hi = lo * 2
                break
            lo *= 2
        else:
            return Bracket(lo, None, tuple(rates))
    else:
        hi = start_rate
        for _ in range(max_halvings):
            if probe(hi / 2):
                lo = hi / 2
                break
            hi /= 2
        else:
            return Bracket(0.0, hi, tuple(rates))
    while hi - lo > tolerance * lo:
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return Bracket(lo, hi, tuple(rates))


# --- one probe ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """One simulated rate of one (point, allocator, seed). KV fields are None unless recorded."""

    rate_req_s: float
    seed: int
    ok: bool
    failures: tuple[str, ...]  # why the SLO failed, one phrase per broken bound
    num_requests: int
    completed: int
    rejected: int
    throughput_req_s: float
    throughput_tok_s: float
    goodput_req_s: float  # finished requests that met every per-request bound, per second
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    e2e_p99_s: float | None
    queue_delay_p99_s: float | None
    queue_growth: float  # slope of queueing delay vs arrival time (s per s)
    max_batch_size: int
    num_kv_refusals: int  # admissions the KV allocator refused (the pool was full or fragmented)
    num_preemptions: int
    kv_used_mean: float | None = None  # allocated share of the pool (not free), time-averaged
    kv_used_peak: float | None = None
    kv_token_state_mean: float | None = None  # share holding written KV, time-averaged

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["failures"] = list(self.failures)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Probe:
        return cls(**{**data, "failures": tuple(data["failures"])})


def check_slo(slo: SLOSpec, *, num_requests: int, completed: int, rejected: int,
              ttft_p99_s: float | None, tpot_p99_s: float | None, e2e_p99_s: float | None,
              queue_growth: float) -> tuple[str, ...]:
    """The broken parts of ``slo`` (empty = it holds), each a short phrase for reports."""
    failures: list[str] = []
    rejected_fraction = rejected / num_requests if num_requests else 0.0
    if rejected_fraction > slo.max_rejected_fraction:
        failures.append(f"rejected {rejected_fraction:.1%} > {slo.max_rejected_fraction:.1%}")
    if completed == 0:
        failures.append("no request finished")
    for label, value, bound in (("TTFT", ttft_p99_s, slo.ttft_p99_s), ("TPOT", tpot_p99_s, slo.tpot_p99_s),
                                ("E2E", e2e_p99_s, slo.e2e_p99_s)):
        if bound is not None and value is not None and value > bound:
            failures.append(f"{label} p99 {value:.4g} s > {bound:g} s")
    if queue_growth > MAX_QUEUE_GROWTH:
        failures.append(f"unstable: queueing delay grows {queue_growth:.3g} s per s")
    return tuple(failures)


def queue_growth(requests: pd.DataFrame) -> float:
    """Least-squares slope of finished requests' queueing delay against their arrival time."""
    done = requests[requests.status == Status.FINISHED.value]
    x = done.arrival_s.to_numpy(dtype=np.float64)
    y = done.queue_delay_s.to_numpy(dtype=np.float64)
    if len(x) < 2 or float(x.max() - x.min()) <= 0:
        return 0.0
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx * dx).sum())


def goodput_req_s(requests: pd.DataFrame, slo: SLOSpec, makespan_s: float) -> float:
    """Finished requests with TTFT ≤ the bound and TPOT ≤ the bound (one-token outputs have no
    TPOT and pass it), per second of makespan."""
    done = requests[requests.status == Status.FINISHED.value]
    good = np.ones(len(done), dtype=bool)
    if slo.ttft_p99_s is not None:
        good &= done.ttft_s.to_numpy() <= slo.ttft_p99_s
    if slo.tpot_p99_s is not None:
        tpot = done.tpot_s.to_numpy()
        good &= np.isnan(tpot) | (tpot <= slo.tpot_p99_s)
    return float(good.sum()) / makespan_s if makespan_s > 0 else 0.0


@dataclass(slots=True)
class _PeakBatch:
    """Wraps a latency model to see every step's batch: the peak concurrency without step rows."""

    inner: LatencyModel
    max_batch_size: int = 0

    def step_latency_s(self, plan: StepPlan) -> float:
        size = plan.batch_size
        if size > self.max_batch_size:
            self.max_batch_size = size
        return self.inner.step_latency_s(plan)


def _counting_refusals(make_replica: Callable[[int], tuple[Scheduler, KVAllocator]],
                       refusals: list[int]) -> Callable[[int], tuple[Scheduler, KVAllocator]]:
    """``make_replica`` whose allocators count the admissions they refuse (``allocate`` -> None):
    the sign that KV memory, not max_num_seqs or step time, held concurrency back. Only
    ``allocate`` is wrapped (on the instance), so the per-token hot path is untouched."""

    def make(index: int) -> tuple[Scheduler, KVAllocator]:
        scheduler, alloc = make_replica(index)
        allocate = alloc.allocate

        def counted(*args: Any, **kwargs: Any) -> Allocation | None:
            got = allocate(*args, **kwargs)
            if got is None:
                refusals[0] += 1
            return got

        alloc.allocate = counted  # type: ignore[method-assign]
        return scheduler, alloc

    return make


def simulate_probe(dep: Deployment, allocator: str, rate_req_s: float, seed: int, slo: SLOSpec,
                   requests: list[Request], *, record_steps: bool) -> Probe:
    """Replay ``requests`` (already at ``rate_req_s``) on ``dep`` and check ``slo``."""
    peak, refusals = _PeakBatch(dep.latency), [0]
    result = simulate(requests, _counting_refusals(dep.replica_factory(allocator), refusals), peak,
                      num_replicas=dep.scenario.num_replicas, record_steps=record_steps)
    frame, steps = metrics.requests_frame(result), metrics.steps_frame(result)
    s = metrics.summarize(result, frame, steps, dep.capacity_tokens)
    growth = queue_growth(frame)
    p99 = {k: s[k]["p99"] for k in ("ttft_s", "tpot_s", "e2e_s", "queue_delay_s")}
    failures = check_slo(slo, num_requests=len(requests), completed=s["completed"], rejected=s["rejected"],
                         ttft_p99_s=p99["ttft_s"], tpot_p99_s=p99["tpot_s"], e2e_p99_s=p99["e2e_s"],
                         queue_growth=growth)
    kv: dict[str, float | None] = {"kv_used_mean": None, "kv_used_peak": None, "kv_token_state_mean": None}
    if record_steps and len(steps):
        cap = dep.capacity_tokens
        used = (cap - steps.kv_free - steps.kv_external_fragmentation) / cap
        # max(0, ...): 1 − free − external can come out as −1e-16 for an idle pool
        kv = {"kv_used_mean": max(0.0, 1.0 - s["kv"]["free"] - s["kv"]["external_fragmentation"]),
              "kv_used_peak": float(used.max()), "kv_token_state_mean": s["kv"]["token_state"]}
    return Probe(
        rate_req_s=rate_req_s, seed=seed, ok=not failures, failures=failures,
        num_requests=len(requests), completed=s["completed"], rejected=s["rejected"],
        throughput_req_s=s["throughput_req_s"], throughput_tok_s=s["throughput_tok_s"],
        goodput_req_s=goodput_req_s(frame, slo, s["makespan_s"]),
        ttft_p99_s=p99["ttft_s"], tpot_p99_s=p99["tpot_s"], e2e_p99_s=p99["e2e_s"],
        queue_delay_p99_s=p99["queue_delay_s"], queue_growth=growth,
        max_batch_size=peak.max_batch_size, num_kv_refusals=refusals[0], num_preemptions=s["num_preemptions"],
        **kv,
    )


# --- one search (the unit of parallel work) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class SearchTask:
    """Everything a worker needs, as plain data (it crosses process and Ray boundaries).

    ``scenario`` is the point's resolved scenario mapping with ``allocators`` set to this
    allocator and ``seed`` to this seed; ``base_dir`` anchors its relative paths.
    """

    point_index: int
    scenario: dict[str, Any]
    where: str  # for error messages: the file and the sweep point
    base_dir: str
    allocator: str
    seed: int
    start_rate_req_s: float
    tolerance: float
    record_steps: bool  # KV data on every probe (the KV-utilization plot needs it)
    cache_dir: str | None


@dataclass(frozen=True, slots=True)
class SearchResult:
    """One seed's answer: the bracket, every probe in order, and the probe at ``lo_rate`` with
    KV data (``None`` when no rate passed)."""

    point_index: int
    allocator: str
    seed: int
    lo_rate_req_s: float
    hi_rate_req_s: float | None
    probes: tuple[Probe, ...]
    at_max: Probe | None


def cache_key(scenario: dict[str, Any], base_dir: str, allocator: str, rate_req_s: float, seed: int,
              record_steps: bool) -> str:
    """Hex digest naming one probe's cache file."""
    payload = {"version": CACHE_VERSION, "scenario": scenario, "base_dir": base_dir, "allocator": allocator,
               "rate_req_s": rate_req_s, "seed": seed, "record_steps": record_steps}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_cache(path: Path) -> Probe | None:
    try:
        return Probe.from_json(json.loads(path.read_text())["probe"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or half-written by an interrupted run: simulate again


def _write_cache(path: Path, probe: Probe) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: parallel workers and interruptions never leave a torn file behind.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"probe": probe.to_json()}, f, sort_keys=True)
    os.replace(tmp, path)


class RateWorkload:
    """A scenario's requests at any mean rate, as ``build_requests`` with ``workload.rate`` set.

    A trace is parsed once; each rate then rescales and slices it with the same calls, in the same
    order, as :func:`workloads.spec.build_requests` (so the same requests, bit for bit): parsing
    is most of the cost of building a trace's requests, as much as a short simulation.
    """

    def __init__(self, spec: WorkloadSpec, *, seed: int, base_dir: Path) -> None:
        self.spec = spec
        self.seed = seed
        self.base_dir = base_dir
        self._full: list[Request] | None = None  # the whole trace at its own rate, read on first use

    def at_rate(self, rate_req_s: float) -> list[Request]:
        """The workload's requests rescaled to a mean of ``rate_req_s`` requests per second."""
        spec = self.spec.model_copy(update={"rate": rate_req_s, "rate_scale": None})
        if spec.trace is None:
            return build_requests(spec, seed=self.seed, base_dir=self.base_dir)
        if self._full is None:
            bare = spec.model_copy(update={"rate": None, "start_s": None, "duration_s": None,
                                           "num_requests": None, "n": 1, "beam_width": 1})
            self._full = build_requests(bare, seed=self.seed, base_dir=self.base_dir)
        try:
            requests = synthetic.rescale_to_rate(self._full, rate_req_s)
            if spec.start_s is not None or spec.duration_s is not None or spec.num_requests is not None:
                requests = synthetic.slice_requests(requests, start_s=spec.start_s,
                                                    duration_s=spec.duration_s,
                                                    num_requests=spec.num_requests)
        except KvplanError as err:
            raise KvplanError(f"workload: {err}") from None
        if spec.n != 1 or spec.beam_width != 1:
            requests = [dataclasses.replace(r, n=spec.n, beam_width=spec.beam_width) for r in requests]
        return requests


def run_search(task: SearchTask) -> SearchResult:
    """Search one (point, allocator, seed); probes come from the cache when present.

    The deployment is built once (the rate changes only the workload). Raises KvplanError for
    bad input; the caller validated the point's deployment before dispatching, so that is rare.
    """
    base_dir = Path(task.base_dir)
    scenario = parse_scenario(task.scenario, task.where)
    assert scenario.slo is not None, "the caller checks the slo section"
    slo = scenario.slo
    dep = build_deployment(scenario, base_dir)
    workload = RateWorkload(scenario.workload, seed=scenario.seed, base_dir=base_dir)
    memo: dict[tuple[float, bool], Probe] = {}

    def probe(rate: float, record_steps: bool) -> Probe:
        if (rate, record_steps) in memo:
            return memo[rate, record_steps]
        data = copy.deepcopy(task.scenario)
        data["workload"].pop("rate_scale", None)
        data["workload"]["rate"] = rate
        path = None
        if task.cache_dir is not None:
            # A probe recorded with KV data also answers a request without it.
            for recorded in (record_steps, True):
                key = cache_key(data, task.base_dir, task.allocator, rate, task.seed, recorded)
                cached = _read_cache(Path(task.cache_dir) / f"{key}.json")
                if cached is not None:
                    if recorded and not record_steps:  # as a fresh probe would be: no KV data
                        cached = dataclasses.replace(cached, kv_used_mean=None, kv_used_peak=None,
                                                     kv_token_state_mean=None)
                    memo[rate, record_steps] = cached
                    return cached
            key = cache_key(data, task.base_dir, task.allocator, rate, task.seed, record_steps)
            path = Path(task.cache_dir) / f"{key}.json"
        requests = workload.at_rate(rate)
        result = simulate_probe(dep, task.allocator, rate, task.seed, slo, requests,
                                record_steps=record_steps)
        if path is not None:
            _write_cache(path, result)
        memo[rate, record_steps] = result
        return result

    bracket = bracket_and_bisect(lambda r: probe(r, task.record_steps).ok, task.start_rate_req_s,
                                 task.tolerance)
    probes = tuple(memo[r, task.record_steps] for r in bracket.rates)
    at_max = probe(bracket.lo_rate, True) if bracket.lo_rate > 0 else None
    return SearchResult(task.point_index, task.allocator, task.seed, bracket.lo_rate, bracket.hi_rate,
                        probes, at_max)


def limited_by(probe: Probe, max_num_seqs: int) -> str:
    """What capped concurrency at this probe: ``max_num_seqs`` (the batch reached it), ``kv`` (the
    allocator refused an admission, or running sequences were preempted, for lack of KV), both
    (``kv+max_num_seqs``), or ``latency`` (neither: the SLO's time bounds bind first)."""
    limits = []
    if probe.num_kv_refusals > 0 or probe.num_preemptions > 0:
        limits.append("kv")
    if probe.max_batch_size >= max_num_seqs:
        limits.append("max_num_seqs")
    return "+".join(limits) or "latency"
