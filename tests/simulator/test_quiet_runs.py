"""Quiet runs (macro-steps) change nothing but the speed: the same decisions, times and rows.

The engine runs each stretch of identical decode steps between two events as one
(``simulate(..., macro_steps=True)``, the default). The contract: per-request times are equal
bit for bit to the one-step-at-a-time run, full step rows are equal, and the summary (sums over
steps, added in closed form per bin) is equal to 1e-9 relative.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine import metrics
from simulator.config.deployment import build_deployment
from simulator.engine.core import simulate
from simulator.kv.models import load_model
from simulator.kv.gpus import get_gpu
from simulator.kv.paged import PagedAllocator
from simulator.latency import quiet_latencies, quiet_plans
from simulator.latency.constant import ConstantLatency
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import StepPlan
from simulator.config.overrides import scenario_overrides
from simulator.engine.runs import client_policy, load_workload
from simulator.config.scenario import load_scenario
from simulator.scheduler import Scheduler, SchedulerConfig
from simulator.scheduler.state import Status
from workloads.request import Request

ROOT = Path(__file__).resolve().parents[2]

# (scenario, overrides): every bundled kind of run, cut to a size a test can afford
CASES = [
    ("chat.yaml", {"workload.num_requests": 600}),
    ("chat.yaml", {"workload.num_requests": 400, "allocators": "[contiguous-pow2]"}),
    ("shared-prefix.yaml", {"workload.num_requests": 300}),
    ("parallel-sampling.yaml", {"workload.num_requests": 150}),
    ("beam-search.yaml", {"workload.num_requests": 60}),
    ("closed-loop.yaml", {"workload.num_requests": 300}),
    ("long-context.yaml", {"workload.num_requests": 60}),
    ("code.yaml", {"workload.num_requests": 300, "num_replicas": 3}),
    # each engine on the scenarios that compare them (chat, code: vllm-v1 by default)
    ("engines.yaml", {"workload.num_requests": 600, "engine": "vllm-v1"}),
    ("engines.yaml", {"workload.num_requests": 600, "engine": "vllm-v0"}),
    ("engines.yaml", {"workload.num_requests": 600, "engine": "sglang", "allocators": "[paged]"}),
    ("engines-prefix.yaml", {"workload.num_requests": 60, "engine": "vllm-v1"}),
    ("engines-prefix.yaml", {"workload.num_requests": 60, "engine": "sglang"}),
    ("shared-prefix.yaml", {"workload.num_requests": 300, "engine": "sglang", "allocators": "[paged]"}),
    # hybrid models (the hybrid manager's groups): paged and contiguous, with prefix caching
    ("hybrid-long-context.yaml", {"workload.num_requests": 40}),
    ("hybrid-long-context.yaml", {"workload.num_requests": 40, "allocators": "[contiguous-max]"}),
    ("shared-prefix.yaml", {"workload.num_requests": 300, "model": "gpt-oss-20b", "allocators": "[paged]",
                            "enable_prefix_caching": "true"}),
    ("shared-prefix.yaml", {"workload.num_requests": 200, "model": "gemma-3-12b", "gpu": "h100-80gb", "allocators": "[paged]",
                            "enable_prefix_caching": "true", "workload.arrival.rate": 12}),
]


def _run_both(name: str, overrides: dict[str, object], record: bool | str = True):  # type: ignore[no-untyped-def]
    extra = [f"{k}={v}" for k, v in overrides.items()]
    scenario, base = load_scenario(ROOT / "scenarios" / name, scenario_overrides(extra=extra))
    dep = build_deployment(scenario, base)
    requests = load_workload(scenario, base, dep.scheduler_config.max_model_len).requests
    clients = client_policy(scenario, len(requests))
    allocator = scenario.allocators[0]
    out = []
    for macro in (True, False):
        out.append(simulate(requests, dep.replica_factory(allocator), dep.latency,
                            num_replicas=scenario.num_replicas, clients=clients,
                            record_steps=record, macro_steps=macro))
    return dep, out


def _times(result) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [(t.admitted_s, t.first_token_s, t.finished_s, t.replica) for t in result.times]


def _assert_same_run(requests, make, latency, **kwargs) -> None:  # type: ignore[no-untyped-def]
    """``simulate`` with quiet runs and one step at a time: the same times, sends and rows."""
    fast = simulate(requests, make, latency, macro_steps=True, **kwargs)
    slow = simulate(requests, make, latency, macro_steps=False, **kwargs)
    assert _times(fast) == _times(slow)
    assert [r.arrival_s for r in fast.requests] == [r.arrival_s for r in slow.requests]
    assert sorted(fast.steps) == sorted(slow.steps)
    assert [g.status for g in fast.groups] == [g.status for g in slow.groups]


def _same_summary(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            _same_summary(x, y)
        elif isinstance(x, float) and not (math.isnan(x) and math.isnan(y)):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12), key
        elif not isinstance(x, float):
            assert x == y, key


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_quiet_runs_give_the_same_run(name, overrides):
    dep, (fast, slow) = _run_both(name, overrides)
    assert _times(fast) == _times(slow)  # bit for bit
    assert [g.status for g in fast.groups] == [g.status for g in slow.groups]
    assert [(g.num_preemptions, g.num_swaps, g.prefix_hit_tokens) for g in fast.groups] == \
        [(g.num_preemptions, g.num_swaps, g.prefix_hit_tokens) for g in slow.groups]
    assert fast.end_s == slow.end_s
    if len({t.replica for t in fast.times}) == 1:  # equal times on several replicas may swap rows
        assert fast.steps == slow.steps
    else:
        assert sorted(fast.steps) == sorted(slow.steps)
    totals = fast.totals(), slow.totals()
    assert (totals[0].num_steps, totals[0].max_batch, totals[0].peak_token_state, totals[0].peak_used) == \
        (totals[1].num_steps, totals[1].max_batch, totals[1].peak_token_state, totals[1].peak_used)
    summaries = []
    for r in (fast, slow):
        req = metrics.requests_frame(r)
        summaries.append(metrics.summarize(r, req, None, dep.capacity_tokens))
    _same_summary(*summaries)


def test_quiet_runs_do_happen_and_bins_keep_the_totals(monkeypatch):
    """The bundled chat trace: most steps run inside quiet runs, and the per-second bins give the
    summary the full rows give."""
    runs: list[int] = []
    advance = Scheduler.advance_quiet

    def counted(self, plan, k, record=None):  # type: ignore[no-untyped-def]
        runs.append(k)
        return advance(self, plan, k, record)

    monkeypatch.setattr(Scheduler, "advance_quiet", counted)
    dep, (fast, slow) = _run_both("chat.yaml", {"workload.num_requests": 600}, record="bins")
    # quiet runs did the most of the work in the run that uses them (and none in the other)
    assert sum(runs) > fast.totals().num_steps / 2 and min(runs) >= 5
    full = _run_both("chat.yaml", {"workload.num_requests": 600}, record=True)[1][1]
    assert fast.steps == slow.steps or all(
        x[:2] == y[:2] and all(math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9) for u, v in zip(x, y))
        for x, y in zip(fast.steps, slow.steps))
    assert sum(row[-1] for row in fast.steps) == len(full.steps)
    sums = [metrics.summarize(r, metrics.requests_frame(r), None, dep.capacity_tokens)
            for r in (fast, full)]
    _same_summary(*sums)
    assert sums[0]["num_steps"] == len(full.steps)
    # the peaks the totals keep are the full rows' peaks (capacity's KV figures rely on them)
    assert fast.totals().peak_used == full.totals().peak_used == max(r[10] + r[11] + r[12] for r in full.steps)
    assert fast.totals().peak_token_state == max(r[10] for r in full.steps)


# --------------------------------------------------------------------------- random workloads
@st.composite
def workloads(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 40))
    t = 0.0
    requests = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.2]))
        requests.append(Request(i, t, draw(st.integers(1, 60)), draw(st.integers(1, 80)),
                                n=draw(st.sampled_from([1, 1, 1, 2]))))
    return requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads(), blocks=st.integers(12, 64), block_size=st.sampled_from([1, 4, 16]),
       replicas=st.integers(1, 2), mode=st.sampled_from(["recompute", "swap"]))
def test_random_runs_are_the_same_with_and_without_quiet_runs(requests, blocks, block_size, replicas, mode):
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=160,
                          block_size=block_size, preemption_mode=mode, swap_space_tokens=256)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(blocks, block_size)
        return Scheduler(alloc, cfg), alloc

    latency = ConstantLatency(0.004, prefill_token_s=1e-4, decode_seq_s=2e-4)
    _assert_same_run(requests, make, latency, num_replicas=replicas)


STEP_S = 1 / 256  # binary fractions: sums of step times land exactly on arrival times (ties)


@st.composite
def tied_workloads(draw):  # type: ignore[no-untyped-def]
    """Arrivals on the step-time grid, so sends coincide with step boundaries exactly."""
    n = draw(st.integers(1, 30))
    t = 0.0
    requests = []
    for i in range(n):
        t += draw(st.integers(0, 12)) * STEP_S
        requests.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 60))))
    return requests


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=tied_workloads(), block_size=st.sampled_from([1, 4]))
def test_sends_at_step_boundaries_are_seen_by_the_same_step(requests, block_size):
    """Arrivals at exactly a quiet run's step boundaries (one replica, open loop): the run is cut
    where one step at a time would have seen the request, the same instant's order included."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
                          block_size=block_size)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(400 // block_size, block_size)
        return Scheduler(alloc, cfg), alloc

    _assert_same_run(requests, make, ConstantLatency(STEP_S))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads(), replicas=st.integers(1, 3),
       clients=st.sampled_from([(2, 0.0), (3, 0.0131), (1, 0.0517), (5, 0.0)]))
