"""User-facing errors.

A :class:`KvplanError` is a problem with the user's input (a scenario, a trace, a flag, a
profile). The CLI prints its message as one line and exits with code 2; it never shows a
traceback. Its message says *what* is wrong and *where* (file, line, key).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KvplanError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" — did you mean 'x'?"`` for the closest choice, or ``""`` if none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" — did you mean '{close[0]}'?" if close else ""


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> KvplanError:
    """The error for an unknown catalog name (model, GPU, dtype, allocator...)."""
    choices = sorted(choices)
    hint = did_you_mean(name, choices)
    if not hint:
        hint = f" (known: {', '.join(choices)})"
    return KvplanError(f"unknown {kind} '{name}'{hint}")
