"""A preempted request's own blocks under vLLM V1: named at preemption, cached, found again.

vLLM V1 hashes every full block of a request, generated tokens included, and keeps the hashes
on the request "in case it will be preempted" (vllm/v1/core/block_pool.py,
BlockPool.cache_full_blocks); freed blocks stay cached until evicted. The simulator names a
request's own blocks only when it is preempted (PagedAllocator.cache_blocks), so ordinary
requests never pay for it. Pools of blocks of 4 tokens.
"""

from __future__ import annotations

from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig
from simulator.scheduler.v1 import V1Scheduler, own_block_hashes
from workloads.request import Request


def test_own_ids_chain_after_the_shared_ones_and_differ_per_request():
    shared = (11, 12)
    a = own_block_hashes(shared, 7, 4)
    assert a[:2] == shared and len(a) == 4 and len(set(a)) == 4
    assert own_block_hashes(a, 7, 6)[:4] == a  # extending keeps the ids already given
    assert own_block_hashes(shared, 8, 4)[2:] != a[2:]  # another request: other content
    assert own_block_hashes(a, 7, 3) is a  # nothing to add


def test_cache_blocks_keeps_the_full_blocks_findable_after_free():
    """A sequence of 10 tokens (2 full blocks + 2 tokens, its final length 11) named and freed:
    its 2 full blocks are evictable, found by lookup (capped below the last token); the partial
    one is plain free, in front (vLLM 0.33.0's BlockPool.free_blocks). Reuse order: 2, then 3, 4,
    5 (never used), then 1, 0 (freed tail first)."""
    alloc = PagedAllocator(6, 4, enable_prefix_caching=True)
    alloc.allocate(0, 10, 11)
    ids = own_block_hashes((), 0, 2)
    alloc.cache_blocks(0, ids, 10)
    alloc.check_invariants()
    assert alloc.num_cached_blocks() == 2
    alloc.free(0)
    alloc.check_invariants()
    assert (alloc.num_free_blocks(), alloc.num_cached_free_blocks()) == (6, 2)
    assert alloc.free_blocks_before_eviction(6) == 4 and alloc.free_blocks_before_eviction(3) == 3
    assert alloc.lookup(ids, 11) == 8 and alloc.lookup(ids, 8) == 4
    assert alloc.has_unreferenced_hit(ids, 11)
    got = alloc.allocate(1, 11, 12, ids)
    assert got is not None and got.num_cached_tokens == 8
    assert not alloc.has_unreferenced_hit(ids, 11)  # both hit blocks are referenced again
    alloc.check_invariants()


def test_without_prefix_caching_nothing_is_cached():
    alloc = PagedAllocator(6, 4)
    alloc.allocate(0, 10, 12)
    alloc.cache_blocks(0, own_block_hashes((), 0, 2), 10)
    alloc.free(0)
    alloc.check_invariants()
    assert alloc.num_cached_blocks() == 0 and alloc.num_cached_free_blocks() == 0
    assert alloc.num_free_blocks() == alloc.free_blocks_before_eviction(6) == 6


def test_an_unnamed_sequence_frees_in_bulk_beside_cached_blocks():
    """While the cache holds blocks, a sequence that never had block ids still frees in bulk, tail
    first (the order the per-block path would give): its full blocks join the evictable list
    after the named ones, anonymous, as vLLM 0.33.0 hashes every full block and appends it to
    the free queue's tail (BlockPool.free_blocks); the plain free list goes first."""
    alloc = PagedAllocator(8, 4, enable_prefix_caching=True)
    alloc.allocate(0, 8, 8)  # blocks 0, 1
    alloc.cache_blocks(0, own_block_hashes((), 0, 2), 8)
    alloc.free(0)  # the queue: 2 .. 7, then 1, 0 (named)
    alloc.allocate(1, 12, 12)  # the head: 2, 3, 4
    assert alloc.block_table(1) == (2, 3, 4)
    alloc.free(1)  # the queue: 5, 6, 7, 1, 0, then 4, 3, 2 (full: its final length fills them)
    alloc.check_invariants()
    assert alloc.num_cached_blocks() == 2
    assert [alloc.allocate(2 + i, 4, 4).seq_id for i in range(8)] == list(range(2, 10))
    assert [alloc.block_table(2 + i)[0] for i in range(8)] == [5, 6, 7, 1, 0, 4, 3, 2]
    assert alloc.num_evictions == 2 and alloc.num_cached_blocks() == 0


def test_ordinary_finishes_name_no_blocks():
    """Prefix caching on, requests without prefix ids, a pool that never preempts: nothing is
    ever cached."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=4,
                          engine="vllm-v1", enable_prefix_caching=True)
    alloc = PagedAllocator(64, 4, enable_prefix_caching=True)
    sched = V1Scheduler(alloc, cfg)
    for i in range(6):
        sched.add_request(Request(i, 0, 9 + i, 7))
    while sched.has_work:
        sched.complete(sched.schedule())
        assert alloc.num_cached_blocks() == 0
    assert sched.num_preemptions == 0 and sched.num_finished == 6
