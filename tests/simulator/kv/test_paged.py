"""Paged allocator: the seed's worked cases as exact assertions, COW, prefix caching, eviction order."""

import pytest

from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.kv.prefix import block_hashes


def test_block_boundary_grow_before_write():
    """The seed's edge case: a prompt that fills its last block exactly."""
    bs = 16
    a = PagedAllocator(num_blocks=8, block_size=bs)
    a.allocate(0, 32, 35)
    assert len(a.block_tables[0]) == 2
    assert a.tokens_until_append(0, 32) == 0  # the first decode write needs a new block
    for pos in range(32, 35):
        a.append(0, pos + 1)  # grow BEFORE writing position `pos`
        (slot,) = a.slot_mapping(0, pos, 1)
        block, offset = divmod(slot, bs)
        assert block == a.block_tables[0][pos // bs]
        assert offset == pos % bs
        a.check_invariants()
    assert len(a.block_tables[0]) == 3


def test_exercise_3_internal_fragmentation_vs_contiguous_max():
    """100 tokens with B=16: 7 blocks, 12 wasted slots; contiguous max 2048 wastes 1948."""
    a = PagedAllocator(num_blocks=200, block_size=16)
    a.allocate(0, 100, 100)
    assert len(a.block_tables[0]) == 7
    snap = a.snapshot()
    assert snap.token_state == 100
    assert snap.internal_fragmentation == 12
    assert snap.reserved == 0

    c = ContiguousAllocator(4096, policy="max", max_model_len=2048)
    c.allocate(0, 100, 100)
    snap = c.snapshot()
    assert snap.token_state == 100
    assert snap.internal_fragmentation == 1948
    assert snap.internal_fragmentation / 2048 == pytest.approx(0.951, abs=1e-3)


def test_exercise_4_parallel_sampling_with_cow():
    """800-token prompt, n=4 samples of 150 tokens, B=16: 90 blocks paged vs 4 x 950 contiguous."""
    bs, prompt, out = 16, 800, 150
    a = PagedAllocator(num_blocks=1000, block_size=bs)
    a.allocate(0, prompt, prompt + out)
    for child in (1, 2, 3):
        a.fork(0, child, prompt)
    a.check_invariants()
    assert a.num_blocks - a.num_free_blocks() == 50  # the prompt is stored once
    for pos in range(prompt, prompt + out):
        for seq in range(4):
            if a.tokens_until_append(seq, pos) == 0:
                assert a.append(seq, pos + 1) is not None
    a.check_invariants()
    used_blocks = a.num_blocks - a.num_free_blocks()
    assert used_blocks == 90
    contiguous_tokens = 4 * (prompt + out)
    assert contiguous_tokens == 3800
    assert contiguous_tokens / (used_blocks * bs) == pytest.approx(2.64, abs=0.01)
    assert a.snapshot().shared_saved_tokens == 3 * prompt


def test_cow_copies_only_the_shared_partial_block():
    a = PagedAllocator(num_blocks=16, block_size=4)
    a.allocate(0, 10, 20)  # blocks: [full, full, 2/4]
    a.fork(0, 1, 10)
    assert a.tokens_until_append(0, 10) == 0 and a.tokens_until_append(1, 10) == 0
    shared_last = a.block_tables[0][-1]
    r0 = a.append(0, 11)
    assert r0 is not None and len(r0.copies) == 1
    src, dst = r0.copies[0]
    assert src == shared_last and dst != src and a.block_tables[0][-1] == dst
    assert a.block_tables[0][:2] == a.block_tables[1][:2]  # full blocks stay shared
    # the other sharer now owns the old block alone: it writes in place
    assert a.tokens_until_append(1, 10) == 2
    r1 = a.append(1, 11)
    assert r1 is not None and r1.copies == ()
    a.check_invariants()


def test_free_returns_blocks_and_shared_blocks_survive():
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(0, 8, 8)
    a.fork(0, 1, 8)
    a.free(0)
    assert a.num_free_blocks() == 6
    a.free(1)
    assert a.num_free_blocks() == 8
    a.check_invariants()


def test_out_of_blocks_returns_none_and_changes_nothing():
    a = PagedAllocator(num_blocks=2, block_size=4)
    assert a.allocate(0, 8, 9) is not None
    assert not a.can_allocate(1, 1)
    assert a.allocate(1, 1, 1) is None
    assert a.append(0, 9) is None
    assert a.num_tokens[0] == 8 and len(a.block_tables[0]) == 2
    a.check_invariants()


def test_prefix_cache_hit_reuses_blocks_and_computes_at_least_one_token():
    bs = 4
    a = PagedAllocator(num_blocks=16, block_size=bs, enable_prefix_caching=True)
    hashes = block_hashes(list(range(4)), 4, bs, 16)  # 16-token prompt fully named
    assert len(hashes) == 4
    assert a.lookup(hashes, 16) == 0
    a.allocate(0, 16, 20, hashes)
    # the whole prompt is cached, but one token must still be computed: 3 blocks hit, not 4
    assert a.lookup(hashes, 16) == 12
    alloc = a.allocate(1, 16, 20, hashes)
    assert alloc is not None and alloc.num_cached_tokens == 12
    assert a.block_tables[1][:3] == a.block_tables[0][:3]
    assert a.block_tables[1][3] != a.block_tables[0][3]
    assert a.snapshot().shared_saved_tokens == 12
    a.check_invariants()


def test_freed_cached_blocks_stay_reusable_until_evicted_tail_first():
    bs = 4
    a = PagedAllocator(num_blocks=4, block_size=bs, enable_prefix_caching=True)
    hashes = block_hashes([1, 2, 3, 4], 4, bs, 16)
    a.allocate(0, 16, 16, hashes)
    table = list(a.block_tables[0])
    a.free(0)
    assert a.num_free_blocks() == 4 and a.num_cached_blocks() == 4
    # a new unrelated 4-token sequence evicts exactly one cached block: the tail of the freed one
    a.allocate(1, 4, 4)
    assert a.block_tables[1] == [table[3]]
    assert a.num_evictions == 1
    # the prefix is still cached: 3 blocks hit
    assert a.lookup(hashes, 16) == 12
    a.check_invariants()


def test_uncached_free_blocks_are_used_before_evicting():
    a = PagedAllocator(num_blocks=6, block_size=4, enable_prefix_caching=True)
    hashes = block_hashes([1, 2], 4, 4, 8)
    a.allocate(0, 8, 8, hashes)
    a.free(0)
    a.allocate(1, 16, 16)  # 4 blocks: the 4 never-cached ones first
    assert a.num_evictions == 0
    assert a.lookup(hashes, 9) == 8
    a.check_invariants()


def test_block_hashes_chain_and_granularity():
    # same ids -> same hashes; a different earlier id changes every later block
    h1 = block_hashes([5, 6, 7], 512, 16, 1536)
    assert len(h1) == 96
    h2 = block_hashes([5, 6, 8], 512, 16, 1536)
    assert h1[:64] == h2[:64] and h1[64] != h2[64]
    h3 = block_hashes([9, 6, 7], 512, 16, 1536)
    assert not set(h1) & set(h3)
    # a block size larger than the id granularity covers several ids
    big = block_hashes([1, 2, 3, 4], 16, 32, 64)
    assert len(big) == 2
    assert block_hashes([1, 2, 3, 4], 16, 32, 64) == big
    # only full blocks inside both the prompt and the named prefix
    assert len(block_hashes([1, 2], 512, 16, 700)) == 700 // 16
    assert block_hashes([], 512, 16, 700) == ()
    # a block size that neither divides nor is divided by the granularity
    odd = block_hashes([1, 2, 3], 16, 24, 48)
    assert len(odd) == 2


def test_snapshot_parts_sum_to_capacity():
    a = PagedAllocator(num_blocks=10, block_size=8)
    a.allocate(0, 13, 30)
    a.allocate(1, 5, 6)
    s = a.snapshot()
    parts = (s.token_state, s.reserved, s.internal_fragmentation, s.external_fragmentation, s.free)
    assert sum(parts) == s.capacity_tokens == 80
    assert s.token_state == 18
    assert s.reserved == 3 + 1  # seq 0 will fill its 16 slots; seq 1 writes one more
    assert s.internal_fragmentation == 2  # seq 1 ends at 6 of 8 slots
    assert sum(s.fractions().values()) == pytest.approx(1.0)


def test_bad_construction():
    with pytest.raises(ValueError, match="block_size"):
        PagedAllocator(num_blocks=4, block_size=0)
    with pytest.raises(ValueError, match="num_blocks"):
        PagedAllocator(num_blocks=-1, block_size=16)
