"""Paged decode attention (Triton, interpreted on CPU) and the torch reference, against an fp64 oracle.

Every pool starts filled with NaN and only the slots of real tokens are written, and table
padding holds an id far outside the pool: a kernel that reads an unwritten slot, the tail of
a partial block or a padding entry produces NaN (or crashes) instead of a plausible number.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from backend.kernels import decode_attention, prefill_attention, triton_available
from backend.kernels.paged_attention import (
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    choose_num_splits,
    paged_decode_attention,
)
from backend.kernels.reference import paged_decode_attention_ref, paged_prefill_attention_ref

PAD_ID = 1_000_000
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class Case:
    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def make_case(lens: list[int], *, num_kv_heads: int = 2, group: int = 4, head_dim: int = 32,
              block_size: int = 16, dtype: torch.dtype = torch.float32, seed: int = 0,
              spare_blocks: int = 3) -> Case:
    """Sequences of the given lengths in randomly scattered blocks of a NaN-filled pool."""
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(needed) + spare_blocks
    physical = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lens), max(needed, default=0) + 2), PAD_ID, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    first = 0
    for seq, (num_tokens, num_seq_blocks) in enumerate(zip(lens, needed)):
        ids = physical[first:first + num_seq_blocks]
        first += num_seq_blocks
        table[seq, :num_seq_blocks] = ids.to(torch.int32)
        pos = torch.arange(num_tokens)
        for cache in (k_cache, v_cache):
            cache[ids[pos // block_size], pos % block_size] = torch.randn(
                num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    return Case(query, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32))


def oracle(case: Case) -> torch.Tensor:
    """The torch reference in float64."""
    return paged_decode_attention_ref(case.query.double(), case.k_cache.double(), case.v_cache.double(),
                                      case.block_tables, case.context_lens)


def run_kernel(case: Case, **kwargs: object) -> torch.Tensor:
    return paged_decode_attention(case.query, case.k_cache, case.v_cache, case.block_tables,
                                  case.context_lens, **kwargs)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected).norm() / expected.norm())


def edge_lengths(block_size: int) -> list[int]:
    """1, B-1, B, B+1 and a long one (B-1 is dropped when it is 0)."""
    return sorted({1, max(block_size - 1, 1), block_size, block_size + 1, 300})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_kernel_matches_fp64_oracle(group: int, block_size: int, dtype: torch.dtype) -> None:
    case = make_case(edge_lengths(block_size), group=group, block_size=block_size, dtype=dtype, seed=group)
    expected = oracle(case)
    for num_splits in (1, 4):
        out = torch.full_like(case.query, float("nan"))  # poisoned: every element must be written
        result = run_kernel(case, num_splits=num_splits, out=out)
        assert result is out
        assert not torch.isnan(out).any()
        assert rel_err(out, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_matches_fp64_oracle(dtype: torch.dtype) -> None:
    case = make_case([1, 15, 16, 17, 300], group=4, dtype=dtype)
    result = paged_decode_attention_ref(case.query, case.k_cache, case.v_cache, case.block_tables,
                                        case.context_lens)
    assert result.dtype == dtype
    assert rel_err(result, oracle(case)) < TOLERANCE[dtype]


def test_odd_head_dim_and_block_size_are_masked() -> None:
    case = make_case([1, 2, 3, 4, 50], group=2, head_dim=40, block_size=3, num_kv_heads=3)
    expected = oracle(case)
    for num_splits in (1, 3):
        assert rel_err(run_kernel(case, num_splits=num_splits), expected) < TOLERANCE[torch.float32]


def test_bf16_pool_within_bf16_rounding() -> None:
    case = make_case([7, 16, 130], group=4, dtype=torch.bfloat16)
    assert rel_err(run_kernel(case, num_splits=2), oracle(case)) < TOLERANCE[torch.bfloat16]


def test_split_counts_agree() -> None:
    case = make_case([5, 300, 700], group=4)
    single = run_kernel(case, num_splits=1).double()
    # 64 splits leave most of them empty for the short sequences: they must reduce to nothing.
    for num_splits in (2, 3, 8, 64):
        assert rel_err(run_kernel(case, num_splits=num_splits), single) < 1e-6


def test_permuting_physical_blocks_changes_nothing() -> None:
    case = make_case([1, 33, 300], group=4)
    num_blocks = case.k_cache.shape[0]
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7))
    moved_k = torch.empty_like(case.k_cache)
    moved_v = torch.empty_like(case.v_cache)
    moved_k[perm], moved_v[perm] = case.k_cache, case.v_cache  # block i now lives at perm[i]
    table = case.block_tables.clone()
    used = table != PAD_ID
    table[used] = perm[table[used].long()].to(torch.int32)
    moved = replace(case, k_cache=moved_k, v_cache=moved_v, block_tables=table)
    for num_splits in (1, 3):
        assert torch.equal(run_kernel(moved, num_splits=num_splits), run_kernel(case, num_splits=num_splits))


def test_forked_sequences_share_blocks() -> None:
    case = make_case([40, 40, 40], group=4)
    table = case.block_tables.clone()
    table[1, :2] = table[0, :2]  # sequence 1 is a fork of 0: shares its first two blocks, own tail
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    for cache in (k_cache, v_cache):  # sequence 2 holds private copies of sequence 1's blocks
        cache[table[2, :3].long()] = cache[table[1, :3].long()]
    query = case.query.clone()
    query[2] = query[1]
    forked = Case(query, k_cache, v_cache, table, case.context_lens)
    result = run_kernel(forked, num_splits=2)
    assert rel_err(result, oracle(forked)) < TOLERANCE[torch.float32]
    assert torch.equal(result[2], result[1])


def test_flat_slot_layout_equals_blocked() -> None:
    case = make_case([3, 16, 45], group=2, block_size=16)
    flat_k, flat_v = case.k_cache.flatten(0, 1), case.v_cache.flatten(0, 1)
    blocked = run_kernel(case, num_splits=2)
    flat = paged_decode_attention(case.query, flat_k, flat_v, case.block_tables, case.context_lens,
                                  num_splits=2, block_size=16)
    assert torch.equal(flat, blocked)
    flat_ref = paged_decode_attention_ref(case.query, flat_k, flat_v, case.block_tables, case.context_lens,
                                          block_size=16)
    assert torch.equal(flat_ref, paged_decode_attention_ref(case.query, case.k_cache, case.v_cache,
                                                            case.block_tables, case.context_lens))


def test_strided_query_and_out() -> None:
    case = make_case([3, 40], group=4)
    wide = torch.randn(2, 16, 64)
    query, out = wide[:, ::2, :32], torch.full((2, 16, 64), float("nan"))[:, 1::2, 32:]
    query.copy_(case.query)
    strided = replace(case, query=query)
    expected = oracle(case)
    assert rel_err(run_kernel(strided, num_splits=2, out=out), expected) < TOLERANCE[torch.float32]
    assert rel_err(paged_decode_attention_ref(query, case.k_cache, case.v_cache, case.block_tables,
                                              case.context_lens), expected) < TOLERANCE[torch.float32]


def test_kernel_rejects_fp64() -> None:
    case = make_case([3], group=1)
    with pytest.raises(ValueError, match="takes float16/bfloat16/float32 queries"):
        paged_decode_attention(case.query.double(), case.k_cache.double(), case.v_cache.double(),
                               case.block_tables, case.context_lens)


def test_empty_context_gives_zeros() -> None:
    case = make_case([0, 20], group=4)
    expected = oracle(case)
    assert torch.equal(expected[0], torch.zeros_like(expected[0]))
    for num_splits in (1, 4):
        out = run_kernel(case, num_splits=num_splits, out=torch.full_like(case.query, float("nan")))
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert rel_err(out[1], expected[1]) < TOLERANCE[torch.float32]


def test_fp8_pool_dequantized_with_scales() -> None:
    case = make_case([9, 100], group=4)
    fp8 = replace(case, k_cache=case.k_cache.to(torch.float8_e4m3fn),
                  v_cache=case.v_cache.to(torch.float8_e4m3fn))
    scales = {"k_scale": 0.5, "v_scale": 3.0}
    expected = paged_decode_attention_ref(case.query.double(), fp8.k_cache, fp8.v_cache, case.block_tables,
                                          case.context_lens, **scales)
    dequantized = oracle(replace(case, k_cache=fp8.k_cache.double() * 0.5,
                                 v_cache=fp8.v_cache.double() * 3.0))
    assert rel_err(expected, dequantized) < 1e-12
    assert rel_err(run_kernel(fp8, num_splits=2, **scales), expected) < TOLERANCE[torch.float32]


def test_block_offsets_past_int32_range() -> None:
    # A pool of 2**31+ elements, only a few blocks of which are ever touched (pages stay unallocated).
    block_size, head_dim = 16, 16
    num_blocks = 2**31 // (block_size * head_dim) + 64
    pool = torch.empty((num_blocks, block_size, 1, head_dim), dtype=torch.float16)
    ids = [num_blocks - 1, 3, num_blocks - 40]
    gen = torch.Generator().manual_seed(3)
    for block_id in ids:
        pool[block_id] = torch.randn(block_size, 1, head_dim, generator=gen).half()
    table = torch.tensor([ids], dtype=torch.int32)
    lens = torch.tensor([40], dtype=torch.int32)
    query = torch.randn(1, 4, head_dim, generator=gen).half()
    compact = pool[torch.tensor(ids)].double()
    expected = paged_decode_attention_ref(query.double(), compact, compact,
                                          torch.arange(3, dtype=torch.int32)[None], lens)
    result = paged_decode_attention(query, pool, pool, table, lens, num_splits=2)
    assert rel_err(result, expected) < TOLERANCE[torch.float16]


def test_choose_num_splits() -> None:
    # One long sequence on a 132-SM GPU: about two waves of (kv head, split) programs.
    assert choose_num_splits(1, 8, 32768, 132) == 33
    # Enough (sequence, kv head) programs already: no split.
    assert choose_num_splits(32, 8, 32768, 132) == 1
    # Short contexts are never split below MIN_SPLIT_TOKENS per split.
    assert choose_num_splits(1, 8, 2 * MIN_SPLIT_TOKENS - 1, 132) == 1
    assert choose_num_splits(1, 8, 4 * MIN_SPLIT_TOKENS, 132) == 4
    assert choose_num_splits(1, 1, 10**6, 132) == MAX_SPLITS


def _bad_inputs() -> list[tuple[str, dict[str, torch.Tensor], str]]:
    case = make_case([4, 20, 9], group=2)
    q, k, bt, lens = case.query, case.k_cache, case.block_tables, case.context_lens
    return [
        ("rows", {"block_tables": bt[:2]}, "block_tables has 2 rows but query has 3 sequences"),
        ("lens", {"context_lens": lens[:2]}, "context_lens has 2 entries but query has 3 sequences"),
        ("heads", {"query": q[:, :3]}, "query has 3 heads, not a multiple of the cache's 2 KV heads"),
        ("head_dim", {"query": q[..., :16]}, "query head_dim is 16 but the KV cache's is 32"),
        ("dtype", {"query": q.half()},
         "KV cache is torch.float32 but the new tokens/query are torch.float16"),
        ("v shape", {"v_cache": k[:-1]}, "differ in shape"),
        ("flat", {"k_cache": k.flatten(0, 1), "v_cache": k.flatten(0, 1)}, "pass block_size"),
        ("table dtype", {"block_tables": bt.float()}, "block_tables must be int32"),
        ("device", {"context_lens": lens.to("meta")}, "tensors on different devices"),
        ("length", {"context_lens": torch.tensor([4, 20, 99], dtype=torch.int32)}, "context_lens[2] = 99"),
        ("block id", {"block_tables": torch.where(bt == bt[1, 1], -3, bt)}, "block_tables[1, 1] = -3"),
    ]


@pytest.mark.parametrize("name,change,message", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
@pytest.mark.parametrize("attention", [paged_decode_attention, paged_decode_attention_ref])
def test_inconsistent_inputs_raise_before_launch(attention, name: str, change: dict[str, torch.Tensor],
                                                 message: str) -> None:
    case = make_case([4, 20, 9], group=2)
    args = {"query": case.query, "k_cache": case.k_cache, "v_cache": case.v_cache,
            "block_tables": case.block_tables, "context_lens": case.context_lens} | change
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        attention(**args)


def test_dispatcher_picks_backend() -> None:
    case = make_case([3, 40], group=4)
    args = (case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens)
    reference = paged_decode_attention_ref(*args)
    assert torch.equal(decode_attention(*args), reference)  # CPU tensors: torch unless asked
    assert torch.equal(decode_attention(*args, backend="torch"), reference)
    triton_out = decode_attention(*args, backend="triton", num_splits=2)
    assert torch.equal(triton_out, run_kernel(case, num_splits=2))
    with pytest.raises(ValueError, match="unknown kernel backend 'cuda'"):
        decode_attention(*args, backend="cuda")  # type: ignore[arg-type]


def test_package_works_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import sys; sys.modules['triton'] = None; import backend.kernels as k; "
            "assert not k.triton_available(); assert 'backend.kernels.paged_attention' not in sys.modules")
    repo_root = str(Path(__file__).resolve().parents[3])
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": repo_root})
    monkeypatch.setitem(sys.modules, "triton", None)
    assert not triton_available()
    case = make_case([5], group=1)
    args = (case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens)
    with pytest.raises(ValueError, match="triton package is not installed"):
        decode_attention(*args, backend="triton")
    assert torch.equal(decode_attention(*args), paged_decode_attention_ref(*args))


def dense_causal_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                           start: int) -> torch.Tensor:
    """Textbook attention per query head over contiguous K/V: query i sits at position start + i."""
    num_new, num_q_heads, head_dim = query.shape
    group = num_q_heads // keys.shape[1]
    causal = torch.arange(keys.shape[0])[None, :] <= (torch.arange(num_new) + start)[:, None]
    out = torch.empty_like(query)
    for head in range(num_q_heads):
        scores = query[:, head] @ keys[:, head // group].T / math.sqrt(head_dim)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out[:, head] = probs @ values[:, head // group]
    return out


@pytest.mark.parametrize("start,num_new", [(0, 37), (21, 16), (44, 1)])
def test_prefill_reference_matches_dense_causal(start: int, num_new: int) -> None:
    context_len = start + num_new
    case = make_case([context_len], group=4, dtype=torch.float64)
    table, blocks = case.block_tables[0], case.block_tables[0, :math.ceil(context_len / 16)].long()
    keys = case.k_cache[blocks].flatten(0, 1)[:context_len]
    values = case.v_cache[blocks].flatten(0, 1)[:context_len]
    query = torch.randn(num_new, 8, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = dense_causal_attention(query, keys, values, start)
    result = paged_prefill_attention_ref(query, case.k_cache, case.v_cache, table, context_len, start)
    assert rel_err(result, expected) < 1e-12
    assert prefill_attention is paged_prefill_attention_ref
    # The chunk's last token attends exactly like a decode step at that position.
    decode = paged_decode_attention_ref(query[-1:], case.k_cache, case.v_cache, table[None],
                                        torch.tensor([context_len], dtype=torch.int32))
    assert rel_err(result[-1:], decode.double()) < 1e-12


def test_prefill_reference_rejects_uncached_queries() -> None:
    case = make_case([20], group=1)
    with pytest.raises(ValueError, match="not all inside the cached context of 20 tokens"):
        paged_prefill_attention_ref(case.query[:1].expand(4, -1, -1), case.k_cache, case.v_cache,
                                    case.block_tables[0], 20, 18)
