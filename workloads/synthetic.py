"""Synthetic workloads and transformations of request lists.

Generators draw from a caller-supplied ``numpy.random.Generator`` (same seed -> identical
requests) and work on whole arrays, so 10^6 requests take about a CPU second, most of it
building the ``Request`` objects, about 160 bytes each (see :func:`make_requests`). The pieces:

* arrivals: Poisson, gamma (burstiness set by the coefficient of variation of the gaps),
  constant rate; the first request arrives at 0.0 like a loaded trace's; or all at 0.0 (a
  burst, or closed-loop clients, which time the sends themselves);
* lengths: fixed, uniform, lognormal fitted to a mean and a percentile, empirical (resampled
  from a trace), each clipped to ``[min_tokens, max_tokens]``;
* shared-prefix groups (system prompts, few-shot templates) with uniform or Zipf popularity;
* list transformations: :func:`scale_rate`, :func:`rescale_to_rate`, :func:`slice_requests`.
  Their results are numbered 0..N-1 again and start at 0.0. :func:`slice_requests` and
  :func:`mean_rate_per_s` also take a stream (:func:`workloads.loaders.iter_trace`) and read
  it once, the slice only as far as it needs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt

from simulator.errors import KvplanError
from workloads.request import Request, cyclic_gc_paused

ArrivalProcess = Literal["poisson", "gamma", "constant"]
Popularity = Literal["uniform", "zipf"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# --- arrivals -----------------------------------------------------------------------------


def interarrival_s(
    process: ArrivalProcess, rate_per_s: float, num_gaps: int, rng: np.random.Generator,
    *, cv: float = 1.0,
) -> FloatArray:
    """``num_gaps`` gaps between arrivals, with mean ``1 / rate_per_s``.

    poisson: exponential gaps (CV 1). gamma: shape ``1/cv²``, scale ``cv²/rate``, so the mean
    is ``1/rate`` and the gaps' coefficient of variation is ``cv`` (> 1 = bursty). constant:
    every gap is ``1/rate`` (``cv`` is ignored).
    """
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise KvplanError(f"arrival rate must be a positive number of requests/s (got {rate_per_s})")
    if process == "poisson":
        return rng.exponential(1.0 / rate_per_s, num_gaps)
    if process == "gamma":
        if not cv > 0:
            raise KvplanError(f"gamma arrivals need cv > 0 (got {cv})")
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, 1.0 / (rate_per_s * shape), num_gaps)
    if process == "constant":
        return np.full(num_gaps, 1.0 / rate_per_s)
    raise KvplanError(f"unknown arrival process '{process}' (known: poisson, gamma, constant)")


def arrival_times_s(
    process: ArrivalProcess, rate_per_s: float, rng: np.random.Generator, *, cv: float = 1.0,
    num_requests: int | None = None, duration_s: float | None = None,
) -> FloatArray:
    """Sorted arrival times starting at 0.0: ``num_requests`` of them, or all before
    ``duration_s``, or (both given) the first ``num_requests`` before ``duration_s``."""
    if num_requests is None and duration_s is None:
        raise KvplanError("synthetic arrivals need num_requests or duration_s")
    if num_requests is not None and num_requests < 1:
        raise KvplanError(f"num_requests must be at least 1 (got {num_requests})")
    if duration_s is None:
        assert num_requests is not None
        gaps = interarrival_s(process, rate_per_s, num_requests - 1, rng, cv=cv)
        return np.concatenate(([0.0], np.cumsum(gaps)))
    if not duration_s > 0:
        raise KvplanError(f"duration_s must be positive (got {duration_s})")
    # Draw in chunks of about the expected count until the window is covered.
    chunk = max(1024, int(1.2 * rate_per_s * duration_s))
    parts: list[FloatArray] = [np.zeros(1)]
    last_s, count = 0.0, 1
    while last_s < duration_s and (num_requests is None or count < num_requests):
        times = last_s + np.cumsum(interarrival_s(process, rate_per_s, chunk, rng, cv=cv))
        parts.append(times)
        last_s, count = float(times[-1]), count + chunk
    arrivals = np.concatenate(parts)
    arrivals = arrivals[arrivals < duration_s]
    return arrivals if num_requests is None else arrivals[:num_requests]


def untimed_arrivals_s(num_requests: int) -> FloatArray:
    """``num_requests`` arrivals at 0.0: a burst, or the offer to closed-loop clients (which
    then decide when each request is sent, see :mod:`workloads.clients`)."""
    if num_requests < 1:
        raise KvplanError(f"num_requests must be at least 1 (got {num_requests})")
    return np.zeros(num_requests)


# --- lengths ------------------------------------------------------------------------------


def fixed_lengths(num_requests: int, value_tokens: int) -> IntArray:
    """Every request gets ``value_tokens``."""
    return np.full(num_requests, value_tokens, dtype=np.int64)


def uniform_lengths(
    num_requests: int, low_tokens: int, high_tokens: int, rng: np.random.Generator
) -> IntArray:
    """Integers drawn uniformly from ``[low_tokens, high_tokens]`` (both included)."""
    if low_tokens > high_tokens:
        raise KvplanError(f"uniform lengths need low <= high (got {low_tokens} > {high_tokens})")
    return rng.integers(low_tokens, high_tokens, num_requests, dtype=np.int64, endpoint=True)


def lognormal_params(mean_tokens: float, quantile_tokens: float, percentile: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal ``exp(mu + sigma·Z)`` with the given mean and
    ``percentile``-th percentile (e.g. mean 161, p99 = 1024).

    With ``z = Φ⁻¹(percentile/100)``: mean ``m = exp(mu + sigma²/2)`` and quantile
    ``q = exp(mu + z·sigma)``, so ``sigma²/2 − z·sigma + ln(q/m) = 0``, whose roots are
    ``sigma = z ± sqrt(z² − 2·ln(q/m))``; then ``mu = ln m − sigma²/2``.
    Above the median (z > 0) we need ``m < q <= m·exp(z²/2)`` (p99: up to 14.97·m) and take
    the smaller root, the lighter tail (the larger one puts so much mass far out that the
    mean exceeds most of the distribution). At or below the median (z <= 0) we need
    ``q < m``, and only ``z + sqrt(...)`` is positive. Anything else -> KvplanError.
    """
    if not (mean_tokens > 0 and quantile_tokens > 0 and 0 < percentile < 100):
        raise KvplanError(
            f"lognormal needs mean > 0, a percentile value > 0 and 0 < percentile < 100 "
            f"(got mean {mean_tokens}, p{percentile:g} {quantile_tokens})"
        )
    z = NormalDist().inv_cdf(percentile / 100.0)
    log_ratio = math.log(quantile_tokens / mean_tokens)
    label = f"lognormal p{percentile:g} {quantile_tokens:g}"
    if z > 0:
        upper = mean_tokens * math.exp(z * z / 2.0)
        if not 0 < log_ratio <= z * z / 2.0:
            raise KvplanError(
                f"{label} must lie in ({mean_tokens:g}, {upper:.6g}] for mean {mean_tokens:g}"
            )
        sigma = z - math.sqrt(max(z * z - 2.0 * log_ratio, 0.0))
    else:
        if not log_ratio < 0:
            raise KvplanError(f"{label} must be below the mean {mean_tokens:g}")
        sigma = z + math.sqrt(z * z - 2.0 * log_ratio)
    return math.log(mean_tokens) - sigma * sigma / 2.0, sigma


