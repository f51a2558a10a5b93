"""Roofline constants per GPU architecture, fitted to the silicon table's established measurements.

``kvplan validate --silicon --fit`` simulates every silicon setup once with recording, under the
global constants (fitted on validation/published.csv), and then, for each GPU architecture
(:data:`simulator.kv.gpus.ARCHITECTURE`) with at least :data:`MIN_ROWS` established
measurements simulated:

* **fits** every constant of :data:`FIT_PARAMS` on that architecture's established rows, from the
  global set, minimising the mean |log error| with every engine × model family cell weighing the
  same (a cell of 140 rows must not outvote one of 8): the set should describe the architecture,
  not its best-measured model;
* **leaves one model family out**: for each model family, fits on the architecture's other
  families and predicts the held-out family's rows — the error to expect on a model the
  constants never saw;
* **compares** with the global set on the same rows.

A fit re-times at most :data:`TRAIN_PER_CELL` simulations of each GPU × engine × model family
(the cells weigh the same in the objective, so the rest of a large cell adds time, not
information); every row is predicted with the result.

The recordings are closed loops (silicon_run's setups), whose batches do not depend on step
times, so re-timing them under other constants
(:meth:`simulator.commands.validate.silicon_run.WaveRecording.predict`) gives what a simulation
with those constants would: one simulation per setup serves the whole fit and every held-out
refit.

An architecture's set is **adopted** (``--write`` makes it the default for its GPUs) only if it
beats the global set on what it was not fitted on: held out by model family, on the
architecture's silicon rows (MAPE over TTFT and TPOT together). The rows it was fitted on, and
the held-out errors, go to roofline_fit.json with it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.commands.validate import fit as fitting
from simulator.commands.validate.predict import row_value
from simulator.commands.validate.report import family_of
from simulator.commands.validate.silicon_run import SiliconResult, find_gpu
from simulator.commands.validate.table import PublishedRow
from simulator.kv.gpus import architecture
from simulator.latency.constants import FIELDS, RooflineConstants

MIN_ROWS = 20  # established measurements simulated on an architecture before it gets its own set
FIT_PARAMS: tuple[str, ...] = tuple(f for f in FIELDS if f != "prefill_overhead_s")  # as the global fit
FIT_EVALS = 1000  # Nelder–Mead evaluations of an architecture's fit, from the global set
HELD_OUT_EVALS = 400  # ... of each leave-one-family-out refit
# The fit re-times at most this many simulations per GPU × engine × model family (evenly spread
# over the cell's setups in row-id order); every row is predicted. A re-timing pass over all of an
# architecture's ~10^7 recorded steps takes ~0.4 s, and the cells weigh the same whatever their
# size, so a large cell adds time, not information.
TRAIN_PER_CELL = 12


@dataclass
class ArchitectureFit:
    """One architecture's fitted set and how well it predicts."""

    architecture: str
    start: RooflineConstants
    constants: RooflineConstants
    objective: float  # weighted mean |log error| at the fitted constants (training setups)
    start_objective: float  # ... at the global constants
    num_evals: int
    num_trained: int  # setups re-timed by the fit (:data:`TRAIN_PER_CELL`)
    rows: list[PublishedRow]  # the established rows fitted
    cells: dict[str, int]  # "engine / model family" -> rows
    fitted: dict[str, float] = field(default_factory=dict)  # row id -> prediction (SI), in sample
    held_out: dict[str, float] = field(default_factory=dict)  # row id -> prediction, family held out
    global_: dict[str, float] = field(default_factory=dict)  # row id -> prediction, global set

    def mape(self, which: Mapping[str, float], rows: Sequence[PublishedRow] | None = None,
             metric: str | None = None) -> float | None:
        """MAPE of the predictions ``which`` over ``rows`` (default: the fitted rows), of one
        ``metric`` or all."""
        errs = [abs(which[r.row_id] / r.value_si - 1) for r in (self.rows if rows is None else rows)
                if r.row_id in which and (metric is None or r.metric == metric)]
        return float(np.mean(errs)) if errs else None

    @property
    def adopted(self) -> bool:
        """Whether the set beats the global one held out (module docstring)."""
        held, glob = self.mape(self.held_out), self.mape(self.global_)
        return held is not None and glob is not None and held < glob


def model_family(row: PublishedRow, extras: Mapping[str, Mapping[str, str]]) -> str:
    return family_of(extras[row.row_id].get("served_model") or row.model)