def test_clients_and_replicas_give_the_same_run(requests, replicas, clients):
    """Capped and closed-loop clients, think times, several replicas: a request sent to a replica
    in a quiet run cuts the run where one step at a time would have seen it."""
    from workloads.clients import Clients

    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=160, block_size=4)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(40, 4)
        return Scheduler(alloc, cfg), alloc

    policy = Clients(max_in_flight=clients[0], think_time_s=clients[1])
    latency = ConstantLatency(0.0041, prefill_token_s=1.3e-4, decode_seq_s=2.1e-4)
    _assert_same_run(requests, make, latency, num_replicas=replicas, clients=policy)


# --------------------------------------------------------------------------- latency models
def _decode_plan(n: int, ctx: int, sq: int, longest: int) -> StepPlan:
    return StepPlan(7, (), n, ctx, float(sq), longest)


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-8b", 1), ("llama-3.1-8b", 2),
                                          ("mixtral-8x7b", 2), ("deepseek-v3", 8)])
def test_quiet_latencies_are_each_steps_latency_bit_for_bit(model, tp):
    cfg = load_model(model)
    roofline = RooflineLatency(cfg, get_gpu("h100-80gb"), tp=tp)
    plan = _decode_plan(37, 37 * 900, 37 * 900 * 900, 2000)
    fast = list(quiet_latencies(roofline, plan, 400))
    slow = [roofline.step_latency_s(p) for p in quiet_plans(plan, 400)]
    assert fast == slow


