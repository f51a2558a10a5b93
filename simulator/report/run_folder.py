"""The files of a simulate run folder: summary.json, run.json, requests.csv, steps.csv, the
plots and report.html (``simulate`` writes them, and ``compare`` for the run it simulates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.config.deployment import Deployment
from simulator.config.scenario import Scenario
from simulator.engine import metrics
from simulator.engine.runs import AllocatorRun
from simulator.engine.steps import STEP_COLUMNS
from simulator.report import files
from simulator.report.html import write_report

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

# What simulate wrote before its folders carried outputs.MARKER: such a folder may be replaced.
SIMULATE_FILES = ("summary.json", "run.json", "requests.csv", "steps.csv")


def write_outputs(out_dir: Path, scenario: Scenario, dep: Deployment, runs: list[AllocatorRun],
                  *, plots: bool, deployments: dict[str, Deployment] | None = None,
                  num_replicas: int | None = None, pools: Sequence[tuple[str, int]] = (),
                  sent: dict[str, Any] | None = None) -> None:
    """Write summary.json, run.json, requests.csv, steps.csv, the plots and report.html into ``out_dir``
    (a staging folder of :func:`simulator.report.outputs.open_output`: nobody else writes there).
    With several engines (or the pools of a disaggregated run), run.json also has each one's
    deployment under ``deployments``. ``num_replicas``: the replicas the step rows number
    (default: the scenario's); ``pools`` and ``sent`` label and count them per pool
    (:func:`simulator.report.plots.write_replica_plot`)."""
    summary = {r.name: r.summary for r in runs}
    files.write_json(out_dir / "summary.json", summary)
    meta: dict[str, Any] = {
        "scenario": scenario.model_dump(mode="json"),
        "deployment": dep.describe(),
        "num_requests": len(runs[0].result.requests) if runs else 0,
    }
    if deployments is not None and len(deployments) > 1:
        meta["deployments"] = {e: d.describe() for e, d in deployments.items()}
    files.write_json(out_dir / "run.json", meta)
    files.write_columns_csv(out_dir / "requests.csv", ("allocator", *metrics.REQUEST_COLUMNS), (
        [[r.name] * len(r.result.requests), *(r.request_columns[c] for c in metrics.REQUEST_COLUMNS)]
        for r in runs))
    files.write_rows_csv(out_dir / "steps.csv", ("allocator", *STEP_COLUMNS), (
        (r.name, *row) for r in runs for row in r.result.steps))
    if plots:
        from simulator.report.plots import write_plots, write_replica_plot

        inputs = plot_inputs(scenario, dep, runs, deployments=deployments, pools=pools)
        write_plots(out_dir, inputs.steps, inputs.requests, summary, **inputs.figure_args())
        write_replica_plot(out_dir, inputs.replica_steps, inputs.requests, num_replicas or scenario.num_replicas,
                           title=inputs.title, policy=scenario.router.policy, pools=pools, sent=sent)
    write_report(out_dir, "simulate")  # last: report.html reads back the files above


@dataclass(frozen=True)
class PlotInputs:
    """What the figures of a run are drawn from (:func:`plot_inputs`)."""

    steps: pd.DataFrame  # one row per step (or bin), ``allocator`` the run (· pool, disaggregated)
    replica_steps: pd.DataFrame  # the same rows, ``allocator`` the run alone
    requests: pd.DataFrame
    title: str
    slo_ttft_p99_s: float | None
    slo_tpot_p99_s: float | None
    step_groups: list[str] | None  # the pools' step groups of a disaggregated run

    def figure_args(self) -> dict[str, Any]:
        """The keyword arguments of :func:`simulator.report.plots.write_plots` and ``build_figure``."""
        return {"title": self.title, "slo_ttft_p99_s": self.slo_ttft_p99_s,
                "slo_tpot_p99_s": self.slo_tpot_p99_s, "step_groups": self.step_groups}


def plot_inputs(scenario: Scenario, dep: Deployment, runs: Sequence[AllocatorRun], *,
                deployments: dict[str, Deployment] | None = None,
                pools: Sequence[tuple[str, int]] = ()) -> PlotInputs:
    """The runs' request and step tables (pools drawn apart), the title and the SLO bounds."""
    import numpy as np
    import pandas as pd

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
    return PlotInputs(steps, replica_steps, requests, title, slo.ttft_p99_s if slo else None,
                      slo.tpot_p99_s if slo else None, step_groups)
