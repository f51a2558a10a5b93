"""Prefix caching in the hybrid allocator (vLLM's HybridKVCacheCoordinator): hand-traced hits
across full, sliding-window and chunked groups, the refusal for linear attention, and random
operation sequences with every invariant checked after each step."""

from __future__ import annotations

from simulator.kv.hybrid import HybridPagedAllocator
from simulator.kv.model_config import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
)
from simulator.kv.sizing import HybridKVLayout, KVCacheGroup
from tests.simulator.kv.test_allocator_stateful import _machine


def _layout(block_size: int, *groups: tuple[str, int | None]) -> HybridKVLayout:
    return HybridKVLayout(tuple(KVCacheGroup(kind, 1, window) for kind, window in groups),
                          group_size=1, block_size=block_size, page_bytes=1, state_bytes=0)


def _gpt_oss_like(num_blocks: int) -> HybridPagedAllocator:
    """One full and one sliding group, W = 128, B = 16 (gpt-oss's window and block size)."""
    layout = _layout(16, (FULL_ATTENTION, None), (SLIDING_ATTENTION, 128))
    return HybridPagedAllocator(num_blocks, layout, enable_prefix_caching=True)


PREFIX = tuple(range(1000, 1062))  # 62 full blocks: the first 992 of a 1,000-token prefix
SECOND = PREFIX + tuple(range(2000, 2006))  # the second request's 68 hashed blocks


def test_second_request_hits_the_whole_prefix_after_the_sliding_blocks_were_dropped() -> None:
    alloc = _gpt_oss_like(200)
    first = alloc.allocate(1, 1000, 1100, PREFIX)
    assert first is not None and first.num_cached_tokens == 0
    assert alloc.held_blocks(1) == (63, 63)  # ceil(1000 / 16) in each group during prefill
    assert alloc.num_cached_blocks() == 2 * 62  # every full block, in both groups
    alloc.append(1, 1001)  # first decode: computed 1000, (1000 − 127) // 16 = 54 blocks skipped
    assert alloc.held_blocks(1) == (63, 9)
    # dropped, still cached: free behind the 74 never used (the free queue's head)
    assert alloc.num_free_blocks() == 74 + 54 and alloc.num_cached_free_blocks() == 54
    assert alloc.free_blocks_before_eviction(200) == 74
    # max (1100 − 1) // 16 = 68 blocks; full: 62 leading hits; sliding: the last
    # ceil(127 / 16) = 8 blocks before block 62 (54..61) are live in request 1 -> 62 blocks
    assert alloc.lookup(SECOND, 1100) == 992
    got = alloc.allocate(2, 1100, 1200, SECOND)
    assert got is not None and got.num_cached_tokens == 992
    # 69 blocks per group: full 62 shared + 7 new; sliding skips (992 − 127) // 16 = 54,
    # shares 8 and takes 7 new: 14 blocks from the pool
    assert alloc.held_blocks(2) == (69, 15)
    assert alloc._tables[2][0][:62] == alloc._tables[1][0][:62]
    assert alloc._tables[2][1][:8] == alloc._tables[1][1][:8]
    assert alloc.num_free_blocks() == 60 + 54 and alloc.num_cached_free_blocks() == 54  # 14 from the head
    # 70 blocks are shared: each counted once in the pool, 70 × 16 slots saved
    token_state, reserved, internal, external, free, saved = alloc.snapshot_parts(1001 + 1100)
    assert saved == 70 * 16
    assert free == (200 - (63 + 9 + 69 + 15 - 70)) * 16
    assert token_state == 2 * 2101 - 16 * (54 + 54) - saved
    alloc.check_invariants()


def _first_request_freed() -> HybridPagedAllocator:
    """160 blocks; request 1 (1,000 tokens of PREFIX, final length 1,100) decodes once and is
    freed. vLLM 0.33.0's free queue (BlockPool.free_blocks: blocks without a hash in front, full
    blocks at the tail, least recently freed first) is then: the 34 blocks never used; the 54
    sliding blocks dropped at the decode, newest first (53..0, named); the full group tail first
    — block 62 (its final length fills it: full, anonymous), 61..0 (named); the sliding group tail
    first — 62 (anonymous), 61..54 (named)."""
    alloc = _gpt_oss_like(160)
    alloc.allocate(1, 1000, 1100, PREFIX)
    alloc.append(1, 1001)  # 54 sliding blocks dropped first: least recently released
    alloc.free(1)
    assert alloc.num_free_blocks() == 160 and alloc.num_cached_free_blocks() == 124
    assert alloc.free_blocks_before_eviction(160) == 34
    return alloc


def test_the_hit_survives_eviction_of_the_early_sliding_blocks() -> None:
    alloc = _first_request_freed()
    # a filler of 44 blocks per group takes the 34 never used, then the 54 dropped sliding
    # blocks 0..53, evicting them
    alloc.allocate(3, 44 * 16, 44 * 16)
    assert alloc.num_evictions == 54
    assert alloc.num_cached_blocks() == 62 + 8
    alloc.free(3)
    assert alloc.lookup(SECOND, 1100) == 992  # sliding needs only blocks 54..61
    got = alloc.allocate(2, 1100, 1200, SECOND)
    assert got is not None and got.num_cached_tokens == 992
    assert alloc.held_blocks(2) == (69, 15)
    # the 70 hits are claimed out of the middle of the queue; the 14 new blocks are its head:
    # full 62 and sliding 62 (anonymous), then 12 of the filler's: nothing named is evicted
    assert alloc.num_cached_free_blocks() == 0 and alloc.num_free_blocks() == 160 - 70 - 14
    assert alloc.num_evictions == 54
    alloc.check_invariants()


