"""Input that used to be misread in silence or end in a traceback: each is now one line (or a
warning that says what runs instead)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.cli import _guarded, _missing_backend, main
from simulator.config.deployment import build_deployment
from simulator.errors import KvplanError, KvplanWarning
from simulator.latency.profile import read_profile
from simulator.config.scenario import load_scenario, parse_scenario
from simulator.yamlfile import parse_yaml, read_yaml
from workloads.spec import build_requests, parse_workload, resolve_trace_path

SCENARIO = """\
model: llama-3.1-8b
gpu: h100
max_model_len: 4096
latency: {model: constant, step_s: 0.01}
workload:
  rate: inf
  num_requests: 4
  prompt_tokens: {dist: fixed, value: 32}
  output_tokens: {dist: fixed, value: 4}
"""


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def error(call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(KvplanError) as err:
        call(*args, **kwargs)
    return str(err.value)


# --- YAML files -----------------------------------------------------------------------------------


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    twice = SCENARIO.replace("gpu: h100\n", "gpu: h100\nblock_size: 16\ngpu: h200\n")
    path = write(tmp_path, "s.yaml", twice)
    assert error(load_scenario, path) == (
        f"{path}:4: not valid YAML (key 'gpu' is given twice, first on line 2)")
    nested = "workload:\n  rate: 1\n  n: 2\n  rate: 3\n"
    assert "key 'rate' is given twice, first on line 2" in error(parse_yaml, nested, "w.yaml")


def test_merge_keys_may_still_be_overridden() -> None:
    text = "base: &b {gpu: h100, block_size: 16}\nrun:\n  <<: *b\n  gpu: h200\n"
    assert parse_yaml(text, "s.yaml") == {"base": {"gpu": "h100", "block_size": 16},
                                          "run": {"gpu": "h200", "block_size": 16}}


def test_a_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", SCENARIO.encode().replace(b"gpu: h100\n", b"gpu: h100 # caf\xe9\n"))
    assert error(read_yaml, path, "scenario") == (
        f"{path}:2: not UTF-8 text (byte 0xe9); save the scenario file as UTF-8")


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("block_size", True, "block_size"), ("tensor_parallel", False, "tensor_parallel"),
    ("gpu_memory_utilization", True, "gpu_memory_utilization"), ("seed", True, "seed"),
    ("workload.num_requests", True, "workload.num_requests"),
    ("latency.step_s", True, "latency.step_s"),
    ("workload.prompt_tokens.value", True, "workload.prompt_tokens.value"),
])
def test_a_boolean_where_a_number_belongs_is_an_error(key: str, value: bool, shown: str) -> None:
    data = yaml.safe_load(SCENARIO)
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    assert error(parse_scenario, data, "s.yaml") == (
        f"s.yaml: {shown}: expected a number, got {str(value).lower()} (a YAML boolean)")


def test_booleans_stay_booleans_where_they_belong() -> None:
    scenario = parse_scenario({**yaml.safe_load(SCENARIO), "enable_prefix_caching": True,
                               "allow_refused": True}, "s.yaml")
    assert scenario.enable_prefix_caching and scenario.allow_refused


# --- profiles, backend commands -------------------------------------------------------------------

PROFILE = """\
kvplan_profile: 1
model: Llama-3.1-8B
tensor_parallel: {tp}
kv_cache_dtype: bfloat16
block_size: {block}
device: NVIDIA H100
gpu: H100-80GB
latency_model: {{form: linear-v1, coefficients_s: {{const: 4.0e-3}}}}
"""


@pytest.mark.parametrize(("tp", "block", "message"), [
    ("two", 16, "tensor_parallel must be a positive integer, got 'two'"),
    (1, "sixteen", "block_size must be a positive integer, got 'sixteen'"),
    (True, 16, "tensor_parallel must be a positive integer, got True"),
    (1, 0, "block_size must be a positive integer, got 0"),
])
def test_profile_fields_of_the_wrong_type(tmp_path: Path, tp: object, block: object, message: str) -> None:
    path = write(tmp_path, "p.yaml", PROFILE.format(tp=yaml.safe_dump(tp).split("\n")[0],
                                                    block=yaml.safe_dump(block).split("\n")[0]))
    assert error(read_profile, path) == f"{path}: {message}"
    good = read_profile(write(tmp_path, "ok.yaml", PROFILE.format(tp=2, block=32)))
    assert (good.tensor_parallel, good.block_size) == (2, 32)


def test_a_backend_command_without_torch_says_which_extra(capsys: pytest.CaptureFixture[str]) -> None:
    def needs_torch() -> int:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    assert _guarded(needs_torch, "fidelity") == 2
    err = capsys.readouterr().err
    assert err.startswith("kvplan: error: 'fidelity' runs the real backend, which needs torch")
    assert "pip install -e '.[backend]'" in err and err.count("\n") == 1

    def needs_something_else() -> int:
        raise ModuleNotFoundError("No module named 'nope'", name="nope")

    with pytest.raises(ModuleNotFoundError):  # a bug, not a missing extra: not disguised
        _guarded(needs_something_else, "simulate")
    # A backend module that fails to import when the parser is built says the same.
    run = _missing_backend("calibrate", ModuleNotFoundError("No module named 'triton'", name="triton"))
    assert error(run, None).startswith("'calibrate' runs the real backend, which needs triton")


# --- traces ---------------------------------------------------------------------------------------


def test_a_trace_path_that_is_a_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    assert error(resolve_trace_path, "traces", tmp_path) == (
        f"trace 'traces' is a directory ({tmp_path / 'traces'}), not a trace file")
    assert "not found" in error(resolve_trace_path, "nope.csv", tmp_path)


def test_more_requests_than_the_trace_holds_runs_fewer_and_says_so(tmp_path: Path) -> None:
    rows = "".join(f"2023-11-16 18:15:{s:02d}.0000000,100,10\n" for s in range(5))
    write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    spec = parse_workload({"trace": "t.csv", "num_requests": 50}, "s.yaml")
    with pytest.warns(KvplanWarning, match="num_requests asks for 50 requests, but the trace has"
                                           " only 5: running 5"):
        assert len(build_requests(spec, seed=0, base_dir=tmp_path)) == 5
    windowed = parse_workload({"trace": "t.csv", "num_requests": 50, "start_s": 1, "duration_s": 2},
                              "s.yaml")
    with pytest.warns(KvplanWarning, match="only 2 between 1 s and 3 s: running 2"):
        assert len(build_requests(windowed, seed=0, base_dir=tmp_path)) == 2


def test_warnings_print_as_one_line_on_the_command_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "s.yaml", SCENARIO.replace("max_model_len: 4096", "block_size: 8"))
    assert main(["simulate", str(path), "--quiet", "--no-plots", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"kvplan: warning: {path}: block_size 8: vLLM accepts it") and err.count("\n") == 1


# --- advice names the knob the user can edit --------------------------------------------------------


def test_sizing_errors_name_scenario_keys_in_scenarios_and_flags_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**yaml.safe_load(SCENARIO), "model": "llama-3.1-70b"}
    message = error(build_deployment, parse_scenario(data, "s.yaml"), tmp_path, where="s.yaml")
    assert message.startswith("s.yaml: Llama-3.1-70B weights") and message.endswith("raise tensor_parallel")
    assert "tensor_parallel 3 does not divide" in error(
        build_deployment, parse_scenario({**data, "tensor_parallel": 3}, "s.yaml"), tmp_path)
    assert main(["size", "--model", "llama-3.1-70b", "--gpu", "h100"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("raise --tp")
