"""Scheduler knobs, named as vLLM names them (each engine's own knobs under that engine's names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PreemptionMode = Literal["recompute", "swap"]
EngineName = Literal["vllm-v1", "vllm-v0", "sglang", "trtllm"]
ENGINES: tuple[str, ...] = ("vllm-v1", "vllm-v0", "sglang", "trtllm")
# TensorRT-LLM's capacity scheduler policies that kvplan simulates (tensorrt_llm/llmapi/llm_args.py
# CapacitySchedulerPolicy; STATIC_BATCH is not simulated)
CapacitySchedulerPolicy = Literal["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"]
CAPACITY_SCHEDULER_POLICIES: tuple[str, ...] = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")


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
    # which engine's policy decides (simulator/scheduler/__init__.py make_scheduler)
    engine: EngineName = "vllm-v0"
    # vLLM V1 only (simulator/scheduler/v1.py), with the names and defaults of vLLM's
    # SchedulerConfig (vllm/config/scheduler.py)
    long_prefill_token_threshold: int = 0  # cap of a request's tokens per step, running or admitted (0: none)
    # V1's scheduler never reads it: above 1 it only sets a threshold left at 0 to 4% of
    # max_model_len (SchedulerConfig.__post_init__)
    max_num_partial_prefills: int = 1
    # admit a request only if its whole sequence (not just its first chunk) fits the free KV now
    # (KVCacheManager.allocate_slots, full_sequence_must_fit)
    scheduler_reserve_full_isl: bool = True
    # blocks kept free when admitting a waiting or preempted request while others run, as a
    # fraction of the pool (vllm/config/scheduler.py ``watermark``, default 0.0: off)
    watermark: float = 0.0
    # SGLang only (simulator/scheduler/sglang.py; python/sglang/srt/server_args.py names them)
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    radix_eviction_policy: Literal["lru", "lfu"] = "lru"
    max_prefill_tokens: int = 16384  # ServerArgs.max_prefill_tokens: prompt tokens per prefill batch
    schedule_conservativeness: float = 1.0  # ServerArgs: scales the initial new_token_ratio
    # python/sglang/srt/environ.py: SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
    # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_RETRACT_DECODE_STEPS,
    # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    init_new_token_ratio: float = 0.7  # share of a running request's future tokens reserved
    min_new_token_ratio_factor: float = 0.14  # the ratio's floor, as a share of its start
    new_token_ratio_decay_steps: int = 600  # decode steps from start to floor
    retract_decode_steps: int = 20  # tokens per request a retraction frees / re-estimates for
    clip_max_new_tokens: int = 4096  # cap of one request's future tokens in the reserve
    # TensorRT-LLM only (simulator/scheduler/trtllm.py): SchedulerConfig.capacity_scheduler_policy
    # (tensorrt_llm/llmapi/llm_args.py), GUARANTEED_NO_EVICT by default
    capacity_scheduler_policy: CapacitySchedulerPolicy = "GUARANTEED_NO_EVICT"
    # speculative decoding (vllm-v1 only: simulator/scheduler/spec.py); 0 drafts: off
    num_speculative_tokens: int = 0  # k: drafts verified per decoding sequence and step
    # P(draft i accepted | drafts 1..i-1 accepted), one per position (length k)
    spec_acceptance: tuple[float, ...] = ()
    # extra KV slots allocated ahead (Scheduler.__init__: k for EAGLE/MTP and draft models, 0 else)
    num_lookahead_tokens: int = 0
    # input slots a scheduled request takes beside its tokens (vllm/config/speculative.py
    # ``max_num_new_slots_for_drafting``: 1 for a draft model, whose input keeps one unsliced
    # token; 0 for EAGLE, MTP and n-gram): charged per request against max_num_batched_tokens
    num_draft_slots: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        one_budget = self.engine != "sglang"  # SGLang decodes outside the prefill budget (sglang.py)
        if one_budget and self.max_num_batched_tokens < self.max_num_seqs:
            # every running sequence decodes one token per step; the budget must hold them all
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        # TensorRT-LLM refuses a longer prompt at arrival instead (simulator/scheduler/trtllm.py)
        vllm = self.engine in ("vllm-v1", "vllm-v0")
        if vllm and not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len}): a whole prompt prefills in one step"
            )
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.swap_space_tokens < 0:
            raise ValueError("swap_space_tokens must be >= 0")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        trtllm_chunks = self.engine == "trtllm" and self.enable_chunked_prefill
        if trtllm_chunks and self.max_num_batched_tokens < self.block_size:
            # a cut context chunk is a multiple of tokens_per_block (microBatchScheduler.cpp): a
            # smaller budget could never chunk a prompt
            raise ValueError(f"with chunked context max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             f"must be >= block_size ({self.block_size}) for engine trtllm")
        if self.capacity_scheduler_policy not in CAPACITY_SCHEDULER_POLICIES:
            raise ValueError(f"capacity_scheduler_policy must be one of "
                             f"{', '.join(CAPACITY_SCHEDULER_POLICIES)}, "
                             f"got {self.capacity_scheduler_policy!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.max_num_partial_prefills < 1:
            raise ValueError("max_num_partial_prefills must be >= 1")
        if self.max_num_partial_prefills > 1:  # vllm/config/scheduler.py (verify_max_model_len)
            if not self.enable_chunked_prefill:
                raise ValueError("max_num_partial_prefills > 1 needs enable_chunked_prefill")
            if self.long_prefill_token_threshold > self.max_model_len:
                raise ValueError(f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) "
                                 f"cannot be greater than max_model_len ({self.max_model_len})")
        if not 0.0 <= self.beam_replace_prob <= 1.0:
            raise ValueError("beam_replace_prob must be in [0, 1]")
        if self.num_speculative_tokens < 0 or self.num_lookahead_tokens < 0 or self.num_draft_slots < 0:
            raise ValueError("num_speculative_tokens, num_lookahead_tokens and num_draft_slots must be >= 0")
        if self.num_speculative_tokens:
            if self.engine != "vllm-v1":
                raise ValueError(f"speculative decoding is simulated for engine vllm-v1 only, not {self.engine}")
            if len(self.spec_acceptance) != self.num_speculative_tokens:
                raise ValueError(f"spec_acceptance needs {self.num_speculative_tokens} rates, "
                                 f"got {len(self.spec_acceptance)}")
            if not all(0.0 <= a <= 1.0 for a in self.spec_acceptance):
                raise ValueError(f"spec_acceptance rates must be in [0, 1], got {list(self.spec_acceptance)}")
