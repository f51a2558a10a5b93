"""``kvplan validate``: the command's outputs, its errors, and the error not regressing.

The regression test reruns the whole shipped table with the shipped defaults and compares the
mean absolute percentage error — overall, per metric group and per source — with what the fit
recorded when the defaults were written (``roofline_fit.json``): exactly, since the simulator is
deterministic. A change that moves any prediction makes the shipped constants the fit of another
simulator (as a stale file once gave an MoE efficiency of 0.2625 where a fresh fit gave 0.214):
refit with ``kvplan validate --fit --write``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.latency.constants import read_fit

def test_one_source_writes_the_table_the_summary_and_the_plot(tmp_path: Path, capsys) -> None:
    assert main(["validate", "--source", "vllm-ci", "--out", str(tmp_path), "--rows"]) == 0
    printed = capsys.readouterr().out
    assert "published vs predicted" in printed and "vllm-ci" in printed
    for name in ("validate.csv", "validate.json", "validate.png"):
        assert (tmp_path / name).stat().st_size > 0
    summary = json.loads((tmp_path / "validate.json").read_text())["summary"]
    assert summary["num_sources"] == 1 and summary["num_simulated"] >= 4
    lines = (tmp_path / "validate.csv").read_text().splitlines()
    assert lines[0].startswith("row_id,source,") and len(lines) == summary["num_rows"] + 1


@pytest.mark.parametrize(("argv", "message"), [
    (["validate", "--write"], "give --fit too"),
    (["validate", "--source", "nope", "-q"], "unknown source 'nope'"),
    (["validate", "--fit", "--write", "--source", "nim"], "whole shipped table"),
    (["validate", "--table", "missing.csv", "-q"], "not found"),
])
def test_bad_flags_are_one_line_errors(argv: list[str], message: str, capsys, tmp_path: Path) -> None:
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_shipped_defaults_give_what_their_fit_recorded(tmp_path: Path) -> None:
    # with architecture sets the published rows of their GPUs take them: the errors the
    # defaults give are recorded apart from the global fit's own (cmd.record_defaults_error)
    fit = read_fit()["fit"]
    recorded = fit.get("defaults_error") or fit["error"]
    assert main(["validate", "--out", str(tmp_path), "--no-plots", "-q"]) == 0
    summary = json.loads((tmp_path / "validate.json").read_text())["summary"]
    stale = "the simulator's predictions moved since the defaults were fitted: kvplan validate --fit --write"
    assert summary["num_simulated"] == recorded["num_rows_simulated"], stale
    now, then = summary["in_sample"], recorded["in_sample_mape"]
    assert now["overall"]["mape"] == pytest.approx(then["overall"], rel=1e-9), stale
    for group, value in then["by_metric"].items():
        assert now["by_metric"][group]["mape"] == pytest.approx(value, rel=1e-9), (group, stale)
    for source, value in then["by_source"].items():  # None: no row of the source simulated
        mape = now["by_source"][source]["mape"]
        assert mape == value if value is None else mape == pytest.approx(value, rel=1e-9), (source, stale)
