"""The command line: ``kvplan simulate|size|calibrate|...`` and the ``simulate``/``calibrate`` aliases.

Bad input (a KvplanError) is printed as one line, ``kvplan: error: ...``, with exit code 2 —
never a traceback.

A run of a built-in command builds the parser of that command alone (argparse needs nothing else
to parse its arguments, and its errors and ``--help`` name only that command); anything else —
``kvplan --help``, a command of the backend, a mistyped name — builds the whole parser, which
lists every command. The modules that add the parsers are light; each command's implementation
— the engine, pandas, matplotlib, torch — is imported when that command runs. Importing pandas
and matplotlib alone costs ~0.9 s of CPU, more than a small simulation (``python
benchmarks/startup.py`` measures it; ``python -X importtime`` shows what each module costs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

from simulator.errors import KvplanError, KvplanWarning


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="replay a scenario's trace through the KV allocators",
                       description="Replay a scenario's requests through a continuous-batching "
                                   "scheduler and each listed KV allocator; write tables and plots.")
    add_simulate_args(p)
    p.set_defaults(func=_run_simulate)


def add_simulate_args(p: argparse.ArgumentParser) -> None:
    from simulator.report.outputs import add_replace_arg  # simulate writes through it anyway

    p.add_argument("scenario", help="scenario YAML (e.g. scenarios/chat.yaml)")
    p.add_argument("--allocator", action="append", metavar="NAME",
                   help="run only this allocator (repeatable): paged, contiguous-max, contiguous-pow2, "
                        "contiguous-oracle (or max, pow2, oracle)")
    p.add_argument("--rate", type=float, help="rescale arrivals to this mean rate (req/s)")
    p.add_argument("--num-requests", type=int, help="use the first N requests")
    p.add_argument("--seed", type=int, help="random seed (synthetic workloads, beam search)")
    p.add_argument("--out", help="output folder (default: runs/<scenario name>/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any scenario key, e.g. --set block_size=32 --set workload.rate=8")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--steps", choices=("bins", "full"), default="bins",
                   help="steps.csv: one row per replica per --step-bin-s seconds (default), or one "
                        "row per engine step (full; large for long runs)")
    p.add_argument("--step-bin-s", type=float, default=1.0, metavar="S",
                   help="seconds of simulated time per steps.csv row with --steps bins (default 1)")
    p.add_argument("--force", action="store_true", help="accept a latency profile measured for another setup")
    add_replace_arg(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no table")


def _run_simulate(args: argparse.Namespace) -> int:
    from simulator.commands.simulate import run_simulate
    from simulator.config.overrides import scenario_overrides

    for flag, value in (("--rate", args.rate), ("--num-requests", args.num_requests),
                        ("--step-bin-s", args.step_bin_s)):
        if value is not None and not value > 0:  # NaN too
            raise KvplanError(f"{flag} must be positive, got {value}")
    if args.step_bin_s == float("inf"):  # (--rate inf is a burst; a bin must end)
        raise KvplanError("--step-bin-s must be a finite number of seconds, got inf")
    overrides = scenario_overrides(rate=args.rate, num_requests=args.num_requests, seed=args.seed,
                                   allocators=args.allocator, extra=args.set)
    run_simulate(args.scenario, out=args.out, overrides=overrides, quiet=args.quiet,
                 plots=not args.no_plots, force_profile=args.force, steps=args.steps,
                 step_bin_s=args.step_bin_s, replace=args.replace)
    return 0


# The built-in commands in `kvplan --help`'s order: the module whose add_parser(subparsers) adds
# each one's parser (None: simulate, added here).
COMMANDS: dict[str, str | None] = {
    "simulate": None,
    "size": "simulator.commands.size",
    "capacity": "simulator.commands.capacity.options",
    "validate": "simulator.commands.validate.cmd",
    "compare": "simulator.commands.compare.cmd",
    "export": "simulator.commands.export.cmd",
}

PLUGIN_GROUP = "kvplan.commands"


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    """Commands of the real backend (``calibrate``, ``fidelity``) arrive as entry points, so the
    simulator never imports the backend (or torch) by name. Without the backend extra installed,
    the command still exists and says what to install."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            add = ep.load()
        except ImportError as err:
            p = sub.add_parser(ep.name, help=f"(needs the backend extra: {err.name or err})")
            p.set_defaults(func=_missing_backend(ep.name, err))
            continue
        add(sub)


