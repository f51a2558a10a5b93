"""Capacity search: bracketing + bisection, the SLO check, and analytic thresholds.

The analytic cases use the constant latency model, one sequence at a time (``max_num_seqs: 1``)
and constant arrivals, so the queue is deterministic: request i of N (rate r, service time S per
request) is admitted at max(i/r, i·S), and p99 statistics follow in closed form.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity import search
from simulator.commands.capacity.search import (
    MAX_QUEUE_GROWTH,
    Probe,
    RateWorkload,
    SearchTask,
    bracket_and_bisect,
    cache_key,
    check_slo,
    limited_by,
    run_search,
)
from simulator.config.scenario import SLOSpec, parse_scenario
from workloads.spec import WorkloadSpec, build_requests
from workloads.synthetic import mean_rate_per_s, rescale_to_rate

STEP_S = 0.1


def analytic_scenario(output_tokens: int, slo: dict[str, float], num_requests: int = 100) -> dict[str, Any]:
    """Prompts of 16 tokens, ``output_tokens`` each, one at a time, every step STEP_S seconds."""
    return {
        "name": "analytic", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 1,
        "latency": {"model": "constant", "step_s": STEP_S},
        "workload": {"arrival": {"process": "constant", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": output_tokens},
                     "num_requests": num_requests},
        "slo": slo,
    }


def task(data: dict[str, Any], *, start: float = 1.0, tolerance: float = 0.01, record_steps: bool = False,
         cache_dir: str | None = None, base_dir: Path = Path(".")) -> SearchTask:
    return SearchTask(0, data, "analytic.yaml", str(base_dir), "paged", 0, start, tolerance, record_steps,
                      cache_dir)


# --- bracketing and bisection ----------------------------------------------------------------


@pytest.mark.parametrize("threshold", [0.003, 0.7, 7.3, 1000.0])
@pytest.mark.parametrize("start", [0.05, 1.0, 7.3, 64.0])
@pytest.mark.parametrize("tolerance", [0.2, 0.05, 0.001])
def test_bracket_contains_threshold_within_tolerance(threshold: float, start: float,
                                                     tolerance: float) -> None:
    calls: list[float] = []

    def holds(rate: float) -> bool:
        calls.append(rate)
        return rate <= threshold

    b = bracket_and_bisect(holds, start, tolerance)
    assert b.hi_rate is not None
    assert b.lo_rate <= threshold < b.hi_rate
    assert b.hi_rate - b.lo_rate <= tolerance * b.lo_rate
    assert list(b.rates) == calls and len(set(calls)) == len(calls)  # each rate probed once
    # doublings/halvings to reach the threshold, one more to cross it, then log2(1/tol) bisections
    ratio = abs(math.log2(threshold / start))
    assert len(calls) <= ratio + 2 + math.ceil(math.log2(1 / tolerance)) + 1


def test_bracket_when_nothing_passes_or_everything_does() -> None:
    never = bracket_and_bisect(lambda r: False, 1.0, 0.05, max_halvings=5)
    assert never.lo_rate == 0.0 and never.hi_rate == 1.0 / 32 and len(never.rates) == 6
    always = bracket_and_bisect(lambda r: True, 1.0, 0.05, max_doublings=5)
    assert always.lo_rate == 32.0 and always.hi_rate is None and len(always.rates) == 6


def test_a_failure_that_holds_at_every_load_ends_the_search() -> None:
    ended = bracket_and_bisect(lambda r: False, 8.0, 0.05, fails_everywhere=lambda r: True)
    assert (ended.lo_rate, ended.hi_rate, ended.rates) == (0.0, 8.0, (8.0,))
    # asked only while nothing has passed: a pass, then failures, bisect as usual
    found = bracket_and_bisect(lambda r: r <= 3.0, 1.0, 0.05, fails_everywhere=lambda r: True)
    assert found.lo_rate <= 3.0 < found.hi_rate  # type: ignore[operator]


def test_requests_rejected_at_any_rate_take_one_probe(tmp_path: Path) -> None:
    """One request of 100 is longer than max_model_len: the scheduler rejects it at every rate,
    so the first probe to run to the end says the SLO fails everywhere."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{i},{100 if i == 50 else 16},1\n" for i in range(100)))
    data = {**analytic_scenario(1, {"ttft_p99_s": 0.15}), "max_model_len": 64,
            "workload": {"trace": str(trace)}}
    result = run_search(dataclasses.replace(task(data, base_dir=tmp_path), start_rate_req_s=None))
    assert len(result.probes) == 1 and result.lo_rate_req_s == 0.0 and result.at_max is None
    assert result.probes[0].failures == ("rejected 1 of 100 requests (1.00%) > 0.00%, whatever the rate",)


def test_bracket_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        bracket_and_bisect(lambda r: True, 0.0, 0.05)
    with pytest.raises(ValueError):
        bracket_and_bisect(lambda r: True, 1.0, 0.0)


