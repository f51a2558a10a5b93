"""The ``workload:`` section of a scenario: a validated spec and the requests it describes.

A workload is a real trace (a file, or ``bundled:NAME``) or synthetic (an arrival process and
two length distributions). Either may then be reshaped::

    workload:
      trace: bundled:azure-conv   # or a path relative to the scenario file; omit for synthetic
      rate: 8.0                   # rescale to this mean req/s (or rate_scale: 2.0)
      start_s: 0                  # keep [start_s, start_s + duration_s) of the rescaled trace,
      duration_s: 600             #   then the first num_requests of those
      num_requests: 2000
      n: 1                        # parallel samples per request
      beam_width: 1

Rate rescaling comes first, so ``start_s``/``duration_s`` are seconds of the workload that is
simulated. Synthetic workloads draw each ingredient (arrivals, prompt lengths, output lengths,
prefix groups) from its own stream of the seed, so changing one leaves the others unchanged.

How the requests are sent (:mod:`workloads.clients`; the way serving benchmarks load a server)::

      concurrency: 64             # closed loop: 64 clients, all sending at t = 0, each sending the
                                  #   next request when its previous one ends; no rate, no arrival
      think_time_s: 0             # closed loop: pause between a request's end and the next send
      requests_per_client: 10     # closed loop: 10 × concurrency requests (num_requests, if given, wins)
      rate: inf                   # a burst: every request at t = 0 (vllm bench serve's default)
      max_concurrency: 32         # open loop with at most 32 in flight; a later arrival waits
                                  #   client-side and is sent when a slot frees
      warmup_requests: 64         # the first 64 sent are left out of latency and throughput
      warmup_fraction: 0.1        #   (or the first 10% of them)

Under ``concurrency`` or ``rate: inf`` the requests keep the workload's order and lengths and
lose its times: a trace's timestamps are ignored (``start_s``/``duration_s`` then select a window
of the trace on its own clock), a synthetic workload needs no ``arrival`` but ``num_requests``.
"""

from __future__ import annotations

import logging
import math
import re
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator.errors import KvplanError, ScenarioError, did_you_mean, warn_user
from workloads import synthetic
from workloads.clients import Clients
from workloads.loaders import (MAX_ARRIVAL_S, MAX_ARRIVAL_TEXT, MAX_TOKENS, TraceFormat,
                               bundled_trace_path, iter_trace)
from workloads.request import Request, cyclic_gc_paused

log = logging.getLogger(__name__)

Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
PositiveReal = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeReal = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class BoolForNumber(ValueError):
    """A YAML boolean where a number is expected; ``key`` names the field."""

    def __init__(self, key: str, value: bool) -> None:
        super().__init__(f"expected a number, got {str(value).lower()} (a YAML boolean)")
        self.key = key


def no_bool_for_number(model: type[BaseModel], data: object) -> object:
    """``data`` (a mapping about to be validated as ``model``) unchanged, unless it gives a
    boolean for a number: pydantic would read YAML's ``true`` as 1 (``block_size: true`` -> 1),
    so that is a ValueError naming the key instead."""
    if not isinstance(data, dict):
        return data
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None or not isinstance(value, bool):
            continue
        kinds = _members(field.annotation)
        if bool not in kinds and any(kind in (int, float) for kind in kinds):
            raise BoolForNumber(key, value)
    return data


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_number(cls, data: object) -> object:
        return no_bool_for_number(cls, data)


class _Clipped(_Spec):
    min: Tokens = 1
    max: Tokens | None = None

    @model_validator(mode="after")
    def _bounds_ordered(self) -> _Clipped:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self


class FixedLengths(_Spec):
    dist: Literal["fixed"]
    value: Tokens


class UniformLengths(_Spec):
    """Integers uniform in [low, high], both included."""

    dist: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _range_ordered(self) -> UniformLengths:
        if self.high < self.low:
            raise ValueError(f"high {self.high} is below low {self.low}")
        return self


