"""vLLM V1's policy (simulator/scheduler/v1.py) on tiny cases traced by hand, step by step.

Pools of a few blocks of 4 tokens. Each test names the vLLM rule it checks and where it comes
from; the expected chunks, decodes, victims and hits are worked out in its docstring. Every step
also checks the allocator's invariants and the memory snapshot (tests/.../test_scheduler.py).
"""

from __future__ import annotations

import pytest

from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig, Status, make_scheduler
from simulator.scheduler.v1 import V1Scheduler
from tests.simulator.scheduler.test_scheduler import Step, finish, step, trace
from workloads.request import Request

BS = 4




def v1(num_blocks: int, *, caching: bool = False, **knobs: object) -> tuple[V1Scheduler, PagedAllocator]:
    cfg = SchedulerConfig(**{"max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 64,
                             "block_size": BS, "engine": "vllm-v1", "enable_prefix_caching": caching,
                             **knobs})  # type: ignore[arg-type]
    alloc = PagedAllocator(num_blocks, BS, enable_prefix_caching=caching)
    sched = make_scheduler(alloc, cfg)
    assert isinstance(sched, V1Scheduler)
    return sched, alloc






# ----------------------------------------------------------------------------- one budget
def test_decodes_and_a_prefill_chunk_share_one_budget():
    """vllm/v1/core/sched/scheduler.py (Scheduler.schedule): one ``token_budget`` per step; the
    running requests take their tokens first, then waiting requests are admitted with what is
    left, chunked to fit (enable_chunked_prefill).

    Budget 8. R0 and R1 (prompts 3) are admitted in step 0 (3 + 3 tokens) and decode from
    step 1. R2 (prompt 10) arrives before step 2: the two decodes take 2 tokens, R2 gets a chunk
    of 6; in step 3 it computes its last 4 tokens beside the two decodes and emits its first token.
    """
    sched, alloc = v1(16, max_num_batched_tokens=8)
    r0, r1, r2 = Request(0, 0, 3, 5), Request(1, 0, 3, 5), Request(2, 0, 10, 2)
    steps = trace(sched, alloc, 4, {0: [r0, r1], 2: [r2]})
    assert steps[0] == Step({0: (3, 0), 1: (3, 0)}, (), (), (0, 1), ())
    assert steps[1] == Step({}, (0, 1), (), (), ())
    assert steps[2] == Step({2: (6, 0)}, (0, 1), (), (), ())
    assert steps[3] == Step({2: (4, 6)}, (0, 1), (), (2,), ())
    finish(sched, alloc)


def test_long_prefill_token_threshold_caps_every_chunk():
    """vllm/v1/core/sched/scheduler.py (Scheduler.schedule): ``if 0 <
    long_prefill_token_threshold < num_new_tokens: num_new_tokens = threshold``, for running and
    waiting requests alike, before the budget cut.

    Threshold 4, budget 16. R0 (prompt 10) and R1 (prompt 6) both get 4 tokens in step 0 though
    the budget would hold both prompts; step 1: R0 4 more, R1 its last 2 (first token); step 2:
    R0 its last 2 beside R1's decode.
    """
    sched, alloc = v1(16, long_prefill_token_threshold=4)
    steps = trace(sched, alloc, 3, {0: [Request(0, 0, 10, 3), Request(1, 0, 6, 3)]})
    assert [s.chunks for s in steps] == [{0: (4, 0), 1: (4, 0)}, {0: (4, 4), 1: (2, 4)}, {0: (2, 8)}]
    assert [s.decodes for s in steps] == [(), (), (1,)]
    assert [s.first for s in steps] == [(), (1,), (0,)]
    finish(sched, alloc)


def test_max_num_partial_prefills_only_sets_a_default_threshold():
    """vllm/config/scheduler.py (SchedulerConfig.__post_init__): with max_num_partial_prefills > 1
    and no threshold set, ``long_prefill_token_threshold = int(max_model_len * 0.04)``; V1's
    scheduler reads nothing else of it. max_model_len 100 -> 4: the same chunks as above."""
    sched, alloc = v1(16, max_model_len=100, max_num_partial_prefills=2)
    assert sched.long_prefill_token_threshold == 4
    steps = trace(sched, alloc, 3, {0: [Request(0, 0, 10, 3), Request(1, 0, 6, 3)]})
    assert [s.chunks for s in steps] == [{0: (4, 0), 1: (4, 0)}, {0: (4, 4), 1: (2, 4)}, {0: (2, 8)}]
    explicit, _ = v1(16, max_model_len=100, max_num_partial_prefills=2, long_prefill_token_threshold=6)
    assert explicit.long_prefill_token_threshold == 6  # a threshold set is kept


