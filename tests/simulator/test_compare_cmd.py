"""``kvplan compare``: the closed loop (the simulator's own predictions, read back as a vLLM
result, compare with zero error), two runs side by side, and bad input as one line, exit 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from compare_helpers import simulate_as_vllm_bench
from simulator.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
SCENARIO = {
    "name": "loop", "model": "llama-3.1-8b", "gpu": "h100-80gb", "allocators": ["paged"], "max_model_len": 4096,
    "workload": {"arrival": {"process": "poisson"}, "rate": 6.0, "num_requests": 60,
                 "prompt_tokens": {"dist": "fixed", "value": 700}, "output_tokens": {"dist": "fixed", "value": 90}},
}


@pytest.fixture
def loop(tmp_path: Path) -> tuple[Path, Path]:
    scenario = tmp_path / "loop.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    result = tmp_path / "loop-result.json"
    simulate_as_vllm_bench(SCENARIO, result, base_dir=tmp_path)
    return scenario, result


def test_closed_loop_against_the_scenario_has_zero_error(loop: tuple[Path, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    scenario, result = loop
    out = tmp_path / "cmp"
    assert main(["compare", str(result), "--against", str(scenario), "--out", str(out)]) == 0
    payload = json.loads((out / "compare.json").read_text())
    assert payload["kind"] == "measured-vs-predicted"
    assert payload["result"]["load"]["rate"] == 6.0 and payload["result"]["load"]["num_requests"] == 60
    compared = [m for m in payload["metrics"] if m["relative_error"] is not None]
    assert len(compared) == 13  # 3 statistics × TTFT/TPOT/E2E, ITL mean, 3 throughputs
    for m in compared:
        assert m["relative_error"] == pytest.approx(0.0, abs=1e-9), m["label"]
    assert payload["summary"]["mape"] == pytest.approx(0.0, abs=1e-9)
    with (out / "compare.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(payload["metrics"])
    for name in ("compare.png", "simulated/summary.json", "simulated/requests.csv", "simulated/latency_cdf.png"):
        assert (out / name).is_file(), name
    assert "TTFT p99" in capsys.readouterr().out


def test_against_a_run_folder_reads_its_requests(loop: tuple[Path, Path], tmp_path: Path) -> None:
    scenario, result = loop
    run = tmp_path / "run"
    assert main(["simulate", str(scenario), "--out", str(run), "--quiet", "--no-plots"]) == 0
    assert main(["compare", str(result), "--against", str(run), "--quiet"]) == 0
    payload = json.loads((tmp_path / "run-compare" / "compare.json").read_text())  # beside the run
    assert payload["against"]["kind"] == "run" and payload["against"]["run"] == "paged"
    assert all(m["relative_error"] == pytest.approx(0.0, abs=1e-9) for m in payload["metrics"])


def test_two_runs_side_by_side(loop: tuple[Path, Path], tmp_path: Path) -> None:
    scenario, _ = loop
    a, b, out = tmp_path / "fp16", tmp_path / "fp8", tmp_path / "what-if"
    assert main(["simulate", str(scenario), "--out", str(a), "--quiet", "--no-plots"]) == 0
    assert main(["simulate", str(scenario), "--out", str(b), "--quiet", "--no-plots",
                 "--set", "kv_cache_dtype=fp8"]) == 0
    assert main(["compare", str(a), str(b), "--out", str(out), "--quiet"]) == 0
    payload = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in payload["runs"]] == ["fp16", "fp8"]
    rows = {r["metric"]: r for r in payload["rows"]}
    pool = rows["KV pool (tokens)"]
    assert pool["ratio"] == pytest.approx(pool["b"] / pool["a"])
    # fp8 halves the bytes per token, so the same memory holds about twice the tokens
    assert 1.9 < pool["ratio"] < 2.1
    assert payload["runs"][1]["kv_cache_dtype"] == "fp8"
    assert (out / "compare_latency_cdf.png").is_file() and (out / "compare_kv.png").is_file()


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvplan: error: "), err
    return err[0]


def test_bad_input_is_one_line_and_exit_2(loop: tuple[Path, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    scenario, result = loop
    other = dict(SCENARIO, model="qwen3-8b")
    other_path = tmp_path / "other.yaml"
    other_path.write_text(yaml.safe_dump(other))
    assert main(["compare", str(result), "--against", str(other_path), "--out", str(tmp_path / "x")]) == 2
    assert "measured on Llama-3.1-8B" in _error_line(capsys)
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"latency": 5}')
    assert main(["compare", str(unknown), "--against", str(scenario), "--out", str(tmp_path / "y")]) == 2
    assert "unknown result format" in _error_line(capsys)
    missing = tmp_path / "missing.json"
    missing.write_text('{"mean_ttft_ms": 5}')
    assert main(["compare", str(missing), "--against", str(scenario), "--out", str(tmp_path / "z")]) == 2
    assert "missing key 'request_throughput'" in _error_line(capsys)
    assert main(["compare", str(result)]) == 2
    assert "--against" in _error_line(capsys)
