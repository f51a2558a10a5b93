"""Quiet runs (macro-steps) under TensorRT-LLM's policy change nothing but the speed.

As tests/simulator/scheduler/test_v1_quiet_runs.py does for vLLM V1: random workloads through
``simulate`` with quiet runs and one step at a time, a TRTLLMScheduler per replica, must give
bit-identical per-request times, step rows, statuses and decision counts. The workloads mix both
capacity policies, chunked context on and off, block reuse on and off, shared prefixes, and pools
small enough to pause (MAX_UTILIZATION) or to hold requests back (GUARANTEED_NO_EVICT).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig, Status
from simulator.scheduler.trtllm import TRTLLMScheduler
from tests.simulator.scheduler.test_v1_quiet_runs import _assert_same, _run_both
from workloads.request import Request


def _workload(rng: random.Random, policy: str):  # type: ignore[no-untyped-def]
    t = 0.0
    requests = []
    for i in range(rng.randint(1, 40)):
        t += rng.choice([0.0, 0.001, 0.01, 0.05])
        prefix = rng.choice([(), (1, 2, 3), (1, 2, 4)])
        requests.append(Request(i, t, rng.randint(1, 60), rng.randint(1, 80),
                                prefix_ids=prefix, prefix_block_tokens=4 if prefix else 0))
    block_size = rng.choice([1, 4, 16])
    num_blocks = rng.randint(max(12, 160 // block_size + 1), 64 if block_size > 1 else 400)
    caching = rng.random() < 0.5
    cfg = SchedulerConfig(max_num_seqs=rng.randint(2, 8), max_num_batched_tokens=rng.choice([16, 64]),
                          max_model_len=160, block_size=block_size, enable_prefix_caching=caching,
                          enable_chunked_prefill=rng.random() < 0.5, engine="trtllm",
                          capacity_scheduler_policy=policy)  # type: ignore[arg-type]
    return requests, cfg, num_blocks


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), replicas=st.integers(1, 2),
       policy=st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"]))
def test_random_trtllm_runs_are_the_same_with_and_without_quiet_runs(rng, replicas, policy):
    requests, cfg, num_blocks = _workload(rng, policy)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(num_blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
        return TRTLLMScheduler(alloc, cfg), alloc

    fast, slow = _run_both(requests, make, num_replicas=replicas)
    _assert_same(fast, slow)
    assert all(g.status in (Status.FINISHED, Status.REJECTED) for g in fast.groups)
    if policy == "GUARANTEED_NO_EVICT":
        assert all(g.num_preemptions == 0 for g in fast.groups)  # no running request is evicted


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False),
       policy=st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"]))
def test_random_trtllm_runs_keep_the_pool_consistent_in_detail_mode(rng, policy):
    """Step by step in detail mode (the real backend's): the allocator's invariants, the memory
    snapshot and each plan's block tables and slots after every step, a step's tokens within
    max_num_tokens and its requests within max_batch_size, nothing leaked at the end; under
    GUARANTEED_NO_EVICT the held blocks never exceed the reservation."""
    from tests.simulator.scheduler.test_scheduler import drive

    requests, cfg, num_blocks = _workload(rng, policy)
    alloc = PagedAllocator(num_blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
    sched = TRTLLMScheduler(alloc, cfg, detail=True)
    arrivals: dict[int, list[Request]] = {}
    for r in requests:
        arrivals.setdefault(int(r.arrival_s * 100), []).append(r)

    def on_step(_: int, plan) -> None:  # type: ignore[no-untyped-def]
        assert plan.num_batched_tokens <= cfg.max_num_batched_tokens or (
            not cfg.enable_chunked_prefill and len(plan.prefills) == 1)  # a paused prompt alone
        assert plan.batch_size <= cfg.max_num_seqs
        if sched.no_evict:
            assert alloc.num_blocks - alloc.num_free_blocks() <= sched.reserved_blocks

    drive(sched, alloc, arrivals, on_step)
    assert sched.reserved_blocks == 0