def test_one_block_more_evicts_a_cached_block_before_blocks_that_hold_nothing() -> None:
    """vLLM hashes every full block, so a full block nobody will hit (full 62, anonymous) waits
    in the same least-recently-freed order as the named ones: a filler one block per group
    longer than above takes it and then evicts full 61, though sliding 62 (anonymous too) was
    freed later and stays. Full then serves 61 blocks, where the sliding group needs blocks
    53..60, and 53 is gone like every block before it: no hit at all. (Reusing every unnamed
    block before any named one, kvplan's rule before vLLM 0.33.0 was followed, kept the 992.)"""
    alloc = _first_request_freed()
    alloc.allocate(3, 45 * 16, 45 * 16)
    assert alloc.num_evictions == 55
    assert alloc.num_cached_blocks() == 61 + 8
    alloc.free(3)
    assert alloc.lookup(SECOND, 1100) == 0
    alloc.check_invariants()


def test_a_hit_needs_the_sliding_window_before_its_end() -> None:
    """B = 4, W = 8: a sliding hit needs ceil(7 / 4) = 2 blocks before the hit point; the full
    group's longer run does not help once those are gone."""
    layout = _layout(4, (FULL_ATTENTION, None), (SLIDING_ATTENTION, 8))
    alloc = HybridPagedAllocator(16, layout, enable_prefix_caching=True)
    hashes = (1, 2, 3, 4, 5, 6)
    alloc.allocate(1, 25, 25, hashes)  # 7 blocks per group, blocks 0..5 cached in both
    alloc.append(1, 26)  # computed 25: sliding drops (25 − 7) // 4 = 4 blocks, 0..3
    alloc.free(1)  # then full 6..0 and sliding 6, 5, 4 are released; block 6 is partial
    assert alloc.num_free_blocks() == 16 and alloc.num_cached_free_blocks() == 12
    # the free queue: sliding 6, full 6 (partial: in front, the later group's first), the 2
    # never used; then the full blocks, least recently freed first: sliding 3..0 (dropped
    # newest first), full 5..0, sliding 5, 4. Three blocks per group take the four in front
    # and evict sliding 3, 2: the sliding group still has blocks 4, 5
    assert alloc.free_blocks_before_eviction(16) == 4
    alloc.allocate(2, 12, 12)
    assert alloc.num_evictions == 2
    assert alloc.lookup(hashes, 100) == 24
    # two more per group evict sliding 1, 0 and full 5, 4: full serves 4 blocks, sliding needs
    # blocks 2, 3 for that, 1, 2 for 3, ..., block 0 for 1: all gone, no shorter point either
    alloc.allocate(3, 8, 8)
    assert alloc.num_evictions == 6
    assert alloc.lookup(hashes, 100) == 0
    alloc.check_invariants()


def test_chunked_groups_need_only_the_current_chunk() -> None:
    """B = 4, chunk 8: a hit of k blocks needs the chunked group's blocks from the start of
    its chunk, ``k·4 // 8 · 8 / 4``, on."""
    layout = _layout(4, (FULL_ATTENTION, None), (CHUNKED_ATTENTION, 8))
    alloc = HybridPagedAllocator(32, layout, enable_prefix_caching=True)
    hashes = (1, 2, 3, 4, 5)
    alloc.allocate(1, 21, 21, hashes)  # 6 blocks per group, 0..4 cached in both
    alloc.append(1, 22)  # computed 21: the chunks before 16 skipped, blocks 0..3 dropped
    assert alloc.held_blocks(1) == (6, 2)
    # full: 5 leading hits; chunked at 5 blocks (20 tokens): the chunk starts at 16 -> block 4,
    # live in request 1 -> 20 tokens
    assert alloc.lookup(hashes, 40) == 20
    got = alloc.allocate(2, 40, 40, hashes)
    assert got is not None and got.num_cached_tokens == 20
    assert alloc.held_blocks(2) == (10, 6)  # chunked: skipped 4, block 4 shared, 5 new
    alloc.check_invariants()


def test_linear_attention_models_run_without_prefix_caching() -> None:
    layout = _layout(16, (FULL_ATTENTION, None), (LINEAR_ATTENTION, None))
    alloc = HybridPagedAllocator(40, layout, enable_prefix_caching=True)
    assert not alloc.enable_prefix_caching
    alloc.allocate(1, 100, 100, (1, 2, 3))
    assert alloc.lookup((1, 2, 3), 100) == 0 and alloc.cache_generation == 0
    alloc.free(1)
    assert alloc.num_cached_blocks() == 0


def _stateful(*groups: tuple[str, int | None], block_size: int = 4, num_blocks: int = 40):
    layout = _layout(block_size, *groups)
    return lambda: HybridPagedAllocator(num_blocks, layout, enable_prefix_caching=True)


TestHybridFullSliding = _machine("HybridFullSliding",
                                 _stateful((FULL_ATTENTION, None), (SLIDING_ATTENTION, 8)))
TestHybridSlidingOnly = _machine("HybridSlidingOnly",
                                 _stateful((SLIDING_ATTENTION, 6), (SLIDING_ATTENTION, 6)))
TestHybridFullChunked = _machine("HybridFullChunked",
                                 _stateful((FULL_ATTENTION, None), (CHUNKED_ATTENTION, 8)))
TestHybridMixed = _machine("HybridMixed", _stateful(
    (FULL_ATTENTION, None), (SLIDING_ATTENTION, 5), (CHUNKED_ATTENTION, 8), block_size=2,
    num_blocks=60))
TestHybridNoCache = _machine("HybridNoCache", lambda: HybridPagedAllocator(
    40, _layout(4, (FULL_ATTENTION, None), (SLIDING_ATTENTION, 8), (LINEAR_ATTENTION, None))))