def lognormal_lengths(
    num_requests: int, mean_tokens: float, quantile_tokens: float, percentile: float,
    rng: np.random.Generator,
) -> IntArray:
    """Lognormal lengths fitted by :func:`lognormal_params`, rounded to integers (before any
    clipping, which moves the mean when it bites)."""
    mu, sigma = lognormal_params(mean_tokens, quantile_tokens, percentile)
    return np.rint(rng.lognormal(mu, sigma, num_requests)).astype(np.int64)


def empirical_lengths(
    num_requests: int, values_tokens: Sequence[int] | IntArray, rng: np.random.Generator
) -> IntArray:
    """Resample (with replacement) from observed lengths, e.g. a trace's prompt column."""
    values = np.asarray(values_tokens, dtype=np.int64)
    if values.size == 0:
        raise KvplanError("empirical lengths need at least one observed value")
    return rng.choice(values, num_requests)


def clip_lengths(lengths: IntArray, min_tokens: int = 1, max_tokens: int | None = None) -> IntArray:
    """Clip to ``[min_tokens, max_tokens]`` (no upper bound when ``max_tokens`` is None)."""
    if max_tokens is not None and max_tokens < min_tokens:
        raise KvplanError(f"length bounds need min <= max (got {min_tokens} > {max_tokens})")
    return np.clip(lengths, min_tokens, max_tokens)


