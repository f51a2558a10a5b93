"""Simulate a setup and read off the metrics its published rows report; re-time recorded runs.

:func:`simulate_setup` runs a setup's scenario through the same machinery as ``simulate``
(deployment, workload, engine, metrics) with given roofline constants and returns, per row, the
predicted value in SI units.

It can also *record* the run: every step's :class:`~simulator.latency.roofline.StepTerms` (what
it moves and computes, before any constant turns that into seconds) and, per request, the steps
that sent, started and finished it. :meth:`Recording.predict` then re-times the same steps under
other constants in a few vectorised numpy operations — what makes fitting the constants and
leaving one source out take seconds instead of hours.

Re-timing is exact when the run's decisions do not depend on step durations: a closed loop
without think time or a burst on one replica (the clients send at step ends; see
:mod:`simulator.engine.core`). With Poisson arrivals the batches would shift a little under other
constants; re-timing keeps the recorded batches, lets idle gaps absorb or grow, and is an
approximation — the fit re-simulates between rounds, and every reported prediction comes from a
full simulation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.config.deployment import build_deployment
from simulator.errors import KvplanError
from simulator.latency.constants import FIELDS, RooflineConstants
from simulator.latency.roofline import Rates, RooflineLatency, StepTerms, combine
from simulator.scheduler.plan import StepPlan
from simulator.engine.runs import client_policy, load_workload, run_allocator
from simulator.config.scenario import parse_scenario
from simulator.scheduler import Status
from simulator.commands.validate.setups import Setup
from simulator.commands.validate.table import THROUGHPUT_METRICS, PublishedRow

_STAT_KEY = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}
_LATENCY_KEY = {"ttft": "ttft_s", "itl": "tpot_s", "tpot": "tpot_s", "e2e": "e2e_s"}
_THROUGHPUT_KEY = {"output_throughput": "throughput_tok_s",
                   "total_throughput": "throughput_total_tok_s",
                   "request_throughput": "throughput_req_s"}


class Recorder:
    """A latency model that times steps with a roofline and keeps each step's terms."""

    quiet_runs = False  # one call per step, in order: the terms line up with the step rows

    def __init__(self, roofline: RooflineLatency) -> None:
        self.roofline = roofline
        self.terms: list[StepTerms] = []

    def step_latency_s(self, plan: StepPlan) -> float:
        self.terms.append(self.roofline.step_terms(plan))
        return self.roofline.step_latency_s(plan)

    def describe(self) -> dict[str, object]:
        return self.roofline.describe()

    @property
    def request_overhead_s(self) -> float:
        return self.roofline.request_overhead_s


