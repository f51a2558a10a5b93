"""``max_model_len_policy``: refuse a request longer than the window (reject, vLLM's server) or
cut it to fit (truncate); both are counted in summary.json and in the printed summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import KvplanError
from simulator.report.summary import max_model_len_line
from simulator.config.scenario import parse_scenario
from workloads.request import Request
from workloads.synthetic import fit_to_max_model_len

# prompts up to 400 tokens and 64-token outputs against a 256-token window: some requests are too
# long; a few prompts alone fill it
SCENARIO = """\
name: window
seed: 1
model: llama-3.1-8b
gpu: h100-80gb
allocators: [paged, contiguous-oracle]
max_model_len: 256
num_gpu_blocks_override: 64
workload:
  num_requests: 60
  arrival: {process: poisson, rate: 20}
  prompt_tokens: {dist: uniform, low: 100, high: 400}
  output_tokens: {dist: fixed, value: 64}
"""
REQUESTS = [Request(0, 0.0, 100, 50), Request(1, 1.0, 200, 5), Request(2, 2.0, 150, 80),
            Request(3, 3.0, 190, 10)]


def test_reject_keeps_every_request_and_counts_the_long_ones() -> None:
    fit = fit_to_max_model_len(REQUESTS, 200, "reject")
    assert fit.requests == REQUESTS
    assert (fit.num_over_window, fit.num_rejected, fit.num_truncated, fit.num_dropped) == (2, 2, 0, 0)


def test_truncate_cuts_outputs_and_drops_prompts_that_fill_the_window() -> None:
    fit = fit_to_max_model_len(REQUESTS, 200, "truncate")
    assert (fit.num_over_window, fit.num_rejected, fit.num_truncated, fit.num_dropped) == (2, 0, 1, 1)
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in fit.requests] == [
        (0, 100, 50), (1, 150, 50), (2, 190, 10)]
    assert fit.as_dict()["policy"] == "truncate"


def test_unknown_policy_is_one_clear_error() -> None:
    with pytest.raises(KvplanError, match="unknown max_model_len_policy 'clip'"):
        fit_to_max_model_len(REQUESTS, 200, "clip")  # type: ignore[arg-type]
    with pytest.raises(KvplanError, match="max_model_len_policy: Input should be 'reject' or 'truncate'"):
        parse_scenario({"model": "tiny", "gpu": "l4", "max_model_len_policy": "clip",
                        "workload": {"trace": "bundled:azure-conv"}}, "s.yaml")


def test_printed_line_names_the_policy_and_the_count() -> None:
    assert max_model_len_line(fit_to_max_model_len(REQUESTS, 200, "reject").as_dict()) == (
        "max_model_len 200, policy reject: 2 requests over the window refused (vLLM's server: 400)")
    assert "1 outputs cut at the window, 1 requests dropped" in max_model_len_line(
        fit_to_max_model_len(REQUESTS, 200, "truncate").as_dict())


def _simulate(tmp_path: Path, policy: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    scenario = tmp_path / "window.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / policy
    capsys.readouterr()
    assert main(["simulate", str(scenario), "--set", f"max_model_len_policy={policy}", "--out", str(out),
                 "--no-plots"]) == 0
    return json.loads((out / "summary.json").read_text()), capsys.readouterr().out


def test_simulate_reports_each_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rejected, printed = _simulate(tmp_path, "reject", capsys)
    for s in rejected.values():
        policy = s["max_model_len_policy"]
        assert policy["policy"] == "reject" and policy["num_rejected"] > 0
        assert s["rejected_by_reason"]["max_model_len"] == policy["num_rejected"]
    assert "policy reject:" in printed

    cut, printed = _simulate(tmp_path, "truncate", capsys)
    for s in cut.values():
        policy = s["max_model_len_policy"]
        assert policy["policy"] == "truncate" and policy["num_truncated"] + policy["num_dropped"] > 0
        assert policy["num_over_window"] == rejected["paged"]["max_model_len_policy"]["num_over_window"]
        assert "max_model_len" not in s["rejected_by_reason"]
        assert s["completed"] + s["rejected"] == 60 - policy["num_dropped"]
    assert "policy truncate:" in printed
