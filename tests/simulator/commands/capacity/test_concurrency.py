"""``kvplan capacity --search concurrency``: the integer search, analytic thresholds, the
throughput-latency curve, its Pareto frontier, and the rate search with a cap on requests in flight.

Analytic closed loop (a constant step S, fixed 16-token prompts that N clients prefill in one
step, O-token outputs, ample KV, at most M sequences at once): with N ≤ M the N requests of a
round start together, prefill in one step and decode O − 1 more together, so every request has
TTFT = S and E2E = O·S, and throughput is N / (O·S) requests and N / S tokens per second. With
N > M the clients beyond M wait in the server's queue for a whole request: TTFT = O·S + S. A
TTFT bound between the two puts the answer at exactly M clients.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity import cmd
from simulator.commands.capacity.pareto import frontier
from simulator.commands.capacity.search import (
    MAX_QUEUE_GROWTH,
    Probe,
    RateWorkload,
    SearchTask,
    bracket_and_bisect,
    curve_loads,
    max_clients,
    run_search,
)
from simulator.errors import KvplanError
from workloads.spec import WorkloadSpec, build_requests, parse_workload

S = 0.01  # step seconds
FIXED_16_4 = {"prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 4}}


def closed_loop(output: int, slo: dict[str, float], *, max_num_seqs: int = 64, per_client: int = 3,
                **workload: Any) -> dict[str, Any]:
    return {
        "name": "clients", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": 16 * 2 * max_num_seqs, "max_model_len": 64,
        "latency": {"model": "constant", "step_s": S},
        "workload": {"prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": output},
                     "concurrency": 1, "requests_per_client": per_client, **workload},
        "slo": slo,
    }


def task(data: dict[str, Any], *, search: str = "concurrency", start: float = 1, tolerance: float = 0.01,
         curve: bool = False, cache_dir: str | None = None) -> SearchTask:
    return SearchTask(0, data, "clients.yaml", ".", "paged", 0, start, tolerance, False, cache_dir,
                      search, curve)


# --- the integer bracket -----------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [1, 3, 37, 100, 255])
@pytest.mark.parametrize("tolerance", [0.01, 0.2])
@pytest.mark.parametrize("upper", [None, 64, 1000])
def test_integer_bracket(threshold: int, tolerance: float, upper: int | None) -> None:
    calls: list[float] = []

    def holds(n: float) -> bool:
        calls.append(n)
        return n <= threshold

    b = bracket_and_bisect(holds, 1, tolerance, integer=True, upper=upper)
    assert all(isinstance(n, int) and n >= 1 for n in calls) and len(set(calls)) == len(calls)
    assert upper is None or max(calls) <= upper
    if upper is not None and threshold >= upper:
        assert b.lo_rate == upper and b.hi_rate is None
        return
    assert b.hi_rate is not None and b.lo_rate <= threshold < b.hi_rate
    assert b.hi_rate - b.lo_rate <= max(1, int(tolerance * b.lo_rate))
    if tolerance == 0.01 and threshold < 100:
        assert (b.lo_rate, b.hi_rate) == (threshold, threshold + 1)


def test_integer_bracket_when_one_client_fails() -> None:
    b = bracket_and_bisect(lambda n: False, 1, 0.05, integer=True)
    assert (b.lo_rate, b.hi_rate, b.rates) == (0.0, 1, (1,))
    b = bracket_and_bisect(lambda n: n <= 2, 8, 0.05, integer=True)  # halving from 8
    assert (b.lo_rate, b.hi_rate) == (2, 3)
    with pytest.raises(ValueError):
        bracket_and_bisect(lambda n: True, 1.5, 0.05, integer=True)


# --- analytic thresholds -------------------------------------------------------------------------


def test_ttft_bound_gives_the_closed_form_concurrency() -> None:
    data = closed_loop(8, {"ttft_p99_s": 0.05}, max_num_seqs=20)
    result = run_search(task(data))
    assert (result.lo_concurrency, result.hi_concurrency) == (20, 21)
    at_max = result.at_max
    assert at_max is not None and at_max.concurrency == 20 and at_max.ok
    assert at_max.ttft_p99_s == pytest.approx(S) and at_max.e2e_p99_s == pytest.approx(8 * S)
    assert at_max.rate_req_s == pytest.approx(20 / (8 * S))  # the rate 20 clients achieve
    assert result.lo_rate_req_s == at_max.rate_req_s
    assert at_max.throughput_tok_s == pytest.approx(20 / S)
    assert at_max.max_batch_size == 20 and at_max.queue_growth == 0.0  # a closed loop cannot run away
    assert all(p.ok == (p.concurrency is not None and p.concurrency <= 20) for p in result.probes)
    over = [p for p in result.probes if p.concurrency == 21]
    assert over and over[0].ttft_p99_s == pytest.approx(9 * S)


def test_search_stops_at_the_most_useful_clients() -> None:
    data = closed_loop(4, {"tpot_p99_s": 1.0}, max_num_seqs=4)
    result = run_search(task(data))
    assert result.hi_concurrency is None and result.lo_concurrency == 8  # 2 × max_num_seqs
    spec = parse_workload({**data["workload"], "requests_per_client": None, "num_requests": 6}, "x")
    assert max_clients(spec, 4, 1) == 6 and max_clients(spec, 2, 1) == 4


# --- the curve and its frontier ------------------------------------------------------------------


def fake(n: int, tok_s: float) -> Probe:
    return Probe(float(n), 0, True, (), 10, 10, 0, 1.0, tok_s, 1.0, 0.1, 0.01, 1.0, 0.0, 0.0, n, 0, 0,
                 concurrency=n)


@pytest.mark.parametrize(("upper", "batch_cap", "expected"), [
    (1000, 1000, [1, 2, 4, 8, 16, 32]),  # 16 -> 32 adds nothing: saturated
    (1000, 4, [1, 2, 4]),  # the server batches at most 4
    (6, 1000, [1, 2, 4, 6]),
])
def test_curve_loads(upper: int, batch_cap: int, expected: list[int]) -> None:
    curve = curve_loads(lambda n: fake(n, 100.0 * min(n, 10)), upper, batch_cap)
    assert [p.concurrency for p in curve] == expected


def test_frontier() -> None:
    xs = [1.0, 2.0, 3.0, 2.0, 1.0, 3.0]
    ys = [5.0, 4.0, 1.0, 3.0, 4.0, 1.0]
    assert frontier(xs, ys) == [True, True, True, False, False, True]  # a tie stays on it
    assert frontier([], []) == []


def test_search_with_curve_measures_up_to_saturation() -> None:
    data = closed_loop(6, {"tpot_p99_s": 1.0}, max_num_seqs=8)
    result = run_search(task(data, curve=True))
    assert [p.concurrency for p in result.curve] == [1, 2, 4, 8]
    for p in result.curve:  # each point in closed form
        assert p.throughput_tok_s == pytest.approx((p.concurrency or 0) / S)


# --- rate search with a cap on requests in flight -------------------------------------------------


def test_capped_rate_search_counts_the_wait_for_a_slot() -> None:
    """One-step requests of S, one in flight: above 1/S the clients fall behind the offered
    arrivals by S·r − 1 seconds per second although every TTFT (from the send) is S. Stability
    puts the threshold at (1 + MAX_QUEUE_GROWTH) / S."""
    data = {"name": "capped", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 4,
            "latency": {"model": "constant", "step_s": S},
            "workload": {"arrival": {"process": "constant", "rate": 1.0},
                         "prompt_tokens": {"dist": "fixed", "value": 16},
                         "output_tokens": {"dist": "fixed", "value": 1},
                         "num_requests": 100, "max_concurrency": 1},
            "slo": {"ttft_p99_s": 1.0}}
    result = run_search(task(data, search="rate", start=20.0))
    threshold = (1 + MAX_QUEUE_GROWTH) / S
    assert result.hi_rate_req_s is not None
    assert result.lo_rate_req_s <= threshold <= result.hi_rate_req_s
    for p in result.probes:
        assert p.ttft_p99_s == pytest.approx(S)
        if p.rate_req_s > 1 / S:
            assert p.queue_growth == pytest.approx(S * p.rate_req_s - 1)


# --- workloads at any concurrency ---------------------------------------------------------------


def test_trace_workload_at_concurrency_equals_build_requests() -> None:
    spec = WorkloadSpec.model_validate({"trace": "bundled:azure-conv", "rate": 4.0, "num_requests": 50,
                                        "warmup_fraction": 0.2})
    workload = RateWorkload(spec, seed=0, base_dir=Path("."))
    for n in (1, 7):
        requests, clients = workload.at_concurrency(n)
        direct = spec.closed_loop_at(n, "x")
        assert requests == build_requests(direct, seed=0, base_dir=Path("."))
        assert clients.max_in_flight == n and clients.warmup_requests == 10
        assert {r.arrival_s for r in requests} == {0.0}


# --- the command ----------------------------------------------------------------------------------


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvplan")
    cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["capacity", *argv])
    return int(args.func(args))


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "clients.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_command_writes_the_table_the_curve_and_the_plot(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = closed_loop(6, {"ttft_p99_s": 0.05}, max_num_seqs=20)
    data["allocators"] = ["paged", "contiguous-max"]
    out = tmp_path / "out"
    assert run(str(write(tmp_path, data)), "--search", "concurrency", "--jobs", "1", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "max closed-loop concurrency under the SLO" in printed and "tok/s/user" in printed
    assert "fixed lengths sent without arrival times" in printed  # one seed is enough
    with (out / "capacity.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["allocator"], r["max_clients"], r["clients_ci_low"], r["clients_ci_high"]) for r in rows] == [
        ("paged", "20", "20", "21"), ("contiguous-max", "20", "20", "21")]
    assert "rate_ci_low_req_s" not in rows[0]
    with (out / "pareto.csv").open() as f:
        curve = list(csv.DictReader(f))
    assert [(r["allocator"], r["concurrency"]) for r in curve] == [
        (a, str(n)) for a in ("paged", "contiguous-max") for n in (1, 2, 4, 8, 16, 32)]
    row = curve[5]
    assert float(row["tok_s_per_user"]) == pytest.approx(float(row["throughput_tok_s"]) / 32, rel=1e-5)
    assert row["slo_ok"] == "False" and curve[4]["slo_ok"] == "True"  # 32 clients: 12 queue
    # a constant step serves every user at 1/S up to the batch limit: 16 clients dominate 1..8
    # (same tok/s/user, more tok/s/GPU); the two allocators' identical points tie on the frontier
    assert [r["on_frontier"] for r in curve] == (["False"] * 4 + ["True"] * 2) * 2
    report = json.loads((out / "capacity.json").read_text())
    assert len(report["pareto"]) == 12 and report["searches"][0]["lo_concurrency"] == 20
    png = (out / "plots" / "pareto.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert run(str(write(tmp_path, data)), "--search", "concurrency", "--jobs", "1", "--out", str(out),
               "--quiet") == 0
    assert (out / "plots" / "pareto.png").read_bytes() == png  # same data, same bytes


@pytest.mark.parametrize(("change", "argv", "message"), [
    ({}, (), ": workload.concurrency sends requests from closed-loop clients, which have "
             "no rate to search: use --search concurrency"),
    ({"workload": {**FIXED_16_4,
                   "duration_s": 30, "arrival": {"process": "poisson", "rate": 2}}},
     ("--search", "concurrency"),
     ": workload: 'duration_s' needs arrival times, and under closed-loop clients (concurrency) "
     "there are none: give num_requests (with 1 client, where --search concurrency starts)"),
    ({"workload": {**FIXED_16_4,
                   "concurrency": 4, "requests_per_client": 3, "warmup_requests": 4}},
     ("--search", "concurrency"),
     ": workload: warmup_requests 4 leaves none of the 3 requests to measure (with 1 client, "
     "where --search concurrency starts)"),
    ({"workload": {**FIXED_16_4,
                   "num_requests": 10, "rate": "inf"}},
     (), ": workload.rate: inf is a burst (every request at t = 0), which has no rate to search: give "
         "workload.arrival (e.g. {process: poisson, rate: 1}) to search its rate, or use --search concurrency"),
])
def test_command_errors(tmp_path: Path, change: dict[str, Any], argv: tuple[str, ...], message: str) -> None:
    data = {**closed_loop(4, {"tpot_p99_s": 1.0}), **change}
    path = write(tmp_path, data)
    with pytest.raises(KvplanError) as err:
        run(str(path), "--quiet", "--jobs", "1", "--out", str(tmp_path / "o"), *argv)
    assert str(err.value) == f"{path}{message}"
