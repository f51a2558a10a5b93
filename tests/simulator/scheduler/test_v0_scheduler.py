"""vLLM V0's scheduling rules (simulator/scheduler/v0.py), each on a case derived by hand from
vLLM 0.10.2's ``vllm/core/scheduler.py`` and ``vllm/core/block_manager.py``, step by step the way
vLLM's own scheduler tests state them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig, Status, make_scheduler
from simulator.scheduler.v0 import V0Scheduler
from workloads.request import Request


def _v0(num_blocks: int, **cfg) -> tuple[V0Scheduler, PagedAllocator]:  # type: ignore[no-untyped-def]
    knobs = {"engine": "vllm-v0", "block_size": 16, "max_num_seqs": 8, "max_model_len": 4096,
             "max_num_batched_tokens": 4096, "enable_chunked_prefill": False, **cfg}
    config = SchedulerConfig(**knobs)
    alloc = PagedAllocator(num_blocks, 16, enable_prefix_caching=config.enable_prefix_caching)
    sched = make_scheduler(alloc, config)
    assert isinstance(sched, V0Scheduler)
    return sched, alloc


def _step(sched, alloc):  # type: ignore[no-untyped-def]
    plan = sched.schedule()
    sched.complete(plan)
    alloc.check_invariants()
    return plan


def test_without_chunked_prefill_a_step_that_admits_runs_no_decode() -> None:
    """``_schedule_default``: prefills first, and "Don't schedule decodes if prefills are
    scheduled". Request 0 prefills in step 0 and decodes in step 1; request 1, sent then,
    prefills alone in step 2 while request 0 waits; both decode in step 3. Request 0's KV does not
    grow in step 2."""
    sched, alloc = _v0(100)
    sched.add_request(Request(0, 0.0, 32, 4))
    p0 = _step(sched, alloc)
    assert [c.num_tokens for c in p0.prefills] == [32] and p0.num_decode_seqs == 0
    p1 = _step(sched, alloc)
    assert not p1.prefills and p1.num_decode_seqs == 1
    g0 = sched.groups[0]
    length = g0.kv_len(sched.decode_counter)
    sched.add_request(Request(1, 0.0, 48, 4))
    p2 = _step(sched, alloc)
    assert [c.num_tokens for c in p2.prefills] == [48]
    assert (p2.num_decode_seqs, p2.decode_context_tokens, p2.decode_max_context) == (0, 0, 0)
    assert g0.kv_len(sched.decode_counter) == length  # request 0 wrote nothing in step 2
    p3 = _step(sched, alloc)
    assert not p3.prefills and p3.num_decode_seqs == 2
    while sched.has_work:
        _step(sched, alloc)
    assert sched.num_finished == 2 and alloc.num_free_blocks() == 100


def test_admission_takes_every_block_of_the_prompt_and_later_chunks_never_preempt() -> None:
    """``_allocate_and_set_running`` → ``block_manager.allocate`` builds the whole prompt's block
    table at admission, chunked prefill or not. 10 blocks, budget 32: request 0 (64-token prompt)
    takes its 4 blocks in step 0 with a 32-token chunk; request 1 (64 + 40) waits for budget and
    is admitted in step 2 beside request 0's first decode with all 4 of its blocks, then prefills
    31 + 32 + 1 tokens without ever needing a block (kvplan admitted on the first chunk and grew
    per chunk before)."""
    sched, alloc = _v0(10, enable_chunked_prefill=True, max_num_batched_tokens=32)
    sched.add_request(Request(0, 0.0, 64, 40))
    sched.add_request(Request(1, 0.0, 64, 40))
    p0 = _step(sched, alloc)
    assert [(c.seq_id, c.num_tokens) for c in p0.prefills] == [(0, 32)]
    assert alloc.block_table(0) and len(alloc.block_table(0)) == 4
    p1 = _step(sched, alloc)
    assert [(c.seq_id, c.num_tokens) for c in p1.prefills] == [(0, 32)]
    p2 = _step(sched, alloc)
    assert p2.num_decode_seqs == 1 and [(c.seq_id, c.num_tokens) for c in p2.prefills] == [(1, 31)]
    assert len(alloc.block_table(1)) == 4 and alloc.num_free_blocks() == 1  # 4 + 4 + r0's 5th
    p3 = _step(sched, alloc)
    assert [c.num_tokens for c in p3.prefills] == [31] and not p3.preempted
    p4 = _step(sched, alloc)
    assert [c.num_tokens for c in p4.prefills] == [2] and not p4.preempted


def test_the_watermark_keeps_one_percent_of_the_blocks_free_at_admission() -> None:
    """``can_allocate``: OK when free − the sequence's blocks ≥ int(0.01 × num_gpu_blocks).
    200 blocks: watermark 2. Request 0 takes 150 (2,400 tokens); of the 50 left a prompt of 48
    blocks is admitted in the same step (48 + 2 ≤ 50), one of 49 is not (49 + 2 > 50)."""
    for blocks, admitted in ((48, True), (49, False)):
        sched, alloc = _v0(200)
        sched.add_request(Request(0, 0.0, 150 * 16, 2))
        sched.add_request(Request(1, 0.0, blocks * 16, 2))
        plan = _step(sched, alloc)
        assert [c.seq_id for c in plan.prefills] == ([0, 1] if admitted else [0])
        if not admitted:
            assert sched.num_kv_refusals == 1 and sched.waiting[0].request_id == 1


def test_a_prompt_that_could_never_leave_the_watermark_free_is_refused() -> None:
    """``can_allocate`` answers NEVER when num_blocks − the prompt's blocks < the watermark
    (vLLM marks the request FINISHED_IGNORED): 100 blocks, watermark 1, a 1,590-token prompt
    needs all 100. One block less is accepted."""
    sched, _ = _v0(100)
    g = sched.add_request(Request(0, 0.0, 1590, 1))
    assert g.status is Status.REJECTED and g.reject_reason.startswith("kv_capacity: the prompt's 100 blocks")
    assert not sched.waiting
    ok = sched.add_request(Request(1, 0.0, 1584, 1))  # 99 blocks
    assert ok.status is Status.WAITING and list(sched.waiting) == [ok]


def test_with_chunked_prefill_a_step_that_preempts_still_admits() -> None:
    """``_schedule_chunked_prefill`` calls ``_schedule_prefills`` whatever ``_schedule_running``
    preempted, and the victims rejoin the waiting queue after it (``waiting.extendleft``). 4
    blocks of 16: requests 0 and 1 (16 + 30 tokens) take a block each in step 0 and a second at
    token 17 in step 1, which fills the pool; request 2 (8 + 2) is sent then. In step 2 request 0,
    first in the queue, wants a free block (``can_append_slots``) and finds none: request 1, the
    tail, is preempted, and its 2 blocks let request 2 in within the same step, ahead of it."""
    sched, alloc = _v0(4, enable_chunked_prefill=True, max_num_batched_tokens=64)
    sched.add_request(Request(0, 0.0, 16, 30))
    sched.add_request(Request(1, 0.0, 16, 30))
    p0 = _step(sched, alloc)
    assert [c.num_tokens for c in p0.prefills] == [16, 16]
    p1 = _step(sched, alloc)
    assert p1.num_decode_seqs == 2 and not p1.preempted and alloc.num_free_blocks() == 0
    sched.add_request(Request(2, 0.0, 8, 2))
    p2 = _step(sched, alloc)
    assert p2.preempted == (1,) and p2.num_decode_seqs == 1
    assert [(c.num_tokens, c.num_computed_tokens) for c in p2.prefills] == [(8, 0)]
    assert [g.request_id for g in sched.waiting] == [1]
    while sched.has_work:
        _step(sched, alloc)
    assert sched.num_finished == 3


def test_with_prefix_caching_a_chunk_that_does_not_finish_its_prompt_is_whole_blocks() -> None:
    """``_chunk_new_tokens_to_schedule``: with prefix caching the budget a chunk may use is cut
    to a multiple of the block size — the budget, not the chunk, so the last 36 tokens of a
    100-token prompt do not fit 40 rounded to 32. Budget 40: 32, 32, 32, 4."""
    sched, alloc = _v0(50, enable_chunked_prefill=True, max_num_batched_tokens=40, enable_prefix_caching=True)
    sched.add_request(Request(0, 0.0, 100, 2, prefix_ids=(7, 8, 9), prefix_block_tokens=16))
    sizes = [c.num_tokens for c in _step(sched, alloc).prefills]
    while sched.groups[0].status is Status.PREFILLING:
        sizes += [c.num_tokens for c in _step(sched, alloc).prefills]
    assert sizes == [32, 32, 32, 4]


@pytest.mark.parametrize("chunked", [True, False])
def test_a_swapped_in_request_rejoins_the_running_queue_where_v0_puts_it(chunked: bool) -> None:
    """``_schedule_chunked_prefill`` extends ``self.running`` with the swapped-in requests before
    the decodes (a request that comes back is the last to be preempted again);
    ``_schedule_default`` after them (it is the first)."""
    config = SchedulerConfig(engine="vllm-v0", block_size=16, max_num_seqs=8, max_model_len=256,
                             max_num_batched_tokens=256, enable_chunked_prefill=chunked,
                             preemption_mode="swap", swap_space_tokens=1024)
    alloc = PagedAllocator(6, 16)
    sched = make_scheduler(alloc, config)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 16, 40))
    swapped_back = None
    for _ in range(200):
        if not sched.has_work:
            break
        before = {g.request_id for g in sched.swapped}
        plan = sched.schedule()
        sched.complete(plan)
        alloc.check_invariants()
        back = before - {g.request_id for g in sched.swapped}
        if back and swapped_back is None:
            swapped_back = back.pop()
            assert (next(iter(sched.running)) if chunked else next(reversed(sched.running))) == swapped_back
    assert swapped_back is not None and sched.num_swaps >= 1 and sched.num_finished == 3


@settings(max_examples=60, deadline=None)
@given(chunked=st.booleans(), caching=st.booleans(), num_blocks=st.integers(3, 40),
       budget=st.sampled_from([32, 64, 256]),
       reqs=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 60), st.integers(1, 3),
                               st.integers(0, 3)), min_size=1, max_size=12))
def test_every_request_ends_and_blocks_are_conserved(chunked, caching, num_blocks, budget, reqs) -> None:  # type: ignore[no-untyped-def]
    """Random requests (prompt, output, samples, shared prefix) through V0 on a small pool,
    chunked or not, with or without caching: the allocator's invariants hold after every step,
    every request finishes or is refused with a reason, and the pool is whole at the end."""
    max_len = 256
    config = SchedulerConfig(engine="vllm-v0", block_size=16, max_num_seqs=8, max_model_len=max_len,
                             max_num_batched_tokens=budget if chunked else max_len,
                             enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                             swap_space_tokens=512)
    alloc = PagedAllocator(num_blocks, 16, enable_prefix_caching=caching)
    sched = make_scheduler(alloc, config)
    groups = []
    for i, (p, o, n, prefix) in enumerate(reqs):
        ids = tuple(range(prefix * 10, prefix * 10 + p // 16)) if caching and prefix else ()
        groups.append(sched.add_request(Request(i, 0.0, p, o, n=n, prefix_ids=ids,
                                                prefix_block_tokens=16 if ids else 0)))
    for _ in range(20000):
        if not sched.has_work:
            break
        plan = sched.schedule()
        assert plan.num_decode_seqs or plan.prefills or plan.preempted or plan.num_swap_in_blocks or \
            plan.num_swap_out_blocks, "a step that does nothing"
        sched.complete(plan)
        alloc.check_invariants()
    assert not sched.has_work
    for g in groups:
        assert g.status is Status.FINISHED or (g.status is Status.REJECTED and g.reject_reason)
    assert alloc.num_free_blocks() == num_blocks


def test_contiguous_baselines_reserve_at_admission_without_a_watermark() -> None:
    """kvplan's contiguous baselines under V0's policy: the region is reserved at admission as
    before, and no watermark applies (a region has no blocks to keep free)."""
    config = SchedulerConfig(engine="vllm-v0", block_size=16, max_num_seqs=8, max_model_len=256,
                             max_num_batched_tokens=256, enable_chunked_prefill=False)
    alloc = ContiguousAllocator(512, policy="max", max_model_len=256)
    sched = make_scheduler(alloc, config)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 100, 20))
    plan = sched.schedule()
    assert [c.seq_id for c in plan.prefills] == [0, 1]  # two 256-token regions fill the 512
    sched.complete(plan)
    while sched.has_work:
        sched.complete(sched.schedule())
    assert sched.num_finished == 3


def test_a_decode_wants_a_free_block_even_when_its_last_block_has_room() -> None:
    """``can_append_slots`` is a worst-case heuristic: ``get_num_blocks_touched_by_append_slots``
    counts the first block a new token touches, the last one, even when it has room, and the
    touched blocks must not exceed the free ones. 7 blocks: prompts of 40 (3 blocks) and 56 (4)
    fill the pool in step 0; in step 1 neither needs a block (room for 48 and 64 tokens), but
    request 0, first in the queue, finds none free: the tail, request 1, is preempted and request
    0 decodes (benchmarks/parity_vllm_v0.py ``free-zero``, where vLLM 0.10.2 does the same)."""
    sched, alloc = _v0(7)
    sched.add_request(Request(0, 0.0, 40, 6))
    sched.add_request(Request(1, 0.0, 56, 6))
    p0 = _step(sched, alloc)
    assert [c.num_tokens for c in p0.prefills] == [40, 56] and alloc.num_free_blocks() == 0
    p1 = _step(sched, alloc)
    assert p1.preempted == (1,) and p1.num_decode_seqs == 1 and alloc.num_free_blocks() == 4
    while sched.has_work:
        _step(sched, alloc)
    assert sched.num_finished == 2
