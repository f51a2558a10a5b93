"""The real-time engine: requests arrive by the wall clock and every step really runs on the device.

The loop is the SimPy engine's (simulator/engine/core.py) with the clock swapped for a real one::

    now = 0
    loop: add every request with arrival <= now to the scheduler
          idle (nothing to run)?  sleep until the next arrival a; now = a
          plan = scheduler.schedule()                     (admitted_s = now)
          runner.execute(plan)                            (synchronized)
          scheduler.complete(plan); now = the clock       (first token / finish = now)
          add the arrivals <= now, record the step

A step lasts from the poll before ``schedule()`` to the poll before the next one, so the
scheduler's own time counts as part of the step, and the recorded step times tile the busy
periods exactly. After an idle wait the step starts at the arrival that
woke the engine (the sleep overshoot counts into that step). Given the recorded durations, the
SimPy engine therefore polls the same arrivals before every ``schedule()`` and makes the same
decisions (see :class:`ReplayLatency`) — the project's "same scheduler, only time differs" claim.

One replica: the trace is served by one scheduler and one runner (one device).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from backend.runner import ModelRunner
from simulator.engine.core import Replica, RequestTimes, SimResult, step_row
from simulator.kv.allocator import KVAllocator
from simulator.kv.paged import PagedAllocator
from simulator.kv.radix import RadixTokenPool
from simulator.latency.profile import features
from simulator.scheduler.plan import StepPlan
from simulator.scheduler import Group, Scheduler, SchedulerConfig, Status, StepOutcome
from workloads.request import Request

WARMUP_PROMPT_TOKENS = 64  # warm-up prompts are capped: long enough to chunk, short enough to be quick
WARMUP_OUTPUT_TOKENS = 8


@dataclass(frozen=True, slots=True)
class StepSample:
    """One executed step: the latency model's features of its plan and what it measured."""

    step_id: int
    features: tuple[float, ...]  # simulator.latency.profile.features(plan, block_size)
    measured_s: float  # the step's wall time, as in the step rows
    execute_s: float  # of which the runner's execute (preparation, copies, forward)


@dataclass
class RealtimeResult(SimResult):
    """A :class:`SimResult` (times in wall seconds since t0) plus one sample per executed step."""

    samples: list[StepSample] = field(default_factory=list)
    time_scale: float = 1.0


class ReplayLatency:
    """A latency model that returns recorded step durations in order: fed a real run's durations,
    the SimPy engine replays that run's timeline."""

    # each call takes the next recorded duration: the engine must time every step, in order,
    # and no step twice (simulator.latency.LatencyModel.quiet_runs)
    quiet_runs = False

    def __init__(self, durations_s: Sequence[float]):
        self._durations = list(durations_s)
        self._next = 0

    def step_latency_s(self, plan: StepPlan) -> float:
        if self._next >= len(self._durations):
            raise RuntimeError(f"replay has only {len(self._durations)} recorded steps")
        self._next += 1
        return self._durations[self._next - 1]


