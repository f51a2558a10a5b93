"""The Python API (simulator/api): the same numbers as the commands, typed, and the same errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main
from simulator.errors import KvplanError, OutputError, RefusedError, ScenarioError

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """\
name: small
seed: 1
model: llama-3.1-8b
gpu: h100
allocators: [paged, contiguous-max]
max_model_len: 2048
latency: {model: roofline}
slo: {ttft_p99_s: 1.0, tpot_p99_s: 0.05}
workload:
  num_requests: 40
  arrival: {process: poisson, rate: 10}
  prompt_tokens: {dist: lognormal, mean: 300, p99: 1200, max: 1800}
  output_tokens: {dist: fixed, value: 16}
"""


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SCENARIO)
    return path


def test_simulate_gives_what_the_command_writes(scenario: Path, tmp_path: Path) -> None:
    result = api.simulate(scenario, block_size=32)
    assert main(["simulate", str(scenario), "--set", "block_size=32", "--out", str(tmp_path / "cli"),
                 "--quiet", "--no-plots"]) == 0
    written = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert json.loads(json.dumps(result.summaries, default=str)) == json.loads(json.dumps(written, default=str))
    # and the API's own folder is the command's, file for file
    out = result.write(tmp_path / "api", plots=False)
    for name in ("summary.json", "run.json", "requests.csv", "steps.csv"):
        assert (out / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


def test_the_summary_is_typed(scenario: Path) -> None:
    result = api.simulate(scenario)
    paged = result.summary["paged"]
    assert isinstance(paged, api.RunSummary)
    raw = result.summaries["paged"]
    assert paged.ttft.p99 == raw["ttft_s"]["p99"] and paged.tpot.p50 == raw["tpot_s"]["p50"]
    assert paged.completed + paged.rejected == 40
    assert paged.kv.capacity_tokens == raw["kv"]["kv_capacity_tokens"] > 0
    assert paged.saturated is raw["saturated"]


def test_tables_and_figures(scenario: Path) -> None:
    result = api.simulate(scenario, steps="full")
    assert set(result.requests["allocator"]) == {"paged", "contiguous-max"}
    assert len(result.requests) == 80
    assert result.steps["allocator"].iloc[0] == "paged" and len(result.steps) > 40
    fig = result.plot("kv_memory")
    assert fig.axes  # a drawn matplotlib figure
    with pytest.raises(KvplanError, match="unknown figure 'cdf'"):
        result.plot("cdf")
    assert result.headline.startswith(("Only", "No allocator", "Every", "paged", "contiguous"))


def test_overrides_by_keyword_and_by_dotted_key(scenario: Path) -> None:
    by_keyword = api.load(scenario, workload__num_requests=10, rate=5.0, allocators=["max"])
    assert by_keyword.scenario.workload.num_requests == 10
    assert by_keyword.scenario.workload.rate == 5.0  # as simulate --rate 5
    assert by_keyword.scenario.allocators == ("contiguous-max",)
    dotted = api.load(scenario, overrides={"workload.num_requests": 12})
    assert dotted.scenario.workload.num_requests == 12


def test_a_mapping_and_a_plan_simulate_too(scenario: Path) -> None:
    import yaml

    data = yaml.safe_load(SCENARIO)
    from_mapping = api.simulate(data)
    from_file = api.simulate(scenario)
    assert from_mapping.summaries == from_file.summaries
    plan = api.load(scenario)
    assert api.simulate(plan).summaries == from_file.summaries
    with pytest.raises(KvplanError, match="already resolved"):
        api.simulate(plan, block_size=32)


def test_errors_are_the_cli_lines_with_their_kind(scenario: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("block", "blok").replace("max_model_len: 2048", "blok_size: 16"))
    with pytest.raises(ScenarioError) as err:
        api.simulate(bad)
    assert main(["simulate", str(bad), "--quiet"]) == 2
    assert capsys.readouterr().err == f"kvplan: error: {err.value}\n"
    with pytest.raises(RefusedError, match="vLLM would refuse to start"):
        api.load(scenario, block_size=24)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="files kvplan did not write"):
        api.simulate(scenario).write(tmp_path / "taken")


def test_size() -> None:
    sized = api.size(model="llama-3.1-70b", gpu="h100", tp=4, kv_cache_dtype="fp8", seq_len=8192, batch=32)
    assert sized.bytes_per_token == 2 * 80 * 8 * 128 // 4  # β per rank: 2·L·H_kv·d_h·1 B / TP
    assert sized.capacity_tokens == sized.capacity.capacity_tokens > 0
    assert sized.as_dict()["total_bytes"] == sized.total_bytes
    assert "KV per token" in sized.table()
    with pytest.raises(KvplanError, match="unknown argument 'layer' — did you mean 'layers'"):
        api.size(layer=2)


def test_capacity(tmp_path: Path) -> None:
    path = tmp_path / "cap.yaml"
    path.write_text(SCENARIO.replace("allocators: [paged, contiguous-max]", "allocators: [paged]")
                    .replace("latency: {model: roofline}", "latency: {model: constant, step_s: 0.02}"))
    found = api.capacity(path, seeds=1, sweep={"block_size": [16, 32]})
    table = found.table
    assert list(table["knob.block_size"]) == [16, 32]
    assert (table["status"] == "ok").all() and (table["max_rate_req_s"] > 0).all()
    assert found.out_dir is None


def test_from_simulator_import_api_is_light() -> None:
    """A notebook's ``from simulator import api`` loads no engine until a function is used."""
    code = ("import sys; from simulator import api; "
            "print(any(m.startswith(('simulator.engine', 'pandas', 'matplotlib')) for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_api_names_stay_functions_once_the_commands_are_imported() -> None:
    """The modules behind the names (simulation, sizing, search) are named apart from them: a
    command importing ``simulator.api.simulation`` must not turn ``api.simulate`` into a module."""
    import simulator.api.search  # noqa: F401
    import simulator.api.simulation  # noqa: F401
    import simulator.api.sizing  # noqa: F401
    import simulator.commands.simulate  # noqa: F401

    assert callable(api.simulate) and callable(api.size) and callable(api.capacity)
