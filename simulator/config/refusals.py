"""Deployments vLLM would refuse to start — found before anything is simulated.

kvplan predicts how vLLM serves a deployment; a deployment vLLM refuses at start-up serves
nothing, so simulating it as if fine would put a figure in a purchase decision that no server
can reach. Each check below mirrors one of vLLM's, with vLLM's reason and what would make it
start, naming the scenario keys to change:

* ``block_size`` not one of vLLM's ``--block-size`` choices, 1, 8, 16, 32, 64, 128, 256
  (vllm/config/cache.py ``BlockSize``, vLLM 0.11-0.16: the sizes its paged-attention kernels are
  built for; the argument parser refuses others);
* ``max_model_len`` above the window vLLM derives from the model's config (vllm/config/model.py
  ``_get_and_verify_max_len``: "User-specified max_model_len (...) is greater than the derived
  max_model_len", unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``: RoPE positions past the window
  give NaNs);
* KV memory, after weights and activations, that cannot hold one request of ``max_model_len``
  tokens (vllm/v1/core/kv_cache_utils.py ``check_enough_kv_cache_memory``: "To serve at least
  one request with the model's max seq len (...) ... the estimated maximum model length is ...");
* ``num_gpu_blocks_override`` larger than the GPU's memory holds: vLLM takes the override without
  a memory check (vllm/v1/core/kv_cache_utils.py ``may_override_num_blocks``), so allocating the
  KV cache fails.

``allow_refused: true`` in a scenario (``--set allow_refused=true``) simulates such a deployment
anyway; each refusal then becomes a warning. Warnings, which never stop a run:

* block sizes 1 and 8, which vLLM accepts but its FlashAttention backend, the default on NVIDIA
  GPUs, does not ("Block size must be a multiple of 16.", vllm/v1/attention/backends/
  flash_attn.py ``get_kv_cache_shape``): vLLM must pick another attention backend;
* a model with sliding-window layers whose full-attention KV sizing (an upper bound, see
  simulator/kv/sizing.py) cannot hold one ``max_model_len`` request: vLLM sizes those layers by
  their window and may well start, so kvplan does not refuse it;
* a ``num_gpu_blocks_override`` that fits the GPU only by using the memory
  ``gpu_memory_utilization`` holds back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simulator.errors import KvplanError, RefusedError
from simulator.kv.gpus import GPUSpec
from simulator.kv.models import ModelConfig
from simulator.kv.sizing import KVCapacity, kv_dtype_bytes

GIB = 1 << 30
# --block-size choices: vllm/config/cache.py BlockSize = Literal[1, 8, 16, 32, 64, 128, 256] in
# vLLM 0.11 to 0.16 (docs.vllm.ai/en/v0.11.1 and /v0.16.0, api/vllm/config/cache); 0.9 and 0.10
# lacked 256, and later releases take any positive size at the parser and leave the check to the
# attention backends, FlashAttention's being a multiple of 16.
VLLM_BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)
# vllm/v1/attention/backends/flash_attn.py get_kv_cache_shape: block_size % 16 != 0 -> ValueError
FLASH_ATTENTION_BLOCK_MULTIPLE = 16
# The highest gpu_memory_utilization a remedy suggests: above it, too little memory is left for
# CUDA graphs and the allocator's slack for a server to be comfortable.
MAX_SUGGESTED_UTILIZATION = 0.95
# tensor-parallel degrees a remedy may suggest: powers of two up to the scenario's limit of 64
_TP_CANDIDATES: tuple[int, ...] = (2, 4, 8, 16, 32, 64)

CapacityAt = Callable[[int, str], KVCapacity]  # (tensor_parallel, kv_cache_dtype) -> capacity


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why vLLM would not start a deployment, and what would make it start."""

    key: str  # the scenario key at fault
    reason: str  # vLLM's reason, with this deployment's numbers
    remedy: str  # what would make vLLM start, naming scenario keys
    source: str  # where vLLM checks (repository path and function)

    def message(self) -> str:
        """One line: reason, where vLLM checks it, and the remedy."""
        return f"{self.reason} ({self.source}); it starts if you {self.remedy}"


