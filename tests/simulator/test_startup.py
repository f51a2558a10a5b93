"""Start-up of ``kvplan simulate``: what it imports.

What a command imports is checked in a fresh interpreter (this one has imported everything
already); no test here measures time (benchmarks/startup.py does).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]


def imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    done = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_simulate_parser_imports_no_other_command():
    """`kvplan simulate ...` builds simulate's parser alone: no other command's module, no entry
    points of the backend."""
    loaded = imported_by("from simulator.cli import build_parser; build_parser('simulate')")
    others = {m for m in COMMANDS.values() if m is not None}
    assert not loaded & (others | {"backend.cli", "importlib.metadata"})


def test_simulate_imports_no_rich_pandas_or_matplotlib():
    """What ``kvplan simulate --quiet --no-plots`` loads holds no rich, pandas or matplotlib: rich
    comes with a progress bar or the printed table, pandas and matplotlib with the plots."""
    loaded = imported_by("import simulator.commands.simulate, simulator.engine.metrics, simulator.engine.saturation, "
                         "simulator.report.files, simulator.report.outputs, simulator.errors, simulator.cli")
    assert not {m.split(".")[0] for m in loaded} & {"rich", "pandas", "matplotlib"}


def commands_of(parser: argparse.ArgumentParser) -> list[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_full_parser_still_lists_every_command():
    assert commands_of(build_parser())[:len(COMMANDS)] == list(COMMANDS)
    assert commands_of(build_parser("export")) == ["export"]
    with pytest.raises(ValueError, match="not a built-in command"):
        build_parser("calibrate")  # a backend command: only the whole parser has it


def test_a_program_leaves_its_objects_to_the_os_but_a_call_does_not():
    """Run as a program, ``main`` freezes the garbage collector's objects just before the process
    exits (the last collection would walk them all); called from Python it must not."""
    import gc

    from simulator.cli import main

    frozen = gc.get_freeze_count()
    assert main(["size", "--model", "llama-2-7b", "--json"]) == 0
    assert gc.get_freeze_count() == frozen
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
            "sys.argv = ['kvplan', 'size', '--model', 'llama-2-7b', '--json']\n"
            "import simulator.cli\n"
            "sys.exit(simulator.cli.main())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and '"model"' in done.stdout, done.stderr
    assert int(done.stderr.split("frozen")[-1]) > 0  # exit handlers still ran
