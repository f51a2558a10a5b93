"""Step-latency models: how long one engine step (a StepPlan) takes.

Every model implements :class:`LatencyModel`. ``roofline`` derives the time from the model and
GPU catalogs; ``profile`` reads a calibration file written by ``kvplan calibrate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from simulator.scheduler.plan import StepPlan


class LatencyModel(Protocol):
    """How long a step takes. A model is a pure function of the plan unless it says otherwise:
    the engine may time a quiet run's steps ahead (:func:`quiet_latencies`) and leave some of
    them untaken when the run is cut short. A model with state (one that replays recorded
    durations, or records each call) sets ``quiet_runs = False``: the engine then times every
    step once, in order, as it runs it."""

    def step_latency_s(self, plan: StepPlan) -> float:
        """Seconds the step takes on the modelled deployment (> 0 for a non-empty plan)."""
        ...


def quiet_plans(plan: StepPlan, k: int) -> Iterator[StepPlan]:
    """The plans of steps 1 .. k-1 of a quiet run that ``plan`` starts: the same decode batch,
    every context one token longer per step (:meth:`simulator.scheduler.Scheduler.quiet_run`)."""
    n = plan.num_decode_seqs
    ctx = plan.decode_context_tokens
    sq = int(plan.decode_context_sq)  # Σ (context)²: an integer held as a float, exact below 2^53
    for j in range(1, k):
        sq += 2 * ctx + n  # Σ (L + 1)² = Σ L² + 2 Σ L + n
        ctx += n
        yield plan._replace(step_id=plan.step_id + j, decode_context_tokens=ctx,
                            decode_context_sq=float(sq), decode_max_context=plan.decode_max_context + j)


def quiet_latencies(model: LatencyModel, plan: StepPlan, k: int) -> Iterator[float]:
    """Durations of steps 1 .. k-1 of the quiet run ``plan`` starts, each exactly what
    ``model.step_latency_s`` gives for that step's plan.

    A model may provide ``quiet_latencies(plan, k)`` itself, computed without building the plans
    (it must give the same floats, bit for bit); otherwise each plan is built and timed.
    """
    own = getattr(model, "quiet_latencies", None)
    if own is not None:
        return own(plan, k)
    return (model.step_latency_s(p) for p in quiet_plans(plan, k))
