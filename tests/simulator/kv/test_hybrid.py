"""Hybrid models: per-group sizing (`kvplan size`), vLLM's hybrid KV cache manager as an
allocator, and the roofline's per-layer-kind attention. Every expected number is worked out by
hand in the test."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.hybrid import HybridPagedAllocator
from simulator.kv.models import get_model
from simulator.kv.sizing import kv_capacity, model_kv_layout
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.commands.size import add_parser, run


def _size(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert run(parser.parse_args(["size", *argv, "--json"])) == 0
    return json.loads(capsys.readouterr().out)


def test_gpt_oss_120b_size(capsys: pytest.CaptureFixture[str]) -> None:
    r = _size(capsys, "--model", "gpt-oss-120b", "--seq-len", "32768", "--gpu", "h200")
    page_token = 2 * 8 * 64 * 2  # one layer, one token: K and V of 8 heads of 64, bf16
    # 18 full layers hold all 32,768 tokens, 18 sliding layers the last 128
    assert r["total_bytes"] == 18 * page_token * 32768 + 18 * page_token * 128
    # 2 groups of 18 layers: a block id is 16 tokens of 18 layers
    assert r["block_bytes"] == 16 * page_token * 18
    assert r["num_blocks"] == r["available_kv_bytes"] // (16 * page_token * 18)
    # per request at max_model_len 131,072: full 8,192 blocks, sliding
    # ceil(min(127 + 8192, 131072) / 16) + 1 = 521 (vLLM's max_memory_usage_bytes)
    assert r["max_concurrency"] == pytest.approx(r["num_blocks"] / (8192 + 521))
    # vLLM main's "GPU KV cache size": max concurrency × max_model_len (get_kv_cache_capacity)
    assert r["capacity_tokens"] == int(r["num_blocks"] / (8192 + 521) * 131072)
    # a 32,768-token sequence: 2,048 full blocks, 8 live sliding blocks + the one being filled
    assert r["max_seqs_at_seq_len"] == r["num_blocks"] // (2048 + 9)


def test_gemma_3_27b_size(capsys: pytest.CaptureFixture[str]) -> None:
    r = _size(capsys, "--model", "gemma-3-27b", "--seq-len", "8192", "--gpu", "h200")
    page_token = 2 * 16 * 128 * 2
    # 10 full layers, 52 sliding (window 1024): groups of 10 -> 1 full + 6 sliding groups
    assert r["total_bytes"] == page_token * (10 * 8192 + 52 * 1024)
    assert r["block_bytes"] == 16 * page_token * 10
    sliding = math.ceil(min(1023 + 8192, 131072) / 16) + 1  # 577
    assert r["capacity_tokens"] == int(r["num_blocks"] / (8192 + 6 * sliding) * 131072)
    assert r["max_concurrency"] == pytest.approx(r["num_blocks"] / (8192 + 6 * sliding))


def test_llama_4_scout_size(capsys: pytest.CaptureFixture[str]) -> None:
    r = _size(capsys, "--model", "llama-4-scout", "--seq-len", "20000", "--gpu", "h200",
              "--tp", "4")
    page_token = 2 * 2 * 128 * 2  # 8 KV heads over 4 ranks
    # 12 global layers hold 20,000 tokens; 36 chunked layers the current chunk: 20,000 mod 8,192
    assert r["total_bytes"] == page_token * (12 * 20000 + 36 * (20000 - 2 * 8192))
    assert r["block_bytes"] == 16 * page_token * 12  # 4 groups of 12
    chunked = math.ceil(min(8192 + 8192, 262144) / 16)  # 1,024 blocks at most
    assert r["max_concurrency"] == pytest.approx(r["num_blocks"] / (262144 // 16 + 3 * chunked))


@pytest.mark.parametrize("model, argv, total", [
    # gpt-oss-20b: 24 layers alternating sliding (128) and full, 8 KV heads of 64, bf16
    # (openai/gpt-oss-20b config.json): 12 layers hold the 32,768 tokens, 12 the last 128
    ("gpt-oss-20b", ("--seq-len", "32768"), 2 * 8 * 64 * 2 * (12 * 32768 + 12 * 128)),
    # Gemma-3-12B: 48 layers, 5 sliding (1,024) per global one -> 8 full, 40 sliding; 8 KV heads
    # of 256 (google/gemma-3-12b-it text_config)
    ("gemma-3-12b", ("--seq-len", "8192"), 2 * 8 * 256 * 2 * (8 * 8192 + 40 * 1024)),
    # Llama-4-Maverick: 48 layers, every 4th global (12), 36 chunked (8,192); 8 KV heads of 128 over
    # TP 8 -> one per rank; 20,000 tokens: the chunked layers hold 20,000 - 2 x 8,192
    ("llama-4-maverick", ("--seq-len", "20000", "--tp", "8"), 2 * 1 * 128 * 2 * (12 * 20000 + 36 * 3616)),
])
def test_hybrid_sequence_bytes_by_hand(capsys: pytest.CaptureFixture[str], model: str,
                                       argv: tuple[str, ...], total: int) -> None:
    r = _size(capsys, "--model", model, "--gpu", "h200", *argv)
    assert r["total_bytes"] == total


def test_qwen3_next_size(capsys: pytest.CaptureFixture[str]) -> None:
    r = _size(capsys, "--model", "qwen3-next-80b-a3b", "--seq-len", "32768", "--gpu", "h200",
              "--tp", "2")
    page_token = 2 * 1 * 256 * 2  # 2 KV heads over 2 ranks, head_dim 256
    conv = (2 * 16 * 128 + 32 * 128) // 2 * 3  # conv_dim / tp × (kernel − 1)
    temporal = 32 // 2 * 128 * 128
    state = (conv + temporal) * 2  # 548,864 B per linear layer per rank
    assert state == 548_864
    assert r["total_bytes"] == 12 * page_token * 32768 + 36 * state
    # block size raised to 16 · ceil(548,864 / (16 · 1,024)) = 544; groups of 12 layers
    assert r["block_size"] == 544
    assert r["block_bytes"] == 544 * page_token * 12
    per_request = math.ceil(262144 / 544) + 3  # full blocks + one state block per linear group
    assert r["max_concurrency"] == pytest.approx(r["num_blocks"] / per_request)


def test_disabling_the_hybrid_manager_sizes_every_layer_full() -> None:
    gpt_oss, h200 = get_model("gpt-oss-120b"), get_gpu("h200")
    on = kv_capacity(gpt_oss, h200)
    off = kv_capacity(gpt_oss, h200, hybrid_kv_cache_manager=False)
    assert off.kv_groups is None and off.block_bytes == 16 * 36 * 2048
    assert off.num_blocks == off.available_kv_bytes // (16 * 36 * 2048)
    assert on.num_blocks == 2 * off.num_blocks or on.num_blocks == 2 * off.num_blocks + 1
    with pytest.raises(KvplanError, match="linear-attention"):
        kv_capacity(get_model("qwen3-next-80b-a3b"), h200, tp=2, hybrid_kv_cache_manager=False)


def _gpt_oss_allocator(num_blocks: int) -> HybridPagedAllocator:
    groups = kv_capacity(get_model("gpt-oss-120b"), get_gpu("h200")).kv_groups
    assert groups is not None
    return HybridPagedAllocator(num_blocks, groups)


@settings(max_examples=40, deadline=None)
@given(prompt=st.integers(1, 600), decode=st.integers(0, 600))
def test_a_sliding_sequence_never_holds_more_than_its_window(prompt: int, decode: int) -> None:
    """Decoding a token at a time, a sliding group (W = 128, B = 16) holds at most
    ceil(W / B) + 1 = 9 blocks after every append (the allocator is touched at block
    boundaries, where the skipped blocks are dropped); the freed blocks are back in the pool."""
    alloc = _gpt_oss_allocator(200)
    alloc.allocate(1, prompt, prompt + decode)
    for n in range(prompt + 1, prompt + decode + 1):
        full, sliding = alloc.held_blocks(1)
        if alloc.tokens_until_append(1, n - 1) == 0:
            assert alloc.append(1, n) is not None
            full, sliding = alloc.held_blocks(1)
            assert sliding <= math.ceil(128 / 16) + 1
        assert full == math.ceil(alloc.num_tokens[1] / 16)
        assert alloc.num_free_blocks() == 200 - full - sliding
        alloc.check_invariants()
    alloc.free(1)
    assert alloc.snapshot_parts() == (0, 0, 0, 0, 200 * 16, 0)


def test_hybrid_snapshot_counts_tokens_per_group() -> None:
    alloc = _gpt_oss_allocator(100)
    alloc.allocate(7, 300, 400)  # 19 blocks in each group
    for n in range(301, 400):
        if alloc.tokens_until_append(7, n - 1) == 0:
            alloc.append(7, n)
    # declared 385 (the append at the 384 boundary): full 25 blocks; sliding skipped
    # (384 − 127) // 16 = 16 blocks, 9 live, holding 385 − 256 = 129 written tokens
    assert alloc.held_blocks(7) == (25, 9)
    token_state, reserved, internal, external, free, saved = alloc.snapshot_parts(385)
    assert token_state == 385 + 129 and reserved == 0
    assert internal == (25 + 9) * 16 - token_state
    assert free == (100 - 34) * 16 and external == saved == 0


def test_roofline_full_attention_models_unchanged_and_sliding_reads_the_window() -> None:
    gpt_oss, h200 = get_model("gpt-oss-120b"), get_gpu("h200")
    roof = RooflineLatency(gpt_oss, h200)
    layer = 2 * 8 * 64 * 2
    plan = StepPlan(0, (), 4, 4 * 10_000, 4 * 10_000**2, 10_000)
    cost = roof.step_cost(plan)
    # 18 full layers read 40,000 tokens, 18 sliding layers 4 × 128
    assert cost.kv_read_bytes == (18 * 40_000 + 18 * 4 * 128) * layer
    chunk = PrefillChunk(1, 200, 100, True)  # positions 100 .. 299
    prefill = roof.step_cost(StepPlan(0, (chunk,), 0, 0, 0.0, 0))
    # sliding keys read: positions from 100 − 127 → 0 .. 299: 300; pairs 28 × (1..128 ramp
    # part: queries 100..127 see 101..128 keys) + 172 × 128
    pairs_sliding = sum(range(101, 129)) + 172 * 128
    pairs_full = 200 * 100 + 200 * 201 // 2
    per_pair = 2 * 64 * (64 + 64)  # 2 × heads × (d_qk + d_v) per layer
    assert prefill.kv_read_bytes == (18 * 300 + 18 * 300) * layer
    assert prefill.attention_flops == per_pair * 18 * (pairs_full + pairs_sliding)
    assert model_kv_layout(gpt_oss).bytes_per_token == 36 * layer
