"""Building a workload's requests: CPU seconds and peak memory, for big traces and big synthetic runs.

    python benchmarks/workloads.py [--rows 1000000] [--synthetic 1000000] [--big-rows 5000000]
                                   [--synthetic-big 10000000] [--keep-dir DIR]

Cases, each through ``workloads.spec.build_requests`` (the path ``kvplan simulate`` takes):

* ``bundled azure-conv in full``: the 19,366 requests of the trace scenarios/chat.yaml replays.
* ``1,000 of a 5x10^6-row trace``: a slice at the start of a big Azure CSV. Streaming stops
  reading once the slice is complete, so this should cost what reading 1,000 rows costs.
* ``1,000 at rate 8 of a 10^6-row trace``: ``rate`` rescales to the *whole* trace's mean rate, so
  every row is read (and validated) once, without being kept.
* ``a 10^6-row trace in full``: every row becomes a request.
* ``10^6 synthetic``: chat-like lognormal lengths, Poisson arrivals, 8 shared-prefix groups.
* ``--synthetic-big 10000000``: a second synthetic case, off by default (about 2 GiB).

The Azure-format traces (``TIMESTAMP,ContextTokens,GeneratedTokens``) are generated once into a
temporary folder (or ``--keep-dir``, reused when present): 5x10^6 rows take about 10 s and
180 MB of disk (``--big-rows 0`` skips that case). Each case runs in its own Python
process; its CPU seconds (user + system) and peak resident memory are that process's own, read
with ``os.wait4`` (the ``getrusage(RUSAGE_CHILDREN)`` record of that one child: RUSAGE_CHILDREN
itself reports the *largest* of all children waited for, so successive cases would hide each
other). The ``python + imports`` row is the floor every case pays. The load average is printed
because the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# First on the path: this script's own folder, which Python puts there, holds a workloads.py
# that would otherwise hide the workloads package.
sys.path.insert(0, str(ROOT))

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
CHUNK_ROWS = 200_000
SYNTHETIC_SPEC = {
    "arrival": {"process": "poisson", "rate": 60.0},
    "prompt_tokens": {"dist": "lognormal", "mean": 1000, "p99": 4000, "max": 6000},
    "output_tokens": {"dist": "lognormal", "mean": 200, "p99": 1000, "max": 2000},
    "shared_prefix": {"groups": 8, "prefix_tokens": 512, "popularity": "zipf"},
}


def write_azure_trace(path: Path, num_rows: int, *, seed: int = 0) -> None:
    """An Azure 2023-format CSV of ``num_rows`` requests at about 5.5 req/s with mean lengths
    near 1,200 prompt and 200 output tokens (the bundled conversation trace: 5.53 req/s, 1,155
    and 211, tests/workloads/test_loaders.py), written in chunks so that generating it needs
    little memory."""
    rng = np.random.default_rng(seed)
    first_day = date(2023, 11, 16)
    day_text: dict[int, str] = {}
    last_s = 0.0
    with path.open("w", newline="") as f:
        f.write(AZURE_HEADER)
        for start in range(0, num_rows, CHUNK_ROWS):
            count = min(CHUNK_ROWS, num_rows - start)
            seconds = last_s + np.cumsum(rng.exponential(1 / 5.5, count))
            last_s = float(seconds[-1])
            ticks = np.floor(seconds * 1e7).astype(np.int64)  # Azure's 100 ns resolution
            days, ticks = np.divmod(ticks, 86_400 * 10**7)
            secs, frac = np.divmod(ticks, 10**7)
            prompts = np.clip(rng.lognormal(6.6, 1.0, count), 1, 30_000).astype(np.int64)
            outputs = np.clip(rng.lognormal(4.9, 0.9, count), 1, 4_000).astype(np.int64)
            for d in np.unique(days).tolist():
                day_text.setdefault(d, (first_day + timedelta(days=d)).isoformat())
            f.writelines(
                f"{day_text[d]} {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{t:07d},{p},{o}\n"
                for d, s, t, p, o in zip(days.tolist(), secs.tolist(), frac.tolist(),
                                         prompts.tolist(), outputs.tolist())
            )


def run_case(workload: str) -> None:
    """In the child process: build the requests of ``workload`` (JSON) and report how many."""
    from workloads.spec import build_requests, parse_workload

    data = json.loads(workload)
    if not data:  # the floor: interpreter and imports only
        print(0)
        return
    requests = build_requests(parse_workload(data, "benchmark"), seed=0, base_dir=ROOT)
    print(len(requests))


def measure(workload: dict) -> tuple[int, float, float, float]:
    """Requests built, CPU seconds, wall seconds and peak MiB of one case in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--case", json.dumps(workload)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"case {workload} failed with exit status {proc.returncode}")
    # ru_maxrss is in KiB on Linux (getrusage(2)).
    return int(out.strip()), usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def trace_file(folder: Path, num_rows: int) -> Path:
    path = folder / f"azure-{num_rows}.csv"
    if not path.is_file():
        start = time.perf_counter()
        partial = path.with_suffix(".partial")
        write_azure_trace(partial, num_rows)
        partial.rename(path)
        print(f"(wrote {num_rows:,} rows to {path} in {time.perf_counter() - start:.1f} s)", flush=True)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the trace read in full")
    ap.add_argument("--big-rows", type=int, default=5_000_000,
                    help="rows of the trace a 1,000-request slice is taken from (0: skip)")
    ap.add_argument("--synthetic", type=int, default=1_000_000, help="synthetic requests")
    ap.add_argument("--synthetic-big", type=int, default=0, help="a second, bigger synthetic case")
    ap.add_argument("--keep-dir", type=Path, help="keep the generated traces here (reused if present)")
    args = ap.parse_args()
    if args.case is not None:
        run_case(args.case)
        return 0

    with tempfile.TemporaryDirectory(prefix="kvplan-bench-") as tmp:
        folder = args.keep_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        cases: list[tuple[str, dict]] = [("python + imports", {}),
                                         ("bundled azure-conv in full", {"trace": "bundled:azure-conv"})]
        if args.big_rows:
            big = str(trace_file(folder, args.big_rows))
            cases.append((f"1,000 of a {args.big_rows:,}-row trace", {"trace": big, "num_requests": 1000}))
        full = str(trace_file(folder, args.rows))
        cases += [
            (f"1,000 at rate 8 of a {args.rows:,}-row trace",
             {"trace": full, "rate": 8.0, "num_requests": 1000}),
            (f"a {args.rows:,}-row trace in full", {"trace": full}),
            (f"{args.synthetic:,} synthetic", {**SYNTHETIC_SPEC, "num_requests": args.synthetic}),
        ]
        if args.synthetic_big:
            cases.append((f"{args.synthetic_big:,} synthetic",
                          {**SYNTHETIC_SPEC, "num_requests": args.synthetic_big}))
        print(f"{'case':<40} {'requests':>11} {'CPU s':>8} {'wall s':>8} {'peak MiB':>9}")
        for name, workload in cases:
            num, cpu, wall, peak = measure(workload)
            print(f"{name:<40} {num:>11,} {cpu:>8.2f} {wall:>8.2f} {peak:>9,.0f}", flush=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
