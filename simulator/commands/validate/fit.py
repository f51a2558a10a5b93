"""Fit the roofline's constants to published measurements, and measure the fit honestly.

The objective is the mean absolute log error, |ln(predicted / published)|, over the simulated
rows, each *source* weighing the same in total (a source with 22 rows must not outvote one with
4): the fitted constants should describe GPUs, not one vendor's table. Log errors treat a 2×
over- and under-prediction alike and keep one wild row from dominating.

Parameters live in an unconstrained space for the minimiser: efficiencies through a logistic
(0, 1), times through a log (positive). The bounds keep every constant physical (see
:data:`EFFICIENCY_FLOOR` and :data:`TIME_RESOLUTION_S`): an efficiency stays in (0, 1], a time is
either at least 10 µs or exactly 0 — never the 10^-21 s a log would otherwise walk down to where a
term fits nothing.

A fit round re-times the recorded runs (:meth:`~simulator.commands.validate.predict.Recording.predict`)
under each candidate; rounds re-simulate with the new constants until the objective settles.
Re-timing is exact for closed loops and bursts and only approximate for open-loop arrivals (a
Poisson run's batches would change with the step times), so a round's constants are taken only
when the re-simulation confirms them: a proposal the simulation finds worse is walked back
halfway towards the current constants (twice at most), and when that does not help either the
fit stops where it was. The constants returned are never worse, simulated, than the start.

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
from simulator.commands.validate.optimize import nelder_mead
from simulator.commands.validate.predict import SetupResult, row_key, row_value
from simulator.commands.validate.setups import Setup
from simulator.commands.validate.table import PublishedRow

EFFICIENCIES = ("mem_efficiency", "flops_efficiency", "fp8_flops_efficiency", "moe_flops_efficiency")
# An efficiency is a share of a datasheet peak: in (0, 1] (RooflineConstants refuses anything
# else). The logistic keeps it inside; the floor keeps it off 0, where a step would take forever.
EFFICIENCY_FLOOR = 1e-4
# A fitted time below 10 µs is written as exactly 0. 10 µs is the resolution of what the
# benchmarks report (vllm bench serve prints latencies in ms to two decimals: "{:<10.2f}" in
# vllm/benchmarks/serve.py ``benchmark``) and under 1% of the shortest latency compared (a TPOT
# of a millisecond or more), so a term that small fits nothing; a log parameter would otherwise
# walk it down to 10^-21 s, a number no serving stack has.
TIME_RESOLUTION_S = 1e-5
IMPROVEMENT = 1e-4  # a round must lower the objective (mean |log error|) by this much to go on
BACKTRACKS = (0.5, 0.25)  # how far towards a proposal the simulation refused a round steps instead
ROUND_EVALS = 4000  # a round's Nelder–Mead budget: enough to stop on its tolerance, not on the budget


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
            v = min(max(v, EFFICIENCY_FLOOR), 1 - EFFICIENCY_FLOOR)
            out.append(math.log(v / (1 - v)))
        else:  # 0 sits half a simplex step below the resolution: it decodes to 0 again
            out.append(math.log(v) if v >= TIME_RESOLUTION_S else math.log(TIME_RESOLUTION_S) - 0.25)
    return np.array(out)


def _decode(x: np.ndarray, base: RooflineConstants, params: Sequence[str]) -> RooflineConstants:
    changes = {}
    for name, u in zip(params, x):
        if name in EFFICIENCIES:
            share = float(1 / (1 + math.exp(-u))) if u > -700 else 0.0
            changes[name] = min(max(share, EFFICIENCY_FLOOR), 1.0)
        else:
            t = float(min(math.exp(min(u, 2.0)), 10.0))
            changes[name] = t if t >= TIME_RESOLUTION_S else 0.0
    return dataclasses.replace(base, **changes)


def by_source(row: PublishedRow) -> str:
    return row.source


def source_weights(rows: Sequence[PublishedRow], group_of: Callable[[PublishedRow], str] = by_source
                   ) -> dict[str, float]:
    """Row weight by row id: 1 / (rows of its group: by default its source), so every group
    sums to 1."""
    count: dict[str, int] = defaultdict(int)
    for r in rows:
        count[group_of(r)] += 1
    return {r.row_id: 1.0 / count[group_of(r)] for r in rows}


def retimed_objective(results: Sequence[SetupResult], rows_of: Callable[[SetupResult], Sequence[PublishedRow]],
                      group_of: Callable[[PublishedRow], str] = by_source
                      ) -> Callable[[RooflineConstants], float]:
    """The fit objective as a function of the constants, over the rows ``rows_of`` each
    recorded result contributes (by re-timing), every ``group_of`` group weighing the same."""
    items = [(res, list(rows_of(res))) for res in results if res.recording is not None]
    items = [(res, rows, frozenset(row_key(r) for r in rows)) for res, rows in items if rows]
    weights = source_weights([r for _, rows, _ in items for r in rows], group_of)
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
        params: Sequence[str] = FIELDS, max_evals: int = ROUND_EVALS,
        group_of: Callable[[PublishedRow], str] = by_source) -> FitResult:
    """Constants minimising the re-timed objective, from ``start`` (one round, no re-simulation)."""
    objective = retimed_objective(results, rows_of, group_of)
    evals = [0]

    def f(x: np.ndarray) -> float:
        evals[0] += 1
        return objective(_decode(x, start, params))

    x, value = nelder_mead(f, _encode(start, params), step=0.5, max_evals=max_evals)
    best = _decode(x, start, params)
    # A time is set to exactly 0 when 0 fits as well (within IMPROVEMENT): the term then fits
    # nothing, and 0 says so where a value at the 10 µs floor would pretend to be a measurement.
    for name in params:
        if name not in EFFICIENCIES and getattr(best, name) > 0:
            zero = dataclasses.replace(best, **{name: 0.0})
            evals[0] += 1
            at_zero = objective(zero)
            if at_zero <= value + IMPROVEMENT:
                best, value = zero, at_zero
    n = sum(len(rows_of(res)) for res in results if res.recording is not None)
    return FitResult(best, value, n, evals[0])


def simulated_objective(results: Sequence[SetupResult]) -> float:
    """The objective of simulated results at the constants they were simulated with (re-timing a
    recording under its own constants is the simulation itself)."""
    ok = [r for r in results if r.error is None and r.constants is not None]
    if not ok:
        return math.inf
    constants = ok[0].constants
    assert constants is not None
    return retimed_objective(ok, lambda res: res.setup.rows)(constants)


def fit_in_rounds(setups: Sequence[Setup], start: RooflineConstants, *, params: Sequence[str],
                  rounds: int, simulate: Callable[[Setup, RooflineConstants], SetupResult]
                  ) -> tuple[RooflineConstants, list[SetupResult], list[dict[str, float]]]:
    """Fit in rounds (module docstring): simulate every setup with recording
    (``simulate(setup, constants)``), fit on the re-timed recordings, simulate with the proposal,
    and take it when the simulation confirms it — else try it halfway, then a quarter of the
    way; at most ``rounds`` fits, fewer once a round gains less than :data:`IMPROVEMENT`.
    Returns the constants, their results (simulated with them) and per round the proposal's
    re-timed and simulated objectives, the evaluations and whether it was taken."""
    current = start
    results = [simulate(s, current) for s in setups]
    best = simulated_objective(results)
    history: list[dict[str, float]] = []
    for round_no in range(rounds):
        ok = [r for r in results if r.error is None]
        outcome = fit(ok, current, params=params)
        here, there = _encode(current, params), _encode(outcome.constants, params)
        entry: dict[str, float] = {"round": round_no + 1, "start_objective": best,
                                   "retimed_objective": outcome.objective, "evals": outcome.num_evals}
        taken = None
        for share in (1.0, *BACKTRACKS):
            proposal = outcome.constants if share == 1.0 else _decode(here + share * (there - here), current,
                                                                      params)
            if proposal == current:
                break
            tried = [simulate(s, proposal) for s in setups]
            value = simulated_objective(tried)
            if value < best:
                taken = (proposal, tried, value, share)
                break
        if taken is None:
            entry.update(objective=best, step=0.0)
            history.append(entry)
            break
        proposal, tried, value, share = taken
        gain = best - value
        current, results, best = proposal, tried, value
        entry.update(objective=value, step=share)
        history.append(entry)
        if gain < IMPROVEMENT:
            break
    return current, results, history


def leave_one_source_out(results: Sequence[SetupResult], start: RooflineConstants, *,
                         params: Sequence[str] = FIELDS, max_evals: int = 800,
                         simulate: Callable[[Setup, RooflineConstants], SetupResult] | None = None
                         ) -> dict[str, float]:
    """Held-out predictions: for each source, fit on the other sources and predict its rows —
    re-timed, or simulated under the held-out constants with ``simulate`` (for runs whose
    re-timing is only approximate: open-loop arrivals). Returns ``{row_id: predicted value
    (SI)}`` for every recorded row."""
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
            if simulate is not None:
                again = simulate(res.setup, fitted)
                flat = again.flat if again.error is None and again.completed else {}
            else:
                flat = res.recording.predict(fitted)
            for r in held_rows:
                p = row_value(r, flat)
                if p is not None:
                    out[r.row_id] = p
    return out
