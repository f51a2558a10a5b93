"""The prefix hit rate counts first admissions only; hits on re-admission are reported apart.

A pool of 8 blocks of 4 slots. R0 (prompt 8, output 16: 6 blocks at the end, no prefix ids) and
R1 (prompt 8 named by two prefix ids, output 12: 5 blocks) are admitted together and decode in
lockstep; at KV length 16 both hold 4 blocks (the pool is full) and R0's growth preempts R1, the
newest. R1's two prefix blocks stay cached (eviction takes a sequence's tail first, and R0 needs
only the two tail blocks), so when R0 finishes, R1 is re-admitted and finds its own 8 prompt
tokens. That is not prefix sharing: nothing else in the workload has R1's prefix, so the hit rate
must be 0, with the 8 tokens in ``readmission_hit_tokens``.
"""

from __future__ import annotations

from simulator.engine import metrics
from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.scheduler import Scheduler, SchedulerConfig, Status
from workloads.request import Request

BLOCK = 4
PREFIX = {"prefix_ids": (10, 11), "prefix_block_tokens": BLOCK}
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=BLOCK,
                         enable_prefix_caching=True)


def replica(_: int) -> tuple[Scheduler, PagedAllocator]:
    alloc = PagedAllocator(8, BLOCK, enable_prefix_caching=True)
    return Scheduler(alloc, CONFIG), alloc


def test_readmission_hits_on_own_blocks_do_not_inflate_the_rate() -> None:
    requests = [Request(0, 0.0, 8, 16), Request(1, 0.0, 8, 12, **PREFIX)]
    result = simulate(requests, replica, ConstantLatency(0.01))
    g0, g1 = result.groups
    assert g0.status is g1.status is Status.FINISHED
    assert (g0.num_preemptions, g1.num_preemptions) == (0, 1)
    assert (g1.num_admissions, g1.prefix_hit_tokens, g1.prefix_query_tokens) == (2, 0, 8)
    assert g1.readmission_hit_tokens == 8  # its own two prefix blocks, still cached
    assert (g0.prefix_query_tokens, g0.readmission_hit_tokens) == (0, 0)  # no prefix ids

    req = metrics.requests_frame(result)
    summary = metrics.summarize(result, req, metrics.steps_frame(result), 8 * BLOCK)
    assert summary["prefix_hit_rate"] == 0.0
    assert summary["readmission_hit_tokens"] == 8
    assert list(req.prefix_hit_tokens) == [0, 0] and list(req.readmission_hit_tokens) == [0, 8]


def test_first_admission_hits_count_once_per_request() -> None:
    """R1 shares R0's prefix and arrives after R0 finished: its first block (4 tokens) is found
    cached; its last block is recomputed for the logits although cached, so the rate over the
    two requests is 4 / 16."""
    requests = [Request(0, 0.0, 8, 2, **PREFIX), Request(1, 1.0, 8, 2, **PREFIX)]
    result = simulate(requests, replica, ConstantLatency(0.01))
    g0, g1 = result.groups
    assert (g0.prefix_hit_tokens, g1.prefix_hit_tokens, g1.prefix_query_tokens) == (0, 4, 8)
    assert g0.readmission_hit_tokens == g1.readmission_hit_tokens == 0
    summary = metrics.summarize(result, metrics.requests_frame(result), metrics.steps_frame(result), 8 * BLOCK)
    assert summary["prefix_hit_rate"] == 4 / 16
    assert summary["readmission_hit_tokens"] == 0
