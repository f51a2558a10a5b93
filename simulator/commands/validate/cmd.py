"""``kvplan validate``: published GPU measurements vs kvplan's predictions, and the roofline fit.

::

    kvplan validate                       # every row of validation/published.csv, fitted defaults
    kvplan validate --source nim --source trtllm-perf --out runs/validate
    kvplan validate --fit                 # refit the roofline constants, leave one source out
    kvplan validate --fit --write         # ... and make them the defaults (roofline_fit.json)
    kvplan validate --silicon             # AIConfigurator's silicon sample (validation/silicon.csv)
    kvplan validate --silicon --fit       # per-architecture constants, leave one model family out

Writes ``validate.csv`` (one row per published measurement: published, predicted, error, the
held-out prediction), ``validate.json`` (MAPE and bias per metric and per source, the targets,
the constants) and ``validate.png`` (predicted vs published, log–log, ±20% bands).

Every run also reports its **coverage**: per GPU × engine × model family, how many rows were
simulated, refused by kvplan's start-up checks (vLLM would not start them), or could not be
expressed, and why (printed, ``summary.coverage`` in validate.json, report.html).

``--silicon`` (or ``--table`` naming a table with the silicon columns) validates against
validation/silicon.csv, AIConfigurator's measured TTFT/TPOT sample with each row's method
(:mod:`simulator.commands.validate.silicon`): rows become scenarios with the client that
measured them (:mod:`simulator.commands.validate.silicon_run`), the errors headline the rows whose
method is established, the others are reported apart (:mod:`simulator.commands.validate.silicon_report`).
``--silicon --fit`` fits a set of roofline constants per GPU architecture on the established
silicon rows, leaves each model family out in turn and compares with the global set
(:mod:`simulator.commands.validate.silicon_fit`); ``--silicon --fit --write`` puts the sets that
beat the global one held out into roofline_fit.json, for their architecture's GPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import KvplanError
from simulator.latency import constants as rc
from simulator.latency.constants import FIELDS, RooflineConstants
from simulator.report.outputs import RUNS_DIR, RunSource, add_replace_arg, check_output, open_output
from simulator.commands.validate.setups import Setup, group_setups
from simulator.commands.validate.silicon import default_silicon_path, is_silicon_table
from simulator.commands.validate.table import default_table_path, read_table, select_sources

if TYPE_CHECKING:
    from rich.progress import Progress

    from simulator.commands.validate.predict import SetupResult

# The CLI imports this module for every command (it adds the ``validate`` parser), so what only
# running the command needs — the simulator, pandas, matplotlib, rich — is imported when it runs.

# What validate wrote before its folders carried outputs.MARKER: such a folder may be replaced.
VALIDATE_FILES = ("validate.csv", "validate.json")
FIT_ROUNDS = 3  # re-simulate and refit until the objective settles (it does in 2–3)
HELD_OUT_EVALS = 800  # Nelder–Mead evaluations of each leave-one-source-out fit
# prefill_overhead_s stays 0: on the published data it trades almost one for one with
# request_overhead_s (the fit objective within 1% either way), and a fixed cost per step that
# carries a prefill chunk would slow every loaded step of a chat trace — which vLLM V1, running
# prefill chunks and decodes in one forward pass, does not pay. What TTFT benchmarks show at low
# load is the serving front end's per-request delay, so that is the term fitted.
FIT_PARAMS: tuple[str, ...] = tuple(f for f in FIELDS if f != "prefill_overhead_s")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate", help="published GPU measurements vs kvplan's predictions",
        description="Run every published measurement of validation/published.csv through the simulator "
                    "and report the error per row, per metric and per source (with --fit: refit the "
                    "roofline constants and measure them leaving one source out).")
    p.add_argument("--source", action="append", metavar="KEY", help="only this source (repeatable)")
    p.add_argument("--table", help="the table to validate against (default: validation/published.csv)")
    p.add_argument("--silicon", action="store_true",
                   help="validate against validation/silicon.csv (AIConfigurator's silicon sample)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="with the silicon table: simulate in N processes (default: the CPUs this "
                        "process may use, at most 8)")
    p.add_argument("--out", help="output folder (default: runs/validate/)")
    add_replace_arg(p)
    p.add_argument("--fit", action="store_true",
                   help="refit the roofline constants on the table and report leave-one-source-out errors "
                        "(with --silicon: a set per GPU architecture, leave one model family out)")
    p.add_argument("--write", action="store_true",
                   help="with --fit: write the fitted constants as kvplan's defaults (with --silicon: "
                        "the architecture sets that beat the global one held out)")
    p.add_argument("--rows", action="store_true", help="print every row, not only the summaries")
    p.add_argument("--no-plots", action="store_true", help="skip validate.png")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from simulator.report.html import write_report
    from simulator.commands.validate import report
    from simulator.commands.validate.predict import simulate_setup

    if args.write and not args.fit:
        raise KvplanError("--write writes fitted constants: give --fit too")
    _jobs(args.jobs)  # a bad --jobs fails now, not after the table is read
    if args.write and (args.source or args.table):
        raise KvplanError("--write fits the defaults on the whole shipped table: drop --source/--table")
    if args.silicon and args.table:
        raise KvplanError("--silicon is --table validation/silicon.csv: give one of them")
    if args.silicon or (args.table and is_silicon_table(args.table)):
        return _run_silicon(args)
    table = Path(args.table) if args.table else default_table_path()
    rows = select_sources(read_table(table), args.source)
    out_dir = Path(args.out) if args.out else RUNS_DIR / "validate"
    words = ["validate", *([f"--table {args.table}"] if args.table else []),
             *(f"--source {s}" for s in args.source or ()), *(["--fit"] if args.fit else [])]
    source = RunSource.of("validate", [table], {"sources": args.source, "fit": args.fit}, " ".join(words))
    # a bad --out fails now, not after the simulations
    check_output(out_dir, recognised=VALIDATE_FILES, command="validate", source=source, replace=args.replace)
    console = Console() if sys.stdout.isatty() else Console(width=140)
    setups = group_setups(rows)
    skipped = {r.row_id: s.skip_reason for s in setups if s.skip_reason for r in s.rows}
    runnable = [s for s in setups if not s.skip_reason]
    total = len(runnable) * ((FIT_ROUNDS + 1) if args.fit else 1)  # a fit's rounds: one simulation each
    progress = _progress(args.quiet)
    held_out: dict[str, float] | None = None
    fit_info: dict[str, Any] | None = None
    with progress if progress is not None else contextlib.nullcontext():
        task = progress.add_task("validate", total=total, unit="simulations") if progress is not None else None
        tick = (lambda: progress.advance(task)) if progress is not None else (lambda: None)
        if args.fit:
            constants, results, held_out, fit_info = fit_defaults(runnable, tick)
            fit_info["rows_skipped"] = dict(sorted(skipped.items()))  # not simulatable: the row says why
        else:
            constants = None
            results = [simulate_setup(s, None, record=False) for s in _ticking(runnable, tick)]
    items = report.outcomes(rows, results, skipped, held_out)
    summary = report.summarize(items)
    used = _constants_used(results)
    notes = []
    if not args.fit:
        # Held-out errors need refits; without --fit, show the ones the defaults were written with.
        stored = rc.fit_provenance()
        digest = stored.get("error", {}).get("held_out_mape")
        if digest:
            held = report.held_out_from_fit(digest)
            if args.source or args.table:  # the fit's overall figures are not this selection's
                held = {"overall": {"mape": None}, "by_metric": {},
                        "by_source": {k: v for k, v in held["by_source"].items()
                                      if k in summary["in_sample"]["by_source"]}}
            summary["held_out"] = held
            summary["targets"] = report.targets(summary["held_out"])
            notes.append(f"held-out MAPE: as measured when the defaults were fitted ({stored.get('num_rows')} "
                         "rows); kvplan validate --fit measures it again")
        if stored.get("table_sha256") and stored["table_sha256"] != _sha256(default_table_path()):
            notes.append("the defaults were fitted on another version of validation/published.csv: "
                         "refit with kvplan validate --fit --write")
    summary["notes"] = notes
    summary["coverage"] = report.coverage((o.row.row_id, o.row.gpu, o.row.engine, report.family_of(o.row.model),
                                           o.status) for o in items)
    summary["coverage_totals"] = report.coverage_totals(summary["coverage"])
    payload = {"table": str(table), "constants": used, "fit": fit_info, "summary": summary}
    # Locked while it writes: the results replace the folder as a whole (simulator/report/outputs.py).
    with open_output(out_dir, command="validate", recognised=VALIDATE_FILES, source=source,
                     replace=args.replace) as folder:
        report.write_csv(folder.staging / "validate.csv", items)
        _write_json(folder.staging / "validate.json", payload)
        if not args.no_plots:
            report.plot(folder.staging / "validate.png", items,
                        f"kvplan vs {summary['num_simulated']} published measurements "
                        f"({summary['num_sources']} sources)")
        write_report(folder.staging, "validate")  # last: report.html reads back the files above
    if args.write:
        assert fit_info is not None and constants is not None
        fit_info["error"] = _error_digest(summary)
        write_fit(constants, fit_info)
    if not args.quiet:
        report.print_report(console, items, summary, constants=used, out_dir=out_dir, rows_table=args.rows)
        report.print_coverage(console, summary["coverage"])
        for note in notes:
            console.print(f"note: {note}")
        if args.write:
            console.print(f"wrote the fitted defaults to {rc.FIT_PATH}")
    return 0


def _run_silicon(args: argparse.Namespace) -> int:
    """``kvplan validate --silicon``: the silicon table's rows as scenarios, simulated once per
    distinct setup with the fitted defaults; errors of the established rows, the others apart,
    the coverage (simulator/commands/validate/silicon_report.py)."""
    import time

    from rich.console import Console

    from simulator.commands.validate import report, silicon_report, silicon_run
    from simulator.commands.validate.silicon import read_silicon
    from simulator.report.html import write_report

    table = Path(args.table) if args.table else default_silicon_path()
    if not table.is_file():
        raise KvplanError(f"validation table '{table}' not found (validation/silicon_convert.py writes it)")
    rows, extras = read_silicon(table)
    rows = select_sources(rows, args.source)
    out_dir = Path(args.out) if args.out else RUNS_DIR / "validate"
    words = ["validate", "--silicon" if args.silicon else f"--table {args.table}",
             *(f"--source {s}" for s in args.source or ()), *(["--fit"] if args.fit else [])]
    source = RunSource.of("validate", [table], {"sources": args.source, "silicon": True, "fit": args.fit},
                          " ".join(words))
    check_output(out_dir, recognised=VALIDATE_FILES, command="validate", source=source, replace=args.replace)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    setups = silicon_run.group(rows, extras)
    progress = _progress(args.quiet)
    start = time.monotonic()
    with progress if progress is not None else contextlib.nullcontext():
        task = (progress.add_task("validate", total=silicon_run.count_runs(setups), unit="simulations")
                if progress is not None else None)
        tick = (lambda: progress.advance(task)) if progress is not None else (lambda: None)
        results = silicon_run.run_all(setups, tick, jobs=_jobs(args.jobs), global_set=args.fit, record=args.fit)
        items, info = silicon_report.outcomes(rows, extras, results)
        fits = None
        if args.fit:
            from simulator.commands.validate import silicon_fit
            from simulator.kv.gpus import get_gpu

            established = {i for i, x in info.items() if x["bucket"] == "established"}
            fit_tick = lambda: None
            if progress is not None:
                fit_task = progress.add_task("fit", total=silicon_fit.count_fits(results, established, extras),
                                             unit="fits")
                fit_tick = lambda: progress.advance(fit_task)
            fits = silicon_fit.fit_architectures(results, established, extras,
                                                 lambda g: rc.global_constants(get_gpu(g)), jobs=_jobs(args.jobs),
                                                 tick=fit_tick)
    summary = silicon_report.summarize(items, info, extras, results, time.monotonic() - start)
    used = dict(rc.read_fit()["constants"])
    summary["notes"].append("errors headline the rows whose method is established (bucket 'established'); "
                            "the other buckets are reported apart and not fitted")
    fit_info = None
    if fits is not None:
        fit_info = silicon_fit.summary(fits, extras)
        summary["architecture_fit"] = fit_info
        summary["notes"].append("with --fit every row is simulated with the global constants (fitted on "
                                "published.csv); the architecture sets are fitted on the established rows")
    else:
        sets = sorted(rc.read_fit().get("per_architecture", {}))
        if sets:
            summary["notes"].append(f"the {', '.join(sets)} GPUs take their architecture's constants, fitted on "
                                    "these established rows: their errors here are in sample (held out by model "
                                    "family: kvplan validate --silicon --fit)")
    payload = {"table": str(table), "constants": used, "fit": fit_info, "summary": summary}
    with open_output(out_dir, command="validate", recognised=VALIDATE_FILES, source=source,
                     replace=args.replace) as folder:
        report.write_csv(folder.staging / "validate.csv", items, silicon_report.CSV_EXTRA, info)
        _write_json(folder.staging / "validate.json", payload)
        if not args.no_plots:
            established = [o for o in items if info[o.row.row_id]["bucket"] == "established"]
            report.plot(folder.staging / "validate.png", established,
                        f"kvplan vs {sum(1 for o in established if o.predicted is not None)} silicon-sample "
                        "measurements (method established)")
        write_report(folder.staging, "validate")
    if not args.quiet:
        report.print_report(console, [o for o in items if info[o.row.row_id]["bucket"] == "established"],
                            summary, constants=used, out_dir=out_dir, rows_table=args.rows)
        silicon_report.print_extras(console, summary)
        if fit_info is not None:
            silicon_report.print_architecture_fit(console, fit_info)
        for note in summary["notes"]:
            console.print(f"note: {note}")
    if args.write:
        assert fits is not None
        write_architecture_fit(fits, table)
        if not args.quiet:
            console.print(f"wrote the adopted architecture sets to {rc.FIT_PATH}")
    return 0


def fit_defaults(setups: Sequence[Setup], tick: Callable[[], None]
                 ) -> tuple[RooflineConstants, list[SetupResult], dict[str, float], dict[str, Any]]:
    """Fit the constants in rounds (simulate with recording, re-timed fit), then leave one
    source out on the last round's recordings. Returns the constants, the last round's results
    (simulated with them), the held-out predictions and the fit's provenance: everything the
    fit depends on besides the simulator — the table's hash, the rows fitted and why the others
    were not, the start, the parameters and the budgets — so that a test can tell, without
    fitting, whether the shipped constants came from the current table (the fit is
    deterministic: the same inputs give the same constants, bit for bit)."""
    from simulator.commands.validate import fit as fitting
    from simulator.commands.validate.predict import simulate_setup

    def simulate(setup: Setup, constants: RooflineConstants) -> SetupResult:
        result = simulate_setup(setup, constants, record=True)
        tick()
        return result

    current, results, history = fitting.fit_in_rounds(setups, _start_constants(), params=FIT_PARAMS,
                                                      rounds=FIT_ROUNDS, simulate=simulate)
    ok = [r for r in results if r.error is None]
    held_out = fitting.leave_one_source_out(ok, current, params=FIT_PARAMS, max_evals=HELD_OUT_EVALS)
    rows = [r for res in ok if res.recording is not None for r in res.setup.rows]
    not_fitted = {r.row_id: res.status for res in results if res.error is not None or res.recording is None
                  for r in res.setup.rows}
    info = {
        "fitted_on": "validation/published.csv",
        "table_sha256": _sha256(default_table_path()),
        "date": dt.date.today().isoformat(),
        "parameters": list(FIT_PARAMS),
        "fixed": {k: getattr(current, k) for k in FIELDS if k not in FIT_PARAMS},
        "start": {k: getattr(_start_constants(), k) for k in FIELDS},
        "budget": {"rounds": FIT_ROUNDS, "round_evals": fitting.ROUND_EVALS, "held_out_evals": HELD_OUT_EVALS,
                   "improvement": fitting.IMPROVEMENT, "backtracks": list(fitting.BACKTRACKS)},
        "objective": "mean |ln(predicted / published)|, every source weighing the same",
        "num_rows": len(rows),
        "sources": sorted({r.source for r in rows}),
        "rows": sorted(r.row_id for r in rows),
        "rows_not_fitted": dict(sorted(not_fitted.items())),
        "rounds": history,
    }
    return current, results, held_out, info


def write_architecture_fit(fits: Any, table: Path) -> None:
    """Put the adopted architecture sets (silicon_fit.py) in ``roofline_fit.json`` beside the
    global set, with what they were fitted on, and record what ``kvplan validate`` gives on the
    published table under the new defaults (``fit.defaults_error``)."""
    from simulator.commands.validate import silicon_fit

    data = rc.read_fit()
    data = {**data, "per_architecture": silicon_fit.constants_block(fits)}
    data["fit"] = {**data["fit"], "per_architecture": {
        "fitted_on": "validation/silicon.csv (bucket 'established')",
        "table_sha256": _sha256(table),
        "date": dt.date.today().isoformat(),
        "parameters": list(silicon_fit.FIT_PARAMS),
        "budget": {"evals": silicon_fit.FIT_EVALS, "held_out_evals": silicon_fit.HELD_OUT_EVALS,
                   "min_rows": silicon_fit.MIN_ROWS, "train_per_cell": silicon_fit.TRAIN_PER_CELL},
        "objective": "mean |ln(predicted / measured)|, every engine × model family weighing the same",
        "adoption": "adopted where leave-one-model-family-out MAPE beats the global set's on the same rows",
        "architectures": {a: {**_architecture_digest(f), "adopted": f.adopted} for a, f in fits.items()},
    }}
    data["inputs"] = {**data.get("inputs", {}),
                      "per_architecture_rows": {a: [r.row_id for r in f.rows] for a, f in fits.items()}}
    _write_json(rc.FIT_PATH, data)
    rc.read_fit.cache_clear()
    record_defaults_error()


def _architecture_digest(f: Any) -> dict[str, Any]:
    return {"num_rows": len(f.rows), "setups_fitted": f.num_trained, "cells": f.cells, "evals": f.num_evals,
            "objective": f.objective, "start_objective": f.start_objective,
            "mape": {name: {m: f.mape(preds, metric=m) for m in ("ttft", "tpot")}
                     for name, preds in (("global", f.global_), ("fitted", f.fitted), ("held_out", f.held_out))}}


def record_defaults_error() -> None:
    """Simulate the published table with the shipped defaults (global and architecture sets) and
    record its errors as ``fit.defaults_error``: what ``kvplan validate`` must reproduce."""
    from simulator.commands.validate import report
    from simulator.commands.validate.predict import simulate_setup

    rows = read_table(default_table_path())
    setups = group_setups(rows)
    skipped = {r.row_id: s.skip_reason for s in setups if s.skip_reason for r in s.rows}
    results = [simulate_setup(s, None, record=False) for s in setups if not s.skip_reason]
    summary = report.summarize(report.outcomes(rows, results, skipped, None))
    data = rc.read_fit()
    held = data["fit"].get("error", {}).get("held_out_mape")
    summary["held_out"] = report.held_out_from_fit(held) if held else summary["held_out"]
    summary["targets"] = report.targets(summary["held_out"])
    data = {**data, "fit": {**data["fit"], "defaults_error": _error_digest(summary)}}
    _write_json(rc.FIT_PATH, data)
    rc.read_fit.cache_clear()


def write_fit(constants: RooflineConstants, info: dict[str, Any]) -> None:
    """Write ``roofline_fit.json``: the constants for every GPU (one all-reduce latency for both
    interconnect kinds: the table has no PCIe-only TP > 1 row to tell them apart). The row lists
    go under ``inputs``, beside ``fit``: every run.json carries ``fit`` (the provenance of its
    constants), and the lists would only bloat it."""
    values = {k: getattr(constants, k) for k in FIELDS}
    lists = ("rows", "rows_not_fitted", "rows_skipped")
    old = rc.read_fit()  # the architecture sets (validate --silicon --fit --write) stay as they were
    data = {
        "kvplan_roofline_fit": rc.FIT_VERSION,
        "constants": values,
        "per_architecture": old.get("per_architecture", {}),
        "per_gpu": {},
        "allreduce_latency_s": {"fabric": values["allreduce_latency_s"],
                                "pcie": values["allreduce_latency_s"]},
        "fit": {**{k: v for k, v in info.items() if k not in lists},
                **({"per_architecture": old["fit"]["per_architecture"]}
                   if "per_architecture" in old.get("fit", {}) else {})},
        "inputs": {**{k: info[k] for k in lists if k in info},
                   **({"per_architecture_rows": old["inputs"]["per_architecture_rows"]}
                      if "per_architecture_rows" in old.get("inputs", {}) else {})},
    }
    _write_json(rc.FIT_PATH, data)
    rc.read_fit.cache_clear()
    if data["per_architecture"]:
        record_defaults_error()  # the published rows of those GPUs take their architecture's set


def _error_digest(summary: dict[str, Any]) -> dict[str, Any]:
    """The fit's errors as the fit file records them: MAPE in sample and held out, per metric
    group and per source (what ``kvplan validate`` and the regression test compare against)."""
    def mapes(block: dict[str, Any]) -> dict[str, Any]:
        return {"overall": block["overall"]["mape"],
                "by_metric": {k: v["mape"] for k, v in block["by_metric"].items()},
                "by_source": {k: v["mape"] for k, v in block["by_source"].items()}}
    return {"num_rows_simulated": summary["num_simulated"],
            "in_sample_mape": mapes(summary["in_sample"]),
            "held_out_mape": mapes(summary["held_out"]),
            "targets": summary["targets"]}


def _start_constants() -> RooflineConstants:
    """Where the fit starts: datasheet-style guesses, not the current defaults (so a refit does
    not depend on the last one)."""
    return RooflineConstants(mem_efficiency=0.8, flops_efficiency=0.6, fp8_flops_efficiency=0.6,
                             moe_flops_efficiency=0.6, step_overhead_s=0.003, prefill_overhead_s=0.0,
                             allreduce_latency_s=1e-5, request_overhead_s=0.02)


def _constants_used(results: Sequence[SetupResult]) -> dict[str, float]:
    for res in results:
        if res.constants is not None:
            return {k: getattr(res.constants, k) for k in FIELDS}
    return dict(rc.read_fit()["constants"])  # nothing ran: the defaults a run would have used


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_json(path: Path, data: Any) -> None:
    from simulator.report.files import write_json

    write_json(path, data)  # atomic, through a temporary name of its own


def _ticking(items: Sequence[Setup], tick: Callable[[], None]):  # type: ignore[no-untyped-def]
    for s in items:
        yield s
        tick()


def _jobs(given: int | None) -> int:
    """``--jobs``, or the CPUs this process may use (at most 8)."""
    import os

    if given is not None:
        if given < 1:
            raise KvplanError(f"--jobs must be at least 1, got {given}")
        return given
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _progress(quiet: bool) -> Progress | None:
    if quiet or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), console=Console(stderr=True),
                    transient=True)


__all__ = ["add_parser", "fit_defaults", "run", "write_fit"]
