"""The maximum load a deployment sustains under an SLO: one search per (point, allocator, seed).

The load is a mean request rate (``search="rate"``) or a number of closed-loop clients
(``search="concurrency"``: the workload sent by N clients, each sending its next request when its
previous one ends, as ``vllm bench serve --max-concurrency N`` does; see :mod:`workloads.clients`).

A *probe* replays the scenario's workload rescaled to one mean rate (``workload.rate``) and checks
the SLO on the result. The search brackets the threshold by doubling (or halving) the rate from a
start guess, then bisects the bracket ``[lo, hi]`` until ``hi − lo ≤ tolerance × lo``::

    start ──×2──×2──×2 (fails)          lo = last passing rate, hi = first failing rate
                 lo ├───────────┤ hi    bisect: mid passes -> lo = mid, fails -> hi = mid
                     lo ├─────┤ hi      ... until (hi − lo) / lo ≤ tolerance; the answer is lo

Concurrency is searched the same way on integers from one client, until ``hi − lo ≤ max(1,
tolerance × lo)``, and never beyond :func:`max_clients` (more clients than requests change
nothing; beyond twice what the replicas may batch, the extra clients only wait in the server's
queue). A closed loop is stable by construction (at most N requests in the system), so its
stability test never fails; with ``max_concurrency`` on a rate, the wait for a client slot counts
as queueing, so an offered rate the capped clients cannot send shows as a growing queue. With
``curve``, a concurrency search also measures 1, 2, 4, ... clients up to saturation
(:func:`curve_loads`), reusing the doubling's probes, for the throughput-latency plot.

Bisection assumes "the SLO holds" is monotone in the rate (true of the analytic cases; with noisy
workloads the seeds' spread is the honest error bar). "The SLO holds" means every bound of the
scenario's ``slo:`` section holds *and* the system is stable: the queueing delay does not grow
along the trace (its least-squares slope against arrival time is at most
:data:`MAX_QUEUE_GROWTH` seconds per second). A TTFT bound already implies it for long traces;
the slope catches overload when the SLO bounds only TPOT.

A rate search on a trace sends the requests the scenario selects (``start_s``, ``duration_s``,
``num_requests``, as ``simulate`` would) with their arrival times rescaled so that *their* mean
rate — (N − 1) gaps over the span from first to last arrival — is the rate searched. (Rescaling
the whole trace first and then taking its first N requests would send them at the slice's own
local rate: for the first 2,000 requests of the Azure conversation trace, 15% below the rate
searched.) A synthetic workload draws its arrivals at the rate searched.

**Rates over the steady window.** A probe's throughput, goodput and output tokens/s are measured
over its *steady window*: from the arrival of the first measured request (the first after the
workload's warm-up; for closed-loop clients, its send) to the arrival of the last request::

    arrivals   w w w|m m m m m m m m m m m m m m m m|
    finishes        . . . . . . . . . . . . . . . . . . . . . .|
          warm-up   |<-------- steady window W ------>|<- drain ->|
              first measured arrival        last arrival      last finish

The warm-up before it (a server still filling up) and the drain after it (the last requests
finishing with nothing arriving, the server below the offered load) are left out. Counting is
per request: the requests that arrive in ``[first, last)`` count, each with the tokens it
generated and whether it met the SLO, however late it finished; the window's rates are those
counts per second of W::

    λ (arrival rate) = arriving in [first, last) / W      throughput = ... and finished / W
    goodput = ... and finished within every bound / W     output tok/s = their generated tokens
                                                          (all samples and beams) / W

The half-open window counts one request per arrival gap: N requests at distinct times give
λ = (N − 1) / W, the workload's own mean rate; closed-loop clients that send in rounds count every
round but the last (the one that drains), so C clients served in E seconds give λ = C / E.

When every request finishes within the SLO, goodput = throughput = λ, the probe's rate (exactly
for a trace without warm-up). At the loads the capacity table reports — stable ones, whose queue
does not grow — this is what the server sustains: it keeps up with the arrivals. (At an
overloaded probe it is what was offered and eventually served, not a service rate: that is
``served_tok_s``, the tokens the server emitted during the window — each request's spread evenly
from its first token to its last — per second, which at a stable load is about the output tok/s
and under overload stops growing with the rate.) When the measured requests are all sent at one
instant (as many closed-loop clients as requests) there is
no steady window: the rates fall back to the run window, from the first measured send to the end
of the last step, drain included, and the probe says so (``steady`` False).

Probes are cached as JSON files keyed by a hash of the resolved scenario (load and seed included),
the allocator and whether KV data was recorded, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import contextlib
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
from workloads.clients import OPEN_LOOP, Clients
from workloads.request import Request
from workloads.spec import WorkloadSpec, build_requests, shape_trace
from workloads.synthetic import rescale_to_rate

MAX_QUEUE_GROWTH = 0.05  # s of extra queueing per s of trace: an overload of ~5% or more is unstable
MAX_DOUBLINGS = 24  # start × 2^24: beyond that the SLO holds "at every rate" (too short a trace)
MAX_HALVINGS = 16  # start / 2^16: below that the SLO fails "at every rate"
CACHE_VERSION = 4  # bump when a probe's meaning changes, so old cache files are not reused
CLIENTS_PER_BATCH_SLOT = 2  # concurrency search: at most this × max_num_seqs × replicas clients


@dataclass(frozen=True, slots=True)
class Bracket:
    """Result of :func:`bracket_and_bisect`: the threshold lies in ``[lo_rate, hi_rate]``.

    ``lo_rate`` is the highest load (a rate, or a number of clients) that passed (0.0 when none
    did); ``hi_rate`` the lowest that failed (``None`` when every load tried passed). ``rates``
    lists the probes in order.
    """

    lo_rate: float
    hi_rate: float | None
    rates: tuple[float, ...]


def bracket_and_bisect(holds: Callable[[float], bool], start_rate: float, tolerance: float, *,
                       max_doublings: int = MAX_DOUBLINGS, max_halvings: int = MAX_HALVINGS,
                       integer: bool = False, upper: float | None = None) -> Bracket:
    """Find the largest load for which ``holds(load)`` is True, to relative ``tolerance``.

    Contract: when a load passes and another fails, the result has ``lo < hi`` and
    ``hi − lo ≤ tolerance × lo`` (``integer``: loads are whole numbers ≥ 1 and
    ``hi − lo ≤ max(1, ⌊tolerance × lo⌋)``); no load above ``upper`` is tried (reaching it and
    passing there ends the search unbounded). ``holds`` is called once per distinct load, in the
    order of ``Bracket.rates``. Deterministic: the loads depend only on the answers.
    """
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise ValueError(f"start_rate must be positive and finite, got {start_rate}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    if integer and (start_rate != int(start_rate) or (upper is not None and upper != int(upper))):
        raise ValueError(f"an integer search needs whole numbers, got {start_rate} and {upper}")
    if upper is not None and not upper >= start_rate:
        raise ValueError(f"upper {upper} is below the start {start_rate}")
    rates: list[float] = []

    def probe(rate: float) -> bool:
        rates.append(rate)
        return holds(rate)

    lo: float = 0.0
    hi: float | None = None
    if probe(start_rate):
        lo = start_rate
        for _ in range(max_doublings):
            if upper is not None and lo >= upper:
                return Bracket(lo, None, tuple(rates))
            nxt = lo * 2 if upper is None else min(lo * 2, upper)
            if not probe(nxt):
                hi = nxt
                break
            lo = nxt
        else:
            return Bracket(lo, None, tuple(rates))
    else:
        hi = start_rate
        for _ in range(max_halvings):
            nxt = hi // 2 if integer else hi / 2
            if nxt < (1 if integer else 0) or nxt == hi:
                return Bracket(0.0, hi, tuple(rates))
            if probe(nxt):
                lo = nxt
                break
            hi = nxt
        else:
            return Bracket(0.0, hi, tuple(rates))
    width = (lambda low: max(1, math.floor(tolerance * low))) if integer else (lambda low: tolerance * low)
    while hi - lo > width(lo):
        mid = (lo + hi) // 2 if integer else (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return Bracket(lo, hi, tuple(rates))


# --- one probe ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """One simulated load of one (point, allocator, seed). KV fields are None unless recorded.

    ``rate_req_s`` is the offered mean rate; for a closed loop (``concurrency`` set) it is the
    rate the clients achieved, which a closed loop offers by construction (arrivals =
    completions). Statistics leave out the workload's warm-up requests; throughput, goodput and
    tokens/s are over the steady window of ``window_s`` seconds (module docstring), or over the
    run window when ``steady`` is False."""

    rate_req_s: float
    seed: int
    ok: bool
    failures: tuple[str, ...]  # why the SLO failed, one phrase per broken bound
    num_requests: int
    completed: int
    rejected: int
    throughput_req_s: float  # measured requests that finished, per second of the window
    throughput_tok_s: float  # their generated tokens (all samples and beams), per second
    goodput_req_s: float  # measured requests that finished within every bound, per second
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
    concurrency: int | None = None  # closed-loop clients (None: a rate probe)
    window_s: float = 0.0  # the window the rates are over: the steady window, or the run window
    steady: bool = True  # False: no steady window (every measured request sent at once)
    served_tok_s: float = 0.0  # output tokens emitted during the window, per second (docstring)

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


def queue_growth(requests: pd.DataFrame, offered_s: np.ndarray | None = None) -> float:
    """Least-squares slope of finished requests' queueing delay against their arrival time.

    With ``offered_s`` (the workload's arrival time of each row, when clients held sends back),
    the delay counts from the offered arrival (the wait for a client slot, then the server's
    queue) and the slope is taken against the offered arrival."""
    finished = (requests.status == Status.FINISHED.value).to_numpy()
    done = requests[finished]
    x = done.arrival_s.to_numpy(dtype=np.float64)
    y = done.queue_delay_s.to_numpy(dtype=np.float64)
    if offered_s is not None:
        offered = np.asarray(offered_s, dtype=np.float64)[finished]
        y = y + (x - offered)
        x = offered
    if len(x) < 2 or float(x.max() - x.min()) <= 0:
        return 0.0
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx * dx).sum())


def met_slo(requests: pd.DataFrame, slo: SLOSpec) -> np.ndarray:
    """Per row of ``requests``: finished with TTFT, TPOT and E2E within the SLO's bounds (applied
    to each request; a one-token output has no TPOT and passes that bound)."""
    good = (requests.status == Status.FINISHED.value).to_numpy()
    for bound, column in ((slo.ttft_p99_s, "ttft_s"), (slo.e2e_p99_s, "e2e_s")):
        if bound is not None:
            good = good & (requests[column].to_numpy() <= bound)
    if slo.tpot_p99_s is not None:
        tpot = requests.tpot_s.to_numpy()
        good = good & (np.isnan(tpot) | (tpot <= slo.tpot_p99_s))
    return good


@dataclass(frozen=True, slots=True)
class WindowRates:
    """Rates of the measured requests over the steady window (module docstring).

    ``rate_req_s`` is λ, their arrival rate. ``steady`` False: they were all sent at one instant,
    so every measured request counts, over the run window instead (drain included). Invariant:
    goodput ≤ throughput ≤ λ."""

    window_s: float
    steady: bool
    rate_req_s: float
    throughput_req_s: float
    throughput_tok_s: float
    goodput_req_s: float

    def __post_init__(self) -> None:
        assert self.goodput_req_s <= self.throughput_req_s <= self.rate_req_s * (1 + 1e-12), self


def window_rates(measured: pd.DataFrame, arrivals_s: np.ndarray, slo: SLOSpec,
                 run_window_s: float) -> WindowRates:
    """Rates of ``measured`` (the requests after the warm-up, in send order; ``arrivals_s`` their
    arrival times) over the steady window ``[first, last)`` of those arrivals: the requests that
    arrive in it, counted with their own outcome, per second of it. Without two distinct
    arrivals, every measured request per second of ``run_window_s`` (the run window: first
    measured send to the end of the last step)."""
    assert len(arrivals_s) == len(measured), (len(arrivals_s), len(measured))
    span_s = float(arrivals_s.max() - arrivals_s.min()) if len(measured) else 0.0
    if span_s > 0:
        steady, window_s = True, span_s
        counted = arrivals_s < arrivals_s.max()  # half-open: one request per arrival gap
    else:
        steady, window_s = False, run_window_s
        counted = np.ones(len(measured), dtype=bool)
    per_s = 1.0 / window_s if window_s > 0 else 0.0
    finished = (measured.status == Status.FINISHED.value).to_numpy() & counted
    samples = measured[["n", "beam_width"]].max(axis=1).to_numpy()
    tokens = float((measured.output_tokens.to_numpy() * samples)[finished].sum())
    good = int((met_slo(measured, slo) & counted).sum())
    return WindowRates(window_s, steady, int(counted.sum()) * per_s, int(finished.sum()) * per_s,
                       tokens * per_s, good * per_s)


def served_tok_s(requests: pd.DataFrame, request_overhead_s: float, start_s: float, end_s: float) -> float:
    """Output tokens (all samples and beams) the server emitted in ``[start_s, end_s)`` per second,
    every finished request of ``requests`` (a :func:`metrics.requests_frame`, warm-up included:
    it is served in the window too) taken to emit its tokens at even intervals from its first
    token to its last — token j of o at first + (j − 1)·(last − first)/(o − 1)."""
    if end_s <= start_s:
        return 0.0
    done = requests[requests.status == Status.FINISHED.value]
    # the server's clock: the client's TTFT and E2E include the front end's overhead
    first = (done.arrival_s + done.ttft_s - request_overhead_s).to_numpy(dtype=np.float64)
    last = (done.arrival_s + done.e2e_s - request_overhead_s).to_numpy(dtype=np.float64)
    outputs = done.output_tokens.to_numpy(dtype=np.int64)
    samples = done[["n", "beam_width"]].max(axis=1).to_numpy(dtype=np.int64)
    gap = np.where(outputs > 1, (last - first) / np.maximum(outputs - 1, 1), 0.0)
    # tokens j = 0..o−1 at first + j·gap; those in [start, end): j in [ceil((start−first)/gap),
    # ceil((end−first)/gap) − 1]; a zero gap puts every token at ``first``
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(gap > 0, np.ceil((start_s - first) / gap), np.where(first >= start_s, 0, outputs))
        hi = np.where(gap > 0, np.ceil((end_s - first) / gap) - 1, np.where(first < end_s, outputs - 1, -1))
    lo, hi = np.clip(lo, 0, outputs), np.clip(hi, -1, outputs - 1)
    emitted = np.maximum(hi - lo + 1, 0) * samples
    return float(emitted.sum()) / (end_s - start_s)


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


def simulate_probe(dep: Deployment, allocator: str, rate_req_s: float | None, seed: int, slo: SLOSpec,
                   requests: list[Request], *, record_steps: bool, clients: Clients = OPEN_LOOP) -> Probe:
    """Replay ``requests`` (already at ``rate_req_s``) sent by ``clients`` on ``dep`` and check
    ``slo``. ``rate_req_s`` None: a closed loop, whose rate is the one its clients achieve."""
    peak, refusals = _PeakBatch(dep.latency), [0]
    result = simulate(requests, _counting_refusals(dep.replica_factory(allocator), refusals), peak,
                      num_replicas=dep.scenario.num_replicas, clients=clients, record_steps=record_steps)
    frame, steps = metrics.requests_frame(result), metrics.steps_frame(result)
    s = metrics.summarize(result, frame, steps, dep.capacity_tokens)
    measured = metrics.measured_requests(result, frame)
    offered = None
    if result.offered is not None:
        offered = np.array([r.arrival_s for r in result.offered[clients.warmup_requests:]])
    growth = queue_growth(measured, offered)
    closed_loop = rate_req_s is None
    # The steady window runs over arrivals as offered (a send held back for a client slot still
    # counts at the rate searched); closed-loop clients offer nothing but their sends.
    arrivals = measured.arrival_s.to_numpy(dtype=np.float64) if offered is None or closed_loop else offered
    rates = window_rates(measured, arrivals, slo, s["throughput_window_s"])
    first_measured_s = float(measured.arrival_s.iloc[0]) if len(measured) else 0.0
    window_start_s = float(arrivals.min()) if rates.steady else first_measured_s
    served = served_tok_s(frame, result.request_overhead_s, window_start_s, window_start_s + rates.window_s)
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
        rate_req_s=rates.rate_req_s if closed_loop else rate_req_s, seed=seed, ok=not failures,
        failures=failures, num_requests=len(requests), completed=s["completed"], rejected=s["rejected"],
        throughput_req_s=rates.throughput_req_s, throughput_tok_s=rates.throughput_tok_s,
        goodput_req_s=rates.goodput_req_s, window_s=rates.window_s, steady=rates.steady,
        served_tok_s=served,
        ttft_p99_s=p99["ttft_s"], tpot_p99_s=p99["tpot_s"], e2e_p99_s=p99["e2e_s"],
        queue_delay_p99_s=p99["queue_delay_s"], queue_growth=growth,
        max_batch_size=peak.max_batch_size, num_kv_refusals=refusals[0], num_preemptions=s["num_preemptions"],
        concurrency=clients.max_in_flight if closed_loop else None, **kv,
    )


# --- one search (the unit of parallel work) -------------------------------------------------


SEARCHES = ("rate", "concurrency")
CURVE_MIN_GAIN = 0.05  # the curve stops once doubling the clients adds less than 5% throughput


@dataclass(frozen=True, slots=True)
class SearchTask:
    """Everything a worker needs, as plain data (it crosses process and Ray boundaries).

    ``scenario`` is the point's resolved scenario mapping with ``allocators`` set to this
    allocator and ``seed`` to this seed; ``base_dir`` anchors its relative paths. ``search`` is
    what varies: ``rate`` (``start_rate_req_s`` is the first rate) or ``concurrency`` (closed-loop
    clients; ``start_rate_req_s`` is the first number of clients). ``curve``: also measure the
    throughput-latency curve over 1, 2, 4, ... clients (concurrency only).
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
    search: str = "rate"
    curve: bool = False

    def __post_init__(self) -> None:
        assert self.search in SEARCHES, self.search
        assert not self.curve or self.search == "concurrency", "a curve is over concurrency"


