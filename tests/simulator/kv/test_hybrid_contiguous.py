"""Contiguous reservations per KV cache group (simulator/kv/hybrid_contiguous.py): region sizes
by hand, a sliding group's ring, token state equal to the hybrid paged allocator's on the same
operations, random operation sequences with the invariants checked after every step, and the
deployment's choice of allocator."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simulator.config.deployment import build_deployment
from simulator.kv.allocator import AllocFailure
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.hybrid import HybridPagedAllocator
from simulator.kv.hybrid_contiguous import HybridContiguousAllocator
from simulator.kv.model_config import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
)
from simulator.kv.sizing import HybridKVLayout, KVCacheGroup
from simulator.config.scenario import parse_scenario

B = 4  # tokens per block in every layout below
C = 20  # max_num_batched_tokens: no operation below declares more than this past the computed


def _layout(*groups: tuple[str, int | None]) -> HybridKVLayout:
    return HybridKVLayout(tuple(KVCacheGroup(kind, 2, window) for kind, window in groups),
                          group_size=2, block_size=B, page_bytes=B * 64, state_bytes=0)


FULL = (FULL_ATTENTION, None)
LAYOUTS = {
    "sliding": _layout(FULL, (SLIDING_ATTENTION, 8)),
    "chunked": _layout(FULL, (CHUNKED_ATTENTION, 8)),
    "linear": _layout(FULL, (LINEAR_ATTENTION, None), (LINEAR_ATTENTION, None)),
    "sliding-linear": _layout((SLIDING_ATTENTION, 6), (LINEAR_ATTENTION, None)),
}


def _contiguous(layout: HybridKVLayout, num_blocks: int = 200, policy: str = "max",
                max_model_len: int = 100) -> HybridContiguousAllocator:
    return HybridContiguousAllocator(num_blocks, layout, policy=policy,  # type: ignore[arg-type]
                                     max_model_len=max_model_len, max_num_batched_tokens=C)


def test_region_holds_each_group_share() -> None:
    alloc = _contiguous(LAYOUTS["sliding"], policy="oracle")
    # sliding W 8: B · (ceil((8 − 1 + 20) / 4) + 1) = 4 · 8 = 32 slots at most
    assert alloc.reservation(3, 10) == 10 + 10  # L = 10 < 32: the window group holds it all
    assert alloc.reservation(3, 90) == 90 + 32
    # admitted with 50 tokens (a swap-in): ceil(50 / 4) · 4 = 52 in the window group, ≤ L
    assert alloc.reservation(50, 90) == 90 + 52
    assert alloc.reservation(50, 51) == 51 + 51
    chunked = _contiguous(LAYOUTS["chunked"], policy="max")
    assert chunked.reservation(3, 10) == 100 + 4 * 7  # ceil((8 + 20) / 4) = 7 blocks
    linear = _contiguous(LAYOUTS["linear"], policy="pow2")
    assert linear.reservation(3, 10) == 16 + 2 * B  # each state takes one page
    alloc.allocate(0, 3, 90)
    assert alloc.region(0) == (0, 122)
    assert alloc.allocated_tokens(0) == 90


def test_sliding_ring_decoding_token_by_token() -> None:
    """A sequence growing at block boundaries never outgrows its 32-slot ring, and its token
    state is the written tokens in the full group plus those after the skipped blocks."""
    alloc = _contiguous(LAYOUTS["sliding"])
    assert alloc.allocate(0, 4, 100) is not None
    written = 4
    while written < 100:  # as the scheduler: told the written count right after each append
        written += alloc.tokens_until_append(0, written)
        assert written % B == 0 or written == 100
        if written == 100:
            break
        assert alloc.append(0, written + 1) is not None
        alloc.check_invariants()
        if written == 20:  # 21 declared; computed: the 17 declared before (told 16), so
            # 17 − 8 + 1 = 10 tokens skipped = 2 blocks
            snap = alloc.snapshot(num_written_tokens=21)
            assert snap.token_state == 21 + (21 - 2 * B)
            # reserved: min(100, 100) + min(32, 100) slots will be written, less the state
            assert snap.reserved == 100 + 32 - snap.token_state
            assert snap.internal_fragmentation == 0
    snap = alloc.snapshot(num_written_tokens=100)
    # at the last append (97 declared, 93 computed): 86 skipped tokens = 21 blocks
    assert snap.token_state == 100 + (100 - 21 * B)


def test_outgrowing_the_ring_is_refused() -> None:
    alloc = _contiguous(LAYOUTS["sliding"])
    alloc.allocate(0, 4, 100)
    # 40 tokens past the 4 computed: more live tokens than the 32-slot ring (over C)
    assert alloc.append(0, 44) is None
    assert alloc.last_failure is AllocFailure.RESERVATION_EXCEEDED
    assert alloc.num_tokens[0] == 4
    assert alloc.append(0, 24) is not None  # 20 past: within the bound
    assert alloc.append(0, 101) is None  # past max_model_len


def test_external_fragmentation_on_the_shared_pool() -> None:
    # 48 slots; max policy, max_model_len 10: each region 10 + 10 = 20 slots
    alloc = _contiguous(LAYOUTS["sliding"], num_blocks=12, max_model_len=10)
    for seq in range(2):
        assert alloc.allocate(seq, 2, 10) is not None
    alloc.free(0)  # a 20-slot hole at 0 fits a region; the 8 free at the end do not
    assert alloc.external_fragmentation((2, 10)) == 8
    alloc.allocate(2, 2, 10)  # fills the hole: 8 free slots, too few for a region
    assert alloc.num_free_tokens() == 8
    assert not alloc.can_allocate(2, 10)
    alloc.free(1)  # holes of 20 (at 20) and 8 (at 40) coalesce into 28
    assert alloc.num_holes() == 1 and alloc.largest_hole() == 28
    alloc.allocate(3, 2, 10)  # 8 left
    alloc.free(2)  # holes 20 at 0 and 8 at 40: a head needing 2 regions finds room for one
    assert alloc.external_fragmentation((2, 10, 2)) == 28
    assert alloc.external_fragmentation((2, 10)) == 8


# ------------------------------------------------------------------ same run, same token state
OPS = st.lists(st.tuples(st.sampled_from(["alloc", "append", "lazy", "free"]),
                         st.integers(0, 7), st.integers(1, 40), st.integers(0, 40)),
               max_size=60)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_token_state_matches_the_paged_allocator(name: str, ops: list) -> None:
    """The same operations (grow before write, at most C tokens past the computed ones, lazy
    writes up to what the allocator allows) replayed into both allocators: equal token state at
    every step."""
    layout = LAYOUTS[name]
    paged = HybridPagedAllocator(1000, layout)
    contiguous = _contiguous(layout, num_blocks=1000)
    written: dict[int, int] = {}
    final: dict[int, int] = {}
    for op, pick, n, extra in ops:
        live = sorted(written)
        if op == "alloc" and len(written) < 6:  # 6 × (100 + 32) slots fit the contiguous pool
            seq = max(written, default=-1) + 1
            assert paged.allocate(seq, n, n + extra) is not None
            assert contiguous.allocate(seq, n, n + extra) is not None
            written[seq], final[seq] = n, n + extra
        elif live and op != "alloc":
            seq = live[pick % len(live)]
            if op == "append":
                target = min(written[seq] + min(n, C), final[seq])
                if target > written[seq]:
                    assert paged.append(seq, target) is not None
                    assert contiguous.append(seq, target) is not None
                    written[seq] = target
            elif op == "lazy":  # both are told; the paged allocator's room (its next block) is used
                room = paged.tokens_until_append(seq, written[seq])
                assert contiguous.tokens_until_append(seq, written[seq]) >= room
                written[seq] = min(written[seq] + room, final[seq])
            else:
                paged.free(seq)
                contiguous.free(seq)
                del written[seq], final[seq]
        contiguous.check_invariants()
        total = sum(written.values())
        assert (contiguous.snapshot(num_written_tokens=total).token_state
                == paged.snapshot(num_written_tokens=total).token_state)


# ------------------------------------------------------------------ random operation sequences
class HybridContiguousMachine(RuleBasedStateMachine):
    """The scheduler's contract against one layout and policy; invariants after every step."""

    layout: HybridKVLayout
    policy: str

    @initialize()
    def setup(self) -> None:
        self.alloc = _contiguous(self.layout, num_blocks=60, policy=self.policy, max_model_len=80)
        self.written: dict[int, int] = {}
        self.final: dict[int, int] = {}
        self.next_id = 0

    @rule(num_tokens=st.integers(1, 60), extra=st.integers(0, 30))
    def allocate(self, num_tokens: int, extra: int) -> None:
        final = min(num_tokens + extra, 80)
        expected = self.alloc.can_allocate(num_tokens, final)
        seq, self.next_id = self.next_id, self.next_id + 1
        result = self.alloc.allocate(seq, num_tokens, final)
        assert (result is not None) == expected
        if result is not None:
            assert self.alloc.allocated_tokens(seq) >= final
            self.written[seq], self.final[seq] = num_tokens, final

    @precondition(lambda self: self.written)
    @rule(data=st.data(), k=st.integers(1, C))
    def append(self, data: st.DataObject, k: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.written)))
        target = min(self.written[seq] + k, self.final[seq])
        if target > self.written[seq]:  # within the reservation and C: never refused
            assert self.alloc.append(seq, target) is not None
            self.written[seq] = target

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def write_lazily(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.written)))
        room = self.alloc.tokens_until_append(seq, self.written[seq])
        assert room >= 0
        self.written[seq] = min(self.written[seq] + room, self.final[seq])

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(sorted(self.written)))
        child, self.next_id = self.next_id, self.next_id + 1
        if self.alloc.fork(parent, child, self.written[parent]) is not None:
            self.written[child], self.final[child] = self.written[parent], self.final[parent]

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.written)))
        self.alloc.free(seq)
        del self.written[seq], self.final[seq]

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "alloc"):
            return
        self.alloc.check_invariants()
        assert set(self.alloc.num_tokens) == set(self.written)
        snap = self.alloc.snapshot(num_written_tokens=sum(self.written.values()))
        parts = (snap.token_state, snap.reserved, snap.internal_fragmentation,
                 snap.external_fragmentation, snap.free)
        assert all(p >= 0 for p in parts), snap
        assert sum(parts) == snap.capacity_tokens == 60 * B


