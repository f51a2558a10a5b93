"""The maximum load a deployment sustains under an SLO: one search per (point, allocator, seed).

The load is a mean request rate (``search="rate"``) or a number of closed-loop clients
(``search="concurrency"``: the workload sent by N clients, each sending its next request when its
previous one ends, as ``vllm bench serve --max-concurrency N`` does; see :mod:`workloads.clients`).

A *probe* replays the scenario's workload rescaled to one mean rate (``workload.rate``) and checks
the SLO on the result. The search brackets the threshold by doubling (or halving) the rate from a
start, then bisects the bracket ``[lo, hi]`` until ``hi − lo ≤ tolerance × lo``::

    start ──×2──×2──×2 (fails)          lo = last passing rate, hi = first failing rate
                 lo ├───────────┤ hi    bisect: mid passes -> lo = mid, fails -> hi = mid
                     lo ├─────┤ hi      ... until (hi − lo) / lo ≤ tolerance; the answer is lo

The answer is the highest probed rate that held, with the next failing one within tolerance. A
rate search starts (unless ``--start-rate`` says where) at half an analytic ceiling ``U`` on the
rate — what the KV pool, the batch limit and the step time allow at best
(:mod:`simulator.commands.capacity.bound`); from the first failure (or pass) bisection starts on a
bracket of a factor of two: about 2 + log2(1 / tolerance) probes. ``U`` leaves out prefill and
the p99 tails, so it lies 2–10× above the answer on the bundled scenarios and the first probe
usually fails — within seconds of simulated time, as a probe far above capacity stops early.

**Warm starts.** The points of a sweep that differ only in its last knob (a block size, say) often
share their threshold, or nearly: ``kvplan capacity`` runs their searches in order as one chain
(:func:`run_chain`), and each starts at the previous one's bracket ``[lo, hi]`` — ``lo`` first,
then ``hi`` — instead of at ``U / 2``. When the threshold has not moved, those two probes are the
answer (a pass and a failure within the tolerance); when it has, the steps away from ``lo`` grow
(×(hi/lo), then squared each time, up to ×2) until a probe crosses it, and bisection goes on as
from any bracket. The answer is the same kind of bracket, of the same width, probed on the point
itself; the start only changes which bracket of that width is found. On ``capacity-chat.yaml``
(144 searches) this halves the probes and leaves every answer as it was.

**Probes stop early.** A probe whose TTFT, TPOT or E2E p99 bound is already certainly broken —
more measured requests exceeded it than the 99th percentile allows — stops there
(:class:`simulator.commands.capacity.stop.SloStopRule`, passed to the engine as ``stop_if``): it fails, its
``failures`` says why and ``stopped_at_s`` when, and its statistics are left empty (None, 0),
since the requests that had not ended would have changed them. Overloaded probes, the costliest
to simulate in full, are the ones that stop soonest.

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
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine import metrics
from simulator.engine.saturation import MAX_QUEUE_GROWTH, queue_growth_of
from simulator.commands.capacity.bound import RateBound, rate_bound
from simulator.commands.capacity.options import SEARCHES
from simulator.commands.capacity.stop import SloStopRule
from simulator.config.deployment import Deployment, build_deployment
from simulator.engine.core import SimResult, simulate
from simulator.errors import KvplanError
from simulator.config.scenario import SLOSpec, parse_scenario
from simulator.scheduler import Status
from workloads.clients import OPEN_LOOP, Clients
from workloads.request import Request
from workloads.spec import WorkloadSpec, build_requests, resolve_trace_path, shape_trace
from workloads.synthetic import rescale_to_rate

MAX_DOUBLINGS = 24  # start × 2^24: beyond that the SLO holds "at every rate" (too short a trace)
MAX_HALVINGS = 16  # start / 2^16: below that the SLO fails "at every rate"
MAX_STEP = 2  # the largest bracketing factor: doubling or halving (an int: integer loads stay ints)
# bump when a probe's meaning changes, so old cache files are not reused. 5: probes stop early
# (stopped_at_s), and TTFT/E2E include the latency model's request_overhead_s. 6: a scenario
# without `engine:` runs vLLM V1 (it ran V0's policy), and probes route by `router:`
CACHE_VERSION = 7
FALLBACK_START_REQ_S = 1.0  # a rate search's start when the workload gives no lengths to bound it
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
                       integer: bool = False, upper: float | None = None,
                       fails_everywhere: Callable[[float], bool] | None = None,
                       step: float = MAX_STEP) -> Bracket:
    """Find the largest load for which ``holds(load)`` is True, to relative ``tolerance``.

    Contract: when a load passes and another fails, the result has ``lo < hi`` and
    ``hi − lo ≤ tolerance × lo`` (``integer``: loads are whole numbers ≥ 1 and
    ``hi − lo ≤ max(1, ⌊tolerance × lo⌋)``); no load above ``upper`` is tried (reaching it and
    passing there ends the search unbounded). ``holds`` is called once per distinct load, in the
    order of ``Bracket.rates``. Deterministic: the loads depend only on the answers.
    ``fails_everywhere(load)``, asked after a load fails while none has passed: True when that
    failure shows every load would fail, which ends the search there (no halving down to
    nothing).

    ``step`` is the first bracketing factor: the second load is ``start × step`` (the start
    passed) or ``start / step`` (it failed), and each further load in the same direction squares
    the factor, up to :data:`MAX_STEP` (doubling). The default doubles from the start; a start
    already close to the threshold (a warm start: :func:`run_chain`) takes a small first step,
    so that two probes can bracket it within the tolerance. A rate search only (``integer``
    loads double).
    """
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise ValueError(f"start_rate must be positive and finite, got {start_rate}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    if integer and (start_rate != int(start_rate) or (upper is not None and upper != int(upper))):
        raise ValueError(f"an integer search needs whole numbers, got {start_rate} and {upper}")
    if upper is not None and not upper >= start_rate:
        raise ValueError(f"upper {upper} is below the start {start_rate}")
    if not 1 < step <= MAX_STEP or (integer and step != MAX_STEP):
        raise ValueError(f"step must be in (1, {MAX_STEP}] ({MAX_STEP} for an integer search), got {step}")
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
            nxt = lo * step if upper is None else min(lo * step, upper)
            if not probe(nxt):
                hi = nxt
                break
            lo = nxt
            step = min(step * step, MAX_STEP)
        else:
            return Bracket(lo, None, tuple(rates))
    else:
        hi = start_rate
        for _ in range(max_halvings):
            nxt = hi // 2 if integer else hi / step
            if nxt < (1 if integer else 0) or nxt == hi:
                return Bracket(0.0, hi, tuple(rates))
            if fails_everywhere is not None and fails_everywhere(hi):
                return Bracket(0.0, hi, tuple(rates))
            if probe(nxt):
                lo = nxt
                break
            hi = nxt
            step = min(step * step, MAX_STEP)
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
    run window when ``steady`` is False.

    A probe stopped early (``stopped_at_s``: the simulated time it stopped at) failed on the
    bound its ``failures`` names; its latency percentiles, rates and KV fields are None or 0:
    the requests that had not ended would have changed them."""

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
    stopped_at_s: float | None = None  # stopped early, its SLO certainly broken (module docstring)
    tpot_mean_s: float | None = None  # 1 / this: the output tokens/s a stream sees (tokens/s/user)

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
    if rejects_too_many(slo, num_requests=num_requests, rejected=rejected):
        failures.append(f"rejected {rejected:,} of {num_requests:,} requests ({rejected / num_requests:.2%})"
                        f" > {slo.max_rejected_fraction:.2%}, whatever the rate")
    if completed == 0:
        failures.append("no request finished")
    for label, value, bound in (("TTFT", ttft_p99_s, slo.ttft_p99_s), ("TPOT", tpot_p99_s, slo.tpot_p99_s),
                                ("E2E", e2e_p99_s, slo.e2e_p99_s)):
        if bound is not None and value is not None and value > bound:
            failures.append(f"{label} p99 {value:.4g} s > {bound:g} s")
    if queue_growth > MAX_QUEUE_GROWTH:
        failures.append(f"unstable: queueing delay grows {queue_growth:.3g} s per s")
    return tuple(failures)


