"""`simulate`: a scenario, every allocator it lists, one trace -> tables, JSON/CSV and plots."""

from __future__ import annotations

import functools
from collections.abc import Sequence
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


from simulator import metrics, report
from simulator.deployment import Deployment, build_deployment
from simulator.engine import SimResult, simulate
from simulator.html_report import write_report
from simulator.errors import KvplanError
from simulator.yamlfile import parse_yaml
from simulator.outputs import RunSource, default_out_dir, open_output, shown_run
from simulator.router import requests_per_replica
from simulator.saturation import saturation
from simulator.scenario import Scenario, canonical_allocator, load_scenario
from simulator.steps import DEFAULT_BIN_S, STEP_COLUMNS
from workloads.clients import OPEN_LOOP, Clients
from workloads.request import Request, cyclic_gc_paused
from workloads.spec import build_requests
from workloads.synthetic import ModelLenFit, fit_to_max_model_len

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from rich.progress import Progress


# What simulate wrote before its folders carried outputs.MARKER: such a folder may be replaced.
SIMULATE_FILES = ("summary.json", "run.json", "requests.csv", "steps.csv")


@dataclass
class AllocatorRun:
    """One allocator's run: the result, its requests table as columns
    (:func:`metrics.request_columns`) and its summary; ``requests`` and ``steps`` give the
    tables as pandas DataFrames, built when first asked for (``simulate`` writes its CSVs
    without them)."""

    name: str
    result: SimResult
    request_columns: dict[str, Any]
    summary: dict[str, Any]

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.request_columns, columns=list(metrics.REQUEST_COLUMNS))

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        return metrics.steps_frame(self.result)


# A rate override (dotted key) -> the scenario keys it replaces (set to None, i.e. not given).
RATE_KEY_REPLACES: dict[str, tuple[str, ...]] = {
    "workload.rate": ("workload.rate_scale",),
    "workload.rate_scale": ("workload.rate",),
    "workload.arrival.rate": ("workload.rate",),
}


def scenario_overrides(*, rate: float | None = None, num_requests: int | None = None,
                       seed: int | None = None, allocators: list[str] | None = None,
                       extra: list[str] | None = None) -> dict[str, object]:
    """CLI flags as dotted scenario keys (``--set key=value`` values are parsed as YAML scalars).

    A rate given here (``--rate``, ``--set workload.rate=``, ``workload.rate_scale=`` or
    ``workload.arrival.rate=``) replaces the scenario's: the keys it excludes
    (:data:`RATE_KEY_REPLACES`) come back as None unless also given here."""
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
        out[key.strip()] = parse_yaml(value, f"--set {key.strip()}", lines=False)  # a YAML scalar, or a bounded list
    # The file's way of setting the rate gives way to the command line's: left in place, a file's
    # rate_scale beside a CLI rate is refused ("give rate ... or rate_scale ..., not both"), and a file's
    # rate would silently win over a CLI arrival.rate. Keys given on the command line together
    # are the user's own conflict and stay for the scenario check to report.
    cleared = {other for key, others in RATE_KEY_REPLACES.items() if key in out
               for other in others if other not in out}
    for other in sorted(cleared):
        out[other] = None
    return out



def load_requests(scenario: Scenario, base_dir: Path) -> list[Request]:
    return build_requests(scenario.workload, seed=scenario.seed, base_dir=base_dir)


def load_workload(scenario: Scenario, base_dir: Path, max_model_len: int) -> ModelLenFit:
    """The scenario's requests after its ``max_model_len_policy`` (reject | truncate) for a
    window of ``max_model_len`` tokens, with how many requests the policy touched."""
    return fit_to_max_model_len(load_requests(scenario, base_dir), max_model_len,
                                scenario.max_model_len_policy)


def client_policy(scenario: Scenario, num_requests: int) -> Clients:
    """How the scenario's workload is sent, checked against the ``num_requests`` it produced
    (a trace window or a max_model_len policy decides that count only once built)."""
    clients = scenario.workload.client_policy(num_requests)
    if clients.warmup_requests >= num_requests:
        raise KvplanError(f"workload: warmup_requests {clients.warmup_requests} leaves none of the "
                          f"{num_requests} requests to measure")
    return clients


