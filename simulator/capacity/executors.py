"""Where capacity searches run: in this process, a local process pool (default), or a Ray cluster.

Every executor takes a picklable top-level function and a list of tasks, runs them in any order
and returns the results *in task order*, so the same tasks give the same results whatever the
executor or the number of jobs (each task is deterministic on its own). ``on_done(index, result)``
is called in the caller's process as tasks finish, for progress bars.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import simulator
import workloads
from simulator.errors import KvplanError

T = TypeVar("T")
R = TypeVar("R")
OnDone = Callable[[int, Any], None]
RAY_MISSING = "ray executor needs: pip install 'kvplan[ray]'"
EXECUTORS = ("process", "ray")


class Executor(Protocol):
    def run(self, fn: Callable[[T], R], tasks: Sequence[T], on_done: OnDone | None = None) -> list[R]:
        """``[fn(t) for t in tasks]``, possibly in parallel; an exception in a task propagates."""
        ...


class SerialExecutor:
    """Runs tasks one after another in this process (``--jobs 1``; also the tests' reference)."""

    def run(self, fn: Callable[[T], R], tasks: Sequence[T], on_done: OnDone | None = None) -> list[R]:
        results: list[R] = []
        for i, task in enumerate(tasks):
            results.append(fn(task))
            if on_done is not None:
                on_done(i, results[-1])
        return results


class ProcessExecutor:
    """A ``concurrent.futures`` process pool of ``jobs`` workers.

    Workers are *spawned*, not forked: the parent may run a progress-bar thread, and forking a
    threaded process can deadlock. Each worker imports the simulator once and serves many tasks.
    """

    def __init__(self, jobs: int) -> None:
        if jobs < 1:
            raise KvplanError(f"--jobs must be at least 1, got {jobs}")
        self.jobs = jobs

    def run(self, fn: Callable[[T], R], tasks: Sequence[T], on_done: OnDone | None = None) -> list[R]:
        if not tasks:
            return []
        results: list[Any] = [None] * len(tasks)
        workers = min(self.jobs, len(tasks))
        with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
            try:
                for future in cf.as_completed(futures):
                    i = futures[future]
                    results[i] = future.result()
                    if on_done is not None:
                        on_done(i, results[i])
            except BaseException:  # a failed task or Ctrl-C: do not start what is still queued
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        return results


def import_ray() -> Any:
    """The ``ray`` module, or a KvplanError saying how to install it (ray is an optional extra)."""
    try:
        import ray  # optional dependency: imported only when the Ray executor is chosen
    except ImportError:
        raise KvplanError(RAY_MISSING) from None
    return ray


class RayExecutor:
    """Runs each task as a Ray remote function.

    If Ray is already initialized (a notebook, a test) that instance is used and left running;
    otherwise ``ray.init(address=...)`` joins a cluster (``None`` starts a local instance), and
    it is shut down after the run. On a remote cluster the scenario and trace files must exist
    at the same paths on the workers (a shared filesystem), or be bundled traces.
    """

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._ray = import_ray()

    def run(self, fn: Callable[[T], R], tasks: Sequence[T], on_done: OnDone | None = None) -> list[R]:
        ray = self._ray
        started = not ray.is_initialized()
        if started:
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         runtime_env={"py_modules": _code_dirs()})
            except (ConnectionError, ValueError, RuntimeError) as err:
                raise KvplanError(f"--address {self.address}: cannot join the Ray cluster ({err})") from None
        try:
            remote = ray.remote(fn)
            if not started:
                # Someone else's instance: uploading code is only possible at ray.init, so point
                # this job's workers at the local checkout instead (right for a local instance).
                path = os.pathsep.join(filter(None, (os.path.dirname(_code_dirs()[0]),
                                                     os.environ.get("PYTHONPATH"))))
                remote = remote.options(runtime_env={"env_vars": {"PYTHONPATH": path}})
            refs = [remote.remote(task) for task in tasks]
            index = {ref: i for i, ref in enumerate(refs)}
            results: list[Any] = [None] * len(tasks)
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                i = index[done[0]]
                results[i] = ray.get(done[0])
                if on_done is not None:
                    on_done(i, results[i])
            return results
        finally:
            if started:
                ray.shutdown()


def _code_dirs() -> list[str]:
    """The package folders a task imports, shipped to Ray workers so that they run this very
    code even on cluster nodes without this checkout."""
    return [os.path.dirname(m.__file__ or "") for m in (simulator, workloads)]


def make_executor(kind: str, *, jobs: int | None = None, address: str | None = None) -> Executor:
    """``process`` (``jobs`` workers, default the CPU count; one job runs in this process) or ``ray``."""
    if kind == "ray":
        return RayExecutor(address)
    if kind != "process":
        raise KvplanError(f"unknown executor '{kind}' (known: {', '.join(EXECUTORS)})")
    if address is not None:
        raise KvplanError("--address applies to --executor ray")
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs == 1:
        return SerialExecutor()
    return ProcessExecutor(jobs)
