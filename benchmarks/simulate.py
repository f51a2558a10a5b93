"""Simulator speed: quiet runs (macro-steps) against one step at a time, measured in the same run.

    python benchmarks/simulate.py [--quick] [--synthetic 1000000] [--repeats 2]
                                  [--scale-replicas 4 --scale-replicas 64]
                                  [--engine vllm-v1 --engine sglang ...]

Setups (CPU seconds, the best of ``--repeats``; the two ways alternate so that the machine's
load hits both alike):

* Azure 2023 conversation trace (19,366 requests, one hour), Llama-2-7B on one A100-80GB, paged,
  at the trace's own rate (1x) and at half of it (timestamps x 2: more, smaller steps) — the
  engine alone (``simulate()``) with ``macro_steps`` on and off, and the whole command
  (``kvplan simulate --no-plots``: start-up, trace, simulation, outputs) in a subprocess; for
  each serving engine (``--engine``, repeatable; default all three: vllm-v1, vllm-v0, sglang).
* ``--synthetic N`` requests (chat-like lognormal lengths, Poisson at 15 req/s per replica, on
  4 and on 64 replicas of Llama-3.1-8B on H100-80GB, paged; ``--scale-replicas``): the scale
  check, the whole command, wall and CPU seconds and peak memory (skipped with ``--quick``).

Every run checks that both ways gave the same per-request times; the table prints the ratio and
the load average. A second table times each whole command as installed (the hot modules
compiled: :mod:`simulator.compiled`) against the same command run from source
(``KVPLAN_PURE_PYTHON=1``), alternately, and checks that both wrote the same requests.csv.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.compiled import PURE_ENV, describe  # noqa: E402
from simulator.deployment import build_deployment  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.scheduler.config import ENGINES  # noqa: E402
from workloads.spec import build_requests  # noqa: E402

AZURE = """\
name: bench-azure
seed: 0
engine: {engine}
model: llama-2-7b
gpu: a100-80gb
allocators: [paged]
max_model_len: 4096
workload:
  trace: bundled:azure-conv
  rate_scale: {scale}
latency:
  model: roofline
"""

SYNTHETIC = """\
name: bench-synthetic
seed: 0
model: llama-3.1-8b
gpu: h100-80gb
allocators: [paged]
num_replicas: {replicas}
workload:
  num_requests: {n}
  arrival: {{process: poisson, rate: {rate}}}
  prompt_tokens: {{dist: lognormal, mean: 1000, p99: 4000, max: 6000}}
  output_tokens: {{dist: lognormal, mean: 200, p99: 1000, max: 2000}}
latency:
  model: roofline
