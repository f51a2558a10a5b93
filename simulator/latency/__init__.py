"""Step-latency models: how long one engine step (a StepPlan) takes.

Every model implements :class:`LatencyModel`. ``roofline`` derives the time from the model and
GPU catalogs; ``profile`` reads a calibration file written by ``kvplan calibrate``.
"""

from __future__ import annotations

from typing import Protocol

from simulator.plan import StepPlan


class LatencyModel(Protocol):
    def step_latency_s(self, plan: StepPlan) -> float:
        """Seconds the step takes on the modelled deployment (> 0 for a non-empty plan)."""
        ...
