"""Quiet runs with a CPU offload tier change nothing but the speed, under vLLM V1's and V0's
policies.

A quiet run's growths may evict HBM blocks whose hashes the tier holds: the lookup of the
waiting head then finds them in the tier instead, the same number of blocks (a hit never grows
inside a run), and a store's LRU drop only shrinks it. The same random workloads (many prefixes
over pools small enough to evict and preempt, tiers small enough to drop) through ``simulate``
with quiet runs and one step at a time must give bit-identical times, step rows and decisions,
and the same loads.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig, make_scheduler
from tests.simulator.scheduler.test_v1_quiet_runs import LATENCY, _assert_same
from workloads.request import Request

PREFIXES = [(), (1, 2, 3), (1, 2, 4), (5, 6, 7, 8, 9), (5, 6), (10, 11, 12, 13, 14, 15, 16, 17)]


def _workload(rng: random.Random, engine: str):  # type: ignore[no-untyped-def]
    t = 0.0
    requests = []
    for i in range(rng.randint(1, 40)):
        t += rng.choice([0.0, 0.001, 0.01, 0.05, 0.2])
        prefix = rng.choice(PREFIXES)
        requests.append(Request(i, t, rng.randint(1, 70), rng.randint(1, 60), n=rng.choice([1, 1, 1, 2]),
                                prefix_ids=prefix, prefix_block_tokens=4 if prefix else 0))
    block_size = rng.choice([1, 4, 16])
    num_blocks = rng.randint(max(12, 160 // block_size + 1), 48 if block_size > 1 else 300)
    offload_blocks = rng.randint(1, 4 * num_blocks)
    knobs = {"long_prefill_token_threshold": rng.choice([0, 0, 8])} if engine == "vllm-v1" else {}
    cfg = SchedulerConfig(max_num_seqs=rng.randint(2, 8), max_num_batched_tokens=64, max_model_len=160,
                          block_size=block_size, enable_prefix_caching=True, engine=engine, **knobs)
    return requests, cfg, num_blocks, offload_blocks


def _run(requests, cfg, num_blocks, offload_blocks, replicas):  # type: ignore[no-untyped-def]
    loads: dict[bool, list[int]] = {True: [], False: []}
    results = []
    for macro in (True, False):
        def make(_: int, macro=macro):  # type: ignore[no-untyped-def]
            alloc = PagedAllocator(num_blocks, cfg.block_size, enable_prefix_caching=True,
                                   offload_blocks=offload_blocks)
            return make_scheduler(alloc, cfg), alloc
        result = simulate(requests, make, LATENCY, macro_steps=macro, num_replicas=replicas)
        loads[macro] = [rep.allocator.num_offload_hit_blocks for rep in result.replicas]
        results.append(result)
    _assert_same(*results)
    assert loads[True] == loads[False]
    for rep in results[0].replicas:  # each tier's hits, every admission: the scheduler's hits
        sched, alloc = rep.scheduler, rep.allocator
        assert (alloc.num_hit_blocks + alloc.num_offload_hit_blocks) * cfg.block_size == \
            sched.prefix_hit_tokens + sched.readmission_hit_tokens
    return results[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), replicas=st.integers(1, 2),
       engine=st.sampled_from(["vllm-v1", "vllm-v0"]))
def test_random_runs_with_a_tier_are_the_same_with_and_without_quiet_runs(rng, replicas, engine):
    _run(*_workload(rng, engine), replicas)


def test_the_random_workloads_load_from_the_tier() -> None:
    """The property above is about something: its workloads do load blocks back."""
    loaded = 0
    for seed in range(20):
        for engine in ("vllm-v1", "vllm-v0"):
            result = _run(*_workload(random.Random(seed), engine), 1)
            loaded += result.replicas[0].allocator.num_offload_hit_blocks
    assert loaded > 0
