"""``kvplan capacity``: the maximum sustainable request rate (or number of closed-loop clients,
``--search concurrency``) under the scenario's SLO, per point of a sweep and per allocator, as a
table (printed, CSV, JSON) and plots.

Examples::

    kvplan capacity scenarios/capacity-chat.yaml
    kvplan capacity scenarios/chat.yaml --allocator paged --sweep block_size=8,16,32 --seeds 1
    kvplan capacity scenarios/capacity-chat.yaml --executor ray --address auto --no-plots
    kvplan capacity scenarios/closed-loop.yaml --search concurrency     # + pareto.png/pareto.csv

With ``--target-rate``/``--growth`` the command answers the inverse question, how many replicas
hold a rate: :mod:`simulator.commands.capacity.replica_cmd`.

Exit status: 0 when every sweep point was searched; :data:`EXIT_POINTS_FAILED` (3) when some
points could not be (their rows say why; the table and files are still written); 2 for bad input,
including every point failing; 130 after Ctrl-C, which stops the worker processes at once, prints
what had finished and where the probe cache is (the same command resumes from it), and writes no
table.

The printed table fits the terminal: knobs that take one value go to the title, and the least
important columns are left out (and named) until the rest fits; ``capacity.csv`` has them all.
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from simulator.commands.capacity.disagg_search import PD_RATIO_KNOB
from simulator.commands.capacity.executors import Executor, make_executor
from simulator.commands.capacity.options import SEARCHES
from simulator.commands.capacity.options import add_parser as add_parser  # the parser of run(), kept light
from simulator.commands.capacity.pareto import ParetoPoint, pareto_points, write_pareto_csv
from simulator.commands.capacity.search import SearchResult, SearchTask, remove_partial_writes, run_chain
from simulator.commands.capacity.sweep import (
    csv_cell,
    CONCURRENCY_ONLY_FIELDS,
    RATE_ONLY_FIELDS,
    CapacityFile,
    CapacityRow,
    SweepPoint,
    failed_row,
    format_knobs,
    gpu_price,
    parse_price_arg,
    parse_sweep_arg,
    read_capacity_scenario,
    resolve_points,
    seeds_for,
    summarize_searches,
)
from simulator.commands.capacity.table import print_table
from simulator.errors import KvplanError
from simulator.report.html import write_report
from simulator.report.outputs import RunSource, default_out_dir, open_output
from simulator.config.overrides import scenario_overrides
from simulator.config.scenario import Scenario
from workloads.spec import parse_workload

CACHE_DIR = "cache"  # the probe cache under --out: kept across re-runs (simulator/report/outputs.py)
# What capacity wrote before its folders carried outputs.MARKER: such a folder may be replaced.
CAPACITY_FILES = ("capacity.csv", "capacity.json", CACHE_DIR)
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(CapacityRow) if f.name not in ("knobs", "point_index"))
EXIT_POINTS_FAILED = 3  # some sweep points failed (a typo, weights that do not fit); the others ran
T = TypeVar("T")
R = TypeVar("R")


def run(args: argparse.Namespace) -> int:
    """Run the command from parsed arguments; bad input raises KvplanError (the CLI exits 2)."""
    if not 0 < args.tolerance <= 1:
        raise KvplanError(f"--tolerance must be in (0, 1], got {args.tolerance}")
    if args.start_rate is not None and not (args.start_rate > 0 and math.isfinite(args.start_rate)):
        raise KvplanError(f"--start-rate must be a positive number, got {args.start_rate}")
    report = run_capacity(
        args.scenario, allocators=args.allocator, sweeps=args.sweep, overrides=args.set,
        num_seeds=args.seeds, tolerance=args.tolerance, start_rate=args.start_rate,
        executor=args.executor, address=args.address, jobs=args.jobs, prices=args.price, out=args.out,
        plots_on=not args.no_plots, use_cache=not args.no_cache, quiet=args.quiet, search=args.search,
        file_sweep=not args.no_sweep, warm_start=not args.no_warm_start, replace=args.replace,
    )
    failed = sum(1 for r in report.rows if r.status == "failed")
    if failed and not args.quiet:
        print(f"kvplan: capacity: {failed} of {len({r.point_index for r in report.rows})} sweep points "
              f"failed, the others were searched (exit status {report.exit_code})", file=sys.stderr)
    return report.exit_code


def capacity_source(path: str, file: Any, sweeps: Sequence[str], overrides: Sequence[str],
                    flags: dict[str, Any]) -> RunSource:
    """Whose run a capacity folder holds: the scenario file, with its resolved keys, sweep and
    search flags as the settings (:class:`simulator.report.outputs.RunSource`)."""
    words = [path, *(f"--sweep {s}" for s in sweeps), *(f"--set {o}" for o in overrides)]
    return RunSource.of("capacity", [path], {"data": file.data, "sweep": file.sweep, **flags},
                        " ".join(words))


@dataclasses.dataclass(frozen=True, slots=True)
class CapacityReport:
    """What :func:`run_capacity` wrote: the table rows, every search (probes included) and, for
    a concurrency search, the throughput-latency curve's points."""

    out_dir: Path
    rows: list[CapacityRow]
    results: list[SearchResult]
    notes: list[str]
    pareto: list[ParetoPoint] = dataclasses.field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0, or :data:`EXIT_POINTS_FAILED` when a sweep point could not be searched."""
        return EXIT_POINTS_FAILED if any(r.status == "failed" for r in self.rows) else 0


def run_capacity(path: str, *, allocators: Sequence[str] | None = None, sweeps: Sequence[str] = (),
                 overrides: Sequence[str] = (), num_seeds: int = 3, tolerance: float = 0.05,
                 start_rate: float | None = None, executor: str = "process", address: str | None = None,
                 jobs: int | None = None, prices: Sequence[str] = (), out: str | None = None,
                 plots_on: bool = True, use_cache: bool = True, quiet: bool = False,
                 search: str = "rate", file_sweep: bool = True,
                 warm_start: bool = True, replace: bool = False) -> CapacityReport:
    """Search every (point, allocator, seed), write ``capacity.csv``/``capacity.json``/plots
    (and ``pareto.csv`` for ``search="concurrency"``). ``file_sweep`` False: the file's
    ``sweep:`` is ignored, only ``sweeps`` vary. ``warm_start``: the rate searches of points
    that differ only in the sweep's last knob run as a chain, each starting from the previous
    one's answer (:func:`simulator.commands.capacity.search.run_chain`); False: each from its own bound.
    ``replace``: write over a folder holding a run of another scenario (:mod:`simulator.report.outputs`).

    Every input is checked before any simulation starts. A point that cannot be deployed is a
    ``failed`` row; if no point can be, KvplanError (after the CSV is written). Ctrl-C
    (KeyboardInterrupt) stops the searches, says what finished and propagates.
    """
    file = read_sweep(path, allocators, sweeps, overrides, file_sweep)
    if any(PD_RATIO_KNOB in key.split("+") for key in file.sweep):
        raise KvplanError(f"{PD_RATIO_KNOB} is a knob of the GPU-count search: give --target-rate or --growth")
    price_overrides = dict(parse_price_arg(p) for p in prices)
    pool = make_executor(executor, jobs=jobs, address=address)
    out_dir = Path(out) if out else default_out_dir(file.data["name"], suffix="-capacity", where=path)
    cache_dir = out_dir / CACHE_DIR if use_cache else None
    points = resolve_points(file)
    if search not in SEARCHES:
        raise KvplanError(f"unknown --search '{search}' (known: {', '.join(SEARCHES)})")
    tasks, notes = _tasks(points, file.base_dir, num_seeds, tolerance, start_rate, plots_on, cache_dir,
                          search)
    # Locked from here: a second run into out_dir is refused. The results replace the folder once
    # all are written; the probe cache stays in place (it lets an interrupted sweep resume).
    source = capacity_source(path, file, sweeps, overrides,
                             {"search": search, "seeds": num_seeds, "tolerance": tolerance,
                              "start_rate": start_rate, "prices": sorted(price_overrides.items()),
                              "warm_start": warm_start})
    with open_output(out_dir, command="capacity", keep=(CACHE_DIR,), recognised=CAPACITY_FILES,
                     source=source, replace=replace) as folder:
        if cache_dir is not None:
            remove_partial_writes(cache_dir)  # the lock is ours: any partial write is a dead run's
        started = time.perf_counter()
        finished: dict[int, SearchResult] = {}
        chains = search_chains(points, tasks, file.sweep, warm_start)
        try:
            results = run_chains(pool, tasks, chains, finished, quiet)
        except KeyboardInterrupt:
            if cache_dir is not None:
                # The executor stopped its workers before the interrupt reached here, killing those
                # that did not stop in time (at once on a second Ctrl-C): a partial write is a
                # killed worker's, and the lock is still ours.
                remove_partial_writes(cache_dir)
            _say_interrupted(points, tasks, finished, price_overrides, notes, search, cache_dir,
                             time.perf_counter() - started, quiet)
            raise
        rows = _rows(points, results, price_overrides, notes, search)
        curve = pareto_points(points, results)
        write_csv(folder.staging / "capacity.csv", rows, search)
        _write_json(folder.staging / "capacity.json", file.data, rows, results, notes, curve)
        if search == "concurrency":
            write_pareto_csv(folder.staging / "pareto.csv", curve)
        if plots_on:
            _write_plots(folder.staging / "plots", points, rows, results, curve)
        write_report(folder.staging, "capacity")  # last: report.html reads back the files above
    if not quiet:
        print_table(make_console(), rows, notes, out_dir, time.perf_counter() - started, search)
    if not any(p.error is None for p in points):
        first = points[0].error or ""
        if len(points) == 1:
            raise KvplanError(first)
        raise KvplanError(f"every sweep point failed (see {out_dir / 'capacity.csv'}); first: {first}")
    return CapacityReport(out_dir, rows, results, sorted(set(notes.values())), curve)


def read_sweep(path: str, allocators: Sequence[str] | None, sweeps: Sequence[str], overrides: Sequence[str],
               file_sweep: bool) -> CapacityFile:
    """The capacity scenario at ``path`` with the command line applied: ``--allocator`` and
    ``--set`` overrides, the file's ``sweep:`` (unless ``file_sweep`` is False) updated by
    ``--sweep`` knobs."""
    file = read_capacity_scenario(path, scenario_overrides(allocators=list(allocators or []),
                                                           extra=list(overrides)))
    sweep = dict(file.sweep) if file_sweep else {}
    sweep.update(parse_sweep_arg(s) for s in sweeps)
    return dataclasses.replace(file, sweep=sweep)


def search_chains(points: Sequence[SweepPoint], tasks: Sequence[SearchTask], sweep: dict[str, list[Any]],
                  warm_start: bool) -> list[list[int]]:
    """The tasks as chains of indices, each run in order by one worker (:func:`run_chain`): the
    rate searches started from the bound (no ``--start-rate``) of one allocator and seed at the
    points that differ only in the sweep's last knob (a zipped ``a+b`` knob counts as one), in
    sweep order; every other task alone. ``warm_start`` False: every task alone. The chains
    depend only on the tasks, never on the executor or the number of jobs, so the answers do
    not either."""
    if not warm_start or not sweep:
        return [[i] for i in range(len(tasks))]
    last = set(list(sweep)[-1].split("+"))
    knobs = {p.index: tuple((k, repr(v)) for k, v in p.knobs.items() if k not in last) for p in points}
    chains: dict[tuple[Any, ...], list[int]] = {}
    for i, task in enumerate(tasks):
        chainable = task.search == "rate" and task.start_rate_req_s is None
        key = (knobs[task.point_index], task.allocator, task.seed) if chainable else ("alone", i)
        chains.setdefault(key, []).append(i)
    return list(chains.values())


def run_searches(pool: Executor, fn: Callable[[T], R], tasks: Sequence[T], finished: dict[int, R],
                 quiet: bool, label: str = "searches") -> list[R]:
    """Run ``fn`` over every task on ``pool`` (with a progress bar of ``label`` on a terminal);
    ``finished`` collects each result as it arrives, so that an interrupted run can say what it
    had done."""
    progress = _progress(quiet)
    if progress is None:
        return pool.run(fn, tasks, finished.__setitem__)
    with progress:
        bar = progress.add_task(label, total=len(tasks))

        def done(i: int, result: R) -> None:
            finished[i] = result
            progress.advance(bar)

        return pool.run(fn, tasks, done)


class _ChainResults(dict[int, list[SearchResult]]):
    """``finished`` for :func:`run_searches` over chains: a chain's results, as they arrive, are
    also filed by task index in ``by_task`` (what an interrupted run reports)."""

    def __init__(self, chains: Sequence[Sequence[int]], by_task: dict[int, SearchResult]) -> None:
        super().__init__()
        self.chains = chains
        self.by_task = by_task

    def __setitem__(self, chain: int, results: list[SearchResult]) -> None:
        super().__setitem__(chain, results)
        self.by_task.update(zip(self.chains[chain], results))


def run_chains(pool: Executor, tasks: Sequence[SearchTask], chains: Sequence[Sequence[int]],
               finished: dict[int, SearchResult], quiet: bool) -> list[SearchResult]:
    """Run each chain of ``tasks`` (lists of indices into it, :func:`search_chains`) with
    :func:`run_chain` on ``pool``; the results in task order. ``finished`` collects them by task
    index as each chain ends."""
    label = "searches" if len(chains) == len(tasks) else f"chains of {len(tasks)} searches"
    run_searches(pool, run_chain, [[tasks[i] for i in chain] for chain in chains],
                 _ChainResults(chains, finished), quiet, label)
    return [finished[i] for i in range(len(tasks))]


def _say_interrupted(points: list[SweepPoint], tasks: list[SearchTask], finished: dict[int, SearchResult],
                     prices: dict[str, float], notes: dict[int, str], search: str, cache_dir: Path | None,
                     elapsed_s: float, quiet: bool) -> None:
    """After Ctrl-C: the rows whose searches had all finished (printed, not written), how many
    searches finished and where the cache that resumes the rest is (stderr)."""
    needed: dict[tuple[int, str], int] = {}
    for task in tasks:
        needed[task.point_index, task.allocator] = needed.get((task.point_index, task.allocator), 0) + 1
    got: dict[tuple[int, str], list[SearchResult]] = {}
    for i in sorted(finished):
        got.setdefault((finished[i].point_index, finished[i].allocator), []).append(finished[i])
    complete = {key for key, results in got.items() if len(results) == needed[key]}
    if complete and not quiet:
        rows = [summarize_searches(point, allocator, got[point.index, allocator],
                                   gpu_price(point.deployment, prices), notes.get(point.index))
                for point in points if point.deployment is not None
                for allocator in (point.scenario.allocators if point.scenario else [])
                if (point.index, allocator) in complete]
        print_table(make_console(), rows, notes, None, elapsed_s, search,
                    title="finished before the interrupt (not written)")
    say_interrupted(cache_dir, len(finished), len(tasks), elapsed_s)


def say_interrupted(cache_dir: Path | None, num_finished: int, num_tasks: int, elapsed_s: float) -> None:
    """After Ctrl-C (stderr): how many searches finished and where the cache that resumes the
    rest is."""
    if cache_dir is None:
        where = "nothing was cached (--no-cache): the same command starts over"
    else:
        num_probes = sum(1 for _ in cache_dir.glob("*.json"))
        where = (f"{num_probes} probes are cached in {cache_dir}: the same command resumes from them")
    print(f"kvplan: capacity interrupted after {elapsed_s:.1f} s: {num_finished} of {num_tasks} searches "
          f"finished; {where}", file=sys.stderr, flush=True)


def make_console() -> Console:
    """A terminal's own width; a wide table when redirected to a file (a file has no width)."""
    return Console() if sys.stdout.isatty() else Console(width=250)