# --- the SLO check -----------------------------------------------------------------------------


def test_check_slo_names_every_broken_bound() -> None:
    slo = SLOSpec(ttft_p99_s=1.0, tpot_p99_s=0.1, e2e_p99_s=10.0, max_rejected_fraction=0.01)
    ok = dict(num_requests=100, completed=100, rejected=0, ttft_p99_s=0.5, tpot_p99_s=0.05,
              e2e_p99_s=5.0, queue_growth=0.0)
    assert check_slo(slo, **ok) == ()
    bad = check_slo(slo, **{**ok, "rejected": 2, "ttft_p99_s": 1.5, "tpot_p99_s": 0.2, "e2e_p99_s": 11.0,
                            "queue_growth": 0.5})
    assert bad == ("rejected 2 of 100 requests (2.00%) > 1.00%, whatever the rate", "TTFT p99 1.5 s > 1 s",
                   "TPOT p99 0.2 s > 0.1 s",
                   "E2E p99 11 s > 10 s", "unstable: queueing delay grows 0.5 s per s")
    # one-token outputs have no TPOT: that bound cannot fail
    assert check_slo(slo, **{**ok, "tpot_p99_s": None}) == ()
    assert check_slo(slo, **{**ok, "completed": 0, "ttft_p99_s": None}) == ("no request finished",)


# --- analytic thresholds -------------------------------------------------------------------------


def test_one_step_requests_capacity_is_one_over_step_time() -> None:
    """Above 1/S req/s request i waits i·(S − 1/r), so TTFT_i = S + i·(S − 1/r); numpy's p99 of N
    values increasing in i sits at i = 0.99·(N − 1). TTFT p99 ≤ B gives
    r* = 1 / (S − (B − S) / (0.99·(N − 1))), just above 1/S = 10 req/s."""
    n, bound = 100, 0.15
    r_star = 1 / (STEP_S - (bound - STEP_S) / (0.99 * (n - 1)))
    result = run_search(task(analytic_scenario(1, {"ttft_p99_s": bound}, n), tolerance=0.005))
    assert result.hi_rate_req_s is not None
    assert result.lo_rate_req_s <= r_star <= result.hi_rate_req_s
    assert result.hi_rate_req_s - result.lo_rate_req_s <= 0.005 * result.lo_rate_req_s
    assert result.lo_rate_req_s >= 1 / STEP_S  # below r* only by the tolerance
    at_max = result.at_max
    assert at_max is not None and at_max.ok and at_max.ttft_p99_s is not None
    assert at_max.ttft_p99_s == pytest.approx(STEP_S + 0.99 * (n - 1) * (STEP_S - 1 / result.lo_rate_req_s))
    assert at_max.max_batch_size == 1 and at_max.num_kv_refusals == 0
    assert limited_by(at_max, 1) == "max_num_seqs"
    # KV is sampled after each step, when a one-step request has already freed its blocks
    assert at_max.kv_used_peak == 0.0 and at_max.kv_used_mean == 0.0
    assert at_max.goodput_req_s <= at_max.throughput_req_s
    # every probe above r* failed on TTFT and every one below passed
    for p in result.probes:
        assert p.ok == (p.rate_req_s <= r_star), p
        assert p.kv_used_mean is None  # record_steps False: no KV data on the search's probes


def test_stability_bounds_capacity_when_the_slo_only_bounds_tpot() -> None:
    """Two-token requests take 2 steps, so service is 2S = 0.2 s and the queue grows above
    5 req/s at 2S·r − 1 seconds per second; the stability limit MAX_QUEUE_GROWTH puts the
    threshold at (1 + 0.05) / 0.2 = 5.25 req/s. TPOT is always S, far under its bound."""
    threshold = (1 + MAX_QUEUE_GROWTH) / (2 * STEP_S)
    result = run_search(task(analytic_scenario(2, {"tpot_p99_s": 1.0}), start=1.1))
    assert result.hi_rate_req_s is not None
    assert result.lo_rate_req_s <= threshold <= result.hi_rate_req_s
    failed = [p for p in result.probes if not p.ok]
    assert failed and all(p.failures[0].startswith("unstable: queueing delay grows") for p in failed)
    for p in result.probes:
        assert p.tpot_p99_s == pytest.approx(STEP_S)
        if p.rate_req_s > 1 / (2 * STEP_S):
            assert p.queue_growth == pytest.approx(2 * STEP_S * p.rate_req_s - 1)


