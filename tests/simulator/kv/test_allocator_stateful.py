"""Random operation sequences against every allocator, with check_invariants() after every step.

The model tracks, per live sequence, the tokens written and the final length; operations follow
the scheduler's contract (grow before write, lazy writes inside the allocated capacity, fork at the
current length). After every step: the allocator's own invariants, the snapshot's parts are
non-negative and sum to the pool, and the allocator agrees with the model.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.kv.prefix import block_hashes

PREFIX_GROUPS = [(), (1, 2, 3, 4), (1, 2, 9, 9), (7, 7, 7, 7, 7, 7)]  # shared leading runs
GRANULARITY = 8


class AllocatorMachine(RuleBasedStateMachine):
    make_allocator = None  # set by subclasses

    @initialize()
    def setup(self):
        self.alloc = self.make_allocator()
        self.generation = 0
        self.written: dict[int, int] = {}
        self.final: dict[int, int] = {}
        self.next_id = 0

    def _block_size(self):
        return getattr(self.alloc, "block_size", 1)

    @rule(num_tokens=st.integers(1, 60), extra=st.integers(0, 40), group=st.integers(0, 3))
    def allocate(self, num_tokens, extra, group):
        final = num_tokens + extra
        hashes = block_hashes(PREFIX_GROUPS[group], GRANULARITY, self._block_size(), num_tokens)
        expected = self.alloc.can_allocate(num_tokens, final, hashes)
        seq = self.next_id
        self.next_id += 1
        result = self.alloc.allocate(seq, num_tokens, final, hashes)
        assert (result is not None) == expected
        if result is not None:
            assert result.num_cached_tokens < num_tokens
            assert self.alloc.allocated_tokens(seq) >= num_tokens
            self.written[seq] = num_tokens
            self.final[seq] = final

    @precondition(lambda self: self.written)
    @rule(data=st.data(), k=st.integers(1, 20))
    def append(self, data, k):
        seq = data.draw(st.sampled_from(sorted(self.written)))
        target = min(self.written[seq] + k, self.final[seq])
        if target <= self.written[seq]:
            return
        before = self.alloc.allocated_tokens(seq)
        result = self.alloc.append(seq, target)
        if result is None:
            assert self.alloc.allocated_tokens(seq) == before
            return
        for src, dst in result.copies:
            assert src != dst
        assert self.alloc.allocated_tokens(seq) >= target
        self.written[seq] = target

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def write_lazily(self, data):
        """Write tokens without telling the allocator, as far as it allows."""
        seq = data.draw(st.sampled_from(sorted(self.written)))
        room = self.alloc.tokens_until_append(seq, self.written[seq])
        assert room >= 0
        self.written[seq] = min(self.written[seq] + room, self.final[seq])

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.written)))
        child = self.next_id
        self.next_id += 1
        result = self.alloc.fork(parent, child, self.written[parent])
        if result is not None:
            self.written[child] = self.written[parent]
            self.final[child] = self.final[parent]

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.written)))
        self.alloc.free(seq)
        del self.written[seq], self.final[seq]

    @invariant()
    def consistent(self):
        if not hasattr(self, "alloc"):
            return
        self.alloc.check_invariants()
        assert set(self.alloc.num_tokens) == set(self.written)
        snap = self.alloc.snapshot(num_written_tokens=sum(self.written.values()))
        parts = (snap.token_state, snap.reserved, snap.internal_fragmentation,
                 snap.external_fragmentation, snap.free)
        assert all(p >= 0 for p in parts), snap
        assert sum(parts) == snap.capacity_tokens
        assert snap.shared_saved_tokens >= 0
        # the prefix-cache generation only moves forward, and only with a prefix cache
        assert self.alloc.cache_generation >= self.generation
        if not getattr(self.alloc, "enable_prefix_caching", False):
            assert self.alloc.cache_generation == 0
        self.generation = self.alloc.cache_generation
        assert 0 <= self.alloc.free_blocks_for_growth() <= self.alloc.num_free_tokens()


def _machine(name, factory):
    cls = type(name, (AllocatorMachine,), {"make_allocator": staticmethod(factory)})
    cls.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    return cls.TestCase


TestPaged = _machine("Paged", lambda: PagedAllocator(24, 4))
TestPagedBlock1 = _machine("PagedBlock1", lambda: PagedAllocator(90, 1, enable_prefix_caching=True))
TestPagedPrefix = _machine("PagedPrefix", lambda: PagedAllocator(24, 4, enable_prefix_caching=True))
TestPagedPrefix16 = _machine("PagedPrefix16", lambda: PagedAllocator(8, 16, enable_prefix_caching=True))
TestContiguousMax = _machine("ContiguousMax", lambda: ContiguousAllocator(300, policy="max", max_model_len=100))
TestContiguousPow2 = _machine("ContiguousPow2", lambda: ContiguousAllocator(300, policy="pow2", max_model_len=100))
TestContiguousOracle = _machine(
    "ContiguousOracle", lambda: ContiguousAllocator(300, policy="oracle", max_model_len=100)
)
