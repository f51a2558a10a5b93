"""Scheduler knobs, named as vLLM names them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PreemptionMode = Literal["recompute", "swap"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # running sequences at once (samples and beams count one each)
    max_num_batched_tokens: int = 8192  # tokens per step: decodes (one each) + prefill chunks
    max_model_len: int = 8192  # prompt + output tokens of one sequence
    block_size: int = 16  # tokens per KV block (prefix hashes and swap accounting use it)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    preemption_mode: PreemptionMode = "recompute"
    swap_space_tokens: int = 0  # CPU swap pool, in KV tokens (0: no swapping)
    beam_replace_prob: float = 0.5  # per beam, at each block boundary: chance it dies and is replaced
    seed: int = 0  # beam search's random choices

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # every running sequence decodes one token per step; the budget must hold them all
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len}): a whole prompt prefills in one step"
            )
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.swap_space_tokens < 0:
            raise ValueError("swap_space_tokens must be >= 0")
        if not 0.0 <= self.beam_replace_prob <= 1.0:
            raise ValueError("beam_replace_prob must be in [0, 1]")