# ----------------------------------------------------------------------------- admission
REQUESTS_ISL = [Request(0, 0, 8, 8), Request(1, 0, 16, 2)]


def test_reserve_full_isl_admits_only_if_the_whole_prompt_fits():
    """vllm/v1/core/kv_cache_manager.py (KVCacheManager.allocate_slots, full_sequence_must_fit),
    passed by the waiting loop of Scheduler.schedule as scheduler_reserve_full_isl (default True).

    6 blocks, budget 8. R0 (prompt 8, output 8: 4 blocks at the end) takes the whole budget in
    step 0 and grows to 3 blocks in step 1. R1 (prompt 16 = 4 blocks) would fit a 7-token chunk
    (2 blocks) beside R0's decode, but not its whole prompt in the 3 free blocks: it waits until
    R0 finishes (step 7), then prefills 8 + 8 (steps 8, 9) and decodes once (step 10). Never
    preempted.
    """
    sched, alloc = v1(6, max_num_batched_tokens=8)
    steps = trace(sched, alloc, 12, {0: REQUESTS_ISL})
    assert [s.chunks for s in steps] == [{0: (8, 0)}] + [{}] * 7 + [{1: (8, 0)}, {1: (8, 8)}, {}]
    assert steps[7].finished == (0,) and steps[10].finished == (1,)
    assert sched.num_preemptions == 0


def test_without_reserve_full_isl_a_long_prompt_is_admitted_and_thrashes():
    """The same requests with scheduler_reserve_full_isl off: admission checks the first chunk
    only (KVCacheManager.allocate_slots), and a running request whose chunk cannot grow preempts
    the newest request, here itself (Scheduler.schedule: ``if preempted_req == request: break``).

    Step 1: R0 grows to 3 blocks and decodes; R1 is admitted with 7 tokens (2 blocks, 1 free).
    Step 2: R1's next 7 tokens need 2 more blocks: it preempts itself. Step 3 re-admits it (R0
    needs no block), step 4 preempts it again; step 5: R0 takes its 4th block first, R1 is
    re-admitted into the last 2, step 6 preempts it; step 7 admits it again as R0 finishes.
    R1 then computes 8 tokens (15 of 16), 1 (its first token) and a decode: it finishes in step
    10 as with the reservation, after 3 preemptions and 21 prompt tokens computed in vain.
    """
    sched, alloc = v1(6, max_num_batched_tokens=8, scheduler_reserve_full_isl=False)
    steps = trace(sched, alloc, 12, {0: REQUESTS_ISL})
    r1 = [s.chunks.get(1) for s in steps]
    assert r1 == [None, (7, 0), None, (7, 0), None, (7, 0), None, (7, 0), (8, 7), (1, 15), None]
    assert [i for i, s in enumerate(steps) if s.preempted] == [2, 4, 6]
    assert all(s.preempted in ((), (1,)) for s in steps)
    assert steps[9].first == (1,) and steps[10].finished == (1,)
    assert sched.groups[1].num_preemptions == sched.num_preemptions == 3


def test_no_admission_in_a_step_that_preempted():
    """vllm/v1/core/sched/scheduler.py (Scheduler.schedule): the waiting loop runs only ``if not
    preempted_reqs``.

    4 blocks, budget 4, no full-ISL reservation. R0 (prompt 4) fills step 0's budget; R1 (prompt
    4) is admitted in step 1 with 3 tokens beside R0's decode and finishes its prompt in step 2.
    Step 5: R0 (KV 8) needs a 3rd block, the pool is full: R1, the newest, is preempted (its 2
    blocks freed) and goes back to the waiting head with 7 tokens to recompute. A 3-token chunk
    of it would fit the free block beside R0's decode, yet nothing is admitted in step 5; step 6
    admits it.
    """
    sched, alloc = v1(4, max_num_batched_tokens=4, max_num_seqs=2, scheduler_reserve_full_isl=False)
    steps = trace(sched, alloc, 7, {0: [Request(0, 0, 4, 10), Request(1, 0, 4, 10)]})
    assert [s.chunks for s in steps[:3]] == [{0: (4, 0)}, {1: (3, 0)}, {1: (1, 3)}]
    assert steps[5] == Step({}, (0,), (1,), (), ())
    assert sched.groups[1].num_prefill_target == 7  # prompt 4 + 3 generated tokens
    assert steps[6] == Step({1: (3, 0)}, (0,), (), (), ())


def test_max_num_seqs_caps_the_running_requests():
    """vllm/v1/core/sched/scheduler.py (Scheduler.schedule): ``if len(self.running) ==
    self.max_num_running_reqs: break``. Two may run: R2 waits with budget and blocks to spare
    until R0 and R1 finish (step 2), and is admitted in step 3."""
    sched, alloc = v1(16, max_num_seqs=2)
    steps = trace(sched, alloc, 4, {0: [Request(i, 0, 2, 3) for i in range(3)]})
    assert [s.chunks for s in steps] == [{0: (2, 0), 1: (2, 0)}, {}, {}, {2: (2, 0)}]
    assert steps[2].finished == (0, 1)


