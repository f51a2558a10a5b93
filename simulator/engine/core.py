"""The SimPy engine: clients send requests; each replica loops schedule -> timed step -> complete.

::

    workload ─clients─route─> replica 0: schedule() ─> yield timeout(latency(plan)) ─> complete()
                              replica 1: ...

The clients (:class:`workloads.clients.Clients`) decide when each request is *sent*: at its
arrival time (open loop), or, with ``max_in_flight`` N, not before one of N slots is free (a cap
on requests in flight; with every arrival at 0.0 it is a closed loop of N clients). A request
whose send waited carries its send time as ``arrival_s`` in the result: TTFT, E2E and queueing
are measured from the send, as ``vllm bench serve`` measures them (source cited in
:mod:`workloads.clients`).

An idle replica waits on an event that the next routed request triggers; it never busy-steps.
Event order:

* At equal times SimPy runs events first scheduled first (FIFO). An open-loop arrival at exactly
  the end of a step is queued before that replica schedules its next step only if the arrival
  process ran first; both orders are deterministic for a given trace.
* A step's finished requests free their client slots right after ``complete(plan)`` and the
  step's row, in the same process, and the next requests are sent (routed and queued) before
  that replica's next ``schedule()``. So with one replica, a closed loop without think time
  feeds the scheduler the same requests before the same steps whatever the step durations: its
  sequence of batches does not depend on the latency model (tests rely on that). Nor does a
  burst's (every request sent at 0.0, before the first step).
* With ``think_time_s`` > 0 a freed slot opens ``think_time_s`` later (a timeout whose callback
  sends), in the order the slots were freed.

Times are recorded per request (send, admission, first token, finish) and per step (start,
duration, batch, KV breakdown: :mod:`simulator.engine.steps`, every step or per-second bins, with exact
totals). Nothing here knows how scheduling or allocation work.

Steps without events. A step (or quiet run) that ends strictly before every event in SimPy's
queue ends with nothing else happening in between, so the replica moves the clock itself and
carries on (``_Environment.advance_to``) instead of yielding a timeout: the same clock values,
the same order of everything else (open-loop arrivals are timeouts in the queue, so a step never
passes one). On one replica most steps go this way; on several, a step usually ends after
another replica's and waits as before.

Quiet runs (macro-steps). Most steps are alike: between two events the decode batch is the same
and every context grows by one token. When a step's plan is decode-only (nothing admitted,
preempted, swapped or copied), the scheduler says how many steps after it are sure to be the
same (:meth:`~simulator.scheduler.Scheduler.quiet_run`: up to the next finish, a growth that
could fail or copy, a beam event; at most :data:`MAX_RUN_STEPS`), and when they are at least
:data:`MIN_RUN_STEPS` the engine runs them without a SimPy event per step:

* The step durations come from the latency model one by one
  (:func:`simulator.latency.quiet_latencies`, exact; a model with state sets ``quiet_runs =
  False`` and is timed step by step), and the step start times are the clock's sums, one
  addition at a time, as SimPy would make them.
* Only a request sent to this replica can change the batch before the run's end. It is held
  back (routed and counted, not yet queued) and interrupts the run, which is cut at the first
  step start that would have seen it: one sent before that start, or at that very instant by
  an event made before the previous step began (SimPy processes one instant's events in the
  order they were made; the engine stamps the events that send with a sequence number). The
  held requests are queued before the schedule() that sees them, the others right after.
* The run's last step ends with its own event, made when that step starts, as one step at a
  time would make it; the steps before it take one event in all.
* :meth:`~simulator.scheduler.Scheduler.advance_quiet` applies the run: the block-boundary
  growths at their steps, in order (so block ids and evictions are the same), the finishes at
  the end. The step rows are recorded per stretch of unchanged allocator state, in closed form.

So per-request times, decisions and full step rows equal, bit for bit, the one-step-at-a-time
run (``macro_steps=False``); the summary's sums over steps agree to rounding (1e-9).
tests/simulator/test_quiet_runs.py checks every bundled scenario, random workloads with
clients and replicas, and arrivals on a run's very step boundaries. One case is not exact:
with several replicas or clients, another event at *exactly* the float instant of a step
boundary inside a run (not a send to this replica) may be ordered differently against this
replica's steps than one step at a time would order it. Float step times from the roofline or
a profile and real arrival times practically never tie; a constant step time with arrivals on
its grid can. With several replicas, rows of steps that end at the same instant may also be
recorded in the other order.

Programmatic use (a fixed-length closed loop of 64 clients)::

    from workloads.spec import parse_workload, build_requests
    spec = parse_workload({"prompt_tokens": {"dist": "fixed", "value": 1000},
                           "output_tokens": {"dist": "fixed", "value": 1000},
                           "num_requests": 640, "concurrency": 64}, "where")
    requests = build_requests(spec, seed=0, base_dir=Path("."))
    result = simulate(requests, deployment.replica_factory("paged"), deployment.latency,
                      clients=spec.client_policy(len(requests)))
    # or simulator.engine.runs.run_allocator(deployment, "paged", requests, clients=...)
    # for the request/step frames and the summary; rate: inf (burst) and rate + max_concurrency
    # are spelled in the same workload mapping.
"""

