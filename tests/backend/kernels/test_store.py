"""KV store: the Triton kernel (interpreted on CPU) and the torch reference write the same slots."""

from __future__ import annotations

import math

import pytest
import torch

from backend.kernels import decode_attention, write_kv
from backend.kernels.reference import store_kv_ref
from backend.kernels.store import store_kv

SENTINEL = -7.0  # what untouched slots hold; a store must leave them alone
NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM = 6, 4, 3, 24


def make_pools(dtype: torch.dtype = torch.float32, flat: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    pools = [torch.full(shape, SENTINEL, dtype=dtype) for _ in range(2)]
    return (pools[0].flatten(0, 1), pools[1].flatten(0, 1)) if flat else (pools[0], pools[1])


def new_tokens(num_tokens: int, dtype: torch.dtype = torch.float32,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (num_tokens, NUM_KV_HEADS, HEAD_DIM)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


SLOTS = [5, -1, 0, 23, 12, -4, 13]  # scattered, with padding tokens (negative) to skip


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_writes_exactly_the_mapped_slots(dtype: torch.dtype, slot_dtype: torch.dtype,
                                                flat: bool) -> None:
    key, value = new_tokens(len(SLOTS), dtype)
    slot_mapping = torch.tensor(SLOTS, dtype=slot_dtype)
    k_cache, v_cache = make_pools(dtype, flat)
    store_kv(key, value, k_cache, v_cache, slot_mapping)
    k_slots = k_cache.reshape(-1, NUM_KV_HEADS, HEAD_DIM)
    v_slots = v_cache.reshape(-1, NUM_KV_HEADS, HEAD_DIM)
    written = [(token, slot) for token, slot in enumerate(SLOTS) if slot >= 0]
    for token, slot in written:
        assert torch.equal(k_slots[slot], key[token])
        assert torch.equal(v_slots[slot], value[token])
    untouched = torch.ones(k_slots.shape[0], dtype=torch.bool)
    untouched[[slot for _, slot in written]] = False
    assert bool((k_slots[untouched] == SENTINEL).all() and (v_slots[untouched] == SENTINEL).all())
    ref_k, ref_v = make_pools(dtype, flat)
    store_kv_ref(key, value, ref_k, ref_v, slot_mapping)
    assert torch.equal(ref_k, k_cache) and torch.equal(ref_v, v_cache)


def test_pool_with_interleaved_k_and_v_blocks() -> None:
    # One allocation [blocks, 2, block_size, H, d]: K and V are strided views, not flattenable.
    pool = torch.full((NUM_BLOCKS, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), SENTINEL)
    key, value = new_tokens(len(SLOTS), seed=1)
    slot_mapping = torch.tensor(SLOTS)
    store_kv(key, value, pool[:, 0], pool[:, 1], slot_mapping)
    expected = torch.full_like(pool, SENTINEL)
    store_kv_ref(key, value, expected[:, 0], expected[:, 1], slot_mapping)
    assert torch.equal(pool, expected)
    assert torch.equal(pool[23 // BLOCK_SIZE, 1, 23 % BLOCK_SIZE], value[3])


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_store_quantizes_with_scale(fp8: torch.dtype) -> None:
    # Values on the fp8 grid times the scale: Triton's interpreter does not round fp32 -> fp8 to
    # nearest-even (the GPU's cvt.rn does), so only exactly representable values compare here.
    k_scale, v_scale = 0.25, 2.0
    key, value = new_tokens(len(SLOTS), torch.float16, seed=2)
    key = (key * 3 / k_scale).to(fp8).to(torch.float16) * k_scale
    value = (value * 3 / v_scale).to(fp8).to(torch.float16) * v_scale
    key[0, 0, 0] = 60000.0  # far outside both formats' range once divided by k_scale: saturates
    slot_mapping = torch.tensor(SLOTS)
    pools = [torch.zeros((NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), dtype=fp8) for _ in range(4)]
    store_kv(key, value, pools[0], pools[1], slot_mapping, k_scale=k_scale, v_scale=v_scale)
    store_kv_ref(key, value, pools[2], pools[3], slot_mapping, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(pools[0].view(torch.uint8), pools[2].view(torch.uint8))
    assert torch.equal(pools[1].view(torch.uint8), pools[3].view(torch.uint8))
    k_stored = pools[0].flatten(0, 1)[5].float()  # token 0 went to slot 5
    assert k_stored[0, 0] == torch.finfo(fp8).max
    assert torch.equal(k_stored.flatten()[1:] * k_scale, key[0].float().flatten()[1:])
    assert torch.equal(pools[1].flatten(0, 1)[5].float() * v_scale, value[0].float())


def test_written_sequence_reads_back_as_dense_attention() -> None:
    # Write a 10-token sequence through its block table's slots, then decode over it.
    table = [4, 1, 3]
    num_tokens = 10
    slots = [table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for pos in range(num_tokens)]
    key, value = new_tokens(num_tokens, seed=3)
    for backend in ("triton", "torch"):
        k_cache, v_cache = make_pools()
        write_kv(key, value, k_cache, v_cache, torch.tensor(slots), backend=backend)
        query = torch.randn(1, NUM_KV_HEADS * 2, HEAD_DIM, generator=torch.Generator().manual_seed(4))
        out = decode_attention(query, k_cache, v_cache, torch.tensor([table], dtype=torch.int32),
                               torch.tensor([num_tokens], dtype=torch.int32), backend=backend)
        keys = key.repeat_interleave(2, dim=1)  # each KV head serves two query heads
        values = value.repeat_interleave(2, dim=1)
        scores = torch.einsum("hd,thd->ht", query[0], keys) / math.sqrt(HEAD_DIM)
        dense = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), values)
        assert float((out[0] - dense).norm() / dense.norm()) < 1e-5


def _bad_store_inputs() -> list[tuple[str, dict[str, torch.Tensor], str]]:
    key, value = new_tokens(3)
    k_cache, _ = make_pools()
    return [
        ("count", {"slot_mapping": torch.tensor([0, 1])}, "slot_mapping has 2 entries but key has 3 tokens"),
        ("range", {"slot_mapping": torch.tensor([0, 24, 1])},
         "slot_mapping[1] = 24 is outside the 24-slot pool"),
        ("heads", {"key": key[:, :2], "value": value[:, :2]}, "new tokens have [H_kv, d_h] = [2, 24]"),
        ("value", {"value": value[:2]}, "key and value must both be"),
        ("dtype", {"key": key.half(), "value": value.half()}, "KV cache is torch.float32"),
        ("slot dtype", {"slot_mapping": torch.tensor([0.0, 1.0, 2.0])}, "slot_mapping must be int32/int64"),
        ("pool", {"k_cache": k_cache[None], "v_cache": k_cache[None]}, "k_cache must be"),
    ]


@pytest.mark.parametrize("name,change,message", _bad_store_inputs(), ids=[c[0] for c in _bad_store_inputs()])
@pytest.mark.parametrize("store", [store_kv, store_kv_ref])
def test_inconsistent_store_inputs_raise(store, name: str, change: dict[str, torch.Tensor],
                                        message: str) -> None:
    key, value = new_tokens(3)
    k_cache, v_cache = make_pools()
    args = {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache,
            "slot_mapping": torch.tensor([0, 1, 2])} | change
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        store(**args)
    assert bool((k_cache == SENTINEL).all())
