"""`kvplan capacity --target-rate/--growth` end to end: table, files, cache, errors, determinism.

The scenario is the analytic one of test_target_rate_search.py: one sequence per replica, every
step 0.1 s, 4 output tokens, so a replica serves 2.5 req/s and R req/s need ⌈R × 0.4⌉ replicas
(that module's docstring derives it). Swept over two tensor-parallel sizes, so GPUs = replicas ×
TP differ while the replicas do not (the constant step time ignores TP).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity import cmd, search
from simulator.cli import main

PRICE_USD = 3.6  # --price h100=3.6: USD per GPU-hour
SCENARIO: dict[str, Any] = {
    "name": "analytic", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 1,
    "latency": {"model": "constant", "step_s": 0.1},
    "workload": {"arrival": {"process": "constant", "rate": 5.0},
                 "prompt_tokens": {"dist": "fixed", "value": 16},
                 "output_tokens": {"dist": "fixed", "value": 4}, "num_requests": 300},
    "slo": {"ttft_p99_s": 0.15},
    "sweep": {"tensor_parallel": [1, 2]},
}
# one seed: constant arrivals and fixed lengths draw nothing (the seeds' spread is covered by
# test_seeds_give_the_range below)
COMMON = ("--jobs", "1", "--quiet", "--seeds", "1", "--price", f"h100={PRICE_USD}")


def scenario_file(tmp_path: Path, **change: Any) -> Path:
    path = tmp_path / "analytic.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, **change}))
    return path


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvplan")
    cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["capacity", *argv])
    return int(args.func(args))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture
def count_simulations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = search.simulate

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "simulate", counted)
    return calls


def test_table_columns_answers_and_cost(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(str(scenario_file(tmp_path)), "--target-rate", "6,23.5", *COMMON, "--out", str(out)) == 0
    rows = read_csv(out / "capacity.csv")
    assert list(rows[0]) == [
        "point", "tensor_parallel", "allocator", "target_rate_req_s", "status", "layout", "layout_kind",
        "num_replicas", "replicas_ci_low", "replicas_ci_high", "num_gpus", "gpus_per_replica",
        "bound_replicas", "max_replicas", "usd_per_hour", "usd_per_m_output_tokens",
        "price_usd_per_gpu_hour", "rate_per_gpu_req_s", "ttft_p99_s", "tpot_p99_s", "throughput_tok_s",
        "goodput_req_s", "limited_by", "kv_used_peak", "num_seeds", "num_probes", "window_s", "message",
        "window_note", "max_gpus", "prefill_replicas", "decode_replicas", "tok_s_per_gpu", "tok_s_per_user",
        "pool_ratio", "setup", "router"]
    got = [(r["point"], r["target_rate_req_s"], r["status"], r["num_replicas"], r["num_gpus"]) for r in rows]
    # ⌈6 × 0.4⌉ = 3 and ⌈23.5 × 0.4⌉ = 10 replicas, of 1 and then 2 GPUs each
    assert got == [("0", "6", "ok", "3", "3"), ("0", "23.5", "ok", "10", "10"),
                   ("1", "6", "ok", "3", "6"), ("1", "23.5", "ok", "10", "20")]
    for r in rows:
        gpus, rate = int(r["num_gpus"]), float(r["target_rate_req_s"])
        assert float(r["usd_per_hour"]) == pytest.approx(PRICE_USD * gpus)
        assert float(r["rate_per_gpu_req_s"]) == pytest.approx(rate / gpus, rel=1e-5)
        assert float(r["ttft_p99_s"]) == pytest.approx(0.1)  # at the answer nobody waits
        # every request generates 4 tokens at R req/s: $/M tok = $/h / (3600 × 4R) × 1e6
        usd_per_m = PRICE_USD * gpus / (3600 * 4 * rate) * 1e6
        assert float(r["usd_per_m_output_tokens"]) == pytest.approx(usd_per_m, rel=1e-3)
    report = json.loads((out / "capacity.json").read_text())
    assert len(report["searches"]) == 4 and report["searches"][1]["num_replicas"] == 10
    assert [p["num_replicas"] for p in report["searches"][1]["probes"]] == [10, 9]
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["cost_per_hour.png", "gpus_vs_target.png",
                                                                 "pareto_layouts.png"]


def test_rerun_hits_the_cache(tmp_path: Path, count_simulations: list[int]) -> None:
    out = tmp_path / "out"
    argv = (str(scenario_file(tmp_path)), "--target-rate", "23.5", *COMMON, "--out", str(out), "--no-plots")
    assert run(*argv) == 0
    first = count_simulations[0]
    assert first > 0 and len(list((out / "cache").glob("*.json"))) == first
    table = (out / "capacity.csv").read_bytes()
    assert run(*argv) == 0
    assert count_simulations[0] == first  # no new probe
    assert (out / "capacity.csv").read_bytes() == table


def test_results_are_deterministic_across_runs_and_executors(tmp_path: Path) -> None:
    path = str(scenario_file(tmp_path))
    files = []
    for name, jobs in (("a", "1"), ("b", "1"), ("c", "2")):
        out = tmp_path / name
        assert run(path, "--target-rate", "6,23.5", "--jobs", jobs, "--quiet", "--no-cache",
                   "--out", str(out)) == 0
        files.append(((out / "capacity.csv").read_bytes(), (out / "capacity.json").read_bytes(),
                      (out / "plots" / "gpus_vs_target.png").read_bytes()))
    assert files[0] == files[1] == files[2]


def test_a_target_above_max_replicas_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(str(scenario_file(tmp_path)), "--target-rate", "23.5", "--max-replicas", "4", "--jobs", "1",
               "--price", "h100=3.6", "--no-plots", "--out", str(out), "--no-sweep") == 0
    (row,) = read_csv(out / "capacity.csv")
    assert row["status"] == "over-max" and row["num_replicas"] == "" and row["num_gpus"] == ""
    assert row["message"].startswith("cannot hold 23.5 req/s with up to 4 replicas (4 GPUs): "
                                     "at 4, TTFT p99 > 0.15 s")
    printed = capsys.readouterr().out
    assert "point 0 paged over-max: cannot hold 23.5 req/s" in printed


def test_growth_multiplies_the_workloads_own_rate(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # the workload's own rate is 5 req/s: growth 2.2 is 11 req/s, ⌈11 × 0.4⌉ = 5 replicas
    assert run(str(scenario_file(tmp_path)), "--growth", "2.2", "--target-rate", "6", *COMMON, "--no-plots",
               "--no-sweep", "--out", str(out)) == 0
    assert [(r["target_rate_req_s"], r["num_replicas"]) for r in read_csv(out / "capacity.csv")] == [
        ("6", "3"), ("11", "5")]


def test_table_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(str(scenario_file(tmp_path)), "--target-rate", "6", "--jobs", "1", "--no-plots", "--out",
        str(tmp_path / "o"))
    out = capsys.readouterr().out
    assert "fewest replicas that hold the target rate under the SLO — target 6 req/s" in out
    assert "GPUs" in out and "$/h" in out and "capacity.csv" in out


@pytest.mark.parametrize("policy", ["round-robin", "least-outstanding"])
def test_the_footer_names_the_router_that_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              policy: str) -> None:
    path = scenario_file(tmp_path, router={"policy": policy})
    run(str(path), "--target-rate", "6", "--jobs", "1", "--seeds", "1", "--no-plots", "--no-sweep",
        "--out", str(tmp_path / "o"))
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap the line
    assert f"replicas: data-parallel copies of the TP group, {policy} routing;" in out
    assert {r["router"] for r in read_csv(tmp_path / "o" / "capacity.csv")} == {policy}


def test_the_footer_names_each_router_of_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario_file(tmp_path, sweep={"router.policy": ["round-robin", "least-outstanding"]})
    run(str(path), "--target-rate", "6", "--jobs", "1", "--seeds", "1", "--no-plots", "--out",
        str(tmp_path / "o"))
    out = " ".join(capsys.readouterr().out.split())
    assert ("routing per point (capacity.csv's router column): round-robin, least-outstanding;"
            in out)


EXPECTS = "expects positive numbers (comma-separated or repeated), got"


@pytest.mark.parametrize(("argv", "message"), [
    (("--target-rate=-5",), f"--target-rate {EXPECTS} '-5'"),
    (("--target-rate", "0"), f"--target-rate {EXPECTS} '0'"),
    (("--target-rate", "10,fast"), f"--target-rate {EXPECTS} 'fast'"),
    (("--target-rate", "10,"), f"--target-rate {EXPECTS} ''"),
    (("--target-rate", "inf"), f"--target-rate {EXPECTS} 'inf'"),
    (("--growth", "0"), f"--growth {EXPECTS} '0'"),
    (("--growth=-1.5",), f"--growth {EXPECTS} '-1.5'"),
    (("--growth", "nan"), f"--growth {EXPECTS} 'nan'"),
    (("--growth", "x2"), f"--growth {EXPECTS} 'x2'"),
    (("--target-rate", "5", "--max-replicas", "0"), "--max-replicas must be at least 1, got 0"),
    (("--target-rate", "5", "--search", "concurrency"),
     "--target-rate and --growth search replicas at a rate: not with --search concurrency"),
    (("--target-rate", "5", "--sweep", "num_replicas=1,2"),
     "num_replicas cannot be swept with --target-rate: it is what the search finds"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          argv: tuple[str, ...], message: str) -> None:
    path = scenario_file(tmp_path)
    assert main(["capacity", str(path), "--quiet", "--jobs", "1", "--out", str(tmp_path / "o"), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"kvplan: error: {message}\n"
    assert not (tmp_path / "o").exists()  # checked before anything ran or was written


def test_seeds_give_the_range(tmp_path: Path) -> None:
    """Poisson arrivals: each seed's requests need their own count; the row holds every seed's
    traffic (the most any needed) and the range spans the seeds' answers."""
    poisson = {**SCENARIO["workload"], "arrival": {"process": "poisson", "rate": 5.0}}
    path = scenario_file(tmp_path, workload=poisson)
    out = tmp_path / "out"
    assert run(str(path), "--target-rate", "6", "--seeds", "3", "--jobs", "1", "--quiet", "--no-plots",
               "--no-sweep", "--out", str(out)) == 0
    (row,) = read_csv(out / "capacity.csv")
    answers = [s["num_replicas"] for s in json.loads((out / "capacity.json").read_text())["searches"]]
    assert len(answers) == 3 and row["num_seeds"] == "3"
    assert (int(row["replicas_ci_low"]), int(row["num_replicas"])) == (min(answers), max(answers))
    # 2 replicas serve 5 req/s < 6 at best: no seed holds with fewer than 3
    assert int(row["replicas_ci_high"]) == max(answers) and min(answers) >= 3