# --- shared prefixes and requests ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """``num_groups`` shared prompt prefixes (system prompts, few-shot templates) of
    ``prefix_tokens`` each; a request joins group g with probability uniform or ∝ 1/(g+1)^s."""

    num_groups: int
    prefix_tokens: int
    popularity: Popularity = "uniform"
    zipf_exponent: float = 1.0
    block_tokens: int = 16  # tokens named by one prefix id

    @property
    def num_prefix_blocks(self) -> int:
        """Full blocks of the prefix: only those can be shared (the tail shares a block with
        the request's own tokens)."""
        return self.prefix_tokens // self.block_tokens

    def group_probabilities(self) -> FloatArray:
        if self.popularity == "uniform":
            return np.full(self.num_groups, 1.0 / self.num_groups)
        weights = 1.0 / np.arange(1, self.num_groups + 1, dtype=np.float64) ** self.zipf_exponent
        return weights / weights.sum()

    def group_prefix_ids(self, group: int) -> tuple[int, ...]:
        """Ids unique to ``group``: group g owns ``[g·K, (g+1)·K)`` for K prefix blocks."""
        first = group * self.num_prefix_blocks
        return tuple(range(first, first + self.num_prefix_blocks))

    def sample_groups(self, num_requests: int, rng: np.random.Generator) -> IntArray:
        if self.num_groups < 1 or self.num_prefix_blocks < 1:
            raise KvplanError(
                f"shared prefix needs >= 1 group and prefix_tokens >= block_tokens "
                f"(got {self.num_groups} groups of {self.prefix_tokens} tokens, "
                f"blocks of {self.block_tokens})"
            )
        return rng.choice(self.num_groups, num_requests, p=self.group_probabilities())


REQUESTS_PER_CHUNK = 1 << 16  # make_requests converts this many array rows at a time


def make_requests(
    arrivals_s: FloatArray, prompt_tokens: IntArray, output_tokens: IntArray, *, n: int = 1,
    beam_width: int = 1, groups: IntArray | None = None, shared_prefix: SharedPrefix | None = None,
) -> list[Request]:
    """Requests 0..N-1 from parallel arrays. With ``shared_prefix`` and ``groups`` (one group
    index per request), a request's prompt is its group's prefix plus its own tokens.

    Memory: a request holds its own ``Request`` (96 bytes with slots), ``arrival_s`` float (24)
    and ``request_id`` int (28; ``sys.getsizeof`` on 64-bit CPython 3.11), plus a pointer in
    the list: about 160 bytes measured with ``tracemalloc``. Everything else is shared: equal
    lengths are one ``int`` object (length arrays have a few thousand distinct values, and
    ``tolist`` would make one object per entry), a group's prefix ids are one tuple, and
    ``n``, ``beam_width`` and the block size one object each. The arrays are converted in
    chunks of :data:`REQUESTS_PER_CHUNK`, so the Python lists the conversion needs stay small
    however many requests there are, and so does the table of shared lengths (started afresh
    when it outgrows a chunk: lengths drawn from a huge range share little anyway).

    Time: the requests are built with the cyclic garbage collector paused
    (:func:`workloads.request.cyclic_gc_paused`): it would otherwise rescan every request built
    so far again and again (benchmarks/workloads.py).
    """
    if not len(arrivals_s) == len(prompt_tokens) == len(output_tokens):
        raise ValueError("arrivals, prompt and output arrays differ in length")
    num = len(arrivals_s)
    by_group: list[tuple[int, ...]] = []
    block_tokens = 0
    if shared_prefix is not None and groups is not None:
        prompt_tokens = prompt_tokens + shared_prefix.prefix_tokens
        by_group = [shared_prefix.group_prefix_ids(g) for g in range(shared_prefix.num_groups)]
        block_tokens = shared_prefix.block_tokens
    lengths: dict[int, int] = {}  # one int object per distinct length
    requests: list[Request] = []
    with cyclic_gc_paused():
        for start in range(0, num, REQUESTS_PER_CHUNK):
            stop = min(start + REQUESTS_PER_CHUNK, num)
            if len(lengths) > REQUESTS_PER_CHUNK:
                lengths = {}
            prompts = prompt_tokens[start:stop].tolist()
            outputs = output_tokens[start:stop].tolist()
            prefixes = (map(by_group.__getitem__, groups[start:stop].tolist()) if by_group
                        else repeat(()))
            # map() over plain lists is the fastest way to build many requests.
            requests.extend(map(
                Request, range(start, stop), arrivals_s[start:stop].tolist(),
                map(lengths.setdefault, prompts, prompts), map(lengths.setdefault, outputs, outputs),
                repeat(n), repeat(beam_width), prefixes, repeat(block_tokens),
            ))
    return requests


# --- transformations ----------------------------------------------------------------------


def _renumbered(requests: Sequence[Request], time_factor: float = 1.0) -> list[Request]:
    """Copies numbered 0..N-1, first arrival at 0.0, times multiplied by ``time_factor``."""
    first_s = requests[0].arrival_s if requests else 0.0
    return [
        Request(i, (r.arrival_s - first_s) * time_factor, r.prompt_tokens, r.output_tokens,
                r.n, r.beam_width, r.prefix_ids, r.prefix_block_tokens, r.kv_ready_tokens)
        for i, r in enumerate(requests)
    ]


def untimed(requests: Iterable[Request]) -> list[Request]:
    """The same requests, in the same order, all arriving at 0.0 (see :func:`untimed_arrivals_s`)."""
    return [r if r.arrival_s == 0.0 else
            Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens, r.n, r.beam_width,
                    r.prefix_ids, r.prefix_block_tokens, r.kv_ready_tokens)
            for r in requests]


