"""Fidelity verdicts from synthetic numbers: a target is met or missed only when the measurement's
own noise (run-to-run spread, a load change) is within its bound; otherwise "inconclusive"."""

from __future__ import annotations

import pytest

from simulator.report.fidelity import judge_target, timing_shift_from_load


@pytest.mark.parametrize(("error", "spread", "shift", "verdict", "reason"), [
    (0.03, 0.02, 0.0, "met", ""),
    (-0.18, 0.02, 0.0, "missed", ""),
    (0.03, 0.35, 0.0, "inconclusive", "run-to-run spread 35% > target 10%"),
    (0.40, 0.35, 0.0, "inconclusive", "run-to-run spread 35% > target 10%"),  # a big error too
    (0.03, 0.02, 0.5, "inconclusive", "machine load changed timings by ~50% > target 10%"),
    (0.03, 0.10, 0.10, "met", ""),  # at the bound: still conclusive
    (0.03, None, None, "met", "run-to-run spread unknown (one real run)"),
    (None, 0.02, 0.0, "n/a", "no measured value to compare with"),
])
def test_judge_target(error: float | None, spread: float | None, shift: float | None, verdict: str,
                      reason: str) -> None:
    v = judge_target(error, 0.10, spread=spread, load_shift=shift)
    assert (v.verdict, v.reason) == (verdict, reason)
    assert v.met is {"met": True, "missed": False}.get(verdict)


@pytest.mark.parametrize(("reference", "measured", "shift"), [
    (0.2, 0.9, 0.0),  # both below one runnable process per CPU: no time-sharing either way
    (0.5, 2.0, 1.0),  # two processes per CPU: each step takes twice as long
    (3.0, 1.5, 0.5),  # calibrated on a busier machine: the real run is faster
    (1.5, 1.5, 0.0),
    (None, 2.0, None),
])
def test_timing_shift_from_load(reference: float | None, measured: float | None, shift: float | None) -> None:
    got = timing_shift_from_load(reference, measured)
    assert got == (None if shift is None else pytest.approx(shift))
