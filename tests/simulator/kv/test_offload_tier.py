"""The paged allocator's CPU offload tier (``offload_blocks``), traced by hand.

Rules (simulator/kv/paged.py, after vLLM's OffloadingConnector): full blocks are stored as they
are registered (write-through, so a hash can be in both tiers), the tier drops its least recently
used hashes to make room, a lookup counts HBM hits first and then CPU hits from the first HBM
miss on, and CPU hits become fresh, cached HBM blocks that the allocator reports as loaded.
Block ids below are pop order: a fresh pool hands out block 0, 1, 2, ...
"""

from __future__ import annotations

import pytest

from simulator.kv.paged import PagedAllocator


def tier(alloc: PagedAllocator) -> list[int]:
    """The CPU tier's hashes, least recently used first."""
    assert alloc._offload is not None
    return list(alloc._offload)


def test_full_blocks_are_stored_as_written_first_block_most_recent() -> None:
    a = PagedAllocator(8, 4, enable_prefix_caching=True, offload_blocks=8)
    g0 = a.cache_generation
    a.allocate(0, 9, 9, [11, 12])  # 2 full blocks and 1 token: both hashes stored
    # inserted in order, then touched in reverse: the first block is the most recently used
    assert tier(a) == [12, 11]
    assert a.num_offload_stored_blocks == 2
    assert a.cache_generation > g0
    # the blocks stay in HBM's cache too (write-through): the hit is HBM's, nothing loads
    assert a.lookup([11, 12], 9) == 8
    a.allocate(1, 9, 9, [11, 12])
    assert (a.num_hit_blocks, a.num_offload_hit_blocks, a.take_loaded_blocks()) == (2, 0, 0)
    a.check_invariants()


def test_a_prefix_evicted_from_hbm_is_loaded_back_from_cpu() -> None:
    """HBM: 4 blocks of 4. A (9 tokens, hashes 11, 12) takes blocks 0, 1, 2 and is freed: 0 and
    1 are cached (evictable, 1 first: tail first), 2 goes back to the free list. B (16 tokens,
    hashes 21..24) takes 2, 3 and evicts 1 then 0: A's prefix is gone from HBM, not from the
    CPU tier. C (A's prefix, 9 tokens) then finds 2 blocks there: 8 tokens cached, 2 loaded,
    into fresh HBM blocks that become cached again."""
    a = PagedAllocator(4, 4, enable_prefix_caching=True, offload_blocks=8)
    a.allocate(0, 9, 9, [11, 12])
    a.free(0)
    a.allocate(1, 16, 16, [21, 22, 23, 24])
    assert a.num_evictions == 2 and a.num_cached_blocks() == 4  # only B's blocks
    assert tier(a) == [12, 11, 24, 23, 22, 21]
    a.free(1)
    assert a.lookup([11, 12], 9) == 8  # 0 from HBM, then 2 from the CPU tier
    gen = a.cache_generation
    got = a.allocate(2, 9, 9, [11, 12])
    assert got is not None and got.num_cached_tokens == 8
    assert (a.num_hit_blocks, a.num_offload_hit_blocks) == (0, 2)
    assert a.take_loaded_blocks() == 2 and a.take_loaded_blocks() == 0
    # the loaded blocks are HBM's cache again: the next request hits there, loads nothing
    assert a.cache_generation > gen
    a.allocate(3, 9, 9, [11, 12])
    assert (a.num_hit_blocks, a.take_loaded_blocks()) == (2, 0)
    # C's admission touched its hashes: most recently used
    assert tier(a)[-2:] == [12, 11]
    a.check_invariants()


def test_cpu_hits_continue_after_the_hbm_hit() -> None:
    """HBM holds the first block of the prefix, the CPU tier the first two: 1 HBM hit, then 1
    CPU hit from the first HBM miss on."""
    a = PagedAllocator(4, 4, enable_prefix_caching=True, offload_blocks=8)
    a.allocate(0, 9, 9, [11, 12])  # blocks 0 (11), 1 (12), 2
    a.allocate(1, 4, 4, [31])  # block 3
    a.free(1)  # 3 cached
    a.free(0)  # 2 free; 1, 0 cached: evictable order 3, 1, 0
    a.allocate(2, 8, 8, [41, 42])  # takes 2, evicts 3 (31): still not A's
    a.allocate(3, 4, 4, [51])  # evicts 1 (hash 12): HBM keeps 11 only
    assert a.lookup([11, 12], 9) == 8
    got = a.allocate(4, 9, 9, [11, 12])
    assert got is None  # 3 blocks needed, 1 HBM hit is free: 3 - 1 + 1 > 1 free block
    a.free(2)
    got = a.allocate(4, 9, 9, [11, 12])
    assert got is not None and got.num_cached_tokens == 8
    assert (a.num_hit_blocks, a.num_offload_hit_blocks, a.take_loaded_blocks()) == (1, 1, 1)
    a.check_invariants()


def test_the_tier_drops_its_least_recently_used_hashes() -> None:
    """A tier of 2 blocks: A stores 11, 12 (order 12, 11); B's store of 21 drops 12, the least
    recently used; C's store of 31 drops 11. HBM (3 blocks) evicts as it goes, so the lookups
    see what the tier dropped."""
    a = PagedAllocator(3, 4, enable_prefix_caching=True, offload_blocks=2)
    a.allocate(0, 9, 9, [11, 12])  # blocks 0, 1, 2
    a.free(0)  # 2 free; 1 (12), 0 (11) cached
    a.allocate(1, 5, 5, [21])  # takes 2, evicts 1 (hash 12)
    assert tier(a) == [11, 21] and a.num_offload_evictions == 1
    assert a.lookup([11, 12], 9) == 4  # 11 in HBM; 12 neither in HBM nor in the tier
    a.free(1)  # its partial block 1 goes free, 2 (21) cached
    a.allocate(2, 5, 5, [31])  # takes 1, evicts 0 (hash 11)
    assert tier(a) == [21, 31] and a.num_offload_evictions == 2
    assert a.lookup([11, 12], 9) == 0
    assert a.lookup([21], 5) == 4  # HBM's block 2 still holds it
    a.check_invariants()


def test_a_store_larger_than_the_tier_is_skipped() -> None:
    """``prepare_store`` returns None when eviction cannot make room: nothing stored, nothing
    dropped (the blocks being stored are protected)."""
    a = PagedAllocator(8, 4, enable_prefix_caching=True, offload_blocks=2)
    a.allocate(0, 5, 5, [11])
    a.allocate(1, 12, 12, [21, 22, 23])
    assert tier(a) == [11] and a.num_offload_evictions == 0
    a.check_invariants()


def test_a_tier_needs_prefix_caching() -> None:
    with pytest.raises(ValueError, match="prefix caching"):
        PagedAllocator(8, 4, offload_blocks=4)
    with pytest.raises(ValueError):
        PagedAllocator(8, 4, enable_prefix_caching=True, offload_blocks=-1)


def test_without_a_tier_nothing_is_loaded() -> None:
    a = PagedAllocator(4, 4, enable_prefix_caching=True)
    a.allocate(0, 9, 9, [11, 12])
    a.free(0)
    a.allocate(1, 16, 16, [21, 22, 23, 24])
    a.free(1)
    assert a.lookup([11, 12], 9) == 0
    assert a.allocate(2, 9, 9, [11, 12]).num_cached_tokens == 0  # type: ignore[union-attr]
    assert a.take_loaded_blocks() == 0 and a._offload is None
