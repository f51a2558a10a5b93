"""TensorRT-LLM's policy (simulator/scheduler/trtllm.py) on tiny cases traced by hand, step by step.

Pools of a few blocks of 4 tokens (``tokens_per_block`` 4). Each test names the TensorRT-LLM rule it
checks and where it comes from; the expected chunks, decodes, pauses and admissions are worked out
in its docstring. Every step also checks the allocator's invariants and the memory snapshot
(tests/.../test_scheduler.py), and every run ends with nothing leaked.
"""

from __future__ import annotations

import pytest

from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig, Status, make_scheduler
from simulator.scheduler.trtllm import TRTLLMScheduler
from tests.simulator.scheduler.test_scheduler import Step, finish, step, trace
from workloads.request import Request

BS = 4
GNE, MU = "GUARANTEED_NO_EVICT", "MAX_UTILIZATION"




def trt(num_blocks: int, policy: str = GNE, *, chunked: bool = False, caching: bool = False,
        **knobs: object) -> tuple[TRTLLMScheduler, PagedAllocator]:
    cfg = SchedulerConfig(**{"max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 64,
                             "block_size": BS, "engine": "trtllm", "enable_chunked_prefill": chunked,
                             "enable_prefix_caching": caching, "capacity_scheduler_policy": policy,
                             **knobs})  # type: ignore[arg-type]
    alloc = PagedAllocator(num_blocks, BS, enable_prefix_caching=caching)
    sched = make_scheduler(alloc, cfg)
    assert isinstance(sched, TRTLLMScheduler)
    return sched, alloc






def when(steps: list[Step], what: str, rid: int) -> int:
    """The step at which request ``rid`` appears in ``what`` (first, finished, preempted)."""
    return next(i for i, s in enumerate(steps) if rid in getattr(s, what))


# ----------------------------------------------------------------------------- capacity policies
def test_guaranteed_no_evict_refuses_what_max_utilization_admits_and_then_pauses():
    """Pool 7 blocks. R0: prompt 6, 10 out (a 16-token sequence: 4 blocks); R1: prompt 6, 14 out
    (20 tokens: 5 blocks); both arrive at step 0.

    GUARANTEED_NO_EVICT (capacityScheduler.cpp ``GuaranteedNoEvictScheduler::impl``; blocks to
    completion, kvCacheManager.cpp ``getRemainingBlocksToCompletion``): R0 takes 4 of the 7; R1
    needs 5 > 3 and waits — in every step while R0 runs (one KV refusal each, steps 0-9) — until
    R0 finishes (step 9: first token at step 0, 9 decodes). R1 prefills at step 10, decodes 13
    tokens, finishes at step 23. Nothing is ever preempted.

    MAX_UTILIZATION (``MaxUtilizationScheduler::operator()``; ``getNeededBlocksOneStep``: a first
    context chunk needs its prompt's blocks, a decode one block at a boundary): both prompts need
    2 blocks, both prefill at step 0 (4 used). Decodes write positions 6, 7, ... from step 1:
    position 8 (step 3) takes a block each (6 used), position 12 (step 7) one more each with one
    free: R0, first in the active list, takes it; R1 is short and is itself the last started
    request: R1 pauses (``LlmRequest::pause``: its 7 generated tokens join its prompt, 13 tokens).
    At steps 8 and 9 R1 needs ceil(13 / 4) = 4 blocks, 3 are free: refused; R0 finishes at step 9;
    R1 recomputes its 13 tokens at step 10 (no new first token: it had one) and decodes its last
    6 tokens, finishing at step 16."""
    sched, alloc = trt(7, GNE)
    r0, r1 = Request(0, 0, 6, 10), Request(1, 0, 6, 14)
    steps = trace(sched, alloc, 30, {0: [r0, r1]})
    assert steps[0] == Step({0: (6, 0)}, (), (), (0,), ())
    assert all(s.decodes == (0,) and not s.chunks for s in steps[1:10])
    assert when(steps, "finished", 0) == 9 and sched.num_kv_refusals == 10
    assert steps[10] == Step({1: (6, 0)}, (), (), (1,), ())
    assert when(steps, "finished", 1) == 23 and len(steps) == 24
    assert sched.num_preemptions == 0
    finish(sched, alloc)

    sched, alloc = trt(7, MU)
    steps = trace(sched, alloc, 30, {0: [Request(0, 0, 6, 10), Request(1, 0, 6, 14)]})
    assert steps[0] == Step({0: (6, 0), 1: (6, 0)}, (), (), (0, 1), ())
    assert all(s.decodes == (0, 1) and not s.preempted for s in steps[1:7])
    assert steps[7] == Step({}, (0,), (1,), (), ())
    assert steps[8] == Step({}, (0,), (), (), ()) and steps[9] == Step({}, (0,), (), (), (0,))
    assert steps[10] == Step({1: (13, 0)}, (), (), (), ())
    assert all(s.decodes == (1,) for s in steps[11:17])
    assert when(steps, "finished", 1) == 16 and len(steps) == 17
    assert sched.num_preemptions == 1 and sched.groups[1].num_preemptions == 1
    finish(sched, alloc)