def rejects_too_many(slo: SLOSpec, *, num_requests: int, rejected: int) -> bool:
    """Whether more requests were rejected than the SLO allows. The scheduler rejects a request
    when it arrives, for what it is (longer than max_model_len, more KV than the pool, more
    sequences than max_num_seqs), never for the load: the same requests fail so at every rate."""
    return bool(num_requests) and rejected / num_requests > slo.max_rejected_fraction


def queue_growth(requests: pd.DataFrame, offered_s: np.ndarray | None = None) -> float:
    """:func:`simulator.engine.saturation.queue_growth_of` of a requests frame (``simulate`` flags a
    saturated run with the same test)."""
    return queue_growth_of(requests.status.to_numpy(), requests.arrival_s.to_numpy(),
                           requests.queue_delay_s.to_numpy(), offered_s)


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


def simulate_probe(dep: Deployment, allocator: str, rate_req_s: float | None, seed: int, slo: SLOSpec,
                   requests: list[Request], *, record_steps: bool, clients: Clients = OPEN_LOOP,
                   stop_early: bool = False, macro_steps: bool = True) -> Probe:
    """Replay ``requests`` (already at ``rate_req_s``) sent by ``clients`` on ``dep`` and check
    ``slo``. ``rate_req_s`` None: a closed loop, whose rate is the one its clients achieve.

    ``stop_early``: stop once a latency bound is certainly broken (module docstring; a rate
    probe only). ``macro_steps`` False: the engine runs every step on its own (the same results,
    slower: the baseline ``benchmarks/capacity.py`` compares with)."""
    rule = None
    if stop_early:
        assert rate_req_s is not None, "a closed loop's probes are not stopped early"
        rule = SloStopRule(slo, requests, warmup_requests=clients.warmup_requests,
                           request_overhead_s=float(getattr(dep.latency, "request_overhead_s", 0.0)))
    # no step rows: the KV figures and the peak batch come from the run's exact totals
    # (simulator.engine.steps.StepTotals), kept over every step, quiet runs included
    result = simulate(requests, dep.replica_factory(allocator), dep.latency,
                      num_replicas=dep.scenario.num_replicas, clients=clients, record_steps=False,
                      macro_steps=macro_steps, stop_if=rule if rule is not None and rule.active else None,
                      router=dep.scenario.router.config())
    # admissions the KV pool refused, each engine's own count (simulator/scheduler/)
    refusals = sum(rep.scheduler.num_kv_refusals for rep in result.replicas)
    max_batch = result.totals().max_batch
    if result.stopped is not None:
        assert rate_req_s is not None
        return stopped_probe(result, rate_req_s, seed, max_batch, refusals)
    frame = metrics.requests_frame(result)
    s = metrics.summarize(result, frame, None, dep.capacity_tokens)
    return probe_of_run(result, frame, s, rate_req_s, seed, slo, clients, record_steps=record_steps,
                        capacity_tokens=dep.capacity_tokens, max_batch_size=max_batch,
                        num_kv_refusals=refusals)


