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
duration, batch, KV breakdown). Nothing here knows how scheduling or allocation work.

Programmatic use (a fixed-length closed loop of 64 clients)::

    from workloads.spec import parse_workload, build_requests
    spec = parse_workload({"prompt_tokens": {"dist": "fixed", "value": 1000},
                           "output_tokens": {"dist": "fixed", "value": 1000},
                           "num_requests": 640, "concurrency": 64}, "where")
    requests = build_requests(spec, seed=0, base_dir=Path("."))
    result = simulate(requests, deployment.replica_factory("paged"), deployment.latency,
                      clients=spec.client_policy(len(requests)))
    # or simulator.run.run_allocator(deployment, "paged", requests, clients=...)
    # for the request/step frames and the summary; rate: inf (burst) and rate + max_concurrency
    # are spelled in the same workload mapping.
"""

from __future__ import annotations

import dataclasses
import gc
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from simulator.kv.allocator import KVAllocator
from simulator.latency import LatencyModel
from simulator.plan import StepPlan
from simulator.scheduler import Group, Scheduler, Status
from workloads.clients import OPEN_LOOP, Clients
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
    """A run's records. ``requests[i]`` is request i *as sent*: its ``arrival_s`` is the moment
    the clients sent it (the workload's arrival time unless it waited for a client slot).
    ``offered`` holds the workload's requests as given when any send waited (None: same as
    ``requests``); ``clients`` is how they were sent (its ``warmup_requests`` is read by the
    metrics)."""

    requests: Sequence[Request]
    groups: list[Group]  # index = position in ``requests``
    times: list[RequestTimes]
    steps: list[tuple]  # rows of STEP_COLUMNS
    end_s: float
    replicas: list[Replica] = field(default_factory=list)
    # keyword-only: subclasses (the real-time engine's result) keep their positional fields
    offered: Sequence[Request] | None = field(default=None, kw_only=True)
    clients: Clients = field(default=OPEN_LOOP, kw_only=True)
    # the serving front end's per-request delay outside the steps (the latency model's
    # ``request_overhead_s``): part of the TTFT and E2E a client sees (simulator.metrics)
    request_overhead_s: float = field(default=0.0, kw_only=True)


def simulate(
    requests: Sequence[Request],
    make_replica: Callable[[int], tuple[Scheduler, KVAllocator]],
    latency: LatencyModel,
    *,
    num_replicas: int = 1,
    clients: Clients = OPEN_LOOP,
    record_steps: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Replay ``requests`` (sorted by arrival) through ``num_replicas`` replicas, sent by ``clients``.

    ``make_replica(i)`` builds replica i's scheduler and allocator. Requests are sent in list
    order; each goes to the replica with the fewest outstanding requests (lowest index on ties).
    Every request ends finished or rejected (with a reason); the result holds per-request times
    and per-step rows. Raises ValueError for duplicate request ids or ``warmup_requests`` that
    leave nothing to measure, RuntimeError if a scheduler is stuck with work left.
    """
    env = simpy.Environment()
    replicas = [Replica(i, *make_replica(i)) for i in range(num_replicas)]
    n = len(requests)
    groups: list[Group | None] = [None] * n
    times = [RequestTimes() for _ in range(n)]
    index_of = {r.request_id: i for i, r in enumerate(requests)}
    if len(index_of) != n:
        raise ValueError("request ids must be unique")
    if n and clients.warmup_requests >= n:
        raise ValueError(f"warmup_requests {clients.warmup_requests} leaves none of the {n} "
                         "requests to measure")
    steps: list[tuple] = []
    done = [0]
    gated = clients.gated
    sent: list[Request] = list(requests) if gated else requests  # type: ignore[assignment]

    def account(count: int) -> None:
        done[0] += count
        if on_progress is not None:
            on_progress(count)

    def send(i: int) -> bool:
        """Route request i now; False when the scheduler rejects it at once (it has ended)."""
        r = requests[i]
        if gated and r.arrival_s != env.now:
            r = sent[i] = dataclasses.replace(r, arrival_s=env.now)
        rep = min(replicas, key=lambda x: x.outstanding)  # least outstanding, lowest index
        g = rep.scheduler.add_request(r)
        groups[i] = g
        times[i].replica = rep.index
        if g.status is Status.REJECTED:
            last_end_s[0] = env.now  # it ended here
            account(1)
            return False
        rep.outstanding += 1
        if rep.wake is not None and not rep.wake.triggered:
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
            env.timeout(think_s, value=count).callbacks.append(thought)
        else:
            free_slots[0] += count

    def thought(event: simpy.Event) -> None:
        thinking[0] -= event.value
        free_slots[0] += event.value
        send_due()

    def arrivals():
        for i, r in enumerate(requests):
            delay = r.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            if gated:
                due.append(i)
                send_due()
            else:
                send(i)
        arrivals_done[0] = True

    def nothing_more_to_send() -> bool:
        return arrivals_done[0] and not due and thinking[0] == 0

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
                if nothing_more_to_send():
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
            if record_steps:  # before the freed slots send: the row is the state the step left
                steps.append(step_row(rep.index, plan, now, dt, sched, alloc))
            if outcome.finished:
                last_end_s[0] = end  # the run's last step finishes its last requests
                rep.outstanding -= len(outcome.finished)
                account(len(outcome.finished))
                if gated:  # the next sends are queued before this replica's next schedule()
                    release(len(outcome.finished))
                    send_due()

    arrivals_done = [False]
    # The run ends when the last request ends (a step's end, or a rejection at its send); think
    # times still pending after it are not part of the run.
    last_end_s = [0.0]
    env.process(arrivals())
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
    return SimResult(sent, groups, times, steps, last_end_s[0], replicas,  # type: ignore[arg-type]
                     offered=requests if gated else None, clients=clients,
                     request_overhead_s=float(getattr(latency, "request_overhead_s", 0.0)))