def _items(results: Sequence[SiliconResult], established: set[str]) -> list[SiliconResult]:
    """Results that recorded a run and answer at least one established row."""
    return [res for res in results if res.recording is not None
            and any(r.row_id in established for r in res.setup.rows)]


def _gpu_of(res: SiliconResult) -> str:
    assert res.setup.scenario is not None
    return str(res.setup.scenario["gpu"])


def _by_architecture(results: Sequence[SiliconResult], established: set[str]
                     ) -> dict[str, list[SiliconResult]]:
    """The recorded results of each architecture with :data:`MIN_ROWS` established rows."""
    by_arch: dict[str, list[SiliconResult]] = defaultdict(list)
    for res in _items(results, established):
        by_arch[architecture(_gpu_of(res))].append(res)
    return {arch: items for arch, items in sorted(by_arch.items())
            if arch and sum(r.row_id in established for res in items for r in res.setup.rows) >= MIN_ROWS}


def count_fits(results: Sequence[SiliconResult], established: set[str],
               extras: Mapping[str, Mapping[str, str]]) -> int:
    """How many fits :func:`fit_architectures` makes (its progress ticks): per architecture
    one, and one per model family held out when there are two or more."""
    total = 0
    for items in _by_architecture(results, established).values():
        families = {model_family(r, extras) for res in items for r in res.setup.rows if r.row_id in established}
        total += 1 + (len(families) if len(families) > 1 else 0)
    return total


def fit_architectures(results: Sequence[SiliconResult], established: set[str],
                      extras: Mapping[str, Mapping[str, str]], start_of: Callable[[str], RooflineConstants],
                      *, jobs: int = 1, tick: Callable[[], None] = lambda: None) -> dict[str, ArchitectureFit]:
    """Every architecture with :data:`MIN_ROWS` established rows recorded: its fit, its
    leave-one-family-out predictions and the global set's, by row (module docstring).
    ``start_of(gpu name)`` gives the global constants a GPU would take."""
    out: dict[str, ArchitectureFit] = {}
    for arch, items in _by_architecture(results, established).items():
        # the architecture's GPUs share one interconnect kind in the catalog: one start for all
        start = start_of(_gpu_of(items[0]))
        out[arch] = _fit_one(arch, items, established, extras, start, jobs=jobs, tick=tick)
    return out


def _cell(extras: Mapping[str, Mapping[str, str]]) -> Callable[[PublishedRow], str]:
    return lambda r: f"{r.engine} / {model_family(r, extras)}"


def _predictions(items: Sequence[SiliconResult], c: RooflineConstants, keep: Callable[[PublishedRow], bool]
                 ) -> dict[str, float]:
    out = {}
    for res in items:
        assert res.recording is not None
        flat = res.recording.predict(c)
        for r in res.setup.rows:
            if keep(r):
                p = row_value(r, flat)
                if p is not None:
                    out[r.row_id] = p
    return out


# The recordings a worker process fits on: set before the pool forks (fork start method), so the
# recordings are inherited, not pickled for every task.
_SHARED: dict[str, Any] = {}


def _held_out_fit(family: str) -> dict[str, float]:
    items, train_items, established, extras, start = (_SHARED[k] for k in
                                                      ("items", "train", "established", "extras", "start"))
    train = lambda r: r.row_id in established and model_family(r, extras) != family
    fitted = fitting.fit(train_items, start, params=FIT_PARAMS, max_evals=HELD_OUT_EVALS,
                         rows_of=lambda res: [r for r in res.setup.rows if train(r)],
                         group_of=_cell(extras)).constants
    return _predictions(items, fitted, lambda r: r.row_id in established and model_family(r, extras) == family)


def training_items(items: Sequence[SiliconResult], established: set[str],
                   extras: Mapping[str, Mapping[str, str]]) -> list[SiliconResult]:
    """At most :data:`TRAIN_PER_CELL` results per GPU × engine × model family, evenly spread
    over the cell in row-id order (deterministic)."""
    cells: dict[tuple[str, str, str], list[SiliconResult]] = defaultdict(list)
    for res in items:
        row = next(r for r in res.setup.rows if r.row_id in established)
        cells[(_gpu_of(res), row.engine, model_family(row, extras))].append(res)
    out: list[SiliconResult] = []
    for key in sorted(cells):
        members = sorted(cells[key], key=lambda res: res.setup.first.row_id)
        if len(members) <= TRAIN_PER_CELL:
            out.extend(members)
        else:
            picks = np.linspace(0, len(members) - 1, TRAIN_PER_CELL).round().astype(int)
            out.extend(members[i] for i in sorted(set(picks.tolist())))
    return out


