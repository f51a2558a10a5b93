"""How the benchmark's clients send a workload's requests to the server.

A workload offers its requests at their ``arrival_s``. The clients decide when each is *sent*,
and the server's clock for the request (queueing, TTFT, E2E) starts at the send::

    open loop (default)   sent at its arrival time, however many are in flight
    max_in_flight = N     sent at its arrival time if fewer than N are in flight; otherwise it
                          waits client-side, in order, and is sent the moment a slot frees
    closed loop           the same with every arrival at 0.0: N clients, each sending the next
                          request (in workload order) when its previous one ends, after
                          ``think_time_s``

The second is ``vllm bench serve --request-rate R --max-concurrency N``; the third is the same
with ``--request-rate inf`` (and GuideLLM's ``concurrent`` profile). In vLLM's benchmark client a
request first acquires the semaphore of ``--max-concurrency`` slots and only then starts its timer
(vllm-project/vllm, vllm/benchmarks/serve.py: ``limited_request_func`` does ``async with
semaphore`` around the request function; vllm/benchmarks/lib/endpoint_request_func.py:
``async_request_openai_completions`` sets ``st = time.perf_counter()`` and measures TTFT and
latency from ``st``), so a request's wait for a slot is not part of its latency — here too.

A request ends when it finishes or is rejected; either frees its slot. ``warmup_requests`` is a
measurement choice carried along with the clients: the first K requests sent are left out of the
statistics (see :mod:`simulator.engine.metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Clients:
    """The sending side of a run (see the module docstring).

    ``max_in_flight``: requests sent and not yet ended, at most (None = open loop, no limit).
    ``think_time_s``: delay between a request's end and the send its slot then allows (closed
    loop only). ``warmup_requests``: the first K requests sent are excluded from the statistics.
    """

    max_in_flight: int | None = None
    think_time_s: float = 0.0
    warmup_requests: int = 0

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        if not (self.think_time_s >= 0 and math.isfinite(self.think_time_s)):
            raise ValueError(f"think_time_s must be a finite number >= 0, got {self.think_time_s}")
        if self.think_time_s > 0 and self.max_in_flight is None:
            raise ValueError("think_time_s needs a bounded number of clients (max_in_flight)")
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")

    @property
    def gated(self) -> bool:
        """True when sends wait for a free slot (a cap on requests in flight, or a closed loop)."""
        return self.max_in_flight is not None


OPEN_LOOP = Clients()
