"""The machine's load around a measurement: a timing taken while other processes compete for the
CPU is not comparable with one taken on an idle machine, so every timed stage records it.

The load average (``os.getloadavg``: runnable processes, averaged over 1, 5 and 15 minutes) is
read before and after a stage; divided by the CPU count it says how contended the CPUs were.
Platforms without a load average give None, and the report says "unknown".
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadSample:
    """The 1-minute load average and the CPU count at one instant."""

    load_1m: float
    num_cpus: int

    @property
    def per_cpu(self) -> float:
        """Runnable processes per CPU: above ~1 a single-threaded timing starts to wait its turn."""
        return self.load_1m / self.num_cpus


@dataclass(frozen=True, slots=True)
class StageLoad:
    """The load before and after one timed stage (calibration, a real run, ...)."""

    stage: str
    before: LoadSample | None
    after: LoadSample | None

    @property
    def peak_per_cpu(self) -> float | None:
        """The higher of the two readings per CPU (None when the platform has no load average)."""
        values = [s.per_cpu for s in (self.before, self.after) if s is not None]
        return max(values) if values else None

    def as_dict(self) -> dict[str, object]:
        return {"stage": self.stage,
                "load_1m_before": None if self.before is None else round(self.before.load_1m, 2),
                "load_1m_after": None if self.after is None else round(self.after.load_1m, 2),
                "num_cpus": (self.before or self.after).num_cpus if (self.before or self.after) else None}


def sample_load() -> LoadSample | None:
    """The load now, or None where the platform has no load average."""
    try:
        load_1m = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return LoadSample(load_1m, os.cpu_count() or 1)