@dataclass(frozen=True, slots=True)
class StartupCheck:
    """What vLLM's start-up would say about a deployment: refusals and warnings, in the order
    vLLM meets them (arguments, model config, then memory)."""

    refusals: tuple[Refusal, ...]
    warnings: tuple[str, ...]

    def raise_or_warnings(self, where: str, allow_refused: bool) -> tuple[str, ...]:
        """The warnings to report; a refusal raises KvplanError naming ``where`` unless
        ``allow_refused``, in which case every refusal joins the warnings."""
        if not self.refusals:
            return self.warnings
        if not allow_refused:
            first = self.refusals[0]
            raise RefusedError(f"{where}: vLLM would refuse to start this deployment: {first.message()}"
                              " (or set allow_refused: true to simulate it anyway)")
        refused = tuple(f"vLLM would refuse to start this deployment (simulated anyway,"
                        f" allow_refused): {r.message()}" for r in self.refusals)
        return refused + self.warnings


def check_startup(model: ModelConfig, gpu: GPUSpec, cap: KVCapacity, *, block_size: int,
                  max_model_len: int, num_gpu_blocks_override: int | None,
                  capacity_at: CapacityAt, engine: str = "vllm-v1",
                  max_num_batched_tokens: int = 8192) -> StartupCheck:
    """Every check of the module docstring for ``model`` on ``gpu`` with the KV budget ``cap``.

    ``max_model_len`` is the one the deployment runs with; ``capacity_at(tp, kv_cache_dtype)``
    sizes the same deployment at another tensor-parallel degree or KV dtype (to say which would
    start), raising KvplanError where that cannot be built.
    """
    refusals: list[Refusal] = []
    warnings: list[str] = []
    # vLLM's block-size choices; SGLang's page_size is any size (python/sglang/srt/server_args.py)
    block = check_block_size(block_size) if engine != "sglang" else None
    if block is not None:
        refusals.append(block)
    elif engine != "sglang" and block_size % FLASH_ATTENTION_BLOCK_MULTIPLE:
        warnings.append(
            f"block_size {block_size}: vLLM accepts it, but its FlashAttention backend, the default"
            f" on NVIDIA GPUs, takes only multiples of {FLASH_ATTENTION_BLOCK_MULTIPLE} ('Block size"
            " must be a multiple of 16.', vllm/v1/attention/backends/flash_attn.py); vLLM must"
            " run another attention backend")
    window = check_window(model, max_model_len)
    if window is not None:
        refusals.append(window)
    memory = check_kv_memory(model, gpu, cap, max_model_len, capacity_at, max_num_batched_tokens)
    if memory is not None and model.num_sliding_window_layers and cap.kv_groups is None:
        warnings.append(
            f"max_model_len {max_model_len:,} does not fit the KV capacity sized as full attention"
            f" ({cap.capacity_tokens:,} tokens), but {model.name} has sliding-window layers, which"
            " vLLM sizes by their window: it may start; simulated with the full-attention pool")
    elif memory is not None:
        refusals.append(memory)
    if num_gpu_blocks_override is not None:
        override = check_override(gpu, cap, num_gpu_blocks_override)
        if isinstance(override, Refusal):
            refusals.append(override)
        elif override is not None:
            warnings.append(override)
    return StartupCheck(tuple(refusals), tuple(warnings))


