"""Disaggregated layouts in `kvplan capacity --target-rate`: the smallest scale of each P:D ratio,
its GPUs and cost, cache re-use, the layouts' Pareto frontier, and bad ratios.

The analytic scenario of test_target_rate_cmd.py, with ``disaggregation:``: one sequence per
replica (``max_num_seqs: 1``), every step 0.1 s, prompts of 16 tokens, 4 output tokens, arrivals
exactly 1/R apart, a link with no latency and a bandwidth that makes every transfer ~0 s.

* A prefill replica runs the prompt in one step: 0.1 s per request, the first token at its end.
  Requests 1/R apart find a prefill replica free (TTFT 0.1 s ≤ 0.15 s) iff P/R ≥ 0.1, i.e.
  P ≥ ⌈0.1 R⌉; fewer, and the queue grows without bound.
* A decode replica gets the request with its prompt's KV, recomputes the last prompt token (a
  step that yields its first token) and decodes 3 more: 4 steps, 0.4 s (TPOT 0.1 s). It keeps up
  iff D ≥ ⌈0.4 R⌉; fewer, and E2E (0.1 + 0.4 = 0.5 s when nothing waits) grows past its 0.6 s
  bound.

So at ratio p:d the smallest scale is k = max(⌈0.1 R / p⌉, ⌈0.4 R / d⌉). At R = 13 (R chosen so
that no product is a whole number): 1:1 -> k = 6 (P6 D6), 1:4 -> k = 2 (P2 D8), 2:1 -> k = 6
(P12 D6); aggregated: ⌈0.4 × 13⌉ = 6 replicas (the aggregated request is 4 steps too).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity import disagg_search
from simulator.commands.capacity.pareto import frontier
from simulator.cli import main

PRICE_USD = 3.6  # --price h100=3.6: USD per GPU-hour
SCENARIO: dict[str, Any] = {
    "name": "analytic-disagg", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 1,
    "latency": {"model": "constant", "step_s": 0.1},
    "workload": {"arrival": {"process": "constant", "rate": 5.0},
                 "prompt_tokens": {"dist": "fixed", "value": 16},
                 "output_tokens": {"dist": "fixed", "value": 4}, "num_requests": 300},
    "slo": {"ttft_p99_s": 0.15, "e2e_p99_s": 0.6},
    # decode at TP 2: GPUs = P × 1 + D × 2 (the constant step time ignores TP)
    "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1, "tensor_parallel": 2},
                       "link": {"bandwidth_gb_s": 1e6}},
    "sweep": {"pd_ratio": ["agg", "1:1", "1:4", "2:1"]},
}
COMMON = ("--jobs", "1", "--quiet", "--seeds", "1", "--price", f"h100={PRICE_USD}")


def scenario_file(tmp_path: Path, **change: Any) -> Path:
    path = tmp_path / "analytic.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, **change}))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture
def count_disagg_probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Simulations a disaggregated probe starts: its prefill pass alone, and both pools."""
    calls = [0]
    for name in ("simulate", "simulate_disaggregated"):
        real = getattr(disagg_search, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls[0] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(disagg_search, name, counted)
    return calls


def test_smallest_scale_of_each_ratio(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["capacity", str(scenario_file(tmp_path)), "--target-rate", "13", *COMMON, "--out", str(out)]) == 0
    rows = {r["pool_ratio"] or "agg": r for r in read_csv(out / "capacity.csv")}
    got = {k: (r["layout"], r["prefill_replicas"], r["decode_replicas"], r["num_replicas"], r["num_gpus"])
           for k, r in rows.items()}
    assert got == {
        "agg": ("agg TP1 ×6", "", "", "6", "6"),
        "1:1": ("disagg P6×TP1 : D6×TP2", "6", "6", "12", "18"),
        "1:4": ("disagg P2×TP1 : D8×TP2", "2", "8", "10", "18"),
        "2:1": ("disagg P12×TP1 : D6×TP2", "12", "6", "18", "24"),
    }
    # cost: every GPU at the same price; tok/s/GPU = 13 req/s × 4 tokens / GPUs; per user 1 / 0.1 s
    assert float(rows["1:4"]["usd_per_hour"]) == pytest.approx(18 * PRICE_USD)
    assert float(rows["1:4"]["tok_s_per_gpu"]) == pytest.approx(13 * 4 / 18, rel=1e-3)
    assert float(rows["agg"]["tok_s_per_gpu"]) == pytest.approx(13 * 4 / 6, rel=1e-3)
    assert float(rows["1:1"]["tok_s_per_user"]) == pytest.approx(10.0, rel=1e-6)
    # each answer is exact: one scale fewer fails (on E2E: the decode pool falls behind)
    searches = json.loads((out / "capacity.json").read_text())["searches"]
    for s in searches:
        if s["pd_ratio"] is None:
            continue
        by_scale = {p["num_replicas"]: p for p in s["probes"]}
        k = s["num_replicas"]
        assert by_scale[k]["ok"]
        if k > 1:
            assert not by_scale[k - 1]["ok"]
    assert sorted(tuple(s["pd_ratio"]) for s in searches if s["pd_ratio"]) == [(1, 1), (1, 4), (2, 1)]
    # 1:4 starts at k₀ = ⌈13 / min(10 × 1, 2.5 × 4)⌉ = 2 (one prefill replica serves 10 req/s at
    # most, one decode replica 2.5); scale 1 has one prefill replica for 13 req/s: its TTFT fails
    # in the prefill pass, which stops early. 1:1 at scale 5 fails on the decode side (E2E), which
    # the prefill pass cannot see: it runs to the end.
    one_four = next(s for s in searches if s["pd_ratio"] == [1, 4])
    assert [(p["num_replicas"], p["ok"]) for p in one_four["probes"]] == [(2, True), (1, False)]
    assert one_four["probes"][1]["stopped_at_s"] is not None
    assert one_four["probes"][1]["failures"][0].startswith("TTFT p99 > 0.15 s")
    one_one = next(s for s in searches if s["pd_ratio"] == [1, 1])
    at_five = next(p for p in one_one["probes"] if p["num_replicas"] == 5)
    assert at_five["stopped_at_s"] is None and at_five["failures"][0].startswith("E2E p99")


def test_scenario_own_pools_give_the_ratio(tmp_path: Path) -> None:
    """Without the knob, ``disaggregation:``'s replicas 2:8 are the ratio 1:4, searched from scale 1."""
    pools = {**SCENARIO["disaggregation"], "prefill": {"replicas": 2}, "decode": {"replicas": 8}}
    path = scenario_file(tmp_path, disaggregation=pools, sweep={})
    out = tmp_path / "out"
    assert main(["capacity", str(path), "--target-rate", "6", *COMMON, "--out", str(out)]) == 0
    (row,) = read_csv(out / "capacity.csv")
    # R = 6: P ≥ ⌈0.6⌉ = 1, D ≥ ⌈2.4⌉ = 3: scale 1 of 1:4 (P1 D4) holds
    assert (row["pool_ratio"], row["layout"], row["num_gpus"]) == ("1:4", "disagg P1×TP1 : D4×TP1", "5")


def test_ratios_from_the_command_line(tmp_path: Path) -> None:
    """``--sweep pd_ratio=agg,1:4`` reads each ratio as text (YAML would read 1:4 as 64)."""
    out = tmp_path / "out"
    assert main(["capacity", str(scenario_file(tmp_path)), "--target-rate", "6", "--no-sweep",
                 "--sweep", "pd_ratio=agg,1:4", *COMMON, "--out", str(out)]) == 0
    # R = 6: ⌈0.4 × 6⌉ = 3 aggregated replicas; 1:4 at scale 1 (P1 D4: 1 + 4 × 2 GPUs) holds
    assert [(r["layout"], r["num_gpus"]) for r in read_csv(out / "capacity.csv")] == [
        ("agg TP1 ×3", "3"), ("disagg P1×TP1 : D4×TP2", "9")]


def test_rerun_makes_no_new_probe(tmp_path: Path, count_disagg_probes: list[int]) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    argv = ["capacity", str(path), "--target-rate", "6,13", *COMMON, "--out", str(out)]
    assert main(argv) == 0
    first = count_disagg_probes[0]
    first_csv = (out / "capacity.csv").read_text()
    assert first > 0
    assert main(argv) == 0
    assert count_disagg_probes[0] == first  # every probe came from the cache
    assert (out / "capacity.csv").read_text() == first_csv
    # the disaggregation spec is part of the key: another link is another probe
    changed = scenario_file(tmp_path, disaggregation={**SCENARIO["disaggregation"],
                                                      "link": {"bandwidth_gb_s": 1e6, "latency_s": 0.001}})
    assert main(["capacity", str(changed), "--target-rate", "6,13", *COMMON, "--out", str(out)]) == 0
    assert count_disagg_probes[0] > first


def test_frontier_of_hand_made_layouts() -> None:
    """Points (tokens/s per user, tokens/s per GPU): B dominates C (faster and more per GPU), A
    has the most per GPU, E the fastest streams; D is below A and slower than B."""
    points = {"A": (10.0, 100.0), "B": (20.0, 80.0), "C": (15.0, 70.0), "D": (12.0, 60.0), "E": (30.0, 20.0)}
    on = frontier([x for x, _ in points.values()], [y for _, y in points.values()])
    assert dict(zip(points, on)) == {"A": True, "B": True, "C": False, "D": False, "E": True}


def test_plots_agg_vs_disagg_and_pareto(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["capacity", str(scenario_file(tmp_path)), "--target-rate", "6,13", *COMMON,
                 "--out", str(out)]) == 0
    for name in ("gpus_vs_target.png", "agg_vs_disagg.png", "pareto_layouts.png"):
        assert (out / "plots" / name).read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(("ratio", "message"), [
    ("0:1", "pd_ratio expects 'agg' or P:D, prefill and decode replicas, each a whole number ≥ 1 "
            "(e.g. 1:2), got '0:1'"),
    ("-1:2", "pd_ratio expects 'agg' or P:D, prefill and decode replicas, each a whole number ≥ 1 "
             "(e.g. 1:2), got '-1:2'"),
    ("1:x", "pd_ratio expects 'agg' or P:D, prefill and decode replicas, each a whole number ≥ 1 "
            "(e.g. 1:2), got '1:x'"),
    (62, "pd_ratio 62: quote a P:D ratio in YAML (\"1:2\"), which reads 1:2 unquoted as the base-60 "
         "number 62"),
])
def test_bad_ratio_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          ratio: Any, message: str) -> None:
    path = scenario_file(tmp_path, sweep={"pd_ratio": ["agg", ratio]})
    out = tmp_path / "o"
    assert main(["capacity", str(path), "--target-rate", "6", *COMMON, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"kvplan: error: {path}: {message}\n"
    assert not out.exists()  # checked before anything ran or was written


def test_ratio_beyond_max_replicas_and_rate_search_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario_file(tmp_path)
    assert main(["capacity", str(path), "--target-rate", "6", "--max-replicas", "3", *COMMON,
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"kvplan: error: {path}: pd_ratio 1:4 needs more than "
                                       "--max-replicas 3 replicas in one pool\n")
    assert main(["capacity", str(path), *COMMON, "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("kvplan: error: pd_ratio is a knob of the GPU-count search: "
                                       "give --target-rate or --growth\n")
