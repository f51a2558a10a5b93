"""SGLang's scheduler step by step on tiny hand-traced cases (simulator/scheduler/sglang.py).

Every expected number below is worked out by hand from the rule the test names (with the SGLang
function it comes from); a pool of a few dozen tokens at page_size 1 unless said otherwise. After
every step the pool's invariants and the snapshot's conservation law are checked.
"""

from __future__ import annotations

import pytest

from simulator.kv.radix import RadixTokenPool
from simulator.scheduler.plan import StepPlan
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.sglang import SGLangScheduler
from simulator.scheduler.state import Status
from workloads.request import Request


def make(num_pages: int, page_size: int = 1, *, policy: str = "fcfs", evict: str = "lru",
         **knobs) -> tuple[SGLangScheduler, RadixTokenPool]:
    cfg = SchedulerConfig(**{"engine": "sglang", "block_size": page_size, "max_num_seqs": 8,
                             "max_num_batched_tokens": 64, "max_model_len": 1000,
                             "enable_prefix_caching": True, "schedule_policy": policy,
                             "radix_eviction_policy": evict, **knobs})
    pool = RadixTokenPool(num_pages, page_size, eviction_policy=evict)
    return SGLangScheduler(pool, cfg), pool


def step(sched: SGLangScheduler, pool: RadixTokenPool) -> tuple[StepPlan, list[int], list[int]]:
    """One schedule + complete: (plan, first-token request ids, finished request ids)."""
    plan = sched.schedule()
    assert not plan.is_empty
    out = sched.complete(plan)
    pool.check_invariants()
    snap = pool.snapshot(sched.written_tokens(), sched.head())
    parts = (snap.token_state, snap.reserved, snap.internal_fragmentation, snap.free)
    assert all(p >= 0 for p in parts) and sum(parts) == pool.capacity_tokens, snap
    return plan, [g.request_id for g in out.first_token], [g.request_id for g in out.finished]


def prefills(plan: StepPlan) -> list[tuple[int, int, int]]:
    """(sequence, tokens, tokens already computed) of the plan's prefill chunks."""
    return [(c.seq_id, c.num_tokens, c.num_computed_tokens) for c in plan.prefills]


# ----------------------------------------------------------------------------- admission reserve
@pytest.mark.parametrize("decodes_before", [1, 2])
def test_admission_reserves_the_running_futures_at_the_decaying_ratio(decodes_before):
    """PrefillAdder (schedule_policy.py): a running request reserves min(max_new_tokens −
    generated, CLIP) × new_token_ratio; a candidate needs prompt + max_new_tokens + 1 page below
    free + evictable − reserve (``add_one_req``). new_token_ratio decays per decode step
    (NewTokenRatioTracker.decay_step): here 0.5 → floor 0.1 in 4 steps, 0.1 a step.

    Pool 40. A: prompt 4, 21 tokens out, alone first. After A's prefill and j decode steps A
    holds 4 + j tokens and has 20 − j to go: the budget is 36 − j − (20 − j) × ratio_j:
    j = 1: 35 − 19 × 0.4 = 27.4; j = 2: 34 − 18 × 0.3 = 28.6. B (prompt 20, 7 out) needs
    20 + 7 + 1 = 28: refused after one decode step, admitted after two. Refused, B waits for
    ``batch_is_full`` to clear — until A has finished, though the ratio keeps decaying."""
    sched, pool = make(40, init_new_token_ratio=0.5, min_new_token_ratio_factor=0.2,
                       new_token_ratio_decay_steps=4)
    sched.add_request(Request(0, 0.0, 4, 21))
    plan, first, _ = step(sched, pool)
    assert prefills(plan) == [(0, 4, 0)] and first == [0]
    for j in range(decodes_before):
        plan, _, _ = step(sched, pool)
        assert plan.num_decode_seqs == 1 and not plan.prefills
    assert sched.new_token_ratio == pytest.approx(0.5 - 0.1 * decodes_before)
    sched.add_request(Request(1, 0.0, 20, 7))
    plan, first, _ = step(sched, pool)
    if decodes_before == 2:
        assert prefills(plan) == [(1, 20, 0)] and first == [1]
        return
    assert plan.num_decode_seqs == 1 and not plan.prefills  # refused: a decode step instead
    finished: list[int] = []
    steps = 3  # A decodes 20 tokens in all: steps 2..21, finishing in step 21
    while not finished:
        plan, _, finished = step(sched, pool)
        assert not plan.prefills  # batch_is_full: no prefill tried while A runs
        steps += 1
    assert steps == 21 and finished == [0]
    assert sched.new_token_ratio == pytest.approx(0.1)  # at its floor since step 5
    # Step 22: the decode batch has only the finished A: filtered out, batch_is_full cleared, no
    # batch, SGLang idles (new_token_ratio back to 0.5) and forms B's prefill at once.
    plan, first, _ = step(sched, pool)
    assert prefills(plan) == [(1, 20, 0)] and first == [1]
    assert sched.new_token_ratio == pytest.approx(0.5)