@dataclass
class Recording:
    """One simulated replica's steps and requests, ready to be re-timed (module docstring)."""

    terms: StepTerms  # of numpy arrays, one element per step
    rates: Rates
    recorded_start_s: np.ndarray  # each step's start in the recorded run
    gap_before: np.ndarray  # bool: the replica was idle before this step (an arrival woke it)
    arrival_step: np.ndarray  # -1: sent at an absolute time (arrival_abs_s); else the step it followed
    arrival_abs_s: np.ndarray
    first_step: np.ndarray  # the step that emitted each finished request's first token
    finish_step: np.ndarray
    output_tokens: np.ndarray  # generated tokens (all samples)
    prompt_tokens: np.ndarray
    num_replicas: int
    request_index: np.ndarray | None = None  # each finished request's place in the run's request list

    def step_durations(self, c: RooflineConstants) -> np.ndarray:
        return combine(self.terms, self.rates, c, maximum=np.maximum)

    def step_ends(self, c: RooflineConstants) -> np.ndarray:
        d = self.step_durations(c)
        if not self.gap_before[1:].any():
            return self.recorded_start_s[0] + np.cumsum(d)
        ends = np.empty_like(d)
        t = 0.0
        # Busy periods: a step after an idle gap starts at its waking arrival or when the previous
        # step ends, whichever is later.
        starts = np.flatnonzero(self.gap_before)
        bounds = list(starts) + [len(d)]
        if bounds[0] != 0:
            bounds.insert(0, 0)
        for a, b in zip(bounds[:-1], bounds[1:]):
            t = max(t, float(self.recorded_start_s[a]))
            ends[a:b] = t + np.cumsum(d[a:b])
            t = float(ends[b - 1])
        return ends

    def request_times(self, c: RooflineConstants) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Under constants ``c``: every step's end, and per finished request when its client
        sent it (moved earlier by the front end's per-request overhead: the client sees every
        response that much later), its first token and its last."""
        ends = self.step_ends(c)
        sent = np.where(self.arrival_step >= 0, ends[np.maximum(self.arrival_step, 0)], self.arrival_abs_s)
        return ends, sent - c.request_overhead_s, ends[self.first_step], ends[self.finish_step]

    def predict(self, c: RooflineConstants, keys: frozenset[str] | None = None) -> dict[str, float]:
        """The summary's numbers (SI) under constants ``c``: latency stats and throughputs, all of
        them or only ``keys`` (``"ttft_s.p50"``, ``"throughput_tok_s"``... as :func:`row_key`
        names them: a fit asks only for what its rows report)."""
        if not len(self.finish_step):
            return {}  # nothing finished: no latency and no throughput to speak of
        ends, sent, first, last = self.request_times(c)
        out: dict[str, float] = {}
        wanted = (lambda name: True) if keys is None else (lambda name: name in keys)
        for name, values in (("ttft_s", lambda: first - sent), ("e2e_s", lambda: last - sent),
                             ("tpot_s", lambda: self._tpot(first, last, sent))):
            stats = [k for k in ("mean", "p50", "p90", "p99") if wanted(f"{name}.{k}")]
            if stats:
                out.update(_stats(name, values(), stats))
        makespan = float(ends[-1])
        r = self.num_replicas
        if makespan > 0:
            out["throughput_req_s"] = r * len(last) / makespan
            out["throughput_tok_s"] = r * float(self.output_tokens.sum()) / makespan
            out["throughput_total_tok_s"] = (
                r * float(self.output_tokens.sum() + self.prompt_tokens.sum()) / makespan)
        return out

    def _tpot(self, first: np.ndarray, last: np.ndarray, sent: np.ndarray) -> np.ndarray:
        multi = self.output_tokens > 1
        return (last[multi] - first[multi]) / (self.output_tokens[multi] - 1)


def _stats(name: str, v: np.ndarray, which: Sequence[str] = ("mean", "p50", "p90", "p99")) -> dict[str, float]:
    if not len(v):
        return {}
    out = {f"{name}.mean": float(v.mean())} if "mean" in which else {}
    qs = [k for k in ("p50", "p90", "p99") if k in which]
    if qs:
        for k, value in zip(qs, np.percentile(v, [float(k[1:]) for k in qs])):
            out[f"{name}.{k}"] = float(value)
    return out


def row_key(row: PublishedRow) -> str:
    """The flattened summary key that holds ``row``'s prediction."""
    if row.metric in THROUGHPUT_METRICS:
        return _THROUGHPUT_KEY[row.metric]
    stat = "mean" if row.statistic == "value" else _STAT_KEY[row.statistic]
    return f"{_LATENCY_KEY[row.metric]}.{stat}"


def row_value(row: PublishedRow, flat: dict[str, float]) -> float | None:
    """The predicted value of ``row`` (SI) from flattened summary numbers (None if missing)."""
    return flat.get(row_key(row))


@dataclass
class SetupResult:
    setup: Setup
    flat: dict[str, float]  # the simulated summary's numbers (SI), flattened
    recording: Recording | None
    error: str | None = None
    num_requests: int = 0
    kv_capacity_tokens: int = 0
    constants: RooflineConstants | None = None  # the roofline's constants in this run
    completed: int = 0
    rejected_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)

    def predicted(self, row: PublishedRow) -> float | None:
        """The row's predicted value (SI); None when the run failed or finished no request."""
        if self.error is not None or not self.completed:
            return None
        return row_value(row, self.flat)

    @property
    def status(self) -> str:
        """"simulated", or why the run predicts nothing."""
        if self.error is not None:
            return f"deployment refused ({self.error})"
        if not self.completed:
            why = ", ".join(f"{n} {reason}" for reason, n in self.rejected_by_reason.items())
            return f"no request completed ({why or 'none finished'})"
        return "simulated"


