"""The SimPy engine: arrivals feed schedulers; each replica loops schedule -> timed step -> complete.

::

    arrivals ──route──> replica 0: Scheduler.schedule() ─> yield timeout(latency(plan)) ─> complete()
                        replica 1: ...

An idle replica waits on an event that the next routed arrival triggers; it never busy-steps.
Event order at equal times (SimPy is FIFO among events scheduled for the same instant): an
arrival at exactly the end of a step is queued before that replica schedules its next step only
if the arrival process ran first; both orders are deterministic for a given trace.

Times are recorded per request (arrival, admission, first token, finish) and per step (start,
duration, batch, KV breakdown). Nothing here knows how scheduling or allocation work.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from simulator.kv.allocator import KVAllocator
from simulator.latency import LatencyModel
from simulator.plan import StepPlan
from simulator.scheduler import Group, Scheduler, Status
from workloads.request import Request

STEP_COLUMNS = (
    "replica", "step", "time_s", "duration_s", "num_prefill_seqs", "num_prefill_tokens",
    "num_decode_seqs", "num_running_seqs", "num_waiting", "num_preempted",
    "kv_token_state", "kv_reserved", "kv_internal_fragmentation", "kv_external_fragmentation",
    "kv_free", "kv_shared_saved",
)  # KV columns are in token slots


def step_row(replica: int, plan: StepPlan, start_s: float, duration_s: float, sched: Scheduler,
             alloc: KVAllocator) -> tuple:
    """One row of STEP_COLUMNS, taken after ``sched.complete(plan)`` (the KV state after the step)."""
    prefills = plan.prefills
    return (
        replica, plan.step_id, start_s, duration_s, len(prefills),
        plan.num_prefill_tokens if prefills else 0, plan.num_decode_seqs, sched.num_running_seqs,
        len(sched.waiting) + len(sched.swapped), len(plan.preempted),
    ) + alloc.snapshot_parts(sched.written_tokens(), sched.head())


@dataclass(slots=True)
class RequestTimes:
    admitted_s: float = -1.0  # first admission (queueing delay ends)
    first_token_s: float = -1.0
    finished_s: float = -1.0
    replica: int = -1


@dataclass(slots=True)
class Replica:
    index: int
    scheduler: Scheduler
    allocator: KVAllocator
    wake: simpy.Event | None = None
    outstanding: int = 0  # routed and not finished


@dataclass
class SimResult:
    requests: Sequence[Request]
    groups: list[Group]  # index = position in ``requests``
    times: list[RequestTimes]
    steps: list[tuple]  # rows of STEP_COLUMNS
    end_s: float
    replicas: list[Replica] = field(default_factory=list)


def simulate(
    requests: Sequence[Request],
    make_replica: Callable[[int], tuple[Scheduler, KVAllocator]],
    latency: LatencyModel,
    *,
    num_replicas: int = 1,
    record_steps: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Replay ``requests`` (sorted by arrival) through ``num_replicas`` replicas.

    ``make_replica(i)`` builds replica i's scheduler and allocator. Every request ends finished or
    rejected (with a reason); the result holds per-request times and per-step rows.
    """
    env = simpy.Environment()
    replicas = [Replica(i, *make_replica(i)) for i in range(num_replicas)]
    n = len(requests)
    groups: list[Group | None] = [None] * n
    times = [RequestTimes() for _ in range(n)]
    index_of = {r.request_id: i for i, r in enumerate(requests)}
    if len(index_of) != n:
        raise ValueError("request ids must be unique")
    steps: list[tuple] = []
    done = [0]

    def account(count: int) -> None:
        done[0] += count
        if on_progress is not None:
            on_progress(count)

    def arrivals():
        for i, r in enumerate(requests):
            delay = r.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            rep = min(replicas, key=lambda x: x.outstanding)  # least outstanding, lowest index
            g = rep.scheduler.add_request(r)
            groups[i] = g
            times[i].replica = rep.index
            if g.status is Status.REJECTED:
                account(1)
                continue
            rep.outstanding += 1
            if rep.wake is not None and not rep.wake.triggered:
                rep.wake.succeed()

    def step_loop(rep: Replica):
        sched, alloc = rep.scheduler, rep.allocator
        while True:
            if not sched.has_work:
                rep.wake = env.event()
                yield rep.wake
                continue
            plan = sched.schedule()
            now = env.now
            for g in sched.newly_admitted:
                t = times[index_of[g.request_id]]
                if t.admitted_s < 0:
                    t.admitted_s = now
            if plan.is_empty:
                if all_arrived[0]:
                    raise RuntimeError(
                        f"replica {rep.index} cannot schedule anything but has work left "
                        f"({len(sched.waiting)} waiting, {len(sched.swapped)} swapped)"
                    )
                rep.wake = env.event()
                yield rep.wake
                continue
            dt = latency.step_latency_s(plan)
            yield env.timeout(dt)
            outcome = sched.complete(plan)
            end = env.now
            for g in outcome.first_token:
                times[index_of[g.request_id]].first_token_s = end
            for g in outcome.finished:
                times[index_of[g.request_id]].finished_s = end
            if outcome.finished:
                rep.outstanding -= len(outcome.finished)
                account(len(outcome.finished))
            if record_steps:
                steps.append(step_row(rep.index, plan, now, dt, sched, alloc))

    all_arrived = [False]

    def arrivals_then_flag():
        yield from arrivals()
        all_arrived[0] = True

    env.process(arrivals_then_flag())
    for rep in replicas:
        env.process(step_loop(rep))
    # A long run allocates millions of small acyclic objects (plans, step rows); the cyclic garbage
    # collector would rescan all of them again and again. Reference counting still frees them.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if gc_was_enabled:
            gc.enable()
    unaccounted = [requests[i].request_id for i, g in enumerate(groups)
                   if g is None or g.status not in (Status.FINISHED, Status.REJECTED)]
    if unaccounted:
        raise RuntimeError(f"{len(unaccounted)} requests neither finished nor rejected: {unaccounted[:5]}")
    return SimResult(requests, groups, times, steps, env.now, replicas)  # type: ignore[arg-type]
