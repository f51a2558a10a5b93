"""tests/simulator/kv/test_allocator_stateful.py's random operation sequences, on paged pools
with a small CPU offload tier: check_invariants() (the tier's size bound and store indexes
included) after every step, and the tier's own contracts:

* an allocation caches what ``lookup`` said just before, and what it did not find in HBM
  (``num_hit_blocks``) it loaded (``take_loaded_blocks``);
* ``lookup`` gives the same answer while ``cache_generation`` stays (the schedulers keep a
  lookup until it moves), the tier's drops and stores included.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from simulator.kv.paged import PagedAllocator
from simulator.kv.prefix import block_hashes

from tests.simulator.kv.test_allocator_stateful import GRANULARITY, PREFIX_GROUPS, AllocatorMachine

PROBES = [(group, n) for group in range(1, len(PREFIX_GROUPS)) for n in (9, 25, 49)]


class OffloadMachine(AllocatorMachine):
    @rule(num_tokens=st.integers(1, 60), extra=st.integers(0, 40), group=st.integers(1, 3))
    def allocate_with_lookup(self, num_tokens, extra, group):
        """An admission as the schedulers make it: lookup, then allocate."""
        hashes = block_hashes(PREFIX_GROUPS[group], GRANULARITY, self.alloc.block_size, num_tokens)
        found = self.alloc.lookup(hashes, num_tokens)
        hbm_before = self.alloc.num_hit_blocks
        assert self.alloc.take_loaded_blocks() == 0  # every rule takes them
        seq = self.next_id
        self.next_id += 1
        result = self.alloc.allocate(seq, num_tokens, num_tokens + extra, hashes)
        loaded = self.alloc.take_loaded_blocks()
        if result is None:
            assert loaded == 0
            return
        assert result.num_cached_tokens == found
        hbm = self.alloc.num_hit_blocks - hbm_before
        assert (hbm + loaded) * self.alloc.block_size == found
        self.written[seq] = num_tokens
        self.final[seq] = num_tokens + extra

    @invariant()
    def lookups_stay_while_the_generation_does(self):
        if not hasattr(self, "alloc"):
            return
        self.alloc.take_loaded_blocks()  # the plain allocate rule's loads
        seen = getattr(self, "seen", {})
        for group, n in PROBES:
            hashes = block_hashes(PREFIX_GROUPS[group], GRANULARITY, self.alloc.block_size, n)
            now = (self.alloc.cache_generation, self.alloc.lookup(hashes, n))
            before = seen.get((group, n))
            if before is not None and before[0] == now[0]:
                assert before[1] == now[1], (group, n, before, now)
            seen[(group, n)] = now
        self.seen = seen


def _machine(name, factory):
    cls = type(name, (OffloadMachine,), {"make_allocator": staticmethod(factory)})
    cls.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    return cls.TestCase


# small HBM pools: prefixes are evicted there and found in the tier
TestOffload = _machine("Offload", lambda: PagedAllocator(10, 4, enable_prefix_caching=True, offload_blocks=6))
TestOffloadTiny = _machine("OffloadTiny",
                           lambda: PagedAllocator(12, 4, enable_prefix_caching=True, offload_blocks=1))
TestOffload16 = _machine("Offload16",
                         lambda: PagedAllocator(8, 16, enable_prefix_caching=True, offload_blocks=3))
TestOffloadBlock1 = _machine("OffloadBlock1",
                             lambda: PagedAllocator(90, 1, enable_prefix_caching=True, offload_blocks=40))