@dataclass(frozen=True, slots=True)
class SearchResult:
    """One seed's answer: the bracket, every probe in order, and the probe at the highest passing
    load with KV data (``None`` when none passed).

    ``lo_rate_req_s``/``hi_rate_req_s`` are rates: the bracket of a rate search, or the rates the
    clients achieved at ``lo_concurrency``/``hi_concurrency`` (0.0/None when there is no such
    probe) for a concurrency search. ``curve``: probes at 1, 2, 4, ... clients (see
    :func:`curve_loads`), empty unless asked for."""

    point_index: int
    allocator: str
    seed: int
    lo_rate_req_s: float
    hi_rate_req_s: float | None
    probes: tuple[Probe, ...]
    at_max: Probe | None
    search: str = "rate"
    lo_concurrency: int | None = None
    hi_concurrency: int | None = None
    curve: tuple[Probe, ...] = ()


def cache_key(scenario: dict[str, Any], base_dir: str, allocator: str, load: float, seed: int,
              record_steps: bool) -> str:
    """Hex digest naming one probe's cache file (``load``: its rate, or its number of clients)."""
    payload = {"version": CACHE_VERSION, "scenario": scenario, "base_dir": base_dir, "allocator": allocator,
               "load": load, "seed": seed, "record_steps": record_steps}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_cache(path: Path) -> Probe | None:
    try:
        return Probe.from_json(json.loads(path.read_text())["probe"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or half-written by an interrupted run: simulate again


PARTIAL_PREFIX = ".tmp-"  # a cache file being written; renamed into place when complete


def _write_cache(path: Path, probe: Probe) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: parallel workers and interruptions never leave a torn file behind.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=PARTIAL_PREFIX, suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"probe": probe.to_json()}, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C, a stopped worker (SystemExit), a full disk: no partial file left
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_partial_writes(cache_dir: Path) -> int:
    """Remove cache files left half-written by a run killed outright (SIGKILL: no chance to
    clean up), and return how many. Call only while no other run writes into ``cache_dir``
    (the output folder's lock); the complete probes are never touched."""
    partial = list(cache_dir.glob(f"{PARTIAL_PREFIX}*")) if cache_dir.is_dir() else []
    for path in partial:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return len(partial)


class RateWorkload:
    """A scenario's requests at any mean rate (as ``build_requests`` with ``workload.rate`` set)
    or sent by any number of closed-loop clients (``workload.concurrency`` set).

    A trace is parsed once; each load then reshapes it with :func:`workloads.spec.shape_trace`, the
    very function ``build_requests`` uses (so the same requests, bit for bit): parsing is most of
    the cost of building a trace's requests, as much as a short simulation. At a rate, a trace's
    selection is rescaled as a whole (module docstring): the same requests at every rate.
    """

    def __init__(self, spec: WorkloadSpec, *, seed: int, base_dir: Path, where: str = "workload") -> None:
        self.spec = spec
        self.seed = seed
        self.base_dir = base_dir
        self.where = where
        self._full: list[Request] | None = None  # the whole trace at its own rate, read on first use
        self._selected: list[Request] | None = None  # the scenario's slice of it, at its own rate

    def at_rate(self, rate_req_s: float) -> list[Request]:
        """The workload's requests at a mean of ``rate_req_s`` requests per second: a synthetic
        workload drawn at that rate; a trace's requests as the scenario selects them, rescaled so
        that their own mean rate ((N − 1) gaps over their span) is exactly ``rate_req_s``."""
        if self.spec.trace is None:
            return self._build(self.spec.model_copy(update={"rate": rate_req_s, "rate_scale": None}))
        if self._selected is None:
            # rate: inf (a burst) selects on the trace's own clock, as a finite rate is searched
            timed = self.spec.model_copy(update={"rate": None}) if self.spec.burst else self.spec
            self._selected = self._build(timed)
        try:
            return rescale_to_rate(self._selected, rate_req_s)
        except KvplanError as err:
            raise KvplanError(f"workload: {err}") from None

    def at_concurrency(self, concurrency: int) -> tuple[list[Request], Clients]:
        """The workload's requests and the ``concurrency`` closed-loop clients that send them
        (its arrival times dropped, see :meth:`WorkloadSpec.closed_loop_at`)."""
        requests = self._build(self.closed_loop_spec(concurrency))
        return requests, self.closed_loop_spec(concurrency).client_policy(len(requests))

    def closed_loop_spec(self, concurrency: int) -> WorkloadSpec:
        return self.spec.closed_loop_at(concurrency, self.where)

    def _build(self, spec: WorkloadSpec) -> list[Request]:
        if spec.trace is None:
            return build_requests(spec, seed=self.seed, base_dir=self.base_dir)
        if self._full is None:
            bare = self.spec.model_copy(update={
                "rate": None, "rate_scale": None, "start_s": None, "duration_s": None,
                "num_requests": None, "n": 1, "beam_width": 1, "concurrency": None,
                "requests_per_client": None})
            self._full = build_requests(bare, seed=self.seed, base_dir=self.base_dir)
        try:
            return shape_trace(self._full, spec)
        except KvplanError as err:
            raise KvplanError(f"workload: {err}") from None


def max_clients(spec: WorkloadSpec, max_num_seqs: int, num_replicas: int) -> int:
    """The most closed-loop clients a concurrency search tries: beyond the workload's fixed
    ``num_requests`` more clients change nothing, and beyond ``CLIENTS_PER_BATCH_SLOT ×
    max_num_seqs × num_replicas`` the extra clients only wait in the server's queue."""
    cap = CLIENTS_PER_BATCH_SLOT * max_num_seqs * num_replicas
    return min(cap, spec.num_requests) if spec.num_requests is not None else cap


def curve_loads(probe_at: Callable[[int], Probe], upper: int, batch_cap: int) -> tuple[Probe, ...]:
    """The throughput-latency curve: probes at 1, 2, 4, ... clients (``upper`` last if reached)
    until saturation — the last point added less than CURVE_MIN_GAIN output throughput over the
    one before, or the clients reached ``batch_cap`` (max_num_seqs × replicas: more only queue),
    or ``upper``."""
    points: list[Probe] = []
    clients = 1
    while True:
        point = probe_at(clients)
        points.append(point)
        if len(points) > 1 and point.throughput_tok_s < (1 + CURVE_MIN_GAIN) * points[-2].throughput_tok_s:
            break
        if clients >= batch_cap or clients >= upper:
            break
        clients = min(clients * 2, upper)
    return tuple(points)


def run_search(task: SearchTask) -> SearchResult:
    """Search one (point, allocator, seed); probes come from the cache when present.

    The deployment is built once (the load changes only the workload). Raises KvplanError for
    bad input; the caller validated the point's deployment before dispatching, so that is rare.
    """
    base_dir = Path(task.base_dir)
    scenario = parse_scenario(task.scenario, task.where)
    assert scenario.slo is not None, "the caller checks the slo section"
    slo = scenario.slo
    dep = build_deployment(scenario, base_dir)
    workload = RateWorkload(scenario.workload, seed=scenario.seed, base_dir=base_dir, where=task.where)
    by_clients = task.search == "concurrency"
    memo: dict[tuple[float, bool], Probe] = {}

    def scenario_at(load: float) -> dict[str, Any]:
        data = copy.deepcopy(task.scenario)
        if by_clients:
            spec = workload.closed_loop_spec(int(load))
            data["workload"] = spec.model_dump(mode="json", exclude_defaults=True)
        else:
            data["workload"].pop("rate_scale", None)
            data["workload"]["rate"] = load
        return data

    def simulate_at(load: float, record_steps: bool) -> Probe:
        if by_clients:
            requests, clients = workload.at_concurrency(int(load))
            return simulate_probe(dep, task.allocator, None, task.seed, slo, requests,
                                  record_steps=record_steps, clients=clients)
        requests = workload.at_rate(load)
        clients = scenario.workload.client_policy(len(requests))
        return simulate_probe(dep, task.allocator, load, task.seed, slo, requests,
                              record_steps=record_steps, clients=clients)

    def probe(load: float, record_steps: bool) -> Probe:
        if (load, record_steps) in memo:
            return memo[load, record_steps]
        data = scenario_at(load)
        path = None
        if task.cache_dir is not None:
            # A probe recorded with KV data also answers a request without it.
            for recorded in (record_steps, True):
                key = cache_key(data, task.base_dir, task.allocator, load, task.seed, recorded)
                cached = _read_cache(Path(task.cache_dir) / f"{key}.json")
                if cached is not None:
                    if recorded and not record_steps:  # as a fresh probe would be: no KV data
                        cached = dataclasses.replace(cached, kv_used_mean=None, kv_used_peak=None,
                                                     kv_token_state_mean=None)
                    memo[load, record_steps] = cached
                    return cached
            key = cache_key(data, task.base_dir, task.allocator, load, task.seed, record_steps)
            path = Path(task.cache_dir) / f"{key}.json"
        result = simulate_at(load, record_steps)
        if path is not None:
            _write_cache(path, result)
        memo[load, record_steps] = result
        return result

    if not by_clients:
        bracket = bracket_and_bisect(lambda r: probe(r, task.record_steps).ok, task.start_rate_req_s,
                                     task.tolerance)
        probes = tuple(memo[r, task.record_steps] for r in bracket.rates)
        at_max = probe(bracket.lo_rate, True) if bracket.lo_rate > 0 else None
        return SearchResult(task.point_index, task.allocator, task.seed, bracket.lo_rate, bracket.hi_rate,
                            probes, at_max)
    cfg = dep.scheduler_config
    upper = max_clients(scenario.workload, cfg.max_num_seqs, scenario.num_replicas)
    start = min(int(task.start_rate_req_s), upper)
    bracket = bracket_and_bisect(lambda n: probe(n, task.record_steps).ok, start, task.tolerance,
                                 integer=True, upper=upper)
    probes = tuple(memo[n, task.record_steps] for n in bracket.rates)
    lo = int(bracket.lo_rate)
    hi = None if bracket.hi_rate is None else int(bracket.hi_rate)
    at_max = probe(lo, True) if lo > 0 else None
    curve: tuple[Probe, ...] = ()
    if task.curve:
        curve = curve_loads(lambda n: probe(n, task.record_steps), upper,
                            cfg.max_num_seqs * scenario.num_replicas)
    return SearchResult(
        task.point_index, task.allocator, task.seed,
        at_max.rate_req_s if at_max is not None else 0.0,
        memo[hi, task.record_steps].rate_req_s if hi is not None else None,
        probes, at_max, "concurrency", lo if lo > 0 else None, hi, curve)


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
