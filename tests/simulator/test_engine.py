"""The SimPy engine against queueing theory and against the latency model, step by step.

* M/D/1: one sequence at a time, one-token outputs, a constant step time D and Poisson arrivals
  make the engine an M/D/1 queue. Its waits must equal Lindley's recursion on the same arrivals
  exactly, and their mean the Pollaczek-Khinchine value ρD / (2(1 − ρ)) within sampling error.
* Little's law on every run: the time-average number of requests in the system (integrated
  from the request records) equals throughput × mean E2E, and at every step end the engine's
  own counts (running + waiting, from steps) equal what the request records say.
* One request's E2E is the sum of the roofline times of the plans it must take, built by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.engine import metrics
from simulator.engine.core import SimResult, simulate
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.gpus import get_gpu
from simulator.kv.models import load_model
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.scheduler import Scheduler, SchedulerConfig, Status
from workloads.request import Request


def factory(cfg: SchedulerConfig, make_alloc):
    def make(_: int):
        alloc = make_alloc()
        return Scheduler(alloc, cfg), alloc
    return make


def poisson_requests(num: int, rate_per_s: float, seed: int, prompt: int | tuple[int, int] = 8,
                     output: int | tuple[int, int] = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, num))
    arrivals -= arrivals[0]

    def draw(spec: int | tuple[int, int]) -> list[int]:
        return [spec] * num if isinstance(spec, int) else rng.integers(spec[0], spec[1] + 1, num).tolist()

    prompts, outputs = draw(prompt), draw(output)
    return [Request(i, float(t), p, o) for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs))]


def check_littles_law(result: SimResult, capacity_tokens: int) -> dict:
    """Little's law from the records, and the engine's per-step counts against the records.
    Returns the summary (for further checks)."""
    req = metrics.requests_frame(result)
    steps = metrics.steps_frame(result)
    summary = metrics.summarize(result, req, steps, capacity_tokens)
    done = req[req.status == Status.FINISHED.value]
    assert len(done) + summary["rejected"] == len(result.requests), "a request is unaccounted for"
    arrival = done.arrival_s.to_numpy()
    # residence in the engine: the client-side E2E less the front end's per-request delay
    front = result.request_overhead_s
    finish = arrival + done.e2e_s.to_numpy() - front
    assert np.all(finish >= arrival) and np.all(np.isfinite(finish))
    # time-average number in system: sweep the arrival (+1) and departure (-1) events
    times = np.concatenate([arrival, finish])
    deltas = np.concatenate([np.ones(len(arrival)), -np.ones(len(finish))])
    order = np.lexsort((deltas, times))  # departures before arrivals at equal times
    in_system = np.cumsum(deltas[order])
    assert in_system.min() >= 0
    area = float(np.sum(in_system[:-1] * np.diff(times[order])))
    horizon = summary["makespan_s"]
    assert horizon == pytest.approx(float(finish.max()))
    mean_in_system = area / horizon
    expected = summary["throughput_req_s"] * (summary["e2e_s"]["mean"] - front)
    assert mean_in_system == pytest.approx(expected, rel=1e-9)
    # the engine's own count after each step equals the records' count at that instant
    if (req.n == 1).all() and (req.beam_width == 1).all():
        admitted = req[req.status == Status.FINISHED.value]
        for replica, rows in steps.groupby("replica"):
            mine = admitted[admitted.replica == replica]
            a = np.sort(mine.arrival_s.to_numpy())
            f = np.sort((mine.arrival_s + mine.e2e_s - front).to_numpy())
            ends = (rows.time_s + rows.duration_s).to_numpy()
            # arrival + e2e can round a hair past the step end it equals; closed-loop clients
            # send exactly at step ends, counted after the step
            eps = 1e-9 * max(1.0, float(ends.max()))
            arrived = np.searchsorted(a, ends - eps, side="left")  # arrivals strictly before the end
            left = np.searchsorted(f, ends + eps, side="right")  # finished at or before it
            counted = (rows.num_running_seqs + rows.num_waiting).to_numpy()
            assert np.array_equal(arrived - left, counted)
    return summary


# ----------------------------------------------------------------------------- M/D/1
D_S = 0.01  # constant step time


def lindley_waits(arrivals: np.ndarray, service_s: float) -> np.ndarray:
    waits = np.zeros(len(arrivals))
    for i in range(1, len(arrivals)):
        waits[i] = max(0.0, waits[i - 1] + service_s - (arrivals[i] - arrivals[i - 1]))
    return waits


@pytest.mark.parametrize("rho,seed", [(0.6, 0)])
def test_md1_queueing_delay(rho, seed):
    rate = rho / D_S
    requests = poisson_requests(20_000, rate, seed, prompt=8, output=1)
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=16, max_model_len=64, block_size=16)
    result = simulate(requests, factory(cfg, lambda: PagedAllocator(4, 16)), ConstantLatency(D_S))
    summary = check_littles_law(result, 64)
    arrivals = np.array([r.arrival_s for r in requests])
    waits = np.array([t.admitted_s for t in result.times]) - arrivals
    assert np.allclose(waits, lindley_waits(arrivals, D_S), rtol=0, atol=1e-9)
    e2e = np.array([t.finished_s for t in result.times]) - arrivals
    assert np.allclose(e2e, waits + D_S, rtol=0, atol=1e-9)  # one step of service, no more
    theory = rho * D_S / (2 * (1 - rho))
    assert waits.mean() == pytest.approx(theory, rel=0.05)
    assert summary["queue_delay_s"]["mean"] == pytest.approx(waits.mean(), rel=1e-9)
    assert summary["busy_fraction"] == pytest.approx(rho, rel=0.03)
    assert summary["max_batch_size"] == 1


# ----------------------------------------------------------------------------- latency model
def test_single_request_e2e_is_the_sum_of_its_step_times():
    model, gpu = load_model("llama-3.1-8b"), get_gpu("h100-80gb")
    latency = RooflineLatency(model, gpu)
    prompt, output = 1000, 50
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192, max_model_len=4096, block_size=16)
    result = simulate([Request(0, 0.0, prompt, output)], factory(cfg, lambda: PagedAllocator(200, 16)),
                      latency)
    prefill = StepPlan(0, (PrefillChunk(0, prompt, 0, True),), 0, 0, 0.0, 0)
    decodes = [StepPlan(i, (), 1, prompt + i, float((prompt + i) ** 2), prompt + i) for i in range(1, output)]
    ttft = latency.step_latency_s(prefill)
    step_times = [latency.step_latency_s(p) for p in decodes]
    t = result.times[0]
    assert t.first_token_s == pytest.approx(ttft, rel=1e-12)
    assert t.finished_s == pytest.approx(ttft + sum(step_times), rel=1e-12)
    assert len(result.steps) == output
    assert [row[3] for row in result.steps] == pytest.approx([ttft, *step_times], rel=1e-12)
    # decode is memory-bound: each step reads one more KV token than the last
    assert all(b > a for a, b in zip(step_times, step_times[1:]))
    check_littles_law(result, 200 * 16)


# ----------------------------------------------------------------------------- idle and replicas
def test_idle_replica_does_not_step():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4)
    requests = [Request(i, 100.0 * i, 8, 5) for i in range(3)]  # far apart: each runs alone
    result = simulate(requests, factory(cfg, lambda: PagedAllocator(16, 4)), ConstantLatency(0.5),
                      num_replicas=2)
    assert len(result.steps) == 3 * 5  # one prefill + 4 decodes each, nothing while empty
    assert {row[0] for row in result.steps} == {0}  # replica 1 never had work: it never stepped
    for row in result.steps:
        start = row[2]
        assert any(r.arrival_s <= start < t.finished_s for r, t in zip(requests, result.times))
    assert [t.finished_s for t in result.times] == pytest.approx([2.5, 102.5, 202.5])
    assert result.end_s == pytest.approx(202.5)
    check_littles_law(result, 64)


def test_two_replicas_share_the_load_and_account_for_everything():
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128, block_size=4)
    requests = poisson_requests(600, 30.0, 1, prompt=(4, 40), output=(1, 30))
    result = simulate(requests, factory(cfg, lambda: PagedAllocator(24, 4)),
                      ConstantLatency(0.004, prefill_token_s=1e-4, decode_seq_s=2e-4), num_replicas=2)
    summary = check_littles_law(result, 96)
    replicas = [t.replica for t in result.times]
    assert set(replicas) == {0, 1}
    assert min(replicas.count(0), replicas.count(1)) > 0.3 * len(requests)
    assert {row[0] for row in result.steps} == {0, 1}
    assert summary["completed"] + summary["rejected"] == len(requests)
    assert summary["rejected"] == 0
    finished_by = [len(rep.scheduler.groups) for rep in result.replicas]
    assert sum(finished_by) == len(requests)
    assert summary["num_preemptions"] > 0  # 96 slots per replica: KV is tight


def test_first_free_replica_gets_simultaneous_arrivals_in_turn():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4)
    requests = [Request(i, 0.0, 4, 3) for i in range(6)]
    result = simulate(requests, factory(cfg, lambda: PagedAllocator(16, 4)), ConstantLatency(0.1),
                      num_replicas=3)
    assert [t.replica for t in result.times] == [0, 1, 2, 0, 1, 2]
    check_littles_law(result, 64)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("make_alloc", [lambda: PagedAllocator(20, 4),
                                        lambda: ContiguousAllocator(80, policy="pow2", max_model_len=64)],
                         ids=["paged", "contiguous-pow2"])
def test_littles_law_under_kv_pressure(mode, make_alloc):
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64, block_size=4,
                          preemption_mode=mode, swap_space_tokens=64)
    requests = poisson_requests(400, 20.0, 2, prompt=(2, 30), output=(1, 30))
    result = simulate(requests, factory(cfg, make_alloc),
                      ConstantLatency(0.005, prefill_token_s=2e-4, decode_seq_s=5e-4))
    summary = check_littles_law(result, 80)
    assert summary["completed"] == len(requests)
    assert 0 < summary["kv"]["token_state"] < 1


def test_swapped_sampled_group_that_outgrows_the_pool_does_not_stall_the_engine():
    """Repro for a deadlock: a sampled group swapped back in as private copies no longer fits."""
    cfg = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=64, max_model_len=64, block_size=1,
                          swap_space_tokens=64)
    requests = [Request(0, 0.0, 6, 6), Request(1, 0.0, 10, 7, n=2)]
    result = simulate(requests, factory(cfg, lambda: PagedAllocator(30, 1)), ConstantLatency(0.01))
    assert all(g.status is Status.FINISHED for g in result.groups)


def test_rejected_requests_are_accounted_and_never_step():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, block_size=4)
    requests = [Request(0, 0.0, 8, 4), Request(1, 0.11, 30, 10), Request(2, 0.23, 8, 4)]
    result = simulate(requests, factory(cfg, lambda: PagedAllocator(16, 4)), ConstantLatency(0.05))
    assert [g.status for g in result.groups] == [Status.FINISHED, Status.REJECTED, Status.FINISHED]
    assert result.times[1].admitted_s == -1.0 and result.times[1].finished_s == -1.0
    summary = check_littles_law(result, 64)
    assert summary["rejected_by_reason"] == {"max_model_len": 1}
    assert math.isclose(summary["throughput_req_s"], 2 / result.end_s)
