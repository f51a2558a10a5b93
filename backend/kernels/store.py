"""Triton KV store: scatter a step's new K/V into the paged pool through ``slot_mapping``.

One program per new token copies its ``[H_kv, d_h]`` key and value rows to pool slot
``slot_mapping[t]`` (``block = slot // block_size``, ``offset = slot % block_size`` in the
blocked layout; the flat layout is the blocked one with block_size 1). A negative slot is
padding and is skipped. fp8 pools store ``x / scale`` saturated to the format's range.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.kernels.paged_attention import INTERPRETED
from backend.kernels.reference import FP8_DTYPES, check_store_inputs, check_store_values


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    inv_k_scale, inv_v_scale, fp8_max, slots_per_block,
    stride_nt, stride_nh, stride_nd,
    stride_vt, stride_vh, stride_vd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_cb, stride_co, stride_ch, stride_cd,
    NUM_HEADS: tl.constexpr, HEADS_P2: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
    QUANTIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        heads = tl.arange(0, HEADS_P2)
        dims = tl.arange(0, HEAD_DIM_P2)
        mask = (heads < NUM_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
        block = slot // slots_per_block
        offset = slot % slots_per_block
        key_at = token * stride_nt + heads[:, None] * stride_nh + dims[None, :] * stride_nd
        value_at = token * stride_vt + heads[:, None] * stride_vh + dims[None, :] * stride_vd
        key = tl.load(key_ptr + key_at, mask=mask)
        value = tl.load(value_ptr + value_at, mask=mask)
        if QUANTIZE:
            key = tl.clamp(key.to(tl.float32) * inv_k_scale, -fp8_max, fp8_max)
            value = tl.clamp(value.to(tl.float32) * inv_v_scale, -fp8_max, fp8_max)
        k_at = block * stride_kb + offset * stride_ko + heads[:, None] * stride_kh + dims[None, :] * stride_kd
        v_at = block * stride_cb + offset * stride_co + heads[:, None] * stride_ch + dims[None, :] * stride_cd
        tl.store(k_cache_ptr + k_at, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + v_at, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _blocked(cache: torch.Tensor) -> torch.Tensor:
    """The pool as ``[blocks, slots_per_block, H_kv, d_h]`` (a flat pool is blocks of one slot)."""
    return cache if cache.dim() == 4 else cache.unsqueeze(1)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write ``key``/``value`` ``[T, H_kv, d_h]`` into pool slots ``slot_mapping`` (int32/int64 ``[T]``).

    Same contract as :func:`backend.kernels.reference.store_kv_ref`: a negative slot skips the
    token, either pool layout works, fp8 pools quantize with ``k_scale``/``v_scale``, two
    tokens must not share a slot. Shapes, dtypes and devices are checked before launch
    (ValueError); slot values only for CPU tensors (interpreter), since on CUDA that would sync.
    """
    num_slots = check_store_inputs(key, value, k_cache, v_cache, slot_mapping)
    if key.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"the Triton store needs CUDA tensors (got {key.device}) or TRITON_INTERPRET=1")
    if key.device.type == "cpu":
        check_store_values(slot_mapping, num_slots)
    if key.shape[0] == 0:
        return
    k_blocks, v_blocks = _blocked(k_cache), _blocked(v_cache)
    quantize = k_cache.dtype in FP8_DTYPES
    fp8_max = torch.finfo(k_cache.dtype).max if quantize else 0.0
    num_heads, head_dim = key.shape[1], key.shape[2]
    _store_kv_kernel[(key.shape[0],)](
        key, value, k_blocks, v_blocks, slot_mapping,
        1.0 / k_scale, 1.0 / v_scale, fp8_max, k_blocks.shape[1],
        *key.stride(), *value.stride(), *k_blocks.stride(), *v_blocks.stride(),
        NUM_HEADS=num_heads, HEADS_P2=triton.next_power_of_2(num_heads),
        HEAD_DIM=head_dim, HEAD_DIM_P2=triton.next_power_of_2(head_dim), QUANTIZE=quantize,
    )
