"""Saturation: a run whose waiting queue grows through the trace.

A deployment that cannot keep up with its offered load has no steady state: every request waits
longer than the one before, so its latency figures say more about the trace's length than about
the deployment (replay twice as many requests and the p99 TTFT doubles). `simulate` flags such a
run, per allocator, with the stability test `capacity` uses to reject a rate — the least-squares
slope of the queueing delay against the time each request was offered
(:func:`queue_growth_of`, which `capacity` uses too), above :data:`MAX_QUEUE_GROWTH` seconds of
extra waiting per second of trace.

Only requests after the warm-up count; under a cap on requests in flight the wait for a client
slot counts as queueing, measured from the workload's own arrival time, as in `capacity`. A
closed loop and a burst offer every request at t = 0 (a closed loop holds at most its clients in
the system): with no spread of arrival times there is no slope, and neither is ever flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine import metrics
from simulator.engine.core import SimResult
from simulator.scheduler import Status

MAX_QUEUE_GROWTH = 0.05  # s of extra queueing per s of trace: an overload of ~5% or more is unstable


def queue_growth_of(status: Any, arrival_s: Any, queue_delay_s: Any,
                    offered_s: Any | None = None) -> float:
    """Least-squares slope of finished requests' queueing delay against their arrival time.

    With ``offered_s`` (the workload's arrival time of each request, when clients held sends
    back), the delay counts from the offered arrival (the wait for a client slot, then the
    server's queue) and the slope is taken against the offered arrival."""
    finished = np.asarray(status, dtype=object) == Status.FINISHED.value
    x = np.asarray(arrival_s, dtype=np.float64)[finished]
    y = np.asarray(queue_delay_s, dtype=np.float64)[finished]
    if offered_s is not None:
        offered = np.asarray(offered_s, dtype=np.float64)[finished]
        y = y + (x - offered)
        x = offered
    if len(x) < 2 or float(x.max() - x.min()) <= 0:
        return 0.0
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx * dx).sum())


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


def saturation(result: SimResult, requests: Any) -> Saturation:
    """The :class:`Saturation` of a run: ``result`` and its requests table
    (:func:`metrics.request_columns` or :func:`metrics.requests_frame`)."""
    cols = metrics.columns_of(requests)
    warmup = result.clients.warmup_requests
    offered_s = None
    if result.offered is not None:  # sends waited for a client slot: count that wait as queueing
        offered = result.offered[warmup:]
        offered_s = np.fromiter((r.arrival_s for r in offered), dtype=np.float64, count=len(offered))
    return Saturation(queue_growth_of(np.asarray(cols["status"], dtype=object)[warmup:],
                                      np.asarray(cols["arrival_s"])[warmup:],
                                      np.asarray(cols["queue_delay_s"])[warmup:], offered_s))
