"""The real-time engine on CPU: a tiny trace completes, and the SimPy engine fed the measured step
durations makes the same scheduling decisions."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from backend.realtime import ReplayLatency, run_realtime
from backend.runner import ModelRunner
from simulator.engine import metrics
from simulator.engine.core import simulate
from simulator.kv.allocator import KVAllocator
from simulator.kv.models import get_model
from simulator.kv.paged import PagedAllocator
from simulator.scheduler import Scheduler, SchedulerConfig, Status
from workloads.request import Request

BLOCK_SIZE = 4
NUM_BLOCKS = 24  # 96 token slots for 8 concurrent requests of up to 36 tokens: preemption is certain
CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=48, block_size=BLOCK_SIZE,
                         enable_prefix_caching=True)
SWAP_CONFIG = replace(CONFIG, preemption_mode="swap", swap_space_tokens=64)


def replica_factory(config: SchedulerConfig) -> Callable[[int], tuple[Scheduler, KVAllocator]]:
    def make(_: int) -> tuple[Scheduler, KVAllocator]:
        alloc = PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        return Scheduler(alloc, config, detail=True), alloc
    return make


make_replica = replica_factory(CONFIG)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def trace() -> list[Request]:
    """8 requests at once (memory pressure), 3 later ones, and one too long to ever run."""
    first = [Request(i, 0.0, 8 + 2 * i, 10 + i, prefix_ids=(1,) if i % 3 == 0 else (),
                     prefix_block_tokens=4 if i % 3 == 0 else 0) for i in range(8)]
    later = [Request(8 + i, 0.02 * (i + 1), 12, 6, n=2 if i == 1 else 1) for i in range(3)]
    return first + later + [Request(11, 0.07, 40, 20)]


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(get_model("tiny"), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, device="cpu",
                       dtype="fp32", max_num_seqs=CONFIG.max_num_seqs,
                       max_num_batched_tokens=CONFIG.max_num_batched_tokens,
                       max_model_len=CONFIG.max_model_len)


@pytest.mark.parametrize("config", [CONFIG, SWAP_CONFIG], ids=["recompute", "swap"])
def test_trace_completes_and_the_simulator_replays_the_same_decisions(runner: ModelRunner,
                                                                      config: SchedulerConfig) -> None:
    make_replica = replica_factory(config)
    progress: list[int] = []
    real = run_realtime(trace(), make_replica, runner, warmup_steps=3, on_progress=progress.append)

    statuses = [g.status for g in real.groups]
    assert statuses.count(Status.FINISHED) == 11 and statuses[11] is Status.REJECTED
    assert sum(progress) == 12
    frame = metrics.requests_frame(real)
    assert len(frame) == 12 and frame.ttft_s.iloc[:11].gt(0).all()
    assert math.isnan(frame.ttft_s.iloc[11])
    summary = metrics.summarize(real, frame, metrics.steps_frame(real), NUM_BLOCKS * BLOCK_SIZE)
    assert summary["completed"] == 11 and summary["num_preemptions"] > 0
    assert (summary["num_swaps"] > 0) == (config.preemption_mode == "swap")
    assert len(real.samples) == len(real.steps)
    assert [s.measured_s for s in real.samples] == [row[3] for row in real.steps]
    assert all(0 < s.execute_s <= s.measured_s for s in real.samples)

    sim = simulate(real.requests, make_replica, ReplayLatency([row[3] for row in real.steps]))
    # the same decisions: admission order, preemptions, swaps, and every step's batch and KV state
    for g_real, g_sim in zip(real.groups, sim.groups):
        assert (g_real.status, g_real.admit_order, g_real.num_preemptions, g_real.num_swaps) == (
            g_sim.status, g_sim.admit_order, g_sim.num_preemptions, g_sim.num_swaps)
    assert [row[1:2] + row[4:] for row in real.steps] == [row[1:2] + row[4:] for row in sim.steps]
    # and the same timeline
    assert [row[2] for row in sim.steps] == pytest.approx([row[2] for row in real.steps], abs=1e-9)
    for t_real, t_sim in zip(real.times, sim.times):
        assert (t_real.admitted_s, t_real.first_token_s, t_real.finished_s) == pytest.approx(
            (t_sim.admitted_s, t_sim.first_token_s, t_sim.finished_s), abs=1e-9)


def test_arrivals_are_scaled(runner: ModelRunner) -> None:
    requests = [Request(0, 0.0, 6, 2), Request(1, 0.5, 6, 2)]
    real = run_realtime(requests, make_replica, runner, time_scale=0.02, warmup_steps=0)
    assert [r.arrival_s for r in real.requests] == [0.0, 0.01]
    assert real.times[1].admitted_s >= 0.01
    assert real.end_s == pytest.approx(real.steps[-1][2] + real.steps[-1][3])


def test_a_scheduler_without_detail_is_refused(runner: ModelRunner) -> None:
    def plain(_: int) -> tuple[Scheduler, KVAllocator]:
        alloc = PagedAllocator(NUM_BLOCKS, BLOCK_SIZE)
        return Scheduler(alloc, CONFIG), alloc

    with pytest.raises(ValueError, match="detail-mode"):
        run_realtime([Request(0, 0.0, 6, 2)], plain, runner, warmup_steps=0)