class LognormalLengths(_Clipped):
    """Lognormal with this mean and one percentile (p50, p90, p95 or p99), then clipped."""

    dist: Literal["lognormal"]
    mean: PositiveReal
    p50: PositiveReal | None = None
    p90: PositiveReal | None = None
    p95: PositiveReal | None = None
    p99: PositiveReal | None = None

    @property
    def percentile(self) -> tuple[float, float]:
        """``(percentile, value)`` of the one percentile given."""
        given = [(float(k[1:]), v) for k in ("p50", "p90", "p95", "p99")
                 if (v := getattr(self, k)) is not None]
        return given[0]

    @model_validator(mode="after")
    def _fits(self) -> LognormalLengths:
        given = [k for k in ("p50", "p90", "p95", "p99") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of p50, p90, p95, p99 (got {len(given)})")
        percentile, value = self.percentile
        try:
            synthetic.lognormal_params(self.mean, value, percentile)
        except KvplanError as err:
            raise ValueError(str(err)) from None
        return self


class EmpiricalLengths(_Clipped):
    """Resampled from a trace's prompt (for prompt_tokens) or output (for output_tokens) lengths."""

    dist: Literal["empirical"]
    trace: str
    format: TraceFormat = "auto"


LengthSpec = Annotated[
    Union[FixedLengths, UniformLengths, LognormalLengths, EmpiricalLengths],
    Field(discriminator="dist"),
]


class PoissonArrivals(_Spec):
    process: Literal["poisson"]
    rate: PositiveReal | None = None  # req/s; the workload's `rate` overrides it


class GammaArrivals(_Spec):
    process: Literal["gamma"]
    rate: PositiveReal | None = None
    cv: PositiveReal  # coefficient of variation of the gaps: 1 = Poisson-like, > 1 bursty


class ConstantArrivals(_Spec):
    process: Literal["constant"]
    rate: PositiveReal | None = None


ArrivalSpec = Annotated[
    Union[PoissonArrivals, GammaArrivals, ConstantArrivals], Field(discriminator="process")
]


class SharedPrefixSpec(_Spec):
    groups: Annotated[int, Field(ge=1)]
    prefix_tokens: Tokens
    popularity: synthetic.Popularity = "uniform"
    zipf_s: PositiveReal = 1.0  # Zipf exponent: group g has weight 1/(g+1)^zipf_s
    block_tokens: Tokens = 16  # granularity of the prefix ids

    @model_validator(mode="after")
    def _one_block(self) -> SharedPrefixSpec:
        if self.prefix_tokens < self.block_tokens:
            raise ValueError(
                f"prefix_tokens {self.prefix_tokens} is shorter than one block of "
                f"{self.block_tokens} tokens: nothing could be shared"
            )
        return self


class ColumnsSpec(_Spec):
    """Column names of a generic CSV/JSONL trace."""

    arrival: str = "arrival_s"
    prompt: str = "prompt_tokens"
    output: str = "output_tokens"
    time_unit: Literal["s", "ms", "us"] = "s"


_SYNTHETIC_KEYS = ("arrival", "prompt_tokens", "output_tokens", "shared_prefix")
_TRACE_KEYS = ("format", "model", "columns", "start_s")


class WorkloadSpec(_Spec):
    """The ``workload:`` section of a scenario (see the module docstring)."""

    trace: str | None = None  # a path (relative to the scenario file) or bundled:NAME
    format: TraceFormat = "auto"
    model: str | None = None  # BurstGPT: keep only this model's rows
    columns: ColumnsSpec | None = None  # generic csv/jsonl traces
    num_requests: Annotated[int, Field(ge=1)] | None = None
    start_s: NonNegativeReal | None = None
    duration_s: PositiveReal | None = None
    rate: Annotated[float, Field(gt=0)] | None = None  # mean req/s; inf (YAML inf or .inf): a burst
    rate_scale: PositiveReal | None = None
    arrival: ArrivalSpec | None = None
    prompt_tokens: LengthSpec | None = None
    output_tokens: LengthSpec | None = None
    shared_prefix: SharedPrefixSpec | None = None
    n: Annotated[int, Field(ge=1)] = 1
    beam_width: Annotated[int, Field(ge=1)] = 1
    concurrency: Annotated[int, Field(ge=1)] | None = None  # closed-loop clients
    requests_per_client: Annotated[int, Field(ge=1)] | None = None  # closed loop: × concurrency
    think_time_s: NonNegativeReal = 0.0  # closed loop: from a request's end to the next send
    max_concurrency: Annotated[int, Field(ge=1)] | None = None  # open loop: cap on requests in flight
    warmup_requests: Annotated[int, Field(ge=0)] = 0  # first K sent: not in the statistics
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] | None = None  # or the first share of them

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    @property
    def burst(self) -> bool:
        """``rate: inf``: every request arrives at t = 0."""
        return self.rate is not None and math.isinf(self.rate)

    @property
    def untimed(self) -> bool:
        """The workload's arrival times are ignored: every request is offered at t = 0."""
        return self.closed_loop or self.burst

    @property
    def total_requests(self) -> int | None:
        """``num_requests`` (it wins, e.g. as ``--num-requests``), or ``requests_per_client ×
        concurrency``; None when a duration decides."""
        if self.num_requests is not None:
            return self.num_requests
        if self.requests_per_client is not None and self.concurrency is not None:
            return self.requests_per_client * self.concurrency
        return None

    def num_warmup(self, num_requests: int) -> int:
        """Requests left out of the statistics when the workload has ``num_requests``:
        ``warmup_requests``, or ``⌊warmup_fraction × num_requests⌋``."""
        if self.warmup_fraction is not None:
            return math.floor(self.warmup_fraction * num_requests)
        return self.warmup_requests

    def client_policy(self, num_requests: int) -> Clients:
        """How the ``num_requests`` requests built from this spec are sent: closed loop, a cap on
        requests in flight, or open loop (and how many are warm-up)."""
        warmup = self.num_warmup(num_requests)
        if self.concurrency is not None:
            return Clients(self.concurrency, self.think_time_s, warmup)
        return Clients(self.max_concurrency, 0.0, warmup)

    def closed_loop_at(self, concurrency: int, where: str) -> WorkloadSpec:
        """This workload sent by ``concurrency`` closed-loop clients: its arrival times (``rate``,
        ``rate_scale``, ``arrival``, ``max_concurrency``) dropped, the rest kept and checked
        again (a one-line KvplanError naming ``where``, e.g. a synthetic ``duration_s``)."""
        data = self.model_dump(exclude_unset=True)
        for key in ("rate", "rate_scale", "arrival", "max_concurrency"):
            data.pop(key, None)
        return parse_workload({**data, "concurrency": concurrency}, where)

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        for key in ("start_s", "duration_s", "think_time_s"):  # seconds on the arrivals' clock
            value = getattr(self, key)
            if value is not None and value > MAX_ARRIVAL_S:
                raise ValueError(f"{key} {value:g} s is past the limit on arrival times,"
                                 f" {MAX_ARRIVAL_TEXT}")
        if self.rate is not None and self.rate_scale is not None:
            # Two ways to say one thing; a rate on the command line replaces the file's rate_scale
            # (simulator.config.overrides.scenario_overrides), so both here means both were written together.
            raise ValueError("give rate (mean req/s) or rate_scale (× the workload's own rate), not both")
        self._check_clients()
        if self.trace is not None:
            for key in _SYNTHETIC_KEYS:
                if getattr(self, key) is not None:
                    raise ValueError(f"'{key}' is for synthetic workloads; a trace brings its own")
            return self
        for key in _TRACE_KEYS:
            if key in self.model_fields_set:
                raise ValueError(f"'{key}' applies to a trace; this workload is synthetic")
        needed = ("prompt_tokens", "output_tokens") if self.untimed else (
            "arrival", "prompt_tokens", "output_tokens")
        for key in needed:
            if getattr(self, key) is None:
                raise ValueError(f"a synthetic workload needs '{key}' (or give a 'trace')")
        if self.untimed:
            how = "closed-loop clients (concurrency)" if self.closed_loop else "a burst (rate: inf)"
            if self.duration_s is not None:
                raise ValueError(f"'duration_s' needs arrival times, and under {how} there are "
                                 "none: give num_requests")
            if self.total_requests is None:
                raise ValueError(f"a synthetic workload sent by {how} needs num_requests")
            return self
        assert self.arrival is not None
        if self.rate is None and self.arrival.rate is None:
            raise ValueError("a synthetic workload needs a rate (arrival.rate or rate)")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a synthetic workload needs num_requests or duration_s")
        return self

    def _check_clients(self) -> None:
        if self.concurrency is not None:
            for key in ("rate", "rate_scale", "arrival"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"'{key}' sets arrival times, but closed-loop clients (concurrency) send "
                        f"each request when their previous one ends: drop '{key}' (for arrivals "
                        "at a rate with a cap on requests in flight, give rate and max_concurrency)")
            if self.max_concurrency is not None:
                raise ValueError("give concurrency (closed-loop clients) or max_concurrency (a cap "
                                 "on requests arriving at a rate), not both")
        else:
            for key in ("think_time_s", "requests_per_client"):
                if key in self.model_fields_set:
                    raise ValueError(f"'{key}' applies to closed-loop clients: give 'concurrency'")
        if self.warmup_fraction is not None and "warmup_requests" in self.model_fields_set:
            raise ValueError("give warmup_requests or warmup_fraction, not both")
        total = self.total_requests
        if total is not None and self.num_warmup(total) >= total:
            raise ValueError(f"warmup_requests {self.num_warmup(total)} leaves none of the {total} "
                             "requests to measure")


