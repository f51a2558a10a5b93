"""Executors: the same searches give exactly the same results in-process, in a process pool and on Ray."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from simulator.commands.capacity.executors import (
    RAY_MISSING,
    ProcessExecutor,
    SerialExecutor,
    make_executor,
)
from simulator.commands.capacity.search import SearchResult, SearchTask, run_search
from simulator.errors import KvplanError

SCENARIO: dict[str, Any] = {
    "name": "tiny", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 2,
    "latency": {"model": "constant", "step_s": 0.02},
    "workload": {"arrival": {"process": "poisson", "rate": 5.0},
                 "prompt_tokens": {"dist": "uniform", "low": 8, "high": 64},
                 "output_tokens": {"dist": "uniform", "low": 1, "high": 8}, "num_requests": 60},
    "slo": {"ttft_p99_s": 0.3},
}


def tasks() -> list[SearchTask]:
    """Two allocators × two seeds: poisson arrivals, so each seed has its own answer."""
    return [SearchTask(0, {**SCENARIO, "seed": seed, "allocators": [alloc]}, "tiny.yaml",
                       str(Path(".").resolve()), alloc, seed, 5.0, 0.1, False, None)
            for alloc in ("paged", "contiguous-max") for seed in (0, 1)]


@pytest.fixture(scope="module")
def serial_results() -> list[SearchResult]:
    return SerialExecutor().run(run_search, tasks())


def test_seeds_differ(serial_results: list[SearchResult]) -> None:
    assert serial_results[0].probes != serial_results[1].probes


def test_process_pool_equals_serial(serial_results: list[SearchResult]) -> None:
    done: list[int] = []
    results = ProcessExecutor(2).run(run_search, tasks(), lambda i, r: done.append(i))
    assert results == serial_results  # exact: every float the same
    assert sorted(done) == [0, 1, 2, 3]


def test_ray_equals_process_pool(serial_results: list[SearchResult]) -> None:
    ray = pytest.importorskip("ray")
    from simulator.commands.capacity.executors import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        done: list[int] = []
        results = RayExecutor().run(run_search, tasks(), lambda i, r: done.append(i))
    finally:
        ray.shutdown()
    assert results == serial_results
    assert sorted(done) == [0, 1, 2, 3]


def test_ray_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(KvplanError) as err:
        make_executor("ray")
    assert str(err.value) == RAY_MISSING == "ray executor needs: pip install 'kvplan[ray]'"


def test_make_executor_choices() -> None:
    assert isinstance(make_executor("process", jobs=1), SerialExecutor)
    pool = make_executor("process", jobs=3)
    assert isinstance(pool, ProcessExecutor) and pool.jobs == 3
    with pytest.raises(KvplanError, match="--jobs must be at least 1, got 0"):
        make_executor("process", jobs=0)
    with pytest.raises(KvplanError, match="--address applies to --executor ray"):
        make_executor("process", address="auto")
    with pytest.raises(KvplanError, match="unknown executor 'dask'"):
        make_executor("dask")


def test_a_failing_task_propagates() -> None:
    bad = dataclasses.replace(tasks()[0], scenario={**SCENARIO, "gpu": "h1000"})
    with pytest.raises(KvplanError, match="unknown GPU 'h1000'"):
        ProcessExecutor(2).run(run_search, [bad, *tasks()[:1]])


def test_a_dead_worker_is_a_clear_error_not_a_hang() -> None:
    """os._exit(3) ends the worker outright, as the OOM killer would (no result, no exception)."""
    with pytest.raises(KvplanError, match=r"a worker process died \(exit code 3\) while running task 0"):
        ProcessExecutor(2).run(os._exit, [3])


def test_a_task_error_carries_the_worker_traceback() -> None:
    bad = dataclasses.replace(tasks()[0], scenario={**SCENARIO, "workload": {"num_requests": "x"}})
    with pytest.raises(KvplanError) as err:
        ProcessExecutor(2).run(run_search, [bad])
    assert "Traceback" in str(err.value.__cause__) and "run_search" in str(err.value.__cause__)
