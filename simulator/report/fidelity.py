"""Comparing a real run with its simulation: same decisions, and how far the predicted times are off.

Two different questions, answered separately:

1. **Decisions.** Fed the real run's own step durations (a replay), the simulator must make the
   *identical* scheduling and allocation decisions: the same steps with the same batches, the same
   KV breakdown after every step, the same admission order, the same preemptions.
   :func:`compare_decisions` checks that and names the first step where they part.
2. **Prediction.** Fed the calibrated profile instead, how far are the simulated throughput and
   latencies from the measured ones (:func:`metric_errors`), and each step's predicted latency
   from its measured latency (:func:`step_errors`)?
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine.core import STEP_COLUMNS, SimResult

# step columns that are decisions (everything but the clock)
DECISION_COLUMNS = tuple(c for c in STEP_COLUMNS if c not in ("time_s", "duration_s"))
METRICS: tuple[tuple[str, str | None], ...] = (
    ("throughput_req_s", None), ("throughput_tok_s", None),
    ("ttft_s", "mean"), ("ttft_s", "p50"), ("ttft_s", "p99"),
    ("tpot_s", "mean"), ("tpot_s", "p50"), ("tpot_s", "p99"),
    ("e2e_s", "mean"), ("e2e_s", "p50"), ("e2e_s", "p99"),
)


@dataclass(frozen=True)
class DecisionCheck:
    identical: bool
    num_steps_real: int
    num_steps_sim: int
    admission_order_equal: bool
    preemptions_real: int
    preemptions_sim: int
    peak_kv_tokens_real: int  # the most KV slots in use after any step
    peak_kv_tokens_sim: int
    first_divergence: str  # "" when identical

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def admission_order(result: SimResult) -> list[int]:
    """Request ids in the order they were first admitted (ties by request id: same step)."""
    admitted = [(t.admitted_s, r.request_id) for r, t in zip(result.requests, result.times) if t.admitted_s >= 0]
    return [rid for _, rid in sorted(admitted)]


def _peak_used(result: SimResult) -> int:
    idx = {c: i for i, c in enumerate(STEP_COLUMNS)}
    used = [row[idx["kv_token_state"]] + row[idx["kv_reserved"]] + row[idx["kv_internal_fragmentation"]]
            for row in result.steps]
    return max(used, default=0)


def compare_decisions(real: SimResult, sim: SimResult) -> DecisionCheck:
    """Step-by-step comparison of everything but time (see the module docstring)."""
    idx = [STEP_COLUMNS.index(c) for c in DECISION_COLUMNS]
    first = ""
    for i, (a, b) in enumerate(zip(real.steps, sim.steps)):
        ra, rb = [a[j] for j in idx], [b[j] for j in idx]
        if ra != rb:
            diffs = [f"{c} {x} vs {y}" for c, x, y in zip(DECISION_COLUMNS, ra, rb) if x != y]
            first = f"step {i}: " + ", ".join(diffs) + " (real vs simulated)"
            break
    if not first and len(real.steps) != len(sim.steps):
        first = f"the real run took {len(real.steps)} steps, the simulation {len(sim.steps)}"
    order_equal = admission_order(real) == admission_order(sim)
    pre_real = [g.num_preemptions for g in real.groups]
    pre_sim = [g.num_preemptions for g in sim.groups]
    if not first and not order_equal:
        first = "admission order differs"
    if not first and pre_real != pre_sim:
        first = "per-request preemption counts differ"
    return DecisionCheck(
        identical=not first, num_steps_real=len(real.steps), num_steps_sim=len(sim.steps),
        admission_order_equal=order_equal, preemptions_real=sum(pre_real), preemptions_sim=sum(pre_sim),
        peak_kv_tokens_real=_peak_used(real), peak_kv_tokens_sim=_peak_used(sim), first_divergence=first,
    )


def _metric(summary: Mapping[str, Any], name: str, stat: str | None) -> float | None:
    value = summary[name] if stat is None else summary[name][stat]
    return None if value is None else float(value)


def metric_label(name: str, stat: str | None) -> str:
    return name if stat is None else f"{name}.{stat}"


def metric_errors(real: Mapping[str, Any], sim: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """For each headline metric: measured, simulated and relative error (sim − real) / real."""
    out: dict[str, dict[str, float | None]] = {}
    for name, stat in METRICS:
        r, s = _metric(real, name, stat), _metric(sim, name, stat)
        err = (s - r) / r if r not in (None, 0.0) and s is not None else None
        out[metric_label(name, stat)] = {"measured": r, "simulated": s, "relative_error": err}
    return out


def metric_spread(summaries: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Run-to-run spread of the measurement itself: (max − min) / mean over repeated real runs."""
    out: dict[str, float | None] = {}
    for name, stat in METRICS:
        values = [_metric(s, name, stat) for s in summaries]
        vals = [v for v in values if v is not None]
        if len(vals) < 2 or not np.mean(vals):
            out[metric_label(name, stat)] = None
        else:
            out[metric_label(name, stat)] = float((max(vals) - min(vals)) / np.mean(vals))
    return out


