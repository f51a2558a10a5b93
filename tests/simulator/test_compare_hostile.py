"""Hostile result files and flags for ``kvplan compare`` and ``kvplan calibrate --from-results``.

Table-driven: a change to one of the example results of tests/data/compare/ (or a flag) → the one
line the command answers, naming the file and the field, exit 2 — or what it reads instead. The
three readers (vllm bench serve JSON, GuideLLM report, fidelity.json) refuse the same things
through one checker: NaN, Infinity where the tool never writes it, absurd magnitudes, 0 where a
count or a rate must be positive, fractions where a count belongs.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from backend.cli import add_calibrate_parser
from simulator.cli import main
from simulator.commands.compare import against
from simulator.commands.compare import cmd as compare_cmd
from simulator.commands.compare.results import read_result
from simulator.errors import KvplanError

DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
SCENARIO = str(DATA / "scenario.yaml")
VLLM = json.loads((DATA / "vllm-bench.json").read_text())
GUIDELLM = json.loads((DATA / "guidellm-sweep.json").read_text())
FIDELITY = json.loads((DATA / "fidelity.json").read_text())
INF, NAN = math.inf, math.nan


def _vllm(**changes: Any) -> dict[str, Any]:
    return {**VLLM, **changes}


def _guidellm(path: str, value: Any) -> dict[str, Any]:
    """The sweep's first benchmark alone, with the value at the dotted ``path`` (in
    ``benchmarks[0]``) replaced."""
    report = copy.deepcopy(GUIDELLM)
    report["benchmarks"] = report["benchmarks"][:1]
    node = report["benchmarks"][0]
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return report


def _fidelity(metric: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(FIDELITY)
    out["allocators"]["paged"]["metrics"][metric]["measured"] = value
    return out


def _write(tmp_path: Path, content: dict[str, Any]) -> str:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(content))  # json writes NaN and Infinity as the tools' files hold them
    return str(path)


# (name, file content, the field the error names, what the error says about it)
REFUSED = [
    ("vllm Infinity latency", _vllm(mean_ttft_ms=INF), "mean_ttft_ms", "is Infinity, not a finite number"),
    ("vllm NaN latency", _vllm(p99_tpot_ms=NAN), "p99_tpot_ms", "is NaN, not a number"),
    ("vllm 1e308 latency", _vllm(median_e2el_ms=1e308), "median_e2el_ms", "beyond any real benchmark run"),
    ("vllm 1e308 throughput", _vllm(output_throughput=1e308), "output_throughput", "beyond any real"),
    ("vllm 'inf' throughput", _vllm(request_throughput="inf"), "request_throughput", "is 'inf', not a number"),
    ("vllm negative latency", _vllm(mean_itl_ms=-1.0), "mean_itl_ms", "not a non-negative number"),
    ("vllm completed 0", _vllm(completed=0), "completed", "is 0: no request of the run completed"),
    ("vllm num_prompts 0", _vllm(num_prompts=0), "num_prompts", "is 0; it must be positive"),
    ("vllm num_prompts 2.5", _vllm(num_prompts=2.5), "num_prompts", "not a whole number"),
    ("vllm num_prompts 1e308", _vllm(num_prompts=1e308), "num_prompts", "beyond any real benchmark run"),
    ("vllm completed > sent", _vllm(completed=300), "completed", "more than 'num_prompts' 200"),
    ("vllm max_concurrency 0", _vllm(max_concurrency=0), "max_concurrency", "is 0; it must be positive"),
    ("vllm request_rate 0", _vllm(request_rate=0), "request_rate", "is 0; it must be positive"),
    ("vllm burstiness 0", _vllm(burstiness=0), "burstiness", "is 0; it must be positive"),
    ("vllm request_rate NaN", _vllm(request_rate=NAN), "request_rate", "is NaN"),
    ("vllm total tokens 1e308", _vllm(total_input_tokens=1e308), "total_input_tokens", "beyond any real"),
    ("guidellm metrics {}", _guidellm("metrics", {}), "metrics", "holds no latency or throughput"),
    ("guidellm NaN mean", _guidellm("metrics.time_to_first_token_ms.successful.mean", NAN),
     "metrics.time_to_first_token_ms.successful.mean", "is NaN, not a number"),
    ("guidellm Infinity p99", _guidellm("metrics.request_latency.successful.percentiles.p99", INF),
     "metrics.request_latency.successful.percentiles.p99", "is Infinity"),
    ("guidellm 1e308 throughput", _guidellm("metrics.output_tokens_per_second.successful.mean", 1e308),
     "metrics.output_tokens_per_second.successful.mean", "beyond any real benchmark run"),
    ("guidellm string mean", _guidellm("metrics.inter_token_latency_ms.successful.median", "fast"),
     "metrics.inter_token_latency_ms.successful.median", "is 'fast', not a number"),
    ("guidellm no success", _guidellm("metrics.request_totals.successful", 0),
     "metrics.request_totals.successful", "is 0: no request of the benchmark completed"),
    ("guidellm total 0", _guidellm("metrics.request_totals.total", 0), "metrics.request_totals.total",
     "is 0; it must be positive"),
    ("guidellm streams 0", _guidellm("config.strategy.streams", 0), "streams", "is 0; it must be positive"),
    ("guidellm streams 1.5", _guidellm("config.strategy.streams", 1.5), "streams", "not a whole number"),
    ("guidellm rate 0", _guidellm("config.strategy", {"type_": "constant", "rate": 0}), "rate",
     "is 0; it must be positive"),
    ("guidellm rate Infinity", _guidellm("config.strategy", {"type_": "poisson", "rate": INF}), "rate",
     "is Infinity"),
    ("fidelity NaN", _fidelity("ttft_s.mean", NAN), "allocators.paged.metrics.ttft_s.mean.measured", "is NaN"),
    ("fidelity 1e308", _fidelity("throughput_tok_s", 1e308),
     "allocators.paged.metrics.throughput_tok_s.measured", "beyond any real benchmark run"),
]


@pytest.mark.parametrize(("content", "field", "says"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_hostile_result_is_one_line_naming_the_file_and_the_field(tmp_path: Path, content: dict[str, Any],
                                                                    field: str, says: str) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(KvplanError) as err:
        read_result(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(path), message
    assert f"'{field}'" in message or f"{field} " in message, message
    assert says in message, message


# the same refusals through the commands: exit 2, one line on stderr, the result file (not the
# scenario) blamed — a rate of 0 is the result's, not the scenario's
COMMAND_CASES = [
    ("request_rate 0", _vllm(request_rate=0), "'request_rate' is 0"),
    ("burstiness 0", _vllm(burstiness=0), "'burstiness' is 0"),
    ("Infinity", _vllm(mean_ttft_ms=INF), "'mean_ttft_ms' is Infinity"),
    ("num_prompts 1e9", _vllm(num_prompts=10**9),
     "'num_prompts' is 1,000,000,000: more requests than kvplan simulates for one result "
     "(at most 100,000; --max-requests N simulates more)"),
    ("request total 1e9", _guidellm("metrics.request_totals.total", 10**9),
     "'metrics.request_totals.total' is 1,000,000,000: more requests"),
]


@pytest.mark.parametrize("command", ["compare", "calibrate"])
@pytest.mark.parametrize(("content", "says"), [c[1:] for c in COMMAND_CASES], ids=[c[0] for c in COMMAND_CASES])
def test_the_commands_answer_one_line_and_blame_the_result(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           command: str, content: dict[str, Any],
                                                           says: str) -> None:
    path = _write(tmp_path, content)
    argv = (["compare", path, "--against", SCENARIO] if command == "compare"
            else ["calibrate", "--from-results", path, "--scenario", SCENARIO])
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvplan: error: {path}: "), err
    assert says in err[0] and "scenario.yaml" not in err[0], err[0]
    assert not (tmp_path / "out").exists()  # refused before anything was simulated or written


@pytest.mark.parametrize("command", ["compare", "calibrate"])
def test_max_requests_lowers_or_lifts_the_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              command: str) -> None:
    path = _write(tmp_path, _vllm())  # 200 requests sent
    argv = (["compare", path, "--against", SCENARIO] if command == "compare"
            else ["calibrate", "--from-results", path, "--scenario", SCENARIO])
    assert main([*argv, "--max-requests", "199", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'num_prompts' is 200: more requests" in err[0] and "at most 199;" in err[0]
    assert main([*argv, "--max-requests", "0", "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == "kvplan: error: --max-requests must be at least 1, got 0"


def test_a_rate_over_the_scenarios_duration_is_capped_too(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # the result records no count: its rate over the scenario's duration_s says how many
    result = {k: v for k, v in _vllm(request_rate=1000.0).items() if k != "num_prompts"}
    scenario = tmp_path / "long.yaml"
    scenario.write_text((DATA / "scenario.yaml").read_text().replace("num_requests: 200", "duration_s: 3600"))
    path = _write(tmp_path, result)
    assert main(["compare", path, "--against", str(scenario), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvplan: error: {path}: 'request_rate' 1000 req/s over ")
    assert "workload.duration_s 3600 s is 3,600,000 requests" in err[0]


def test_goodput_given_twice_is_refused_before_simulating(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["compare", str(DATA / "vllm-bench.json"), "--against", SCENARIO, "--goodput", "ttft:500",
                 "tpot:50", "ttft:300", "--out", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kvplan: error: --goodput: 'ttft' is given twice (ttft:500, ttft:300); give each SLO once")
    assert not out.exists()


# what the tools do write, read as they mean it
READ = [
    ("vllm --request-rate inf", _vllm(request_rate="inf"), {"rate": INF, "arrival": None}),
    ("vllm --burstiness inf", _vllm(burstiness=INF), {"rate": 4.0, "burstiness": INF, "arrival": "constant"}),
    ("vllm gamma", _vllm(burstiness=0.5), {"arrival": "gamma", "burstiness": 0.5}),
    ("vllm no cap", _vllm(max_concurrency=None), {"max_concurrency": None, "num_requests": 200}),
    ("vllm a cap", _vllm(max_concurrency=16), {"max_concurrency": 16}),
    ("vllm latency 0 (no streaming)", _vllm(mean_ttft_ms=0.0), {"num_requests": 200}),
]


@pytest.mark.parametrize(("content", "load"), [c[1:] for c in READ], ids=[c[0] for c in READ])
def test_what_the_tools_write_is_read(tmp_path: Path, content: dict[str, Any], load: dict[str, Any]) -> None:
    result = read_result(_write(tmp_path, content))
    for key, value in load.items():
        assert getattr(result.load, key) == value, key


def test_the_cap_is_one_number_wherever_it_is_stated() -> None:
    assert compare_cmd.DEFAULT_MAX_REQUESTS == against.DEFAULT_MAX_REQUESTS  # repeated there to import less
    calibrate = add_calibrate_parser(argparse.ArgumentParser().add_subparsers())
    helps = [a.help for a in calibrate._actions if "--max-requests" in a.option_strings]
    assert helps and f"default {against.DEFAULT_MAX_REQUESTS:,}" in helps[0]