# --- building requests --------------------------------------------------------------------


def resolve_trace_path(trace: str, base_dir: Path) -> Path:
    """``bundled:NAME`` -> the shipped file; a relative path is taken from ``base_dir``."""
    if trace.startswith("bundled:"):
        return bundled_trace_path(trace.removeprefix("bundled:"))
    path = Path(trace).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if path.is_dir():
        raise KvplanError(f"trace '{trace}' is a directory ({path}), not a trace file")
    if not path.is_file():
        raise KvplanError(f"trace file '{trace}' not found (looked for {path})")
    return path


def _trace_options(spec: WorkloadSpec) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if spec.model is not None:
        options["model"] = spec.model
    if spec.columns is not None:
        options.update(spec.columns.model_dump())
    return options


def _lengths(
    spec: FixedLengths | UniformLengths | LognormalLengths | EmpiricalLengths, num: int,
    rng: np.random.Generator, column: Literal["prompt", "output"], base_dir: Path,
) -> synthetic.IntArray:
    if isinstance(spec, FixedLengths):
        return synthetic.fixed_lengths(num, spec.value)
    if isinstance(spec, UniformLengths):
        return synthetic.uniform_lengths(num, spec.low, spec.high, rng)
    if isinstance(spec, LognormalLengths):
        percentile, value = spec.percentile
        drawn = synthetic.lognormal_lengths(num, spec.mean, value, percentile, rng)
    else:
        trace = iter_trace(resolve_trace_path(spec.trace, base_dir), spec.format)
        values = np.fromiter((r.prompt_tokens if column == "prompt" else r.output_tokens
                              for r in trace), dtype=np.int64)
        drawn = synthetic.empirical_lengths(num, values, rng)
    return synthetic.clip_lengths(drawn, spec.min, spec.max)


