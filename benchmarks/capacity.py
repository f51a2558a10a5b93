"""Capacity search speed: the two documented capacity commands, timed, with a baseline search.

    python benchmarks/capacity.py [--skip-sweep] [--rows] [--jobs N]

* ``kvplan capacity scenarios/chat.yaml`` — the whole Azure conversation trace (19,366 requests),
  four allocators; one request is longer than its max_model_len, so its SLO (no rejection
  allowed) fails at every rate — again with ``--set slo.max_rejected_fraction=0.001``, where each
  allocator has a rate to find — and ``kvplan capacity scenarios/capacity-chat.yaml`` — the
  72-point sweep, 144 searches — each run as a user runs it (plots on, a fresh output folder so no probe comes
  from the cache), in a subprocess: wall seconds, and CPU seconds of the command and its worker
  processes (``resource.getrusage(RUSAGE_CHILDREN)``, which counts every waited-for descendant);
  the number of probes, how many stopped early, and the answers (``--rows``: every sweep row).
* The baseline, measured in the same run: one search (``chat.yaml`` allowing the rejection,
  paged allocator) in this process, with the engine's quiet runs on (``macro_steps``, today's
  setting) and off (one step at a time); the two must give the same answer from the same probes, and the ratio is what the
  quiet runs buy a capacity search.

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

from simulator.capacity.search import SearchTask, run_search  # noqa: E402
from simulator.capacity.sweep import read_capacity_scenario, resolve_points  # noqa: E402

ALLOW_ONE_REJECTION = {"slo.max_rejected_fraction": 0.001}  # chat.yaml: 1 of 19,366 is too long
SET_ALLOW = [a for k, v in ALLOW_ONE_REJECTION.items() for a in ("--set", f"{k}={v}")]
COMMANDS: tuple[tuple[str, list[str]], ...] = (
    ("chat.yaml (4 allocators)", ["scenarios/chat.yaml"]),
    ("chat.yaml, rejections allowed", ["scenarios/chat.yaml", *SET_ALLOW]),
    ("capacity-chat.yaml (sweep)", ["scenarios/capacity-chat.yaml"]),
)
SWEEP = 2  # the index of the sweep in COMMANDS (--skip-sweep)
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
    file = read_capacity_scenario(ROOT / BASELINE_SCENARIO,
                                  {"allocators": [BASELINE_ALLOCATOR], **ALLOW_ONE_REJECTION})
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


def describe(body: dict[str, Any], rows: bool) -> list[str]:
    probes = [p for s in body["searches"] for p in s["probes"]]
    stopped = sum(1 for p in probes if p.get("stopped_at_s") is not None)
    lines = [f"  {len(body['searches'])} searches, {len(probes)} probes ({stopped} stopped early)"]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-sweep", action="store_true", help="time only chat.yaml and the baseline")
    ap.add_argument("--rows", action="store_true", help="print every row of the sweep")
    ap.add_argument("--jobs", type=int, help="kvplan capacity --jobs (default: its own, the CPU count)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    report: list[str] = []
    commands = COMMANDS[:SWEEP] if args.skip_sweep else COMMANDS
    with tempfile.TemporaryDirectory(prefix="kvplan-capacity-bench-") as tmp:
        for i, (label, command) in enumerate(commands):
            wall, cpu, body = run_command(command, Path(tmp) / f"out{i}", args.jobs)
            report.append(f"kvplan capacity {label}: wall {wall:.1f} s, CPU {cpu:.1f} s")
            report.extend(describe(body, args.rows))
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