def _tasks(points: list[SweepPoint], base_dir: Path, num_seeds: int, tolerance: float,
           start_rate: float | None, record_steps: bool, cache_dir: Path | None,
           search: str = "rate") -> tuple[list[SearchTask], dict[int, str]]:
    tasks: list[SearchTask] = []
    notes: dict[int, str] = {}
    for point in points:
        if point.scenario is None:
            continue
        note = check_searchable(point.scenario, point.where, search)
        seeds, seed_note = seeds_for(point.scenario, num_seeds, search)
        if note or seed_note:
            notes[point.index] = "; ".join(n for n in (seed_note, note) if n)
        # the doubling from one client also measures the curve's points; a rate search without
        # --start-rate starts below the deployment's analytic ceiling (simulator.commands.capacity.bound)
        start = 1.0 if search == "concurrency" else start_rate
        # The canonical mapping (defaults left out) names the point in the cache, however it was written.
        canonical = point.scenario.model_dump(mode="json", exclude_defaults=True)
        for allocator in point.scenario.allocators:
            for seed in seeds:
                data = {**copy.deepcopy(canonical), "allocators": [allocator], "seed": seed}
                tasks.append(SearchTask(point.index, data, point.where, str(base_dir.resolve()), allocator,
                                        seed, start, tolerance, record_steps,
                                        str(cache_dir.resolve()) if cache_dir else None, search,
                                        curve=search == "concurrency" and seed == seeds[0]))
    return tasks, notes