def test_max_utilization_pauses_the_newest_started_request_first():
    """MAX_UTILIZATION pauses the *last started* request at or after the one short of a block
    (capacityScheduler.cpp: ``lastStartedReqIt`` from the end), so an older request keeps
    running. Pool 6. R0, R1, R2: prompts 4, 8 out each, all at step 0: each prompt 1 block (3
    used), step 0 prefills all three. Decodes write position 4 at step 1: a block each (6 used,
    none free). Position 8 at step 5: R0 is short of a block; the last started request is R2:
    paused (2 blocks back, its prompt now 4 + 5 = 9); R0 and then R1 grow. R2's 9 tokens need 3
    blocks, 0 are free until R0 and R1 finish at step 7 (8 out: first token at step 0, decodes
    1-7); R2 recomputes at step 8."""
    sched, alloc = trt(6, MU)
    steps = trace(sched, alloc, 30, {0: [Request(i, 0, 4, 8) for i in range(3)]})
    assert steps[0].chunks == {0: (4, 0), 1: (4, 0), 2: (4, 0)}
    assert all(s.decodes == (0, 1, 2) for s in steps[1:5])
    assert steps[5] == Step({}, (0, 1), (2,), (), ())
    assert steps[7].finished == (0, 1)
    assert steps[8] == Step({2: (9, 0)}, (), (), (), ())
    assert sched.groups[0].num_preemptions == 0 and sched.groups[2].num_preemptions == 1
    finish(sched, alloc)


def test_no_evict_counts_shared_prefix_blocks_once_and_waits_for_a_prefix_being_computed():
    """Block reuse (KvCacheConfig.enable_block_reuse, the default). Pool 9. R0 and R1: prompt 9
    whose first 8 tokens (2 blocks) are a shared prefix, 3 out (12 tokens: 3 blocks). R2: prompt
    9 of its own, 11 out (20 tokens: 5 blocks).

    Step 0: R0 is admitted (3 of 9). R1's first block to compute is R0's first, which R0 computes
    in this step: ``beneficialToSkip`` skips R1 (capacityScheduler.cpp), and at its context's end
    R0 stores its 2 full prompt blocks for reuse (``storeContextBlocks``).
    Step 1: R1 is admitted (9 − 3 = 6 ≥ 3, no credit for its hits at admission), shares R0's 2
    blocks and computes only its last prompt token — but the micro-batch charged it 9 tokens
    (the chunk is sized before the blocks are found). R2 (arrived at step 1) needs 5 > 6 − 3.
    Step 2: each shared block is in both R0's and R1's held count, so the no-evict room is
    9 − (3 + 3) + 2 = 5 (``NoEvictScheduledBlocksManager`` subtracts each request's blocks to
    completion from the free blocks): R2 is admitted. Without the sharing it would wait for R0."""
    sched, alloc = trt(9, GNE, caching=True)
    shared = {"prefix_ids": (7, 8), "prefix_block_tokens": 4}
    steps = trace(sched, alloc, 3, {0: [Request(0, 0, 9, 3, **shared), Request(1, 0, 9, 3, **shared)],
                                    1: [Request(2, 0, 9, 11)]})
    assert steps[0] == Step({0: (9, 0)}, (), (), (0,), ())
    assert steps[1] == Step({1: (1, 8)}, (0,), (), (1,), ())
    assert sched.groups[1].prefix_hit_tokens == 8
    assert steps[2] == Step({2: (9, 0)}, (0, 1), (), (2,), (0,))
    finish(sched, alloc)


# ----------------------------------------------------------------------------- the token budget
def test_without_chunked_context_a_prompt_runs_whole_or_waits():
    """MicroBatchScheduler::operator() without ``ctxChunkConfig``: a context request takes all its
    tokens; the first that does not fit the budget left stops the contexts. max_num_tokens 16.
    R0 and R1: prompt 10, 4 out, at step 0: R0 takes 10, R1's 10 > 6 waits; at step 1 R0's decode
    leaves 15: R1 prefills whole. R2 (prompt 17 > max_num_tokens) is refused at arrival
    (tensorrt_llm/llmapi/llm.py ``_check_arguments``: "should not exceed max_num_tokens")."""
    sched, alloc = trt(32, GNE)
    r2 = sched.add_request(Request(2, 0, 17, 4))
    assert r2.status is Status.REJECTED and "should not exceed max_num_tokens" in r2.reject_reason
    steps = trace(sched, alloc, 2, {0: [Request(0, 0, 10, 4), Request(1, 0, 10, 4)]})
    assert steps[0] == Step({0: (10, 0)}, (), (), (0,), ())
    assert steps[1] == Step({1: (10, 0)}, (0,), (), (1,), ())
    finish(sched, alloc)