# ----------------------------------------------------------------------------- retraction
def test_decode_oom_retracts_fewest_generated_then_longest_prompt_and_sets_the_ratio():
    """Pool 40, new_token_ratio fixed at 0.1 (floor factor 1), retract_decode_steps 2.
    X (prompt 4), Y (6), Z (8), 12 tokens out each, arrive one step apart; each passes the
    reserve test at ratio 0.1 (Y: 6 + 12 + 1 = 19 < 36 − 1.1; Z: 21 < 30 − 2.2), over-committing
    the pool: 18 tokens held, 22 free, 3 taken per decode step.

    Step 11 needs 3 with 1 free (``check_decode_mem``): ``retract_decode`` sorts by (generated,
    −prompt) descending — all have 8 — and retracts from the end: Z, the longest prompt. Z frees
    its 7 generated tokens; its prompt, cached at prefill, stays in the tree, evictable
    (``release_kv_cache(is_insert=False)``); 8 free ≥ 2 × 2 (``release_req`` evicts nothing)
    and ≥ the 2 tokens the survivors need. new_token_ratio = (8 + 8 + 2 × 2) / (12 + 12 + 1) = 0.8.
    Z goes to the waiting queue's tail and, once X and Y have finished (step 14), re-prefills its
    8 generated tokens after finding its prompt cached (readmission hit 8); making room, the tree
    evicts X's leaf (11 tokens, the least recently used) and keeps Y's."""
    sched, pool = make(40, init_new_token_ratio=0.1, min_new_token_ratio_factor=1.0,
                       retract_decode_steps=2)
    for rid, prompt in enumerate((4, 6, 8)):
        sched.add_request(Request(rid, 0.0, prompt, 12))
        plan, first, _ = step(sched, pool)
        assert prefills(plan) == [(rid, prompt, 0)] and first == [rid]
    assert pool.available_tokens() == 22
    for _ in range(7):  # steps 4..10
        plan, _, _ = step(sched, pool)
        assert plan.num_decode_seqs == 3 and not plan.preempted
    assert pool.available_tokens() == 1
    plan, _, _ = step(sched, pool)  # step 11
    assert plan.preempted == (2,) and plan.num_decode_seqs == 2
    assert sched.new_token_ratio == pytest.approx(0.8)
    assert sched.num_preemptions == 1 and sched.groups[2].num_preemptions == 1
    assert sched.groups[2].status is Status.WAITING and sched.head() == (16, 19, 1)
    assert pool.evictable_tokens == 8 and pool.available_tokens() == 8 - 2
    # step 12: Z's retraction cleared batch_is_full, so Z is tried: 8 to compute + 4 to come +
    # 1 >= 6 free + 8 evictable − 0.8 × (3 + 3): refused; steps 12..14 decode X and Y
    for _ in range(2):
        plan, _, finished = step(sched, pool)
        assert plan.num_decode_seqs == 2 and not finished
    plan, _, finished = step(sched, pool)
    # X and Y end with 15 and 17 tokens, all inserted; with Z's prompt that fills the pool
    assert finished == [0, 1] and pool.evictable_tokens == 15 + 17 + 8 and pool.available_tokens() == 0
    plan, first, _ = step(sched, pool)  # step 15: Z finds its prompt, recomputes 8 tokens
    assert prefills(plan) == [(3, 8, 8)] and first == []
    assert sched.groups[2].readmission_hit_tokens == 8 and sched.readmission_hit_tokens == 8
    assert {n.key.prompt_owner for n in pool.tree.nodes() if n.end - n.start == 11} == {1}
    assert pool.tree.num_evicted_tokens == 11


