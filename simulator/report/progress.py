"""The progress bar of a long run: on a terminal's stderr only, never under ``--quiet``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress


def make_progress(quiet: bool) -> Progress | None:
    """A progress bar on a terminal's stderr; None with ``quiet`` or when stderr is no terminal
    (rich is imported only for a bar or the printed table: a quiet run never loads it)."""
    if quiet or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description:>18}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("requests"), TimeElapsedColumn(), console=Console(stderr=True),
                    transient=False)
