"""kvplan from Python: what the commands compute, as objects a notebook can hold.

::

    from simulator import api

    result = api.simulate("scenarios/chat.yaml", num_requests=2000, block_size=32)
    result.summary["paged"].ttft.p99          # seconds
    result.requests                            # one row per request (pandas)
    result.plot("latency_cdf")                 # a matplotlib Figure
    result.write("runs/chat-bs32")             # the folder `kvplan simulate` writes

    api.size(model="llama-3.1-70b", gpu="h100", tp=4).capacity_tokens
    api.capacity("scenarios/capacity-chat.yaml", sweep={"gpu": ["h100"]}).table

The command line is a thin layer over the same functions: ``kvplan simulate`` and ``kvplan size``
call :func:`simulate`'s and :func:`size`'s machinery and print what they return, and
:func:`capacity` runs the search ``kvplan capacity`` runs. Bad input raises a
:class:`~simulator.errors.KvplanError` (or one of its subclasses: :class:`ScenarioError`,
:class:`RefusedError`, :class:`OutputError`, :class:`ResultFileError`) whose message is the
one line the CLI prints after ``kvplan: error:``. Warnings are :class:`KvplanWarning`\\s
(Python's ``warnings``).

Overrides are scenario keys: ``block_size=32`` sets ``block_size``; a double underscore goes one
level down (``workload__rate_scale=2`` is ``--set workload.rate_scale=2``); ``overrides=`` takes
dotted keys as ``--set`` does (``{"workload.rate": 8}``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from simulator.errors import (
    KvplanError,
    KvplanWarning,
    OutputError,
    RefusedError,
    ResultFileError,
    ScenarioError,
)

# Each name's module, imported when the name is first used: ``kvplan size`` imports
# simulator.api.sizing without the engine, and ``from simulator import api`` stays instant.
_HOMES = {
    "CapacityResult": "search", "capacity": "search",
    "Latency": "simulation", "Plan": "simulation", "Result": "simulation", "RunSummary": "simulation",
    "load": "simulation", "simulate": "simulation",
    "SizeResult": "sizing", "size": "sizing",
}

if TYPE_CHECKING:  # pragma: no cover
    from simulator.api.search import CapacityResult, capacity
    from simulator.api.simulation import Latency, Plan, Result, RunSummary, load, simulate
    from simulator.api.sizing import SizeResult, size


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'simulator.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"simulator.api.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["CapacityResult", "KvplanError", "KvplanWarning", "Latency", "OutputError", "Plan", "RefusedError",
           "Result", "ResultFileError", "RunSummary", "ScenarioError", "SizeResult", "capacity", "load",
           "simulate", "size"]
