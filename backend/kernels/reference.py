"""Paged-KV contract and its torch reference: input checks, decode/prefill attention, KV store.

The KV pool of one layer is a pair of tensors (K and V) in one of two layouts:

    blocked  [num_blocks, block_size, H_kv, d_h]        block_size read from the shape
    flat     [num_blocks * block_size, H_kv, d_h]       block_size passed by the caller

Token ``t`` of a sequence lives at slot ``block_table[t // block_size] * block_size +
t % block_size``; a table row is right-padded and only its first ``ceil(context_len /
block_size)`` entries are ever read::

    block_table  [ 7 | 1 | 4 | pad pad ]     context_len = 2.5 blocks
    slots         7:0..B-1  1:0..B-1  4:0..B/2-1   (rest of block 4 never read)

The functions here are the CPU execution path of the engine and the numerical oracle of the
Triton kernels (run them in float64 for that). They are vectorized: one gather through the
block tables, then masked dense attention in fp32 (fp64 for fp64 queries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
QUERY_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INDEX_DTYPES = frozenset({torch.int32, torch.int64})


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """Sizes of one paged decode call, as validated by :func:`check_decode_inputs`."""

    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (GQA ratio)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def max_context_tokens(self) -> int:
        """Most tokens a table row can address."""
        return self.max_blocks_per_seq * self.block_size


def block_view(cache: torch.Tensor, block_size: int | None, name: str = "k_cache") -> torch.Tensor:
    """Return ``cache`` as a ``[num_blocks, block_size, H_kv, d_h]`` view (no copy).

    A 4-D cache is returned as is (``block_size``, if given, must match its dim 1); a flat
    ``[num_slots, H_kv, d_h]`` cache needs ``block_size`` dividing ``num_slots``.
    Raises ValueError otherwise.
    """
    if cache.dim() == 4:
        if block_size is not None and block_size != cache.shape[1]:
            raise ValueError(f"{name} has block_size {cache.shape[1]} (dim 1) but block_size={block_size}")
        return cache
    if cache.dim() != 3:
        raise ValueError(f"{name} must be [num_blocks, block_size, H_kv, d_h] or [num_slots, H_kv, d_h], "
                         f"got shape {tuple(cache.shape)}")
    if block_size is None:
        raise ValueError(f"{name} is flat [num_slots, H_kv, d_h]: pass block_size")
    if block_size < 1 or cache.shape[0] % block_size:
        raise ValueError(f"{name} has {cache.shape[0]} slots, not a multiple of block_size={block_size}")
    return cache.unflatten(0, (cache.shape[0] // block_size, block_size))


def _check_pool_pair(k_cache: torch.Tensor, v_cache: torch.Tensor, query_dtype: torch.dtype) -> None:
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    if k_cache.dtype != query_dtype and k_cache.dtype not in FP8_DTYPES:
        raise ValueError(f"KV cache is {k_cache.dtype} but the new tokens/query are {query_dtype} "
                         "(they must match unless the cache is fp8)")


def _check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"tensors on different devices: {listing}")


def check_decode_inputs(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor,
                        block_size: int | None = None, out: torch.Tensor | None = None) -> PagedLayout:
    """Check shapes, dtypes and devices of a paged decode call; return its sizes.

    Raises ValueError with a one-line message naming the offending tensor. Values (block ids,
    lengths) are checked separately by :func:`check_decode_values` because that needs a
    device sync.
    """
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, H_q, d_h], got shape {tuple(query.shape)}")
    if query.dtype not in QUERY_DTYPES:
        raise ValueError(f"query dtype {query.dtype} is not one of float16/bfloat16/float32/float64")
    _check_pool_pair(k_cache, v_cache, query.dtype)
    blocks = block_view(k_cache, block_size)
    num_seqs, num_q_heads, head_dim = query.shape
    num_blocks, block_len, num_kv_heads, cache_head_dim = blocks.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"query head_dim is {head_dim} but the KV cache's is {cache_head_dim}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"query has {num_q_heads} heads, not a multiple of the cache's "
                         f"{num_kv_heads} KV heads")
    if block_tables.dim() != 2 or block_tables.dtype not in INDEX_DTYPES:
        raise ValueError(f"block_tables must be int32 [num_seqs, max_blocks], got {block_tables.dtype} "
                         f"{tuple(block_tables.shape)}")
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows but query has {num_seqs} sequences")
    if context_lens.dim() != 1 or context_lens.dtype not in INDEX_DTYPES:
        raise ValueError(f"context_lens must be int32 [num_seqs], got {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}")
    if context_lens.shape[0] != num_seqs:
        raise ValueError(f"context_lens has {context_lens.shape[0]} entries but query has "
                         f"{num_seqs} sequences")
    _check_same_device(query=query, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                       context_lens=context_lens)
    if out is not None:
        if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
            raise ValueError(f"out must be {query.dtype} {tuple(query.shape)} on {query.device}, got "
                             f"{out.dtype} {tuple(out.shape)} on {out.device}")
    return PagedLayout(num_seqs=num_seqs, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, num_blocks=num_blocks, block_size=block_len,
                       max_blocks_per_seq=block_tables.shape[1])


def check_decode_values(layout: PagedLayout, block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    """Check that every length fits its table row and every block id read is in the pool.

    Syncs with the device (reads the tensors); raises ValueError naming the first bad sequence.
    """
    lens = context_lens.to("cpu", torch.int64)
    bad = torch.nonzero((lens < 0) | (lens > layout.max_context_tokens)).flatten()
    if bad.numel():
        seq = int(bad[0])
        raise ValueError(f"context_lens[{seq}] = {int(lens[seq])} outside [0, {layout.max_context_tokens}] "
                         f"(block_tables width {layout.max_blocks_per_seq} x block_size {layout.block_size})")
    needed = (lens + layout.block_size - 1) // layout.block_size
    columns = torch.arange(layout.max_blocks_per_seq)
    ids = block_tables.to("cpu", torch.int64)
    read = columns[None, :] < needed[:, None]
    bad_ids = read & ((ids < 0) | (ids >= layout.num_blocks))
    if bad_ids.any():
        seq, col = (int(i) for i in torch.nonzero(bad_ids)[0])
        raise ValueError(f"block_tables[{seq}, {col}] = {int(ids[seq, col])} is not a block of the "
                         f"{layout.num_blocks}-block pool")


def check_store_inputs(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> int:
    """Check a KV store call (new tokens ``[T, H_kv, d_h]`` into either pool layout).

    Returns the pool's slot count.

    Raises ValueError with a one-line message naming the offending tensor.
    """
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(f"key and value must both be [num_tokens, H_kv, d_h], got {tuple(key.shape)} "
                         f"and {tuple(value.shape)}")
    if key.dtype != value.dtype:
        raise ValueError(f"key is {key.dtype} but value is {value.dtype}")
    _check_pool_pair(k_cache, v_cache, key.dtype)
    if k_cache.dim() not in (3, 4):
        raise ValueError(f"k_cache must be [num_blocks, block_size, H_kv, d_h] or [num_slots, H_kv, d_h], "
                         f"got shape {tuple(k_cache.shape)}")
    if tuple(k_cache.shape[-2:]) != tuple(key.shape[1:]):
        raise ValueError(f"new tokens have [H_kv, d_h] = {list(key.shape[1:])} but the cache has "
                         f"{list(k_cache.shape[-2:])}")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in INDEX_DTYPES:
        raise ValueError(f"slot_mapping must be int32/int64 [num_tokens], got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries but key has "
                         f"{key.shape[0]} tokens")
    _check_same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    return k_cache.shape[0] * (k_cache.shape[1] if k_cache.dim() == 4 else 1)


def check_store_values(slot_mapping: torch.Tensor, num_slots: int) -> None:
    """Check that every non-negative slot is inside the pool (syncs with the device)."""
    slots = slot_mapping.to("cpu", torch.int64)
    bad = torch.nonzero(slots >= num_slots).flatten()
    if bad.numel():
        token = int(bad[0])
        raise ValueError(f"slot_mapping[{token}] = {int(slots[token])} is outside the {num_slots}-slot pool")


def default_scale(head_dim: int) -> float:
    """The usual softmax scale ``1 / sqrt(d_h)``."""
    return 1.0 / math.sqrt(head_dim)


def _compute_dtype(query_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if query_dtype == torch.float64 else torch.float32


def _quantize(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """New tokens in the cache's dtype; fp8 stores ``x / scale`` saturated to the format's range.

    Multiplies by the reciprocal, as the Triton store does, so both round identically."""
    if cache_dtype not in FP8_DTYPES:
        return x
    limit = torch.finfo(cache_dtype).max
    return (x.float() * (1.0 / scale)).clamp(-limit, limit).to(cache_dtype)


def store_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write token ``i`` of ``key``/``value`` ([T, H_kv, d_h]) into pool slot ``slot_mapping[i]``.

    A negative slot skips the token (padding). Either pool layout is accepted; with an fp8
    pool the tokens are stored as ``x / scale``. Two tokens must not share a slot.
    """
    num_slots = check_store_inputs(key, value, k_cache, v_cache, slot_mapping)
    check_store_values(slot_mapping, num_slots)
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    for cache, new, scale in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
        # Index the blocked view by (block, offset) so pools with any block stride work.
        blocks = cache if cache.dim() == 4 else cache.unflatten(0, (num_slots, 1))
        size = blocks.shape[1]
        blocks[slots // size, slots % size] = _quantize(new[keep], cache.dtype, scale)


def _gather_heads(blocks: torch.Tensor, table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The blocks named by ``table [S, nb]`` as ``[S, H_kv, num_tokens, d_h]``, in one gather.

    Indexing block, head and offset together lays the result out head-major, so the matmuls
    below read it without another copy."""
    num_seqs, num_blocks_read = table.shape
    _, block_size, num_heads, head_dim = blocks.shape
    heads = torch.arange(num_heads, device=table.device)
    offsets = torch.arange(block_size, device=table.device)
    gathered = blocks[table[:, None, :, None], offsets[None, None, None, :], heads[None, :, None, None]]
    return gathered.view(num_seqs, num_heads, num_blocks_read * block_size, head_dim)[:, :, :num_tokens]


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Softmax attention of ``q [S, H_kv, G, M, d]`` over ``k, v [S, H_kv, N, d]`` where
    ``allowed [S, M, N]``; a query row that may see no key gets zeros. Returns ``q``'s shape."""
    num_seqs, num_heads, group, num_rows, head_dim = q.shape
    scores = q.reshape(num_seqs, num_heads, group * num_rows, head_dim) @ k.transpose(-1, -2)
    scores = scores.view(num_seqs, num_heads, group, num_rows, -1) * scale
    scores.masked_fill_(~allowed[:, None, None], float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    probs = torch.exp(scores - row_max)
    denom = probs.sum(dim=-1, keepdim=True)
    out = probs.view(num_seqs, num_heads, group * num_rows, -1) @ v
    out = out.view(q.shape)
    return out / torch.where(denom > 0, denom, torch.ones_like(denom))


def paged_decode_attention_ref(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, *,
                               scale: float | None = None, num_splits: int | None = None,
                               out: torch.Tensor | None = None, block_size: int | None = None,
                               k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """One decode query per sequence attending to its paged KV: ``query [B, H_q, d_h]`` -> ``[B, H_q, d_h]``.

    Sequence ``b`` reads its first ``context_lens[b]`` tokens through ``block_tables[b]``;
    query head ``h`` uses KV head ``h // (H_q / H_kv)``. ``scale`` defaults to ``d_h ** -0.5``;
    fp8 pools are dequantized with ``k_scale``/``v_scale``. A zero-length context yields zeros.
    ``num_splits`` is accepted for signature parity with the kernel and ignored. Computes in
    fp32 (fp64 for an fp64 query); the result has the query's dtype and goes to ``out`` if given.
    Raises ValueError on inconsistent inputs, out-of-range lengths or block ids.
    """
    del num_splits  # exact softmax here: nothing to split
    layout = check_decode_inputs(query, k_cache, v_cache, block_tables, context_lens, block_size, out)
    check_decode_values(layout, block_tables, context_lens)
    k_blocks = block_view(k_cache, layout.block_size)
    v_blocks = block_view(v_cache, layout.block_size, "v_cache")
    compute = _compute_dtype(query.dtype)
    lens = context_lens.to(torch.int64)
    num_tokens = int(lens.max()) if layout.num_seqs else 0
    num_blocks_read = -(-num_tokens // layout.block_size)
    # Padding entries may hold anything: point them at block 0 and mask those tokens out.
    columns = torch.arange(num_blocks_read, device=query.device)
    needed = (lens + layout.block_size - 1) // layout.block_size
    read = columns[None, :] < needed[:, None]
    table = torch.where(read, block_tables[:, :num_blocks_read].to(torch.int64), 0)
    valid = torch.arange(num_tokens, device=query.device)[None, :] < lens[:, None]  # [B, N]
    k = _gather_heads(k_blocks, table, num_tokens).to(compute)
    v = _gather_heads(v_blocks, table, num_tokens).to(compute)
    if not bool(valid.all()):
        # Unread slots may hold NaN: their scores are masked to -inf, but 0 * NaN in P @ V is
        # NaN. The gather made v a fresh tensor, so zeroing it in place is safe.
        v.masked_fill_(~valid[:, None, :, None], 0.0)
    q = query.to(compute).reshape(layout.num_seqs, layout.num_kv_heads, layout.group_size, 1, layout.head_dim)
    softmax_scale = (default_scale(layout.head_dim) if scale is None else scale) * k_scale
    result = _masked_attention(q, k, v, valid[:, None, :], softmax_scale) * v_scale
    result = result.reshape(query.shape).to(query.dtype)
    if out is None:
        return result
    return out.copy_(result)


def paged_prefill_attention_ref(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_table: torch.Tensor, context_len: int, query_start_pos: int, *,
                                scale: float | None = None, block_size: int | None = None,
                                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Causal attention of a chunk of new tokens of ONE sequence against its paged KV.

    ``query [T, H_q, d_h]`` holds positions ``query_start_pos .. query_start_pos + T - 1``;
    their K/V must already be in the cache (write before attend), so ``query_start_pos + T <=
    context_len``. Query ``i`` sees cached tokens ``0 .. query_start_pos + i``. ``block_table``
    is the sequence's 1-D table. Returns ``[T, H_q, d_h]`` in the query's dtype.
    Raises ValueError on inconsistent inputs.
    """
    if block_table.dim() != 1:
        raise ValueError(f"block_table must be 1-D (one sequence), got shape {tuple(block_table.shape)}")
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, H_q, d_h], got shape {tuple(query.shape)}")
    num_new = query.shape[0]
    if query_start_pos < 0 or query_start_pos + num_new > context_len:
        raise ValueError(f"query tokens {query_start_pos}..{query_start_pos + num_new - 1} are not all "
                         f"inside the cached context of {context_len} tokens")
    lens = torch.tensor([context_len], dtype=torch.int64, device=query.device)
    # One decode-shaped row stands for the chunk: the pool/table checks are the same.
    row = query.new_empty((1,) + tuple(query.shape[1:]))
    layout = check_decode_inputs(row, k_cache, v_cache, block_table[None, :], lens, block_size)
    check_decode_values(layout, block_table[None, :], lens)
    if num_new == 0:
        return query.new_empty(query.shape)
    num_blocks_read = -(-context_len // layout.block_size)
    table = block_table[None, :num_blocks_read].to(torch.int64)
    compute = _compute_dtype(query.dtype)
    k_blocks = block_view(k_cache, layout.block_size)
    v_blocks = block_view(v_cache, layout.block_size, "v_cache")
    k = _gather_heads(k_blocks, table, context_len).to(compute)
    v = _gather_heads(v_blocks, table, context_len).to(compute)
    q = query.to(compute).reshape(num_new, layout.num_kv_heads, layout.group_size, layout.head_dim)
    q = q.permute(1, 2, 0, 3)[None]  # [1, H_kv, G, T, d]
    query_pos = torch.arange(num_new, device=query.device) + query_start_pos
    allowed = torch.arange(context_len, device=query.device)[None, :] <= query_pos[:, None]  # [T, N]
    softmax_scale = (default_scale(layout.head_dim) if scale is None else scale) * k_scale
    result = _masked_attention(q, k, v, allowed[None], softmax_scale)[0] * v_scale  # [H_kv, G, T, d]
    return result.permute(2, 0, 1, 3).reshape(query.shape).to(query.dtype)

