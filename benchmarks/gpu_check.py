"""GPU truth in one run: kernel correctness, kernel bandwidth, a calibration and a fidelity replay.

    python benchmarks/gpu_check.py [--dry-run] [--budget-s 480] [--only STAGE ...] [--skip STAGE ...]
                                   [--results-dir benchmarks/results] [--work-dir runs/gpu-check]

Stages, each a subprocess with a time limit (a stage whose limit no longer fits in what is left of
``--budget-s`` is skipped, and the results say so):

    kernels       benchmarks/kernel_check.py --device cuda: the Triton store and paged decode
                  kernels against the torch reference, fp16 / bf16 / fp8 (e4m3) KV
    kernel-bench  benchmarks/kernel.py --quick: achieved KV bandwidth of the paged decode kernel
    calibrate     kvplan calibrate --model llama-3.1-8b --device cuda --layers 4 (the full sweep)
    fidelity      kvplan fidelity scenarios/fidelity-gpu.yaml --device cuda on the first 300
                  requests, quick calibration sweep + the training-run refit, 2 real runs

It writes ``benchmarks/results/gpu-check-<date>-<gpu>.json``: the date, the GPU, the torch /
Triton / CUDA versions, and every stage's status, duration, command, key numbers and the tail of
its output. Stage outputs (the profile, fidelity.json, kernel.csv) stay in ``--work-dir``.
``--dry-run`` checks the imports, prints the plan (commands and budgets) and writes the JSON with
every stage "skipped: dry run"; it runs anywhere, without a GPU.

Running it on a GPU machine without network access
---------------------------------------------------
kvplan does not need to be installed: run the script from the repository root. It needs, next to
torch and Triton, the packages kvplan imports (numpy, pandas, matplotlib, pyyaml, simpy, pydantic,
rich); a missing one is named at the start with the command that installs it. Fetch their wheels
beforehand on a machine with network access (the two platform tags cover the manylinux 2014 and
2.28 wheels that numpy, pandas and pillow ship; the GPU machine needs glibc 2.28 or newer)::

    pip download numpy pandas matplotlib pyyaml simpy pydantic rich -d wheels \\
        --python-version 3.12 --only-binary=:all: \\
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64

(about 56 MB; ``wheels/`` is git-ignored), copy the repository with ``wheels/`` to the GPU
machine, and there::

    pip install --no-index --find-links wheels numpy pandas matplotlib pyyaml simpy pydantic rich
    python benchmarks/gpu_check.py --dry-run     # the plan and the imports, in seconds
    python benchmarks/gpu_check.py               # about 8 minutes at most
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
TOTAL_BUDGET_S = 480  # the whole check: 8 minutes
OUTPUT_TAIL_CHARS = 3000
# import name -> distribution name (what pip installs)
REQUIRED = {"numpy": "numpy", "pandas": "pandas", "matplotlib": "matplotlib", "yaml": "pyyaml",
            "simpy": "simpy", "pydantic": "pydantic", "rich": "rich", "torch": "torch", "triton": "triton"}
WHEELS = ("numpy", "pandas", "matplotlib", "pyyaml", "simpy", "pydantic", "rich")
FIDELITY_REQUESTS = 300  # of the scenario's 1,500: ~25 s of arrivals per real run at 12 req/s
CALIBRATE_LAYERS = 4


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    budget_s: int
    argv: tuple[str, ...]  # what runs (in the repository root)
    command: str  # the same as a user would type it


# the files each stage leaves in the work dir: removed before it runs, so none is read stale
STAGE_OUTPUTS = {"kernels": ("kernels.json",), "kernel-bench": ("kernel.csv",),
                 "calibrate": ("calibrate.json", "profile.yaml"), "fidelity": ("fidelity.json",)}


def plan(work: Path) -> list[Stage]:
    """The stages in order, their commands and budgets (they sum to under TOTAL_BUDGET_S)."""
    py = sys.executable
    profile, fidelity_out = work / "profile.yaml", work / "fidelity"
    return [
        Stage("kernels", "Triton store + paged decode vs the torch reference (fp16, bf16, fp8 KV)", 60,
              (py, "benchmarks/kernel_check.py", "--device", "cuda", "--out", str(work / "kernels.json")),
              f"python benchmarks/kernel_check.py --device cuda --out {work / 'kernels.json'}"),
        Stage("kernel-bench", "paged decode kernel bandwidth vs a device copy (bf16)", 90,
              (py, "benchmarks/kernel.py", "--quick", "--out", str(work / "kernel.csv")),
              f"python benchmarks/kernel.py --quick --out {work / 'kernel.csv'}"),
        Stage("calibrate", f"llama-3.1-8b, {CALIBRATE_LAYERS} of 32 layers, full sweep", 140,
              (py, str(SCRIPT), "--stage", "calibrate", "--work-dir", str(work)),
              f"kvplan calibrate --model llama-3.1-8b --device cuda --layers {CALIBRATE_LAYERS} "
              f"--out {profile}"),
        Stage("fidelity", f"real engine vs simulator, first {FIDELITY_REQUESTS} requests of fidelity-gpu",
              180,
              (py, str(SCRIPT), "--stage", "fidelity", "--work-dir", str(work)),
              f"kvplan fidelity scenarios/fidelity-gpu.yaml --device cuda --num-requests {FIDELITY_REQUESTS} "
              f"--quick-calibrate --repeats 2 --out {fidelity_out}"),
    ]


# ---------------------------------------------------------------------- environment
def check_imports() -> dict[str, str | None]:
    """Each required module's installed version, or None when it cannot be imported."""
    found: dict[str, str | None] = {}
    for module, dist in REQUIRED.items():
        if importlib.util.find_spec(module) is None:
            found[module] = None
            continue
        try:
            found[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[module] = "unknown version"
    return found


def missing_message(imports: dict[str, str | None]) -> str:
    missing = [m for m, v in imports.items() if v is None]
    if not missing:
        return ""
    names = [REQUIRED[m] for m in missing]
    wheels = [n for n in names if n in WHEELS]
    hint = (f"; install them from local wheels: pip install --no-index --find-links wheels {' '.join(wheels)}"
            " (how to fetch the wheels: see this script's docstring)") if wheels else ""
    return f"missing: {', '.join(names)}{hint}"


def describe_machine() -> dict[str, Any]:
    """GPU name and the versions that matter, without failing where there is no GPU."""
    # Each probe below may find nothing (no torch, no triton, no driver): its field then stays
    # None in the results JSON, which is the honest record of what the machine had.
    info: dict[str, Any] = {"python": platform.python_version(), "torch": None, "triton": None,
                            "cuda": None, "gpu": None, "gpu_count": 0, "nvidia_smi": None}
    try:
        import torch

        info["torch"] = str(torch.__version__)
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
    except ImportError:
        pass  # torch missing: torch, cuda and gpu stay None
    try:
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass  # triton not installed: stays None
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass  # no nvidia-smi (or it hung): stays None
    return info


def results_path(results_dir: Path, when: datetime, gpu: str | None) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", (gpu or "no-gpu").lower()).strip("-")
    return results_dir / f"gpu-check-{when:%Y-%m-%d}-{slug}.json"


# ---------------------------------------------------------------------- running the stages
def run_stage(stage: Stage, timeout_s: float, env: dict[str, str]) -> dict[str, Any]:
    """Run one stage in its own process group (so a timeout kills its children too)."""
    start = time.perf_counter()
    proc = subprocess.Popen(stage.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else f"failed: exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = f"timeout: stopped after {timeout_s:.0f} s"
    return {"status": status, "duration_s": round(time.perf_counter() - start, 1),
            "output_tail": (output or "")[-OUTPUT_TAIL_CHARS:]}


def key_numbers(name: str, work: Path) -> dict[str, Any]:
    """The numbers worth reading from a stage's output files (empty if it wrote none)."""
    try:
        if name == "kernels":
            data = json.loads((work / "kernels.json").read_text())
            return {"all_ok": data["ok"], "num_cases": len(data["cases"]),
                    "failed": [f"{c['op']} {c['kv_dtype']}" for c in data["cases"] if not c["ok"]],
                    "max_decode_rel_err": max(c["rel_err"] for c in data["cases"] if c["op"] == "decode")}
        if name == "kernel-bench":
            with (work / "kernel.csv").open() as f:
                rows = list(csv.DictReader(f))
            if not rows:
                return {"num_points": 0}
            ratio = sorted(float(r["paged_over_copy"]) for r in rows)
            return {"num_points": len(rows), "best_paged_gbps": max(float(r["paged_gbps"]) for r in rows),
                    "median_paged_over_copy": ratio[len(ratio) // 2],
                    "max_rel_err": max(float(r["max_rel_err"]) for r in rows)}
        if name in ("calibrate", "fidelity"):
            return json.loads((work / f"{name}.json").read_text())
    except (OSError, ValueError, KeyError) as err:
        return {"unreadable": f"{type(err).__name__}: {err}"}
    return {}


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # compiled kernels on the GPU, never the interpreter
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# ---------------------------------------------------------------------- stages run in-process
def _stage_calibrate(work: Path) -> dict[str, Any]:
    """``kvplan calibrate`` through its own parser (kvplan need not be installed)."""
    import yaml

    from backend.cli import add_calibrate_parser

    profile = work / "profile.yaml"
    args = _parse(add_calibrate_parser, ["calibrate", "--model", "llama-3.1-8b", "--device", "cuda",
                                         "--layers", str(CALIBRATE_LAYERS), "--out", str(profile)])
    args.func(args)
    raw = yaml.safe_load(profile.read_text())
    fit = raw["fit"]
    return {"profile": str(profile), "gpu": raw.get("gpu"), "device": raw.get("device"),
            "num_shapes": fit["num_samples"] + fit["num_heldout"], "mape_train": fit["mape_train"],
            "mape_heldout": fit["mape_heldout"], "wall_s": fit.get("wall_s"),
            "coefficients_s": raw["latency_model"]["coefficients_s"]}


def _stage_fidelity(work: Path) -> dict[str, Any]:
    from backend.cli import add_fidelity_parser

    out = work / "fidelity"
    args = _parse(add_fidelity_parser, ["fidelity", "scenarios/fidelity-gpu.yaml", "--device", "cuda",
                                        "--num-requests", str(FIDELITY_REQUESTS), "--quick-calibrate",
                                        "--repeats", "2", "--out", str(out)])
    args.func(args)
    report = json.loads((out / "fidelity.json").read_text())
    paged = report["allocators"]["paged"]
    return {"out": str(out), "decisions_identical": paged["decisions"]["identical"],
            "step_mape": paged["steps"]["mape"],
            "errors": {k: v["relative_error"] for k, v in paged["metrics"].items()},
            "spread": paged["measurement_spread"],
            "targets": {k: v.get("verdict", v["met"]) for k, v in paged["targets"].items()}}


def _parse(add_parser, argv: list[str]) -> argparse.Namespace:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser(prog="kvplan")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def run_internal_stage(name: str, work: Path) -> int:
    """``--stage NAME``: run one in-process stage and write its key numbers to WORK/NAME.json."""
    sys.path.insert(0, str(ROOT))
    from simulator.errors import KvplanError

    work.mkdir(parents=True, exist_ok=True)
    stage = {"calibrate": _stage_calibrate, "fidelity": _stage_fidelity}[name]
    try:
        numbers = stage(work)
    except KvplanError as err:
        print(f"kvplan: error: {err}", file=sys.stderr)
        return 2
    (work / f"{name}.json").write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


# ---------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [s.name for s in plan(Path("."))]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="check imports, print the plan, write the JSON; run nothing")
    p.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S, help=f"total time (default {TOTAL_BUDGET_S})")
    p.add_argument("--only", action="append", choices=names, metavar="STAGE", help="run only this stage (repeatable)")
    p.add_argument("--skip", action="append", choices=names, metavar="STAGE", default=[], help="skip this stage")
    p.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "gpu-check")
    p.add_argument("--stage", choices=("calibrate", "fidelity"), help=argparse.SUPPRESS)  # internal
    args = p.parse_args(argv)
    if args.budget_s <= 0:
        p.error(f"--budget-s must be positive, got {args.budget_s:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work_dir.resolve()
    if args.stage:
        return run_internal_stage(args.stage, work)
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    imports = check_imports()
    missing = missing_message(imports)
    print("gpu_check: imports: " + ", ".join(f"{m} {v or 'MISSING'}" for m, v in imports.items()))
    if missing:
        print(f"gpu_check: {missing}", file=sys.stderr)
        if not args.dry_run:
            return 2
    machine = describe_machine()
    print(f"gpu_check: GPU {machine['gpu'] or 'none'}, torch {machine['torch']}, CUDA {machine['cuda']}, "
          f"Triton {machine['triton']}, Python {machine['python']}")
    if not args.dry_run and machine["gpu"] is None:
        print("gpu_check: no CUDA device: nothing to check (--dry-run shows the plan)", file=sys.stderr)
        return 2
    stages = [s for s in plan(work) if (not args.only or s.name in args.only) and s.name not in args.skip]
    print(f"gpu_check: plan ({sum(s.budget_s for s in stages)} s of stage budgets, "
          f"{args.budget_s:.0f} s in all):")
    for s in stages:
        print(f"  {s.name:<13} {s.budget_s:>4} s  {s.what}\n                         $ {s.command}")
    if not args.dry_run:
        work.mkdir(parents=True, exist_ok=True)
    results = []
    for s in stages:
        entry: dict[str, Any] = {"name": s.name, "what": s.what, "command": s.command, "argv": list(s.argv),
                                 "budget_s": s.budget_s}
        left = args.budget_s - (time.perf_counter() - t0)
        if args.dry_run:
            entry.update(status="skipped: dry run", duration_s=0.0)
        elif left < s.budget_s:
            entry.update(status=f"skipped: {left:.0f} s left of the {args.budget_s:.0f} s budget, "
                                f"the stage may need {s.budget_s} s", duration_s=0.0)
        else:
            print(f"gpu_check: {s.name} (up to {s.budget_s} s) ...", flush=True)
            for name in STAGE_OUTPUTS[s.name]:
                (work / name).unlink(missing_ok=True)
            entry.update(run_stage(s, s.budget_s, child_env()))
            entry["numbers"] = key_numbers(s.name, work)
        print(f"gpu_check: {s.name}: {entry['status']} ({entry['duration_s']} s)", flush=True)
        results.append(entry)
    out = results_path(args.results_dir, started, machine["gpu"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "kvplan_gpu_check": 1, "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "dry_run": args.dry_run,
        **machine, "imports": imports, "budget_s": args.budget_s, "work_dir": str(work),
        "total_s": round(time.perf_counter() - t0, 1), "stages": results,
    }, indent=2) + "\n")
    print(f"gpu_check: wrote {out}")
    failed = [r["name"] for r in results if not (r["status"] == "ok" or r["status"].startswith("skipped"))]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
