"""Continuous batching: queues, admission, preemption -> StepPlan. Knows nothing of time."""

from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.core import Scheduler
from simulator.scheduler.state import Group, Status, StepOutcome

__all__ = ["Group", "Scheduler", "SchedulerConfig", "Status", "StepOutcome"]
