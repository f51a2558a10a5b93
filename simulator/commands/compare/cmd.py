"""``kvplan compare``: a plan checked against measurements, or two plans side by side.

::

    kvplan compare RESULT --against SCENARIO|RUN_DIR [--allocator paged] [--goodput ttft:500 ...]
                   [--max-requests N]
    kvplan compare RUN_A RUN_B

RESULT is a ``vllm bench serve --save-result`` JSON, a GuideLLM report (JSON/YAML; ``#N`` picks
one benchmark of a sweep) or kvplan's ``fidelity.json`` (:mod:`.results`). Output folder
(``--out``): against a scenario ``runs/compare/<result>/``, against a run ``<RUN_DIR>-compare/``
beside it, two runs ``runs/compare/<A>-vs-<B>/``. Against a scenario, a result that asks for more
than ``--max-requests`` requests (default 100,000) is refused before any request is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError
from simulator.report.outputs import RUNS_DIR, RunSource, add_replace_arg, check_output, open_output

COMPARE_FILES = ("compare.json", "compare.csv")
# the default of --max-requests (simulator.commands.compare.against.DEFAULT_MAX_REQUESTS; repeated here
# so that building the parser imports nothing of the simulator: every kvplan command builds it)
DEFAULT_MAX_REQUESTS = 100_000


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="measured results vs kvplan's predictions, or two runs side by side",
        description="Compare a measured benchmark result (vllm bench serve --save-result JSON, GuideLLM "
                    "report, kvplan fidelity.json) with a scenario simulated at its load or with a run "
                    "folder; or put two simulate folders side by side.")
    p.add_argument("paths", nargs="+", metavar="RESULT|RUN_DIR",
                   help="a result file with --against, or two simulate folders")
    p.add_argument("--against", metavar="SCENARIO|RUN_DIR",
                   help="the scenario to simulate at the result's load, or a simulate folder")
    p.add_argument("--allocator", metavar="NAME", help="the allocator (run) to compare (default: paged)")
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="goodput SLOs as vllm bench serve takes them (ttft, tpot, e2el in ms; default: "
                        "the scenario's slo: bounds)")
    p.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS, metavar="N",
                   help="against a scenario: refuse a result that asks for more than N requests (its "
                        f"num_prompts or request total; default {DEFAULT_MAX_REQUESTS:,}, more than real "
                        "benchmark runs send: vllm bench serve's default is 1000)")
    p.add_argument("--out", help="output folder (see the command's description)")
    add_replace_arg(p)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", "-q", action="store_true", help="no table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120)
    if args.against is None:
        if len(args.paths) != 2:
            raise KvplanError("compare: give RESULT --against SCENARIO|RUN_DIR, or two simulate folders")
        return _runs(args, console)
    if len(args.paths) != 1:
        raise KvplanError(f"compare --against takes one RESULT, got {len(args.paths)}")
    return _measured(args, console)


def _measured(args: argparse.Namespace, console: Any) -> int:
    from simulator.commands.compare import measured as m
    from simulator.report.html import write_report
    from simulator.commands.compare.against import read_run
    from simulator.commands.compare.results import read_result
    from simulator.report.files import write_json, write_rows_csv

    if args.max_requests < 1:
        raise KvplanError(f"--max-requests must be at least 1, got {args.max_requests}")
    result = read_result(args.paths[0])
    against = Path(args.against)
    is_run = against.is_dir()
    default = (against.parent / f"{against.name}-compare" if is_run
               else RUNS_DIR / "compare" / result.label.replace("#", "-"))
    out_dir = Path(args.out) if args.out else default
    source = _source(args, [args.paths[0], args.against])
    check_output(out_dir, recognised=COMPARE_FILES, command="compare", source=source, replace=args.replace)
    if is_run:
        comparison = m.against_run(result, read_run(args.against), allocator=args.allocator, goodput=args.goodput)
    else:
        comparison = m.against_scenario(result, args.against, allocator=args.allocator, goodput=args.goodput,
                                        max_requests=args.max_requests)
    with open_output(out_dir, command="compare", recognised=COMPARE_FILES, source=source,
                     replace=args.replace) as folder:
        write_json(folder.staging / "compare.json", comparison.payload())
        rows = [r.as_dict() for r in comparison.rows]
        columns = ("metric", "statistic", "label", "unit", "measured", "predicted", "relative_error")
        write_rows_csv(folder.staging / "compare.csv", columns, ([r[c] for c in columns] for r in rows))
        if not args.no_plots:
            title = f"{result.label} vs {comparison.against['path']} [{comparison.against['run']}]"
            m.plot_errors(folder.staging / "compare.png", comparison.rows, title)
        if comparison.simulated is not None:
            from simulator.report.run_folder import write_outputs

            scenario, dep, sim = comparison.simulated
            (folder.staging / "simulated").mkdir()
            write_outputs(folder.staging / "simulated", scenario, dep, [sim], plots=not args.no_plots)
        write_report(folder.staging, "compare")  # last: report.html reads back the files above
    if not args.quiet:
        m.print_comparison(console, comparison, out_dir)
    return 0


def _source(args: argparse.Namespace, inputs: list[str]) -> RunSource:
    """Whose comparison an output folder holds: its inputs, with the flags as settings."""
    flags = {"allocator": args.allocator, "goodput": args.goodput}
    words = [*inputs[:1], *(["--against", inputs[1]] if args.against else inputs[1:])]
    words += [f"--{k} {v if isinstance(v, str) else ' '.join(v)}" for k, v in flags.items() if v]
    return RunSource.of("compare", inputs, flags, " ".join(words))


def _runs(args: argparse.Namespace, console: Any) -> int:
    from simulator.commands.compare import runs as r
    from simulator.report.html import write_report
    from simulator.commands.compare.against import read_run
    from simulator.report.files import write_json, write_rows_csv

    a, b = read_run(args.paths[0]), read_run(args.paths[1])
    r.check_pairable(a, b)
    name = f"{a.name}-vs-{b.name}" if a.name != b.name else "runs"
    out_dir = Path(args.out) if args.out else RUNS_DIR / "compare" / name
    rows = r.pair_rows(a, b)
    if args.allocator:
        rows = [row for row in rows if row.run == args.allocator or row.run.endswith("/" + args.allocator)]
        if not rows:
            raise KvplanError(f"no run '{args.allocator}' in {a.path} or {b.path}")
    with open_output(out_dir, command="compare", recognised=COMPARE_FILES,
                     source=_source(args, args.paths), replace=args.replace) as folder:
        write_json(folder.staging / "compare.json", r.payload(a, b, rows))
        write_rows_csv(folder.staging / "compare.csv", ("run", "metric", "a", "b", "ratio"),
                       ((row.run, row.label, row.a, row.b, row.ratio) for row in rows))
        if not args.no_plots:
            r.write_plots(folder.staging, a, b)
        write_report(folder.staging, "compare")
    if not args.quiet:
        r.print_runs(console, a, b, rows, out_dir)
    return 0