"""


def engine_seconds(path: Path, macro: bool) -> tuple[float, int, list[tuple]]:
    """CPU seconds of ``simulate()`` alone, its steps, and the per-request times."""
    scenario, base = load_scenario(path)
    dep = build_deployment(scenario, base)
    requests = build_requests(scenario.workload, seed=scenario.seed, base_dir=base)
    t = time.process_time()
    result = simulate(requests, dep.replica_factory("paged"), dep.latency,
                      num_replicas=scenario.num_replicas, record_steps="bins", macro_steps=macro)
    secs = time.process_time() - t
    times = [(x.admitted_s, x.first_token_s, x.finished_s) for x in result.times]
    return secs, result.totals().num_steps, times


def command_seconds(path: Path, out: Path, *, source: bool = False) -> tuple[float, float]:
    """CPU seconds and peak MiB of ``kvplan simulate PATH --no-plots`` in a fresh process, as
    installed or (``source``) with every module run from its source."""
    cmd = [sys.executable, "-m", "simulator.cli", "simulate", str(path), "--out", str(out),
           "--no-plots", "--quiet"]
    # bytecode cached as an installed Python has it (a shell may turn the cache off: then every
    # start compiles the sources again, 0.07-0.09 s); the first of the repeats writes it
    env = {k: v for k, v in os.environ.items() if k not in (PURE_ENV, "PYTHONDONTWRITEBYTECODE")}
    if source:
        env[PURE_ENV] = "1"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({status})")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def both_builds(path: Path, folder: Path, repeats: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """The whole command as installed and from source, alternately, the best of ``repeats`` each:
    ((CPU s, peak MiB) built, (CPU s, peak MiB) from source). Both must write the same requests."""
    best = {False: (float("inf"), 0.0), True: (float("inf"), 0.0)}
    for _ in range(repeats):
        for source in (True, False):
            secs, peak = command_seconds(path, folder / f"out-{source}", source=source)
            if secs < best[source][0]:
                best[source] = (secs, peak)
    written = [(folder / f"out-{source}" / "requests.csv").read_bytes() for source in (True, False)]
    if written[0] != written[1]:
        raise SystemExit(f"{path.name}: the compiled modules changed requests.csv")
    return best[False], best[True]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the synthetic scale run")
    ap.add_argument("--synthetic", type=int, default=1_000_000, help="requests of the scale run")
    ap.add_argument("--scale-replicas", type=int, action="append",
                    help="replicas of a scale run (repeatable; default: 4 and 64)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each way (the best counts)")
    ap.add_argument("--engine", action="append", choices=ENGINES,
                    help="serving engine of the Azure runs (repeatable; default: all)")
    args = ap.parse_args()
    engines = args.engine or list(ENGINES)
    load_before = os.getloadavg()
    rows = []
    builds = []  # (run, (source CPU s, peak MiB), (built CPU s, peak MiB))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for engine, scale in ((e, x) for e in engines for x in (1.0, 0.5)):
            path = folder / f"azure-{engine}-{scale}.yaml"
            path.write_text(AZURE.format(scale=scale, engine=engine))
            best = {True: float("inf"), False: float("inf")}
            times: dict[bool, list[tuple]] = {}
            steps = 0
            for _ in range(args.repeats):
                for macro in (False, True):
                    secs, steps, times[macro] = engine_seconds(path, macro)
                    best[macro] = min(best[macro], secs)
            if times[True] != times[False]:
                raise SystemExit(f"azure {scale}x, {engine}: quiet runs changed the per-request times")
            cli, cli_source = both_builds(path, folder, args.repeats)
            rows.append((f"azure-conv {scale:g}x {engine}, engine", steps, best[False], best[True], None))
            rows.append((f"azure-conv {scale:g}x {engine}, kvplan simulate", steps, None, cli[0], None))
            builds.append((f"azure-conv {scale:g}x {engine}, kvplan simulate", cli_source, cli))
        for replicas in () if args.quick else (args.scale_replicas or [4, 64]):
            path = folder / f"synthetic-{replicas}.yaml"
            path.write_text(SYNTHETIC.format(n=args.synthetic, replicas=replicas, rate=15.0 * replicas))
            wall = time.perf_counter()
            (secs, peak), source = both_builds(path, folder, 1)
            wall = time.perf_counter() - wall
            name = f"synthetic {args.synthetic:,}, {replicas} replicas vllm-v1, kvplan simulate"
            rows.append((f"{name} ({wall:.0f} s wall, both builds)", None, None, secs, peak))
            builds.append((name, source, (secs, peak)))
    load_after = os.getloadavg()
    print(f"{'run':<68} {'steps':>9} {'1 step (s)':>10} {'quiet (s)':>10} {'ratio':>7} {'peak MiB':>9}")
    for name, steps, single, quiet, peak in rows:
        cells = [f"{steps:>9,}" if steps else " " * 9,
                 f"{single:>10.2f}" if single else " " * 10, f"{quiet:>10.2f}",
                 f"{single / quiet:>6.2f}x" if single else " " * 7,
                 f"{peak:>9.0f}" if peak else ""]
        print(f"{name:<68} " + " ".join(cells))
    print(f"CPU seconds (user + system), best of {args.repeats}; the per-request times are equal both "
          f"ways. Load average {load_before[0]:.2f} before, {load_after[0]:.2f} after, on "
          f"{os.cpu_count()} CPUs.")
    print()
    print(f"{'whole command':<68} {'source (s)':>10} {'built (s)':>10} {'ratio':>7} {'MiB src':>8} "
          f"{'MiB blt':>8}")
    for name, (src, src_peak), (built, peak) in builds:
        print(f"{name:<68} {src:>10.2f} {built:>10.2f} {src / built:>6.2f}x {src_peak:>8.0f} {peak:>8.0f}")
    print(f"Built: {describe()}. Source: {PURE_ENV}=1. The two ran alternately and wrote the same "
          "requests.csv.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