def check_block_size(block_size: int) -> Refusal | None:
    """A block size outside vLLM's ``--block-size`` choices."""
    if block_size in VLLM_BLOCK_SIZES:
        return None
    nearest = min(VLLM_BLOCK_SIZES, key=lambda size: (abs(size - block_size), size))
    choices = ", ".join(map(str, VLLM_BLOCK_SIZES))
    return Refusal(
        key="block_size",
        reason=f"block_size {block_size} is not one vLLM takes: --block-size accepts {choices},"
               " the sizes its paged-attention kernels are built for",
        remedy=f"use block_size {nearest}",
        source="vllm/config/cache.py BlockSize")


def check_window(model: ModelConfig, max_model_len: int) -> Refusal | None:
    """A ``max_model_len`` beyond the model's window (vLLM's derived max_model_len)."""
    window = model.max_position_embeddings
    if max_model_len <= window:
        return None
    return Refusal(
        key="max_model_len",
        reason=f"max_model_len {max_model_len:,} is greater than {model.name}'s window of"
               f" {window:,} tokens: vLLM stops with 'User-specified max_model_len ({max_model_len})"
               " is greater than the derived max_model_len' unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1,"
               " and positions past the window give NaNs with RoPE",
        remedy=f"lower max_model_len to {window:,} or less (or leave it out: the window is the"
               " default)",
        source="vllm/config/model.py _get_and_verify_max_len")


def check_kv_memory(model: ModelConfig, gpu: GPUSpec, cap: KVCapacity, max_model_len: int,
                    capacity_at: CapacityAt, max_num_batched_tokens: int = 8192) -> Refusal | None:
    """KV memory that cannot hold one request of ``max_model_len`` tokens.

    vLLM sums every layer's ``max_memory_usage_bytes`` for one request of ``max_model_len``
    tokens and compares it with the KV memory available; its estimate of the longest length
    that fits is a binary search over the same sum (vllm/v1/core/kv_cache_utils.py
    ``check_enough_kv_cache_memory``, ``estimate_max_model_len``). With every layer full
    attention that is ``ceil(L / block_size)`` blocks: whole blocks × block_size. With the
    hybrid manager's groups (``cap.kv_groups``), a sliding or chunked layer needs only its
    window plus a step's tokens, a linear-attention layer its state
    (:meth:`~simulator.kv.sizing.HybridKVLayout.max_blocks_per_request`).
    """
    needed_bytes = one_request_kv_bytes(cap, max_model_len, max_num_batched_tokens)
    if needed_bytes <= cap.available_kv_bytes:
        return None
    if cap.kv_groups is None:
        fits = cap.available_kv_bytes // cap.block_bytes * cap.block_size
    else:  # the largest length that fits: the bytes needed do not decrease with the length
        lo, hi = 0, max_model_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            ok = one_request_kv_bytes(cap, mid, max_num_batched_tokens) <= cap.available_kv_bytes
            lo, hi = (mid, hi) if ok else (lo, mid - 1)
        fits = lo
    remedies = [f"lower max_model_len to {fits:,}"]
    bigger_tp = _smallest_tp_that_fits(cap, max_model_len, capacity_at, max_num_batched_tokens)
    if bigger_tp is not None:
        remedies.append(f"raise tensor_parallel to {bigger_tp}")
    if kv_dtype_bytes(cap.kv_cache_dtype) > 1 and _fits(capacity_at, cap.tp, "fp8", max_model_len,
                                                            max_num_batched_tokens):
        remedies.append("set kv_cache_dtype: fp8")
    utilization = _utilization_that_fits(gpu, cap, needed_bytes)
    if utilization is not None:
        remedies.append(f"raise gpu_memory_utilization to {utilization:.2f}")
    return Refusal(
        key="max_model_len",
        reason=f"one request of max_model_len {max_model_len:,} tokens needs"
               f" {needed_bytes / GIB:.2f} GiB of KV cache per rank, more than the"
               f" {cap.available_kv_bytes / GIB:.2f} GiB available ({cap.capacity_tokens:,} tokens)"
               f" for {model.name} on {cap.gpu_name} at tensor_parallel {cap.tp}: vLLM stops at"
               f" start-up ('To serve at least one request with the model's max seq len"
               f" ({max_model_len}) ... the estimated maximum model length is {fits}')",
        remedy=_either(remedies),
        source="vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory")