def run_allocator(dep: Deployment, allocator: str, requests: list[Request], *,
                  clients: Clients = OPEN_LOOP, progress: Progress | None = None,
                  record_steps: bool | str = True, step_bin_s: float = DEFAULT_BIN_S,
                  name: str | None = None) -> AllocatorRun:
    """Simulate ``requests`` sent by ``clients`` on ``dep`` with one allocator: the request and
    step frames and the summary (see :func:`simulator.engine.simulate`; ``record_steps`` and
    ``step_bin_s`` choose the step rows, :mod:`simulator.steps`). ``name`` labels the run
    (default: the allocator's name)."""
    name = name or allocator
    task = None
    if progress is not None:
        task = progress.add_task(name, total=len(requests))

    def advance(count: int) -> None:
        if progress is not None and task is not None:
            progress.advance(task, count)

    # The run's groups and times are millions of acyclic objects on a big trace: the cyclic
    # collector would rescan them all again and again while the metrics are computed (the
    # engine pauses it during the simulation itself), so it is paused until the summary is done.
    with cyclic_gc_paused():
        result = simulate(requests, dep.replica_factory(allocator), dep.latency,
                          num_replicas=dep.scenario.num_replicas, clients=clients,
                          record_steps=record_steps, step_bin_s=step_bin_s,
                          on_progress=advance if progress is not None else None,
                          router=dep.scenario.router.config())
        columns = metrics.request_columns(result)
        summary = metrics.summarize(result, columns, None, dep.capacity_tokens)
        if dep.scenario.num_replicas > 1:
            summary["requests_per_replica"] = requests_per_replica(result.times.replica,  # type: ignore[attr-defined]
                                                                   dep.scenario.num_replicas)
        summary.update(saturation(result, columns).as_dict())
    return AllocatorRun(name, result, columns, summary)


def make_progress(quiet: bool) -> Progress | None:
    """A progress bar on a terminal's stderr; None with ``quiet`` or when stderr is no terminal
    (rich is imported only for a bar or the printed table: a quiet run never loads it)."""
    if quiet or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description:>18}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("requests"), TimeElapsedColumn(), console=Console(stderr=True),
                    transient=False)


def run_simulate(path: str, *, out: str | None, overrides: dict[str, object], quiet: bool,
                 plots: bool = True, force_profile: bool = False, steps: str = "bins",
                 step_bin_s: float = DEFAULT_BIN_S, replace: bool = False) -> tuple[Path, dict[str, Any]]:
    """Run ``kvplan simulate``: each engine × allocator of the scenario at ``path`` (with dotted
    ``overrides``), written to ``out`` (default ``runs/<name>/``). ``replace``: write over a
    folder holding a run of another scenario file (:mod:`simulator.outputs`)."""
    scenario, base_dir = load_scenario(path, overrides)
    source = RunSource.of("simulate", [path], scenario.model_dump(mode="json"), shown_run(path, overrides))
    if scenario.disaggregation is not None:
        from simulator.disagg import run_disaggregated
        return run_disaggregated(scenario, base_dir, path, out=out, quiet=quiet, plots=plots,
                                 force_profile=force_profile, steps=steps, step_bin_s=step_bin_s,
                                 source=source, replace=replace)
    deps = {e: build_deployment(scenario.for_engine(e), base_dir, force_profile=force_profile,
                                where=path) for e in scenario.engines}
    dep = next(iter(deps.values()))
    fit = load_workload(scenario, base_dir, dep.scheduler_config.max_model_len)
    requests = fit.requests
    clients = client_policy(scenario, len(requests))
    # one engine: a run per allocator, named by it; several: engine/allocator
    several = len(deps) > 1
    setups = [(f"{e}/{a}" if several else a, d, a) for e, d in deps.items()
              for a in scenario.allocators_of(e)]
    out_dir = Path(out) if out else default_out_dir(scenario.name, where=path)
    # Locked from here: a second run into out_dir is refused before it simulates anything, and
    # the results replace the folder only once all of them are written (simulator/outputs.py).
    with open_output(out_dir, command="simulate", recognised=SIMULATE_FILES, source=source,
                     replace=replace) as folder:
        progress = make_progress(quiet)
        runs: list[AllocatorRun] = []
        if progress is not None:
            with progress:
                runs = [run_allocator(d, a, requests, clients=clients, progress=progress,
                                      record_steps=steps, step_bin_s=step_bin_s, name=name)
                        for name, d, a in setups]
        else:
            runs = [run_allocator(d, a, requests, clients=clients, record_steps=steps,
                                  step_bin_s=step_bin_s, name=name) for name, d, a in setups]
        for r in runs:
            r.summary["max_model_len_policy"] = fit.as_dict()
        summary = {r.name: r.summary for r in runs}
        write_outputs(folder.staging, scenario, dep, runs, plots=plots, deployments=deps)
    if not quiet:
        from rich.console import Console

        console = Console() if sys.stdout.isatty() else Console(width=120)  # pipes: no 80-col wrap
        report.print_summary(console, summary, dep.describe(), scenario.name, out_dir,
                             engines=[d.describe() for d in deps.values()] if several else None,
                             slo=scenario.slo.model_dump() if scenario.slo else None)
    return out_dir, summary