def probe_of_run(result: SimResult, frame: pd.DataFrame, s: dict[str, Any], rate_req_s: float | None,
                 seed: int, slo: SLOSpec, clients: Clients, *, record_steps: bool, capacity_tokens: int,
                 max_batch_size: int, num_kv_refusals: int) -> Probe:
    """The :class:`Probe` of a run that ended: ``frame`` its requests (a
    :func:`simulator.engine.metrics.requests_frame`), ``s`` its summary (:func:`simulator.engine.metrics.summarize`
    over a pool of ``capacity_tokens``), the SLO checked on them. Shared by aggregated probes and
    disaggregated ones (:mod:`simulator.commands.capacity.disagg_search`), whose merged run has both
    pools' requests and the decode pool's steps."""
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
    num_requests = len(result.requests)
    failures = check_slo(slo, num_requests=num_requests, completed=s["completed"], rejected=s["rejected"],
                         ttft_p99_s=p99["ttft_s"], tpot_p99_s=p99["tpot_s"], e2e_p99_s=p99["e2e_s"],
                         queue_growth=growth)
    kv: dict[str, float | None] = {"kv_used_mean": None, "kv_used_peak": None, "kv_token_state_mean": None}
    totals = result.totals()
    if record_steps and totals.num_steps:
        # max(0, ...): 1 − free − external can come out as −1e-16 for an idle pool
        kv = {"kv_used_mean": max(0.0, 1.0 - s["kv"]["free"] - s["kv"]["external_fragmentation"]),
              "kv_used_peak": totals.peak_used / capacity_tokens,
              "kv_token_state_mean": s["kv"]["token_state"]}
    return Probe(
        rate_req_s=rates.rate_req_s if closed_loop else rate_req_s, seed=seed, ok=not failures,
        failures=failures, num_requests=num_requests, completed=s["completed"], rejected=s["rejected"],
        throughput_req_s=rates.throughput_req_s, throughput_tok_s=rates.throughput_tok_s,
        goodput_req_s=rates.goodput_req_s, window_s=rates.window_s, steady=rates.steady,
        served_tok_s=served,
        ttft_p99_s=p99["ttft_s"], tpot_p99_s=p99["tpot_s"], e2e_p99_s=p99["e2e_s"],
        queue_delay_p99_s=p99["queue_delay_s"], queue_growth=growth,
        max_batch_size=max_batch_size, num_kv_refusals=num_kv_refusals, num_preemptions=s["num_preemptions"],
        concurrency=clients.max_in_flight if closed_loop else None, tpot_mean_s=s["tpot_s"]["mean"], **kv,
    )