def check_searchable(scenario: Scenario, where: str, search: str) -> str | None:
    """Raise KvplanError when the workload cannot be searched this way; a note for the table
    when the search changes how it is sent."""
    spec = scenario.workload
    if search == "rate":
        if spec.closed_loop:
            raise KvplanError(f"{where}: workload.concurrency sends requests from closed-loop clients, "
                              "which have no rate to search: use --search concurrency")
        # the search sets a finite rate: the workload must then be valid (arrival times needed)
        try:
            parse_workload({**spec.model_dump(exclude_unset=True), "rate": 1.0, "rate_scale": None}, where)
        except KvplanError:
            if spec.rate is not None and math.isinf(spec.rate):
                raise KvplanError(f"{where}: workload.rate: inf is a burst (every request at t = 0), which "
                                  "has no rate to search: give workload.arrival (e.g. {process: poisson, "
                                  "rate: 1}) to search its rate, or use --search concurrency") from None
            raise
        return None
    try:
        spec.closed_loop_at(1, where)  # e.g. a synthetic duration_s: no requests without a rate
    except KvplanError as err:
        raise KvplanError(f"{err} (with 1 client, where --search concurrency starts)") from None
    dropped = [k for k in ("rate", "rate_scale", "arrival", "max_concurrency")
               if getattr(spec, k) is not None]
    if dropped:
        return f"closed-loop clients ignore the workload's {', '.join(dropped)}"
    return None