def test_a_small_kv_pool_limits_concurrency() -> None:
    """A pool of 4 blocks of 16 tokens, requests of 16 + 8 tokens (2 blocks each): at most two
    run at once although max_num_seqs allows 256, and admissions are refused for lack of KV.
    The override is 4 + 1 blocks: vLLM V1 keeps one as its null block."""
    data = analytic_scenario(8, {"ttft_p99_s": 1.0}, 60)
    data.update(max_num_seqs=256, num_gpu_blocks_override=4 + 1)
    result = run_search(task(data, start=4.0, tolerance=0.1))
    at_max = result.at_max
    assert at_max is not None and at_max.max_batch_size == 2 and at_max.num_kv_refusals > 0
    assert limited_by(at_max, 256) == "kv"
    assert at_max.kv_used_peak == 1.0  # both sequences hold 2 blocks each: the pool is full


def test_record_steps_gives_kv_data_on_every_probe() -> None:
    data = analytic_scenario(1, {"ttft_p99_s": 0.15}, 20)
    result = run_search(task(data, tolerance=0.2, record_steps=True))
    # every probe that ran to the end; one stopped early has none (its run is cut short)
    assert all((p.kv_used_mean is not None and p.kv_used_peak is not None) == (p.stopped_at_s is None)
               for p in result.probes)
    assert result.at_max is not None and result.at_max.kv_used_mean is not None


# --- cache keys and records ------------------------------------------------------------------------


def test_cache_key_changes_with_every_input() -> None:
    data = analytic_scenario(1, {"ttft_p99_s": 0.15})
    base = cache_key(data, "/x", "paged", 1.0, 0, False)
    assert base == cache_key(dict(reversed(list(data.items()))), "/x", "paged", 1.0, 0, False)  # order-free
    others = {cache_key(data, "/x", "contiguous-max", 1.0, 0, False),
              cache_key(data, "/x", "paged", 1.5, 0, False),
              cache_key(data, "/x", "paged", 1.0, 1, False),
              cache_key(data, "/x", "paged", 1.0, 0, True),
              cache_key(data, "/y", "paged", 1.0, 0, False),
              cache_key({**data, "block_size": 32}, "/x", "paged", 1.0, 0, False)}
    assert base not in others and len(others) == 6


def test_probe_json_round_trip() -> None:
    probe = Probe(2.5, 3, False, ("TTFT p99 3 s > 2 s",), 10, 9, 1, 0.5, 100.0, 0.4, 3.0, None, 4.0, 1.0,
                  0.01, 7, 2, 0, 0.5, 0.9, 0.3)
    assert Probe.from_json(yaml.safe_load(yaml.safe_dump(probe.to_json()))) == probe


# --- the workload at any rate ------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [{"num_requests": 300}, {"num_requests": 50, "n": 2},
                                   {"start_s": 20.0, "duration_s": 40.0}])
def test_rate_workload_rescales_the_selected_requests(extra: dict[str, Any]) -> None:
    """The requests the scenario selects (as simulate would), at exactly the rate searched: the
    same requests at every rate, only their arrival times scaled."""
    spec = WorkloadSpec.model_validate({"trace": "bundled:azure-conv", "rate_scale": 2.0, **extra})
    workload = RateWorkload(spec, seed=0, base_dir=Path("."))
    selected = build_requests(spec, seed=0, base_dir=Path("."))
    for rate in (3.0, 17.5):
        requests = workload.at_rate(rate)
        assert mean_rate_per_s(requests) == pytest.approx(rate, rel=1e-12)
        assert requests == rescale_to_rate(selected, rate)
        assert [r.prompt_tokens for r in requests] == [r.prompt_tokens for r in selected]


def test_synthetic_workload_follows_the_seed() -> None:
    data = analytic_scenario(1, {"ttft_p99_s": 0.15})
    data["workload"]["arrival"] = {"process": "poisson", "rate": 1.0}
    spec = parse_scenario(data, "x").workload
    a = RateWorkload(spec, seed=1, base_dir=Path(".")).at_rate(4.0)
    assert a == RateWorkload(spec, seed=1, base_dir=Path(".")).at_rate(4.0)
    assert a != RateWorkload(spec, seed=2, base_dir=Path(".")).at_rate(4.0)


def test_a_trace_is_parsed_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The searches of a sweep in one worker share the parsed trace; an edited file is read again."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n1.0,20,5\n2.0,30,5\n")
    parses = [0]
    real = search.build_requests

    def counted(*args: Any, **kwargs: Any) -> Any:
        parses[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "build_requests", counted)
    spec = WorkloadSpec.model_validate({"trace": str(trace), "num_requests": 2})
    first = RateWorkload(spec, seed=0, base_dir=tmp_path).at_rate(2.0)
    again = RateWorkload(spec, seed=3, base_dir=tmp_path).at_rate(4.0)  # another search, another seed
    assert parses[0] == 1
    assert [r.prompt_tokens for r in first] == [r.prompt_tokens for r in again] == [10, 20]
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,11,5\n1.0,21,5\n2.0,31,5\n4.0,41,5\n")
    edited = RateWorkload(spec, seed=0, base_dir=tmp_path).at_rate(2.0)
    assert parses[0] == 2 and [r.prompt_tokens for r in edited] == [11, 21]
