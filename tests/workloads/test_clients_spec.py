"""The workload keys that say how requests are sent: concurrency, max_concurrency, rate: inf,
think time, warm-up — their requests, their client policy and their one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.errors import KvplanError
from workloads.clients import Clients
from workloads.spec import build_requests, parse_workload

FIXED = {"prompt_tokens": {"dist": "fixed", "value": 1000},
         "output_tokens": {"dist": "fixed", "value": 1000}}
LOGNORMAL = {"prompt_tokens": {"dist": "lognormal", "mean": 200, "p99": 2000},
             "output_tokens": {"dist": "uniform", "low": 10, "high": 300}}


def build(data: dict[str, Any], seed: int = 0):
    spec = parse_workload(data, "s.yaml")
    return spec, build_requests(spec, seed=seed, base_dir=Path("."))


def test_closed_loop_synthetic_is_untimed_with_the_open_loops_lengths() -> None:
    spec, closed = build({**LOGNORMAL, "num_requests": 50, "concurrency": 8, "think_time_s": 0.5,
                          "warmup_requests": 8})
    assert spec.client_policy(len(closed)) == Clients(8, 0.5, 8)
    assert spec.closed_loop and spec.untimed and not spec.burst
    assert [r.request_id for r in closed] == list(range(50))
    assert {r.arrival_s for r in closed} == {0.0}
    _, open_loop = build({**LOGNORMAL, "num_requests": 50, "arrival": {"process": "poisson", "rate": 3}})
    # lengths come from their own seed streams: the same draws as the open loop's
    assert [(r.prompt_tokens, r.output_tokens) for r in closed] == [
        (r.prompt_tokens, r.output_tokens) for r in open_loop]


def test_requests_per_client_scales_with_the_clients() -> None:
    spec, requests = build({**FIXED, "concurrency": 16, "requests_per_client": 10})
    assert spec.total_requests == 160 and len(requests) == 160
    spec, requests = build({**FIXED, "concurrency": 16, "requests_per_client": 10, "num_requests": 50})
    assert spec.total_requests == 50 and len(requests) == 50  # a fixed count wins (--num-requests)


def test_closed_loop_trace_keeps_order_and_lengths_and_drops_times() -> None:
    _, timed = build({"trace": "bundled:azure-conv", "start_s": 60, "num_requests": 40})
    _, closed = build({"trace": "bundled:azure-conv", "start_s": 60, "num_requests": 40, "concurrency": 4})
    assert len(closed) == 40 and {r.arrival_s for r in closed} == {0.0}
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in closed] == [
        (r.request_id, r.prompt_tokens, r.output_tokens) for r in timed]


@pytest.mark.parametrize("text", ["inf", ".inf", "Infinity"])
def test_rate_inf_is_a_burst(text: str) -> None:
    rate = yaml.safe_load(f"rate: {text}")["rate"]  # a string or a float, as YAML reads it
    spec, requests = build({**FIXED, "num_requests": 20, "rate": rate})
    assert spec.burst and spec.client_policy(20) == Clients()
    assert [r.arrival_s for r in requests] == [0.0] * 20
    spec, requests = build({"trace": "bundled:azure-code", "num_requests": 5, "rate": rate,
                            "max_concurrency": 2})
    assert spec.client_policy(5) == Clients(2) and {r.arrival_s for r in requests} == {0.0}


def test_rate_inf_overrides_the_arrival_process() -> None:
    _, requests = build({**FIXED, "num_requests": 6, "rate": "inf",
                         "arrival": {"process": "gamma", "rate": 2, "cv": 3}})
    assert {r.arrival_s for r in requests} == {0.0}


def test_rate_with_max_concurrency_keeps_the_arrivals() -> None:
    spec, capped = build({**FIXED, "num_requests": 30, "rate": 4.0, "max_concurrency": 3,
                          "arrival": {"process": "poisson"}})
    _, free = build({**FIXED, "num_requests": 30, "rate": 4.0, "arrival": {"process": "poisson"}})
    assert capped == free and spec.client_policy(30) == Clients(3)


def test_warmup_on_an_open_loop() -> None:
    spec, _ = build({**FIXED, "num_requests": 30, "rate": 4.0, "arrival": {"process": "poisson"},
                     "warmup_requests": 10})
    assert spec.client_policy(30) == Clients(None, 0.0, 10)


def test_warmup_fraction_scales_with_the_requests() -> None:
    spec = parse_workload({**FIXED, "concurrency": 4, "requests_per_client": 10,
                           "warmup_fraction": 0.1}, "s.yaml")
    assert spec.client_policy(40) == Clients(4, 0.0, 4)
    assert spec.num_warmup(7) == 0 and spec.num_warmup(250) == 25


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"concurrency": 4, "rate": 2.0},
         "s.yaml: workload: 'rate' sets arrival times, but closed-loop clients (concurrency) send each "
         "request when their previous one ends: drop 'rate' (for arrivals at a rate with a cap on "
         "requests in flight, give rate and max_concurrency)"),
        ({"concurrency": 4, "rate": "inf"}, "s.yaml: workload: 'rate' sets arrival times"),
        ({"concurrency": 4, "rate_scale": 2.0}, "s.yaml: workload: 'rate_scale' sets arrival times"),
        ({"concurrency": 4, "arrival": {"process": "poisson", "rate": 1}},
         "s.yaml: workload: 'arrival' sets arrival times"),
        ({"concurrency": 4, "max_concurrency": 2},
         "s.yaml: workload: give concurrency (closed-loop clients) or max_concurrency"),
        ({"concurrency": 0}, "s.yaml: workload.concurrency: Input should be greater than or equal to 1"),
        ({"concurrency": 2, "think_time_s": -0.5},
         "s.yaml: workload.think_time_s: Input should be greater than or equal to 0"),
        ({"concurrency": 2, "warmup_requests": 10},
         "s.yaml: workload: warmup_requests 10 leaves none of the 10 requests to measure"),
        ({"concurrency": 2, "num_requests": None, "requests_per_client": 3, "warmup_requests": 7},
         "s.yaml: workload: warmup_requests 7 leaves none of the 6 requests"),
        ({"concurrency": 2, "num_requests": None},
         "s.yaml: workload: a synthetic workload sent by closed-loop clients (concurrency) needs "
         "num_requests"),
        ({"concurrency": 2, "num_requests": None, "duration_s": 60},
         "s.yaml: workload: 'duration_s' needs arrival times, and under closed-loop clients "
         "(concurrency) there are none: give num_requests"),
        ({"rate": "inf", "num_requests": None, "duration_s": 60},
         "s.yaml: workload: 'duration_s' needs arrival times, and under a burst (rate: inf)"),
        ({"think_time_s": 1.0, "rate": 2.0, "arrival": {"process": "poisson"}},
         "s.yaml: workload: 'think_time_s' applies to closed-loop clients: give 'concurrency'"),
        ({"requests_per_client": 2, "rate": 2.0, "arrival": {"process": "poisson"}},
         "s.yaml: workload: 'requests_per_client' applies to closed-loop clients"),
        ({"max_concurrency": 0, "rate": "inf"},
         "s.yaml: workload.max_concurrency: Input should be greater than or equal to 1"),
        ({"rate": "nan"}, "s.yaml: workload.rate: Input should be greater than 0"),
        ({"rate": 2.0}, "s.yaml: workload: a synthetic workload needs 'arrival' (or give a 'trace')"),
        ({"concurrency": 2, "warmup_requests": 1, "warmup_fraction": 0.5},
         "s.yaml: workload: give warmup_requests or warmup_fraction, not both"),
        ({"concurrency": 2, "warmup_fraction": 1.0},
         "s.yaml: workload.warmup_fraction: Input should be less than 1"),
        ({"concurrency": 2, "warmup_requests": -1},
         "s.yaml: workload.warmup_requests: Input should be greater than or equal to 0"),
    ],
)
def test_errors_are_one_line(changes: dict[str, Any], message: str) -> None:
    data = {**FIXED, "num_requests": 10, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(KvplanError) as info:
        parse_workload(data, "s.yaml")
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text


def test_trace_with_concurrency_refuses_a_rate() -> None:
    with pytest.raises(KvplanError, match=r"^s\.yaml: workload: 'rate' sets arrival times"):
        parse_workload({"trace": "bundled:azure-conv", "concurrency": 4, "rate": 3.0}, "s.yaml")