def check_override(gpu: GPUSpec, cap: KVCapacity, num_blocks: int) -> Refusal | str | None:
    """A ``num_gpu_blocks_override`` the GPU cannot hold (a Refusal), or holds only in the
    memory gpu_memory_utilization leaves free (a warning), or None."""
    pool_bytes = num_blocks * cap.block_bytes
    if pool_bytes <= cap.available_kv_bytes:
        return None
    room_bytes = gpu.total_memory_bytes - cap.weight_bytes - cap.activation_bytes - cap.non_torch_bytes
    pool = (f"num_gpu_blocks_override {num_blocks:,} blocks take {pool_bytes / GIB:.1f} GiB of KV"
            f" per rank")
    if pool_bytes <= room_bytes:
        return (f"{pool}, beyond the {cap.available_kv_bytes / GIB:.1f} GiB that"
                f" gpu_memory_utilization {cap.budget_bytes / gpu.total_memory_bytes:.2f} leaves for KV"
                f" ({cap.num_blocks:,} blocks): they fit only in the memory it holds back")
    most = max(room_bytes, 0) // cap.block_bytes
    return Refusal(
        key="num_gpu_blocks_override",
        reason=f"{pool}, but {cap.gpu_name} ({gpu.total_memory_gib:.2f} GiB) has"
               f" {max(room_bytes, 0) / GIB:.1f} GiB left once the weights, activations and"
               " overhead are in: vLLM takes the override without a memory check, so allocating"
               " the KV cache fails (CUDA out of memory)",
        remedy=f"lower num_gpu_blocks_override to {most:,} or less (or leave it out: vLLM's own"
               f" pool is {cap.num_blocks:,} blocks)",
        source="vllm/v1/core/kv_cache_utils.py may_override_num_blocks")


def _utilization_that_fits(gpu: GPUSpec, cap: KVCapacity, needed_bytes: int) -> float | None:
    """The gpu_memory_utilization (2 decimals) whose budget holds ``needed_bytes`` of KV, when
    it is at most :data:`MAX_SUGGESTED_UTILIZATION`: raising the budget adds to the KV memory
    alone (weights, activations and overhead do not depend on it)."""
    wanted = (cap.budget_bytes + needed_bytes - cap.available_kv_bytes) / gpu.total_memory_bytes
    wanted = math.ceil(wanted * 100) / 100
    return wanted if wanted <= MAX_SUGGESTED_UTILIZATION else None


def one_request_kv_bytes(cap: KVCapacity, length: int, max_num_batched_tokens: int) -> int:
    """KV bytes per rank one request of ``length`` tokens may need (:func:`check_kv_memory`)."""
    if cap.kv_groups is None:
        return math.ceil(length / cap.block_size) * cap.block_bytes
    return cap.kv_groups.max_blocks_per_request(length, max_num_batched_tokens) * cap.kv_groups.block_bytes


def _smallest_tp_that_fits(cap: KVCapacity, max_model_len: int, capacity_at: CapacityAt,
                           max_num_batched_tokens: int) -> int | None:
    for tp in _TP_CANDIDATES:
        if tp > cap.tp and _fits(capacity_at, tp, cap.kv_cache_dtype, max_model_len, max_num_batched_tokens):
            return tp
    return None


def _fits(capacity_at: CapacityAt, tp: int, kv_cache_dtype: str, max_model_len: int,
          max_num_batched_tokens: int) -> bool:
    try:
        other = capacity_at(tp, kv_cache_dtype)
    except KvplanError:  # TP does not divide the heads, weights do not fit, ...
        return False
    return one_request_kv_bytes(other, max_model_len, max_num_batched_tokens) <= other.available_kv_bytes


def _either(options: list[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
