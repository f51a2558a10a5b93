"""One allocator's run of a workload on a deployment, and the run's measurements.

:func:`run_allocator` drives :func:`simulator.engine.core.simulate` with a deployment's allocator,
latency model and router and measures what came out (:mod:`simulator.engine.metrics`, the
saturation test); :func:`load_workload` and :func:`client_policy` turn a scenario's workload into
the requests and the clients that send them. Every command that simulates goes through here:
``simulate``, ``capacity``'s probes, ``compare``, ``validate``, ``fidelity`` and the Python API.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.config.deployment import Deployment
from simulator.config.scenario import Scenario
from simulator.engine import metrics
from simulator.engine.core import SimResult, simulate
from simulator.engine.saturation import saturation
from simulator.engine.steps import DEFAULT_BIN_S
from simulator.errors import KvplanError
from simulator.scheduler.router import requests_per_replica
from workloads.clients import OPEN_LOOP, Clients
from workloads.request import Request, cyclic_gc_paused
from workloads.spec import build_requests
from workloads.synthetic import ModelLenFit, fit_to_max_model_len

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from rich.progress import Progress


@dataclass
class AllocatorRun:
    """One allocator's run: the result, its requests table as columns
    (:func:`metrics.request_columns`) and its summary; ``requests`` and ``steps`` give the
    tables as pandas DataFrames, built when first asked for (``simulate`` writes its CSVs
    without them)."""

    name: str
    result: SimResult
    request_columns: dict[str, Any]
    summary: dict[str, Any]

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.request_columns, columns=list(metrics.REQUEST_COLUMNS))

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        return metrics.steps_frame(self.result)


def load_requests(scenario: Scenario, base_dir: Path) -> list[Request]:
    return build_requests(scenario.workload, seed=scenario.seed, base_dir=base_dir)


def load_workload(scenario: Scenario, base_dir: Path, max_model_len: int) -> ModelLenFit:
    """The scenario's requests after its ``max_model_len_policy`` (reject | truncate) for a
    window of ``max_model_len`` tokens, with how many requests the policy touched."""
    return fit_to_max_model_len(load_requests(scenario, base_dir), max_model_len,
                                scenario.max_model_len_policy)


def client_policy(scenario: Scenario, num_requests: int) -> Clients:
    """How the scenario's workload is sent, checked against the ``num_requests`` it produced
    (a trace window or a max_model_len policy decides that count only once built)."""
    clients = scenario.workload.client_policy(num_requests)
    if clients.warmup_requests >= num_requests:
        raise KvplanError(f"workload: warmup_requests {clients.warmup_requests} leaves none of the "
                          f"{num_requests} requests to measure")
    return clients


def run_allocator(dep: Deployment, allocator: str, requests: list[Request], *,
                  clients: Clients = OPEN_LOOP, progress: Progress | None = None,
                  record_steps: bool | str = True, step_bin_s: float = DEFAULT_BIN_S,
                  name: str | None = None) -> AllocatorRun:
    """Simulate ``requests`` sent by ``clients`` on ``dep`` with one allocator: the request and
    step frames and the summary (see :func:`simulator.engine.core.simulate`; ``record_steps`` and
    ``step_bin_s`` choose the step rows, :mod:`simulator.engine.steps`). ``name`` labels the run
    (default: the allocator's name)."""
    name = name or allocator
    task = None
    if progress is not None:
        task = progress.add_task(name, total=len(requests))

    def advance(count: int) -> None:
        if progress is not None and task is not None:
            progress.advance(task, count)

    # The run's groups and times are millions of acyclic objects on a big trace: the cyclic
    # collector would rescan them all again and again while the metrics are computed (the
    # engine pauses it during the simulation itself), so it is paused until the summary is done.
    with cyclic_gc_paused():
        result = simulate(requests, dep.replica_factory(allocator), dep.latency,
                          num_replicas=dep.scenario.num_replicas, clients=clients,
                          record_steps=record_steps, step_bin_s=step_bin_s,
                          on_progress=advance if progress is not None else None,
                          router=dep.scenario.router.config())
        columns = metrics.request_columns(result)
        summary = metrics.summarize(result, columns, None, dep.capacity_tokens)
        if dep.scenario.num_replicas > 1:
            summary["requests_per_replica"] = requests_per_replica(result.times.replica,  # type: ignore[attr-defined]
                                                                   dep.scenario.num_replicas)
        summary.update(saturation(result, columns).as_dict())
    return AllocatorRun(name, result, columns, summary)


__all__ = ["AllocatorRun", "client_policy", "load_requests", "load_workload", "run_allocator"]
