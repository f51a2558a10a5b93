"""The analytic ceiling a rate search starts from: its formula on hand-checkable deployments, and
the search it starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from simulator.commands.capacity.bound import START_FRACTION, RateBound, decode_step_s, rate_bound
from simulator.commands.capacity.search import run_search
from simulator.config.deployment import Deployment, build_deployment
from simulator.config.scenario import SLOSpec, parse_scenario
from workloads.spec import build_requests
from tests.simulator.commands.capacity.test_search import STEP_S, analytic_scenario, task


def bound_of(data: dict[str, Any], allocator: str = "paged",
             slo: SLOSpec | None = None) -> tuple[Deployment, RateBound]:
    sc = parse_scenario(data, "bound.yaml")
    dep = build_deployment(sc, Path("."))
    requests = build_requests(sc.workload, seed=0, base_dir=Path("."))
    assert sc.slo is not None
    return dep, rate_bound(dep, allocator, requests, slo or sc.slo)


def test_one_sequence_at_a_time_serves_one_over_the_service_time() -> None:
    """max_num_seqs 1, O tokens of S seconds each: U = 1 / (O · S)."""
    for output_tokens in (1, 4):
        _, bound = bound_of(analytic_scenario(output_tokens, {"ttft_p99_s": 1.0}))
        assert bound.rate_req_s == pytest.approx(1 / (output_tokens * STEP_S))
        assert (bound.batch, bound.limit) == (1, "max_num_seqs")
        assert bound.start_req_s == START_FRACTION * bound.rate_req_s


def test_a_small_pool_bounds_the_batch_by_the_mean_request() -> None:
    """64 slots; paged requests of 16 + 8 tokens hold 16 + 8/2 = 20 on average: 3.2 fit, so 3
    sequences decode at once, each 8 steps of S: U = 3 / (8 S). The override is 4 + 1 blocks:
    vLLM V1 keeps one as its null block."""
    data = analytic_scenario(8, {"ttft_p99_s": 1.0})
    data.update(max_num_seqs=256, num_gpu_blocks_override=4 + 1)
    dep, bound = bound_of(data)
    assert dep.capacity_tokens == 64
    assert bound.kv_requests == pytest.approx(64 / 20) and bound.limit == "kv" and bound.batch == 3
    assert bound.rate_req_s == pytest.approx(3 / (8 * STEP_S))


def test_contiguous_reservations_hold_their_whole_region() -> None:
    """contiguous-max reserves max_model_len for every request, oracle the final length: a pool
    of 64 usable blocks (1,024 slots; the override is one more, vLLM V1's null block)."""
    data = analytic_scenario(8, {"ttft_p99_s": 1.0})
    data.update(max_num_seqs=256, num_gpu_blocks_override=64 + 1, max_model_len=512)
    _, most = bound_of({**data, "allocators": ["contiguous-max"]}, "contiguous-max")
    _, exact = bound_of({**data, "allocators": ["contiguous-oracle"]}, "contiguous-oracle")
    assert most.kv_requests == pytest.approx(1024 / 512) and most.batch == 2
    assert exact.kv_requests == pytest.approx(1024 / 24) and exact.batch == 42


def test_a_tpot_bound_caps_the_batch_at_the_step_time_it_allows() -> None:
    data = {"name": "b", "model": "llama-3.1-8b", "gpu": "h100", "latency": {"model": "roofline"},
            "workload": {"arrival": {"process": "poisson", "rate": 1.0},
                         "prompt_tokens": {"dist": "fixed", "value": 1000},
                         "output_tokens": {"dist": "fixed", "value": 200}, "num_requests": 50},
            "slo": {"tpot_p99_s": 1.0}}
    dep, loose = bound_of(data)
    context = 1000 + 200 / 2
    tpot = decode_step_s(dep, loose.batch // 2, context)  # a bound that only half the batch meets
    _, tight = bound_of(data, slo=SLOSpec(tpot_p99_s=tpot))
    assert loose.limit != "tpot" and tight.limit == "tpot"
    assert decode_step_s(dep, tight.batch, context) <= tpot < decode_step_s(dep, tight.batch + 1, context)
    assert tight.rate_req_s < loose.rate_req_s


def test_a_search_without_a_start_begins_at_half_the_ceiling() -> None:
    """The threshold of test_search's one-step case (just above 10 req/s, the ceiling): the
    first probe is at U/2, the second at U, and the answer is the one a given start finds."""
    n, bound = 100, 0.15
    r_star = 1 / (STEP_S - (bound - STEP_S) / (0.99 * (n - 1)))
    data = analytic_scenario(1, {"ttft_p99_s": bound}, n)
    result = run_search(dataclasses.replace(task(data, tolerance=0.005), start_rate_req_s=None))
    assert result.bound is not None and result.bound.rate_req_s == pytest.approx(10.0)
    first, second = (p.rate_req_s for p in result.probes[:2])
    assert first == pytest.approx(5.0) and second == pytest.approx(10.0)
    assert result.hi_rate_req_s is not None
    assert result.lo_rate_req_s <= r_star <= result.hi_rate_req_s
    assert result.hi_rate_req_s - result.lo_rate_req_s <= 0.005 * result.lo_rate_req_s
    given = run_search(task(data, tolerance=0.005))
    assert given.bound is None
    assert given.lo_rate_req_s <= r_star <= given.hi_rate_req_s  # type: ignore[operator]