def _arrivals_s(spec: WorkloadSpec, rng: np.random.Generator) -> synthetic.FloatArray:
    """A synthetic workload's arrival times: all 0.0 when untimed (the clients time the sends)."""
    if spec.untimed:
        assert spec.total_requests is not None
        return synthetic.untimed_arrivals_s(spec.total_requests)
    assert spec.arrival is not None
    rate = spec.rate if spec.rate is not None else spec.arrival.rate
    assert rate is not None
    if rate * (spec.rate_scale or 1.0) * MAX_ARRIVAL_S < 1.0:  # the mean gap alone is too long
        scaled = "" if spec.rate_scale is None else f" × rate_scale {spec.rate_scale:g}"
        raise KvplanError(f"a rate of {rate:g} req/s{scaled} spaces arrivals"
                          f" {1 / (rate * (spec.rate_scale or 1.0)):.3g} s apart on average, past"
                          f" the limit on arrival times of {MAX_ARRIVAL_TEXT}")
    return synthetic.arrival_times_s(
        spec.arrival.process, rate * (spec.rate_scale or 1.0), rng,
        cv=getattr(spec.arrival, "cv", 1.0), num_requests=spec.num_requests,
        duration_s=spec.duration_s,
    )


def _synthesize(spec: WorkloadSpec, seed: int, base_dir: Path) -> list[Request]:
    assert spec.prompt_tokens and spec.output_tokens
    arrival_rng, prompt_rng, output_rng, group_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    arrivals = _arrivals_s(spec, arrival_rng)
    num = len(arrivals)
    prompts = _lengths(spec.prompt_tokens, num, prompt_rng, "prompt", base_dir)
    outputs = _lengths(spec.output_tokens, num, output_rng, "output", base_dir)
    prefix: synthetic.SharedPrefix | None = None
    groups = None
    if spec.shared_prefix is not None:
        sp = spec.shared_prefix
        prefix = synthetic.SharedPrefix(sp.groups, sp.prefix_tokens, sp.popularity, sp.zipf_s,
                                        sp.block_tokens)
        groups = prefix.sample_groups(num, group_rng)
    _check_span(arrivals[-1] if num else 0.0, spec)
    return synthetic.make_requests(arrivals, prompts, outputs, n=spec.n,
                                   beam_width=spec.beam_width, groups=groups, shared_prefix=prefix)