def stopped_probe(result: SimResult, rate_req_s: float, seed: int, max_batch_size: int,
                   num_kv_refusals: int) -> Probe:
    """The record of a probe stopped early: failed, on ``result.stopped``; the counts are those
    at the stop, and nothing is measured over requests that had not ended (Probe docstring)."""
    ended = Counter(g.status for g in result.groups if g is not None)
    return Probe(
        rate_req_s=rate_req_s, seed=seed, ok=False, failures=(str(result.stopped),),
        num_requests=len(result.requests), completed=ended[Status.FINISHED], rejected=ended[Status.REJECTED],
        throughput_req_s=0.0, throughput_tok_s=0.0, goodput_req_s=0.0, ttft_p99_s=None, tpot_p99_s=None,
        e2e_p99_s=None, queue_delay_p99_s=None, queue_growth=0.0, max_batch_size=max_batch_size,
        num_kv_refusals=num_kv_refusals,
        num_preemptions=sum(rep.scheduler.num_preemptions for rep in result.replicas),
        window_s=0.0, stopped_at_s=result.end_s,
    )


# --- one search (the unit of parallel work) -------------------------------------------------


CURVE_MIN_GAIN = 0.05  # the curve stops once doubling the clients adds less than 5% throughput


@dataclass(frozen=True, slots=True)
class SearchTask:
    """Everything a worker needs, as plain data (it crosses process and Ray boundaries).

    ``scenario`` is the point's resolved scenario mapping with ``allocators`` set to this
    allocator and ``seed`` to this seed; ``base_dir`` anchors its relative paths. ``search`` is
    what varies: ``rate`` (``start_rate_req_s`` is the first rate; None: half the analytic
    ceiling, :mod:`simulator.commands.capacity.bound`) or ``concurrency`` (closed-loop clients;
    ``start_rate_req_s`` is the first number of clients). ``curve``: also measure the
    throughput-latency curve over 1, 2, 4, ... clients (concurrency only). ``macro_steps`` False:
    the engine runs every step on its own (same results, slower; for benchmarks).
    """

    point_index: int
    scenario: dict[str, Any]
    where: str  # for error messages: the file and the sweep point
    base_dir: str
    allocator: str
    seed: int
    start_rate_req_s: float | None
    tolerance: float
    record_steps: bool  # KV data on every probe (the KV-utilization plot needs it)
    cache_dir: str | None
    search: str = "rate"
    curve: bool = False
    macro_steps: bool = True

    def __post_init__(self) -> None:
        assert self.search in SEARCHES, self.search
        assert not self.curve or self.search == "concurrency", "a curve is over concurrency"
        assert self.start_rate_req_s is not None or self.search == "rate", "clients start from a number"


