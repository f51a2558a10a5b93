"""Stopping a probe as soon as its SLO is certainly broken: the rest of the run cannot save it.

An overloaded probe is the slowest kind (its queue, and with it the work per step, grows to the
end of the trace) and the least informative: the search only needs to know that it failed. The
engine calls :class:`SloStopRule` after every step in which requests emitted their first token
or finished (``simulate(..., stop_if=...)``, see :mod:`simulator.engine.core`), and the rule stops the
run once enough *measured* requests (those after the workload's warm-up) exceeded a bound that
the p99 over all of them exceeds it, whatever the requests still to come do.

**When is a p99 certainly above S?** :mod:`simulator.engine.metrics` takes ``np.percentile(v, 99)``
with numpy's default linear interpolation: with ``v`` sorted ascending, ``N`` values and
``h = (N − 1) × 0.99`` (that very floating-point product, numpy's ``(n - 1) * quantiles``),
``p99 = v[⌊h⌋] + (h − ⌊h⌋) × (v[⌊h⌋ + 1] − v[⌊h⌋])``. Suppose ``m`` of the values exceed S and
``N − m ≤ ⌊h⌋``. The ``N − m`` values at most S fill indices ``0 .. N − m − 1`` of the sorted
list, so ``v[⌊h⌋] > S``; ``v[⌊h⌋ + 1] ≥ v[⌊h⌋]`` when it exists (and ``h`` is an integer
otherwise), so the interpolation adds something non-negative and ``p99 ≥ v[⌊h⌋] > S``. Hence
``m ≥ N − ⌊(N − 1) × 0.99⌋`` exceedances (:func:`exceedances_to_break`) break the bound.

**N is not known before the end**: the p99 is over the measured requests that *finish*, and
some may be rejected. But :func:`exceedances_to_break` never decreases as N grows (``⌊h⌋`` grows
by at most one per value), so counting against the most there can be — every measured request —
is safe for any N at the end. The counted values are final when counted: a request's first
token comes once (the scheduler never emits it again, even after a preemption), a request with a
first token is never rejected (rejections happen only when a request arrives), so it finishes by
the end of a complete run, and its TTFT, TPOT and E2E do not change after its first token and
its finish.

What each bound counts, when (``now_s`` is the step's end; the client-side times include the
latency model's ``request_overhead_s``, as :mod:`simulator.engine.metrics` adds it):

* TTFT p99 — at the first token: ``now_s − sent[i].arrival_s + request_overhead_s > S``;
* TPOT p99 — at the finish, over measured requests of more than one output token (the others
  have no TPOT): ``(now_s − first_token_s) / (output_tokens − 1) > S``;
* E2E p99 — at the finish: ``now_s − sent[i].arrival_s + request_overhead_s > S``.

The rejected fraction is left to the end of the run (rejections are not reported to the rule),
and so is stability (a queue growing slowly is not certain before the end).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.config.scenario import SLOSpec
from workloads.request import Request

PERCENTILE = 99  # the SLO bounds p99 (simulator.engine.metrics: np.percentile(values, 99))


def exceedances_to_break(num_values: int, percentile: float = PERCENTILE) -> int:
    """The fewest of ``num_values`` values that must exceed S for ``np.percentile(values,
    percentile)`` (linear interpolation) to exceed S, whatever the others are (module
    docstring): ``N − ⌊(N − 1) × q⌋``, computed as numpy computes ``h``."""
    if num_values < 1:
        raise ValueError(f"num_values must be at least 1, got {num_values}")
    return num_values - math.floor((num_values - 1) * (percentile / 100))


class SloStopRule:
    """``stop_if`` for :func:`simulator.engine.core.simulate`: a phrase naming the broken bound once
    the SLO's TTFT, TPOT or E2E p99 bound is certainly broken (module docstring), else None.

    ``requests`` are the run's requests in send order (the engine's indices), of which the
    first ``warmup_requests`` are not measured. One rule serves one run: it counts as it goes.
    """

    def __init__(self, slo: SLOSpec, requests: Sequence[Request], *, warmup_requests: int,
                 request_overhead_s: float) -> None:
        self.warmup = warmup_requests
        self.overhead_s = request_overhead_s
        self.output_tokens = [r.output_tokens for r in requests]
        measured = len(requests) - warmup_requests
        with_tpot = sum(1 for r in requests[warmup_requests:] if r.output_tokens > 1)
        self.ttft_s, self.tpot_s, self.e2e_s = slo.ttft_p99_s, slo.tpot_p99_s, slo.e2e_p99_s
        # exceedances that break each bound (None: no bound, or nothing it could be measured on)
        self.ttft_needed = exceedances_to_break(measured) if self.ttft_s is not None and measured else None
        self.tpot_needed = exceedances_to_break(with_tpot) if self.tpot_s is not None and with_tpot else None
        self.e2e_needed = exceedances_to_break(measured) if self.e2e_s is not None and measured else None
        self.num_measured = measured
        self.num_with_tpot = with_tpot
        self.ttft_over = self.tpot_over = self.e2e_over = 0
        self.first_token_s: dict[int, float] = {}  # measured requests with a TPOT, until they finish

    @property
    def active(self) -> bool:
        """Whether any bound can be decided early (else the engine need not call the rule)."""
        return any(n is not None for n in (self.ttft_needed, self.tpot_needed, self.e2e_needed))

    def __call__(self, now_s: float, first_token: Sequence[int], finished: Sequence[int],
                 sent: Sequence[Request]) -> str | None:
        warmup = self.warmup
        for i in first_token:
            if i < warmup:
                continue
            if self.ttft_s is not None and now_s - sent[i].arrival_s + self.overhead_s > self.ttft_s:
                self.ttft_over += 1
            if self.tpot_needed is not None and self.output_tokens[i] > 1:
                self.first_token_s[i] = now_s
        for i in finished:
            if i < warmup:
                continue
            if self.e2e_s is not None and now_s - sent[i].arrival_s + self.overhead_s > self.e2e_s:
                self.e2e_over += 1
            first_s = self.first_token_s.pop(i, None)
            if (first_s is not None and self.tpot_s is not None
                    and (now_s - first_s) / (self.output_tokens[i] - 1) > self.tpot_s):
                self.tpot_over += 1
        for label, over, needed, total, bound in (
                ("TTFT", self.ttft_over, self.ttft_needed, self.num_measured, self.ttft_s),
                ("TPOT", self.tpot_over, self.tpot_needed, self.num_with_tpot, self.tpot_s),
                ("E2E", self.e2e_over, self.e2e_needed, self.num_measured, self.e2e_s)):
            if needed is not None and over >= needed:
                return (f"{label} p99 > {bound:g} s: {over:,} of {total:,} measured requests over it "
                        f"(stopped at {now_s:.4g} s)")
        return None