def mean_rate_per_s(requests: Iterable[Request]) -> float:
    """Mean arrival rate: (N − 1) gaps over the span from first to last arrival. One pass, no
    request kept: a stream (:func:`workloads.loaders.iter_trace`) is read to its end."""
    count, first_s, last_s = 0, 0.0, 0.0
    for r in requests:
        if count == 0:
            first_s = r.arrival_s
        last_s = r.arrival_s
        count += 1
    if count < 2 or last_s <= first_s:
        raise KvplanError(
            f"cannot measure the arrival rate of {count} requests that arrive at one instant"
        )
    return (count - 1) / (last_s - first_s)


def arrival_time_factor(rate_scale: float) -> float:
    """What :func:`scale_rate` multiplies arrival times by for ``rate_scale`` (factor 2 = the
    same requests at twice the rate: times × 0.5)."""
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise KvplanError(f"rate scale factor must be a positive number (got {rate_scale})")
    return 1.0 / rate_scale


def scale_rate(requests: Sequence[Request], factor: float) -> list[Request]:
    """Compress time by ``factor``: factor 2 = the same requests at twice the rate."""
    return _renumbered(requests, arrival_time_factor(factor))


def rate_scale_to(requests: Iterable[Request], rate_per_s: float) -> float:
    """The ``rate_scale`` that brings the :func:`mean_rate_per_s` of ``requests`` to
    ``rate_per_s`` (one pass over ``requests``)."""
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise KvplanError(f"rate must be a positive number of requests/s (got {rate_per_s})")
    return rate_per_s / mean_rate_per_s(requests)


def rescale_to_rate(requests: Sequence[Request], rate_per_s: float) -> list[Request]:
    """Compress or stretch time so that :func:`mean_rate_per_s` becomes ``rate_per_s``."""
    return scale_rate(requests, rate_scale_to(requests, rate_per_s))


def slice_requests(
    requests: Iterable[Request], *, start_s: float | None = None,
    duration_s: float | None = None, num_requests: int | None = None, time_factor: float = 1.0,
) -> list[Request]:
    """The requests arriving in ``[start_s, start_s + duration_s)``, then the first
    ``num_requests`` of those; renumbered from 0 and re-based so the first arrives at 0.0.
    An empty result is an error (it is always a mistake in a scenario).

    ``time_factor`` multiplies every arrival time first, as :func:`scale_rate` does for a
    workload whose first request arrives at 0.0 (every loader's and generator's), so that
    ``slice_requests(r, time_factor=arrival_time_factor(k), ...)`` equals
    ``slice_requests(scale_rate(r, k), ...)`` bit for bit without building the rescaled list.

    ``requests`` must be sorted by arrival (as every loader and generator returns them): the
    iteration stops at the first request past the window or once ``num_requests`` are kept, so
    a stream (:func:`workloads.loaders.iter_trace`) is read only that far. Only when the slice
    is empty is the rest read, to say in the error how long the workload is.
    """
    start = start_s or 0.0
    end = math.inf if duration_s is None else start + duration_s
    limit = math.inf if num_requests is None else num_requests
    kept: list[Request] = []
    first_s = 0.0
    rest = iter(requests)
    last: Request | None = None  # the last request read
    if limit >= 1:
        for r in rest:
            last = r
            arrival_s = r.arrival_s * time_factor
            if arrival_s >= end:
                break
            if arrival_s < start:
                continue
            if not kept:
                first_s = arrival_s
            kept.append(Request(len(kept), arrival_s - first_s, r.prompt_tokens, r.output_tokens,
                                r.n, r.beam_width, r.prefix_ids, r.prefix_block_tokens, r.kv_ready_tokens))
            if len(kept) >= limit:
                break
    if not kept:
        tail = deque(rest, maxlen=1)  # read to the end, to say how long the workload is
        if tail:
            last = tail[0]
        span = "0" if last is None else f"{last.arrival_s * time_factor:.6g}"
        raise KvplanError(
            f"no requests in the slice start_s={start:g}, duration_s={duration_s}, "
            f"num_requests={num_requests} (the workload spans 0-{span} s)"
        )
    return kept


