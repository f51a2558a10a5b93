"""Step latency with speculative decoding: the target's verify pass plus the drafter's passes.

Wraps a :class:`~simulator.latency.roofline.RooflineLatency` of the target model (its public
``step_terms`` on a rewritten plan, then :func:`~simulator.latency.roofline.combine`):

* Verify pass. A decoding sequence with d drafts runs 1 + d query tokens: the GEMMs, the KV
  written, the all-reduce and the logits (the rejection sampler needs the target's
  distribution at every draft position and the bonus one: vllm/v1/sample/rejection_sampler.py)
  grow with the query tokens, as if each were a decoding sequence; attention FLOPs grow with
  each query token's context (query i of a sequence of KV length L reads L + 1 + i tokens);
  the KV *read* stays one pass per sequence (its L + 1 + d tokens), which is what keeps a
  small batch memory-bound and makes the verify nearly free there. Drafts per sequence are
  taken as the step's mean (exact when every sequence verifies the same number).
* Drafter. ``draft_model``: k forward passes of the catalog draft model on the same GPU and TP
  (a roofline of its own), the first over every token the target step ran (prefill chunks and
  verify tokens: the proposer first runs on the target's scheduled tokens), the next k - 1 one
  token per sampling sequence — the structure of ``SpecDecodeBaseProposer.propose``
  (vllm/v1/spec_decode/eagle.py, which vllm/v1/spec_decode/draft_model.py's
  ``DraftModelProposer`` extends). ``eagle`` / ``mtp``: the same k passes, of a head assumed
  to be one decoder layer of the target's shape (EAGLE's draft is a single decoder layer over
  the target's hidden states; DeepSeek-V3's MTP module is one transformer block), its
  embedding and lm_head the target's (shared in ``EagleProposer.load_model``). ``ngram``: 0 —
  ``NgramProposer`` matches n-grams on the CPU with numba between steps
  (vllm/v1/spec_decode/ngram_proposer.py) and no GPU time is spent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from simulator.kv.models import ModelConfig
from simulator.latency.roofline import RooflineLatency, combine
from simulator.scheduler.plan import StepPlan


def draft_head_model(target: ModelConfig) -> ModelConfig:
    """An EAGLE / MTP head as one decoder layer of ``target``'s shape (module docstring); an
    MoE target's MTP block is an MoE layer."""
    return dataclasses.replace(
        target, name=f"{target.name} (1-layer draft head)", num_hidden_layers=1,
        first_k_dense_replace=0, layer_types=target.layer_types[-1:], mlp_only_layers=())


class SpeculativeLatency:
    """The target's verify pass plus ``num_speculative_tokens`` drafter passes per step."""

    def __init__(self, target: RooflineLatency, num_speculative_tokens: int,
                 drafter: RooflineLatency | None) -> None:
        """``drafter``: the roofline of the draft model or head; None for n-gram (no GPU cost)."""
        self.target, self.k, self.drafter = target, num_speculative_tokens, drafter
        self.request_overhead_s = target.request_overhead_s

    def step_latency_s(self, plan: StepPlan) -> float:
        return self.verify_s(plan) + self.draft_s(plan)

    def verify_s(self, plan: StepPlan) -> float:
        """The target's pass over the step's prefill chunks and verify tokens."""
        return _verify_seconds(self.target, plan)

    def draft_s(self, plan: StepPlan) -> float:
        """The drafter's k passes after the step (0 for n-gram, or when nothing samples)."""
        drafter = self.drafter
        sampling = plan.num_decode_seqs + sum(1 for c in plan.prefills if c.samples_token)
        if drafter is None or not sampling:
            return 0.0
        total = _verify_seconds(drafter, plan)
        ctx = plan.decode_context_tokens + plan.num_spec_tokens
        for j in range(1, self.k):
            one = StepPlan(plan.step_id, (), sampling, ctx + j * sampling, 0.0, 0)
            total += drafter.step_latency_s(one)
        return total

    def describe(self) -> dict[str, Any]:
        out = dict(self.target.describe())
        out["speculative"] = {
            "num_speculative_tokens": self.k,
            "drafter": self.drafter.model.name if self.drafter is not None else "ngram (CPU, no GPU time)",
        }
        return out


def _verify_seconds(model: RooflineLatency, plan: StepPlan) -> float:
    """``model``'s seconds for ``plan`` with its decodes' drafts as extra query tokens: terms of
    the plan where every query token is a decoding sequence, the KV read put back to one pass
    per sequence (module docstring)."""
    drafts = plan.num_spec_tokens
    if not drafts:
        return model.step_latency_s(plan)
    n, ctx = plan.num_decode_seqs, plan.decode_context_tokens
    per_seq = drafts / n
    # Σ over queries of the KV each reads: ctx for the first, + i for draft i (i = 1..d)
    query_ctx = ctx * (1 + per_seq) + n * per_seq * (per_seq + 1) / 2
    wide = plan._replace(num_decode_seqs=n + drafts, decode_context_tokens=query_ctx, num_spec_tokens=0)
    terms = model.step_terms(wide)
    # the plan's own read (per layer kind for a hybrid model), plus the drafts' keys
    kv_read = model.step_terms(plan).kv_read_bytes + drafts * model.bytes_per_token
    return combine(terms._replace(kv_read_bytes=kv_read), model.rates, model.constants)