def _rows(points: list[SweepPoint], results: list[SearchResult], prices: dict[str, float],
          notes: dict[int, str], search: str = "rate") -> list[CapacityRow]:
    grouped: dict[tuple[int, str], list[SearchResult]] = {}
    for r in results:
        grouped.setdefault((r.point_index, r.allocator), []).append(r)
    rows = []
    for point in points:
        if point.scenario is None or point.deployment is None:
            rows.append(failed_row(point, "", search))
            continue
        price = gpu_price(point.deployment, prices)
        for allocator in point.scenario.allocators:
            rows.append(summarize_searches(point, allocator, grouped[point.index, allocator], price,
                                           notes.get(point.index)))
    return rows


def _progress(quiet: bool) -> Progress | None:
    if quiet or not sys.stderr.isatty():
        return None
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True))


# --- outputs --------------------------------------------------------------------------------


def write_csv(path: Path, rows: Sequence[CapacityRow], search: str = "rate") -> None:
    """One line per row: ``point``, the knobs (their union, in sweep order), then the row's fields
    (those of the other search left out)."""
    knobs = list(dict.fromkeys(k for r in rows for k in r.knobs if k != "allocators"))
    other = CONCURRENCY_ONLY_FIELDS if search == "rate" else RATE_ONLY_FIELDS
    fields = [name for name in ROW_FIELDS if name not in other]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["point", *knobs, *fields])
        for r in rows:
            writer.writerow([r.point_index, *(csv_cell(r.knobs.get(k)) for k in knobs),
                             *(csv_cell(getattr(r, name)) for name in fields)])