# ----------------------------------------------------------------------------- preemption
def test_the_newest_is_preempted_to_the_waiting_head_and_finds_its_own_blocks():
    """vllm/v1/core/sched/scheduler.py (Scheduler.schedule: ``self.running.pop()``;
    Scheduler._preempt_request: blocks freed, ``num_computed_tokens = 0``,
    ``waiting.prepend_request``), and vllm/v1/core/block_pool.py (BlockPool.cache_full_blocks):
    every full block is named, generated tokens included, so with prefix caching a re-admitted
    request finds the blocks it had, while they are not evicted.

    5 blocks. R0 and R1 (prompt 4, output 9: 3 blocks each at the end) run in lockstep; in step 5
    (KV 8) both need a 3rd block and one is free: R0 takes it, R1 preempts itself. Its two full
    blocks stay cached (evictable); R2 (prompt 4, output 1) arrived meanwhile and waits behind
    it. R1 (9 tokens to recompute, 8 of them cached) needs 1 new block plus its 2 cached ones
    (claiming a free cached block takes it too) and 2 are free: R1 and R2 wait until R0 finishes
    in step 8. Step 9: R1 computes 1 token (8 hit), R2 its prompt. Without prefix caching R1
    recomputes all 9 tokens.
    """
    for caching, cached in ((True, 8), (False, 0)):
        sched, alloc = v1(5, caching=caching)
        reqs = {0: [Request(0, 0, 4, 9), Request(1, 0, 4, 9)], 5: [Request(2, 0, 4, 1)]}
        steps = trace(sched, alloc, 10, reqs)
        assert steps[5] == Step({}, (0,), (1,), (), ())
        assert all(s.chunks == {} and s.decodes == (0,) for s in steps[6:9])
        assert steps[8].finished == (0,)
        assert steps[9].chunks == {1: (9 - cached, cached), 2: (4, 0)}
        g1 = sched.groups[1]
        assert (g1.num_preemptions, g1.num_admissions, g1.readmission_hit_tokens) == (1, 2, cached)
        assert sched.readmission_hit_tokens == cached and sched.prefix_hit_tokens == 0
        finish(sched, alloc)


def test_a_fully_cached_prompt_still_computes_its_last_token():
    """vllm/v1/core/kv_cache_manager.py (KVCacheManager.get_computed_blocks):
    ``max_cache_hit_length = request.num_tokens - 1``: the last prompt token is always computed
    (its logits give the first output token), so a hit counts only full blocks before it.

    R0 (prompt 8 named by two prefix ids, 2 blocks) is cached once it finishes. R1 (the same 8
    tokens) hits 1 block, not 2, and computes 4 tokens; R2 (the same prefix + 1 token, 9) hits
    both blocks and computes 1.
    """
    sched, alloc = v1(16, caching=True)
    prefix = {"prefix_ids": (7, 8), "prefix_block_tokens": 4}
    steps = trace(sched, alloc, 2, {0: [Request(0, 0, 8, 1, **prefix)],
                                    1: [Request(1, 0, 8, 1, **prefix), Request(2, 0, 9, 1, **prefix)]})
    assert steps[0].chunks == {0: (8, 0)} and steps[0].finished == (0,)
    assert steps[1].chunks == {1: (4, 4), 2: (1, 8)}
    assert (sched.groups[1].prefix_hit_tokens, sched.groups[2].prefix_hit_tokens) == (4, 8)
    assert sched.prefix_query_tokens == 8 + 8 + 9


# ----------------------------------------------------------------------------- requests
def test_parallel_samples_are_separate_requests_sharing_the_prompt_through_the_cache():
    """vllm/v1/engine/parallel_sampling.py (ParentRequest): n samples are n requests to the
    engine; the request's first token is its first sample's, it finishes with its last.

    Prompt 9 (2 full blocks + 1 token), n = 3, output 2, budget 32, max_num_seqs 2 (the samples
    count one each, and three fit in turn). With prefix caching, sample 0 registers the 2 full prompt blocks
    at its admission (KVCacheManager.allocate_slots caches them at schedule time) and sample 1,
    admitted in the same step, finds them: it computes 1 token. Sample 2 waits for a slot (step
    2) and finds them too. Without caching each sample computes the whole prompt.
    """
    for caching, hit in ((True, 8), (False, 0)):
        sched, alloc = v1(16, caching=caching, max_num_seqs=2, max_num_batched_tokens=32)
        steps = trace(sched, alloc, 4, {0: [Request(5, 0, 9, 2, n=3)]})
        s0, s1, s2 = -1, -2, -3  # the samples' request ids inside the scheduler
        assert steps[0].chunks == {s0: (9, 0), s1: (9 - hit, hit)}
        assert steps[1].decodes == (s1, s0) and steps[1].finished == ()
        assert steps[2].chunks == {s2: (9 - hit, hit)}
        assert [s.first for s in steps] == [(5,), (), (), ()]
        assert [s.finished for s in steps] == [(), (), (), (5,)]
        parent = sched.groups[5]
        assert parent.status is Status.FINISHED and parent.num_admissions == 3
        assert (parent.prefix_hit_tokens, sched.num_finished) == (2 * hit, 1)
        assert not sched.has_work and alloc.num_seqs == 0