from __future__ import annotations

import dataclasses
import gc
from array import array
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from bisect import bisect_right
from heapq import heappush
import itertools

import simpy
from simpy.events import NORMAL

from simulator.kv.allocator import KVAllocator
from simulator.latency import LatencyModel, quiet_latencies
from simulator.scheduler.router import Router, RouterConfig
from simulator.scheduler import Group, Scheduler, Status
from simulator.engine.steps import DEFAULT_BIN_S, STEP_COLUMNS, StepLog, StepTotals, step_row
from workloads.clients import OPEN_LOOP, Clients
from workloads.request import Request

__all__ = ["STEP_COLUMNS", "RequestTimes", "Replica", "SimResult", "StopRule", "simulate", "step_row"]

MAX_RUN_STEPS = 256  # steps timed ahead for one quiet run (a longer stretch takes several runs)
MIN_RUN_STEPS = 5  # shorter stretches run step by step: a run costs about as much as 3-5 steps

# stop_if(now_s, first_token_indices, finished_indices, sent) -> a reason to stop, or None
StopRule = Callable[[float, Sequence[int], Sequence[int], Sequence[Request]], "str | None"]


class _Stopped(Exception):
    """Raised inside the event loop when ``stop_if`` says so."""


class _Environment(simpy.Environment):
    def timeout_at(self, when_s: float) -> simpy.Event:
        """An event at exactly ``when_s``: a quiet run's end, the clock value the run's steps
        reach one addition at a time (``now + delay`` could round differently). It pushes onto
        SimPy 4's queue as ``Environment.schedule`` does (pyproject pins simpy < 5)."""
        event = simpy.Event(self)
        event._ok = True
        event._value = None
        heappush(self._queue, (when_s, NORMAL, next(self._eid), event))
        return event

    def advance_to(self, when_s: float) -> bool:
        """Move the clock to ``when_s`` without an event, if no event is due before or at it;
        False (nothing done) otherwise.

        A step whose end comes strictly before every scheduled event ends with nothing else
        happening in between, whatever way it is waited out: the replica's process carries on
        at once instead of yielding a timeout (one heap push, one pop and a generator resume
        per step). At a tie it must wait: an event already scheduled for that instant runs
        before the step's end, which one step at a time would create later (SimPy 4 pops its
        queue by (time, priority, event id): simpy/core.py, Environment.schedule and
        Environment.step). The event ids SimPy would have spent on the skipped timeouts only
        order events among themselves."""
        queue = self._queue
        if queue and not when_s < queue[0][0]:
            return False
        self._now = when_s
        return True


@dataclass(slots=True)
class RequestTimes:
    admitted_s: float = -1.0  # first admission (queueing delay ends)
    first_token_s: float = -1.0
    finished_s: float = -1.0
    replica: int = -1


