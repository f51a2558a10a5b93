"""Contiguous allocator: reservation policies, first fit, coalescing, external fragmentation."""

import pytest

from simulator.kv.contiguous import ContiguousAllocator, next_pow2


@pytest.mark.parametrize(
    "policy, expected", [("max", 2048), ("pow2", 512), ("oracle", 300)]
)
def test_reservation_policies(policy, expected):
    c = ContiguousAllocator(10_000, policy=policy, max_model_len=2048)
    assert c.reservation(100, 300) == expected


def test_pow2_is_capped_and_never_below_the_prompt():
    c = ContiguousAllocator(10_000, policy="pow2", max_model_len=2048)
    assert c.reservation(100, 1500) == 2048
    assert c.reservation(5, 5) == 8
    assert next_pow2(1) == 1 and next_pow2(17) == 32 and next_pow2(32) == 32


def test_first_fit_and_coalescing():
    c = ContiguousAllocator(100, policy="oracle", max_model_len=100)
    for seq in range(4):
        c.allocate(seq, 25, 25)
    assert c.num_free_tokens() == 0
    c.free(1)
    c.free(2)  # merges with the hole of seq 1
    assert c.num_holes() == 1 and c.largest_hole() == 50
    c.allocate(9, 10, 10)
    assert c.region(9) == (25, 10)  # first fit: the lowest hole
    c.check_invariants()
    c.free(0)
    c.free(9)
    c.free(3)
    assert c.num_holes() == 1 and c.largest_hole() == 100
    c.check_invariants()


def test_external_fragmentation_is_counted():
    c = ContiguousAllocator(100, policy="oracle", max_model_len=100)
    for seq in range(4):
        c.allocate(seq, 25, 25)
    c.free(0)
    c.free(2)  # two 25-slot holes, not adjacent: 50 free
    assert c.num_free_tokens() == 50
    assert not c.can_allocate(40, 40)
    assert c.allocate(5, 40, 40) is None
    assert c.last_failure is not None and c.last_failure.name == "EXTERNAL_FRAGMENTATION"
    assert c.num_external_blocked == 1
    snap = c.snapshot(head=(40, 40))
    assert snap.external_fragmentation == 50 and snap.free == 0
    assert c.allocate(6, 60, 60) is None
    assert c.last_failure.name == "NO_SPACE"
    assert c.num_external_blocked == 1


def test_snapshot_reserved_vs_internal():
    c = ContiguousAllocator(4096, policy="pow2", max_model_len=2048)
    c.allocate(0, 100, 300)  # reserves 512
    s = c.snapshot()
    assert (s.token_state, s.reserved, s.internal_fragmentation) == (100, 200, 212)
    c.append(0, 250)
    s = c.snapshot()
    assert (s.token_state, s.reserved, s.internal_fragmentation) == (250, 50, 212)
    assert sum((s.token_state, s.reserved, s.internal_fragmentation, s.free)) == 4096


def test_fork_copies_into_a_new_region():
    c = ContiguousAllocator(1000, policy="oracle", max_model_len=1000)
    c.allocate(0, 100, 150)
    r = c.fork(0, 1, 100)
    assert r is not None and r.num_copied_tokens == 100
    assert c.num_free_tokens() == 700
    children = 1
    while c.fork(0, children + 1, 100) is not None:
        children += 1
    assert children + 1 == 1000 // 150  # no sharing: every sample holds a full private region
    c.check_invariants()


def test_growth_beyond_reservation_fails():
    c = ContiguousAllocator(1000, policy="oracle", max_model_len=1000)
    c.allocate(0, 10, 12)
    assert c.append(0, 12) is not None
    assert c.append(0, 13) is None
    assert c.tokens_until_append(0, 12) == 0
