"""A rate on the command line replaces the scenario's, whichever way the file sets it.

``rate`` (mean req/s) and ``rate_scale`` (× the workload's own rate) are two ways to say one
thing, so a scenario may give only one; ``--rate R`` or ``--set workload.rate=R`` on a file with
``rate_scale`` (chat.yaml) must win, not fail, and ``--set workload.rate_scale=S`` must win over
a file's ``rate``. Both on one command line is the user's own conflict: one clear line.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.config.overrides import scenario_overrides
from simulator.config.scenario import load_scenario

CHAT = Path(__file__).resolve().parents[2] / "scenarios" / "chat.yaml"  # workload.rate_scale: 3.0


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"rate": 20.0}, {"workload.rate": 20.0, "workload.rate_scale": None}),
    ({"extra": ["workload.rate=20"]}, {"workload.rate": 20, "workload.rate_scale": None}),
    ({"extra": ["workload.rate_scale=2"]}, {"workload.rate_scale": 2, "workload.rate": None}),
    ({"extra": ["workload.arrival.rate=4"]}, {"workload.arrival.rate": 4, "workload.rate": None}),
    # given together on the command line: both kept, for the scenario check to refuse
    ({"rate": 20.0, "extra": ["workload.rate_scale=2"]}, {"workload.rate": 20.0, "workload.rate_scale": 2}),
    ({"num_requests": 5}, {"workload.num_requests": 5}),  # no rate: nothing cleared
])
def test_overrides(kwargs: dict, expected: dict) -> None:
    assert scenario_overrides(**kwargs) == expected


def test_a_cli_rate_replaces_the_files_rate_scale() -> None:
    scenario, _ = load_scenario(CHAT, scenario_overrides(rate=20.0))
    assert (scenario.workload.rate, scenario.workload.rate_scale) == (20.0, None)


def test_a_cli_rate_scale_replaces_the_files_rate(tmp_path: Path) -> None:
    path = tmp_path / "rated.yaml"
    path.write_text(CHAT.read_text().replace("rate_scale: 3.0", "rate: 8.0"))
    scenario, _ = load_scenario(path, scenario_overrides(extra=["workload.rate_scale=2"]))
    assert (scenario.workload.rate, scenario.workload.rate_scale) == (None, 2)


def simulate(capsys, *args: object) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["simulate", *map(str, args)])
    return rc, capsys.readouterr().err


def test_readme_usage_line_runs_and_sets_the_rate(tmp_path: Path, capsys) -> None:
    """README's own example, with fewer requests. The trace is rescaled as a whole to the mean
    rate, then its first requests taken: arrivals at 20 req/s come at half the times of 10 req/s."""
    outs = {}
    for name, how in (("rate", ("--rate", "20")), ("set", ("--set", "workload.rate=20")),
                      ("half", ("--rate", "10"))):
        out = tmp_path / name
        rc, err = simulate(capsys, CHAT, "--allocator", "paged", *how, "--num-requests", 100, "--seed", 1,
                           "--out", out, "--no-plots", "--quiet")
        assert rc == 0, err
        outs[name] = out
    arrivals = {k: pd.read_csv(out / "requests.csv")["arrival_s"].to_numpy() for k, out in outs.items()}
    assert arrivals["rate"] * 2 == pytest.approx(arrivals["half"], rel=1e-9, abs=1e-9)
    assert (outs["rate"] / "requests.csv").read_bytes() == (outs["set"] / "requests.csv").read_bytes()


def test_rate_and_rate_scale_together_on_the_command_line(tmp_path: Path, capsys) -> None:
    rc, err = simulate(capsys, CHAT, "--rate", 20, "--set", "workload.rate_scale=2", "--num-requests", 20,
                       "--out", tmp_path / "o", "--no-plots", "--quiet")
    assert rc == 2
    assert err == (f"kvplan: error: {CHAT}: workload: give rate (mean req/s) or rate_scale "
                   "(× the workload's own rate), not both\n")
