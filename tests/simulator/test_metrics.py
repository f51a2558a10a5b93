"""Metrics from a run small enough to work out by hand.

Two requests, a constant step of 0.1 s, a paged pool of 8 blocks of 4 slots (32):

* R0 arrives at 0, prompt 4, output 3 (6 KV tokens at the end).
* R1 arrives at 0.05 (during step 0), prompt 4, output 1.
* R2 arrives at 0.07 and is longer than max_model_len: rejected at once.

Step 0 [0, 0.1): R0 prefills (token 1).   Step 1 [0.1, 0.2): R0 decodes (token 2); R1 is admitted,
prefills, emits its only token and finishes.   Step 2 [0.2, 0.3): R0 decodes token 3, finishes.

KV after each step (token state / reserved / internal / free, in slots): step 0: R0 wrote 4 in
its one full block -> 4 / 0 / 0 / 28. Step 1: R0 grew to 2 blocks before writing position 4 ->
5 written, 1 more to come (final 6), 2 never written -> 5 / 1 / 2 / 24. Step 2: all freed -> 0/0/0/32.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.engine import metrics
from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.scheduler import Scheduler, SchedulerConfig
from workloads.request import Request

CAPACITY = 32
SUMMARY_FIELDS = {
    "completed", "rejected", "rejected_by_reason", "makespan_s", "warmup_requests",
    "throughput_window_s", "throughput_req_s",
    "throughput_tok_s", "throughput_total_tok_s", "queue_delay_s", "ttft_s", "tpot_s", "e2e_s",
    "mean_batch_size", "max_batch_size", "num_steps", "busy_fraction", "num_preemptions",
    "num_swaps", "requests_blocked_by_external_fragmentation", "prefix_hit_rate",
    "readmission_hit_tokens", "kv",
}
KV_FIELDS = {"token_state", "reserved", "internal_fragmentation", "external_fragmentation", "free",
             "shared_saved", "peak_token_state", "kv_capacity_tokens"}
STATS = {"mean", "p50", "p90", "p99"}


@pytest.fixture(scope="module")
def worked():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=16, block_size=4)

    def make(_: int):
        alloc = PagedAllocator(8, 4)
        return Scheduler(alloc, cfg), alloc

    requests = [Request(0, 0.0, 4, 3), Request(1, 0.05, 4, 1), Request(2, 0.07, 12, 8)]
    result = simulate(requests, make, ConstantLatency(0.1))
    req = metrics.requests_frame(result)
    steps = metrics.steps_frame(result)
    return result, req, steps, metrics.summarize(result, req, steps, CAPACITY)


def test_request_rows(worked):
    _, req, _, _ = worked
    assert tuple(req.columns) == metrics.REQUEST_COLUMNS
    assert list(req.status) == ["finished", "finished", "rejected"]
    assert req.reject_reason[2] == "max_model_len: prompt + output = 20 tokens > 16"
    assert req.queue_delay_s[:2].tolist() == pytest.approx([0.0, 0.05])
    assert req.ttft_s[:2].tolist() == pytest.approx([0.1, 0.15])
    assert req.e2e_s[:2].tolist() == pytest.approx([0.3, 0.15])
    assert req.tpot_s[0] == pytest.approx(0.1)  # (0.3 - 0.1) / (3 - 1)
    assert math.isnan(req.tpot_s[1])  # one output token: no time per output token
    assert all(math.isnan(req[c][2]) for c in ("queue_delay_s", "ttft_s", "tpot_s", "e2e_s"))


def test_step_rows(worked):
    _, _, steps, _ = worked
    assert steps.time_s.tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert steps.duration_s.tolist() == pytest.approx([0.1, 0.1, 0.1])
    assert steps.num_prefill_seqs.tolist() == [1, 1, 0]
    assert steps.num_prefill_tokens.tolist() == [4, 4, 0]
    assert steps.num_decode_seqs.tolist() == [0, 1, 1]
    assert steps.num_running_seqs.tolist() == [1, 1, 0]
    assert steps.kv_token_state.tolist() == [4, 5, 0]
    assert steps.kv_reserved.tolist() == [0, 1, 0]
    assert steps.kv_internal_fragmentation.tolist() == [0, 2, 0]
    assert steps.kv_external_fragmentation.tolist() == [0, 0, 0]
    assert steps.kv_free.tolist() == [28, 24, 32]


def test_summary_worked_numbers(worked):
    _, _, _, s = worked
    assert set(s) == SUMMARY_FIELDS
    assert set(s["kv"]) == KV_FIELDS
    assert (s["completed"], s["rejected"], s["rejected_by_reason"]) == (2, 1, {"max_model_len": 1})
    assert s["makespan_s"] == pytest.approx(0.3)
    assert s["throughput_req_s"] == pytest.approx(2 / 0.3)
    assert s["throughput_tok_s"] == pytest.approx((3 + 1) / 0.3)
    assert s["throughput_total_tok_s"] == pytest.approx((3 + 1 + 4 + 4) / 0.3)
    ttft = np.array([0.1, 0.15])
    assert s["ttft_s"]["mean"] == pytest.approx(0.125)
    assert [s["ttft_s"][k] for k in ("p50", "p90", "p99")] == pytest.approx(
        np.percentile(ttft, [50, 90, 99]).tolist())
    assert s["ttft_s"]["p90"] == pytest.approx(0.145)  # linear interpolation between the two
    assert s["tpot_s"] == pytest.approx({"mean": 0.1, "p50": 0.1, "p90": 0.1, "p99": 0.1})
    assert s["e2e_s"]["mean"] == pytest.approx(0.225)
    assert s["queue_delay_s"]["mean"] == pytest.approx(0.025)
    assert s["mean_batch_size"] == pytest.approx(4 / 3)  # batches 1, 2, 1 for 0.1 s each
    assert (s["max_batch_size"], s["num_steps"]) == (2, 3)
    assert s["busy_fraction"] == pytest.approx(1.0)
    assert (s["num_preemptions"], s["num_swaps"], s["prefix_hit_rate"]) == (0, 0, 0.0)
    kv = s["kv"]
    assert kv["token_state"] == pytest.approx(9 / 96)
    assert kv["reserved"] == pytest.approx(1 / 96)
    assert kv["internal_fragmentation"] == pytest.approx(2 / 96)
    assert kv["free"] == pytest.approx(84 / 96)
    assert kv["external_fragmentation"] == 0
    assert kv["peak_token_state"] == pytest.approx(5 / 32)
    assert kv["kv_capacity_tokens"] == CAPACITY


def test_summary_of_a_run_where_nothing_finishes():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=16, block_size=4)

    def make(_: int):
        alloc = PagedAllocator(8, 4)
        return Scheduler(alloc, cfg), alloc

    result = simulate([Request(0, 0.0, 30, 2)], make, ConstantLatency(0.1))
    req, steps = metrics.requests_frame(result), metrics.steps_frame(result)
    s = metrics.summarize(result, req, steps, CAPACITY)
    assert (s["completed"], s["rejected"], s["num_steps"]) == (0, 1, 0)
    assert s["ttft_s"] == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert s["throughput_req_s"] == 0.0 and s["busy_fraction"] == 0.0
    assert s["kv"]["free"] == 1.0 and s["kv"]["token_state"] == 0.0


def test_generated_tokens_count_every_sample():
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=16, block_size=4)

    def make(_: int):
        alloc = PagedAllocator(16, 4)
        return Scheduler(alloc, cfg), alloc

    result = simulate([Request(0, 0.0, 6, 3, n=4)], make, ConstantLatency(0.1))
    req, steps = metrics.requests_frame(result), metrics.steps_frame(result)
    s = metrics.summarize(result, req, steps, 64)
    assert s["makespan_s"] == pytest.approx(0.3)
    assert s["throughput_tok_s"] == pytest.approx(4 * 3 / 0.3)
    assert s["max_batch_size"] == 4
    # the fork shares the full block (4 tokens) and the partial one (2) with 3 more samples
    assert steps.kv_shared_saved.tolist()[0] == 3 * (4 + 2)
    assert steps.kv_shared_saved.tolist()[1] == 3 * 4  # the partial block was copied on write
