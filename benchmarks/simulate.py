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

Each case says on stderr when it starts and what it measured when it ends (with the load
average then), and its rows are appended to ``--save`` (JSON lines; default
``runs/benchmarks/simulate.jsonl``) as they come: a run stopped with Ctrl-C keeps every case it
finished, and prints their tables before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.compiled import PURE_ENV, describe  # noqa: E402
from simulator.config.deployment import build_deployment  # noqa: E402
from simulator.engine.core import simulate  # noqa: E402
from simulator.config.scenario import load_scenario  # noqa: E402
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
            secs, peak = command_seconds(path, folder / f"out-{path.stem}-{source}", source=source)
            if secs < best[source][0]:
                best[source] = (secs, peak)
    written = [(folder / f"out-{path.stem}-{source}" / "requests.csv").read_bytes() for source in (True, False)]
    if written[0] != written[1]:
        raise SystemExit(f"{path.name}: the compiled modules changed requests.csv")
    return best[False], best[True]


class Results:
    """The rows measured so far: said on stderr and appended to ``save`` as each comes, so that
    nothing finished is lost to a Ctrl-C; :meth:`print_tables` prints them all."""

    def __init__(self, save: Path, repeats: int) -> None:
        self.save = save
        self.repeats = repeats
        self.rows: list[tuple] = []  # (run, steps, 1 step s, quiet s, peak MiB)
        self.builds: list[tuple] = []  # (run, (source CPU s, peak MiB), (built CPU s, peak MiB))
        self.load_before = os.getloadavg()
        save.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, record: dict) -> None:
        record = {**record, "load_1min": round(os.getloadavg()[0], 2), "repeats": self.repeats,
                  "build": describe(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(self.save, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def row(self, name: str, steps: int | None, single: float | None, quiet: float, peak: float | None) -> None:
        self.rows.append((name, steps, single, quiet, peak))
        self._append({"run": name, "steps": steps, "one_step_cpu_s": single, "quiet_cpu_s": quiet,
                      "peak_mib": peak})
        ratio = f", {single / quiet:.2f}x" if single else ""
        say(f"  {name}: {quiet:.2f} s CPU{ratio} (load {os.getloadavg()[0]:.2f})")

    def build(self, name: str, source: tuple[float, float], built: tuple[float, float]) -> None:
        self.builds.append((name, source, built))
        self._append({"run": name, "source_cpu_s": source[0], "built_cpu_s": built[0],
                      "source_peak_mib": source[1], "built_peak_mib": built[1]})
        say(f"  {name}: source {source[0]:.2f} s, built {built[0]:.2f} s, "
            f"{source[0] / built[0]:.2f}x (load {os.getloadavg()[0]:.2f})")

    def print_tables(self, *, finished: bool) -> None:
        load_after = os.getloadavg()
        print(f"{'run':<68} {'steps':>9} {'1 step (s)':>10} {'quiet (s)':>10} {'ratio':>7} {'peak MiB':>9}")
        for name, steps, single, quiet, peak in self.rows:
            cells = [f"{steps:>9,}" if steps else " " * 9,
                     f"{single:>10.2f}" if single else " " * 10, f"{quiet:>10.2f}",
                     f"{single / quiet:>6.2f}x" if single else " " * 7,
                     f"{peak:>9.0f}" if peak else ""]
            print(f"{name:<68} " + " ".join(cells))
        print(f"CPU seconds (user + system), best of {self.repeats}; the per-request times are equal both "
              f"ways. Load average {self.load_before[0]:.2f} before, {load_after[0]:.2f} after, on "
              f"{os.cpu_count()} CPUs.")
        print()
        print(f"{'whole command':<68} {'source (s)':>10} {'built (s)':>10} {'ratio':>7} {'MiB src':>8} "
              f"{'MiB blt':>8}")
        for name, (src, src_peak), (built, peak) in self.builds:
            print(f"{name:<68} {src:>10.2f} {built:>10.2f} {src / built:>6.2f}x {src_peak:>8.0f} {peak:>8.0f}")
        print(f"Built: {describe()}. Source: {PURE_ENV}=1. The two ran alternately and wrote the same "
              "requests.csv.")
        if not finished:
            print("Interrupted: the cases above are those that finished.")
        print(f"Rows saved in {self.save}.")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the synthetic scale run")
    ap.add_argument("--synthetic", type=int, default=1_000_000, help="requests of the scale run")
    ap.add_argument("--scale-replicas", type=int, action="append",
                    help="replicas of a scale run (repeatable; default: 4 and 64)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each way (the best counts)")
    ap.add_argument("--engine", action="append", choices=ENGINES,
                    help="serving engine of the Azure runs (repeatable; default: all)")
    ap.add_argument("--save", type=Path, default=ROOT / "runs" / "benchmarks" / "simulate.jsonl",
                    help="append each measured row here as it comes (JSON lines)")
    args = ap.parse_args()
    engines = args.engine or list(ENGINES)
    results = Results(args.save, args.repeats)
    try:
        measure(args, engines, results)
    except KeyboardInterrupt:
        say("interrupted")
        results.print_tables(finished=False)
        return 130
    results.print_tables(finished=True)
    return 0


def measure(args: argparse.Namespace, engines: list[str], results: Results) -> None:
    """Every case of the module docstring, each row handed to ``results`` as it is measured."""
    cases = [(e, x) for e in engines for x in (1.0, 0.5)]
    scale = [] if args.quick else (args.scale_replicas or [4, 64])
    total = len(cases) + len(scale)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, (engine, scale_x) in enumerate(cases, 1):
            say(f"[{i}/{total}] azure-conv {scale_x:g}x {engine}: the engine both ways, then the whole "
                f"command both builds, {args.repeats} repeats each")
            path = folder / f"azure-{engine}-{scale_x}.yaml"
            path.write_text(AZURE.format(scale=scale_x, engine=engine))
            best = {True: float("inf"), False: float("inf")}
            times: dict[bool, list[tuple]] = {}
            steps = 0
            for _ in range(args.repeats):
                for macro in (False, True):
                    secs, steps, times[macro] = engine_seconds(path, macro)
                    best[macro] = min(best[macro], secs)
            if times[True] != times[False]:
                raise SystemExit(f"azure {scale_x}x, {engine}: quiet runs changed the per-request times")
            results.row(f"azure-conv {scale_x:g}x {engine}, engine", steps, best[False], best[True], None)
            cli, cli_source = both_builds(path, folder, args.repeats)
            results.row(f"azure-conv {scale_x:g}x {engine}, kvplan simulate", steps, None, cli[0], None)
            results.build(f"azure-conv {scale_x:g}x {engine}, kvplan simulate", cli_source, cli)
        for i, replicas in enumerate(scale, len(cases) + 1):
            say(f"[{i}/{total}] synthetic {args.synthetic:,} requests on {replicas} replicas, the whole "
                "command both builds (minutes)")
            path = folder / f"synthetic-{replicas}.yaml"
            path.write_text(SYNTHETIC.format(n=args.synthetic, replicas=replicas, rate=15.0 * replicas))
            wall = time.perf_counter()
            (secs, peak), source = both_builds(path, folder, 1)
            wall = time.perf_counter() - wall
            name = f"synthetic {args.synthetic:,}, {replicas} replicas vllm-v1, kvplan simulate"
            results.row(f"{name} ({wall:.0f} s wall, both builds)", None, None, secs, peak)
            results.build(name, source, (secs, peak))


if __name__ == "__main__":
    sys.exit(main())
