"""A step that ends before every scheduled event runs without a SimPy event of its own
(``_Environment.advance_to``); requests.csv is written column by column. Neither may change a
byte of the results: the same times, rows and totals as a run that waits out every step with a
timeout, and the same CSV as the row-by-row writer.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import simpy

from simulator.engine import core as engine
from simulator.report import files as report
from simulator.config.deployment import build_deployment
from simulator.engine.core import _Environment, simulate
from simulator.config.overrides import scenario_overrides
from simulator.engine.runs import client_policy, load_workload
from simulator.config.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_advance_to_moves_the_clock_only_before_every_event():
    env = _Environment(0.0)
    assert env.advance_to(2.5) and env.now == 2.5  # nothing scheduled: any time will do
    env.timeout(1.0)  # at 3.5
    assert env.advance_to(3.0) and env.now == 3.0
    assert not env.advance_to(3.5) and env.now == 3.0  # a tie: the scheduled event runs first
    assert not env.advance_to(4.0) and env.now == 3.0
    env.run()
    assert env.now == 3.5


def test_a_process_that_advances_itself_keeps_the_order_of_events():
    """A process steps by 1.0 (advancing the clock itself when it may) among others' events:
    a wake at 2.5 and one at 3.0 made at 2.5 (after the step ending at 3.0 began), and one at
    4.0 made at 0 (before the step ending at 4.0 began). The log is what plain timeouts give:
    at a tie the event made first runs first."""
    def run(advance: bool) -> list[tuple[str, float]]:
        env = _Environment(0.0)
        log: list[tuple[str, float]] = []

        def stepper():  # type: ignore[no-untyped-def]
            for _ in range(5):
                if not (advance and env.advance_to(env.now + 1.0)):
                    yield env.timeout(1.0)
                log.append(("step", env.now))

        def waker(delays: list[float]):  # type: ignore[no-untyped-def]
            for delay in delays:
                yield env.timeout(delay)
                log.append(("wake", env.now))

        env.process(waker([2.5, 0.5]))
        env.process(waker([4.0]))
        env.process(stepper())
        env.run()
        return log

    expected = [("step", 1.0), ("step", 2.0), ("wake", 2.5), ("step", 3.0), ("wake", 3.0),
                ("wake", 4.0), ("step", 4.0), ("step", 5.0)]
    assert run(advance=False) == expected
    assert run(advance=True) == expected


# open loop on one replica, several replicas, and clients (closed loop with think time)
CASES = [
    ("chat.yaml", {"workload.num_requests": 400}),
    ("code.yaml", {"workload.num_requests": 300, "num_replicas": 3}),
    ("closed-loop.yaml", {"workload.num_requests": 200}),
    ("engines.yaml", {"workload.num_requests": 300, "engine": "sglang", "allocators": "[paged]"}),
]


@pytest.mark.parametrize("macro", [True, False], ids=["quiet-runs", "single-steps"])
@pytest.mark.parametrize(("name", "overrides"), CASES, ids=[n for n, _ in CASES])
def test_steps_without_events_change_nothing(monkeypatch, name, overrides, macro):
    extra = [f"{k}={v}" for k, v in overrides.items()]
    scenario, base = load_scenario(ROOT / "scenarios" / name, scenario_overrides(extra=extra))
    dep = build_deployment(scenario, base)
    requests = load_workload(scenario, base, dep.scheduler_config.max_model_len).requests
    clients = client_policy(scenario, len(requests))
    allocator = scenario.allocators[0]

    def run():  # type: ignore[no-untyped-def]
        return simulate(requests, dep.replica_factory(allocator), dep.latency,
                        num_replicas=scenario.num_replicas, clients=clients, record_steps="full",
                        macro_steps=macro)

    timeouts: list[float] = []
    original = simpy.Environment.timeout

    def counted(self, delay, value=None):  # type: ignore[no-untyped-def]
        timeouts.append(delay)
        return original(self, delay, value)

    monkeypatch.setattr(simpy.Environment, "timeout", counted)
    fast = run()
    fast_timeouts = len(timeouts)
    monkeypatch.setattr(engine._Environment, "advance_to", lambda self, when_s: False)
    slow = run()
    assert fast_timeouts < len(timeouts) - fast_timeouts  # steps did run without their event
    assert list(fast.times) == list(slow.times)  # bit for bit
    assert fast.steps == slow.steps
    assert fast.totals() == slow.totals()
    assert fast.end_s == slow.end_s
    assert [r.arrival_s for r in fast.requests] == [r.arrival_s for r in slow.requests]


def test_columns_are_written_as_the_rows_would_be(tmp_path, monkeypatch):
    """Integers, floats (shortest repr), NaN (empty), strings and None, from numpy arrays and
    lists, two tables one after another: the bytes of write_rows_csv."""
    header = ("name", "i", "x", "y", "s")
    tables = [
        {"i": np.array([1, -2, 3], dtype=np.int64), "x": np.array([0.1 + 0.2, math.nan, 1e-300]),
         "y": np.array([2.5, 3.0, 1 / 3]), "s": ["ok", "", None]},
        {"i": np.array([7], dtype=np.int64), "x": np.array([math.inf]), "y": [math.nan],
         "s": ["rejected"]},
    ]
    by_rows = tmp_path / "rows.csv"
    report.write_rows_csv(by_rows, header, (
        (name, *row) for name, t in zip("ab", tables) for row in zip(t["i"], t["x"], t["y"], t["s"])))
    by_columns = tmp_path / "columns.csv"
    for chunk_rows in (2, 1 << 16):  # tables cut into chunks, and whole
        monkeypatch.setattr(report, "CHUNK_ROWS", chunk_rows)
        report.write_columns_csv(by_columns, header, (
            [[name] * len(t["s"]), *(t[c] for c in header[1:])] for name, t in zip("ab", tables)))
        assert by_columns.read_bytes() == by_rows.read_bytes()
    assert by_rows.read_text().splitlines() == [
        "name,i,x,y,s", "a,1,0.30000000000000004,2.5,ok", "a,-2,,3.0,", "a,3,1e-300,0.3333333333333333,",
        "b,7,inf,,rejected"]
