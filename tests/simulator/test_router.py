"""Routing policies over data-parallel replicas (simulator/scheduler/router.py): each policy's rule on
hand-built replica states, in whole runs, under a stale view, and with quiet runs."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.scheduler.router import POLICIES, Router, RouterConfig
from simulator.scheduler import Scheduler, SchedulerConfig, Status
from workloads.request import Request

from tests.simulator.test_quiet_runs import _assert_same_run, _times

CFG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=2048, block_size=16)
CFG_CACHED = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=2048, block_size=16,
                             enable_prefix_caching=True)
QUIET_POLICIES = ("least-outstanding", "round-robin", "vllm-dp", "prefix-affinity")


def factory(num_blocks: int = 400, prefix_caching: bool = False):  # type: ignore[no-untyped-def]
    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(num_blocks, 16, enable_prefix_caching=prefix_caching)
        return Scheduler(alloc, CFG_CACHED if prefix_caching else CFG), alloc
    return make


def fake(index: int, *, outstanding: int = 0, waiting: int = 0, running: int = 0,
         free_tokens: int = 100) -> SimpleNamespace:
    """A replica as the router reads it: counters and a KV pool of 100 token slots."""
    alloc = SimpleNamespace(num_free_tokens=lambda: free_tokens, capacity_tokens=100)
    sched = SimpleNamespace(waiting=deque(range(waiting)), swapped=deque(), num_running_seqs=running)
    return SimpleNamespace(index=index, outstanding=outstanding, scheduler=sched, allocator=alloc,
                           held=[], late=[])


def prefixed(i: int, t: float, group: int, prompt: int = 256, output: int = 8) -> Request:
    """A request whose first 128 prompt tokens are the shared prefix ``group``."""
    return Request(i, t, prompt, output, prefix_ids=(group,), prefix_block_tokens=128)


def spread_requests(n: int = 60) -> list[Request]:
    return [prefixed(i, 0.013 * i, i % 3, prompt=64 + 37 * (i % 7), output=5 + 11 * (i % 5))
            for i in range(n)]


# --------------------------------------------------------------------------- the rules
def test_vllm_dp_scores_waiting_four_times_running():
    # scores 4*2 + 1 = 9, 4*0 + 8 = 8, 4*1 + 5 = 9: replica 1 despite the most running
    replicas = [fake(0, waiting=2, running=1), fake(1, waiting=0, running=8), fake(2, waiting=1, running=5)]
    assert Router(RouterConfig("vllm-dp"), replicas).route(prefixed(0, 0.0, 0)) == 1
    # a tie (4*1 + 0 = 4 = 4*0 + 4) goes to the lowest index
    replicas = [fake(0, waiting=1, running=0), fake(1, waiting=0, running=4)]
    assert Router(RouterConfig("vllm-dp"), replicas).route(prefixed(0, 0.0, 0)) == 0


def test_least_kv_and_weighted_read_the_pool_and_the_queue():
    replicas = [fake(0, free_tokens=20), fake(1, free_tokens=60, outstanding=3), fake(2, free_tokens=60)]
    # usage 0.8, 0.4, 0.4: the tie between 1 and 2 goes to fewer outstanding
    assert Router(RouterConfig("least-kv"), replicas).route(prefixed(0, 0.0, 0)) == 2
    # queue scores (min-max over waiting 0, 4, 2): 1, 0, 0.5; kv: 0.2, 0.6, 0.6 -> totals with
    # queue 1, kv 1: 1.2, 0.6, 1.1
    replicas = [fake(0, waiting=0, free_tokens=20), fake(1, waiting=4, free_tokens=60),
                fake(2, waiting=2, free_tokens=60)]
    cfg = RouterConfig("weighted", scorers=(("queue", 1.0), ("kv-utilization", 1.0)))
    assert Router(cfg, replicas).route(prefixed(0, 0.0, 0)) == 0
    cfg = RouterConfig("weighted", scorers=(("queue", 1.0), ("kv-utilization", 3.0)))  # 1.6, 1.8, 2.3
    assert Router(cfg, replicas).route(prefixed(0, 0.0, 0)) == 2


def test_prefix_affinity_follows_the_prefix_until_the_load_is_imbalanced():
    replicas = [fake(0), fake(1), fake(2)]
    router = Router(RouterConfig("prefix-affinity", balance_abs_threshold=4, balance_rel_threshold=1.5),
                    replicas)
    first = router.route(prefixed(0, 0.0, 7))
    assert first == 0  # nothing cached anywhere: the smallest cache, lowest index
    router.routed(first, prefixed(0, 0.0, 7))
    replicas[0].outstanding = 1
    # other groups go to the smaller caches; group 7 (half its 256-token prompt matched, > 0.3)
    # sticks to replica 0
    second = router.route(prefixed(1, 0.0, 8))
    assert second == 1
    router.routed(second, prefixed(1, 0.0, 8))
    replicas[1].outstanding = 1
    for i in range(2, 6):
        assert router.route(prefixed(i, 0.0, 7)) == 0
        router.routed(0, prefixed(i, 0.0, 7))
    # replica 0 holds 5 outstanding, replica 2 none: 5 - 0 > 4 and 5 > 0 * 1.5, imbalanced
    replicas[0].outstanding = 5
    assert router.route(prefixed(6, 0.0, 7)) == 2


def test_stale_view_counts_the_routers_own_sends_only():
    replicas = [fake(0, outstanding=0), fake(1, outstanding=2)]
    router = Router(RouterConfig("least-outstanding", refresh_interval_s=1.0), replicas)
    router.refresh()
    replicas[1].outstanding = 0  # its requests finish after the refresh: the view still says 2
    picks = []
    for i in range(4):
        picks.append(router.route(prefixed(i, 0.0, 0)))
        router.routed(picks[-1], prefixed(i, 0.0, 0))
    assert picks == [0, 0, 0, 1]  # 0+1, 0+2 vs 2, then the tie at 2, 2 + ... -> lowest, then 1
    assert router.load(0).outstanding == 3 and router.load(1).outstanding == 3


# --------------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_is_routed_once_and_runs_are_deterministic(policy):
    requests = spread_requests()
    make = factory(prefix_caching=True)
    runs = [simulate(requests, make, ConstantLatency(0.004, decode_seq_s=2e-4), num_replicas=3,
                     router=RouterConfig(policy)) for _ in range(2)]
    assert _times(runs[0]) == _times(runs[1])
    replicas = [t.replica for t in runs[0].times]
    assert all(0 <= r < 3 for r in replicas)
    assert all(g.status is Status.FINISHED for g in runs[0].groups)
    assert sum(len([r for r in replicas if r == k]) for k in range(3)) == len(requests)


def test_round_robin_is_exact():
    requests = spread_requests(47)
    result = simulate(requests, factory(), ConstantLatency(0.004), num_replicas=4,
                      router=RouterConfig("round-robin"))
    assert [t.replica for t in result.times] == [i % 4 for i in range(47)]


def test_least_outstanding_is_the_default():
    requests = spread_requests()
    default = simulate(requests, factory(), ConstantLatency(0.004), num_replicas=3)
    named = simulate(requests, factory(), ConstantLatency(0.004), num_replicas=3,
                     router=RouterConfig("least-outstanding"))
    assert _times(default) == _times(named)


def test_prefix_affinity_keeps_groups_together_under_light_load():
    # 3 groups, one request at a time (each ends before the next is sent): no imbalance, so each
    # group stays on the replica its first request went to, and groups land on separate replicas
    requests = [prefixed(i, 0.5 * i, i % 3) for i in range(12)]
    result = simulate(requests, factory(), ConstantLatency(0.004), num_replicas=3,
                      router=RouterConfig("prefix-affinity"))
    replica = [t.replica for t in result.times]
    assert replica == [0, 1, 2] * 4


def test_precise_prefix_sends_a_request_where_its_prefix_is_cached():
    # request 0 (group 5) fills replica 0's cache, requests 1 and 2 (other groups) go where no
    # prefix matches (fewest outstanding), request 3 shares group 5 and finds it on replica 0
    requests = [prefixed(0, 0.0, 5), prefixed(1, 0.001, 6), prefixed(2, 0.002, 7), prefixed(3, 1.0, 5)]
    result = simulate(requests, factory(prefix_caching=True), ConstantLatency(0.004), num_replicas=3,
                      router=RouterConfig("precise-prefix"))
    assert [t.replica for t in result.times] == [0, 1, 2, 0]
    assert result.groups[3].prefix_hit_tokens == 128


def test_a_long_refresh_interval_piles_a_burst_onto_the_replica_that_looked_idle():
    # request 0 holds replica 0's pool from t = 0; at the refresh (t = 0.5) replica 1 is empty.
    # Then 6 large requests arrive 0.05 s apart: fresh KV usage spreads them as replica 1 fills,
    # the view of t = 0.5 sends every one to replica 1
    requests = [Request(0, 0.0, 64, 1900)] + [Request(i, 0.55 + 0.05 * i, 512, 400) for i in range(1, 7)]
    runs = {}
    for interval in (0.0, 0.5):
        result = simulate(requests, factory(num_blocks=800), ConstantLatency(0.004), num_replicas=2,
                          router=RouterConfig("least-kv", refresh_interval_s=interval))
        runs[interval] = [t.replica for t in result.times][1:]
    assert runs[0.5] == [1] * 6
    assert 0 in runs[0.0] and 1 in runs[0.0]


# --------------------------------------------------------------------------- quiet runs
@st.composite
def workloads(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 40))
    t = 0.0
    requests = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.2]))
        requests.append(Request(i, t, draw(st.integers(1, 60)), draw(st.integers(1, 80)),
                                prefix_ids=(draw(st.integers(0, 2)),), prefix_block_tokens=8))
    return requests


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads(), replicas=st.integers(2, 3), interval=st.sampled_from([0.0, 0.037]))
@pytest.mark.parametrize("policy", QUIET_POLICIES)
def test_counter_policies_keep_quiet_runs_exact(policy, requests, replicas, interval):
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=160, block_size=4)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(40, 4)
        return Scheduler(alloc, cfg), alloc

    latency = ConstantLatency(0.0041, prefill_token_s=1.3e-4, decode_seq_s=2.1e-4)
    router = RouterConfig(policy, refresh_interval_s=interval, block_tokens=8,
                          balance_abs_threshold=2, balance_rel_threshold=1.2)
    _assert_same_run(requests, make, latency, num_replicas=replicas, router=router)


def test_kv_reading_policies_run_step_by_step(monkeypatch):
    runs: list[int] = []
    advance = Scheduler.advance_quiet

    def counted(self, plan, k, record=None):  # type: ignore[no-untyped-def]
        runs.append(k)
        return advance(self, plan, k, record)

    monkeypatch.setattr(Scheduler, "advance_quiet", counted)
    requests = spread_requests()
    for policy in ("least-kv", "precise-prefix", "weighted"):
        simulate(requests, factory(), ConstantLatency(0.004), num_replicas=2, router=RouterConfig(policy))
    assert runs == []
    simulate(requests, factory(), ConstantLatency(0.004), num_replicas=2, router=RouterConfig("vllm-dp"))
    assert runs


# --------------------------------------------------------------------------- scenario errors
SCENARIO = """\
model: llama-3.1-8b
gpu: h100
num_replicas: 2
latency: {model: constant, step_s: 0.01}
router: ROUTER
workload:
  rate: inf
  num_requests: 4
  prompt_tokens: {dist: fixed, value: 32}
  output_tokens: {dist: fixed, value: 4}
"""


@pytest.mark.parametrize(("router", "says"), [
    ("{policy: round-robbin}", "did you mean 'round-robin'"),
    ("{policy: vllm-dp, refresh_interval_s: -1}", "refresh_interval_s"),
    ("{policy: weighted, scorers: {queue: 1, kv-utilisation: 1}}", "did you mean 'kv-utilization'"),
    ("{policy: vllm-dp, refersh_interval_s: 1}", "did you mean 'refresh_interval_s'"),
])
def test_bad_router_keys_are_one_line_errors(tmp_path: Path, capsys, router, says):  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("ROUTER", router), encoding="utf-8")
    assert main(["simulate", str(path), "--quiet", "--no-plots", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_a_router_scenario_writes_the_replica_plot(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("ROUTER", "{policy: round-robin}"), encoding="utf-8")
    assert main(["simulate", str(path), "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "replicas.png").exists()
