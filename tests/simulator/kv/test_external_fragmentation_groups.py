"""External fragmentation seen by a request that brings several sequences (n samples, beams).

Without shared memory every sequence of a group needs its own region, and admission gives back
all of them when one does not fit: free memory with room for fewer regions than the group needs
is memory the head of the queue cannot use, and the snapshot must say so (not call it free).
"""

from __future__ import annotations

from simulator.kv.contiguous import ContiguousAllocator
from simulator.scheduler import Scheduler, SchedulerConfig
from workloads.request import Request


def _pool_with_one_hole_of(free_tokens: int, region_tokens: int) -> ContiguousAllocator:
    """A max-policy pool of ``3 × region_tokens + free_tokens`` slots, three regions placed:
    one hole of ``free_tokens`` at the end."""
    alloc = ContiguousAllocator(3 * region_tokens + free_tokens, policy="max", max_model_len=region_tokens)
    for seq in range(3):
        assert alloc.allocate(seq, 1, 1) is not None
    return alloc


def test_a_hole_that_takes_every_region_is_not_fragmentation():
    alloc = _pool_with_one_hole_of(40, 20)  # room for two 20-slot regions
    for head in ((5, 10), (5, 10, 1), (5, 10, 2)):
        snap = alloc.snapshot(head=head)
        assert (snap.external_fragmentation, snap.free) == (0, 40), head


def test_a_hole_too_small_for_all_regions_is_unusable_for_the_group():
    alloc = _pool_with_one_hole_of(40, 20)
    snap = alloc.snapshot(head=(5, 10, 3))  # three regions of 20, room for two
    assert (snap.external_fragmentation, snap.free) == (40, 0)
    # what the accounting claims is what admission finds: the third region does not fit
    assert alloc.allocate(10, 5, 10) is not None and alloc.fork(10, 11, 5) is not None
    assert alloc.fork(10, 12, 5) is None


def test_small_holes_beside_a_big_enough_one_stay_fragmentation():
    alloc = ContiguousAllocator(100, policy="oracle", max_model_len=100)
    for seq, size in enumerate((10, 5, 10, 75)):
        alloc.allocate(seq, size, size)
    alloc.free(1)  # a 5-slot hole
    alloc.free(3)  # a 75-slot hole at the end
    assert alloc.snapshot(head=(30, 30, 2)).external_fragmentation == 5  # 75 holds two of 30
    assert alloc.snapshot(head=(30, 30, 3)).external_fragmentation == 80  # not three: all of it


def test_the_scheduler_reports_the_group_size_at_the_head():
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=16, block_size=4)
    alloc = ContiguousAllocator(76, policy="max", max_model_len=16)  # four 16-slot regions fit
    sched = Scheduler(alloc, cfg)
    sched.add_request(Request(0, 0.0, 6, 4))  # one region
    sched.add_request(Request(1, 0.0, 6, 4, n=4))  # four regions, room for three beside it: waits
    sched.complete(sched.schedule())
    # final KV tokens: prompt + output - 1 (the last token's KV is never written)
    assert sched.head() == (6, 6 + 4 - 1, 4)
    snap = alloc.snapshot(sched.written_tokens(), sched.head())
    assert snap.free == 0 and snap.external_fragmentation == 76 - 16