def _fit_one(arch: str, items: list[SiliconResult], established: set[str],
             extras: Mapping[str, Mapping[str, str]], start: RooflineConstants, *, jobs: int,
             tick: Callable[[], None]) -> ArchitectureFit:
    mine = lambda res: [r for r in res.setup.rows if r.row_id in established]
    cell = _cell(extras)
    train = training_items(items, established, extras)
    objective = fitting.retimed_objective(train, mine, cell)
    outcome = fitting.fit(train, start, params=FIT_PARAMS, max_evals=FIT_EVALS, rows_of=mine, group_of=cell)
    tick()
    rows = [r for res in items for r in mine(res)]
    families = sorted({model_family(r, extras) for r in rows})
    _SHARED.update(items=items, train=train, established=established, extras=extras, start=start)
    held: dict[str, float] = {}
    if len(families) > 1:
        if jobs > 1 and "fork" in _start_methods():
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
                for part in pool.map(_held_out_fit, families):
                    held.update(part)
                    tick()
        else:
            for fam in families:
                held.update(_held_out_fit(fam))
                tick()
    _SHARED.clear()
    cells: dict[str, int] = defaultdict(int)
    for r in rows:
        cells[cell(r)] += 1
    result = ArchitectureFit(
        architecture=arch, start=start, constants=outcome.constants, objective=outcome.objective,
        start_objective=objective(start), num_evals=outcome.num_evals, num_trained=len(train),
        rows=sorted(rows, key=lambda r: r.row_id),
        cells=dict(sorted(cells.items())),
        fitted=_predictions(items, outcome.constants, lambda r: r.row_id in established),
        held_out=held, global_=_predictions(items, start, lambda r: r.row_id in established))
    return result


def _start_methods() -> list[str]:
    import multiprocessing

    return multiprocessing.get_all_start_methods() if os.name == "posix" else []


def summary(fits: Mapping[str, ArchitectureFit], extras: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """Per architecture, and per GPU × engine within it: rows, and MAPE / bias of TTFT and TPOT
    under the global set, the architecture's set in sample and held out by model family."""
    out: dict[str, Any] = {}
    for arch, f in fits.items():
        fitted_rows = f.rows
        groups: dict[str, list[PublishedRow]] = defaultdict(list)
        for r in fitted_rows:
            gpu = find_gpu(r.gpu)
            assert gpu is not None  # a fitted row was simulated: its GPU is in the catalog
            groups[f"{gpu.name} × {r.engine}"].append(r)
        out[arch] = {
            "adopted": f.adopted,
            "num_rows": len(fitted_rows),
            "cells": f.cells,
            "constants": {k: getattr(f.constants, k) for k in FIELDS},
            "start": {k: getattr(f.start, k) for k in FIELDS},
            "objective": f.objective, "start_objective": f.start_objective, "evals": f.num_evals,
            "setups_fitted": f.num_trained,
            "overall": _errors(f, fitted_rows),
            "by_gpu_engine": {k: _errors(f, v) for k, v in sorted(groups.items())},
            "by_family": {fam: _errors(f, [r for r in fitted_rows if model_family(r, extras) == fam])
                          for fam in sorted({model_family(r, extras) for r in fitted_rows})},
        }
    return out


def _errors(f: ArchitectureFit, rows: Sequence[PublishedRow]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("ttft", "tpot"):
        mine = [r for r in rows if r.metric == metric]
        entry: dict[str, Any] = {"rows": len(mine)}
        for name, preds in (("global", f.global_), ("fitted", f.fitted), ("held_out", f.held_out)):
            errs = [preds[r.row_id] / r.value_si - 1 for r in mine if r.row_id in preds]
            entry[name] = ({"mape": float(np.mean(np.abs(errs))), "bias": float(np.mean(errs))}
                           if errs else None)
        out[metric] = entry
    return out


def constants_block(fits: Mapping[str, ArchitectureFit]) -> dict[str, dict[str, float]]:
    """roofline_fit.json's ``per_architecture``: the adopted sets, every field."""
    return {arch: {k: getattr(f.constants, k) for k in FIELDS} for arch, f in fits.items() if f.adopted}


__all__ = ["FIT_PARAMS", "MIN_ROWS", "ArchitectureFit", "constants_block", "count_fits", "fit_architectures",
           "summary"]