def run_realtime(
    requests: Sequence[Request],
    make_replica: Callable[[int], tuple[Scheduler, KVAllocator]],
    runner: ModelRunner,
    *,
    time_scale: float = 1.0,
    warmup_steps: int = 8,
    on_progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> RealtimeResult:
    """Serve ``requests`` (sorted by arrival) in real time; every request ends finished or rejected.

    ``make_replica(i)`` builds a detail-mode scheduler over a paged allocator (e.g.
    ``deployment.replica_factory("paged", detail=True)``); it is called twice: once for
    ``warmup_steps`` throw-away steps before t0 (Triton compilation, CUDA-graph capture), once
    for the measured run. Request ``i`` arrives at ``arrival_s × time_scale`` after t0; the
    result's requests carry those scaled arrivals, so its frames read in wall seconds.
    ``on_progress(count)`` is told of finished or rejected requests; ``clock`` and ``sleep`` are
    the wall clock (seconds). Raises ValueError for a scheduler or allocator the runner cannot
    serve (its steps must fit the runner: :func:`max_step_tokens`), RuntimeError if the scheduler
    is stuck with work left.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    scaled = [replace(r, arrival_s=r.arrival_s * time_scale) for r in requests]
    if len({r.request_id for r in scaled}) != len(scaled):
        raise ValueError("request ids must be unique")
    runner.prepare()
    _warm_up(make_replica, runner, scaled, warmup_steps)
    scheduler, allocator = make_replica(0)
    _check_compatible(scheduler, allocator, runner)
    loop = _Loop(scaled, scheduler, allocator, runner, on_progress)
    t0 = clock()
    while True:
        loop.arrive_until(loop.now)
        plan = scheduler.schedule() if scheduler.has_work else None
        if plan is not None:
            loop.admitted(scheduler.newly_admitted)
        if plan is None or plan.is_empty:
            if loop.next_arrival >= len(scaled):
                if plan is None:
                    break
                raise RuntimeError(f"the scheduler cannot schedule anything but has work left "
                                   f"({len(scheduler.waiting)} waiting, {len(scheduler.swapped)} swapped)")
            loop.now = _sleep_until(scaled[loop.next_arrival].arrival_s, t0, clock, sleep)
            continue
        start = loop.now
        before = clock()
        runner.execute(plan)
        execute_s = clock() - before
        outcome = scheduler.complete(plan)
        loop.now = clock() - t0
        loop.record(plan, outcome, start, execute_s)
    loop.check_accounted()
    return RealtimeResult(scaled, loop.groups, loop.times, loop.steps, loop.now,  # type: ignore[arg-type]
                          [Replica(0, scheduler, allocator)], loop.samples, time_scale)


class _Loop:
    """The run's state and records; times are seconds since t0 (``now``: the engine's time)."""

    def __init__(self, requests: list[Request], scheduler: Scheduler, allocator: KVAllocator,
                 runner: ModelRunner, on_progress: Callable[[int], None] | None):
        self.requests = requests
        self.scheduler = scheduler
        self.allocator = allocator
        self.block_size = runner.block_size
        self.on_progress = on_progress
        self.index_of = {r.request_id: i for i, r in enumerate(requests)}
        self.groups: list[Group | None] = [None] * len(requests)
        self.times = [RequestTimes(replica=0) for _ in requests]
        self.steps: list[tuple] = []
        self.samples: list[StepSample] = []
        self.next_arrival = 0
        self.now = 0.0

    def arrive_until(self, now: float) -> None:
        """Queue every request that has arrived by ``now`` (a rejection accounts for it at once)."""
        requests = self.requests
        while self.next_arrival < len(requests) and requests[self.next_arrival].arrival_s <= now:
            g = self.scheduler.add_request(requests[self.next_arrival])
            self.groups[self.next_arrival] = g
            if g.status is Status.REJECTED:
                self._account(1)
            self.next_arrival += 1

    def admitted(self, groups: Sequence[Group]) -> None:
        for g in groups:
            t = self.times[self.index_of[g.request_id]]
            if t.admitted_s < 0:
                t.admitted_s = self.now

    def record(self, plan: StepPlan, outcome: StepOutcome, start: float, execute_s: float) -> None:
        """Time-stamp the step's outcome and append its row, as the SimPy engine does."""
        sched, now = self.scheduler, self.now
        self.arrive_until(now)  # requests that arrived during the step are queued when it is recorded
        for g in outcome.first_token:
            self.times[self.index_of[g.request_id]].first_token_s = now
        for g in outcome.finished:
            self.times[self.index_of[g.request_id]].finished_s = now
        self._account(len(outcome.finished))
        self.steps.append(step_row(0, plan, start, now - start, sched, self.allocator))
        self.samples.append(StepSample(plan.step_id, features(plan, self.block_size), now - start, execute_s))

    def check_accounted(self) -> None:
        unaccounted = [self.requests[i].request_id for i, g in enumerate(self.groups)
                       if g is None or g.status not in (Status.FINISHED, Status.REJECTED)]
        if unaccounted:
            raise RuntimeError(f"{len(unaccounted)} requests neither finished nor rejected: "
                               f"{unaccounted[:5]}")

    def _account(self, count: int) -> None:
        if self.on_progress is not None and count:
            self.on_progress(count)


