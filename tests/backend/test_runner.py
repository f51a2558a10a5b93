"""ModelRunner executes a real detail-mode scheduler's plans: fixed buffers, COW, swaps, tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.runner import ModelRunner, decode_buckets, token_ids
from simulator.kv.models import get_model
from simulator.kv.paged import PagedAllocator
from simulator.scheduler.plan import StepPlan
from simulator.scheduler import Scheduler, SchedulerConfig, Status
from workloads.request import Request

TINY = get_model("tiny")
BLOCK_SIZE = 4
NUM_BLOCKS = 40
CONFIG = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=64, block_size=BLOCK_SIZE,
                         enable_prefix_caching=True)


def make_runner(config: SchedulerConfig = CONFIG, **kwargs: object) -> ModelRunner:
    return ModelRunner(TINY, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, device="cpu", dtype="fp32",
                       max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                       max_model_len=config.max_model_len, **kwargs)  # type: ignore[arg-type]


def trace() -> list[Request]:
    """Chunked prompts, a shared prefix, and n=2 samples (fork -> copy-on-write)."""
    return [
        Request(0, 0.0, 30, 6),
        Request(1, 0.0, 10, 5, n=2),
        Request(2, 0.0, 13, 4, prefix_ids=(7, 8), prefix_block_tokens=4),
        Request(3, 0.0, 14, 6, prefix_ids=(7, 8), prefix_block_tokens=4),
        Request(4, 0.0, 6, 7, n=3),
    ]


def run(runner: ModelRunner, scheduler: Scheduler, requests: list[Request],
        on_step: object = None) -> list[StepPlan]:
    for r in requests:
        scheduler.add_request(r)
    plans = []
    while scheduler.has_work:
        plan = scheduler.schedule()
        assert not plan.is_empty
        runner.execute(plan)
        if on_step is not None:
            on_step(plan)  # type: ignore[operator]
        scheduler.complete(plan)
        plans.append(plan)
    return plans


def test_runs_a_scheduler_trace_with_fixed_buffers_and_applies_cow() -> None:
    runner = make_runner()
    alloc = PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
    scheduler = Scheduler(alloc, CONFIG, detail=True)
    pointers = {name: t.data_ptr() for name, t in runner.buffers.items()}
    pool_pointer = runner.model.kv_pool.data_ptr()
    checked_copies: list[int] = []

    def check_cow(plan: StepPlan) -> None:
        assert plan.details is not None
        pool = runner.model.kv_pool
        for src, dst in plan.cow_copies:
            writer = next(d for d in plan.details if dst in d.block_table)
            filled = writer.position % BLOCK_SIZE  # tokens copied; this step writes the next one
            assert filled > 0
            assert torch.equal(pool[:, :, dst, :filled], pool[:, :, src, :filled])
            assert pool[:, :, dst, :filled].abs().sum() > 0
            checked_copies.append(filled)

    plans = run(runner, scheduler, trace(), check_cow)
    assert all(g.status is Status.FINISHED for g in scheduler.groups.values())
    assert checked_copies, "the trace must exercise copy-on-write"
    assert any(p.prefills and p.num_decode_seqs for p in plans), "the trace must have mixed steps"
    assert {name: t.data_ptr() for name, t in runner.buffers.items()} == pointers
    assert runner.model.kv_pool.data_ptr() == pool_pointer


@pytest.mark.parametrize("padded", [False, True])
def test_sampled_tokens_equal_the_dense_forward_of_each_sequence(padded: bool) -> None:
    """Without sharing, a sequence's inputs are token_ids(seq, 0..p): its sampled token must be
    the dense forward's greedy token — the step tensors are built right, padded rows included."""
    config = SchedulerConfig(max_num_seqs=5, max_num_batched_tokens=16, max_model_len=48,
                             block_size=BLOCK_SIZE)
    runner = make_runner(config, use_cuda_graphs=padded)
    scheduler = Scheduler(PagedAllocator(NUM_BLOCKS, BLOCK_SIZE), config, detail=True)
    checked = [0]

    def compare(plan: StepPlan) -> None:
        assert plan.details is not None and runner.last_sampled is not None
        sampling = [d for c, d in zip(plan.prefills, plan.details) if c.samples_token]
        sampling += list(plan.details[len(plan.prefills):])
        for d, token in zip(sampling, runner.last_sampled.tolist()):
            positions = np.arange(d.position + d.num_tokens)
            ids = token_ids(np.full_like(positions, d.seq_id), positions, runner.model.shape.vocab_size)
            dense = runner.model.reference_logits(torch.from_numpy(ids))[-1]
            assert token == int(dense.argmax())
            checked[0] += 1

    run(runner, scheduler, [Request(i, 0.0, 5 + 3 * i, 4) for i in range(3)], compare)
    assert checked[0] == 3 * 4


def test_swap_copies_touch_only_the_staging_blocks() -> None:
    runner = make_runner(swap_buffer_blocks=2)
    pool = runner.model.kv_pool
    pool.normal_()
    before = pool.clone()
    plan = StepPlan(step_id=0, prefills=(), num_decode_seqs=0, decode_context_tokens=0, decode_context_sq=0.0,
                    decode_max_context=0, num_swap_out_blocks=5, num_swap_in_blocks=3, details=())
    timing = runner.execute(plan)
    assert timing.total_s > 0 and timing.per_layer_s > 0
    assert torch.equal(pool[:, :, :NUM_BLOCKS + 1], before[:, :, :NUM_BLOCKS + 1])
    staging = NUM_BLOCKS + 1
    assert torch.equal(pool[:, :, staging:staging + 2], before[:, :, :2])  # swapped out, then back in


def test_timing_scales_the_layer_stack_to_the_full_model() -> None:
    runner = make_runner(num_layers=1)
    scheduler = Scheduler(PagedAllocator(NUM_BLOCKS, BLOCK_SIZE), CONFIG, detail=True)
    scheduler.add_request(Request(0, 0.0, 12, 2))
    timing = runner.execute(scheduler.schedule())
    assert (timing.num_layers, timing.num_total_layers) == (1, 2)
    assert 0 < timing.per_layer_s < timing.total_s
    assert timing.full_model_s == pytest.approx(timing.total_s + timing.per_layer_s)


def test_plans_without_details_are_refused() -> None:
    scheduler = Scheduler(PagedAllocator(NUM_BLOCKS, BLOCK_SIZE), CONFIG)
    scheduler.add_request(Request(0, 0.0, 8, 2))
    with pytest.raises(ValueError, match="detail=True"):
        make_runner().execute(scheduler.schedule())


def test_decode_buckets_cover_every_batch_size() -> None:
    assert decode_buckets(1) == (1,)
    assert decode_buckets(12) == (1, 2, 4, 8, 12)
    assert decode_buckets(32) == (1, 2, 4, 8, 16, 24, 32)


def test_token_ids_are_deterministic_and_in_range() -> None:
    seqs, positions = np.array([0, 0, 1, 7]), np.array([0, 1, 0, 123])
    ids = token_ids(seqs, positions, 512)
    assert np.array_equal(ids, token_ids(seqs, positions, 512))
    assert ids.min() >= 0 and ids.max() < 512 and len(set(ids.tolist())) == 4
