"""Routing against queueing theory: a two-replica split whose every replica is an M/D/1 queue.

Two independent Poisson streams (rate λ each), each with its own shared prefix, go to two replicas
under ``prefix-affinity`` (SGLang's cache-aware router: a prompt whose prefix a replica holds goes
there while the load stays balanced; simulator/scheduler/router.py). Each replica serves one request at a
time (``max_num_seqs`` 1) for a fixed time D (constant step time, fixed lengths: one prefill step
and ``output - 1`` decode steps), so each is an M/D/1 queue, whose mean wait in queue is the
Pollaczek-Khinchine value ρ·D / (2·(1 − ρ)) with ρ = λ·D, and whose server is busy a fraction ρ
of the time. The simulated means must agree within the sampling error of 8,000 requests a stream.
"""

from __future__ import annotations

import random

from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.scheduler.router import RouterConfig
from simulator.scheduler import SchedulerConfig, make_scheduler
from workloads.request import Request

STEP_S = 0.01
OUTPUT = 10  # tokens: one prefill step (it emits the first), then 9 decode steps
SERVICE_S = OUTPUT * STEP_S  # D
PROMPT = 32
PER_STREAM = 8000


def _streams(rate: float, seed: int = 7) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for group in (0, 1):
        t = 0.0
        for _ in range(PER_STREAM):
            t += rng.expovariate(rate)
            out.append((t, group))
    out.sort()
    return [Request(i, t, PROMPT, OUTPUT, prefix_ids=(100 + g,), prefix_block_tokens=PROMPT)
            for i, (t, g) in enumerate(out)]


def _replica(_: int):  # type: ignore[no-untyped-def]
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=128, block_size=16,
                          engine="vllm-v1", enable_prefix_caching=True)
    alloc = PagedAllocator(64, 16, enable_prefix_caching=True)
    return make_scheduler(alloc, cfg), alloc


def test_each_replica_of_a_prefix_affinity_split_is_an_m_d_1_queue() -> None:
    rate = 5.0  # per stream: ρ = 5 × 0.1 = 0.5
    rho = rate * SERVICE_S
    requests = _streams(rate)
    result = simulate(requests, _replica, ConstantLatency(STEP_S), num_replicas=2,
                      router=RouterConfig(policy="prefix-affinity"))
    groups = [r.prefix_ids[0] - 100 for r in requests]
    replica_of = {}
    waits: dict[int, list[float]] = {0: [], 1: []}
    for r, g, t in zip(requests, groups, result.times):
        replica_of.setdefault(g, t.replica)
        assert t.replica == replica_of[g], "a stream left its replica: the split is not by prefix"
        assert t.finished_s > 0
        assert abs(t.finished_s - t.admitted_s - SERVICE_S) < 1e-9  # service exactly D
        waits[g].append(t.admitted_s - r.arrival_s)
    assert sorted(replica_of.values()) == [0, 1]
    expected_wait = rho * SERVICE_S / (2 * (1 - rho))  # Pollaczek-Khinchine, M/D/1: 0.05 s
    for g in (0, 1):
        mean = sum(waits[g]) / len(waits[g])
        assert abs(mean - expected_wait) < 0.12 * expected_wait, (g, mean, expected_wait)
        # P(wait = 0) = 1 − ρ in M/D/1 (an arrival finds the server idle)
        idle = sum(1 for w in waits[g] if w == 0.0) / len(waits[g])
        assert abs(idle - (1 - rho)) < 0.03, (g, idle)