def _sleep_until(arrival_s: float, t0: float, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> float:
    """Wait for the next arrival; the engine's time becomes that arrival's (see module docstring)."""
    remaining = arrival_s - (clock() - t0)
    if remaining > 0:
        sleep(remaining)
    return arrival_s


def max_step_tokens(config: SchedulerConfig) -> int:
    """The most tokens one step of ``config``'s engine can hold: what a runner must be sized for.

    vLLM (V0 and V1): ``max_num_batched_tokens``, one budget for decodes and prefill chunks
    (vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``: ``token_budget =
    self.max_num_scheduled_tokens``). SGLang: a step prefills or decodes, never both (no mixed
    chunks: simulator/scheduler/sglang.py). A decode step runs one token per running request, up
    to ``max_num_seqs`` (``--max-running-requests``), which SGLang does not bound by the chunk
    size. A prefill batch stays within ``chunked_prefill_size`` (``max_num_batched_tokens``);
    without chunked prefill only the requests after a batch's first must fit in
    ``max_prefill_tokens``, the first goes in whole (python/sglang/srt/managers/schedule_policy.py,
    ``PrefillAdder.add_one_req``), so a batch holds at most max(max_prefill_tokens, max_model_len).
    """
    if config.engine != "sglang":
        return config.max_num_batched_tokens
    if config.enable_chunked_prefill:
        prefill = config.max_num_batched_tokens
    else:
        prefill = max(config.max_prefill_tokens, config.max_model_len)
    return max(prefill, config.max_num_seqs)


def _check_compatible(scheduler: Scheduler, allocator: KVAllocator, runner: ModelRunner) -> None:
    if not scheduler.detail:
        raise ValueError("the real engine needs a detail-mode scheduler (replica_factory(..., detail=True))")
    if not isinstance(allocator, (PagedAllocator, RadixTokenPool)):
        raise ValueError("the real engine runs a paged KV pool (vLLM's blocks or SGLang's pages), "
                         f"not {type(allocator).__name__}")
    if allocator.block_size != runner.block_size or allocator.num_blocks > runner.num_blocks:
        raise ValueError(f"the allocator's {allocator.num_blocks} blocks of {allocator.block_size} do "
                         f"not fit the runner's {runner.num_blocks} blocks of {runner.block_size}")
    cfg = scheduler.config
    tokens = max_step_tokens(cfg)
    if cfg.max_num_seqs > runner.max_num_seqs or tokens > runner.max_num_batched_tokens:
        raise ValueError(f"the scheduler's steps (up to {cfg.max_num_seqs} sequences, {tokens} tokens) "
                         f"exceed the runner's ({runner.max_num_seqs}, {runner.max_num_batched_tokens})")
    if -(-cfg.max_model_len // cfg.block_size) > runner.max_blocks_per_seq:
        raise ValueError("the scheduler's max_model_len exceeds the runner's")


def _warm_up(make_replica: Callable[[int], tuple[Scheduler, KVAllocator]], runner: ModelRunner,
             requests: Sequence[Request], num_steps: int) -> None:
    """Throw-away steps on a separate scheduler and allocator, shaped like the trace's first
    requests (prompts capped), so compilation and first-touch costs fall before t0."""
    if num_steps <= 0 or not requests:
        return
    scheduler, allocator = make_replica(0)
    _check_compatible(scheduler, allocator, runner)
    for i, r in enumerate(requests[:4]):
        scheduler.add_request(Request(i, 0.0, min(r.prompt_tokens, WARMUP_PROMPT_TOKENS),
                                      min(r.output_tokens, WARMUP_OUTPUT_TOKENS)))
    for _ in range(num_steps):
        if not scheduler.has_work:
            break
        plan = scheduler.schedule()
        if plan.is_empty:
            break
        runner.execute(plan)
        scheduler.complete(plan)