def _write_json(path: Path, scenario: dict[str, Any], rows: Sequence[CapacityRow], results: Sequence[SearchResult],
                notes: dict[int, str], curve: Sequence[ParetoPoint] = ()) -> None:
    searches = []
    for r in results:
        entry: dict[str, Any] = {
            "point": r.point_index, "allocator": r.allocator, "seed": r.seed, "search": r.search,
            "lo_rate_req_s": r.lo_rate_req_s, "hi_rate_req_s": r.hi_rate_req_s,
            "probes": [p.to_json() for p in r.probes], "at_max": r.at_max.to_json() if r.at_max else None,
            "bound": dataclasses.asdict(r.bound) if r.bound is not None else None}
        if r.search == "concurrency":
            entry.update(lo_concurrency=r.lo_concurrency, hi_concurrency=r.hi_concurrency,
                         curve=[p.to_json() for p in r.curve])
        searches.append(entry)
    # the scenario (sweep removed) as read: report.html states its SLO and setup
    body: dict[str, Any] = {"scenario": scenario, "rows": [dataclasses.asdict(r) for r in rows], "searches": searches,
                            "notes": {str(k): v for k, v in sorted(notes.items())}}
    if curve:
        body["pareto"] = [dataclasses.asdict(p) for p in curve]
    path.write_text(json.dumps(body, indent=1, sort_keys=True, default=str) + "\n")