# ----------------------------------------------------------------------------- policies
def _warm(sched: SGLangScheduler, pool: RadixTokenPool, requests: list[Request]) -> None:
    """Cache prompts: one-token requests finish at their prefill, their prompts in the tree."""
    for r in requests:
        sched.add_request(r)
        step(sched, pool)
    assert not sched.has_work


@pytest.mark.parametrize(("policy", "order"), [("fcfs", [10, 11, 12]), ("lpm", [11, 12, 10])])
def test_lpm_admits_the_longest_cached_prefix_first_fcfs_in_arrival_order(policy, order):
    """``SchedulePolicy.calc_priority``: lpm sorts the queue by cached prefix (prompt 30 each:
    R11 finds 20 cached tokens, R12 10, R10 none), fcfs keeps it. One running request at a time
    (max_running_requests 1) and one-token outputs make the admission order the step order."""
    sched, pool = make(200, policy=policy, max_num_seqs=1)
    _warm(sched, pool, [Request(0, 0.0, 20, 1, prefix_ids=(5,), prefix_block_tokens=20),
                        Request(1, 0.0, 10, 1, prefix_ids=(6,), prefix_block_tokens=10)])
    sched.add_request(Request(10, 0.0, 30, 1))
    sched.add_request(Request(11, 0.0, 30, 1, prefix_ids=(5,), prefix_block_tokens=20))
    sched.add_request(Request(12, 0.0, 30, 1, prefix_ids=(6,), prefix_block_tokens=10))
    seen = []
    while sched.has_work:
        plan, _, finished = step(sched, pool)
        seen += finished
    assert seen == order
    hits = {10: 0, 11: 20, 12: 10}
    assert [sched.groups[r].prefix_hit_tokens for r in order] == [hits[r] for r in order]


@pytest.mark.parametrize(("fillers", "first"), [(126, 11), (127, 10)])
def test_lpm_falls_back_to_fcfs_above_128_waiting(fillers, first):
    """``_determine_active_policy``: lpm with more than 128 waiting requests is fcfs. R10 (no
    cached prefix) arrives before R11 (20 cached tokens) and 126 or 127 others: 128 waiting sort
    R11 first, 129 keep R10 first."""
    sched, pool = make(400, policy="lpm", max_num_seqs=1)
    _warm(sched, pool, [Request(0, 0.0, 20, 1, prefix_ids=(5,), prefix_block_tokens=20)])
    sched.add_request(Request(10, 0.0, 30, 1))
    sched.add_request(Request(11, 0.0, 30, 1, prefix_ids=(5,), prefix_block_tokens=20))
    for i in range(fillers):
        sched.add_request(Request(100 + i, 0.0, 2, 1))
    _, _, finished = step(sched, pool)
    assert finished == [first]


@pytest.mark.parametrize(("evict", "hit"), [("lru", 0), ("lfu", 9)])
def test_lru_evicts_the_oldest_leaf_lfu_the_least_hit(evict, hit):
    """Pool 30, one-token requests (each prompt ends in the tree). A caches a 10-token system
    prompt S (prefix id 1); A2 with the same prompt finds 9 of it (all but its last token) and
    inserts it again: S's nodes have 2 hits. B caches 10 tokens of its own (1 hit, used later).
    C (20 tokens) needs 10 more than free: LRU evicts S (least recently used: its 1-token tail,
    then its 9-token head, childless now), LFU evicts B (fewest hits). D with S's prompt then
    finds 9 tokens cached with LFU, none with LRU."""
    sched, pool = make(30, evict=evict)
    s = dict(prefix_ids=(1,), prefix_block_tokens=10)
    _warm(sched, pool, [Request(0, 0.0, 10, 1, **s), Request(1, 0.0, 10, 1, **s)])
    assert sched.groups[1].prefix_hit_tokens == 9
    _warm(sched, pool, [Request(2, 0.0, 10, 1), Request(3, 0.0, 20, 1)])
    assert pool.tree.num_evicted_tokens == 10
    _warm(sched, pool, [Request(4, 0.0, 10, 1, **s)])
    assert sched.groups[4].prefix_hit_tokens == hit


