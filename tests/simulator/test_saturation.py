"""Saturation: worked out on a D/D/1 queue, where the slope of the queueing delay is exact.

One sequence at a time, one-token outputs and a constant step time D make the engine a queue
with service time D. Requests arriving every 1/λ s then wait w_i = max(0, i (D − 1/λ)): with
ρ = λD > 1 the delay grows by ρ − 1 seconds per second of trace, below 1 nobody waits.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from simulator.engine import metrics
from simulator.report import summary as report
from simulator.engine.saturation import MAX_QUEUE_GROWTH
from simulator.cli import main
from simulator.engine.core import simulate
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.engine.saturation import Saturation, saturation
from simulator.scheduler import Scheduler, SchedulerConfig
from workloads.clients import Clients
from workloads.request import Request

STEP_S = 0.1  # D: one request per step


def run(rate_req_s: float, num: int = 60, clients: Clients = Clients()) -> Saturation:
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64, block_size=4)

    def make(_: int):
        alloc = PagedAllocator(64, 4)
        return Scheduler(alloc, cfg), alloc

    arrival = (lambda i: i / rate_req_s) if rate_req_s != float("inf") else (lambda i: 0.0)
    requests = [Request(i, arrival(i), 8, 1) for i in range(num)]
    result = simulate(requests, make, ConstantLatency(STEP_S), clients=clients)
    return saturation(result, metrics.requests_frame(result))


def test_overload_grows_the_queue_by_rho_minus_one() -> None:
    s = run(15.0)  # ρ = 1.5
    assert s.queue_growth_s_per_s == pytest.approx(0.5, rel=1e-9)
    assert s.saturated and s.as_dict() == {"saturated": True, "queue_growth_s_per_s": s.queue_growth_s_per_s}


def test_below_capacity_nobody_waits() -> None:
    s = run(5.0)  # ρ = 0.5
    assert s.queue_growth_s_per_s == pytest.approx(0.0, abs=1e-12) and not s.saturated


def test_a_burst_has_no_trend_to_measure() -> None:
    assert run(float("inf")) == Saturation(0.0)  # everything offered at t = 0


def test_a_cap_on_requests_in_flight_counts_the_wait_for_a_slot() -> None:
    """One slot and a rate the server cannot follow: the server's own queue stays empty, the
    clients' backlog grows, and that is saturation."""
    s = run(15.0, clients=Clients(max_in_flight=1))
    assert s.queue_growth_s_per_s == pytest.approx(0.5, rel=1e-9) and s.saturated


def test_warmup_requests_are_left_out() -> None:
    """Warm-up drops the first requests from the fit; the slope of the rest is the same line."""
    s = run(15.0, clients=Clients(warmup_requests=20))
    assert s.queue_growth_s_per_s == pytest.approx(0.5, rel=1e-9)


@pytest.mark.parametrize(("growth", "saturated"), [(MAX_QUEUE_GROWTH, False),
                                                   (MAX_QUEUE_GROWTH * 1.001, True), (-0.3, False)])
def test_the_threshold_is_capacitys(growth: float, saturated: bool) -> None:
    assert Saturation(growth).saturated is saturated


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_growth_s_per_s must be positive"):
        Saturation(0.1, max_growth_s_per_s=0.0)


# ----------------------------------------------------------------------------- reported
def summary_of(saturated: dict[str, bool]) -> dict[str, dict]:
    return {name: {"saturated": sat, "queue_growth_s_per_s": 0.4 if sat else -0.004}
            for name, sat in saturated.items()}


def test_saturation_line_names_the_allocators() -> None:
    assert report.saturation_line(summary_of({"paged": False, "contiguous-max": False})) == ""
    line = report.saturation_line(summary_of({"paged": False, "contiguous-max": True}))
    assert line == ("saturated (contiguous-max): the queue grows through the run and latencies with it; "
                    "lower --rate or add GPUs")
    every = report.saturation_line(summary_of({"paged": True, "contiguous-max": True}))
    assert every.startswith("saturated (every allocator):")
    assert report.saturation_line({"paged": {}}) == ""  # a summary from before the flag


def test_table_row_says_stable_or_saturated() -> None:
    console = Console(width=160, record=True)
    base = {"completed": 1, "rejected": 0, "throughput_req_s": 1.0, "throughput_tok_s": 1.0,
            "ttft_s": {"p50": 0.1, "p99": 0.2}, "tpot_s": {"p50": 0.01, "p99": 0.02},
            "e2e_s": {"p50": 1.0, "p99": 2.0}, "mean_batch_size": 1.0, "max_batch_size": 1,
            "num_preemptions": 0, "prefix_hit_rate": 0.0,
            "kv": {"token_state": 0.1, "reserved": 0.0, "internal_fragmentation": 0.0,
                   "external_fragmentation": 0.0}}
    summary = {n: {**base, **s} for n, s in summary_of({"paged": False, "contiguous-max": True}).items()}
    console.print(report.summary_table(summary, "t"))
    row = next(line for line in console.export_text().splitlines() if "queue over the run" in line)
    assert "stable +0.00 s/s" in row and "SATURATED +0.40 s/s" in row  # no "-0.00"


OVERLOADED = """\
name: overloaded
model: llama-3.1-8b
gpu: h100-80gb
allocators: [paged]
latency: {model: constant, step_s: 0.1}
max_num_seqs: 1
workload:
  num_requests: 40
  arrival: {process: constant, rate: 20}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 1}
"""


def test_simulate_reports_saturation(tmp_path, capsys) -> None:
    scenario = tmp_path / "overloaded.yaml"
    scenario.write_text(OVERLOADED)
    out = tmp_path / "out"
    assert main(["simulate", str(scenario), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())["paged"]
    assert summary["saturated"] is True
    assert summary["queue_growth_s_per_s"] == pytest.approx(20 * 0.1 - 1, rel=0.05)  # ρ − 1
    assert "saturated (paged): the queue grows through the run" in printed
    # the same scenario at a rate it can serve: stable, and nothing printed about saturation
    assert main(["simulate", str(scenario), "--out", str(tmp_path / "ok"), "--no-plots",
                 "--rate", "5"]) == 0
    assert "saturated" not in capsys.readouterr().out
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["paged"]["saturated"] is False
