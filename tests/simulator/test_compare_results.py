"""Reading measured results (each format, field by field) and predicting by each tool's rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from simulator.commands.compare.against import scenario_at_load
from simulator.commands.compare.measured import MetricRow, goodput_slo, summarize
from simulator.commands.compare.predict import CONVENTIONS, predicted_metrics, relative_error
from simulator.commands.compare.results import Load, read_result
from simulator.errors import KvplanError

DATA = Path(__file__).resolve().parents[1] / "data" / "compare"


def test_vllm_bench_fields_map_to_seconds_and_the_load() -> None:
    r = read_result(str(DATA / "vllm-bench.json"))
    assert r.format == "vllm-bench" and r.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.metrics[("ttft", "mean")] == pytest.approx(0.060)  # mean_ttft_ms 60.0
    assert r.metrics[("ttft", "median")] == pytest.approx(0.055)
    assert r.metrics[("ttft", "p99")] == pytest.approx(0.110)
    assert r.metrics[("tpot", "p99")] == pytest.approx(0.011)
    assert r.metrics[("itl", "mean")] == pytest.approx(0.0091)
    assert ("itl", "p99") not in r.metrics  # per-gap percentiles: not comparable
    assert r.metrics[("e2e", "median")] == pytest.approx(1.180)
    assert r.metrics[("request_throughput", "value")] == 4.0
    assert r.metrics[("total_throughput", "value")] == 2560.0  # total_token_throughput
    assert r.metrics[("request_goodput", "value")] == 3.9
    # 102,400 input and 25,600 output tokens over 200 completed requests
    assert r.load == Load(rate=4.0, burstiness=1.0, arrival="poisson", max_concurrency=None, num_requests=200,
                          mean_prompt_tokens=512.0, mean_output_tokens=128.0)


def test_guidellm_benchmark_is_picked_and_its_itl_is_kvplans_tpot() -> None:
    first = read_result(f"{DATA / 'guidellm-sweep.json'}#1")
    assert first.format == "guidellm" and first.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert first.load.concurrency == 8 and first.load.num_requests == 400
    assert first.load.mean_prompt_tokens == 512.0 and first.load.mean_output_tokens == 128.0
    assert first.metrics[("ttft", "mean")] == pytest.approx(0.075)
    assert first.metrics[("tpot", "mean")] == pytest.approx(0.0095)  # inter_token_latency_ms
    assert first.metrics[("e2e", "mean")] == pytest.approx(1.28)  # request_latency is in seconds
    assert first.metrics[("e2e", "p99")] == pytest.approx(1.28 * 1.2)  # percentiles.p99
    assert first.metrics[("output_throughput", "value")] == 794.0
    second = read_result(f"{DATA / 'guidellm-sweep.json'}#2")
    assert second.load.rate == 4.0 and second.load.arrival == "constant" and second.load.concurrency is None
    yaml_one = read_result(str(DATA / "guidellm-concurrent.yaml"))
    assert yaml_one.metrics == first.metrics and yaml_one.load == first.load


def test_fidelity_json_gives_the_real_engines_values() -> None:
    r = read_result(str(DATA / "fidelity.json"))
    assert r.format == "kvplan-fidelity" and r.model == "Llama-3.1-8B" and r.load == Load()
    assert r.metrics[("ttft", "median")] == 0.056  # ttft_s.p50 measured
    assert r.metrics[("output_throughput", "value")] == 505.6  # throughput_tok_s measured
    assert read_result(str(DATA)).metrics == r.metrics  # the folder holding fidelity.json


@pytest.mark.parametrize("content, message", [
    ({"hello": 1}, "unknown result format"),
    ({"mean_ttft_ms": 5.0}, "missing key 'request_throughput'"),
    ({"request_throughput": 1.0, "completed": 3}, "no latency in the result"),
    ({"request_throughput": "fast", "mean_ttft_ms": 5.0, "completed": 1}, "'request_throughput' is 'fast'"),
    ({"benchmarks": []}, "has no benchmarks"),
    ({"allocators": {}, "scenario": "x"}, "missing key 'allocators.paged.metrics'"),
])
def test_bad_results_are_one_line_errors(tmp_path: Path, content: dict, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(content))
    with pytest.raises(KvplanError, match=message):
        read_result(str(path))


def test_a_sweep_needs_a_benchmark_number_and_appended_results_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KvplanError, match=r"holds 2 benchmarks .*json#N, N = 1\.\.2"):
        read_result(str(DATA / "guidellm-sweep.json"))
    with pytest.raises(KvplanError, match="holds benchmarks 1..2, not 3"):
        read_result(f"{DATA / 'guidellm-sweep.json'}#3")
    appended = tmp_path / "a.json"
    appended.write_text('{"request_throughput": 1}\n{"request_throughput": 2}\n')
    with pytest.raises(KvplanError, match="holds 2 results, one per line"):
        read_result(str(appended))


def _columns(ttft: list[float], e2e: list[float], output: list[int], prompt: int = 100) -> dict:
    n = len(ttft)
    return {"status": ["finished"] * n, "ttft_s": np.array(ttft), "e2e_s": np.array(e2e),
            "tpot_s": np.full(n, np.nan), "output_tokens": np.array(output), "prompt_tokens": np.full(n, prompt),
            "n": np.ones(n, dtype=int), "beam_width": np.ones(n, dtype=int)}


def test_vllm_rules_by_hand() -> None:
    # TPOT (E2E − TTFT)/(out − 1): (1.1 − 0.1)/10 = 0.1, (2.2 − 0.2)/5 = 0.4; the one-token request has none
    cols = _columns(ttft=[0.1, 0.2, 0.3], e2e=[1.1, 2.2, 0.3], output=[11, 6, 1])
    p = predicted_metrics(cols, warmup=0, window_s=10.0, convention=CONVENTIONS["vllm-bench"],
                          goodput_slo_s={"ttft": 0.25, "tpot": 0.2})
    assert p[("tpot", "mean")] == pytest.approx(0.25)
    assert p[("tpot", "p99")] == pytest.approx(0.1 + 0.99 * 0.3)  # np.percentile, linear
    assert p[("ttft", "median")] == pytest.approx(0.2)
    assert p[("itl", "mean")] == pytest.approx((1.0 + 2.0) / (10 + 5))  # every gap counts once
    assert p[("request_throughput", "value")] == pytest.approx(0.3)
    assert p[("output_throughput", "value")] == pytest.approx(18 / 10)
    assert p[("total_throughput", "value")] == pytest.approx((18 + 300) / 10)
    # good: request 0 (ttft 0.1, tpot 0.1) and request 2 (ttft 0.3 > 0.25: no) -> 1 of 3
    assert p[("request_goodput", "value")] == pytest.approx(0.1)


def test_guidellm_rules_by_hand() -> None:
    # ITL weighted by output − 1: values 0.1 (weight 10) and 0.4 (weight 5): mean 0.2; the inverted
    # CDF's median is the first value whose cumulative weight reaches 1/2: 0.1 (10/15)
    cols = _columns(ttft=[0.1, 0.2, 0.3, 0.4], e2e=[1.1, 2.2, 0.3, 0.4], output=[11, 6, 1, 1])
    p = predicted_metrics(cols, warmup=1, window_s=10.0, convention=CONVENTIONS["guidellm"])
    assert p[("tpot", "mean")] == pytest.approx(0.4)  # the warm-up request is left out: only 0.4 remains
    p = predicted_metrics(cols, warmup=0, window_s=10.0, convention=CONVENTIONS["guidellm"])
    assert p[("tpot", "mean")] == pytest.approx(0.2)
    assert p[("tpot", "median")] == pytest.approx(0.1)
    assert p[("ttft", "median")] == pytest.approx(0.2)  # 4 values: cdf 0.25, 0.5 -> the 2nd
    assert ("request_goodput", "value") not in p


def test_relative_errors_by_hand() -> None:
    assert relative_error(110.0, 100.0) == pytest.approx(0.10)
    assert relative_error(0.045, 0.060) == pytest.approx(-0.25)
    assert relative_error(None, 1.0) is None and relative_error(1.0, 0.0) is None
    rows = [MetricRow("ttft", "mean", 0.060, 0.045), MetricRow("tpot", "mean", 0.010, 0.011),
            MetricRow("e2e", "p99", 1.0, None)]
    s = summarize(rows)
    assert s["num_compared"] == 2 and s["mape"] == pytest.approx((0.25 + 0.10) / 2)
    assert s["worst"]["label"] == "TTFT mean"


def test_goodput_slos_come_from_the_flag_then_the_scenario() -> None:
    assert goodput_slo(["ttft:500", "e2el:2000"], {"ttft_p99_s": 1.0}) == (
        {"ttft": 0.5, "e2el": 2.0}, "--goodput")
    slo, where = goodput_slo(None, {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05, "e2e_p99_s": None})
    assert slo == {"ttft": 1.0, "tpot": 0.05} and where.startswith("the scenario's slo")
    assert goodput_slo(None, None) == (None, None)
    with pytest.raises(KvplanError, match="KEY:MS"):
        goodput_slo(["itl:5"], None)


def test_the_scenario_is_sent_at_the_results_load() -> None:
    data = {"name": "s", "workload": {"arrival": {"process": "poisson"}, "rate": 2.0, "warmup_requests": 5,
                                      "num_requests": 10, "prompt_tokens": {"dist": "lognormal", "mean": 100,
                                                                            "p99": 900},
                                      "output_tokens": {"dist": "fixed", "value": 50}}}
    load = Load(rate=8.0, burstiness=0.25, arrival="gamma", max_concurrency=16, num_requests=300,
                mean_prompt_tokens=511.6, mean_output_tokens=128.2)
    out, notes = scenario_at_load(data, load, "s.yaml")
    wl = out["workload"]
    # vLLM's gamma of shape 0.25 has a coefficient of variation of 1/√0.25 = 2
    assert wl["arrival"] == {"process": "gamma", "cv": 2.0} and wl["rate"] == 8.0
    assert wl["max_concurrency"] == 16 and wl["num_requests"] == 300 and "warmup_requests" not in wl
    assert wl["prompt_tokens"] == {"dist": "fixed", "value": 512}
    assert wl["output_tokens"] == {"dist": "fixed", "value": 128}
    assert any("lengths: fixed" in n for n in notes)
    assert data["workload"]["rate"] == 2.0  # the caller's mapping is left alone
    closed, _ = scenario_at_load(data, Load(concurrency=8, num_requests=64), "s.yaml")
    assert closed["workload"]["concurrency"] == 8 and "rate" not in closed["workload"]
    burst, _ = scenario_at_load({"workload": {"trace": "t.csv"}}, Load(rate=math.inf, num_requests=5), "s")
    assert burst["workload"] == {"trace": "t.csv", "rate": math.inf, "num_requests": 5}
