"""Quiet runs change nothing but the speed with SGLang's scheduler, too.

``simulate(..., macro_steps=True)`` runs each stretch of identical decode steps as one
(SGLangScheduler.quiet_run / advance_quiet: evictions and page allocations at their steps, the
ratio's decay in closed form); ``macro_steps=False`` runs every step. Both must give the same
per-request times, step rows, statuses, retractions and prefix hits: on random workloads with
shared prefixes, parallel samples and pools small enough to retract, at page sizes 1, 4 and 16.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine.core import simulate
from simulator.kv.radix import RadixTokenPool
from simulator.latency.constant import ConstantLatency
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.sglang import SGLangScheduler
from workloads.clients import Clients
from workloads.request import Request

PREFIXES = [(), (1, 2, 3), (1, 2, 9), (4, 4)]


def replicas(num_pages: int, page_size: int, **knobs):  # type: ignore[no-untyped-def]
    cfg = SchedulerConfig(**{"engine": "sglang", "block_size": page_size, "max_num_seqs": 8,
                             "max_num_batched_tokens": 64, "max_model_len": 200,
                             "enable_prefix_caching": True, **knobs})

    def make(_: int):  # type: ignore[no-untyped-def]
        pool = RadixTokenPool(num_pages, page_size, enable_prefix_caching=cfg.enable_prefix_caching,
                              eviction_policy=cfg.radix_eviction_policy)
        return SGLangScheduler(pool, cfg), pool

    return make


def same_run(requests, make, latency, **kwargs):  # type: ignore[no-untyped-def]
    fast = simulate(requests, make, latency, macro_steps=True, **kwargs)
    slow = simulate(requests, make, latency, macro_steps=False, **kwargs)
    times = [[(t.admitted_s, t.first_token_s, t.finished_s, t.replica) for t in r.times]
             for r in (fast, slow)]
    assert times[0] == times[1]
    assert [r.arrival_s for r in fast.requests] == [r.arrival_s for r in slow.requests]
    assert sorted(fast.steps) == sorted(slow.steps)
    facts = [[(g.status, g.reject_reason, g.num_preemptions, g.prefix_hit_tokens, g.readmission_hit_tokens)
              for g in r.groups] for r in (fast, slow)]
    assert facts[0] == facts[1]
    return fast


@st.composite
def workloads(draw, max_requests: int = 30):  # type: ignore[no-untyped-def]
    t = 0.0
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.2]))
        ids = PREFIXES[draw(st.integers(0, 3))]
        requests.append(Request(i, t, draw(st.integers(1, 60)), draw(st.integers(1, 80)),
                                n=draw(st.sampled_from([1, 1, 1, 2])), prefix_ids=ids,
                                prefix_block_tokens=8 if ids else 0))
    return requests


LATENCY = ConstantLatency(0.004, prefill_token_s=1e-4, decode_seq_s=2e-4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads(), page_size=st.sampled_from([1, 1, 4, 16]), tokens=st.integers(150, 600),
       policy=st.sampled_from(["fcfs", "lpm"]), evict=st.sampled_from(["lru", "lfu"]),
       chunked=st.booleans(), caching=st.booleans(), num_replicas=st.integers(1, 2))
def test_random_runs_are_the_same_with_and_without_quiet_runs(requests, page_size, tokens, policy,
                                                              evict, chunked, caching, num_replicas):
    make = replicas(tokens // page_size, page_size, schedule_policy=policy, radix_eviction_policy=evict,
                    enable_chunked_prefill=chunked, max_num_batched_tokens=64 if chunked else 200,
                    enable_prefix_caching=caching, new_token_ratio_decay_steps=40)
    same_run(requests, make, LATENCY, num_replicas=num_replicas)


STEP_S = 1 / 256  # binary fractions: sums of step times land exactly on arrival times (ties)


@st.composite
def tied_workloads(draw):  # type: ignore[no-untyped-def]
    t = 0.0
    requests = []
    for i in range(draw(st.integers(1, 25))):
        t += draw(st.integers(0, 12)) * STEP_S
        ids = PREFIXES[draw(st.integers(0, 3))]
        requests.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 60)),
                                prefix_ids=ids, prefix_block_tokens=8 if ids else 0))
    return requests


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=tied_workloads(), page_size=st.sampled_from([1, 4]))
def test_sends_at_step_boundaries_are_seen_by_the_same_step(requests, page_size):
    same_run(requests, replicas(240 // page_size, page_size), ConstantLatency(STEP_S))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=workloads(20), clients=st.sampled_from([(2, 0.0), (3, 0.0131), (5, 0.0)]))
def test_clients_give_the_same_run(requests, clients):
    policy = Clients(max_in_flight=clients[0], think_time_s=clients[1])
    same_run(requests, replicas(300, 1), LATENCY, clients=policy)


def test_an_overloaded_pool_retracts_the_same_way_in_quiet_runs(monkeypatch):
    """A burst on a small pool: requests retract, evictions happen inside quiet runs, and most
    decode steps run inside quiet runs."""
    runs: list[int] = []
    advance = SGLangScheduler.advance_quiet

    def counted(self, plan, k, record=None):  # type: ignore[no-untyped-def]
        runs.append(k)
        return advance(self, plan, k, record)

    monkeypatch.setattr(SGLangScheduler, "advance_quiet", counted)
    requests = [Request(i, 0.002 * i, 20 + 7 * (i % 5), 60 + 13 * (i % 7),
                        prefix_ids=PREFIXES[i % 4], prefix_block_tokens=8 if i % 4 else 0)
                for i in range(40)]
    result = same_run(requests, replicas(400, 1, init_new_token_ratio=0.2), LATENCY)
    assert sum(g.num_preemptions for g in result.groups) > 0
    assert sum(g.prefix_hit_tokens for g in result.groups) > 0
    assert sum(runs) > result.totals().num_steps / 2 and min(runs) >= 5
