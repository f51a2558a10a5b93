"""A fixed time per step (plus optional per-token terms): for analytic checks and what-ifs."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.scheduler.plan import StepPlan


@dataclass(frozen=True, slots=True)
class ConstantLatency:
    """``step_s + prefill_token_s × prefill tokens + decode_seq_s × decoding sequences``."""

    step_s: float
    prefill_token_s: float = 0.0
    decode_seq_s: float = 0.0

    def step_latency_s(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        return (
            self.step_s
            + self.prefill_token_s * plan.num_prefill_tokens
            + self.decode_seq_s * plan.num_decode_seqs
        )

    def describe(self) -> dict[str, float | str]:
        return {"model": "constant", "step_s": self.step_s,
                "prefill_token_s": self.prefill_token_s, "decode_seq_s": self.decode_seq_s}