MaxModelLenPolicy = Literal["reject", "truncate"]
MAX_MODEL_LEN_POLICIES: tuple[str, ...] = ("reject", "truncate")


@dataclass(frozen=True, slots=True)
class ModelLenFit:
    """A workload after its ``max_model_len`` policy, and how many requests the policy touched.

    ``num_over_window`` requests asked for more than the window (prompt + output >
    ``max_model_len``). Under ``reject`` they stay in ``requests`` and the scheduler refuses each
    at arrival with reason ``max_model_len``, so ``num_rejected == num_over_window``. Under
    ``truncate`` none is left: ``num_truncated`` had their output cut and ``num_dropped`` (prompt
    alone fills the window) were removed, and ``num_truncated + num_dropped == num_over_window``.
    """

    requests: list[Request]
    policy: MaxModelLenPolicy
    max_model_len: int
    num_over_window: int
    num_dropped: int  # truncate: the prompt alone leaves no room for one output token
    num_truncated: int  # truncate: output cut so that prompt + output fits

    def __post_init__(self) -> None:
        touched = self.num_rejected + self.num_dropped + self.num_truncated
        assert touched == self.num_over_window, (self.policy, touched, self.num_over_window)

    @property
    def num_rejected(self) -> int:
        """Requests the scheduler will refuse at arrival for their length (``reject`` only)."""
        return self.num_over_window if self.policy == "reject" else 0

    def as_dict(self) -> dict[str, int | str]:
        """The ``max_model_len_policy`` entry of summary.json."""
        return {"policy": self.policy, "max_model_len": self.max_model_len,
                "num_over_window": self.num_over_window, "num_rejected": self.num_rejected,
                "num_truncated": self.num_truncated, "num_dropped": self.num_dropped}


def fit_to_max_model_len(requests: Sequence[Request], max_model_len: int,
                         policy: MaxModelLenPolicy = "truncate") -> ModelLenFit:
    """Apply a context window of ``max_model_len`` tokens (prompt + output) under ``policy``.

    * ``reject`` — what a vLLM server does and so what ``vllm bench serve`` measures: the client
      sends ``max_tokens`` = the output length (vllm-project/vllm,
      vllm/benchmarks/lib/endpoint_request_func.py, ``async_request_openai_completions``) and the
      server answers 400 when prompt + max_tokens > max_model_len (vllm-project/vllm,
      vllm/entrypoints/openai/serving_engine.py, ``OpenAIServing._validate_input``: "This
      model's maximum context length is ... tokens. However, you requested ..."). The requests
      are returned unchanged; the scheduler rejects the long ones at arrival
      (``Scheduler.add_request``, reason ``max_model_len``), and the report counts them.
    * ``truncate`` — make every request fit instead of refusing it, as trace replays into
      simulators commonly do (Vidur's trace replay cuts the prompt: microsoft/vidur,
      vidur/request_generator/trace_replay_request_generator.py). Here generation stops at the
      window (output cut to ``max_model_len − prompt``), and a request whose prompt leaves no
      room for one output token is dropped. Survivors are renumbered from 0 when any is
      dropped; if none survive -> KvplanError.
    """
    if max_model_len < 2:
        raise KvplanError(f"max_model_len must be at least 2 tokens (got {max_model_len})")
    if policy not in MAX_MODEL_LEN_POLICIES:
        raise KvplanError(f"unknown max_model_len_policy '{policy}' (known: reject, truncate)")
    num_over = sum(1 for r in requests if r.prompt_tokens + r.output_tokens > max_model_len)
    if policy == "reject":
        return ModelLenFit(list(requests), policy, max_model_len, num_over, 0, 0)
    kept: list[Request] = []
    num_truncated = 0
    for r in requests:
        room_tokens = max_model_len - r.prompt_tokens
        if room_tokens < 1:
            continue
        if r.output_tokens > room_tokens:
            num_truncated += 1
            r = Request(r.request_id, r.arrival_s, r.prompt_tokens, room_tokens, r.n,
                        r.beam_width, r.prefix_ids, r.prefix_block_tokens, r.kv_ready_tokens)
        kept.append(r)
    if not kept:
        raise KvplanError(
            f"every prompt of the workload is longer than max_model_len {max_model_len}"
        )
    num_dropped = len(requests) - len(kept)
    return ModelLenFit(_renumbered(kept) if num_dropped else kept, policy, max_model_len, num_over,
                       num_dropped, num_truncated)