def test_chunked_context_first_come_first_served_chunks_round_down_to_blocks():
    """``setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>`` (microBatchScheduler.cpp): with chunked
    context the contexts share what the decodes leave, in order, each min(rest, budget left,
    max_num_tokens); a cut chunk is rounded down to ``chunk_unit_size`` = tokens_per_block
    (py_executor_creator.py); a chunk of 0 is not scheduled, and a later context that fits whole
    still goes. max_num_tokens 16.

    Step 0: R0 (prompt 14) takes 14, 2 left; R1 (prompt 10): min(10, 2) = 2 is cut, rounded to 0:
    not scheduled; R2 (prompt 2) fits whole: scheduled. Step 1: the decodes of R0 and R2 take 2;
    R1 takes its 10."""
    sched, alloc = trt(32, GNE, chunked=True)
    steps = trace(sched, alloc, 2, {0: [Request(0, 0, 14, 3), Request(1, 0, 10, 3), Request(2, 0, 2, 3)]})
    assert steps[0] == Step({0: (14, 0), 2: (2, 0)}, (), (), (0, 2), ())
    assert steps[1] == Step({1: (10, 0)}, (0, 2), (), (1,), ())
    finish(sched, alloc)


def test_chunked_context_of_a_long_prompt_beside_decodes():
    """The same rule over several steps. max_num_tokens 16. R0 (prompt 3, 10 out) decodes from
    step 1. R1 (prompt 40) arrives at step 1: the decode leaves 15, min(40, 15) = 15 is cut and
    rounded down to 12, at steps 1, 2 and 3 (computed 0, 12, 24); at step 4 its last 4 tokens fit
    whole and it emits its first token."""
    sched, alloc = trt(32, GNE, chunked=True)
    steps = trace(sched, alloc, 5, {0: [Request(0, 0, 3, 10)], 1: [Request(1, 0, 40, 2)]})
    assert steps[0].chunks == {0: (3, 0)}
    assert [s.chunks for s in steps[1:]] == [{1: (12, 0)}, {1: (12, 12)}, {1: (12, 24)}, {1: (4, 36)}]
    assert all(s.decodes == (0,) for s in steps[1:])
    assert steps[4].first == (1,)
    finish(sched, alloc)


def test_max_batch_size_caps_the_requests_of_a_step():
    """The capacity scheduler takes at most ``max_num_requests`` = max_batch_size requests and the
    micro-batch at most max_batch_size (``scheduledReqSize >= maxBatchSizeRuntime``): with
    max_batch_size 2, the third request waits for a finish."""
    sched, alloc = trt(32, GNE, max_num_seqs=2)
    steps = trace(sched, alloc, 5, {0: [Request(i, 0, 4, 3) for i in range(3)]})
    assert steps[0].chunks == {0: (4, 0), 1: (4, 0)}
    assert steps[2].finished == (0, 1)
    assert steps[3] == Step({2: (4, 0)}, (), (), (2,), ())
    finish(sched, alloc)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("kind", ["beam_width", "n"])
def test_beams_and_samples_are_refused(kind):
    sched, _ = trt(32)
    g = sched.add_request(Request(0, 0, 4, 4, **{kind: 2}))
    assert g.status is Status.REJECTED and "not modelled" in g.reject_reason


def test_a_sequence_larger_than_the_pool_is_refused_under_no_evict():
    """GUARANTEED_NO_EVICT needs every block of prompt + max new tokens: 8 + 24 = 32 tokens = 8
    blocks > a 7-block pool. MAX_UTILIZATION only refuses what cannot finish alone: 31 KV tokens
    (the last token has none) need 8 blocks too; 8 + 21 − 1 = 28 (7 blocks) pass."""
    sched, _ = trt(7, GNE, max_model_len=64)
    assert sched.add_request(Request(0, 0, 8, 24)).status is Status.REJECTED
    sched, _ = trt(7, MU)
    assert sched.add_request(Request(0, 0, 8, 24)).status is Status.REJECTED
    assert sched.add_request(Request(1, 0, 8, 21)).status is Status.WAITING


def test_swap_and_contiguous_pools_are_not_trtllm():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, block_size=BS,
                          engine="trtllm", preemption_mode="swap")
    with pytest.raises(ValueError, match="pauses"):
        make_scheduler(PagedAllocator(8, BS), cfg)
    from simulator.kv.contiguous import ContiguousAllocator
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, block_size=BS,
                          engine="trtllm")
    with pytest.raises(ValueError, match="allocator paged"):
        make_scheduler(ContiguousAllocator(64, policy="max", max_model_len=64), cfg)
