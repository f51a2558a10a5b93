"""Which block the paged allocator reuses is vLLM V1's choice.

:class:`VllmPool` below is vLLM's ``BlockPool`` as its source reads, written the plain way
(vllm/v1/core/block_pool.py: ``get_new_blocks`` pops the free queue's head and evicts the
popped block's hash, ``free_blocks`` appends the blocks whose count reaches 0, ``touch``
takes a hit block out of the queue; vllm/v1/core/kv_cache_utils.py ``FreeKVCacheBlockQueue``
holds block ids in order at start; vllm/v1/core/single_type_kv_cache_manager.py ``free``
releases a request's blocks in reverse; ``find_longest_cache_hit`` takes the leading cached
blocks, at most ``(prompt − 1) // block_size``). Random operation sequences drive it and
:class:`PagedAllocator` side by side; after every operation the block tables, the hits and the
free blocks (in reuse order) must agree. Named blocks are the workload's (trace hash ids): vLLM
names every full block, but a block whose content nothing else shares is never hit, so naming
it changes no block id (simulator/kv/paged.py, "Which free block is reused").
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.kv.paged import PagedAllocator

BS = 4


class VllmPool:
    """vLLM 0.33.0's BlockPool and one full-attention manager, literally (lists, linear scans).
    Sequences are finished when freed: every block they hold is written (the final length)."""

    def __init__(self, num_blocks: int):
        self.free_queue = list(range(num_blocks))  # FreeKVCacheBlockQueue: head first
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block (cached_block_hash_to_block)
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, int] = {}
        self.hashes: dict[int, tuple[int, ...]] = {}
        self.caching = True
        self.evictions = 0  # of named blocks: the workload's hashes
        self._anonymous = 0

    def get_new_blocks(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = self.free_queue.pop(0)  # popleft
            h = self.block_hash[b]
            if h is not None:  # _maybe_evict_cached_block
                if h in self.cached and self.cached[h] == b:
                    del self.cached[h]
                self.block_hash[b] = None
                self.evictions += h >= 0
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def hits(self, hashes: tuple[int, ...], num_tokens: int) -> list[int]:
        out = []
        for h in hashes[: max(num_tokens - 1, 0) // BS]:
            if h not in self.cached:
                break
            out.append(self.cached[h])
        return out

    def allocate(self, seq: int, num_tokens: int, hashes: tuple[int, ...]) -> int | None:
        hits = self.hits(hashes, num_tokens)
        need = -(-num_tokens // BS)
        free_hits = sum(1 for b in hits if self.ref_cnt[b] == 0)
        if need - len(hits) + free_hits > len(self.free_queue):
            return None
        for b in hits:  # touch
            if self.ref_cnt[b] == 0:
                self.free_queue.remove(b)
            self.ref_cnt[b] += 1
        self.tables[seq] = hits + self.get_new_blocks(need - len(hits))
        self.tokens[seq] = num_tokens
        self.hashes[seq] = hashes
        self._cache_full(seq)
        return len(hits) * BS

    def grow(self, seq: int, num_tokens: int) -> bool:
        extra = -(-num_tokens // BS) - len(self.tables[seq])
        if extra > len(self.free_queue):
            return False
        self.tables[seq] += self.get_new_blocks(max(extra, 0))
        self.tokens[seq] = max(self.tokens[seq], num_tokens)
        self._cache_full(seq)
        return True

    def _cache_full(self, seq: int) -> None:
        """cache_full_blocks: every full block gets a hash — the workload's name where it has
        one (a name already cached stays with its first block; the block gets a hash of its
        own), else one of its own (negative: never looked up)."""
        if not self.caching:
            return
        table, hashes = self.tables[seq], self.hashes[seq]
        for i in range(self.tokens[seq] // BS):
            b = table[i]
            if self.block_hash[b] is not None:
                continue
            if i < len(hashes) and hashes[i] not in self.cached:
                self.cached[hashes[i]] = b
                self.block_hash[b] = hashes[i]
            else:
                self._anonymous -= 1
                self.block_hash[b] = self._anonymous

    def free(self, seq: int, final: int) -> None:
        self.tokens[seq] = final  # written to the end
        self._cache_full(seq)
        first, last = [], []
        for b in reversed(self.tables.pop(seq)):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                (first if self.block_hash[b] is None or not self.caching else last).append(b)
        self.free_queue[:0] = first  # prepend_n
        self.free_queue += last  # append_n
        del self.tokens[seq], self.hashes[seq]


PREFIXES = [(), (1, 2, 3), (1, 2, 3, 4, 5, 6), (1, 2, 7, 8), (9, 10, 11, 12, 13, 14, 15, 16)]

operations = st.lists(
    st.tuples(st.sampled_from(["allocate", "grow", "free"]), st.integers(0, 10**6),
              st.integers(1, 40), st.sampled_from(range(len(PREFIXES)))),
    min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(4, 40), caching=st.booleans(), ops=operations)
def test_the_blocks_handed_out_are_vllms(num_blocks: int, caching: bool, ops) -> None:
    ours = PagedAllocator(num_blocks, BS, enable_prefix_caching=caching)
    ref = VllmPool(num_blocks)
    ref.caching = caching
    final: dict[int, int] = {}
    next_seq = 0
    for kind, pick, size, prefix in ops:
        live = sorted(ref.tables)
        if kind == "allocate" or not live:
            hashes = PREFIXES[prefix] if caching else ()
            final[next_seq] = size + pick % 40  # what the sequence holds when it finishes
            got = ours.allocate(next_seq, size, final[next_seq], hashes)
            want = ref.allocate(next_seq, size, hashes)
            assert (got.num_cached_tokens if got else None) == want
            next_seq += 1
        elif kind == "grow":
            seq = live[pick % len(live)]
            n = min(ref.tokens[seq] + size, final[seq])
            assert (ours.append(seq, n) is not None) == ref.grow(seq, n)
        else:
            seq = live[pick % len(live)]
            if ref.tokens[seq] < final[seq]:  # it finishes first: written to its final length
                assert (ours.append(seq, final[seq]) is not None) == ref.grow(seq, final[seq])
            if ref.tokens[seq] == final[seq]:
                ours.free(seq)
                ref.free(seq, final[seq])
        assert {s: list(ours.block_table(s)) for s in ours.block_tables} == ref.tables
        assert [*reversed(ours._free), *ours.evictable_blocks()] == ref.free_queue
        assert ours.num_evictions == ref.evictions
        ours.check_invariants()
