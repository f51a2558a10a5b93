"""Start-up cost of every command: CPU seconds before the first useful instruction.

    python benchmarks/startup.py [--repeat 5]

Each row runs in a fresh interpreter (``subprocess``) and is charged the CPU time (user + system)
that the child used, read from ``resource.getrusage(RUSAGE_CHILDREN)`` before and after: wall
time on a shared machine says more about the neighbours than about the imports, CPU time much
less. The baseline, measured in the same run, is a bare ``python -c pass``; the ratio column is
each row's CPU over it. Rows:

* ``kvplan --help`` and ``kvplan CMD --help`` for every command (the parser is built; nothing runs);
* ``import simulator.cli`` (what every ``kvplan`` invocation pays);
* the import phase of ``kvplan simulate``: simulate's parser and :mod:`simulator.commands.simulate`;
* the import of each command's implementation module (what running that command adds).

Without a bytecode cache (``PYTHONDONTWRITEBYTECODE`` set, or a read-only checkout) every row
also compiles the project's modules from source; the footer says which case was measured.

``python -X importtime -c "import simulator.cli"`` shows where the time goes, module by module.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (label, python arguments) — the CLI runs as ``python -m simulator.cli``, as the ``kvplan``
# console script would (pyproject.toml [project.scripts]), without needing it installed.
CLI = ["-m", "simulator.cli"]
ROWS: list[tuple[str, list[str]]] = [
    ("python -c pass (baseline)", ["-c", "pass"]),
    ("kvplan --help", [*CLI, "--help"]),
    *[(f"kvplan {cmd} --help", [*CLI, cmd, "--help"])
      for cmd in ("simulate", "size", "capacity", "validate", "calibrate", "fidelity")],
    ("import simulator.cli", ["-c", "import simulator.cli"]),
    ("kvplan simulate: parser + simulator.commands.simulate",
     ["-c", "from simulator.cli import build_parser; build_parser('simulate'); import simulator.commands.simulate"]),
    *[(f"import {mod}", ["-c", f"import {mod}"])
      for mod in ("simulator.commands.simulate", "simulator.commands.size", "simulator.commands.capacity.cmd",
                  "simulator.commands.capacity.search", "simulator.commands.validate.cmd", "backend.cli")],
]


def child_cpu_s(args: list[str]) -> float | None:
    """CPU seconds (user + system) of one ``python ARGS`` run in the repository root; None when
    it fails (its error is printed: the other rows are still worth measuring)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        return None
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per row; the table shows min and median")
    args = ap.parse_args()
    load_before = os.getloadavg()
    results: list[tuple[str, list[float] | None]] = []
    for label, py_args in ROWS:
        samples = [child_cpu_s(py_args) for _ in range(args.repeat)]
        ok = [s for s in samples if s is not None]
        results.append((label, ok if len(ok) == len(samples) else None))
    load_after = os.getloadavg()
    baseline = results[0][1]
    assert baseline is not None, "python -c pass failed"
    base = statistics.median(baseline)
    print(f"{'command':<40} {'CPU s min':>10} {'CPU s median':>13} {'vs baseline':>12}")
    for label, samples in results:
        if samples is None:
            print(f"{label:<40} {'failed (error above)':>37}")
            continue
        median = statistics.median(samples)
        print(f"{label:<40} {min(samples):>10.3f} {median:>13.3f} {median / base:>11.1f}x")
    print(f"{args.repeat} runs per row on {os.cpu_count()} CPUs; load average (1, 5, 15 min) "
          f"before {', '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {', '.join(f'{x:.2f}' for x in load_after)}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: every row compiled the project's modules from source")
    return 0


if __name__ == "__main__":
    sys.exit(main())
