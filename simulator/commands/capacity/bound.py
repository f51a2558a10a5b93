"""An analytic ceiling on the request rate a deployment sustains: where a rate search starts.

A probe costs a whole simulation, and one far above capacity the most (its queue grows to the end
of the trace). The search therefore starts from what the deployment can do at best, computed from
the workload's mean request and the deployment's latency model, instead of doubling from a guess.

**The formula.** Per replica, with the workload's requests ``i`` (prompt ``P_i``, output ``O_i``
tokens, ``s_i = max(n, beam_width)`` sequences), the KV pool of ``C`` token slots, and the latency
model's time ``t(b)`` of a decode step of ``b`` sequences, each reading ``c̄ = P̄ + Ō/2`` KV
tokens (the mean context over a request's decode)::

    F̄   = mean_i F_i          KV slots a request holds, averaged over its decode:
                               contiguous allocators: s_i × reservation(P_i, P_i + O_i), held from
                               admission to finish; paged: P_i + s_i × O_i / 2 (the prompt once,
                               each sequence's output growing from 0 to O_i)
    B   = min(max_num_seqs, ⌊s̄ · C / F̄⌋, b_τ)
                               sequences that can decode at once: the batch limit, the mean-sized
                               requests the pool holds, and (with a TPOT bound τ) the largest batch
                               whose decode step takes at most τ
    U   = R × max_{b ≤ B} b / (s̄ · Ō · t(b))      req/s, R replicas

By Little's law a replica holding ``L`` requests, each resident for ``W`` seconds, serves
``λ = L / W``; a request decodes its ``O`` tokens in ``O`` steps of at least ``t(b)`` each at a
batch of ``b`` sequences, and a batch of ``b`` sequences decodes at most ``b / t(b)`` tokens per
second — so ``λ ≤ b / (s̄ · Ō · t(b))``, with ``b`` bounded by the batch limit, by the KV pool
and, if p99 TPOT must stay within τ, by the step time. Prefill, preemptions and queueing only add
time, so the sustainable rate lies below ``U``. This rests on mean lengths (a pool can hold more
short requests than mean-length ones), so the search does not trust it blindly: it starts at
``U / 2``, probes ``U`` next, and keeps doubling if ``U`` passes, as from any start.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.config.deployment import Deployment
from simulator.kv.contiguous import ContiguousAllocator
from simulator.scheduler.plan import StepPlan
from simulator.config.scenario import SLOSpec
from workloads.request import Request

START_FRACTION = 0.5  # the search's first rate, as a fraction of the ceiling


@dataclass(frozen=True, slots=True)
class RateBound:
    """The ceiling ``U`` of the module docstring and what set it.

    ``batch`` is the ``b`` the maximum is reached at (sequences per replica), ``step_s`` its
    decode step time; ``limit`` names what bounds ``B``: ``max_num_seqs``, ``kv`` or ``tpot``.
    ``kv_requests`` is ``C / F̄``, the mean-sized requests one replica's pool holds."""

    rate_req_s: float
    batch: int
    step_s: float
    kv_requests: float
    limit: str

    @property
    def start_req_s(self) -> float:
        """Where a rate search starts: below the ceiling, so that the ceiling's own probe is
        the likely first failure and bisection starts from a bracket of a factor of two."""
        return START_FRACTION * self.rate_req_s


def decode_step_s(dep: Deployment, batch: int, context_tokens: float) -> float:
    """The latency model's time of a decode step of ``batch`` sequences of ``context_tokens``
    KV tokens each (no prefill, no copies)."""
    ctx = max(1, round(context_tokens))
    plan = StepPlan(step_id=0, prefills=(), num_decode_seqs=batch, decode_context_tokens=batch * ctx,
                    decode_context_sq=float(batch * ctx * ctx), decode_max_context=ctx)
    return dep.latency.step_latency_s(plan)


def rate_bound(dep: Deployment, allocator: str, requests: Sequence[Request], slo: SLOSpec) -> RateBound:
    """The ceiling ``U`` (module docstring) for ``requests`` on ``dep`` with ``allocator``.
    ``requests`` must not be empty."""
    if not requests:
        raise ValueError("no requests to bound the rate of")
    alloc = dep.make_allocator(allocator)
    max_len = dep.scheduler_config.max_model_len
    samples = [max(r.n, r.beam_width) for r in requests]
    if isinstance(alloc, ContiguousAllocator):
        footprints = [s * alloc.reservation(r.prompt_tokens, min(r.prompt_tokens + r.output_tokens, max_len))
                      for r, s in zip(requests, samples)]
    else:
        footprints = [r.prompt_tokens + s * r.output_tokens / 2 for r, s in zip(requests, samples)]
    mean_samples = statistics.fmean(samples)
    mean_output = max(1.0, statistics.fmean(r.output_tokens for r in requests))
    context = statistics.fmean(r.prompt_tokens for r in requests) + mean_output / 2
    kv_requests = dep.capacity_tokens / max(1.0, statistics.fmean(footprints))
    limits = {"max_num_seqs": dep.scheduler_config.max_num_seqs,
              "kv": max(1, int(mean_samples * kv_requests))}
    if slo.tpot_p99_s is not None:
        limits["tpot"] = _largest_batch_within(dep, context, slo.tpot_p99_s, min(limits.values()))
    limit = min(limits, key=lambda k: limits[k])
    best = (0.0, 1, 0.0)
    for b in _candidates(limits[limit]):
        step_s = decode_step_s(dep, b, context)
        best = max(best, (b / step_s, b, step_s))
    per_s, batch, step_s = best
    rate = dep.scenario.num_replicas * per_s / (mean_samples * mean_output)
    return RateBound(rate, batch, step_s, kv_requests, limit)


def _largest_batch_within(dep: Deployment, context: float, step_s: float, most: int) -> int:
    """The largest batch of at most ``most`` whose decode step takes at most ``step_s`` (1 when
    none does: then the TPOT bound fails at every rate, and the search finds that out)."""
    lo, hi = 1, most
    if decode_step_s(dep, most, context) <= step_s:
        return most
    while hi - lo > 1:  # invariant: t(hi) > step_s; t(lo) <= step_s, or lo == 1
        mid = (lo + hi) // 2
        if decode_step_s(dep, mid, context) <= step_s:
            lo = mid
        else:
            hi = mid
    return lo


def _candidates(most: int) -> list[int]:
    """Batches 1, 2, 4, ... up to ``most``, and ``most``: where ``b / t(b)`` is looked at (it
    grows with ``b`` for a roofline step time, whose cost per extra sequence is constant)."""
    out = [1 << k for k in range(most.bit_length()) if 1 << k < most]
    return [*out, most]
