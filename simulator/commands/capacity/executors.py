"""Where capacity searches run: in this process, a local process pool (default), or a Ray cluster.

Every executor takes a picklable top-level function and a list of tasks, runs them in any order
and returns the results *in task order*, so the same tasks give the same results whatever the
executor or the number of jobs (each task is deterministic on its own). ``on_done(index, result)``
is called in the caller's process as tasks finish, for progress bars.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol, TypeVar

import simulator
import workloads
from simulator.commands.capacity.options import EXECUTORS
from simulator.errors import KvplanError

T = TypeVar("T")
R = TypeVar("R")
OnDone = Callable[[int, Any], None]
RAY_MISSING = "ray executor needs: pip install 'kvplan[ray]'"
_SPAWN = multiprocessing.get_context("spawn")


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


TERMINATE_GRACE_S = 1.0  # after SIGTERM, a worker has this long to clean up before SIGKILL


class ProcessExecutor:
    """A pool of ``jobs`` worker processes, each given one task at a time over its own pipe.

    Stopping is this pool's job, not the workers': ``concurrent.futures`` waits for running tasks
    when it shuts down (a search may run for minutes, so Ctrl-C took that long) and a second
    Ctrl-C then hangs in its thread joins. Here:

    * workers are started with SIGINT ignored — Ctrl-C reaches the whole foreground process
      group, and only this process may act on it;
    * whatever ends a run early here (Ctrl-C, a failed task, a dead worker) first stops every
      worker — SIGTERM, which a worker turns into SystemExit so that its ``finally`` blocks run
      (a half-written cache file is removed), then SIGKILL after :data:`TERMINATE_GRACE_S` —
      and then propagates; a second Ctrl-C while stopping skips the grace;
    * a worker that dies (killed, out of memory) is a clear error, never a wait for a result
      that cannot come.

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
        queue = list(enumerate(tasks))[::-1]  # popped from the end: task order
        workers: list[_Worker] = []
        finished = False
        try:
            with _sigint_ignored():  # an ignored signal stays ignored through exec: see _serve
                workers = [_Worker.start(fn) for _ in range(min(self.jobs, len(tasks)))]
            for worker in workers:
                worker.give(queue)
            for _ in range(len(tasks)):
                i, result = _next_result(workers, queue)
                results[i] = result
                if on_done is not None:
                    on_done(i, result)
            finished = True
        finally:
            _stop(workers, graceful=finished)
        return results


@dataclass(slots=True)
class _Worker:
    """One worker process, its end of the pipe, and the index of the task it runs (None: idle)."""

    process: BaseProcess
    conn: Connection
    task_index: int | None = None

    @classmethod
    def start(cls, fn: Callable[[Any], Any]) -> _Worker:
        ours, theirs = _SPAWN.Pipe()
        process = _SPAWN.Process(target=_serve, args=(theirs, fn), daemon=True, name="kvplan-worker")
        process.start()
        theirs.close()  # the worker holds its own copy; closing ours lets a dead worker read as EOF
        return cls(process, ours)

    def give(self, queue: list[tuple[int, Any]]) -> None:
        """Send the next queued task (none left: stay idle)."""
        self.task_index = None
        if queue:
            self.task_index, task = queue.pop()
            self.conn.send((self.task_index, task))


def _next_result(workers: list[_Worker], queue: list[tuple[int, Any]]) -> tuple[int, Any]:
    """Wait for a busy worker to answer; give it the next task; return ``(index, result)``.
    A task's exception is raised here; so is a KvplanError when a worker died."""
    busy = [w for w in workers if w.task_index is not None]
    assert busy, "a result is awaited, so some worker has a task"
    ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
    # Results first: a worker may have answered and then exited.
    worker = next((w for w in busy if w.conn in ready), None)
    if worker is None:
        dead = next(w for w in busy if w.process.sentinel in ready)
        dead.process.join()
        raise KvplanError(f"a worker process died ({_exit_reason(dead.process.exitcode)}) while running "
                          f"task {dead.task_index}; out of memory? try fewer --jobs")
    try:
        index, ok, payload = worker.conn.recv()
    except EOFError:
        worker.process.join()
        raise KvplanError(f"a worker process died ({_exit_reason(worker.process.exitcode)}) while "
                          f"running task {worker.task_index}") from None
    assert index == worker.task_index, (index, worker.task_index)
    if not ok:
        error, remote_traceback = payload
        raise error from _RemoteTraceback(remote_traceback)
    worker.give(queue)
    return index, payload


def _stop(workers: list[_Worker], *, graceful: bool) -> None:
    """End every worker: idle ones are asked to exit (``graceful``), the others get SIGTERM, and
    any left after :data:`TERMINATE_GRACE_S` (or at a second Ctrl-C) get SIGKILL."""
    for w in workers:
        if graceful and w.task_index is None:
            try:
                w.conn.send(None)
            except OSError:
                w.process.terminate()  # already gone, or its pipe broken: make sure
        else:
            w.process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    try:
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
    finally:  # also on a second Ctrl-C during the joins
        for w in workers:
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()


def _serve(conn: Connection, fn: Callable[[Any], Any]) -> None:
    """A worker's loop: receive ``(index, task)``, send back ``(index, True, fn(task))`` or
    ``(index, False, (exception, traceback text))``; ``None`` or a closed pipe ends it.

    SIGINT is already ignored (inherited; set again here for a worker started outside the main
    thread); SIGTERM raises SystemExit, so ``finally`` blocks (cache writes) run on the way out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        index, task = item
        try:
            conn.send((index, True, fn(task)))
        except Exception as err:  # sent back, and raised in the parent
            conn.send((index, False, (_picklable(err), traceback.format_exc())))


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _picklable(err: Exception) -> Exception:
    """``err`` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:  # any failure to round-trip: an unpicklable attribute, a custom __reduce__
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err


class _RemoteTraceback(Exception):
    """The worker's traceback, chained as the cause of a task's exception (as concurrent.futures
    does), so that a bug in a task is found where it happened."""

    def __init__(self, text: str) -> None:
        super().__init__(text)

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.args[0]}\"\"\""


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while worker processes start, so that they inherit it ignored (a Ctrl-C in
    those few milliseconds is lost). Only the main thread may set handlers; elsewhere this does
    nothing and the workers ignore SIGINT from their first line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1)
                    i = index[done[0]]
                    results[i] = ray.get(done[0])
                    if on_done is not None:
                        on_done(i, results[i])
            except BaseException:  # a failed task or Ctrl-C: stop what still runs or waits
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise
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