@dataclass(frozen=True, slots=True)
class SearchResult:
    """One seed's answer: the bracket, every probe in order, and the probe at the highest passing
    load with KV data (``None`` when none passed).

    ``lo_rate_req_s``/``hi_rate_req_s`` are rates: the bracket of a rate search, or the rates the
    clients achieved at ``lo_concurrency``/``hi_concurrency`` (0.0/None when there is no such
    probe) for a concurrency search. ``curve``: probes at 1, 2, 4, ... clients (see
    :func:`curve_loads`), empty unless asked for. ``bound``: the analytic ceiling a rate search
    started from (None when it was given a start, and for a concurrency search)."""

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
    bound: RateBound | None = None


def cache_key(scenario: dict[str, Any], base_dir: str, allocator: str, load: float, seed: int,
              record_steps: bool) -> str:
    """Hex digest naming one probe's cache file (``load``: its rate, or its number of clients)."""
    payload = {"version": CACHE_VERSION, "scenario": scenario, "base_dir": base_dir, "allocator": allocator,
               "load": load, "seed": seed, "record_steps": record_steps}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cached_probe(cache_dir: str | None, scenario: dict[str, Any], base_dir: str, allocator: str, load: float,
                 seed: int, record_steps: bool, run: Callable[[], Probe]) -> Probe:
    """The probe of ``scenario`` (its mapping at this load) from the cache under ``cache_dir``
    when there (one recorded with KV data also answers a request without it, its KV fields
    dropped as a fresh probe has them), else ``run()``'s, written there. ``cache_dir`` None:
    always ``run()``."""
    if cache_dir is None:
        return run()
    for recorded in (record_steps, True):
        key = cache_key(scenario, base_dir, allocator, load, seed, recorded)
        cached = _read_cache(Path(cache_dir) / f"{key}.json")
        if cached is not None:
            if recorded and not record_steps:
                cached = dataclasses.replace(cached, kv_used_mean=None, kv_used_peak=None,
                                             kv_token_state_mean=None)
            return cached
    result = run()
    key = cache_key(scenario, base_dir, allocator, load, seed, record_steps)
    _write_cache(Path(cache_dir) / f"{key}.json", result)
    return result


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

    A trace is parsed once per process (:func:`parsed_trace`: every search of a sweep in a worker
    shares it); each load then reshapes it with :func:`workloads.spec.shape_trace`, the very
    function ``build_requests`` uses (so the same requests, bit for bit): parsing is most of the
    cost of building a trace's requests, as much as a short simulation. At a rate, a trace's
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

    @property
    def same_requests_at_every_rate(self) -> bool:
        """Whether :meth:`at_rate` sends the same requests (lengths, samples) at every rate, only
        at other times: a trace's selection, or a synthetic workload of a number of requests
        (its lengths are drawn apart from its arrivals). Over a duration the count varies."""
        return self.spec.trace is not None or (self.spec.num_requests is not None
                                                and self.spec.duration_s is None)

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
            self._full = parsed_trace(bare, self.base_dir)
        try:
            return shape_trace(self._full, spec)
        except KvplanError as err:
            raise KvplanError(f"workload: {err}") from None


TRACE_CACHE_SIZE = 4  # parsed traces kept per process (the bundled Azure one is ~19k requests)
_traces: OrderedDict[tuple[str, int, int, str], list[Request]] = OrderedDict()


def parsed_trace(spec: WorkloadSpec, base_dir: Path) -> list[Request]:
    """``build_requests(spec)`` for a trace ``spec`` that selects nothing (the whole trace at its
    own rate), parsed once per process: a sweep's searches in one worker, and the probes of each,
    share it. The key is the file (resolved path, modification time and size: an edited trace is
    read again) and the spec (format and column options; a trace ignores the seed). Callers
    must not modify the list (shape_trace and rescaling build new ones)."""
    assert spec.trace is not None
    try:
        path = resolve_trace_path(spec.trace, base_dir).resolve()
        stat = path.stat()
    except (KvplanError, OSError):  # build_requests says what is wrong, as a workload error
        return build_requests(spec, seed=0, base_dir=base_dir)
    key = (str(path), stat.st_mtime_ns, stat.st_size, spec.model_dump_json())
    if key in _traces:
        _traces.move_to_end(key)
        return _traces[key]
    requests = build_requests(spec, seed=0, base_dir=base_dir)
    _traces[key] = requests
    while len(_traces) > TRACE_CACHE_SIZE:
        _traces.popitem(last=False)
    return requests


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