def simulate_setup(setup: Setup, constants: RooflineConstants | None, *, record: bool = False,
                   base_dir: Path | None = None) -> SetupResult:
    """Simulate ``setup`` (which must have a scenario) under ``constants`` (None: the fitted
    defaults). A deployment that cannot be built (weights that do not fit...) is returned with
    its error, not raised."""
    assert setup.scenario is not None
    data = dict(setup.scenario)
    if constants is not None:
        data["latency"] = {"model": "roofline", **dataclasses.asdict(constants)}
    where = f"validation row {setup.first.row_id}"
    try:
        scenario = parse_scenario(data, where)
        dep = build_deployment(scenario, base_dir or Path.cwd(), where=where)
        fit = load_workload(scenario, base_dir or Path.cwd(), dep.scheduler_config.max_model_len)
    except KvplanError as err:
        return SetupResult(setup, {}, None, error=str(err))
    requests = fit.requests
    roofline = dep.latency
    assert isinstance(roofline, RooflineLatency)
    recorder = None
    if record:
        recorder = Recorder(roofline)
        dep = dataclasses.replace(dep, latency=recorder)  # type: ignore[arg-type]
    run = run_allocator(dep, scenario.allocators[0], requests, clients=client_policy(scenario, len(requests)))
    flat = _flatten(run.summary, setup.num_replicas)
    recording = (recording_of(run, recorder, setup.num_replicas)
                 if recorder is not None and run.summary["completed"] else None)
    return SetupResult(setup, flat, recording, num_requests=len(requests),
                       kv_capacity_tokens=dep.capacity_tokens, constants=roofline.constants,
                       completed=int(run.summary["completed"]),
                       rejected_by_reason=dict(run.summary["rejected_by_reason"]))


def _flatten(summary: dict[str, object], replicas: int) -> dict[str, float]:
    flat: dict[str, float] = {}
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        stats = summary.get(key) or {}
        assert isinstance(stats, dict)
        for stat, value in stats.items():
            if value is not None:
                flat[f"{key}.{stat}"] = float(value)
    for key in _THROUGHPUT_KEY.values():
        flat[key] = replicas * float(summary[key])  # type: ignore[arg-type]
    return flat


def recording_of(run, recorder: Recorder, replicas: int) -> Recording:  # type: ignore[no-untyped-def]
    result = run.result
    steps = result.steps
    start = np.array([s[2] for s in steps], dtype=np.float64)
    duration = np.array([s[3] for s in steps], dtype=np.float64)
    if len(recorder.terms) != len(steps):
        raise RuntimeError(f"recorded {len(recorder.terms)} step terms for {len(steps)} steps")
    ends = start + duration  # bit for bit the engine's clock after each step
    step_of_end = {float(e): i for i, e in enumerate(ends)}
    gap = np.zeros(len(steps), dtype=bool)
    if len(steps):
        gap[0] = True
        gap[1:] = start[1:] > ends[:-1]
    arrival_step, arrival_abs, first, finish, out, prompt, index = [], [], [], [], [], [], []
    for i, (r, g, t) in enumerate(zip(result.requests, result.groups, result.times)):
        if g is None or g.status is not Status.FINISHED:
            continue
        index.append(i)
        k = step_of_end.get(float(r.arrival_s), -1)
        arrival_step.append(k)
        arrival_abs.append(r.arrival_s)
        first.append(step_of_end[float(t.first_token_s)])
        finish.append(step_of_end[float(t.finished_s)])
        out.append(r.output_tokens * max(r.n, r.beam_width))
        prompt.append(r.prompt_tokens)
    terms = StepTerms(*(np.array(col, dtype=np.float64) for col in zip(*recorder.terms))) \
        if recorder.terms else StepTerms(*(np.zeros(0) for _ in StepTerms._fields))
    return Recording(
        terms=terms, rates=recorder.roofline.rates, recorded_start_s=start, gap_before=gap,
        arrival_step=np.array(arrival_step, dtype=np.int64), arrival_abs_s=np.array(arrival_abs),
        first_step=np.array(first, dtype=np.int64), finish_step=np.array(finish, dtype=np.int64),
        output_tokens=np.array(out, dtype=np.float64), prompt_tokens=np.array(prompt, dtype=np.float64),
        num_replicas=replicas, request_index=np.array(index, dtype=np.int64))


def relative_error(predicted: float, published: float) -> float:
    return predicted / published - 1.0


def log_error(predicted: float, published: float) -> float:
    return abs(math.log(predicted / published)) if predicted > 0 else math.inf


__all__ = ["FIELDS", "Recording", "SetupResult", "log_error", "relative_error", "row_value",
           "simulate_setup"]
