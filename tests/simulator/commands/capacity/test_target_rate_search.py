"""The replica search of ``kvplan capacity --target-rate``: the smallest count, probe by probe.

The analytic case: the constant latency model (every step STEP_S), one sequence per replica
(``max_num_seqs: 1``), prompts of 16 tokens and OUTPUT_TOKENS output tokens, so a request takes
OUTPUT_TOKENS steps: one replica serves one request per S = OUTPUT_TOKENS × STEP_S seconds, a
capacity of exactly 1 / S req/s. Requests arrive at constant intervals 1 / R. With n replicas
under least-outstanding routing, request i goes to a replica idle since request i − n finished
at (i − n) / R + S, which is before i / R exactly when n ≥ R × S: then no request waits and
every TTFT is one step; below it the backlog grows by R − n / S requests per second and the
TTFT with it. So the fewest replicas that hold R is ⌈R × S⌉.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from simulator.commands.capacity import replicas
from simulator.commands.capacity.replicas import ReplicaTask, run_replica_search, smallest_holding, start_count
from simulator.commands.capacity.bound import RateBound

STEP_S = 0.1
OUTPUT_TOKENS = 4
SERVICE_S = OUTPUT_TOKENS * STEP_S  # 0.4 s per request per replica: 2.5 req/s each


def scenario(num_requests: int = 300, **change: Any) -> dict[str, Any]:
    return {
        "name": "analytic", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 1,
        "latency": {"model": "constant", "step_s": STEP_S},
        "workload": {"arrival": {"process": "constant", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": OUTPUT_TOKENS},
                     "num_requests": num_requests},
        # a request that waits at all misses it (TTFT is one step, 0.1 s, when none waits)
        "slo": {"ttft_p99_s": 0.15},
        **change,
    }


def task(rate: float, *, max_replicas: int = 64, cache_dir: str | None = None, **change: Any) -> ReplicaTask:
    return ReplicaTask(0, scenario(**change), "analytic.yaml", str(Path(".").resolve()), "paged", 0, rate,
                       max_replicas, False, cache_dir)


# --- the integer search ------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [1, 2, 3, 7, 8, 9, 31, 64])
@pytest.mark.parametrize("start", [1, 2, 5, 8, 40, 64])
def test_smallest_holding_finds_the_threshold(answer: int, start: int) -> None:
    calls: list[int] = []

    def holds(n: int) -> bool:
        calls.append(n)
        return n >= answer

    found = smallest_holding(holds, start, 64)
    assert found.smallest == answer
    assert list(found.counts) == calls and len(set(calls)) == len(calls)  # each count probed once
    if start <= answer:
        # the start (or its confirmation below), doublings to pass the answer, then a bisection
        # of the last doubling's bracket, narrower than the answer
        doublings = math.ceil(math.log2(answer / start))
        assert len(calls) <= 2 + doublings + math.ceil(math.log2(answer))
    if start == answer and answer > 1:
        assert calls == [answer, answer - 1]  # an exact bound is confirmed by one probe below it


def test_smallest_holding_when_the_most_fails() -> None:
    assert smallest_holding(lambda n: False, 5, 64).counts == (5, 10, 20, 40, 64)
    assert smallest_holding(lambda n: False, 5, 64).smallest is None
    assert smallest_holding(lambda n: False, 64, 64).counts == (64,)
    # rejections that fail everywhere end the search at the first failure
    ended = smallest_holding(lambda n: False, 5, 64, fails_everywhere=lambda n: True)
    assert ended.smallest is None and ended.counts == (5,)


def test_smallest_holding_rejects_a_start_outside_the_range() -> None:
    with pytest.raises(ValueError):
        smallest_holding(lambda n: True, 0, 4)
    with pytest.raises(ValueError):
        smallest_holding(lambda n: True, 5, 4)


def test_start_count_is_the_ceiling_of_rate_over_one_replicas_bound() -> None:
    bound = RateBound(rate_req_s=2.5, batch=1, step_s=STEP_S, kv_requests=100.0, limit="max_num_seqs")
    assert start_count(23.5, bound, 64) == 10  # 9.4 -> 10
    assert start_count(25.0, bound, 64) == 10  # exactly 10 × the bound: 10, not 11
    assert start_count(1000.0, bound, 64) == 64  # within --max-replicas
    assert start_count(0.1, bound, 64) == 1
    assert start_count(3.0, None, 64) == 1


# --- the analytic case -----------------------------------------------------------------------------


@pytest.mark.parametrize(("rate", "expected"), [(23.5, 10), (6.0, 3), (2.4, 1)])
def test_fewest_replicas_is_the_ceiling_of_rate_times_service_time(rate: float, expected: int) -> None:
    assert expected == math.ceil(rate * SERVICE_S)  # the module docstring's answer
    result = run_replica_search(task(rate))
    assert result.num_replicas == expected
    # The analytic ceiling of one replica is exactly 1 / S here (batch 1, constant steps), so the
    # search starts at the answer and one probe below confirms it.
    assert result.bound is not None and result.bound.rate_req_s == pytest.approx(1 / SERVICE_S)
    assert result.start == expected
    assert result.counts == ((expected, expected - 1) if expected > 1 else (expected,))
    ok = dict(zip(result.counts, (p.ok for p in result.probes)))
    assert ok[expected] and (expected == 1 or not ok[expected - 1])
    at = result.at_answer
    assert at is not None and at.ok and at.ttft_p99_s == pytest.approx(STEP_S)  # nobody waited
    assert at.max_batch_size == 1 and at.kv_used_peak is not None  # KV recorded at the answer


@pytest.mark.parametrize(("ceiling_req_s", "counts"), [
    # 10 × too high: starts at ⌈23.5 / 25⌉ = 1, doubles to 16 (the first to hold), bisects
    (25.0, (1, 2, 4, 8, 16, 12, 10, 9)),
    # too low: starts at ⌈23.5 / 1⌉ = 24, which holds, and so does 23: halves to the first
    # failure (5), then bisects [5, 11]
    (1.0, (24, 23, 11, 5, 8, 9, 10)),
])
def test_a_wrong_bound_still_finds_the_smallest_count(monkeypatch: pytest.MonkeyPatch, ceiling_req_s: float,
                                                       counts: tuple[int, ...]) -> None:
    """The bound rests on mean lengths and may be wrong either way: the answer does not depend
    on it, only the probes do."""
    wrong = RateBound(rate_req_s=ceiling_req_s, batch=1, step_s=STEP_S, kv_requests=1.0, limit="kv")
    monkeypatch.setattr(replicas, "rate_bound", lambda *args: wrong)
    result = run_replica_search(task(23.5))
    assert result.num_replicas == 10 and result.counts == counts


def test_a_target_beyond_max_replicas_is_an_answer_not_an_error() -> None:
    result = run_replica_search(task(23.5, max_replicas=4))  # needs 10
    assert result.num_replicas is None and result.at_answer is None and not result.everywhere
    assert result.counts == (4,)  # the bound starts at the most allowed: one probe says it fails
    assert not result.probes[0].ok and "TTFT" in result.probes[0].failures[0]


def test_rejections_fail_every_count_in_one_probe() -> None:
    # a prompt longer than max_model_len is rejected on arrival however many replicas there are
    result = run_replica_search(task(6.0, max_model_len=16))
    assert result.num_replicas is None and result.everywhere and len(result.counts) == 1


def test_probes_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    real = replicas.simulate_probe

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(replicas, "simulate_probe", counted)
    first = run_replica_search(task(6.0, cache_dir=str(tmp_path)))
    assert calls[0] == len(first.counts) + 1  # the probes, and the answer again with KV data
    again = run_replica_search(task(6.0, cache_dir=str(tmp_path)))
    assert calls[0] == len(first.counts) + 1 and again == first