def _write_plots(plot_dir: Path, points: list[SweepPoint], rows: list[CapacityRow],
                 results: list[SearchResult], curve: Sequence[ParetoPoint] = ()) -> None:
    # matplotlib (~0.5 s of CPU to import) only when plots are drawn: not with --no-plots
    from simulator.commands.capacity import plots

    by_point: dict[int, dict[str, list[SearchResult]]] = {}
    for r in results:
        by_point.setdefault(r.point_index, {}).setdefault(r.allocator, []).append(r)
    for point in points:
        if point.scenario is None or point.index not in by_point:
            continue
        assert point.scenario.slo is not None and point.deployment is not None
        title = f"{point.deployment.model.name} on {point.deployment.gpu.name}"
        title += f" — {format_knobs(point.knobs)}" if point.knobs else ""
        plots.plot_point(plot_dir / "points" / f"{point.index:03d}.png", title, by_point[point.index],
                         point.scenario.slo)
    plots.plot_capacity_vs_block_size(plot_dir / "capacity_vs_block_size.png", rows)
    plots.plot_capacity_per_dollar(plot_dir / "capacity_per_dollar.png", rows)
    setups = dict.fromkeys(f"{p.deployment.model.name} on {p.deployment.gpu.name}" for p in points
                           if p.deployment is not None and any(c.point_index == p.index for c in curve))
    plots.plot_pareto(plot_dir / "pareto.png", curve, "; ".join(setups))