def test_parallel_samples_with_a_contiguous_allocator_reserve_a_region_each():
    """Without a shared pool of blocks nothing is shared: each sample reserves its own region."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, block_size=BS,
                          engine="vllm-v1")
    alloc = ContiguousAllocator(64, policy="oracle", max_model_len=32)
    sched = make_scheduler(alloc, cfg)
    g = sched.add_request(Request(0, 0, 9, 4, n=3))
    plan = sched.schedule()
    assert [c.num_tokens for c in plan.prefills] == [9, 9, 9]
    assert alloc.num_free_tokens() == 64 - 3 * 12  # oracle: 12 = 9 + 4 - 1 slots each
    sched.complete(plan)
    while sched.has_work:
        sched.complete(sched.schedule())
        alloc.check_invariants()
    assert g.status is Status.FINISHED and alloc.num_seqs == 0


def test_partial_prefills_are_validated_as_vllm_validates_them():
    """vllm/config/scheduler.py (SchedulerConfig.verify_max_model_len): concurrent partial
    prefills need chunked prefill, and their threshold cannot exceed max_model_len."""
    with pytest.raises(ValueError, match="needs enable_chunked_prefill"):
        SchedulerConfig(max_num_partial_prefills=2, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="cannot be greater than max_model_len"):
        SchedulerConfig(max_num_partial_prefills=2, long_prefill_token_threshold=100, max_model_len=64)
    SchedulerConfig(long_prefill_token_threshold=100, max_model_len=64)  # one partial prefill: allowed


def test_beam_search_is_rejected_and_swap_refused():
    """V1's engine has no beam search (vllm/entrypoints/llm.py, LLM.beam_search: it runs outside
    the engine) and no swap space (Scheduler._preempt_request recomputes)."""
    sched, _ = v1(16)
    g = sched.add_request(Request(0, 0, 4, 4, beam_width=2))
    assert g.status is Status.REJECTED and g.reject_reason.startswith("beam_search: ")
    assert not sched.has_work and sched.num_rejected == 1
    cfg = SchedulerConfig(block_size=BS, engine="vllm-v1", preemption_mode="swap", swap_space_tokens=64)
    with pytest.raises(ValueError, match="recompute only"):
        V1Scheduler(PagedAllocator(16, BS), cfg)


def test_the_watermark_keeps_blocks_free_when_admitting_beside_running_requests():
    """vllm/v1/core/kv_cache_manager.py (KVCacheManager.allocate_slots): ``watermark_blocks =
    int(watermark * num_blocks)`` more must stay free after a waiting request's allocation, when
    some request is already scheduled (``has_scheduled_reqs``); vllm/config/scheduler.py
    ``watermark`` (default 0.0).

    8 blocks, watermark 0.25: 2 blocks. Step 0: R0 (prompt 8, output 4) is admitted alone (no
    watermark: nothing runs) into 2 blocks. Step 1: R0 grows to 3 blocks to decode; R1 (prompt
    16: 4 blocks) finds 5 free, but 4 + 2 > 5: it waits. R0 finishes in step 3; in step 4
    nothing runs, so R1 is admitted without the watermark and prefills its 16 tokens. Without a
    watermark R1 is admitted in step 1, with the 15 tokens R0's decode leaves of the budget.
    """
    requests = {0: [Request(0, 0.0, 8, 4)], 1: [Request(1, 0.0, 16, 2)]}
    sched, alloc = v1(8, watermark=0.25)
    steps = trace(sched, alloc, 8, requests)
    assert [s.chunks for s in steps][:5] == [{0: (8, 0)}, {}, {}, {}, {1: (16, 0)}]
    assert steps[3].finished == (0,) and sched.num_kv_refusals == 3
    sched, alloc = v1(8)
    steps = trace(sched, alloc, 8, requests)
    assert [s.chunks for s in steps][:2] == [{0: (8, 0)}, {1: (15, 0)}]
    assert sched.num_kv_refusals == 0