def step_errors(predicted_s: Sequence[float], measured_s: Sequence[float]) -> dict[str, float]:
    """MAPE and bias of per-step predicted vs measured latency."""
    p = np.asarray(predicted_s, dtype=np.float64)
    m = np.asarray(measured_s, dtype=np.float64)
    if not len(m):
        return {"mape": math.nan, "bias": math.nan, "num_steps": 0}
    rel = (p - m) / m
    return {"mape": float(np.mean(np.abs(rel))), "bias": float(np.mean(rel)),
            "p90_abs_error": float(np.percentile(np.abs(rel), 90)), "num_steps": int(len(m))}


# ---------------------------------------------------------------------- verdicts
def timing_shift_from_load(reference_per_cpu: float | None, measured_per_cpu: float | None) -> float | None:
    """Roughly how much a change of machine load alone moves a single-threaded timing.

    With ``L`` runnable processes per CPU, a busy thread gets about ``1 / max(1, L)`` of a CPU, so
    its steps take ``max(1, L)`` times as long. Between a stage at load ``a`` per CPU (the one the
    profile was fitted on) and one at ``b`` (the measured runs) the timings shift by about
    ``max(1, b) / max(1, a) − 1``; returned as a magnitude. An idle-enough machine (both ≤ 1
    per CPU) gives 0. None when either reading is unknown.
    """
    if reference_per_cpu is None or measured_per_cpu is None:
        return None
    return abs(max(1.0, measured_per_cpu) / max(1.0, reference_per_cpu) - 1.0)


@dataclass(frozen=True)
class TargetVerdict:
    """met | missed | inconclusive (the measurement's own noise exceeds the bound) | n/a."""

    verdict: str
    reason: str  # one line, "" when met or missed with nothing to add

    @property
    def met(self) -> bool | None:
        """True or False only for a conclusive verdict."""
        return {"met": True, "missed": False}.get(self.verdict)


def judge_target(error: float | None, bound: float, *, spread: float | None,
                 load_shift: float | None) -> TargetVerdict:
    """Whether ``|error| <= bound`` can be claimed at all, and then whether it holds.

    A relative error smaller than the measurement's own run-to-run ``spread`` means nothing, and
    neither does one made when the load changed between calibration and measurement by more
    than the bound (``load_shift``, :func:`timing_shift_from_load`): then the verdict is
    ``inconclusive`` with the reason, never met or missed.
    """
    if error is None:
        return TargetVerdict("n/a", "no measured value to compare with")
    if spread is not None and spread > bound:
        return TargetVerdict("inconclusive", f"run-to-run spread {spread:.0%} > target {bound:.0%}")
    if load_shift is not None and load_shift > bound:
        return TargetVerdict("inconclusive",
                             f"machine load changed timings by ~{load_shift:.0%} > target {bound:.0%}")
    note = "run-to-run spread unknown (one real run)" if spread is None else ""
    return TargetVerdict("met" if abs(error) <= bound else "missed", note)
