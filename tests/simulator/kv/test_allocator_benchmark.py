"""benchmarks/allocator.py's baselines and replays on a short trace: the vLLM V1 baseline keeps
vLLM's block accounting, and the replay modes leave every allocator in the same state."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from simulator.kv.paged import PagedAllocator

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "allocator.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_allocator", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ops(bench: ModuleType) -> list[tuple]:
    return bench.build_trace(120)


def _vllm(bench: ModuleType, ops: list[tuple], caching: bool):
    hashes_of = bench.vllm_block_hashes(ops, bench.BLOCK) if caching else {}
    return bench.VllmV1KVCacheManager(bench.NUM_BLOCKS, bench.BLOCK, caching, hashes_of)


def _drive(bench: ModuleType, ops: list[tuple], m, boundaries: bool) -> None:
    """Apply ``ops`` and check every call the way the timed replays do not."""
    bs = m.block_size
    for op in ops:
        if op[0] == "append":
            if boundaries and (op[2] - 1) % bs:
                continue
            assert m.append(op[1], op[2]) is not None
            assert len(m.req_to_blocks[op[1]]) == -(-op[2] // bs)
        elif op[0] == "alloc":
            assert m.allocate(*op[1:]) is not None
        elif op[0] == "fork":
            assert m.fork(*op[1:]) is not None
        else:
            m.free(op[1])


@pytest.mark.parametrize("caching", [True, False])
def test_vllm_baseline_replays_the_trace_and_returns_every_block(bench, ops, caching):
    m = _vllm(bench, ops, caching)
    _drive(bench, ops, m, boundaries=False)
    pool = m.block_pool
    assert not m.req_to_blocks and not m.requests
    assert pool.get_num_free_blocks() == bench.NUM_BLOCKS  # the null block aside, all free again
    assert all(b.ref_cnt == 0 for b in pool.blocks if not b.is_null)
    cached = [b for b in pool.blocks if b.block_hash is not None]
    assert bool(cached) == caching
    for b in cached:
        assert pool.cached_block_hash_to_block.get_one_block(b.block_hash) is not None


def test_vllm_baseline_hits_the_prefix_and_the_parallel_samples(bench, ops):
    """Mooncake requests share prefixes, and n > 1 children reuse the parent's prompt blocks."""
    m = _vllm(bench, ops, caching=True)
    hits = 0
    for op in ops:
        if op[0] in ("alloc", "fork"):
            seq = op[1] if op[0] == "alloc" else op[2]
            n = op[2] if op[0] == "alloc" else op[3]
            hits += len(m.get_computed_blocks(bench.VllmRequest(seq, n, m.hashes_of[seq]))[0])
            assert (m.allocate(*op[1:]) if op[0] == "alloc" else m.fork(*op[1:])) is not None
        elif op[0] == "append":
            m.append(op[1], op[2])
        else:
            m.free(op[1])
    assert hits > 0


def test_vllm_baseline_calls_at_boundaries_give_the_same_blocks(bench, ops):
    """Without caching, skipping the calls for tokens inside a block changes nothing."""
    every, bounds = _vllm(bench, ops, caching=False), _vllm(bench, ops, caching=False)
    half = ops[: len(ops) // 2]
    _drive(bench, half, every, boundaries=False)
    _drive(bench, half, bounds, boundaries=True)
    ids = lambda m: {r: [b.block_id for b in blocks] for r, blocks in m.req_to_blocks.items()}  # noqa: E731
    assert ids(every) == ids(bounds)


@pytest.mark.parametrize("caching", [True, False])
def test_kvplan_replay_modes_end_in_the_same_state(bench, ops, caching):
    """Per token, lazy and event-driven calls must leave the allocator in the same state."""
    states = []
    for mode in ("per token", "lazy", "events"):
        a = PagedAllocator(bench.NUM_BLOCKS, bench.BLOCK, enable_prefix_caching=caching)
        half = ops[: len(ops) // 2]
        if mode == "events":
            bench.replay_events(half, a)
        else:
            until = a.tokens_until_append if mode == "lazy" else None
            bench.replay(half, a.allocate, a.append, a.fork, a.free, until)
        a.check_invariants()
        states.append(({s: list(t) for s, t in a.block_tables.items()}, a.num_evictions, a.num_hit_blocks))
    assert states[0] == states[1] == states[2]  # the same block ids, evictions and hits