def _from_trace(spec: WorkloadSpec, base_dir: Path) -> list[Request]:
    assert spec.trace is not None
    path = resolve_trace_path(spec.trace, base_dir)
    options = _trace_options(spec)
    return _shape(lambda: iter_trace(path, spec.format, **options), spec)


def shape_trace(requests: Sequence[Request], spec: WorkloadSpec) -> list[Request]:
    """A loaded trace as ``spec`` reshapes it: rescaled (``rate``/``rate_scale``), sliced
    (``start_s``, ``duration_s``, then the first ``num_requests``), untimed (every arrival at
    0.0, order kept, under ``concurrency`` or ``rate: inf``; the slice is then taken on the
    trace's own clock), then ``n``/``beam_width`` set. Bad input -> KvplanError.

    :func:`build_requests` does the same on the trace file itself, streamed (so the same
    requests, bit for bit, as this function on the whole loaded trace)."""
    return _shape(lambda: iter(requests), spec)


def _shape(read: Callable[[], Iterator[Request]], spec: WorkloadSpec) -> list[Request]:
    """:func:`shape_trace` of the trace that each call of ``read`` streams from its start.

    The trace is read only as far as the slice needs (a bad row beyond it goes unseen, see
    :func:`workloads.loaders.iter_trace`), except under ``rate``: rescaling comes before the
    slice (module docstring) and sets the mean rate of the *whole* trace, (N − 1) gaps over
    its span, which takes every row's count and the last arrival. Rows past the slice are
    then read for those two numbers and dropped. Without ``start_s``/``duration_s`` the slice
    is the first ``num_requests`` whatever the rate, so one pass keeps them and goes on
    counting; a window is placed on the rescaled clock, so the trace is read to its end for
    the rate first, then again only up to the window's end.
    """
    num = spec.total_requests
    window = spec.start_s is not None or spec.duration_s is not None
    time_factor = 1.0
    if spec.untimed:
        pass  # the clients time the sends; a rate would be meaningless
    elif spec.rate is not None and not window:
        requests = read()
        head = list(requests) if num is None else list(islice(requests, num))
        time_factor = synthetic.arrival_time_factor(
            synthetic.rate_scale_to(chain(head, requests), spec.rate))
        return _finish(synthetic.slice_requests(head, time_factor=time_factor), num, spec)
    elif spec.rate is not None:
        time_factor = synthetic.arrival_time_factor(synthetic.rate_scale_to(read(), spec.rate))
    elif spec.rate_scale is not None:
        time_factor = synthetic.arrival_time_factor(spec.rate_scale)
    selected: Iterable[Request] = read()
    if window or num is not None or time_factor != 1.0:
        selected = synthetic.slice_requests(selected, start_s=spec.start_s,
                                            duration_s=spec.duration_s, num_requests=num,
                                            time_factor=time_factor)
    return _finish(synthetic.untimed(selected) if spec.untimed else list(selected), num, spec)


