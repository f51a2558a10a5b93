"""`kvplan capacity` end to end through a real argparse parser: outputs, cache resume, errors."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity import cmd, plots, search
from simulator.errors import KvplanError

SCENARIO: dict[str, Any] = {
    "name": "tiny", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 2,
    "allocators": ["paged", "contiguous-max"],
    "latency": {"model": "constant", "step_s": 0.02},
    "workload": {"arrival": {"process": "poisson", "rate": 5.0},
                 "prompt_tokens": {"dist": "fixed", "value": 32},
                 "output_tokens": {"dist": "uniform", "low": 1, "high": 6}, "num_requests": 40},
    "slo": {"ttft_p99_s": 0.3, "tpot_p99_s": 0.1},
}


def scenario_file(tmp_path: Path, **change: Any) -> Path:
    data = {k: v for k, v in {**SCENARIO, **change}.items() if v is not None}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvplan")
    cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["capacity", *argv])
    return int(args.func(args))


@pytest.fixture
def count_simulations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = search.simulate

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "simulate", counted)
    return calls


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_sweep_with_cache_resume(tmp_path: Path, count_simulations: list[int]) -> None:
    path = scenario_file(tmp_path, sweep={"block_size": [16, 32]})
    out = tmp_path / "out"
    argv = (str(path), "--seeds", "2", "--jobs", "1", "--out", str(out), "--quiet", "--tolerance", "0.1")
    assert run(*argv) == 0
    first = count_simulations[0]
    assert first > 0 and len(list((out / "cache").glob("*.json"))) == first
    rows = read_csv(out / "capacity.csv")
    assert [(r["point"], r["block_size"], r["allocator"]) for r in rows] == [
        ("0", "16", "paged"), ("0", "16", "contiguous-max"),
        ("1", "32", "paged"), ("1", "32", "contiguous-max")]
    assert all(r["status"] == "ok" and float(r["max_rate_req_s"]) > 0 and r["num_seeds"] == "2" for r in rows)
    assert all(float(r["rate_ci_low_req_s"]) <= float(r["max_rate_req_s"]) <= float(r["rate_ci_high_req_s"])
               for r in rows)
    report = json.loads((out / "capacity.json").read_text())
    assert len(report["searches"]) == 8 and len(report["rows"]) == 4
    pngs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png"))
    assert pngs == ["plots/capacity_vs_block_size.png", "plots/points/000.png", "plots/points/001.png"]
    csv_before = (out / "capacity.csv").read_bytes()

    assert run(*argv) == 0  # resumes from the cache: no simulation at all, the same table
    assert count_simulations[0] == first
    assert (out / "capacity.csv").read_bytes() == csv_before

    assert run(*argv, "--no-cache") == 0
    assert count_simulations[0] == 2 * first
    assert (out / "capacity.csv").read_bytes() == csv_before


def test_interrupted_run_resumes_where_it_stopped(tmp_path: Path, count_simulations: list[int]) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    argv = (str(path), "--seeds", "1", "--jobs", "1", "--out", str(out), "--quiet", "--no-plots")
    assert run(*argv) == 0
    total = count_simulations[0]
    table, report = (out / "capacity.csv").read_bytes(), (out / "capacity.json").read_bytes()
    files = sorted((out / "cache").glob("*.json"))
    assert len(files) == total
    for f in files[: total // 2]:
        f.unlink()  # as if the run had stopped half way
    files[-1].write_text("{half a fi")  # and torn one file
    assert run(*argv) == 0
    # only the missing probes run again (fewer when a probe with KV data stands in for a lean one)
    assert 0 < count_simulations[0] - total <= total // 2 + 1
    assert (out / "capacity.csv").read_bytes() == table
    assert (out / "capacity.json").read_bytes() == report  # every probe as a fresh run has it


def test_failed_point_keeps_the_others(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    # a distinct exit status says that a point failed; the table is written all the same
    assert run(str(path), "--sweep", "model=llama-3.1-8b,llama-3.1-70b", "--allocator", "paged",
               "--seeds", "1", "--jobs", "1", "--out", str(out), "--quiet", "--no-plots") == 3
    ok, failed = read_csv(out / "capacity.csv")
    assert ok["model"] == "llama-3.1-8b" and ok["status"] == "ok"
    assert failed["model"] == "llama-3.1-70b" and failed["status"] == "failed"
    assert "weights" in failed["message"]


def test_sweeping_allocators(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    run(str(path), "--sweep", "allocators=max,paged", "--seeds", "1", "--jobs", "1", "--out", str(out),
        "--quiet", "--no-plots")
    rows = read_csv(out / "capacity.csv")
    assert [(r["point"], r["allocator"]) for r in rows] == [("0", "contiguous-max"), ("1", "paged")]
    assert "allocators" not in rows[0]  # the allocator column says it


def test_every_point_failing_is_an_error(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, model="llama-3.1-70b")
    with pytest.raises(KvplanError, match="weights"):
        run(str(path), "--jobs", "1", "--out", str(tmp_path / "out"), "--quiet", "--no-plots")


def test_price_override_sets_the_cost(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    run(str(path), "--allocator", "paged", "--seeds", "1", "--jobs", "1", "--out", str(out), "--quiet",
        "--no-plots", "--price", "h100=3.6")
    (row,) = read_csv(out / "capacity.csv")
    assert row["price_usd_per_gpu_hour"] == "3.6"
    # $3.6 per GPU-hour / (3600 s × tok/s) × 1e6 = 1000 / tok/s dollars per million tokens
    tok_s = float(row["throughput_tok_s"])
    assert float(row["usd_per_m_output_tokens"]) == pytest.approx(1000 / tok_s, rel=1e-5)


def test_table_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario_file(tmp_path)
    run(str(path), "--allocator", "paged", "--seeds", "1", "--jobs", "1", "--out", str(tmp_path / "o"),
        "--no-plots")
    out = capsys.readouterr().out
    assert "max sustainable rate under the SLO" in out and "paged" in out and "capacity.csv" in out


def test_point_plot_is_deterministic(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    report = cmd.run_capacity(str(path), num_seeds=1, jobs=1, out=str(tmp_path / "o"), quiet=True,
                              use_cache=False, plots_on=False)
    by_alloc = {r.allocator: [r] for r in report.results}
    slo = search.SLOSpec(ttft_p99_s=0.3, tpot_p99_s=0.1)
    a = plots.plot_point(tmp_path / "a.png", "t", by_alloc, slo).read_bytes()
    b = plots.plot_point(tmp_path / "b.png", "t", by_alloc, slo).read_bytes()
    assert a == b and a[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("argv", "message"), [
    (("--sweep", "x"), "--sweep expects KEY=V1,V2,..., got 'x'"),
    (("--sweep", "blok_size=8,16"), "--sweep: unknown sweep knob 'blok_size' — did you mean 'block_size'?"),
    (("--tolerance", "0"), "--tolerance must be in (0, 1], got 0.0"),
    (("--seeds", "0"), "--seeds must be at least 1, got 0"),
    (("--start-rate", "-1"), "--start-rate must be a positive number, got -1.0"),
    (("--price", "h100"), "--price expects GPU=USD_PER_HOUR (a positive number), got 'h100'"),
    (("--allocator", "pagd"), "unknown allocator 'pagd' — did you mean 'paged'?"),
    (("--address", "auto"), "--address applies to --executor ray"),
])
def test_cli_errors(tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    path = scenario_file(tmp_path)
    with pytest.raises(KvplanError) as err:
        run(str(path), "--quiet", "--out", str(tmp_path / "o"), "--jobs", "1", *argv)
    assert str(err.value) == message


def test_missing_slo_is_an_error(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, slo=None)
    with pytest.raises(KvplanError) as err:
        run(str(path), "--quiet")
    assert str(err.value) == (f"{path}: capacity needs an 'slo:' section "
                              "(e.g. slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.1})")


def test_exit_status_says_a_point_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real CLI: 3 when some points failed (the table still written), 2 when all did."""
    from simulator.cli import main

    path = scenario_file(tmp_path)
    common = ("--allocator", "paged", "--seeds", "1", "--jobs", "1", "--no-plots")
    assert main(["capacity", str(path), "--sweep", "gpu=h100,h1000", *common, "--out", str(tmp_path / "a")]) == 3
    assert [r["status"] for r in read_csv(tmp_path / "a" / "capacity.csv")] == ["ok", "failed"]
    captured = capsys.readouterr()
    assert "point 1 failed:" in captured.out
    assert "kvplan: capacity: 1 of 2 sweep points failed, the others were searched (exit status 3)" in captured.err
    assert main(["capacity", str(path), "--sweep", "gpu=h1000,h2000", *common, "--out", str(tmp_path / "b")]) == 2
    assert "every sweep point failed" in capsys.readouterr().err


def test_no_sweep_ignores_the_files_sweep(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, sweep={"block_size": [16, 32], "max_num_seqs": [2, 4]})
    common = ("--allocator", "paged", "--seeds", "1", "--jobs", "1", "--quiet", "--no-plots")
    assert run(str(path), "--no-sweep", *common, "--out", str(tmp_path / "a")) == 0
    (row,) = read_csv(tmp_path / "a" / "capacity.csv")
    assert row["point"] == "0" and "block_size" not in row  # the scenario's own block size
    assert run(str(path), "--no-sweep", "--sweep", "block_size=32", *common, "--out", str(tmp_path / "b")) == 0
    assert [r["block_size"] for r in read_csv(tmp_path / "b" / "capacity.csv")] == ["32"]