class TimesTable(Sequence[RequestTimes]):
    """Every request's :class:`RequestTimes`, held as four flat arrays (32 bytes a request,
    against ~150 for the objects): ``table[i]`` reads request i's times as a RequestTimes (a
    copy: the engine writes the arrays)."""

    def __init__(self, n: int) -> None:
        self.admitted_s = array("d", [-1.0]) * n
        self.first_token_s = array("d", [-1.0]) * n
        self.finished_s = array("d", [-1.0]) * n
        self.replica = array("i", [-1]) * n

    def __len__(self) -> int:
        return len(self.replica)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return RequestTimes(self.admitted_s[i], self.first_token_s[i], self.finished_s[i],
                            self.replica[i])

    def __iter__(self) -> Iterator[RequestTimes]:
        return map(RequestTimes, self.admitted_s, self.first_token_s, self.finished_s, self.replica)


@dataclass(slots=True)
class Replica:
    index: int
    scheduler: Scheduler
    allocator: KVAllocator
    wake: simpy.Event | None = None
    outstanding: int = 0  # routed and not finished
    process: simpy.Process | None = None
    # a quiet run in progress: its steps' start times (the last entry is the run's end), and
    # the requests sent here meanwhile, held back as (group, send time, creation time of the
    # event that sent it) until the run's step that sees them
    run_starts: list[float] | None = None
    held: list[tuple[Group, float, float]] = field(default_factory=list)
    interrupted: bool = False
    run_stamp: int = -1  # sequence number of the run's start (engine: stamps)
    last_stamp: int = -1  # sequence number of the run's last step's end event (-1: not made)
    last_step: int = 0  # the run's steps as now decided (its last step's end: run_starts[last_step])
    late: list[Group] = field(default_factory=list)  # held requests queued after the next schedule()


@dataclass
class SimResult:
    """A run's records. ``requests[i]`` is request i *as sent*: its ``arrival_s`` is the moment
    the clients sent it (the workload's arrival time unless it waited for a client slot).
    ``offered`` holds the workload's requests as given when any send waited (None: same as
    ``requests``); ``clients`` is how they were sent (its ``warmup_requests`` is read by the
    metrics)."""

    requests: Sequence[Request]
    groups: list[Group]  # index = position in ``requests``
    times: Sequence[RequestTimes]  # the engine's: a TimesTable
    steps: list[tuple]  # rows of STEP_COLUMNS (one per step, or per-second bins: simulator.engine.steps)
    end_s: float
    replicas: list[Replica] = field(default_factory=list)
    # keyword-only: subclasses (the real-time engine's result) keep their positional fields
    offered: Sequence[Request] | None = field(default=None, kw_only=True)
    clients: Clients = field(default=OPEN_LOOP, kw_only=True)
    # the serving front end's per-request delay outside the steps (the latency model's
    # ``request_overhead_s``): part of the TTFT and E2E a client sees (simulator.engine.metrics)
    request_overhead_s: float = field(default=0.0, kw_only=True)
    # exact totals over every step (None: compute them from ``steps``, which are then full rows)
    step_totals: StepTotals | None = field(default=None, kw_only=True)
    # why the run stopped before every request ended (``stop_if``), None when it ran to the end
    stopped: str | None = field(default=None, kw_only=True)

    def totals(self) -> StepTotals:
        """The step totals (from the rows when the result has none of its own)."""
        return self.step_totals if self.step_totals is not None else StepTotals.from_rows(self.steps)


