"""The continuous-batching scheduler driven directly (schedule/complete, no SimPy, no time).

Every scenario here is small enough to work out by hand: the expected chunk sizes, step counts,
victims and block counts in the asserts come from the rules in ``simulator/scheduler/core.py``'s
module docstring, not from a previous run. After every step the helpers check the allocator's
invariants, the memory snapshot's conservation law and (in detail mode) that the per-sequence
details agree with the plan and the allocator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import NamedTuple

import pytest

from simulator.kv.allocator import KVAllocator
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler.plan import StepPlan
from simulator.scheduler import Scheduler, SchedulerConfig, Status, StepOutcome
from workloads.request import Request

MAX_STEPS = 5_000


# ----------------------------------------------------------------------------- helpers
def check_snapshot(sched: Scheduler, alloc: KVAllocator) -> None:
    """The five parts of the pool are non-negative and sum to its capacity."""
    snap = alloc.snapshot(sched.written_tokens(), sched.head())
    parts = (snap.token_state, snap.reserved, snap.internal_fragmentation,
             snap.external_fragmentation, snap.free)
    assert all(p >= 0 for p in parts), snap
    assert sum(parts) == alloc.capacity_tokens, snap
    assert snap.shared_saved_tokens >= 0, snap


def check_details(plan: StepPlan, alloc: KVAllocator, prev_tables: dict[int, tuple[int, ...]]) -> None:
    """Detail mode: one SeqDetail per scheduled sequence (prefills first), consistent with the plan
    and with the allocator; block tables that changed in place are listed as COW copies."""
    details = plan.details
    assert details is not None
    assert len(details) == len(plan.prefills) + plan.num_decode_seqs
    for chunk, d in zip(plan.prefills, details):
        assert (d.seq_id, d.position, d.num_tokens) == (
            chunk.seq_id, chunk.num_computed_tokens, chunk.num_tokens)
    decodes = details[len(plan.prefills):]
    assert all(d.num_tokens == 1 for d in decodes)
    contexts = [d.context_len for d in decodes]
    assert sum(contexts) == plan.decode_context_tokens
    assert sum(c * c for c in contexts) == plan.decode_context_sq
    assert max(contexts, default=0) == plan.decode_max_context
    written: list[int] = []
    for d in details:
        assert d.context_len == d.position + d.num_tokens
        assert len(d.slot_mapping) == d.num_tokens
        if isinstance(alloc, PagedAllocator):
            bs = alloc.block_size
            assert d.block_table == alloc.block_table(d.seq_id)
            assert len(d.block_table) * bs >= d.context_len, "grow before write"
            for i, slot in enumerate(d.slot_mapping):
                pos = d.position + i
                assert slot == d.block_table[pos // bs] * bs + pos % bs
                block = slot // bs
                # a write lands in a private block, or computes a prefix-cached block's content
                assert alloc.ref_count[block] == 1 or alloc.block_hash[block] is not None, (d, block)
            prev = prev_tables.get(d.seq_id, ())
            for old, new in zip(prev, d.block_table):
                if old != new:
                    assert (old, new) in plan.cow_copies, (d.seq_id, old, new, plan.cow_copies)
            prev_tables[d.seq_id] = d.block_table
        else:
            assert isinstance(alloc, ContiguousAllocator)
            start, size = alloc.region(d.seq_id)
            assert d.block_table == (start,)
            assert d.context_len <= size
            assert d.slot_mapping == tuple(range(start + d.position, start + d.context_len))
        written.extend(d.slot_mapping)
    assert len(written) == len(set(written)), "two sequences write the same slot"
    assert all(src != dst for src, dst in plan.cow_copies)


def step(sched: Scheduler, alloc: KVAllocator, prev_tables: dict[int, tuple[int, ...]] | None = None
         ) -> tuple[StepPlan, StepOutcome]:
    """One schedule/complete round with every check."""
    plan = sched.schedule()
    alloc.check_invariants()
    if sched.detail:
        check_details(plan, alloc, {} if prev_tables is None else prev_tables)
    outcome = sched.complete(plan)
    alloc.check_invariants()
    check_snapshot(sched, alloc)
    return plan, outcome


def drive(sched: Scheduler, alloc: KVAllocator, arrivals: dict[int, list[Request]] | None = None,
          on_step: Callable[[int, StepPlan], None] | None = None) -> list[tuple[StepPlan, StepOutcome]]:
    """Run to the end; ``arrivals[i]`` are added before step i. Checks there is no leak at the end."""
    arrivals = dict(arrivals or {})
    history: list[tuple[StepPlan, StepOutcome]] = []
    tables: dict[int, tuple[int, ...]] = {}
    i = 0
    while sched.has_work or arrivals:
        for r in arrivals.pop(i, ()):
            sched.add_request(r)
        if sched.has_work:
            plan, outcome = step(sched, alloc, tables)
            assert not plan.is_empty, f"empty plan at step {i} with work left"
            if on_step is not None:
                on_step(i, plan)
            history.append((plan, outcome))
        i += 1
        assert i < MAX_STEPS, "no progress"
    assert alloc.num_seqs == 0, "KV of finished requests leaked"
    assert alloc.num_free_tokens() == alloc.capacity_tokens
    assert all(g.status in (Status.FINISHED, Status.REJECTED) for g in sched.groups.values())
    return history


class Step(NamedTuple):
    """One traced step of a hand-derived golden (:func:`trace`)."""

    chunks: dict[int, tuple[int, int]]  # request id -> (tokens computed this step, computed before)
    decodes: tuple[int, ...]  # request ids decoding this step
    preempted: tuple[int, ...]  # request ids preempted (TensorRT-LLM: paused) while building this step
    first: tuple[int, ...]  # request ids that emitted their first token
    finished: tuple[int, ...]


def trace(sched: Scheduler, alloc: KVAllocator, num_steps: int,
          arrivals: dict[int, list[Request]] | None = None) -> list[Step]:
    """``num_steps`` steps (fewer if the work ends) with every check; ``arrivals[i]`` are added
    before step i."""
    out = []
    for i in range(num_steps):
        for r in (arrivals or {}).get(i, ()):
            sched.add_request(r)
        if not sched.has_work:
            break
        plan = sched.schedule()
        owner = {g.seq_ids[0]: g.request_id for g in sched.running.values()}
        decodes = tuple(sorted(sched.decoding))
        outcome = sched.complete(plan)
        alloc.check_invariants()
        check_snapshot(sched, alloc)
        out.append(Step({owner[c.seq_id]: (c.num_tokens, c.num_computed_tokens) for c in plan.prefills},
                        decodes, plan.preempted, tuple(g.request_id for g in outcome.first_token),
                        tuple(g.request_id for g in outcome.finished)))
    return out


def finish(sched: Scheduler, alloc: KVAllocator) -> None:
    """Run the rest with every check (:func:`step`); nothing leaks."""
    for _ in range(1000):
        if not sched.has_work:
            break
        step(sched, alloc)
    assert not sched.has_work
    assert alloc.num_seqs == 0 and alloc.num_free_tokens() == alloc.capacity_tokens
    assert getattr(sched, "reserved_blocks", 0) == 0  # TensorRT-LLM's no-evict reservations: all returned


def paged(num_blocks: int, block_size: int = 4, *, prefix: bool = False) -> PagedAllocator:
    return PagedAllocator(num_blocks, block_size, enable_prefix_caching=prefix)


def config(**kw) -> SchedulerConfig:
    base = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=4)
    base.update(kw)
    return SchedulerConfig(**base)


def run(alloc: KVAllocator, cfg: SchedulerConfig, requests: Iterable[Request], *, detail: bool = False
        ) -> tuple[Scheduler, list[tuple[StepPlan, StepOutcome]]]:
    sched = Scheduler(alloc, cfg, detail=detail)
    for r in requests:
        sched.add_request(r)
    return sched, drive(sched, alloc)


def step_of(history, request_id: int, what: str) -> int:
    """Index of the step whose outcome lists the request as ``first_token`` or ``finished``."""
    hits = [i for i, (_, o) in enumerate(history)
            if any(g.request_id == request_id for g in getattr(o, what))]
    assert len(hits) == 1, (request_id, what, hits)
    return hits[0]


def req(rid: int, prompt: int, output: int, **kw) -> Request:
    return Request(rid, 0.0, prompt, output, **kw)


# ----------------------------------------------------------------------------- one request
@pytest.mark.parametrize("prompt,output,budget", [(10, 4, 8), (8, 1, 8), (3, 7, 32), (17, 5, 4)])
@pytest.mark.parametrize("detail", [False, True])
def test_single_request_step_counts(prompt, output, budget, detail):
    """ceil(P / budget) prefill chunks, the last emits token 1, then O - 1 decodes; KV = P + O - 1."""
    alloc = paged(16)
    sched, history = run(alloc, config(max_num_batched_tokens=budget), [req(0, prompt, output)],
                         detail=detail)
    num_chunks = -(-prompt // budget)
    assert len(history) == num_chunks + output - 1
    chunks = [c for plan, _ in history for c in plan.prefills]
    assert [c.num_tokens for c in chunks] == [min(budget, prompt - i * budget) for i in range(num_chunks)]
    assert [c.num_computed_tokens for c in chunks] == [i * budget for i in range(num_chunks)]
    assert [c.samples_token for c in chunks] == [False] * (num_chunks - 1) + [True]
    assert step_of(history, 0, "first_token") == num_chunks - 1
    assert step_of(history, 0, "finished") == len(history) - 1
    decodes = [plan for plan, _ in history[num_chunks:]]
    assert all(p.num_decode_seqs == 1 and not p.prefills for p in decodes)
    # the i-th decode reads the prompt and i generated tokens (its own write included)
    assert [p.decode_context_tokens for p in decodes] == [prompt + i for i in range(1, output)]
    assert [p.decode_max_context for p in decodes] == [prompt + i for i in range(1, output)]
    final_context = decodes[-1].decode_context_tokens if decodes else prompt
    assert final_context == prompt + output - 1
    g = sched.groups[0]
    assert g.status is Status.FINISHED and g.num_preemptions == 0
    assert sched.num_finished == 1


def test_chunk_sizes_shrink_by_the_decoding_sequences():
    """Budget = max_num_batched_tokens - decoding sequences; chunks fill it exactly."""
    alloc = paged(32)
    # A (4-token prompt) decodes from step 1; B's 30-token prompt gets what is left of 8 per step
    sched, history = run(alloc, config(max_num_batched_tokens=8), [req(0, 4, 20), req(1, 30, 2)])
    b_chunks = [(i, c.num_tokens) for i, (p, _) in enumerate(history) for c in p.prefills
                if c.seq_id == sched.groups[1].seq_ids[0]]
    assert b_chunks == [(0, 4), (1, 7), (2, 7), (3, 7), (4, 5)]
    for plan, _ in history:
        assert plan.num_batched_tokens <= 8
    assert step_of(history, 1, "first_token") == 4


def test_prompt_filling_its_last_block_grows_on_the_first_decode():
    """Grow before write: a prompt of exactly 2 blocks has 2 blocks after prefill and gets its
    third block in the schedule() of the first decode, before the token is written."""
    alloc = paged(8)
    sched = Scheduler(alloc, config(), detail=True)
    sched.add_request(req(0, 8, 3))
    plan, _ = step(sched, alloc)
    seq = plan.prefills[0].seq_id
    assert len(alloc.block_table(seq)) == 2
    plan = sched.schedule()
    assert len(alloc.block_table(seq)) == 3
    (detail,) = plan.details
    assert (detail.position, detail.context_len) == (8, 9)
    assert detail.slot_mapping == (alloc.block_table(seq)[2] * 4,)
    sched.complete(plan)
    drive(sched, alloc)


def test_prompt_with_room_in_its_last_block_does_not_grow():
    alloc = paged(8)
    sched = Scheduler(alloc, config())
    sched.add_request(req(0, 7, 2))
    plan, _ = step(sched, alloc)
    seq = plan.prefills[0].seq_id
    sched.schedule()
    assert len(alloc.block_table(seq)) == 2


# ----------------------------------------------------------------------------- admission
@pytest.mark.parametrize("make_alloc", [lambda: paged(6), lambda: ContiguousAllocator(
    24, policy="oracle", max_model_len=64)], ids=["paged", "contiguous"])
def test_fcfs_no_overtaking(make_alloc):
    """B does not fit while A runs; C would, but must not pass B."""
    alloc = make_alloc()
    admitted: list[tuple[int, int]] = []
    sched = Scheduler(alloc, config())
    for r in (req(0, 16, 4), req(1, 12, 2), req(2, 2, 2)):
        sched.add_request(r)
    drive(sched, alloc, on_step=lambda i, _: admitted.extend((g.request_id, i) for g in sched.newly_admitted))
    order = [rid for rid, _ in admitted]
    assert order == [0, 1, 2]
    when = dict(admitted)
    assert when[0] == 0
    assert when[2] >= when[1] > 0, admitted


def test_rejections_with_reasons():
    alloc = paged(8)  # 32 slots
    sched = Scheduler(alloc, config(max_num_seqs=4, max_model_len=64))
    too_long = sched.add_request(req(0, 60, 10))
    too_big = sched.add_request(req(1, 30, 10))  # 39 KV tokens -> 10 blocks > 8
    too_wide = sched.add_request(req(2, 4, 2, n=5))  # 6 blocks fit, 5 sequences do not
    exact = sched.add_request(req(3, 20, 13))  # 32 KV tokens: the whole pool, and P + O = 33
    at_len = sched.add_request(req(4, 60, 4))  # P + O = max_model_len, but 63 KV tokens > 32 slots
    assert too_long.reject_reason == "max_model_len: prompt + output = 70 tokens > 64"
    assert too_big.reject_reason == "kv_capacity: needs 40 KV slots, the whole pool holds 32"
    assert too_wide.reject_reason == "max_num_seqs: 5 sequences > 4"
    assert at_len.reject_reason == "kv_capacity: needs 64 KV slots, the whole pool holds 32"
    assert exact.status is Status.WAITING and exact.reject_reason == ""
    assert sched.num_rejected == 4
    history = drive(sched, alloc)
    assert exact.status is Status.FINISHED
    scheduled = {c.seq_id for plan, _ in history for c in plan.prefills}
    assert scheduled == set(exact.seq_ids)
    for g in (too_long, too_big, too_wide, at_len):
        assert g.status is Status.REJECTED and not g.seq_ids


def test_contiguous_rejects_by_its_reservation():
    alloc = ContiguousAllocator(40, policy="oracle", max_model_len=64)
    sched = Scheduler(alloc, config())
    g = sched.add_request(req(0, 6, 5, n=4))  # 4 regions of 10 fit exactly
    h = sched.add_request(req(1, 6, 6, n=4))  # 4 regions of 11 do not
    assert g.status is Status.WAITING
    assert h.reject_reason == "kv_capacity: needs 44 KV slots, the whole pool holds 40"
    drive(sched, alloc)
    assert g.status is Status.FINISHED


# ----------------------------------------------------------------------------- preemption
# A and B: 8-token prompts (2 blocks of 4 each) and 9 output tokens (16 KV tokens = 4 blocks at the
# end) in a pool of 6 blocks. Step 0 prefills both (4 blocks), step 1 grows both to 3 blocks (the
# prompts fill their blocks exactly). Step 5 writes position 12: A grows first, finds no block,
# and preempts the newest running request, B, which has written 12 KV tokens (5 emitted).
PAIR = (req(100, 8, 9), req(101, 8, 9))


def pair_config(mode: str, swap_tokens: int = 64) -> SchedulerConfig:
    return config(preemption_mode=mode, swap_space_tokens=swap_tokens)


@pytest.mark.parametrize("detail", [False, True])
def test_recompute_preemption_victim_is_newest_and_it_recomputes(detail):
    alloc = paged(6)
    sched, history = run(alloc, pair_config("recompute"), PAIR, detail=detail)
    a, b = sched.groups[100], sched.groups[101]
    preempting = [i for i, (p, _) in enumerate(history) if p.preempted]
    assert preempting == [5]
    assert history[5][0].num_decode_seqs == 1  # only A decodes in step 5
    assert (a.num_preemptions, b.num_preemptions, sched.num_preemptions) == (0, 1, 1)
    assert step_of(history, 100, "finished") == 8
    # B comes back after A frees its blocks: one chunk re-prefilling the prompt and its 5 tokens
    (chunk,) = history[9][0].prefills
    assert (chunk.num_tokens, chunk.num_computed_tokens, chunk.samples_token) == (13, 0, True)
    # that chunk emits token 6; tokens 7..9 come from three decodes
    assert step_of(history, 101, "first_token") == 0
    assert step_of(history, 101, "finished") == 12
    assert len(history) == 13
    assert [p.num_decode_seqs for p, _ in history[10:]] == [1, 1, 1]
    assert [p.decode_context_tokens for p, _ in history[10:]] == [14, 15, 16]
    assert a.status is b.status is Status.FINISHED
    assert sched.num_swaps == 0
    assert all(p.num_swap_out_blocks == p.num_swap_in_blocks == 0 for p, _ in history)


def test_preempted_lists_the_victim_request():
    """StepPlan.preempted names the preempted requests (one entry per preemption, as the
    num_preempted column and the num_preemptions total count them), not their sequences."""
    alloc = paged(6)
    sched = Scheduler(alloc, pair_config("recompute"))
    for r in PAIR:
        sched.add_request(r)
    for _ in range(5):
        step(sched, alloc)
    victim_seqs = tuple(sched.groups[101].seq_ids)
    plan = sched.schedule()
    assert plan.preempted == (101,) and victim_seqs != (101,)


@pytest.mark.parametrize("detail", [False, True])
def test_swap_preemption_swaps_out_and_back_in(detail):
    alloc = paged(6)
    sched, history = run(alloc, pair_config("swap"), PAIR, detail=detail)
    b = sched.groups[101]
    outs = [(i, p.num_swap_out_blocks) for i, (p, _) in enumerate(history) if p.num_swap_out_blocks]
    ins = [(i, p.num_swap_in_blocks) for i, (p, _) in enumerate(history) if p.num_swap_in_blocks]
    assert outs == [(5, 3)]  # B's 12 KV tokens = 3 blocks
    assert ins == [(9, 3)]  # the step after A finishes
    assert (b.num_preemptions, b.num_swaps, sched.num_swaps) == (1, 1, 1)
    # B resumes decoding where it stopped: no prefill, positions 12..15
    assert all(not p.prefills for p, _ in history[1:])
    assert [p.decode_context_tokens for p, _ in history[9:]] == [13, 14, 15, 16]
    assert step_of(history, 101, "finished") == 12
    assert b.status is Status.FINISHED


def test_swap_falls_back_to_recompute_without_swap_space():
    alloc = paged(6)
    sched, history = run(alloc, pair_config("swap", swap_tokens=8), PAIR)  # 12 tokens do not fit
    assert sched.num_swaps == 0 and sched.num_preemptions == 1
    assert history[9][0].prefills[0].num_tokens == 13


def _swap_with_a_late_arrival() -> tuple[Scheduler, list[tuple[int, list[int], int]]]:
    """PAIR in swap mode; C (3-token prompt, fits in the 2 free blocks) arrives while B is out."""
    alloc = paged(6)
    sched = Scheduler(alloc, pair_config("swap"))
    log: list[tuple[int, list[int], int]] = []  # (step, newly admitted, swap-in blocks)
    drive(sched, alloc, arrivals={0: list(PAIR), 6: [req(102, 3, 8)]},
          on_step=lambda i, p: log.append((i, [g.request_id for g in sched.newly_admitted],
                                           p.num_swap_in_blocks)))
    return sched, log


def test_swapped_request_comes_back_before_a_waiting_one():
    """B (swapped out at step 5) returns before C, which arrived later, is admitted."""
    sched, log = _swap_with_a_late_arrival()
    swap_in = min(i for i, _, blocks in log if blocks)
    admit_c = min(i for i, ids, _ in log if 102 in ids)
    assert swap_in <= admit_c, log
    assert all(sched.groups[r].status is Status.FINISHED for r in (100, 101, 102))


def test_parallel_sampling_paged_stores_the_prompt_once():
    """n=4: the prompt's blocks are shared after the fork; each sample then gets a private block,
    copying the shared partial last block (COW) for all samples but the last writer."""
    alloc = paged(16)
    sched = Scheduler(alloc, config(), detail=True)
    sched.add_request(req(0, 6, 3, n=4))  # 6 tokens = 1 full + 1 half block
    tables: dict[int, tuple[int, ...]] = {}
    step(sched, alloc, tables)
    g = sched.groups[0]
    assert len(g.seq_ids) == 4
    assert alloc.num_free_blocks() == 16 - 2  # forked: still two blocks
    plan, _ = step(sched, alloc, tables)
    assert plan.num_decode_seqs == 4 and plan.decode_context_tokens == 4 * 7
    assert len(plan.cow_copies) == 3 and plan.num_copy_tokens == 3 * 2
    assert alloc.num_free_blocks() == 16 - 5  # full block shared, 4 private half blocks
    full = {alloc.block_table(s)[0] for s in g.seq_ids}
    assert len(full) == 1 and alloc.ref_count[full.pop()] == 4
    drive(sched, alloc)


def test_parallel_sampling_paged_exact_block_prompt_needs_no_copy():
    alloc = paged(16)
    sched, history = run(alloc, config(), [req(0, 8, 3, n=4)], detail=True)
    assert all(not p.cow_copies for p, _ in history)
    assert history[1][0].num_decode_seqs == 4


def test_parallel_sampling_contiguous_reserves_four_regions():
    alloc = ContiguousAllocator(64, policy="oracle", max_model_len=64)
    sched = Scheduler(alloc, config(), detail=True)
    sched.add_request(req(0, 6, 3, n=4))  # 8 KV tokens per sample
    plan = sched.schedule()
    assert alloc.num_seqs == 4 and alloc.num_free_tokens() == 64 - 4 * 8
    assert [alloc.region(s)[1] for s in sched.groups[0].seq_ids] == [8] * 4
    assert len(plan.prefills) == 1  # the prompt is computed once, then copied
    sched.complete(plan)
    drive(sched, alloc)


@pytest.mark.parametrize("make_alloc", [lambda: paged(16), lambda: ContiguousAllocator(
    64, policy="oracle", max_model_len=64)], ids=["paged", "contiguous"])
def test_parallel_sampling_copies_are_reported_in_plans(make_alloc):
    """Every KV token the samples copy shows up in some plan's num_copy_tokens (latency models
    charge for it): paged copies only the shared partial block (2 tokens) for 3 samples;
    contiguous copies the whole 6-token prompt into 3 regions."""
    alloc = make_alloc()
    sched, history = run(alloc, config(), [req(0, 6, 3, n=4)])
    expected = 3 * 2 if isinstance(alloc, PagedAllocator) else 3 * 6
    assert sum(p.num_copy_tokens for p, _ in history) == expected


def test_parallel_sampling_paged_peak_below_contiguous():
    requests = [req(i, 20 + 3 * i, 12, n=4) for i in range(4)]
    peaks = {}
    for name, alloc in (("paged", paged(200)),
                        ("oracle", ContiguousAllocator(800, policy="oracle", max_model_len=64))):
        sched = Scheduler(alloc, config(max_num_seqs=16, max_num_batched_tokens=128))
        for r in requests:
            sched.add_request(r)
        peak = 0
        while sched.has_work:
            step(sched, alloc)
            peak = max(peak, alloc.capacity_tokens - alloc.num_free_tokens())
        peaks[name] = peak
    assert peaks["oracle"] == sum(4 * (r.prompt_tokens + r.output_tokens - 1) for r in requests)
    assert peaks["paged"] < 0.6 * peaks["oracle"], peaks


# ----------------------------------------------------------------------------- beam search
def _beam_history(seed: int, make_alloc=lambda: paged(200)) -> tuple[list, int, Scheduler]:
    alloc = make_alloc()
    cfg = config(max_num_seqs=8, max_num_batched_tokens=64, seed=seed, beam_replace_prob=0.5)
    sched = Scheduler(alloc, cfg, detail=True)
    # a 22-token prompt: the beams fork inside a block, so replacements copy on write
    sched.add_request(req(0, 22, 40, beam_width=4))
    trace, peak, tables = [], 0, {}
    while sched.has_work:
        plan, _ = step(sched, alloc, tables)
        peak = max(peak, alloc.capacity_tokens - alloc.num_free_tokens())
        trace.append(plan)
    assert alloc.num_seqs == 0
    return trace, peak, sched


def test_beam_search_is_deterministic_for_a_seed():
    first, _, _ = _beam_history(7)
    again, _, _ = _beam_history(7)
    assert first == again
    others = {tuple(p.cow_copies for p in _beam_history(s)[0]) for s in range(1, 6)}
    assert len(others) > 1, "the seed should drive the beams' fate"


def test_beam_search_shares_blocks():
    trace, peak, sched = _beam_history(3)
    assert sched.groups[0].status is Status.FINISHED
    assert len(trace) == 1 + 39 and all(p.num_decode_seqs == 4 for p in trace[1:])
    final_tokens = 22 + 40 - 1
    private_copies = 4 * -(-final_tokens // 4) * 4
    assert peak < private_copies, (peak, private_copies)
    assert sum(len(p.cow_copies) for p in trace) > 0  # replaced beams copied a shared last block


def test_beam_search_contiguous_keeps_private_regions():
    _, peak, sched = _beam_history(3, lambda: ContiguousAllocator(400, policy="oracle", max_model_len=64))
    assert sched.groups[0].status is Status.FINISHED
    assert peak == 4 * (22 + 40 - 1)


# ----------------------------------------------------------------------------- prefix caching
def test_prefix_caching_second_request_reuses_the_prefix():
    alloc = paged(32, prefix=True)
    sched = Scheduler(alloc, config(enable_prefix_caching=True))
    prefix = dict(prefix_ids=(5, 6, 7, 8), prefix_block_tokens=4)  # 16 shared tokens = 4 blocks
    first = sched.add_request(req(0, 20, 3, **prefix))
    while sched.has_work:
        step(sched, alloc)
    second = sched.add_request(req(1, 22, 3, **prefix))
    plan, _ = step(sched, alloc)
    (chunk,) = plan.prefills
    assert (chunk.num_computed_tokens, chunk.num_tokens) == (16, 6)
    assert (first.prefix_hit_tokens, second.prefix_hit_tokens) == (0, 16)
    assert (sched.prefix_hit_tokens, sched.prefix_query_tokens) == (16, 42)
    assert alloc.num_hit_blocks == 4
    drive(sched, alloc)
    assert second.status is Status.FINISHED


def test_prefix_caching_always_computes_one_prompt_token():
    """A prompt entirely inside the cached prefix still computes its last block (the logits)."""
    alloc = paged(32, prefix=True)
    sched = Scheduler(alloc, config(enable_prefix_caching=True))
    prefix = dict(prefix_ids=(1, 2, 3, 4), prefix_block_tokens=4)
    sched.add_request(req(0, 16, 2, **prefix))
    drive(sched, alloc)
    sched.add_request(req(1, 16, 2, **prefix))
    plan, _ = step(sched, alloc)
    (chunk,) = plan.prefills
    assert (chunk.num_computed_tokens, chunk.num_tokens) == (12, 4)
    drive(sched, alloc)


def test_prefix_caching_off_computes_everything():
    alloc = paged(32)
    sched = Scheduler(alloc, config())
    prefix = dict(prefix_ids=(5, 6, 7, 8), prefix_block_tokens=4)
    sched.add_request(req(0, 20, 3, **prefix))
    drive(sched, alloc)
    sched.add_request(req(1, 22, 3, **prefix))
    plan, _ = step(sched, alloc)
    assert plan.prefills[0].num_tokens == 22
    assert sched.prefix_hit_tokens == sched.prefix_query_tokens == 0
    drive(sched, alloc)


# ----------------------------------------------------------------------------- detail mode
def random_workload(seed: int, num: int = 40) -> dict[int, list[Request]]:
    """Requests arriving over the first steps: mixed lengths, samples, beams and shared prefixes."""
    rng = random.Random(seed)
    arrivals: dict[int, list[Request]] = {}
    prefixes = [(), (1, 2, 3), (1, 2, 9), (4, 4, 4, 4, 4)]
    for rid in range(num):
        kind = rng.random()
        n = rng.choice((2, 3)) if kind < 0.15 else 1
        beam = rng.choice((2, 3)) if 0.15 <= kind < 0.25 else 1
        ids = rng.choice(prefixes)
        r = Request(rid, 0.0, rng.randint(1, 40), rng.randint(1, 30), n=n, beam_width=beam,
                    prefix_ids=ids, prefix_block_tokens=8 if ids else 0)
        arrivals.setdefault(rng.randint(0, 60), []).append(r)
    return arrivals


ALLOCATORS = {
    "paged": lambda: PagedAllocator(24, 4),
    "paged-prefix": lambda: PagedAllocator(24, 4, enable_prefix_caching=True),
    "contiguous-oracle": lambda: ContiguousAllocator(120, policy="oracle", max_model_len=72),
    "contiguous-pow2": lambda: ContiguousAllocator(160, policy="pow2", max_model_len=72),
}


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_detail_mode_makes_identical_decisions(name, mode):
    cfg = config(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=72, preemption_mode=mode,
                 swap_space_tokens=48, enable_prefix_caching=name == "paged-prefix", seed=3)
    plans = {}
    for detail in (False, True):
        alloc = ALLOCATORS[name]()
        sched = Scheduler(alloc, cfg, detail=detail)
        history = drive(sched, alloc, random_workload(11))
        plans[detail] = [p for p, _ in history]
        statuses = sorted((g.request_id, g.status.value, g.num_preemptions) for g in sched.groups.values())
        plans[(detail, "groups")] = statuses
    assert all(p.details is None for p in plans[False])
    assert all(p.details is not None for p in plans[True])
    assert [p._replace(details=None) for p in plans[True]] == plans[False]
    assert plans[(True, "groups")] == plans[(False, "groups")]
    if name.startswith("paged"):  # contiguous regions are reserved up front: they never preempt
        assert any(p.preempted for p in plans[False]), "the pool should be tight enough to preempt"


@pytest.mark.parametrize("name", ["paged", "paged-prefix"])
def test_cow_copies_only_target_scheduled_sequences(name):
    """A copy-on-write listed in a plan lands in a block of a sequence that runs this step: a
    copy made for a sequence preempted later in the same schedule() is wasted work that the
    latency model charges (and a write into a block the step has freed)."""
    cfg = config(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=72, swap_space_tokens=48,
                 enable_prefix_caching=name == "paged-prefix", seed=3)
    alloc = ALLOCATORS[name]()
    sched = Scheduler(alloc, cfg, detail=True)
    stale: list[tuple[int, tuple[int, int]]] = []

    def check(i: int, plan: StepPlan) -> None:
        targets = {b for d in plan.details or () for b in d.block_table}
        stale.extend((plan.step_id, c) for c in plan.cow_copies if c[1] not in targets)

    drive(sched, alloc, random_workload(11), on_step=check)
    assert not stale, f"(step, (src, dst)) copies into blocks no scheduled sequence holds: {stale}"


def test_swapped_group_too_big_to_return_restarts_without_an_empty_step():
    """Sharing is lost on swap: B (n=2, a 10-token prompt shared, 16 KV tokens per sample at the
    end) fits a 30-slot pool only while its prompt is shared. Swapped back in as two private
    copies it outgrows the pool alone; it must restart from the prompt rather than produce a step
    with nothing to run (the engine treats such a step with no arrival pending as a deadlock)."""
    alloc = paged(30, block_size=1)
    cfg = config(max_num_seqs=3, max_num_batched_tokens=64, block_size=1, swap_space_tokens=64)
    sched = Scheduler(alloc, cfg)
    sched.add_request(req(0, 6, 6))
    b = sched.add_request(req(1, 10, 7, n=2))
    history = drive(sched, alloc)  # asserts every plan is non-empty
    # it is never swapped (it could not come back alone): it restarts from the prompt
    assert b.status is Status.FINISHED and b.num_preemptions >= 1 and b.num_swaps == 0
    assert len(history) < 40
