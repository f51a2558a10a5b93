"""The ``capacity`` subcommand's options, importable without the simulator.

``kvplan`` builds every subcommand's parser on each run (``kvplan --help`` lists them all, and
argparse needs each one's options to parse), so this module is imported by every command: it
imports nothing but the standard library. The implementation (:mod:`simulator.commands.capacity.cmd`: the
engine, pandas, and matplotlib for the plots) is imported when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

SEARCHES = ("rate", "concurrency")  # what a capacity search varies (simulator.commands.capacity.search)
EXECUTORS = ("process", "ray")  # where searches run (simulator.commands.capacity.executors)
DEFAULT_MAX_REPLICAS = 64  # --max-replicas: the most replicas a --target-rate search tries


def add_parser(subparsers: Any) -> None:
    """Add the ``capacity`` subcommand to an ``argparse`` subparsers object."""
    from simulator.commands import lazy
    from simulator.report.outputs import add_replace_arg  # standard library only, as this module

    p = subparsers.add_parser(
        "capacity", help="max sustainable request rate under the SLO, with sweeps",
        description="For each allocator (and each point of a sweep), find the highest request rate at "
                    "which the scenario's slo: holds, by doubling then bisection over the workload's rate; "
                    "with --target-rate (or --growth), the fewest replicas that hold that rate, their GPUs "
                    "and cost.")
    p.add_argument("scenario", help="scenario YAML with an slo: section (and optionally sweep:)")
    p.add_argument("--allocator", action="append", metavar="NAME", help="only this allocator (repeatable)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="sweep a scenario knob (repeatable; crossed with the file's sweep:)")
    p.add_argument("--no-sweep", action="store_true",
                   help="ignore the file's sweep: section (only --sweep knobs vary): one point without them")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set workload.num_requests=500")
    p.add_argument("--seeds", type=int, default=3, help="seeds per point for synthetic workloads (default 3)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="relative width at which bisection stops (default 0.05)")
    p.add_argument("--start-rate", type=float,
                   help="first rate tried (default: half the deployment's analytic ceiling on the rate)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="start every point's rate search at its own analytic ceiling (default: the "
                        "points that differ only in the sweep's last knob start from the previous "
                        "one's answer)")
    p.add_argument("--search", choices=SEARCHES, default="rate",
                   help="what to search: the request rate (default), or the number of closed-loop "
                        "clients from 1 up (concurrency; also draws pareto.png)")
    p.add_argument("--target-rate", action="append", metavar="R[,R...]",
                   help="instead of the max rate: the fewest replicas (data-parallel copies of each "
                        "point's TP group) that hold R req/s under the SLO, their GPUs and cost "
                        "(repeatable)")
    p.add_argument("--growth", action="append", metavar="G[,G...]",
                   help="as --target-rate, at G × the workload's own mean rate (repeatable)")
    p.add_argument("--max-replicas", type=int, default=DEFAULT_MAX_REPLICAS,
                   help="with --target-rate: the most replicas tried per point "
                        f"(default {DEFAULT_MAX_REPLICAS})")
    p.add_argument("--executor", choices=EXECUTORS, default="process", help="where searches run")
    p.add_argument("--address", help="Ray cluster address (with --executor ray; default: local)")
    p.add_argument("--jobs", type=int, help="parallel processes (default: CPU count)")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD_PER_HOUR",
                   help="override a GPU's price per GPU-hour (repeatable)")
    p.add_argument("--out", help="output folder (default: runs/<scenario name>-capacity/)")
    add_replace_arg(p)
    p.add_argument("--no-plots", action="store_true", help="skip plots (and KV recording on every probe)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the probe cache")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no table")
    p.set_defaults(func=lazy("simulator.commands.capacity.dispatch:run"))
