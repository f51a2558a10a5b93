"""Saturation: a run whose waiting queue grows through the trace.

A deployment that cannot keep up with its offered load has no steady state: every request waits
longer than the one before, so its latency figures say more about the trace's length than about
the deployment (replay twice as many requests and the p99 TTFT doubles). `simulate` flags such a
run, per allocator, with the stability test `capacity` uses to reject a rate — the least-squares
slope of the queueing delay against the time each request was offered
(:func:`simulator.capacity.search.queue_growth`), above
:data:`simulator.capacity.search.MAX_QUEUE_GROWTH` seconds of extra waiting per second of trace.

Only requests after the warm-up count; under a cap on requests in flight the wait for a client
slot counts as queueing, measured from the workload's own arrival time, as in `capacity`. A
closed loop and a burst offer every request at t = 0 (a closed loop holds at most its clients in
the system): with no spread of arrival times there is no slope, and neither is ever flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator import metrics
from simulator.capacity.search import MAX_QUEUE_GROWTH, queue_growth
from simulator.engine import SimResult


@dataclass(frozen=True, slots=True)
class Saturation:
    """Whether a run's queue grew through the trace.

    ``queue_growth_s_per_s``: seconds of queueing delay added per second of offered arrivals
    (least-squares slope; 0.0 when fewer than two requests finished or all arrived at once).
    ``saturated``: ``queue_growth_s_per_s > max_growth_s_per_s``.
    """

    queue_growth_s_per_s: float
    max_growth_s_per_s: float = MAX_QUEUE_GROWTH

    def __post_init__(self) -> None:
        if not self.max_growth_s_per_s > 0:
            raise ValueError(f"max_growth_s_per_s must be positive, got {self.max_growth_s_per_s}")

    @property
    def saturated(self) -> bool:
        return self.queue_growth_s_per_s > self.max_growth_s_per_s

    def as_dict(self) -> dict[str, Any]:
        """The summary.json fields: ``saturated``, ``queue_growth_s_per_s``."""
        return {"saturated": self.saturated, "queue_growth_s_per_s": self.queue_growth_s_per_s}


def saturation(result: SimResult, requests: pd.DataFrame) -> Saturation:
    """The :class:`Saturation` of a run: ``result`` and its :func:`metrics.requests_frame`."""
    measured = metrics.measured_requests(result, requests)
    offered_s = None
    if result.offered is not None:  # sends waited for a client slot: count that wait as queueing
        offered = result.offered[result.clients.warmup_requests:]
        offered_s = np.fromiter((r.arrival_s for r in offered), dtype=np.float64, count=len(offered))
    return Saturation(queue_growth(measured, offered_s))
