"""Stopping a probe early: the p99 exceedance count against numpy, the rule on synthetic events,
and a probe stopped by the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.commands.capacity.search import simulate_probe
from simulator.commands.capacity.stop import SloStopRule, exceedances_to_break
from simulator.config.deployment import build_deployment
from simulator.config.scenario import SLOSpec, parse_scenario
from workloads.clients import Clients
from workloads.request import Request
from workloads.spec import build_requests

# Values on a grid of 1/64 s: the rule's argument is exact in real arithmetic, and numpy's
# interpolation rounds by less than an ulp, far below the grid (times are never that adversarial).
GRID = st.integers(min_value=0, max_value=64 * 20).map(lambda k: k / 64)


@settings(max_examples=400, deadline=None)
@given(values=st.lists(GRID, min_size=1, max_size=400), bound=GRID)
def test_enough_exceedances_put_the_p99_above_the_bound(values: list[float], bound: float) -> None:
    over = sum(v > bound for v in values)
    if over >= exceedances_to_break(len(values)):
        assert np.percentile(values, 99) > bound


@given(n=st.integers(min_value=1, max_value=100_000))
def test_exceedances_needed_never_decrease_with_more_values(n: int) -> None:
    """What makes counting against the most values there can be safe (stop.py's docstring)."""
    assert exceedances_to_break(n) <= exceedances_to_break(n + 1) <= exceedances_to_break(n) + 1


def test_exceedances_to_break_known_values() -> None:
    # h = 0.99 (N − 1): N = 1 -> the only value; N = 101 -> h = 99 (its float product is 99.0)
    assert exceedances_to_break(1) == 1
    assert exceedances_to_break(100) == 100 - 98
    assert exceedances_to_break(101) == 101 - 99
    assert exceedances_to_break(2000) == 21
    values = [0.0] * (101 - 2) + [1.0, 1.0]  # exactly 2 of 101 over 0.5: p99 = v[99] = 1.0
    assert np.percentile(values, 99) > 0.5
    values = [0.0] * (101 - 1) + [1.0]  # one fewer: p99 = v[99] = 0.0
    assert np.percentile(values, 99) <= 0.5
    with pytest.raises(ValueError):
        exceedances_to_break(0)


def requests(n: int, *, gap_s: float = 1.0, output_tokens: int = 10) -> list[Request]:
    return [Request(i, i * gap_s, 100, output_tokens) for i in range(n)]


def test_ttft_stops_once_the_p99_is_certainly_above_the_bound() -> None:
    reqs = requests(200)  # 200 measured: 3 exceedances break a p99 (200 − ⌊199 × 0.99⌋)
    rule = SloStopRule(SLOSpec(ttft_p99_s=1.0), reqs, warmup_requests=0, request_overhead_s=0.0)
    assert rule.active
    assert rule(0.5, [0], [], reqs) is None  # TTFT 0.5 s
    assert rule(3.0, [1], [], reqs) is None  # 2.0 s: one over
    assert rule(4.0, [2], [], reqs) is None  # 2.0 s: two over
    reason = rule(10.0, [3, 4], [], reqs)  # 7.0 and 6.0 s: four over, one step
    assert reason is not None and reason.startswith("TTFT p99 > 1 s: 4 of 200 measured")
    assert "stopped at 10 s" in reason


def test_first_token_events_count_once_each() -> None:
    reqs = requests(200)
    rule = SloStopRule(SLOSpec(ttft_p99_s=1.0), reqs, warmup_requests=0, request_overhead_s=0.0)
    assert rule(2.5, [0], [], reqs) is None
    assert rule(2.5, [], [0], reqs) is None  # its finish counts nothing towards TTFT
    assert rule(3.5, [1], [1], reqs) is None
    assert rule(4.5, [2], [], reqs) is not None  # the third TTFT over 1 s


def test_warmup_requests_are_not_measured() -> None:
    reqs = requests(103)
    rule = SloStopRule(SLOSpec(ttft_p99_s=1.0), reqs, warmup_requests=3, request_overhead_s=0.0)
    assert rule.num_measured == 100 and rule.ttft_needed == 2
    assert rule(50.0, [0, 1, 2], [], reqs) is None  # warm-up: far over, never counted
    assert rule(50.0, [3], [], reqs) is None
    assert rule(50.0, [4], [], reqs) is not None


def test_the_front_end_overhead_counts_in_ttft_and_e2e() -> None:
    reqs = requests(100)  # 2 exceedances of 100 break a p99
    for slo in (SLOSpec(ttft_p99_s=1.0), SLOSpec(e2e_p99_s=1.0)):
        plain = SloStopRule(slo, reqs, warmup_requests=0, request_overhead_s=0.0)
        front = SloStopRule(slo, reqs, warmup_requests=0, request_overhead_s=0.2)
        for rule in (plain, front):
            rule(0.9, [0], [0], reqs)
        assert plain(1.9, [1], [1], reqs) is None  # 0.9 s each: within
        assert front(1.9, [1], [1], reqs) is not None  # 1.1 s each with the overhead


def test_tpot_counts_at_the_finish_over_requests_with_more_than_one_token() -> None:
    one = [Request(i, float(i), 100, 1) for i in range(50)]
    many = [Request(50 + i, 50.0 + i, 100, 11) for i in range(100)]
    reqs = one + many
    rule = SloStopRule(SLOSpec(tpot_p99_s=0.1), reqs, warmup_requests=0, request_overhead_s=0.0)
    assert rule.num_with_tpot == 100 and rule.tpot_needed == 2
    assert rule(100.0, [0, 1], [0, 1], reqs) is None  # one-token outputs have no TPOT
    assert rule(51.0, [50, 51], [], reqs) is None
    assert rule(52.0, [], [50], reqs) is None  # (52 − 51) / 10 = 0.1 s: not over
    assert rule(53.1, [], [51], reqs) is None  # 0.21 s: one over
    assert rule(60.0, [52], [], reqs) is None
    assert rule(62.0, [], [52], reqs) is not None  # 0.2 s: two over


def test_a_rule_without_latency_bounds_is_inactive() -> None:
    reqs = requests(10)
    rule = SloStopRule(SLOSpec(max_rejected_fraction=0.1), reqs, warmup_requests=0, request_overhead_s=0.0)
    assert not rule.active and rule(100.0, list(range(10)), list(range(10)), reqs) is None


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(min_value=1, max_value=300), bound=GRID.filter(lambda b: b > 0))
def test_a_stop_is_never_wrong(data: Any, n: int, bound: float) -> None:
    """Whatever the order in which requests get their first token, if the rule stops, the p99
    TTFT over every request at the end of the run is above the bound."""
    reqs = requests(n, gap_s=0.0)  # all sent at 0: TTFT = the first token's time
    ttfts = data.draw(st.lists(GRID, min_size=n, max_size=n))
    order = data.draw(st.permutations(range(n)))
    rule = SloStopRule(SLOSpec(ttft_p99_s=bound), reqs, warmup_requests=0, request_overhead_s=0.0)
    stopped = any(rule(ttfts[i], [i], [], reqs) is not None for i in order)
    if stopped:
        assert np.percentile(ttfts, 99) > bound


