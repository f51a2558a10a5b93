"""``kvplan validate``: the command's outputs, its errors, and the error not regressing.

The regression test reruns the whole shipped table with the shipped defaults and compares the
mean absolute percentage error per metric group with what the fit recorded when the defaults
were written (``roofline_fit.json``), plus a margin: a baseline, not a target.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.latency.constants import read_fit

MARGIN = 0.02  # absolute MAPE points a change may cost before this test asks for a refit


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


def test_the_shipped_defaults_do_not_regress(tmp_path: Path) -> None:
    recorded = read_fit()["fit"]["error"]
    assert main(["validate", "--out", str(tmp_path), "--no-plots", "-q"]) == 0
    summary = json.loads((tmp_path / "validate.json").read_text())["summary"]
    assert summary["num_simulated"] >= recorded["num_rows_simulated"]
    now = summary["in_sample"]
    assert now["overall"]["mape"] <= recorded["in_sample_mape"]["overall"] + MARGIN
    for group, baseline in recorded["in_sample_mape"]["by_metric"].items():
        assert now["by_metric"][group]["mape"] <= baseline + MARGIN, group
