"""User-facing errors.

A :class:`KvplanError` is a problem with the user's input (a scenario, a trace, a flag, a
profile). The CLI prints its message as one line and exits with code 2; it never shows a
traceback. Its message says *what* is wrong and *where* (file, line, key).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable


class KvplanError(Exception):
    """Bad input from the user: printed as one line, exit code 2. From Python
    (:mod:`simulator.api`) it is raised with that same line as its message; the subclasses
    below say what kind of input it was, for a caller that handles one kind."""


class ScenarioError(KvplanError):
    """A scenario (or another YAML/JSON file kvplan reads) that is not valid: bad YAML, an
    unknown key, a value of the wrong type or out of range."""


class RefusedError(KvplanError):
    """A deployment the serving engine would refuse to start (vLLM's own start-up checks:
    simulator/config/refusals.py); ``allow_refused: true`` simulates it anyway."""


class OutputError(KvplanError):
    """A results folder that cannot be written as asked: a file in the way, a folder of other
    files, another run's folder, a run already writing it, a full disk."""


class ResultFileError(KvplanError):
    """A measured benchmark result (vllm bench serve, GuideLLM, fidelity.json) that cannot be
    read or holds a value no run produces."""


class KvplanWarning(UserWarning):
    """Input kvplan accepts but the user should hear about (a run shorter than asked, a block
    size vLLM's fastest kernel does not take): the CLI prints it as one line, the run goes on."""


def warn_user(message: str) -> None:
    """Emit ``message`` as a KvplanWarning, from the main process only: a worker of a process
    pool (capacity's searches) rebuilds deployments and workloads its parent process already
    built, and said, when it resolved the sweep; repeating that from every worker would say each
    warning once per task, outside the CLI's one-line format.

    A process in which nothing imported :mod:`multiprocessing` is no pool worker (a worker runs
    multiprocessing's own bootstrap), so the check does not import it: the commands that start
    no pool do not pay for it."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        warnings.warn(message, KvplanWarning, stacklevel=2)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" — did you mean 'x'?"`` for the closest choice, or ``""`` if none is close."""
    import difflib  # only on an error's path

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" — did you mean '{close[0]}'?" if close else ""


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> KvplanError:
    """The error for an unknown catalog name (model, GPU, dtype, allocator...)."""
    choices = sorted(choices)
    hint = did_you_mean(name, choices)
    if not hint:
        hint = f" (known: {', '.join(choices)})"
    return KvplanError(f"unknown {kind} '{name}'{hint}")


__all__ = ["KvplanError", "KvplanWarning", "OutputError", "RefusedError", "ResultFileError", "ScenarioError",
           "did_you_mean", "unknown_name", "warn_user"]
