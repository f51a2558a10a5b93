"""Fit the roofline's constants to published measurements, and measure the fit honestly.

The objective is the mean absolute log error, |ln(predicted / published)|, over the simulated
rows, each *source* weighing the same in total (a source with 22 rows must not outvote one with
4): the fitted constants should describe GPUs, not one vendor's table. Log errors treat a 2×
over- and under-prediction alike and keep one wild row from dominating.

Parameters live in an unconstrained space for the minimiser: efficiencies through a logistic
(0, 1), times through a log (positive). A fit round re-times the recorded runs
(:meth:`~simulator.validate.predict.Recording.predict`) under each candidate; rounds re-simulate
with the new constants until the objective settles (the decisions of Poisson runs depend a
little on the constants).

Leave one source out: for each source, fit on the others (re-timing the recordings of the final
round) and predict the held-out source's rows — the error a user should expect on a benchmark
of a kind the fit never saw.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.latency.constants import FIELDS, RooflineConstants
from simulator.validate.optimize import nelder_mead
from simulator.validate.predict import SetupResult, row_key, row_value
from simulator.validate.setups import Setup
from simulator.validate.table import PublishedRow

EFFICIENCIES = ("mem_efficiency", "flops_efficiency", "fp8_flops_efficiency", "moe_flops_efficiency")
TIME_FLOOR_S = 1e-7  # a fitted time never reaches exactly 0: its log is the parameter


@dataclass(frozen=True)
class FitResult:
    constants: RooflineConstants
    objective: float  # weighted mean |log error| at the fitted constants
    num_rows: int
    num_evals: int


def _encode(c: RooflineConstants, params: Sequence[str]) -> np.ndarray:
    out = []
    for name in params:
        v = getattr(c, name)
        if name in EFFICIENCIES:
            v = min(max(v, 1e-4), 1 - 1e-4)
            out.append(math.log(v / (1 - v)))
        else:
            out.append(math.log(max(v, TIME_FLOOR_S)))
    return np.array(out)


def _decode(x: np.ndarray, base: RooflineConstants, params: Sequence[str]) -> RooflineConstants:
    changes = {}
    for name, u in zip(params, x):
        if name in EFFICIENCIES:
            changes[name] = float(1 / (1 + math.exp(-u))) if u > -700 else 1e-300
            changes[name] = min(max(changes[name], 1e-4), 1.0)
        else:
            changes[name] = float(min(math.exp(min(u, 2.0)), 10.0))
    return dataclasses.replace(base, **changes)


def source_weights(rows: Sequence[PublishedRow]) -> dict[str, float]:
    """Row weight by row id: 1 / (rows of its source), so every source sums to 1."""
    count: dict[str, int] = defaultdict(int)
    for r in rows:
        count[r.source] += 1
    return {r.row_id: 1.0 / count[r.source] for r in rows}


def retimed_objective(results: Sequence[SetupResult], rows_of: Callable[[SetupResult], Sequence[PublishedRow]]
                      ) -> Callable[[RooflineConstants], float]:
    """The fit objective as a function of the constants, over the rows ``rows_of`` each
    recorded result contributes (by re-timing)."""
    items = [(res, list(rows_of(res))) for res in results if res.recording is not None]
    items = [(res, rows, frozenset(row_key(r) for r in rows)) for res, rows in items if rows]
    weights = source_weights([r for _, rows, _ in items for r in rows])
    total = sum(weights.values())

    def objective(c: RooflineConstants) -> float:
        err = 0.0
        for res, rows, keys in items:
            assert res.recording is not None
            flat = res.recording.predict(c, keys)
            for r in rows:
                p = row_value(r, flat)
                if p is None or not p > 0:
                    err += weights[r.row_id] * 10.0
                else:
                    err += weights[r.row_id] * abs(math.log(p / r.value_si))
        return err / total if total else 0.0

    return objective


def fit(results: Sequence[SetupResult], start: RooflineConstants, *,
        rows_of: Callable[[SetupResult], Sequence[PublishedRow]] = lambda res: res.setup.rows,
        params: Sequence[str] = FIELDS, max_evals: int = 1500) -> FitResult:
    """Constants minimising the re-timed objective, from ``start`` (one round, no re-simulation)."""
    objective = retimed_objective(results, rows_of)
    evals = [0]

    def f(x: np.ndarray) -> float:
        evals[0] += 1
        return objective(_decode(x, start, params))

    x, value = nelder_mead(f, _encode(start, params), step=0.5, max_evals=max_evals)
    n = sum(len(rows_of(res)) for res in results if res.recording is not None)
    return FitResult(_decode(x, start, params), value, n, evals[0])


def fit_in_rounds(setups: Sequence[Setup], start: RooflineConstants, *, params: Sequence[str],
                  rounds: int, simulate: Callable[[Setup, RooflineConstants], SetupResult]
                  ) -> tuple[RooflineConstants, list[SetupResult], list[dict[str, float]]]:
    """Fit in rounds: simulate every setup with recording (``simulate(setup, constants)``), fit on
    the re-timed recordings, and again with the new constants, until the objective stops
    improving or after ``rounds`` fits. Returns the constants, the last round's results
    (simulated with them) and each round's objective and evaluations."""
    current = start
    history: list[dict[str, float]] = []
    results: list[SetupResult] = []
    for round_no in range(rounds + 1):
        results = [simulate(s, current) for s in setups]
        if round_no == rounds:
            break
        ok = [r for r in results if r.error is None]
        outcome = fit(ok, current, params=params)
        history.append({"round": round_no + 1, "objective": outcome.objective, "evals": outcome.num_evals})
        settled = history[-1]["objective"] >= (history[-2]["objective"] - 1e-4 if len(history) > 1 else 1e9)
        current = outcome.constants
        if settled:
            results = [simulate(s, current) for s in setups]
            break
    return current, results, history


def leave_one_source_out(results: Sequence[SetupResult], start: RooflineConstants, *,
                         params: Sequence[str] = FIELDS, max_evals: int = 800
                         ) -> dict[str, float]:
    """Held-out predictions: for each source, fit on the other sources and predict its rows
    (re-timed). Returns ``{row_id: predicted value (SI)}`` for every recorded row."""
    sources = sorted({r.source for res in results if res.recording is not None for r in res.setup.rows})
    out: dict[str, float] = {}
    if len(sources) < 2:
        return out
    for held in sources:
        fitted = fit(results, start, params=params, max_evals=max_evals,
                     rows_of=lambda res, s=held: [r for r in res.setup.rows if r.source != s]).constants
        for res in results:
            held_rows = [r for r in res.setup.rows if r.source == held]
            if res.recording is None or not held_rows:
                continue
            flat = res.recording.predict(fitted)
            for r in held_rows:
                p = row_value(r, flat)
                if p is not None:
                    out[r.row_id] = p
    return out
