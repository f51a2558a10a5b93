"""The serving front end's per-request delay: in the TTFT and E2E a client sees, in no step."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.config.deployment import build_deployment
from simulator.engine.runs import client_policy, load_workload, run_allocator
from simulator.config.scenario import parse_scenario

SCENARIO = {
    "model": "llama-3.1-8b", "gpu": "h100", "allocators": ["paged"],
    "workload": {"prompt_tokens": {"dist": "fixed", "value": 500},
                 "output_tokens": {"dist": "fixed", "value": 20}, "num_requests": 12,
                 "concurrency": 4},
}


def run(overhead: float):  # type: ignore[no-untyped-def]
    scenario = parse_scenario({**SCENARIO, "latency": {"request_overhead_s": overhead}}, "test")
    dep = build_deployment(scenario, Path("."))
    fit = load_workload(scenario, Path("."), dep.scheduler_config.max_model_len)
    return run_allocator(dep, "paged", fit.requests, clients=client_policy(scenario, len(fit.requests)))


def test_it_adds_to_ttft_and_e2e_only() -> None:
    none, some = run(0.0), run(0.05)
    assert (some.requests.ttft_s - none.requests.ttft_s).tolist() == pytest.approx([0.05] * 12)
    assert (some.requests.e2e_s - none.requests.e2e_s).tolist() == pytest.approx([0.05] * 12)
    assert some.requests.tpot_s.tolist() == pytest.approx(none.requests.tpot_s.tolist())
    assert some.steps.duration_s.tolist() == none.steps.duration_s.tolist()  # no GPU time
    assert some.summary["throughput_tok_s"] == none.summary["throughput_tok_s"]
