"""``grow``: a block-boundary growth and the room to the next boundary in one call.

The simulator's scheduler grows every single-sequence group through ``grow`` (simulator/scheduler/
core.py, ``_grow`` and ``advance_quiet``); it must leave the allocator exactly as ``append``
would and answer what ``tokens_until_append`` would answer after it.
"""

import random

import pytest

from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.kv.prefix import block_hashes


def _state(a: PagedAllocator) -> tuple:
    """Everything a later operation or a snapshot can observe."""
    return (a.block_tables, a.ref_count, a.fill, a.block_hash, a._free, a.evictable_blocks(), a._num_cached_free,
            a._cache, a.num_tokens, a._hash_due, a.num_evictions, a.cache_generation,
            a.snapshot_parts())


def test_boundary_takes_one_block_and_answers_its_room():
    a = PagedAllocator(4, 4)
    a.allocate(0, 8, 20)  # blocks 0, 1: full
    assert a.grow(0, 9) == 4  # block 2; positions 8 .. 11 are writable without a call
    assert a.block_table(0) == (0, 1, 2)
    assert a.tokens_until_append(0, 8) == 4
    assert a.fill[1] == 4 and a.fill[2] == 1
    # 9 tokens declared; 12 slots allocated, all of them below the final 20: reserved 12 - 9
    assert a.snapshot_parts() == (9, 3, 0, 0, 4, 0)
    a.check_invariants()


def test_growth_past_the_final_length_counts_only_the_useful_slots():
    a = PagedAllocator(4, 4)
    a.allocate(0, 4, 6)
    assert a.grow(0, 5) == 4
    assert a._sum_useful == 6  # min(8 allocated, 6 final)
    a.check_invariants()


def test_full_pool_returns_none_and_changes_nothing():
    a = PagedAllocator(2, 4)
    a.allocate(0, 8, 12)
    before = repr(_state(a))
    assert a.grow(0, 9) is None
    assert repr(_state(a)) == before


def test_full_pool_evicts_the_oldest_cached_block():
    a = PagedAllocator(3, 2, enable_prefix_caching=True)
    hashes = block_hashes((1, 2, 3, 4), 1, 2, 4)
    a.allocate(0, 4, 4, hashes)  # two full blocks, both cached under their hashes
    a.free(0)  # tail first: block 1 then block 0 on the evictable list
    a.allocate(1, 2, 6)  # takes the plain free block 2
    assert a.grow(1, 3) == 2
    assert a.block_table(1) == (2, 1)  # block 1, freed first, is evicted first
    assert a.num_evictions == 1 and a.num_cached_blocks() == 1
    a.check_invariants()


def test_shared_partial_last_block_is_refused():
    a = PagedAllocator(8, 4)
    a.allocate(0, 6, 10)
    a.fork(0, 1, 6)  # block 1 (2 of 4 slots) is shared
    with pytest.raises(ValueError, match="use append"):
        a.grow(1, 7)


def test_contiguous_default_answers_its_region():
    c = ContiguousAllocator(1000, policy="oracle", max_model_len=100)
    c.allocate(0, 10, 50)
    assert c.grow(0, 11) == c.tokens_until_append(0, 10) == 40


@pytest.mark.parametrize("seed", range(40))
def test_grow_equals_append_then_tokens_until_append(seed):
    """Seeded random workloads (prefix caching, hashes registered by growth, evictions on a full
    pool, forks): each unforked sequence's boundary goes through ``grow`` on one allocator and
    ``append`` + ``tokens_until_append`` on a twin; both must stay identical."""
    rng = random.Random(seed)
    num_blocks, bs = rng.choice([(12, 4), (30, 2), (20, 3), (40, 1)])
    caching = rng.random() < 0.7
    a = PagedAllocator(num_blocks, bs, enable_prefix_caching=caching)
    b = PagedAllocator(num_blocks, bs, enable_prefix_caching=caching)
    written: dict[int, int] = {}
    forked: set[int] = set()
    next_id = 0
    for _ in range(300):
        live = sorted(written)
        k = rng.random()
        if k < 0.15 or not live:
            n = rng.randint(1, 12)
            hashes = block_hashes((rng.randrange(3), 5, 6, 7, 8, 9), 1, bs, n + rng.randint(0, 8))
            ra, rb = a.allocate(next_id, n, n + 20, hashes), b.allocate(next_id, n, n + 20, hashes)
            assert ra == rb
            if ra is not None:
                written[next_id] = n
            next_id += 1
        elif k < 0.25:
            s = rng.choice(live)
            a.free(s)
            b.free(s)
            del written[s]
            forked.discard(s)
        elif k < 0.3:
            s = rng.choice(live)
            assert a.fork(s, next_id, written[s]) == b.fork(s, next_id, written[s])
            written[next_id] = written[s]
            forked |= {s, next_id}
            next_id += 1
        else:
            s = rng.choice(live)
            n = written[s]
            room = b.tokens_until_append(s, n)
            assert room == a.tokens_until_append(s, n)
            if room > 0:
                written[s] = n + room  # write up to the boundary without a call
                continue
            if s in forked:
                ra, rb = a.append(s, n + 1), b.append(s, n + 1)
                assert ra == rb
            else:
                got = a.grow(s, n + 1)
                rb = b.append(s, n + 1)
                assert (got is None) == (rb is None)
                if got is not None:
                    assert rb.copies == ()
                    assert got == b.tokens_until_append(s, n) > 0
            if rb is not None:
                written[s] = n + 1
        assert _state(a) == _state(b)
    a.check_invariants()