@pytest.mark.parametrize(("page_size", "hit"), [(1, 37), (16, 32)])
def test_a_later_prompt_hits_the_shared_tokens_or_whole_pages(page_size, hit):
    """W's 37-token prompt is prefix ids (1, 2, 3) of 16 tokens cut short; R (60 tokens, ids
    (1, 2, 3)) shares those 37: it finds all 37 at page_size 1, 32 at page_size 16 (W's prompt
    went into the tree page-aligned; ``match_prefix`` matches whole pages)."""
    sched, pool = make(400 // page_size, page_size)
    ids = dict(prefix_ids=(1, 2, 3), prefix_block_tokens=16)
    _warm(sched, pool, [Request(0, 0.0, 37, 1, **ids), Request(1, 0.0, 60, 1, **ids)])
    assert sched.groups[1].prefix_hit_tokens == hit
    assert sched.prefix_query_tokens == 37 + 60


# ----------------------------------------------------------------------------- chunked prefill
def test_a_long_prompt_prefills_in_chunks_and_its_last_chunk_shares_the_budget():
    """chunked_prefill_size 16 (``max_num_batched_tokens``): A (40 tokens) takes 16, the budget
    is spent (``budget_state``: OTHER), B waits; A's next chunks go first (``add_chunked_req``):
    16, then its last 8, and B (5) fits in the 8 left. Nothing decodes in a prefill step."""
    sched, pool = make(200, max_num_batched_tokens=16)
    sched.add_request(Request(0, 0.0, 40, 3))
    sched.add_request(Request(1, 0.0, 5, 3))
    plan, first, _ = step(sched, pool)
    assert prefills(plan) == [(0, 16, 0)] and not first
    assert sched.written_tokens() == 16 and pool.tree.protected_size == 16  # chunk cached
    plan, first, _ = step(sched, pool)
    assert prefills(plan) == [(0, 16, 16)] and not first
    plan, first, _ = step(sched, pool)
    assert prefills(plan) == [(0, 8, 32), (1, 5, 0)] and first == [0, 1]
    plan, _, _ = step(sched, pool)
    assert plan.num_decode_seqs == 2 and plan.decode_context_tokens == 41 + 6


def test_parallel_samples_follow_a_prompt_only_request():
    """n = 2 (``TokenizerManager._handle_batch_request``): the prompt first runs with
    max_new_tokens 0 and goes into the tree; then two samples each find all but its last token
    and compute one; the group's first token is the first sample's, its end the last one's."""
    sched, pool = make(100)
    sched.add_request(Request(0, 0.0, 12, 3, n=2))
    plan, first, finished = step(sched, pool)
    assert prefills(plan) == [(0, 12, 0)] and first == [] and finished == []
    plan, first, _ = step(sched, pool)
    assert prefills(plan) == [(1, 1, 11), (2, 1, 11)] and first == [0]
    g = sched.groups[0]
    assert (g.prefix_hit_tokens, g.readmission_hit_tokens, g.seq_ids) == (0, 22, [1, 2])
    step(sched, pool)
    _, _, finished = step(sched, pool)
    assert finished == [0] and g.status is Status.FINISHED and not sched.has_work


def test_refusals_name_their_reason():
    sched, _ = make(40)
    assert sched.add_request(Request(0, 0.0, 5, 5, beam_width=2)).reject_reason.startswith("beam_search: ")
    assert sched.add_request(Request(1, 0.0, 990, 10)).reject_reason.startswith("max_model_len: ")
    assert sched.add_request(Request(2, 0.0, 30, 9)).reject_reason.startswith("kv_capacity: ")
    assert sched.add_request(Request(3, 0.0, 30, 8)).status is Status.WAITING  # 30 + 8 + 1 < 40
    assert sched.num_rejected == 3
