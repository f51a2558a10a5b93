"""One module (or package) per command; :mod:`simulator.cli` parses and dispatches to them.

Each command module has ``add_parser(subparsers)``; the parser names the function that runs the
command as ``"module:function"`` (resolved by the CLI only when that command runs), so building a
parser imports no implementation and nothing here imports upward."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def lazy(target: str) -> Callable[[argparse.Namespace], int]:
    """The function ``"module:function"`` names, imported when first called: a parser's
    ``set_defaults(func=lazy(...))`` builds without importing the command it runs."""
    module, _, name = target.partition(":")

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), name)(args))

    run.__qualname__ = run.__name__ = name
    run.target = target  # type: ignore[attr-defined]
    return run


__all__ = ["lazy"]