# Modules only the `backend` extra installs (pyproject.toml [project.optional-dependencies]).
BACKEND_MODULES = frozenset({"torch", "triton"})


def backend_missing_message(command: str, missing: str) -> str:
    """What to tell a user whose ``command`` needs the backend extra's ``missing`` module."""
    return (f"'{command}' runs the real backend, which needs {missing} (No module named"
            f" '{missing}'): install the backend extra, pip install -e '.[backend]' (install your"
            " CUDA or CPU build of torch first; see README)")


def _missing_backend(name: str, err: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(_: argparse.Namespace) -> int:
        raise KvplanError(backend_missing_message(name, (err.name or str(err)).split(".")[0]))
    return run


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``kvplan`` parser: every command's (built-in, then the backend's entry points), or with
    ``command``, one of :data:`COMMANDS`, that command's alone — all that parsing its arguments
    needs, without importing the other commands' modules or reading the entry points."""
    if command is not None and command not in COMMANDS:
        raise ValueError(f"not a built-in command: {command!r} (one of {', '.join(COMMANDS)})")
    parser = argparse.ArgumentParser(prog="kvplan", description="Capacity planner for the KV cache of LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if command is None else (command,):
        module = COMMANDS[name]
        if module is None:
            _add_simulate(sub)
        else:
            importlib.import_module(module).add_parser(sub)
    if command is None:
        _add_plugins(sub)
    for p in (parser, *sub.choices.values()):
        p._negative_number_matcher = _NEGATIVE_NUMBER  # type: ignore[attr-defined]
    return parser


class _NegativeNumber:
    """What argparse takes for a negative number, hence for an option's value rather than an
    option: any text ``float`` reads that starts with ``-`` (``-5``, ``-1e3``, ``-inf``,
    ``-nan``). argparse's own pattern knows only ``-5`` and ``-.5``, and would take ``--rate
    -inf`` for two options ("expected one argument"); with this one the command's own check
    says what is wrong with the value ("--rate must be positive, got -inf"). argparse calls
    ``.match`` on its parser's ``_negative_number_matcher``, the one thing replaced; no option
    of kvplan's looks like a number, so none is shadowed."""

    @staticmethod
    def match(text: str) -> bool:
        if not text.startswith("-"):
            return False
        try:
            float(text)
        except ValueError:
            return False
        return True


_NEGATIVE_NUMBER = _NegativeNumber()


_python_show_warning = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A KvplanWarning is one line, ``kvplan: warning: ...``; other warnings print as Python's."""
    if issubclass(category, KvplanWarning):
        print(f"kvplan: warning: {message}", file=file or sys.stderr)
        return
    _python_show_warning(message, category, filename, lineno, file, line)


def _guarded(run: Callable[[], int], command: str = "kvplan") -> int:
    """Run a command: bad input is one line and exit code 2, never a traceback; so is a command
    of the real backend run without the backend extra (the backend imports torch only when a
    command runs, so that surfaces here, not when the parser is built)."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return run()
    except KvplanError as err:
        print(f"kvplan: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in BACKEND_MODULES:
            raise
        print(f"kvplan: error: {backend_missing_message(command, missing)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` (default: the program's arguments, as a program: then the
    process exits right after, see :func:`_before_exit`)."""
    return _main(list(sys.argv[1:] if argv is None else argv), as_program=argv is None)


def _main(argv: list[str], *, as_program: bool) -> int:
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    code = _guarded(lambda: args.func(args), args.command)
    if as_program:
        _before_exit()
    return code


def _before_exit() -> None:
    """The process ends next: spare it the garbage collection of everything the command built.

    A simulation leaves millions of objects in reference cycles (the engine's closures and its
    processes); the interpreter's last collection would walk and free them all, 5-7% of a
    whole-trace ``kvplan simulate`` on the Azure trace. Frozen, they are left to the operating
    system; exit handlers still run. Only a program's ``main`` does this, never a call from
    Python, whose process goes on."""
    import gc
    gc.freeze()


def simulate_main(argv: Sequence[str] | None = None) -> int:
    """``simulate SCENARIO ...``: the same as ``kvplan simulate``."""
    return _main(["simulate", *(sys.argv[1:] if argv is None else argv)], as_program=argv is None)


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    """``calibrate ...``: the same as ``kvplan calibrate``."""
    return _main(["calibrate", *(sys.argv[1:] if argv is None else argv)], as_program=argv is None)


if __name__ == "__main__":
    sys.exit(main())