def test_quiet_plans_grow_every_context_by_one():
    lengths = [5, 9, 30]
    n = len(lengths)
    plan = _decode_plan(n, sum(x + 1 for x in lengths), sum((x + 1) ** 2 for x in lengths), 31)
    for j, p in enumerate(quiet_plans(plan, 5), start=1):
        now = [x + 1 + j for x in lengths]
        assert (p.step_id, p.decode_context_tokens, p.decode_context_sq, p.decode_max_context) == \
            (7 + j, sum(now), float(sum(x * x for x in now)), max(now))


# --------------------------------------------------------------------------- stop_if
def test_stop_if_ends_the_run_with_its_reason():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=200, block_size=4)
    requests = [Request(i, 0.01 * i, 20, 50) for i in range(30)]
    seen: list[int] = []

    def stop(now_s, first, finished, sent):  # type: ignore[no-untyped-def]
        seen.extend(finished)
        return "enough" if len(seen) >= 5 else None

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(200, 4)
        return Scheduler(alloc, cfg), alloc

    result = simulate(requests, make, ConstantLatency(0.01), stop_if=stop)
    assert result.stopped == "enough"
    finished = [i for i, g in enumerate(result.groups) if g is not None and g.status is Status.FINISHED]
    assert sorted(finished) == sorted(seen)
    assert any(g is None or g.status is not Status.FINISHED for g in result.groups)
    frame = metrics.requests_frame(result)  # a stopped run still gives its tables
    assert len(frame) == len(requests)
    assert result.end_s == max(result.times[i].finished_s for i in finished)
    full = simulate(requests, make, ConstantLatency(0.01))
    assert full.stopped is None
    assert all(g.status is Status.FINISHED for g in full.groups)