def write_outputs(out_dir: Path, scenario: Scenario, dep: Deployment, runs: list[AllocatorRun],
                  *, plots: bool, deployments: dict[str, Deployment] | None = None,
                  num_replicas: int | None = None, pools: Sequence[tuple[str, int]] = (),
                  sent: dict[str, Any] | None = None) -> None:
    """Write summary.json, run.json, requests.csv, steps.csv, the plots and report.html into ``out_dir``
    (a staging folder of :func:`simulator.outputs.open_output`: nobody else writes there).
    With several engines (or the pools of a disaggregated run), run.json also has each one's
    deployment under ``deployments``. ``num_replicas``: the replicas the step rows number
    (default: the scenario's); ``pools`` and ``sent`` label and count them per pool
    (:func:`simulator.plots.write_replica_plot`)."""
    summary = {r.name: r.summary for r in runs}
    report.write_json(out_dir / "summary.json", summary)
    meta: dict[str, Any] = {
        "scenario": scenario.model_dump(mode="json"),
        "deployment": dep.describe(),
        "num_requests": len(runs[0].result.requests) if runs else 0,
    }
    if deployments is not None and len(deployments) > 1:
        meta["deployments"] = {e: d.describe() for e, d in deployments.items()}
    report.write_json(out_dir / "run.json", meta)
    report.write_columns_csv(out_dir / "requests.csv", ("allocator", *metrics.REQUEST_COLUMNS), (
        [[r.name] * len(r.result.requests), *(r.request_columns[c] for c in metrics.REQUEST_COLUMNS)]
        for r in runs))
    report.write_rows_csv(out_dir / "steps.csv", ("allocator", *STEP_COLUMNS), (
        (r.name, *row) for r in runs for row in r.result.steps))
    if plots:
        import numpy as np
        import pandas as pd

        from simulator.plots import write_plots, write_replica_plot

        requests = pd.concat([r.requests.assign(allocator=r.name) for r in runs], ignore_index=True)
        steps = pd.concat([r.steps.assign(allocator=r.name) for r in runs], ignore_index=True)
        requests = requests[["allocator", *metrics.REQUEST_COLUMNS]]
        steps = replica_steps = steps[["allocator", *STEP_COLUMNS]]
        step_groups = None
        if pools:  # each pool's steps drawn apart: their KV pools and batches are not alike
            start, edges, names = 0, [], []
            for pool, n in pools:
                start += n
                edges.append(start)
                names.append(pool)
            which = np.searchsorted(np.asarray(edges), steps["replica"].to_numpy(), side="right")
            steps = steps.assign(allocator=steps["allocator"] + " · " + np.asarray(names)[which] + " pool")
            step_groups = [f"{r.name} · {pool} pool" for r in runs for pool in names]
        slo = scenario.slo
        title = f"{scenario.name}: {dep.model.name} on {dep.gpu.name}"
        if pools and deployments:  # each pool on its own GPUs: name both, not the decode pool's alone
            title = f"{scenario.name}: {dep.model.name}, " + ", ".join(
                f"{pool} on {d.gpu.name}" for pool, d in deployments.items())
        write_plots(out_dir, steps, requests, summary, title=title,
                    slo_ttft_p99_s=slo.ttft_p99_s if slo else None,
                    slo_tpot_p99_s=slo.tpot_p99_s if slo else None, step_groups=step_groups)
        write_replica_plot(out_dir, replica_steps, requests, num_replicas or scenario.num_replicas, title=title,
                           policy=scenario.router.policy, pools=pools, sent=sent)
    write_report(out_dir, "simulate")  # last: report.html reads back the files above