def _machine(name: str, layout: str, policy: str) -> type:
    cls = type(name, (HybridContiguousMachine,), {"layout": LAYOUTS[layout], "policy": policy})
    cls.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
    return cls.TestCase


TestSlidingMax = _machine("SlidingMax", "sliding", "max")
TestSlidingOracle = _machine("SlidingOracle", "sliding", "oracle")
TestChunkedPow2 = _machine("ChunkedPow2", "chunked", "pow2")
TestLinearOracle = _machine("LinearOracle", "linear", "oracle")
TestSlidingLinearMax = _machine("SlidingLinearMax", "sliding-linear", "max")


# ------------------------------------------------------------------ the deployment's choice
def _deployment(model: str, allocators: list[str]):  # noqa: ANN202
    scenario = parse_scenario({
        "name": "hybrid-contiguous", "model": model, "gpu": "h100", "allocators": allocators,
        "max_model_len": 4096, "max_num_batched_tokens": 2048, "num_gpu_blocks_override": 3000,
        "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 100},
                     "output_tokens": {"dist": "fixed", "value": 20}},
    }, "hybrid-contiguous")
    return build_deployment(scenario, Path("."))


def test_deployment_reserves_per_group_for_a_hybrid_model() -> None:
    dep = _deployment("gpt-oss-20b", ["paged", "contiguous-max"])
    groups = dep.capacity.kv_groups
    assert groups is not None  # sized by the hybrid manager although a contiguous run is listed
    alloc = dep.make_allocator("contiguous-max")
    assert isinstance(alloc, HybridContiguousAllocator)
    # the 3,000 overridden blocks less vLLM V1's null block (Deployment.usable_blocks)
    assert dep.num_blocks == 3000 and dep.usable_blocks == 3000 - 1
    assert alloc.capacity_tokens == dep.make_allocator("paged").capacity_tokens == (3000 - 1) * 16
    # 1 full + 1 sliding group (W 128): 4,096 + 16 · (ceil((127 + 2,048) / 16) + 1) = 4,096 + 2,192
    assert alloc.reservation(100, 120) == 4096 + 2192


def test_deployment_keeps_the_plain_allocator_for_full_attention() -> None:
    dep = _deployment("llama-3.1-8b", ["paged", "contiguous-max"])
    assert dep.capacity.kv_groups is None
    assert type(dep.make_allocator("contiguous-max")) is ContiguousAllocator