def run_chain(chain: Sequence[SearchTask]) -> list[SearchResult]:
    """Run ``chain``'s searches in order, each started from the one before (:func:`warm_start`).

    ``kvplan capacity`` chains the searches of sweep points that differ only in the sweep's last
    knob (same allocator and seed): their thresholds are often equal or close (a block size
    the pool is not short of changes nothing), and a search that starts at its neighbour's
    bracket confirms it in two probes — a pass at ``lo`` (the whole trace) and a failure at
    ``hi`` (stopped early) — where a cold one spends about seven. The answer of each search is
    its own bracket, probed on its own point; only where it starts depends on the chain."""
    results: list[SearchResult] = []
    for task in chain:
        results.append(run_search(task, results[-1] if results else None))
    return results


def warm_start(after: SearchResult | None) -> tuple[float, float] | None:
    """``(start, step)`` for :func:`bracket_and_bisect` from the previous search of a chain: its
    bracket, ``lo`` as the start and ``hi / lo`` (at most ``1 + tolerance``) as the first step,
    so that the search's first two probes are that bracket. None — start cold, at half the
    analytic ceiling — without a previous rate search that found a bracket.

    The bracket is not scaled by the two points' ceilings: on ``capacity-chat.yaml`` they are a
    poor guide to how the answer moves (fp8 KV raises the ceiling of Llama-3.1-8B on an A100 by
    half and its answer by 2.5%; an H100 in place of the A100 raises the ceiling by 57% and the
    answer 3.3-fold)."""
    if after is None or after.search != "rate" or after.lo_rate_req_s <= 0 or after.hi_rate_req_s is None:
        return None
    return after.lo_rate_req_s, min(after.hi_rate_req_s / after.lo_rate_req_s, MAX_STEP)


def run_search(task: SearchTask, after: SearchResult | None = None) -> SearchResult:
    """Search one (point, allocator, seed); probes come from the cache when present.

    A rate search without ``start_rate_req_s`` starts at half the analytic ceiling or, given
    ``after`` (the previous search of a chain, :func:`run_chain`), at that search's bracket.
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
                                  record_steps=record_steps, clients=clients, macro_steps=task.macro_steps)
        requests = workload.at_rate(load)
        clients = scenario.workload.client_policy(len(requests))
        return simulate_probe(dep, task.allocator, load, task.seed, slo, requests,
                              record_steps=record_steps, clients=clients, stop_early=True,
                              macro_steps=task.macro_steps)

    def probe(load: float, record_steps: bool) -> Probe:
        if (load, record_steps) not in memo:
            memo[load, record_steps] = cached_probe(
                task.cache_dir, scenario_at(load), task.base_dir, task.allocator, load, task.seed,
                record_steps, lambda: simulate_at(load, record_steps))
        return memo[load, record_steps]

    if not by_clients:
        bound = None
        start = task.start_rate_req_s
        step = MAX_STEP
        if start is None:
            # any rate gives the lengths; a synthetic workload of a duration may draw none at 1 req/s
            sample = workload.at_rate(1.0)
            bound = rate_bound(dep, task.allocator, sample, slo) if sample else None
            start = bound.start_req_s if bound is not None else FALLBACK_START_REQ_S
            start, step = warm_start(after) or (start, step)

        def fails_everywhere(rate: float) -> bool:
            """A probe run to the end that rejected too many requests: so would every rate, when
            every rate sends the same requests (rejections do not depend on the load)."""
            p = memo[rate, task.record_steps]
            return (workload.same_requests_at_every_rate and p.stopped_at_s is None
                    and rejects_too_many(slo, num_requests=p.num_requests, rejected=p.rejected))

        bracket = bracket_and_bisect(lambda r: probe(r, task.record_steps).ok, start, task.tolerance,
                                     fails_everywhere=fails_everywhere, step=step)
        probes = tuple(memo[r, task.record_steps] for r in bracket.rates)
        at_max = probe(bracket.lo_rate, True) if bracket.lo_rate > 0 else None
        return SearchResult(task.point_index, task.allocator, task.seed, bracket.lo_rate, bracket.hi_rate,
                            probes, at_max, bound=bound)
    assert task.start_rate_req_s is not None
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
