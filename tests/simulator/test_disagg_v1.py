"""``Request.kv_ready_tokens`` under vLLM V1's scheduler: the decode side of disaggregation.

vLLM's decode side allocates blocks for the whole prompt (local and external tokens, so the
full-ISL check counts them), loads the remote KV and recomputes the last prompt token
(nixl_connector.py ``get_num_new_matched_tokens``; scheduler.py ``_update_waiting_for_remote_kv``).
Pools of blocks of 4 tokens, traced by hand.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.scheduler.plan import PrefillChunk
from simulator.scheduler import SchedulerConfig, Status
from simulator.scheduler.v1 import V1Scheduler
from workloads.request import Request


def v1(num_blocks: int, *, budget: int = 64, full_isl: bool = True, caching: bool = False):  # type: ignore[no-untyped-def]
    alloc = PagedAllocator(num_blocks, 4, enable_prefix_caching=caching)
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=64,
                          block_size=4, enable_prefix_caching=caching, engine="vllm-v1",
                          scheduler_reserve_full_isl=full_isl)
    return V1Scheduler(alloc, cfg), alloc


def test_ready_prompt_gets_blocks_for_every_token_and_computes_the_last():
    """10 ready tokens: 3 blocks (12 slots) at admission, one chunk of 1 token at position 9,
    the first token after that step; then decodes as any request."""
    sched, alloc = v1(10)
    g = sched.add_request(Request(0, 0.0, 10, 3, kv_ready_tokens=10))
    plan = sched.schedule()
    assert plan.prefills == (PrefillChunk(g.seq_ids[0], 1, 9, True),)
    assert plan.num_prefill_tokens == 1
    assert alloc.num_free_blocks() == 7
    assert sched.written_tokens() == 9  # the ready tokens; the step writes the 10th
    out = sched.complete(plan)
    assert sched.written_tokens() == 10
    assert out.first_token == (g,) and g.status is Status.DECODING
    assert g.prefix_hit_tokens == 0  # remote KV is no prefix-cache hit
    for _ in range(2):
        out = sched.complete(sched.schedule())
    assert out.finished == (g,) and alloc.num_free_blocks() == 10


def test_admission_needs_the_whole_ready_sequence_to_fit():
    """A (10 ready tokens) holds 3 of 10 blocks. B, 30 ready tokens, needs 8 blocks: refused
    (7 free), where the same prompt computed locally, with the full-ISL check off and a budget
    of 8, is admitted with its first chunk of 7 tokens (2 blocks)."""
    for full_isl in (True, False):
        sched, alloc = v1(10, budget=8, full_isl=full_isl)
        sched.add_request(Request(0, 0.0, 10, 20, kv_ready_tokens=10))
        sched.complete(sched.schedule())
        b = sched.add_request(Request(1, 0.0, 30, 2, kv_ready_tokens=30))
        plan = sched.schedule()
        assert plan.prefills == () and b.status is Status.WAITING
        assert sched.num_kv_refusals == 1 and alloc.num_free_blocks() == 7
    sched, alloc = v1(10, budget=8, full_isl=False)
    sched.add_request(Request(0, 0.0, 10, 20, kv_ready_tokens=10))
    sched.complete(sched.schedule())
    b = sched.add_request(Request(1, 0.0, 30, 2))
    plan = sched.schedule()
    assert [c.num_tokens for c in plan.prefills] == [7] and alloc.num_free_blocks() == 5


def test_a_preempted_ready_request_recomputes_everything():
    """vLLM loads remote KV once (update_state_after_alloc clears do_remote_prefill): after a
    preemption the request recomputes its prompt and generated tokens like any other."""
    sched, alloc = v1(4)
    a = sched.add_request(Request(0, 0.0, 7, 9, kv_ready_tokens=7))
    b = sched.add_request(Request(1, 0.0, 7, 9, kv_ready_tokens=7))
    sched.complete(sched.schedule())  # both admitted: 2 blocks each, the pool is full
    assert alloc.num_free_blocks() == 0
    plan = sched.schedule()  # both write token 8 (fits), then token 9 needs a block each
    sched.complete(plan)
    plan = sched.schedule()
    assert plan.preempted == (1,) and b.status is Status.WAITING and a.status is Status.DECODING
    assert b.num_prefill_target == 9  # prompt + the 2 tokens it had generated
    sched.complete(plan)
    while True:  # B waits (3 blocks, 1 free) until A finishes with the whole pool
        plan = sched.schedule()
        if b in sched.newly_admitted:
            break
        sched.complete(plan)
    assert a.status is Status.FINISHED
    assert plan.prefills == (PrefillChunk(b.seq_ids[0], 9, 0, True),)


LATENCY = ConstantLatency(0.004, prefill_token_s=1e-4, decode_seq_s=2e-4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), replicas=st.integers(1, 2))
def test_ready_requests_run_the_same_with_and_without_quiet_runs(rng, replicas):
    t = 0.0
    requests = []
    for i in range(rng.randint(1, 40)):
        t += rng.choice([0.0, 0.001, 0.01, 0.05])
        prompt = rng.randint(1, 60)
        prefix = rng.choice([(), (1, 2, 3)])
        requests.append(Request(i, t, prompt, rng.randint(1, 80), prefix_ids=prefix,
                                prefix_block_tokens=4 if prefix else 0,
                                kv_ready_tokens=rng.choice([0, prompt, prompt])))
    block_size = rng.choice([1, 4, 16])
    num_blocks = rng.randint(max(12, 160 // block_size + 1), 64 if block_size > 1 else 400)
    cfg = SchedulerConfig(max_num_seqs=rng.randint(2, 8), max_num_batched_tokens=64, max_model_len=160,
                          block_size=block_size, enable_prefix_caching=rng.random() < 0.5,
                          engine="vllm-v1", long_prefill_token_threshold=rng.choice([0, 0, 8]),
                          scheduler_reserve_full_isl=rng.random() < 0.7)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(num_blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
        return V1Scheduler(alloc, cfg), alloc

    fast = simulate(requests, make, LATENCY, num_replicas=replicas, macro_steps=True)
    slow = simulate(requests, make, LATENCY, num_replicas=replicas, macro_steps=False)
    assert list(fast.times) == list(slow.times)
    assert sorted(fast.steps) == sorted(slow.steps)
    assert [(g.status, g.num_preemptions, g.prefix_hit_tokens) for g in fast.groups] == \
        [(g.status, g.num_preemptions, g.prefix_hit_tokens) for g in slow.groups]
    assert all(g.status in (Status.FINISHED, Status.REJECTED) for g in fast.groups)
