"""`simulate`: a scenario, every allocator it lists, one trace -> tables, JSON/CSV and plots."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from simulator import metrics, report
from simulator.deployment import Deployment, build_deployment
from simulator.engine import SimResult, simulate
from simulator.errors import KvplanError
from simulator.scenario import Scenario, canonical_allocator, load_scenario
from workloads.request import Request
from workloads.spec import build_requests


@dataclass
class AllocatorRun:
    name: str
    result: SimResult
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]


def scenario_overrides(*, rate: float | None = None, num_requests: int | None = None,
                       seed: int | None = None, allocators: list[str] | None = None,
                       extra: list[str] | None = None) -> dict[str, object]:
    """CLI flags as dotted scenario keys (``--set key=value`` values are parsed as YAML scalars)."""
    out: dict[str, object] = {}
    if rate is not None:
        out["workload.rate"] = rate
    if num_requests is not None:
        out["workload.num_requests"] = num_requests
    if seed is not None:
        out["seed"] = seed
    if allocators:
        out["allocators"] = [canonical_allocator(a) for a in allocators]
    for item in extra or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KvplanError(f"--set expects KEY=VALUE, got '{item}'")
        out[key.strip()] = yaml.safe_load(value)
    return out


def load_requests(scenario: Scenario, base_dir: Path) -> list[Request]:
    return build_requests(scenario.workload, seed=scenario.seed, base_dir=base_dir)


def run_allocator(dep: Deployment, allocator: str, requests: list[Request], *,
                  progress: Progress | None = None, record_steps: bool = True) -> AllocatorRun:
    task = None
    if progress is not None:
        task = progress.add_task(allocator, total=len(requests))

    def advance(count: int) -> None:
        if progress is not None and task is not None:
            progress.advance(task, count)

    result = simulate(requests, dep.replica_factory(allocator), dep.latency,
                      num_replicas=dep.scenario.num_replicas, record_steps=record_steps,
                      on_progress=advance if progress is not None else None)
    req = metrics.requests_frame(result)
    steps = metrics.steps_frame(result)
    summary = metrics.summarize(result, req, steps, dep.capacity_tokens)
    return AllocatorRun(allocator, result, req, steps, summary)


def make_progress(quiet: bool) -> Progress | None:
    if quiet or not sys.stderr.isatty():
        return None
    return Progress(TextColumn("[bold]{task.description:>18}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("requests"), TimeElapsedColumn(), console=Console(stderr=True),
                    transient=False)


def run_simulate(path: str, *, out: str | None, overrides: dict[str, object], quiet: bool,
                 plots: bool = True, force_profile: bool = False) -> tuple[Path, dict[str, Any]]:
    scenario, base_dir = load_scenario(path, overrides)
    dep = build_deployment(scenario, base_dir, force_profile=force_profile, where=path)
    requests = load_requests(scenario, base_dir)
    out_dir = Path(out) if out else Path("runs") / scenario.name
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = make_progress(quiet)
    runs: list[AllocatorRun] = []
    if progress is not None:
        with progress:
            runs = [run_allocator(dep, a, requests, progress=progress) for a in scenario.allocators]
    else:
        runs = [run_allocator(dep, a, requests) for a in scenario.allocators]
    summary = {r.name: r.summary for r in runs}
    write_outputs(out_dir, scenario, dep, runs, plots=plots)
    if not quiet:
        console = Console() if sys.stdout.isatty() else Console(width=120)  # pipes: no 80-col wrap
        report.print_summary(console, summary, dep.describe(), scenario.name, out_dir)
    return out_dir, summary


def write_outputs(out_dir: Path, scenario: Scenario, dep: Deployment, runs: list[AllocatorRun],
                  *, plots: bool) -> None:
    summary = {r.name: r.summary for r in runs}
    requests = pd.concat([r.requests.assign(allocator=r.name) for r in runs], ignore_index=True)
    steps = pd.concat([r.steps.assign(allocator=r.name) for r in runs], ignore_index=True)
    requests = requests[["allocator", *metrics.REQUEST_COLUMNS]]
    steps = steps[["allocator", *[c for c in steps.columns if c != "allocator"]]]
    report.write_json(out_dir / "summary.json", summary)
    report.write_json(out_dir / "run.json", {
        "scenario": scenario.model_dump(mode="json"),
        "deployment": dep.describe(),
        "num_requests": len(runs[0].result.requests) if runs else 0,
    })
    report.write_csv(out_dir / "requests.csv", requests)
    report.write_csv(out_dir / "steps.csv", steps)
    if plots:
        from simulator.plots import write_plots

        write_plots(out_dir, steps, requests, summary, title=f"{scenario.name}: {dep.model.name} on {dep.gpu.name}")
