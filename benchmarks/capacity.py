"""Capacity search speed: the two documented capacity commands, timed, against baselines.

    python benchmarks/capacity.py [--skip-sweep] [--rows] [--jobs N]

* ``kvplan capacity scenarios/chat.yaml`` — the whole Azure conversation trace (19,366 requests),
  four allocators (its SLO allows the one request longer than max_model_len to be refused) — and
  ``kvplan capacity scenarios/capacity-chat.yaml`` — the 72-point sweep, 144 searches — each run
  as a user runs it (plots on, a fresh output folder so no probe comes from the cache), in a
  subprocess: wall seconds, and CPU seconds of the command and its worker processes
  (``resource.getrusage(RUSAGE_CHILDREN)``, which counts every waited-for descendant); the
  1-minute load average when it started; the number of probes (per search), how many stopped
  early, and the answers (``--rows``: every sweep row).
* The sweep again with ``--no-warm-start`` (every search from its own analytic bound, as before
  searches were chained along the sweep's last knob: ``simulator.commands.capacity.search.run_chain``):
  the baseline of the warm starts, in the same run; the CPU and probe ratios are what they buy,
  and the rows whose answers differ are counted (each answer is a bracket within the tolerance,
  so two runs may differ by as much).
* The baseline of the engine, measured in the same run: one search (``chat.yaml``, paged
  allocator) in this process, with the engine's quiet runs on (``macro_steps``, today's setting)
  and off (one step at a time); the two must give the same answer from the same probes, and the
  ratio is what the quiet runs buy a capacity search.

Targets (the issue that asked for this): ``chat.yaml`` within 60 s and the sweep within 3 minutes
of wall time on 2 cores. The load average is printed before and after: on a shared machine the
wall times say as much about the neighbours as about kvplan.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.commands.capacity.search import SearchTask, run_search  # noqa: E402
from simulator.commands.capacity.sweep import read_capacity_scenario, resolve_points  # noqa: E402

COMMANDS: tuple[tuple[str, list[str]], ...] = (
    ("chat.yaml (4 allocators)", ["scenarios/chat.yaml"]),
    ("capacity-chat.yaml (sweep)", ["scenarios/capacity-chat.yaml"]),
    ("capacity-chat.yaml, --no-warm-start", ["scenarios/capacity-chat.yaml", "--no-warm-start"]),
)
SWEEP = 1  # the index of the sweep in COMMANDS (--skip-sweep: only those before it)
WARM, COLD = 1, 2  # the sweep with warm starts and its baseline
BASELINE_SCENARIO = "scenarios/chat.yaml"
BASELINE_ALLOCATOR = "paged"
TOLERANCE = 0.05  # kvplan capacity's default


def run_command(args: list[str], out: Path, jobs: int | None) -> tuple[float, float, dict[str, Any]]:
    """Wall and CPU seconds of ``kvplan capacity ARGS --out OUT --quiet``, and its capacity.json."""
    argv = [sys.executable, "-m", "simulator.cli", "capacity", *args, "--out", str(out), "--quiet"]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads((out / "capacity.json").read_text())


def baseline_task(macro_steps: bool) -> SearchTask:
    """One rate search as ``kvplan capacity`` builds it (no cache, no KV recording)."""
    file = read_capacity_scenario(ROOT / BASELINE_SCENARIO, {"allocators": [BASELINE_ALLOCATOR]})
    point = resolve_points(file)[0]
    assert point.scenario is not None, point.error
    data = {**point.scenario.model_dump(mode="json", exclude_defaults=True),
            "allocators": [BASELINE_ALLOCATOR], "seed": point.scenario.seed}
    return SearchTask(0, data, BASELINE_SCENARIO, str(file.base_dir.resolve()), BASELINE_ALLOCATOR,
                      point.scenario.seed, None, TOLERANCE, False, None, macro_steps=macro_steps)


def timed_search(macro_steps: bool) -> tuple[float, Any]:
    start = time.process_time()
    result = run_search(baseline_task(macro_steps))
    return time.process_time() - start, result


def num_probes(body: dict[str, Any]) -> int:
    return sum(len(s["probes"]) for s in body["searches"])


def describe(body: dict[str, Any], rows: bool) -> list[str]:
    probes = [p for s in body["searches"] for p in s["probes"]]
    stopped = sum(1 for p in probes if p.get("stopped_at_s") is not None)
    searches = len(body["searches"])
    lines = [f"  {searches} searches, {len(probes)} probes ({len(probes) / max(1, searches):.1f} per search, "
             f"{stopped} stopped early)"]
    table = body["rows"]
    if rows or len(table) <= 8:
        for r in table:
            knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items())
            rate = "-" if r["max_rate_req_s"] is None else f"{r['max_rate_req_s']:.4g}"
            high = "-" if r["rate_ci_high_req_s"] is None else f"{r['rate_ci_high_req_s']:.4g}"
            lines.append(f"  {r['allocator']:<18} {rate:>8} req/s (next failing {high:>8}) "
                         f"{r['status']:<9} {knobs}")
        return lines
    for allocator in dict.fromkeys(r["allocator"] for r in table):
        mine = [r for r in table if r["allocator"] == allocator]
        rates = [r["max_rate_req_s"] for r in mine if r["max_rate_req_s"] is not None]
        statuses = statistics.multimode(r["status"] for r in mine)
        lines.append(f"  {allocator:<18} {len(mine)} rows, max req/s min {min(rates):.4g} / median "
                     f"{statistics.median(rates):.4g} / max {max(rates):.4g}; most often {statuses[0]}")
    return lines


def compare_sweeps(warm: tuple[float, float, dict[str, Any]],
                   cold: tuple[float, float, dict[str, Any]]) -> list[str]:
    """The sweep's table row against its --no-warm-start baseline: wall, CPU, probes, and how
    many answers differ (and by how much at most, relative)."""
    rates = [(a["max_rate_req_s"], b["max_rate_req_s"]) for a, b in zip(warm[2]["rows"], cold[2]["rows"])]
    moved = [abs(a / b - 1) for a, b in rates if a != b and a is not None and b is not None]
    lost = sum(1 for a, b in rates if (a is None) != (b is None))
    lines = ["capacity-chat.yaml sweep, warm starts against each search cold (baseline):",
             f"  {'':<34} {'wall s':>8} {'CPU s':>8} {'probes':>8}"]
    for label, (wall, cpu, body) in (("each search cold (baseline)", cold),
                                     ("chained, warm starts (default)", warm)):
        lines.append(f"  {label:<34} {wall:>8.1f} {cpu:>8.1f} {num_probes(body):>8}")
    lines += [f"  {'ratio (baseline / default)':<34} {cold[0] / warm[0]:>7.2f}x {cold[1] / warm[1]:>7.2f}x "
              f"{num_probes(cold[2]) / num_probes(warm[2]):>7.2f}x",
              f"  answers: {len(rates) - len(moved) - lost} of {len(rates)} rows the same"
              + (f", {len(moved)} moved by at most {max(moved):.1%}" if moved else "")
              + (f", {lost} found a rate in one run only" if lost else "")]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-sweep", action="store_true", help="time only chat.yaml and the baseline")
    ap.add_argument("--rows", action="store_true", help="print every row of the sweep")
    ap.add_argument("--jobs", type=int, help="kvplan capacity --jobs (default: its own, the CPU count)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    report: list[str] = []
    commands = COMMANDS[:SWEEP] if args.skip_sweep else COMMANDS
    runs: dict[int, tuple[float, float, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="kvplan-capacity-bench-") as tmp:
        for i, (label, command) in enumerate(commands):
            load = os.getloadavg()[0]
            runs[i] = wall, cpu, body = run_command(command, Path(tmp) / f"out{i}", args.jobs)
            report.append(f"kvplan capacity {label}: wall {wall:.1f} s, CPU {cpu:.1f} s "
                          f"(load average {load:.2f} at its start)")
            report.extend(describe(body, args.rows))
    if WARM in runs and COLD in runs:
        report.extend(compare_sweeps(runs[WARM], runs[COLD]))
    fast_cpu, fast = timed_search(True)
    slow_cpu, slow = timed_search(False)
    same = (fast.lo_rate_req_s, fast.hi_rate_req_s, fast.probes) == (slow.lo_rate_req_s, slow.hi_rate_req_s,
                                                                      slow.probes)
    load_after = os.getloadavg()
    print("\n".join(report))
    high = "none" if fast.hi_rate_req_s is None else f"{fast.hi_rate_req_s:.4g}"
    print(f"one search ({BASELINE_SCENARIO}, {BASELINE_ALLOCATOR}, {len(fast.probes)} probes, "
          f"answer {fast.lo_rate_req_s:.4g} req/s, next failing {high}):")
    print(f"  {'engine':<40} {'CPU s':>8} {'vs baseline':>12}")
    print(f"  {'one step at a time (baseline)':<40} {slow_cpu:>8.1f} {1.0:>11.2f}x")
    print(f"  {'quiet runs as one (macro_steps, default)':<40} {fast_cpu:>8.1f} "
          f"{slow_cpu / fast_cpu:>11.2f}x")
    print(f"  same answer from the same probes: {'yes' if same else 'NO'}")
    print(f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