def simulate(
    requests: Sequence[Request],
    make_replica: Callable[[int], tuple[Scheduler, KVAllocator]],
    latency: LatencyModel,
    *,
    num_replicas: int = 1,
    clients: Clients = OPEN_LOOP,
    record_steps: bool | str = True,
    step_bin_s: float = DEFAULT_BIN_S,
    on_progress: Callable[[int], None] | None = None,
    macro_steps: bool = True,
    stop_if: StopRule | None = None,
    router: RouterConfig | None = None,
) -> SimResult:
    """Replay ``requests`` (sorted by arrival) through ``num_replicas`` replicas, sent by ``clients``.

    ``make_replica(i)`` builds replica i's scheduler and allocator. Requests are sent in list
    order; ``router`` chooses each one's replica (:mod:`simulator.scheduler.router`; default: the fewest
    outstanding requests, lowest index on ties). A policy that reads KV state
    (:attr:`RouterConfig.reads_kv`) turns quiet runs off; a stale view (``refresh_interval_s`` >
    0) is refreshed by a process every ``refresh_interval_s`` of simulated time.
    Every request ends finished or rejected (with a reason); the result holds per-request times,
    the step rows (``record_steps``: True or ``"full"``, ``"bins"`` of ``step_bin_s`` seconds,
    or False; :mod:`simulator.engine.steps`) and exact step totals.

    ``macro_steps``: run each stretch of identical decode steps between two events as one
    (see "Quiet runs" in the module docstring); False runs every step on its own. Both make the
    same decisions at the same times, bit for bit; the summary's sums over steps agree to
    rounding.

    ``stop_if(now_s, first_token_indices, finished_indices, sent)`` is called after every step
    (or quiet run) in which requests emitted their first token or finished, with their positions
    in ``requests``; ``sent[i].arrival_s`` is when request i was sent. A string it returns stops
    the run at once: ``SimResult.stopped`` holds it and requests not ended keep their status.

    Raises ValueError for duplicate request ids or ``warmup_requests`` that leave nothing to
    measure, RuntimeError if a scheduler is stuck with work left.
    """
    env = _Environment(0.0)  # a float clock from the start: every time written is a float
    replicas = [Replica(i, *make_replica(i)) for i in range(num_replicas)]
    n = len(requests)
    groups: list[Group | None] = [None] * n
    times = TimesTable(n)
    admitted_at, first_token_at, finished_at = times.admitted_s, times.first_token_s, times.finished_s
    if len({r.request_id for r in requests}) != n:
        raise ValueError("request ids must be unique")
    if n and clients.warmup_requests >= n:
        raise ValueError(f"warmup_requests {clients.warmup_requests} leaves none of the {n} "
                         "requests to measure")
    log = StepLog(record_steps, bin_s=step_bin_s)
    route = Router(router or RouterConfig(), replicas)
    # a policy that reads the KV pool or the prefix cache sees every step's state: no quiet runs;
    # nor on a pool whose blocks a quiet run's growths may free (KVAllocator.quiet_runs)
    macro = (macro_steps and getattr(latency, "quiet_runs", True) and not route.config.reads_kv
             and all(rep.allocator.quiet_runs for rep in replicas))
    done = [0]
    gated = clients.gated
    sent: list[Request] = list(requests) if gated else requests  # type: ignore[assignment]
    # (time, sequence number) of the creation of the event being processed: decides, for a
    # request sent at exactly the time a quiet run's step would start, whether that step's
    # schedule() sees it (SimPy processes events of one instant in creation order)
    stamps = itertools.count()
    arrived = [0]  # requests the arrival process has handed out
    cause_s: list[tuple[float, int]] = [(-math.inf, -1)]

    def account(count: int) -> None:
        done[0] += count
        if on_progress is not None:
            on_progress(count)

    def send(i: int) -> bool:
        """Route request i now; False when the scheduler rejects it at once (it has ended)."""
        r = requests[i]
        if gated and r.arrival_s != env.now:
            r = sent[i] = dataclasses.replace(r, arrival_s=env.now)
        rep = replicas[route.route(r)]
        route.routed(rep.index, r)
        in_run = rep.run_starts is not None
        g = rep.scheduler.add_request(r, queue=not in_run)
        g.index = i
        groups[i] = g
        times.replica[i] = rep.index
        if g.status is Status.REJECTED:
            last_end_s[0] = env.now  # it ended here
            account(1)
            return False
        rep.outstanding += 1
        if in_run:  # the run decides which of its steps sees it (quiet runs, module docstring)
            now = env.now
            rep.held.append((g, now, cause_s[0]))
            # during the run's last step only its end can see it: no cut, no interrupt
            if not rep.interrupted and now <= rep.run_starts[rep.last_step - 1]:  # type: ignore[index]
                rep.interrupted = True
                rep.process.interrupt()  # type: ignore[union-attr]
        elif rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()
        return True

    # --- the client side of a gated run: requests due but not sent, and free slots ----------
    due: deque[int] = deque()
    free_slots = [clients.max_in_flight or 0]
    thinking = [0]  # slots freed and waiting out the think time
    think_s = clients.think_time_s

    def send_due() -> None:
        """Send due requests, in order, while slots are free (a rejection frees its slot)."""
        while due and free_slots[0] > 0:
            free_slots[0] -= 1
            if not send(due.popleft()):
                release(1)

    def release(count: int) -> None:
        if think_s > 0:
            thinking[0] += count
            env.timeout(think_s, value=(count, (env.now, next(stamps)))).callbacks.append(thought)
        else:
            free_slots[0] += count

    def thought(event: simpy.Event) -> None:
        slots, cause_s[0] = event.value
        thinking[0] -= slots
        free_slots[0] += slots
        send_due()

    def arrivals():
        created = (-math.inf, -1)  # when the timeout that woke this process was created
        for i, r in enumerate(requests):
            delay = r.arrival_s - env.now
            if delay > 0:
                created = (env.now, next(stamps))
                yield env.timeout(delay)
            cause_s[0] = created
            arrived[0] = i + 1
            if gated:
                due.append(i)
                send_due()
            else:
                send(i)
        arrivals_done[0] = True

    def nothing_more_to_send() -> bool:
        return arrivals_done[0] and not due and thinking[0] == 0

    def quiet_run(rep: Replica, plan, dt: float):  # type: ignore[no-untyped-def]
        """(k, durations, step start times + end) of the quiet run ``plan`` starts (k = 1: just
        this step)."""
        sched = rep.scheduler
        now = env.now
        horizon = min(sched.steps_to_next_finish(), MAX_RUN_STEPS)
        if horizon < MIN_RUN_STEPS:  # the run could not be longer than the horizon
            return 1, None, None
        # How far to time ahead: any length is exact (a run cut short, or ended early, is just
        # more runs), so guess where a request will likely arrive here: the next arrival with
        # one replica, the num_replicas-th next with several (routing spreads them). Gated
        # sends are not known ahead: MAX_RUN_STEPS.
        ahead = arrived[0] + num_replicas - 1
        until_s = requests[ahead].arrival_s if not gated and ahead < n else math.inf
        durations = [dt]
        t = now + dt
        starts = [now, t]  # the clock, add by add
        if t < until_s:
            for dt_j in quiet_latencies(latency, plan, horizon):
                durations.append(dt_j)
                t = t + dt_j
                starts.append(t)
                if not t < until_s:
                    break
        horizon = len(durations)
        if horizon < MIN_RUN_STEPS:  # a request likely arrives first: not worth asking
            return 1, None, None
        k = sched.quiet_run(plan, horizon)
        if k < MIN_RUN_STEPS:  # not worth a run this short (its own cost is a few steps)
            return 1, None, None
        del durations[k:], starts[k + 1:]
        return k, durations, starts

    def cut(rep: Replica, k: int) -> int:
        """The steps of the run that happen before the requests held back: the run ends at the
        first step start that would see one of them (sent before it, or at the same instant by
        an event created before the previous step started, as SimPy would order them).

        At the run's first boundary the order is known exactly (the run began with a real event,
        stamped ``rep.run_stamp``); at a later one, a send created at the very instant the
        previous step began counts as created after it: exact when that sending event was
        itself a request to this replica (an arrival process's next arrival), one order out of
        two otherwise (an event of another replica at exactly that instant)."""
        starts = rep.run_starts
        assert starts is not None
        for _, sent_s, created in rep.held:
            i = bisect_right(starts, sent_s, 1, k)  # the first start after the send
            if i > 1 and starts[i - 1] == sent_s and sees(rep, i - 1, created):
                i -= 1  # at that very start, and queued before the step would have begun
            k = min(k, i)
        return k

    def sees(rep: Replica, i: int, created: tuple[float, int]) -> bool:
        """Whether the step start ``i`` (> 0) of the run sees a request sent at that very
        instant by an event made at ``created``: the event was made before the step ``i - 1``
        began (before the end event of that step, as one step at a time would make it)."""
        starts = rep.run_starts
        assert starts is not None
        made_s, seq = created
        if made_s != starts[i - 1]:
            return made_s < starts[i - 1]
        if i == 1:
            return seq < rep.run_stamp
        if i == rep.last_step and rep.last_stamp >= 0:
            return seq < rep.last_stamp
        return False

    def run_quietly(rep: Replica, k: int, durations: list[float]):  # type: ignore[no-untyped-def]
        """Wait out a quiet run of ``k`` steps, cut short by requests sent here meanwhile; return
        the number of steps run. The last step's end is its own event, created when that step
        starts, as one step at a time would create it (so SimPy orders it the same way)."""
        starts = rep.run_starts
        assert starts is not None
        if env.advance_to(starts[k]):  # nothing can happen before the run's end: no send to cut it
            rep.last_stamp = next(stamps)  # its last step's end, as made when that step starts
            rep.last_step = k
            return k
        event = env.timeout_at(starts[k - 1])
        last = False  # waiting for the last step's end
        rep.last_stamp = -1  # the sequence number of the last step's end event, once created
        rep.last_step = k
        while True:
            try:
                yield event
            except simpy.Interrupt:
                rep.interrupted = False
                now = env.now
                k2 = cut(rep, k)
                if k2 < k:
                    k = k2
                    if starts[k] == now:
                        rep.last_stamp, rep.last_step = -1, k
                        return k
                    event, last = env.timeout_at(starts[k]), True
                    rep.last_stamp, rep.last_step = -1, k  # made after the step began
                continue
            if last:
                return k
            event, last = env.timeout(durations[k - 1]), True  # now + dt: exactly starts[k]
            rep.last_stamp = next(stamps)

    def step_loop(rep: Replica):
        sched, alloc = rep.scheduler, rep.allocator
        while True:
            if not sched.has_work:
                if not rep.late:
                    rep.wake = env.event()
                    yield rep.wake
                    continue
                for g in rep.late:  # nothing to schedule before them: they are queued at once
                    sched.enqueue(g)
                rep.late.clear()
            plan = sched.schedule()
            now = env.now
            for g in sched.newly_admitted:
                if admitted_at[g.index] < 0:
                    admitted_at[g.index] = now
            empty = plan.is_empty
            if rep.late:  # held back by the last run, sent after its last step began
                for g in rep.late:
                    sched.enqueue(g)
                rep.late.clear()
                if empty:  # their send would have woken this replica at this instant
                    continue
            if empty:
                if nothing_more_to_send():
                    raise RuntimeError(
                        f"replica {rep.index} cannot schedule anything but has work left "
                        f"({len(sched.waiting)} waiting, {len(sched.swapped)} swapped)"
                    )
                rep.wake = env.event()
                yield rep.wake
                continue
            dt = latency.step_latency_s(plan)
            k = 1
            if macro and sched.is_quiet(plan):
                k, durations, rep.run_starts = quiet_run(rep, plan, dt)
            if k == 1:
                step_stamp = (now, next(stamps))
                if not env.advance_to(now + dt):  # now + dt: the clock a timeout would reach
                    yield env.timeout(dt)
                outcome = sched.complete(plan)
                log.step(rep.index, plan, now, dt, sched, alloc)  # the state the step left
            else:
                rep.run_stamp = next(stamps)
                # the queues as the run's steps see them (nothing joins them before its end)
                waiting, head = len(sched.waiting) + len(sched.swapped), sched.head()
                k = yield from run_quietly(rep, k, durations)
                starts = rep.run_starts
                step_start = starts[k - 1]
                step_stamp = (step_start, rep.last_stamp)
                if rep.held:  # queue those the next schedule() sees; the rest right after it
                    end_s = starts[k]
                    for g, sent_s, created in rep.held:
                        if sent_s < end_s or sees(rep, k, created):
                            sched.enqueue(g)
                        else:
                            rep.late.append(g)
                    rep.held.clear()
                rep.run_starts = None
                outcome = _advance(rep, plan, k, starts, durations[:k], waiting, head)
            end = env.now
            if outcome.first_token or outcome.finished:
                first = [g.index for g in outcome.first_token]
                finished = [g.index for g in outcome.finished]
                for i in first:
                    first_token_at[i] = end
                for i in finished:
                    finished_at[i] = end
                if outcome.finished:
                    last_end_s[0] = end  # the run's last step finishes its last requests
                    rep.outstanding -= len(finished)
                    account(len(finished))
                if stop_if is not None:
                    reason = stop_if(end, first, finished, sent)
                    if reason is not None:
                        stopped[0] = reason
                        raise _Stopped
                if outcome.finished and gated:  # the next sends are queued before this replica's next schedule()
                    cause_s[0] = step_stamp  # this step's end event was created when it began
                    release(len(finished))
                    send_due()

    def _advance(rep: Replica, plan, k: int, starts: list[float], durations, waiting: int, head):  # type: ignore[no-untyped-def]
        """Complete a quiet run of ``k`` steps (starting at ``starts[0 .. k-1]``) and record its
        steps as the engine would have, from the KV state at each change of the allocator
        (:meth:`StepLog.quiet_run`)."""
        sched, alloc = rep.scheduler, rep.allocator
        running = sched.num_running_seqs
        segments: list[tuple[int, int, int, tuple]] = []
        last = k - 1

        def record(j: int, written: int) -> None:
            nonlocal running, waiting, head
            if j == last:  # after the finishes; requests that arrived during the step are queued
                running = sched.num_running_seqs
                waiting = len(sched.waiting) + len(sched.swapped)
                head = sched.head()
            segments.append((j, running, waiting, alloc.snapshot_parts(written, head)))

        outcome = sched.advance_quiet(plan, k, record)
        log.quiet_run(rep.index, plan.step_id, starts, durations, plan.num_decode_seqs, segments,
                      plan.num_decode_seqs * alloc.slots_per_token)
        return outcome

    def refreshes():
        """The router's stale view, refreshed every ``refresh_interval_s`` from time 0 until
        every request has ended (or nothing can happen any more: every replica waits and
        nothing is left to send)."""
        interval = route.config.refresh_interval_s
        while True:
            route.refresh()
            if done[0] >= n or (nothing_more_to_send() and all(
                    rep.wake is not None and not rep.wake.triggered for rep in replicas)):
                return
            yield env.timeout(interval)

    arrivals_done = [False]
    stopped: list[str | None] = [None]
    # The run ends when the last request ends (a step's end, or a rejection at its send); think
    # times still pending after it are not part of the run.
    last_end_s = [0.0]
    env.process(arrivals())
    if route.config.refresh_interval_s > 0:
        env.process(refreshes())
    for rep in replicas:
        rep.process = env.process(step_loop(rep))
    # A long run allocates millions of small acyclic objects (plans, step rows); the cyclic garbage
    # collector would rescan all of them again and again. Reference counting still frees them.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        env.run()
    except _Stopped:  # stop_if asked: ``stopped`` holds its reason, the result is built below
        assert stopped[0] is not None
    finally:
        if gc_was_enabled:
            gc.enable()
    if stopped[0] is None:
        unaccounted = [requests[i].request_id for i, g in enumerate(groups)
                       if g is None or g.status not in (Status.FINISHED, Status.REJECTED)]
        if unaccounted:
            raise RuntimeError(f"{len(unaccounted)} requests neither finished nor rejected: "
                               f"{unaccounted[:5]}")
    else:
        last_end_s[0] = env.now
    return SimResult(sent, groups, times, log.rows, last_end_s[0], replicas,  # type: ignore[arg-type]
                     offered=requests if gated else None, clients=clients,
                     request_overhead_s=float(getattr(latency, "request_overhead_s", 0.0)),
                     step_totals=log.totals, stopped=stopped[0])
