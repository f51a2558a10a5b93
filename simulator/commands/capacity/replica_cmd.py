"""``kvplan capacity SCENARIO --target-rate R``: how many GPUs, laid out how, hold R under the SLO.

For each sweep point (a layout: model × GPU × TP × block size × KV dtype × engine ...), allocator
and target rate, the fewest replicas — data-parallel copies of the point's TP group — that meet
the scenario's ``slo:`` at R (:mod:`simulator.commands.capacity.replicas`), their GPUs, cost per hour and
per million output tokens (:mod:`simulator.commands.capacity.replica_table`), as a table (printed,
``capacity.csv``, ``capacity.json``) and plots (:mod:`simulator.commands.capacity.replica_plots`).
A point with ``disaggregation:`` (or a ``pd_ratio`` knob) is a disaggregated layout: the fewest
prefill and decode replicas at its P:D ratio (:mod:`simulator.commands.capacity.disagg_search`), in the
same table with its ``layout``.

Examples::

    kvplan capacity scenarios/cluster.yaml --target-rate 40
    kvplan capacity scenarios/cluster-disagg.yaml --growth 1,2      # agg vs P:D 1:1, 1:2, 2:1
    kvplan capacity scenarios/cluster.yaml --target-rate 20,40,80 --max-replicas 32
    kvplan capacity scenarios/capacity-chat.yaml --growth 3 --no-sweep   # 3 × today's rate

``--growth G`` is a target of G × the workload's own rate: the mean rate of the requests the
scenario sends as written (a trace's selection with its ``rate_scale``; a synthetic workload's
``rate``). Targets from both flags are searched alike. Probes share the rate search's cache
(``--out``/cache), executors (``--jobs``, ``--executor ray``), early stop and exit statuses.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator.commands.capacity.cmd import (
    CACHE_DIR,
    CAPACITY_FILES,
    EXIT_POINTS_FAILED,
    capacity_source,
    check_searchable,
    make_console,
    read_sweep,
    run_searches,
    say_interrupted,
)
from simulator.commands.capacity.executors import make_executor
from simulator.commands.capacity.options import DEFAULT_MAX_REPLICAS
from simulator.commands.capacity.replica_table import (
    ReplicaRow,
    failed_row,
    print_replica_table,
    summarize_replicas,
    write_replica_csv,
)
from simulator.commands.capacity.replicas import ReplicaResult, ReplicaTask, run_replica_search
from simulator.commands.capacity.search import remove_partial_writes
from simulator.commands.capacity.disagg_search import PD_RATIO_KNOB, parse_pd_ratio
from simulator.commands.capacity.sweep import (
    CapacityFile,
    SweepPoint,
    expand_sweep,
    parse_price_arg,
    resolve_points,
    seeds_for,
)
from simulator.errors import KvplanError
from simulator.report.html import write_report
from simulator.report.outputs import default_out_dir, open_output
from simulator.config.scenario import Scenario
from workloads.spec import build_requests
from workloads.synthetic import mean_rate_per_s


def parse_rates(values: Sequence[str], flag: str) -> list[float]:
    """``["10,20", "40"]`` -> ``[10.0, 20.0, 40.0]``: each a positive finite number, else a
    one-line KvplanError naming ``flag`` and the value."""
    out = []
    for text in values:
        for item in text.split(","):
            try:
                value = float(item)
            except ValueError:
                value = math.nan
            if not (value > 0 and math.isfinite(value)):
                raise KvplanError(f"{flag} expects positive numbers (comma-separated or repeated), "
                                  f"got '{item}'")
            out.append(value)
    return out


def run(args: argparse.Namespace) -> int:
    """Run the command from parsed arguments; bad input raises KvplanError (the CLI exits 2)."""
    targets = parse_rates(args.target_rate or [], "--target-rate")
    growths = parse_rates(args.growth or [], "--growth")
    if args.search != "rate":
        raise KvplanError("--target-rate and --growth search replicas at a rate: "
                          "not with --search concurrency")
    if args.start_rate is not None:
        raise KvplanError("--start-rate starts a rate search; with --target-rate the rate is fixed")
    if args.max_replicas < 1:
        raise KvplanError(f"--max-replicas must be at least 1, got {args.max_replicas}")
    report = run_replica_capacity(
        args.scenario, target_rates=targets, growths=growths, max_replicas=args.max_replicas,
        allocators=args.allocator, sweeps=args.sweep, overrides=args.set, num_seeds=args.seeds,
        executor=args.executor, address=args.address, jobs=args.jobs, prices=args.price, out=args.out,
        plots_on=not args.no_plots, use_cache=not args.no_cache, quiet=args.quiet,
        file_sweep=not args.no_sweep, replace=args.replace)
    failed = {r.point_index for r in report.rows if r.status == "failed"}
    if failed and not args.quiet:
        print(f"kvplan: capacity: {len(failed)} of {len({r.point_index for r in report.rows})} sweep points "
              f"failed, the others were searched (exit status {report.exit_code})", file=sys.stderr)
    return report.exit_code


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaReport:
    """What :func:`run_replica_capacity` wrote: the rows and every search (probes included)."""

    out_dir: Path
    rows: list[ReplicaRow]
    results: list[ReplicaResult]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        """0, or EXIT_POINTS_FAILED (3) when a sweep point could not be built; a target that no
        count up to --max-replicas holds is an answer, not a failure."""
        return EXIT_POINTS_FAILED if any(r.status == "failed" for r in self.rows) else 0


def run_replica_capacity(path: str, *, target_rates: Sequence[float] = (), growths: Sequence[float] = (),
                         max_replicas: int = DEFAULT_MAX_REPLICAS, allocators: Sequence[str] | None = None,
                         sweeps: Sequence[str] = (), overrides: Sequence[str] = (), num_seeds: int = 3,
                         executor: str = "process", address: str | None = None, jobs: int | None = None,
                         prices: Sequence[str] = (), out: str | None = None, plots_on: bool = True,
                         use_cache: bool = True, quiet: bool = False,
                         file_sweep: bool = True, replace: bool = False) -> ReplicaReport:
    """Search the fewest replicas for every (point, allocator, target, seed); write
    ``capacity.csv``, ``capacity.json`` and the plots. Targets: ``target_rates`` and, per
    point, ``growths`` × the workload's own rate. Every input is checked before any simulation;
    a point that cannot be built is a ``failed`` row (every point failing: KvplanError, after
    the files are written). ``replace``: write over a folder holding a run of another scenario."""
    if not target_rates and not growths:
        raise KvplanError("give --target-rate R or --growth G")
    file = read_sweep(path, allocators, sweeps, overrides, file_sweep)
    if any("num_replicas" in key.split("+") for key in file.sweep):
        raise KvplanError("num_replicas cannot be swept with --target-rate: it is what the search finds")
    check_pd_ratios(file, max_replicas)
    price_overrides = dict(parse_price_arg(p) for p in prices)
    pool = make_executor(executor, jobs=jobs, address=address)
    out_dir = Path(out) if out else default_out_dir(file.data["name"], suffix="-capacity", where=path)
    cache_dir = out_dir / CACHE_DIR if use_cache else None
    points = resolve_points(file, disaggregated=True)
    own_rates: dict[str, float] = {}  # by workload: a sweep's points mostly share one (a trace parsed once)
    targets = {p.index: _targets(p, file.base_dir, target_rates, growths, own_rates)
               for p in points if p.scenario}
    tasks, notes = _tasks(points, targets, file.base_dir, num_seeds, max_replicas, plots_on, cache_dir)
    source = capacity_source(path, file, sweeps, overrides,
                             {"target_rates": list(target_rates), "growths": list(growths), "seeds": num_seeds,
                              "max_replicas": max_replicas, "prices": sorted(price_overrides.items())})
    with open_output(out_dir, command="capacity", keep=(CACHE_DIR,), recognised=CAPACITY_FILES,
                     source=source, replace=replace) as folder:
        if cache_dir is not None:
            remove_partial_writes(cache_dir)  # the lock is ours: any partial write is a dead run's
        started = time.perf_counter()
        finished: dict[int, ReplicaResult] = {}
        try:
            results = run_searches(pool, run_replica_search, tasks, finished, quiet)
        except KeyboardInterrupt:
            if cache_dir is not None:
                remove_partial_writes(cache_dir)  # a killed worker's (cmd.run_capacity says why)
            say_interrupted(cache_dir, len(finished), len(tasks), time.perf_counter() - started)
            raise
        rows = _rows(points, targets, results, price_overrides, notes)
        write_replica_csv(folder.staging / "capacity.csv", rows)
        _write_json(folder.staging / "capacity.json", file.data, rows, results, notes)
        if plots_on:
            _write_plots(folder.staging / "plots", rows)
        write_report(folder.staging, "capacity")  # last: report.html reads back the files above
    if not quiet:
        print_replica_table(make_console(), rows, notes, out_dir, time.perf_counter() - started)
    if not any(p.error is None for p in points):
        first = points[0].error or ""
        if len(points) == 1:
            raise KvplanError(first)
        raise KvplanError(f"every sweep point failed (see {out_dir / 'capacity.csv'}); first: {first}")
    return ReplicaReport(out_dir, rows, results, sorted(set(notes.values())))


def check_pd_ratios(file: CapacityFile, max_replicas: int) -> None:
    """Every ``pd_ratio`` of the sweep (or the scenario's own pools) parses, and its smallest
    layout fits within ``max_replicas`` per pool; else a one-line KvplanError (exit 2) before
    any point is built."""
    ratios = [knobs[PD_RATIO_KNOB] for knobs in expand_sweep(file.sweep, file.where) if PD_RATIO_KNOB in knobs]
    pools = file.data.get("disaggregation")
    if not ratios and pools:
        ratios = [f"{pools.get('prefill', {}).get('replicas', 1)}:{pools.get('decode', {}).get('replicas', 1)}"]
    for value in dict.fromkeys(ratios):
        ratio = parse_pd_ratio(value, file.where)
        if ratio is not None and max(ratio) > max_replicas:
            raise KvplanError(f"{file.where}: {PD_RATIO_KNOB} {value} needs more than --max-replicas "
                              f"{max_replicas} replicas in one pool")


def own_rate_req_s(scenario: Scenario, base_dir: Path, where: str) -> float:
    """The mean rate of the requests the scenario sends as written ((N − 1) gaps over their span;
    a synthetic workload's nominal rate), the base of ``--growth``."""
    spec = scenario.workload
    if spec.closed_loop or spec.burst:
        raise KvplanError(f"{where}: --growth needs a workload sent at a rate, not "
                          + ("closed-loop clients" if spec.closed_loop else "a burst (rate: inf)"))
    if spec.trace is None:
        rate = spec.rate if spec.rate is not None else spec.arrival.rate if spec.arrival else None
        assert rate is not None, "a synthetic workload has a rate (WorkloadSpec checks it)"
        return rate * (spec.rate_scale or 1.0)
    try:
        return mean_rate_per_s(build_requests(spec, seed=scenario.seed, base_dir=base_dir))
    except KvplanError as err:
        raise KvplanError(f"{where}: --growth: {err}") from None


def _targets(point: SweepPoint, base_dir: Path, rates: Sequence[float], growths: Sequence[float],
             own_rates: dict[str, float]) -> list[float]:
    """The point's target rates, ascending: ``rates`` and each growth × its workload's own rate
    (``own_rates``: those measured so far, by workload and seed)."""
    assert point.scenario is not None
    if not growths:
        return sorted(set(rates))
    key = f"{point.scenario.seed}:{point.scenario.workload.model_dump_json()}"
    if key not in own_rates:
        own_rates[key] = own_rate_req_s(point.scenario, base_dir, point.where)
    return sorted({*rates, *(g * own_rates[key] for g in growths)})


def _tasks(points: list[SweepPoint], targets: dict[int, list[float]], base_dir: Path, num_seeds: int,
           max_replicas: int, record_steps: bool,
           cache_dir: Path | None) -> tuple[list[ReplicaTask], dict[int, str]]:
    """One task per (point, allocator, target, seed), in that order, and the points' notes
    (fewer seeds than asked); KvplanError when a point's workload cannot be sent at a rate."""
    tasks: list[ReplicaTask] = []
    notes: dict[int, str] = {}
    for point in points:
        if point.scenario is None:
            continue
        check_searchable(point.scenario, point.where, "rate")
        seeds, seed_note = seeds_for(point.scenario, num_seeds, "rate")
        if seed_note:
            notes[point.index] = seed_note
        canonical = point.scenario.model_dump(mode="json", exclude_defaults=True)
        for allocator in point.scenario.allocators:
            for rate in targets[point.index]:
                for seed in seeds:
                    data = {**copy.deepcopy(canonical), "allocators": [allocator], "seed": seed}
                    tasks.append(ReplicaTask(point.index, data, point.where, str(base_dir.resolve()),
                                             allocator, seed, rate, max_replicas, record_steps,
                                             str(cache_dir.resolve()) if cache_dir else None,
                                             point.ratio))
    return tasks, notes


def _rows(points: list[SweepPoint], targets: dict[int, list[float]], results: list[ReplicaResult],
          prices: dict[str, float], notes: dict[int, str]) -> list[ReplicaRow]:
    """The rows in point, allocator, target order: a failed point gives one failed row."""
    grouped: dict[tuple[int, str, float], list[ReplicaResult]] = {}
    for r in results:
        grouped.setdefault((r.point_index, r.allocator, r.target_rate_req_s), []).append(r)
    rows: list[ReplicaRow] = []
    for point in points:
        if point.scenario is None or point.deployment is None:
            rows.append(failed_row(point))
            continue
        for allocator in point.scenario.allocators:
            for rate in targets[point.index]:
                rows.append(summarize_replicas(point, allocator, grouped[point.index, allocator, rate], prices,
                                               notes.get(point.index)))
    return rows


def _write_json(path: Path, scenario: dict[str, Any], rows: Sequence[ReplicaRow], results: Sequence[ReplicaResult],
                notes: dict[int, str]) -> None:
    searches = [{
        "point": r.point_index, "allocator": r.allocator, "seed": r.seed, "search": "replicas",
        "target_rate_req_s": r.target_rate_req_s, "num_replicas": r.num_replicas, "start": r.start,
        "pd_ratio": list(r.ratio) if r.ratio else None,
        "max_replicas": r.max_replicas, "bound": dataclasses.asdict(r.bound) if r.bound is not None else None,
        # num_replicas: a disaggregated search's scale of pd_ratio
        "probes": [{"num_replicas": n, **p.to_json()} for n, p in zip(r.counts, r.probes)],
        "at_answer": r.at_answer.to_json() if r.at_answer else None} for r in results]
    # the scenario (sweep removed) as read: report.html states its SLO and setup
    body: dict[str, Any] = {"scenario": scenario, "rows": [dataclasses.asdict(r) for r in rows], "searches": searches,
                            "notes": {str(k): v for k, v in sorted(notes.items())}}
    path.write_text(json.dumps(body, indent=1, sort_keys=True, default=str) + "\n")


def _write_plots(plot_dir: Path, rows: list[ReplicaRow]) -> None:
    # matplotlib (~0.5 s of CPU to import) only when plots are drawn: not with --no-plots
    from simulator.commands.capacity import replica_plots

    replica_plots.plot_gpus_vs_target(plot_dir / "gpus_vs_target.png", rows)
    replica_plots.plot_cost_per_hour(plot_dir / "cost_per_hour.png", rows)
    replica_plots.plot_agg_vs_disagg(plot_dir / "agg_vs_disagg.png", rows)
    replica_plots.plot_layout_pareto(plot_dir / "pareto_layouts.png", rows)
