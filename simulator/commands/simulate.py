"""``kvplan simulate``: a scenario, every engine and allocator it lists, one trace -> tables,
JSON/CSV and plots in a results folder. A thin layer over :mod:`simulator.api.simulation`: this
module adds the results folder (locked before anything is simulated, swapped in once every file
is written: :mod:`simulator.report.outputs`), the progress bar and the printed table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from simulator.api.simulation import Result, load, run, workload
from simulator.engine.steps import DEFAULT_BIN_S
from simulator.report import summary as report
from simulator.report.outputs import RunSource, default_out_dir, open_output, shown_run
from simulator.report.progress import make_progress
from simulator.report.run_folder import SIMULATE_FILES


def run_simulate(path: str, *, out: str | None, overrides: dict[str, object], quiet: bool,
                 plots: bool = True, force_profile: bool = False, steps: str = "bins",
                 step_bin_s: float = DEFAULT_BIN_S, replace: bool = False) -> tuple[Path, dict[str, Any]]:
    """Run ``kvplan simulate``: each engine × allocator of the scenario at ``path`` (with dotted
    ``overrides``), written to ``out`` (default ``runs/<name>/``). ``replace``: write over a
    folder holding a run of another scenario file (:mod:`simulator.report.outputs`). Returns the
    folder and every run's summary."""
    plan = load(path, overrides=overrides, force_profile=force_profile)
    requests = workload(plan)  # a bad trace fails here, before the output folder is touched
    scenario = plan.scenario
    source = RunSource.of("simulate", [path], scenario.model_dump(mode="json"), shown_run(path, overrides))
    out_dir = Path(out) if out else default_out_dir(scenario.name, where=path)
    # Locked from here: a second run into out_dir is refused before it simulates anything, and
    # the results replace the folder only once all of them are written (simulator/report/outputs.py).
    with open_output(out_dir, command="simulate", recognised=SIMULATE_FILES, source=source,
                     replace=replace) as folder:
        progress = make_progress(quiet)
        if progress is not None:
            with progress:
                result = run(plan, steps=steps, step_bin_s=step_bin_s, progress=progress, requests=requests)
        else:
            result = run(plan, steps=steps, step_bin_s=step_bin_s, requests=requests)
        result.write_into(folder.staging, plots=plots)
    if not quiet:
        print_result(result, out_dir)
    return out_dir, result.summaries


def print_result(result: Result, out_dir: Path) -> None:
    """The table ``simulate`` prints: the deployment, per run the headline figures, the verdict."""
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120)  # pipes: no 80-col wrap
    plan, scenario = result.plan, result.scenario
    slo = scenario.slo.model_dump() if scenario.slo else None
    if plan.disaggregated:
        from simulator.engine.disagg import transfer_line

        prefill, decode = plan.deployments["prefill"], plan.deployments["decode"]
        report.print_summary(console, result.summaries, decode.describe(), f"{scenario.name} (decode pool)",
                             out_dir, engines=[{**prefill.describe(), "pool": "prefill pool"},
                                               {**decode.describe(), "pool": "decode pool"}], slo=slo)
        console.print(transfer_line(next(iter(result.runs.values())).summary["disaggregation"]))
        return
    several = len(plan.deployments) > 1
    report.print_summary(console, result.summaries, plan.deployment.describe(), scenario.name, out_dir,
                         engines=[d.describe() for d in plan.deployments.values()] if several else None, slo=slo)
