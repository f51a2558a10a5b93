"""The workload spec: YAML -> validated spec -> requests, and one-line validation errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from simulator.errors import KvplanError
from workloads.loaders import bundled_trace_path, load_azure
from workloads.spec import WorkloadSpec, build_requests, format_validation_error, parse_workload
from workloads.synthetic import fit_to_max_model_len, mean_rate_per_s

SYNTHETIC_YAML = """
workload:
  num_requests: 3000
  arrival: {process: poisson, rate: 5.0}
  prompt_tokens: {dist: lognormal, mean: 161, p99: 1024, min: 1, max: 2048}
  output_tokens: {dist: fixed, value: 128}
  shared_prefix: {groups: 4, prefix_tokens: 512, popularity: zipf}
  n: 2
"""


def synthetic(**changes: Any) -> WorkloadSpec:
    data = yaml.safe_load(SYNTHETIC_YAML)["workload"]
    data.update(changes)
    return parse_workload(data, "chat.yaml")


def test_synthetic_workload_from_yaml(tmp_path: Path) -> None:
    requests = build_requests(synthetic(), seed=3, base_dir=tmp_path)
    assert len(requests) == 3000 and requests[0].arrival_s == 0.0
    assert [r.request_id for r in requests] == list(range(3000))
    assert mean_rate_per_s(requests) == pytest.approx(5.0, rel=0.05)
    assert all(513 <= r.prompt_tokens <= 512 + 2048 for r in requests)
    assert all(r.output_tokens == 128 and r.n == 2 and r.beam_width == 1 for r in requests)
    assert {len(r.prefix_ids) for r in requests} == {32}
    assert len({r.prefix_ids for r in requests}) == 4
    assert build_requests(synthetic(), seed=3, base_dir=tmp_path) == requests


def test_each_ingredient_has_its_own_stream(tmp_path: Path) -> None:
    base = build_requests(synthetic(), seed=3, base_dir=tmp_path)
    other = build_requests(synthetic(output_tokens={"dist": "uniform", "low": 1, "high": 9}),
                           seed=3, base_dir=tmp_path)
    assert [(r.arrival_s, r.prompt_tokens, r.prefix_ids) for r in other] == [
        (r.arrival_s, r.prompt_tokens, r.prefix_ids) for r in base]
    faster = build_requests(synthetic(rate=10.0), seed=3, base_dir=tmp_path)  # overrides arrival.rate
    assert [2 * r.arrival_s for r in faster] == pytest.approx([r.arrival_s for r in base])


def test_synthetic_by_duration_with_gamma_and_empirical(tmp_path: Path) -> None:
    spec = synthetic(num_requests=None, duration_s=120.0, shared_prefix=None,
                     arrival={"process": "gamma", "rate": 20.0, "cv": 2.0},
                     output_tokens={"dist": "empirical", "trace": "bundled:azure-code"})
    requests = build_requests(spec, seed=0, base_dir=tmp_path)
    assert requests[-1].arrival_s < 120.0
    assert len(requests) == pytest.approx(2400, rel=0.15)
    code_outputs = {r.output_tokens for r in load_azure(bundled_trace_path("azure-code"))}
    assert {r.output_tokens for r in requests} <= code_outputs


def test_trace_rescaled_then_sliced(tmp_path: Path) -> None:
    spec = parse_workload({"trace": "bundled:azure-conv", "rate": 8.0}, "s.yaml")
    whole = build_requests(spec, seed=0, base_dir=tmp_path)
    assert len(whole) == 19_366 and mean_rate_per_s(whole) == pytest.approx(8.0)
    spec = parse_workload({"trace": "bundled:azure-conv", "rate": 8.0, "start_s": 100,
                           "duration_s": 600, "num_requests": 2000, "beam_width": 4}, "s.yaml")
    window = build_requests(spec, seed=0, base_dir=tmp_path)
    inside = [r for r in whole if 100 <= r.arrival_s < 700]
    assert len(window) == 2000 and window[0].arrival_s == 0.0
    assert [r.prompt_tokens for r in window] == [r.prompt_tokens for r in inside[:2000]]
    assert all(r.beam_width == 4 and r.n == 1 for r in window)
    doubled = build_requests(parse_workload({"trace": "bundled:azure-conv", "rate_scale": 2},
                                            "s.yaml"), seed=0, base_dir=tmp_path)
    assert mean_rate_per_s(doubled) == pytest.approx(2 * 5.53, abs=0.01)


def test_relative_trace_paths_and_options(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("at_ms,p,o\n0,5,1\n500,6,2\n")
    spec = parse_workload({"trace": "traces/t.csv", "columns": {"arrival": "at_ms", "prompt": "p",
                           "output": "o", "time_unit": "ms"}}, "s.yaml")
    requests = build_requests(spec, seed=0, base_dir=tmp_path)
    assert [(r.arrival_s, r.prompt_tokens) for r in requests] == [(0.0, 5), (0.5, 6)]
    with pytest.raises(KvplanError) as info:
        build_requests(parse_workload({"trace": "gone.csv"}, "s.yaml"), seed=0, base_dir=tmp_path)
    assert str(info.value) == (f"workload: trace file 'gone.csv' not found "
                               f"(looked for {tmp_path / 'gone.csv'})")
    with pytest.raises(KvplanError, match=r"^workload: unknown bundled trace 'azure' "):
        build_requests(parse_workload({"trace": "bundled:azure"}, "s.yaml"), seed=0, base_dir=tmp_path)


def test_max_model_len_policies_on_a_real_trace(tmp_path: Path) -> None:
    spec = parse_workload({"trace": "bundled:mooncake"}, "s.yaml")
    requests = build_requests(spec, seed=0, base_dir=tmp_path)
    over = sum(r.prompt_tokens + r.output_tokens > 32_768 for r in requests)
    assert over > 0  # build_requests leaves long requests to the policy
    cut = fit_to_max_model_len(requests, 32_768, "truncate")
    assert all(r.prompt_tokens + r.output_tokens <= 32_768 for r in cut.requests)
    assert [r.request_id for r in cut.requests] == list(range(len(cut.requests)))
    assert 3000 < len(cut.requests) < 3993
    assert cut.num_dropped + cut.num_truncated == cut.num_over_window == over
    kept = fit_to_max_model_len(requests, 32_768, "reject")
    assert kept.requests == requests and kept.num_rejected == over


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_request": 5},
         "chat.yaml: unknown key 'workload.num_request' — did you mean 'num_requests'?"),
        ({"prompt_tokens": {"dist": "lognormal", "mean": 0, "p99": 10}},
         "chat.yaml: workload.prompt_tokens.mean: Input should be greater than 0"),
        ({"prompt_tokens": {"dist": "lognormal", "mean": 10, "p99": 100, "mx": 9}},
         "chat.yaml: unknown key 'workload.prompt_tokens.mx' — did you mean 'max'?"),
        ({"prompt_tokens": {"dist": "lognorm", "mean": 10}},
         "chat.yaml: workload.prompt_tokens: unknown dist 'lognorm' — did you mean 'lognormal'?"),
        ({"arrival": {"process": "gama", "rate": 1, "cv": 2}},
         "chat.yaml: workload.arrival: unknown process 'gama' — did you mean 'gamma'?"),
        ({"arrival": {"rate": 1}}, "chat.yaml: workload.arrival: missing key 'process'"),
        ({"arrival": {"process": "gamma", "rate": 1}},
         "chat.yaml: workload.arrival.cv: missing required key"),
        ({"shared_prefix": {"groups": 2, "prefix_tokens": 64, "popularity": "zip"}},
         "chat.yaml: workload.shared_prefix.popularity: Input should be 'uniform' or 'zipf' "
         "(got 'zip') — did you mean 'zipf'?"),
        ({"prompt_tokens": {"dist": "lognormal", "mean": 100, "p99": 2000}},
         "chat.yaml: workload.prompt_tokens: lognormal p99 2000 must lie in (100, 1496.85] for mean 100"),
        ({"prompt_tokens": {"dist": "uniform", "low": 9, "high": 3}},
         "chat.yaml: workload.prompt_tokens: high 3 is below low 9"),
        ({"output_tokens": {"dist": "fixed", "value": 0}},
         "chat.yaml: workload.output_tokens.value: Input should be greater than or equal to 1"),
        ({"rate_scale": 2.0, "rate": 3.0},
         "chat.yaml: workload: give rate (mean req/s) or rate_scale (× the workload's own rate), not both"),
        ({"num_requests": None},
         "chat.yaml: workload: a synthetic workload needs num_requests or duration_s"),
        ({"start_s": 5}, "chat.yaml: workload: 'start_s' applies to a trace; this workload is synthetic"),
        ({"trace": "bundled:azure-conv"},
         "chat.yaml: workload: 'arrival' is for synthetic workloads; a trace brings its own"),
        ({"format": "azur", "trace": "x.csv"},
         "chat.yaml: workload.format: Input should be 'auto', 'azure', 'mooncake', 'burstgpt', 'csv' "
         "or 'jsonl' (got 'azur') — did you mean 'azure'?"),
    ],
)
def test_validation_errors(changes: dict[str, Any], message: str) -> None:
    data = yaml.safe_load(SYNTHETIC_YAML)["workload"]
    if "trace" in changes and "format" in changes:
        data = {}
    data.update(changes)
    with pytest.raises(KvplanError) as info:
        parse_workload(data, "chat.yaml")
    assert str(info.value) == message


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rate: float = 1.0


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workload: WorkloadSpec
    runs: list[Run] = []
    labels: dict[str, Run] = {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"workload": {"trace": "x.csv", "num_request": 5}},
         "chat.yaml: unknown key 'workload.num_request' — did you mean 'num_requests'?"),
        ({"workload": {"trace": "x.csv"}, "runs": [{"rate": 1}, {"rat": 2}]},
         "chat.yaml: unknown key 'runs[1].rat' — did you mean 'rate'?"),
        ({"workload": {"trace": "x.csv"}, "labels": {"a": {"rate": "fast"}}},
         "chat.yaml: labels.a.rate: Input should be a valid number, unable to parse string as a number"),
        ({"workload": {"trace": "x.csv"}, "worklaod": {}},
         "chat.yaml: unknown key 'worklaod' — did you mean 'workload'?"),
        ({"workload": {"trace": "x.csv"}, "zzz": 1},
         "chat.yaml: unknown key 'zzz' (known keys: workload, runs, labels)"),
    ],
)
def test_format_validation_error_is_generic(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Scenario.model_validate(data)
    assert str(format_validation_error(info.value, "chat.yaml", model=Scenario)) == message