# --- with the engine -------------------------------------------------------------------------------


def overloaded(rate: float) -> tuple[Any, list[Request], SLOSpec]:
    """One-step requests, one at a time (service 0.1 s: capacity 10 req/s), at ``rate``."""
    data = {"name": "stop", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 1,
            "latency": {"model": "constant", "step_s": 0.1},
            "workload": {"arrival": {"process": "constant", "rate": rate},
                         "prompt_tokens": {"dist": "fixed", "value": 16},
                         "output_tokens": {"dist": "fixed", "value": 1}, "num_requests": 400},
            "slo": {"ttft_p99_s": 0.5}}
    sc = parse_scenario(data, "stop.yaml")
    assert sc.slo is not None
    return build_deployment(sc, Path(".")), build_requests(sc.workload, seed=0, base_dir=Path(".")), sc.slo


def test_an_overloaded_probe_stops_early_and_fails() -> None:
    dep, reqs, slo = overloaded(20.0)
    full = simulate_probe(dep, "paged", 20.0, 0, slo, reqs, record_steps=False, clients=Clients())
    early = simulate_probe(dep, "paged", 20.0, 0, slo, reqs, record_steps=False, clients=Clients(),
                           stop_early=True)
    assert not full.ok and full.stopped_at_s is None and full.failures[0].startswith("TTFT p99")
    assert not early.ok and early.stopped_at_s is not None
    assert early.failures[0].startswith("TTFT p99 > 0.5 s: 5 of 400 measured")
    # the queue grows by 0.05 s per request: the 5th over 0.5 s is about the 15th; the full run
    # serves all 400 (40 s of steps)
    assert early.completed < 20 and early.stopped_at_s < 2.0 < full.e2e_p99_s  # type: ignore[operator]
    assert early.ttft_p99_s is None and early.throughput_req_s == 0.0


def test_a_probe_that_holds_is_the_same_with_or_without_the_rule() -> None:
    dep, reqs, slo = overloaded(5.0)
    full = simulate_probe(dep, "paged", 5.0, 0, slo, reqs, record_steps=False, clients=Clients())
    early = simulate_probe(dep, "paged", 5.0, 0, slo, reqs, record_steps=False, clients=Clients(),
                           stop_early=True)
    assert full.ok and early == full
