"""Warm starts: a rate search that starts at the previous search's bracket (search.run_chain),
the chains ``kvplan capacity`` forms (cmd.search_chains), and the answers they give.

The analytic scenario is test_search's: one-token requests served one at a time, every step
``STEP_S`` seconds, constant arrivals, so the TTFT p99 bound B puts the threshold at
``r* = 1 / (S − (B − S) / (0.99·(N − 1)))`` (derived there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity import cmd
from simulator.commands.capacity.search import (
    MAX_STEP,
    SearchResult,
    SearchTask,
    bracket_and_bisect,
    run_chain,
    warm_start,
)
from simulator.commands.capacity.sweep import read_capacity_scenario, resolve_points

STEP_S = 0.1
N = 100


def r_star(ttft_bound_s: float) -> float:
    return 1 / (STEP_S - (ttft_bound_s - STEP_S) / (0.99 * (N - 1)))


def analytic(ttft_bound_s: float) -> dict[str, Any]:
    return {
        "name": "analytic", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 1,
        "latency": {"model": "constant", "step_s": STEP_S},
        "workload": {"arrival": {"process": "constant", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 1}, "num_requests": N},
        "slo": {"ttft_p99_s": ttft_bound_s},
    }


def task(data: dict[str, Any], tolerance: float = 0.01) -> SearchTask:
    """A rate search from the analytic bound (no start rate): what a chain may warm-start."""
    return SearchTask(0, {**data, "allocators": ["paged"], "seed": 0}, "analytic.yaml", ".", "paged", 0,
                      None, tolerance, False, None)


def threshold(at: float, calls: list[float]) -> Any:
    def holds(rate: float) -> bool:
        calls.append(rate)
        return rate <= at
    return holds


# --- bracketing from a warm start -------------------------------------------------------------


def test_an_unmoved_bracket_is_confirmed_by_two_probes() -> None:
    calls: list[float] = []
    b = bracket_and_bisect(threshold(10.2, calls), 10.0, 0.05, step=10.4 / 10.0)
    assert calls == [10.0, pytest.approx(10.4)]
    assert b.lo_rate == 10.0 and b.hi_rate == pytest.approx(10.4)


def test_steps_from_a_moved_bracket_square_until_they_cross_it() -> None:
    """Up from 10 with a first step of 1.04: 10.4, then ×1.04² = 11.249, then ×1.04⁴ = 13.16,
    which fails at a threshold of 12: bisection then narrows [11.249, 13.16] to 5%."""
    calls: list[float] = []
    b = bracket_and_bisect(threshold(12.0, calls), 10.0, 0.05, step=1.04)
    assert calls[:4] == pytest.approx([10.0, 10.4, 10.4 * 1.04 ** 2, 10.4 * 1.04 ** 2 * 1.04 ** 4])
    assert b.hi_rate is not None and b.lo_rate <= 12.0 < b.hi_rate <= 1.05 * b.lo_rate
    # and down: 10 fails, 10 / 1.04, / 1.04², / 1.04⁴ = 7.60 passes at a threshold of 8
    calls = []
    b = bracket_and_bisect(threshold(8.0, calls), 10.0, 0.05, step=1.04)
    assert calls[:4] == pytest.approx([10.0, 10 / 1.04, 10 / 1.04 ** 3, 10 / 1.04 ** 7])
    assert b.hi_rate is not None and b.lo_rate <= 8.0 < b.hi_rate <= 1.05 * b.lo_rate


def test_the_step_grows_to_doubling_and_no_further() -> None:
    always = bracket_and_bisect(lambda r: True, 1.0, 0.05, max_doublings=4, step=1.5)
    assert always.rates == (1.0, 1.5, 3.0, 6.0, 12.0)  # ×1.5, then ×2.25 capped at ×2
    never = bracket_and_bisect(lambda r: False, 1.0, 0.05, max_halvings=3, step=1.5)
    assert never.rates == pytest.approx((1.0, 1 / 1.5, 1 / 3.0, 1 / 6.0))


@pytest.mark.parametrize("step, integer", [(1.0, False), (MAX_STEP * 1.01, False), (1.5, True)])
def test_bad_steps_are_refused(step: float, integer: bool) -> None:
    with pytest.raises(ValueError, match="step must be"):
        bracket_and_bisect(lambda r: True, 1.0, 0.05, integer=integer, step=step)


# --- where a chained search starts ------------------------------------------------------------


def result(lo: float, hi: float | None, search: str = "rate") -> SearchResult:
    return SearchResult(0, "paged", 0, lo, hi, (), None, search=search)


def test_warm_start_is_the_previous_bracket() -> None:
    assert warm_start(result(10.0, 10.4)) == (10.0, pytest.approx(1.04))


@pytest.mark.parametrize("after", [None, result(0.0, 1.0), result(10.0, None),
                                   result(10.0, 10.4, "concurrency")])
def test_nothing_to_start_from_starts_cold(after: SearchResult | None) -> None:
    assert warm_start(after) is None


def test_a_chain_confirms_an_unchanged_threshold_and_finds_a_moved_one() -> None:
    """The same point twice: the second search probes the first's bracket and stops there. Then a
    looser TTFT bound (0.3 s: r* from 10.05 to 10.21 req/s): it starts at the previous lo and
    still brackets its own threshold within the tolerance."""
    first, again, looser = run_chain([task(analytic(0.15)), task(analytic(0.15)), task(analytic(0.3))])
    assert first.hi_rate_req_s is not None and len(first.probes) > 2
    assert first.lo_rate_req_s <= r_star(0.15) < first.hi_rate_req_s
    assert [p.rate_req_s for p in again.probes] == [first.lo_rate_req_s, pytest.approx(first.hi_rate_req_s)]
    assert again.lo_rate_req_s == first.lo_rate_req_s
    assert again.hi_rate_req_s == pytest.approx(first.hi_rate_req_s)
    assert looser.probes[0].rate_req_s == again.lo_rate_req_s
    assert looser.hi_rate_req_s is not None
    assert looser.lo_rate_req_s <= r_star(0.3) < looser.hi_rate_req_s <= 1.01 * looser.lo_rate_req_s
    assert looser.bound == first.bound  # the ceiling is computed (and reported) all the same


# --- the chains kvplan capacity runs ------------------------------------------------------------


def sweep_file(tmp_path: Path, sweep: dict[str, list[Any]]) -> Path:
    path = tmp_path / "analytic.yaml"
    path.write_text(yaml.safe_dump({**analytic(0.15), "allocators": ["paged", "contiguous-max"],
                                    "sweep": sweep}))
    return path


def test_chains_run_along_the_last_knob_per_allocator(tmp_path: Path) -> None:
    """Points (gpu, block_size): (a100, 16), (a100, 32), (h100, 16), (h100, 32); two allocators
    each, so tasks 0..7 are (point 0, paged), (point 0, contiguous-max), (point 1, paged), ..."""
    sweep = {"gpu": ["a100-80gb", "h100"], "block_size": [16, 32]}
    file = read_capacity_scenario(sweep_file(tmp_path, sweep))
    points = resolve_points(file)
    tasks, _ = cmd._tasks(points, tmp_path, 1, 0.05, None, False, None)
    assert [(t.point_index, t.allocator) for t in tasks[:3]] == [(0, "paged"), (0, "contiguous-max"),
                                                                  (1, "paged")]
    assert cmd.search_chains(points, tasks, file.sweep, True) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert cmd.search_chains(points, tasks, file.sweep, False) == [[i] for i in range(8)]
    # a start rate the user gave is where every search starts: nothing to chain
    given, _ = cmd._tasks(points, tmp_path, 1, 0.05, 2.0, False, None)
    assert cmd.search_chains(points, given, file.sweep, True) == [[i] for i in range(8)]


def test_warm_and_cold_sweeps_give_the_same_rows_with_fewer_probes(tmp_path: Path) -> None:
    """max_num_seqs 1 and one-token requests: the block size changes nothing, so each point has
    the first one's threshold; chained, the second and third confirm its bracket in two probes."""
    path = sweep_file(tmp_path, {"block_size": [16, 32, 64]})
    bodies = {}
    for warm in (True, False):
        cmd.run_capacity(str(path), allocators=["paged"], num_seeds=1, jobs=1, plots_on=False,
                         use_cache=False, quiet=True, out=str(tmp_path / f"out-{warm}"), warm_start=warm)
        bodies[warm] = json.loads((tmp_path / f"out-{warm}" / "capacity.json").read_text())
    warm, cold = bodies[True], bodies[False]
    assert [r["max_rate_req_s"] for r in warm["rows"]] == [r["max_rate_req_s"] for r in cold["rows"]]
    cold_probes = [len(s["probes"]) for s in cold["searches"]]
    assert cold_probes[0] > 2 and len(set(cold_probes)) == 1
    assert [len(s["probes"]) for s in warm["searches"]] == [cold_probes[0], 2, 2]


def test_no_warm_start_on_the_command_line(tmp_path: Path) -> None:
    """``--no-warm-start``: the second point searches from its own bound, as the first did."""
    path = sweep_file(tmp_path, {"block_size": [16, 32]})
    parser = argparse.ArgumentParser(prog="kvplan")
    cmd.add_parser(parser.add_subparsers(dest="command"))
    probes = {}
    for flag in ((), ("--no-warm-start",)):
        out = tmp_path / f"out{len(flag)}"
        args = parser.parse_args(["capacity", str(path), "--allocator", "paged", "--jobs", "1",
                                  "--seeds", "1", "--no-plots", "--no-cache", "--quiet", "--out", str(out),
                                  *flag])
        assert args.func(args) == 0
        probes[flag] = [len(s["probes"]) for s in json.loads((out / "capacity.json").read_text())["searches"]]
    cold = probes[("--no-warm-start",)]
    assert cold[0] > 2 and cold == [cold[0], cold[0]]
    assert probes[()] == [cold[0], 2]
