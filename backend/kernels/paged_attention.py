"""Triton paged decode attention with flash-decoding split-K.

Stage 1 runs one program per (sequence, KV head, split). The program serves the whole GQA
group of query heads that share the KV head, so each K/V tile is loaded once per group. Its
split covers an equal, tile-aligned share of the sequence's context::

    context (tokens)  |---- split 0 ----|---- split 1 ----|-- split 2 --|   (split 3: empty)
    one tile          |tile|tile|tile|..                                    TILE_N tokens
    token t           -> block_tables[seq, t // block_size], offset t % block_size

For every tile it gathers the physical block id of each token from the block table, loads K,
computes scores, and folds them into an fp32 online softmax (running max ``m``, denominator
``l``, weighted sum ``acc``). With one split it writes the normalised output directly;
otherwise it writes ``(m, l, acc)`` partials and stage 2 (one program per sequence and query
head) rescales them to a common max and divides.

Scores live in the log2 domain (``qk * scale * log2(e)``) so both stages use ``exp2``.
Pool offsets are int64 (``block_id * block_stride`` overflows int32 on large pools).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from backend.kernels.reference import (
    PagedLayout,
    block_view,
    check_decode_inputs,
    check_decode_values,
    default_scale,
)

# Read when the kernels below are decorated, exactly like triton.jit does: the interpreter runs
# CPU tensors, and it mishandles bf16/fp16 tl.dot, so it gets fp32 dots.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")

MIN_SPLIT_TOKENS = 256  # below this a split's fixed cost (partials, stage 2) outweighs its parallelism
MAX_SPLITS = 64
_LOG2E = 1.4426950408889634
_TRITON_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
    qk_scale, v_scale, max_context_tokens,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_tb, stride_tc,
    stride_ob, stride_oh, stride_od,
    stride_pb, stride_ph, stride_ps,
    stride_ab, stride_ah, stride_as, stride_ad,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Never address past the table row, whatever the length says.
    context_len = tl.minimum(tl.load(context_lens_ptr + seq).to(tl.int32), max_context_tokens)
    split_tokens = tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), TILE_N) * TILE_N
    start = split * split_tokens
    end = tl.minimum(start + split_tokens, context_len)

    rows = tl.arange(0, GROUP_P2)
    dims = tl.arange(0, HEAD_DIM_P2)
    row_mask = rows < GROUP
    dim_mask = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([GROUP_P2], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)
    table_row = block_tables_ptr + seq * stride_tb
    tile = tl.arange(0, TILE_N)
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tile
        token_mask = pos < end
        block_ids = tl.load(table_row + (pos // BLOCK_SIZE) * stride_tc, mask=token_mask, other=0)
        block_ids = block_ids.to(tl.int64)
        in_block = pos % BLOCK_SIZE
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k_rows = block_ids * stride_kb + in_block * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + k_rows[:, None] + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale
        scores = tl.where(token_mask[None, :], scores, float("-inf"))
        # Every tile holds >= 1 valid token, so m_new is finite and alpha is well defined.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_rows = block_ids * stride_vb + in_block * stride_vt + kv_head * stride_vh
        v = tl.load(v_ptr + v_rows[:, None] + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc * v_scale
    out_mask = row_mask[:, None] & dim_mask[None, :]
    if NUM_SPLITS == 1:
        # An empty context (l == 0) gives zeros rather than 0/0.
        result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 result.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = seq * stride_pb + heads * stride_ph + split * stride_ps
        tl.store(m_ptr + part, m_i, mask=row_mask)
        tl.store(l_ptr + part, l_i, mask=row_mask)
        acc_at = seq * stride_ab + heads[:, None] * stride_ah + split * stride_as + dims[None, :] * stride_ad
        tl.store(acc_ptr + acc_at, acc, mask=out_mask)


@triton.jit
def _decode_reduce_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps,
    stride_ab, stride_ah, stride_as, stride_ad,
    stride_ob, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P2)
    dims = tl.arange(0, HEAD_DIM_P2)
    split_mask = splits < NUM_SPLITS
    dim_mask = dims < HEAD_DIM
    part = seq * stride_pb + head * stride_ph + splits * stride_ps
    m = tl.load(m_ptr + part, mask=split_mask, other=float("-inf"))
    l = tl.load(l_ptr + part, mask=split_mask, other=0.0)
    acc = tl.load(acc_ptr + seq * stride_ab + head * stride_ah + splits[:, None] * stride_as
                  + dims[None, :] * stride_ad, mask=split_mask[:, None] & dim_mask[None, :], other=0.0)
    m_max = tl.max(m, axis=0)
    # All splits empty (zero-length context): use 0 so exp2(-inf - 0) = 0, not NaN.
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(m - m_max)
    denom = tl.sum(weight * l, axis=0)
    result = tl.sum(weight[:, None] * acc, axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
             result.to(out_ptr.dtype.element_ty), mask=dim_mask)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_tokens: int, num_sms: int) -> int:
    """Splits per sequence so that stage 1 fills the GPU without splits shorter than
    ``MIN_SPLIT_TOKENS``: about two waves of programs over ``num_sms`` multiprocessors,
    capped at ``MAX_SPLITS``. Returns 1 when (sequence, KV head) programs already fill it."""
    programs = max(1, num_seqs * num_kv_heads)
    if programs >= num_sms or max_context_tokens < 2 * MIN_SPLIT_TOKENS:
        return 1
    by_occupancy = -(-2 * num_sms // programs)
    by_length = max_context_tokens // MIN_SPLIT_TOKENS
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # the interpreter runs programs one after another: splitting only adds work


def _check_launchable(query: torch.Tensor) -> None:
    if query.dtype not in _TRITON_DTYPES:
        raise ValueError(f"the Triton kernel takes float16/bfloat16/float32 queries, got {query.dtype}")
    if query.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"the Triton kernel needs CUDA tensors (got {query.device}) or TRITON_INTERPRET=1 "
                         "set before backend.kernels.paged_attention is imported")


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, *,
                           scale: float | None = None, num_splits: int | None = None,
                           out: torch.Tensor | None = None, block_size: int | None = None,
                           k_scale: float = 1.0, v_scale: float = 1.0,
                           max_context_len: int | None = None) -> torch.Tensor:
    """Paged decode attention on the GPU: ``query [B, H_q, d_h]`` -> ``[B, H_q, d_h]``.

    Same contract as :func:`backend.kernels.reference.paged_decode_attention_ref` (fp16/bf16/
    fp32 queries; pools of the query's dtype or fp8 with per-tensor ``k_scale``/``v_scale``;
    zeros for an empty context). ``num_splits`` forces the split-K factor; by default it is
    chosen from the batch and ``max_context_len`` (a bound on ``context_lens``; without it the
    table width is used, which avoids a device sync). Shapes, dtypes and devices are checked
    before launch (ValueError); block ids and lengths are checked only for CPU tensors
    (interpreter) since on CUDA that would sync — there they are the caller's contract.
    """
    layout = check_decode_inputs(query, k_cache, v_cache, block_tables, context_lens, block_size, out)
    _check_launchable(query)
    if query.device.type == "cpu":
        check_decode_values(layout, block_tables, context_lens)
    if num_splits is None:
        bound = layout.max_context_tokens if max_context_len is None else min(max_context_len,
                                                                                 layout.max_context_tokens)
        num_splits = choose_num_splits(layout.num_seqs, layout.num_kv_heads, bound, _num_sms(query.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if out is None:
        out = torch.empty_like(query)
    if layout.num_seqs == 0:
        return out
    _launch(query, block_view(k_cache, layout.block_size), block_view(v_cache, layout.block_size, "v_cache"),
            block_tables, context_lens, out, layout, num_splits,
            (default_scale(layout.head_dim) if scale is None else scale) * k_scale, v_scale)
    return out


def _launch(query: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor, out: torch.Tensor, layout: PagedLayout, num_splits: int,
            softmax_scale: float, v_scale: float) -> None:
    head_dim_p2 = max(16, triton.next_power_of_2(layout.head_dim))
    group_p2 = max(16, triton.next_power_of_2(layout.group_size))  # tl.dot needs M >= 16
    tile_n = 64 if head_dim_p2 <= 128 else 32  # keeps the K and V tiles in registers
    use_fp32_dot = INTERPRETED or query.dtype == torch.float32
    dot_dtype = tl.float32 if use_fp32_dot else _TRITON_DTYPES[query.dtype]
    dot_precision = "ieee" if use_fp32_dot else "tf32"  # "tf32" only matters for fp32 operands
    if num_splits == 1:
        m = l = acc = out  # unused: stage 1 writes the output itself
        part_strides, acc_strides = (0, 0, 0), (0, 0, 0, 0)
    else:
        shape = (layout.num_seqs, layout.num_q_heads, num_splits)
        m = torch.empty(shape, dtype=torch.float32, device=query.device)
        l = torch.empty(shape, dtype=torch.float32, device=query.device)
        acc = torch.empty(shape + (layout.head_dim,), dtype=torch.float32, device=query.device)
        part_strides, acc_strides = m.stride(), acc.stride()
    grid = (layout.num_seqs, layout.num_kv_heads, num_splits)
    _decode_split_kernel[grid](
        query, k_blocks, v_blocks, block_tables, context_lens, out, m, l, acc,
        softmax_scale * _LOG2E, v_scale, layout.max_context_tokens,
        *query.stride(), *k_blocks.stride(), *v_blocks.stride(), *block_tables.stride(), *out.stride(),
        *part_strides, *acc_strides,
        HEAD_DIM=layout.head_dim, HEAD_DIM_P2=head_dim_p2, GROUP=layout.group_size, GROUP_P2=group_p2,
        BLOCK_SIZE=layout.block_size, TILE_N=tile_n, NUM_SPLITS=num_splits,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(layout.num_seqs, layout.num_q_heads)](
            m, l, acc, out, *part_strides, *acc_strides, *out.stride(),
            HEAD_DIM=layout.head_dim, HEAD_DIM_P2=head_dim_p2, NUM_SPLITS=num_splits,
            SPLITS_P2=triton.next_power_of_2(num_splits),
        )