def _finish(requests: list[Request], num: int | None, spec: WorkloadSpec) -> list[Request]:
    """The last steps of :func:`_shape`: warn if fewer than ``num`` requests were found, then
    set ``n`` and ``beam_width`` (in place: a copy of a big list would double the peak). The
    last arrival must be within :data:`~workloads.loaders.MAX_ARRIVAL_S` of the first."""
    _check_span(requests[-1].arrival_s if requests else 0.0, spec)
    if num is not None and len(requests) < num:
        warn_fewer_requests(num, len(requests), spec)
    if spec.n != 1 or spec.beam_width != 1:
        for i, r in enumerate(requests):
            requests[i] = Request(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens,
                                  spec.n, spec.beam_width, r.prefix_ids, r.prefix_block_tokens,
                                  r.kv_ready_tokens)
    return requests


def _check_span(last_s: float, spec: WorkloadSpec) -> None:
    """A workload whose last request arrives ``last_s`` after the first (at 0.0) is refused past
    :data:`~workloads.loaders.MAX_ARRIVAL_S` (a trace's own rows are checked as they are read;
    a rate or rate_scale can still stretch them, a sampled gap still land that far)."""
    if not last_s <= MAX_ARRIVAL_S:
        if spec.rate_scale is not None:
            cause = f": rate_scale {spec.rate_scale:g} stretches the workload that far"
        elif spec.rate is not None:
            cause = f": rate {spec.rate:g} req/s stretches the workload that far"
        else:
            cause = ""
        raise KvplanError(f"the last request arrives {last_s:.3g} s after the first, past the"
                          f" limit on arrival times of {MAX_ARRIVAL_TEXT}{cause}")


def warn_fewer_requests(asked: int, found: int, spec: WorkloadSpec) -> None:
    """Say that the trace holds fewer requests than asked for, so the run simulates fewer: a
    run quietly shorter than asked would be measured as if it were what was asked."""
    window = ""
    if spec.start_s is not None or spec.duration_s is not None:
        start = spec.start_s or 0.0
        end = "the end" if spec.duration_s is None else f"{start + spec.duration_s:g} s"
        window = f" between {start:g} s and {end}"
    asked_as = "num_requests" if spec.num_requests is not None else "requests_per_client × concurrency"
    warn_user(f"workload: {asked_as} asks for {asked:,} requests, but the trace has only"
              f" {found:,}{window}: running {found:,}")


def build_requests(spec: WorkloadSpec, *, seed: int, base_dir: Path) -> list[Request]:
    """The requests ``spec`` describes: numbered 0..N-1, sorted by arrival, first at 0.0.

    ``seed`` makes synthetic workloads reproducible (a trace ignores it). ``base_dir`` anchors
    relative trace paths (the scenario file's folder). A trace is streamed: read only up to
    the end of the requests selected (all of it under ``rate``, see :func:`_shape`), so rows
    past them are neither parsed nor checked. Requests longer than the context window
    are left as they are: the scenario's ``max_model_len_policy`` decides what happens to them
    (:func:`workloads.synthetic.fit_to_max_model_len`, applied by ``simulator.engine.runs.load_workload``).
    Bad input -> KvplanError prefixed ``workload``. The cyclic garbage collector is paused
    meanwhile (:func:`workloads.request.cyclic_gc_paused`).
    """
    try:
        with cyclic_gc_paused():
            if spec.trace is not None:
                requests = _from_trace(spec, base_dir)
            else:
                requests = _synthesize(spec, seed, base_dir)
    except KvplanError as err:
        raise KvplanError(f"workload: {err}") from None
    return requests


# --- readable validation errors -----------------------------------------------------------


def _members(annotation: Any) -> list[Any]:
    """The types a field may hold: Optional, Union and Annotated flattened."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [t for arg in get_args(annotation) for t in _members(arg)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _branch_labels(model: type[BaseModel]) -> set[object]:
    """What pydantic puts in an error's loc to name a union branch: tag values or the class."""
    labels: set[object] = {model.__name__}
    for field in model.model_fields.values():
        if get_origin(field.annotation) is Literal:
            labels.update(get_args(field.annotation))
    return labels


def _walk_loc(
    model: type[BaseModel], loc: Sequence[int | str]
) -> tuple[list[str], type[BaseModel] | None]:
    """Follow an error's loc through the model's fields: the path to show (union branch labels
    left out) and the model that owns the last key (None when unknown)."""
    shown: list[str] = []
    current: list[Any] = [model]
    owner: type[BaseModel] | None = None
    for item in loc:
        models = [t for t in current if _is_model(t)]
        if isinstance(item, int):
            shown.append(f"[{item}]")
            current = [m for t in current if get_origin(t) in (list, tuple, set, frozenset)
                       for m in _members(get_args(t)[0])]
            continue
        fields = models[0].model_fields if len(models) == 1 else {}
        if item not in fields:
            branch = [m for m in models if item in _branch_labels(m)]
            if branch:
                current = branch[:1]
                continue
        shown.append(str(item))
        owner = models[0] if len(models) == 1 else None
        if item in fields:
            current = _members(fields[item].annotation)
        else:  # a dict key, or an unknown key
            current = [m for t in current if get_origin(t) is dict
                       for m in _members(get_args(t)[1])]
    return shown, owner


def _dotted(parts: Sequence[str]) -> str:
    return "".join(p if p.startswith("[") or i == 0 else "." + p for i, p in enumerate(parts))


def _quoted_choices(text: str) -> list[str]:
    return re.findall(r"'([^']*)'", text)


# pydantic's error types for a value outside a field's bounds (Field(gt=..., le=...))
_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def format_validation_error(
    err: ValidationError, where: str, *, model: type[BaseModel],
    loc_prefix: Sequence[str] = (),
) -> ScenarioError:
    """One line for the FIRST error of ``err``, raised validating ``model`` from file ``where``.

    ``"chat.yaml: workload.prompt_tokens.mean: Input should be greater than 0"``, or for an
    unknown key ``"chat.yaml: unknown key 'workload.num_request' — did you mean
    'num_requests'?"`` (the suggestion comes from the fields valid at that level).
    ``loc_prefix`` is prepended to the shown path, for a model validated on its own
    (``("workload",)`` for a bare :class:`WorkloadSpec`).
    """
    first = err.errors()[0]
    shown, owner = _walk_loc(model, first["loc"])
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, BoolForNumber):  # raised for the whole mapping: name the key
        shown = [*shown, cause.key]
    path = _dotted([*loc_prefix, *shown])
    kind, message, ctx = first["type"], first["msg"], first.get("ctx", {})
    given = first.get("input")
    if kind == "extra_forbidden":
        key = shown[-1] if shown else ""
        names = [f.alias or n for n, f in owner.model_fields.items()] if owner else []
        hint = did_you_mean(key, names) or (f" (known keys: {', '.join(names)})" if names else "")
        return ScenarioError(f"{where}: unknown key '{path}'{hint}")
    if kind == "missing":
        message = "missing required key"
    elif kind == "union_tag_not_found":
        message = f"missing key {ctx.get('discriminator', '')}"
    elif kind == "union_tag_invalid":
        tags = _quoted_choices(str(ctx.get("expected_tags", "")))
        tag = str(ctx.get("tag", ""))
        message = (f"unknown {str(ctx.get('discriminator', '')).strip(chr(39))} '{tag}'"
                   + (did_you_mean(tag, tags) or f" (known: {', '.join(tags)})"))
    elif kind == "literal_error" and isinstance(given, str):
        message = f"{message} (got '{given}')" + did_you_mean(given, _quoted_choices(message))
    elif kind in _RANGE_ERRORS and isinstance(given, float) and math.isnan(given):
        # NaN fails every comparison, so pydantic reports whichever bound it checked first
        message = "expected a number, got NaN (not a number)"
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return ScenarioError(f"{where}: {path}: {message}" if path else f"{where}: {message}")


def parse_workload(data: object, where: str) -> WorkloadSpec:
    """Validate a ``workload:`` mapping read from file ``where``; errors -> one-line KvplanError."""
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err, where, model=WorkloadSpec,
                                      loc_prefix=("workload",)) from None
