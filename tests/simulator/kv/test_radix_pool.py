"""SGLang's token pool and radix tree (simulator/kv/radix.py), driven directly.

The expected numbers come from the rules in the module's docstring (SGLang's RadixCache): whole
pages match, a match splits the node it ends inside, locks cover the path to the root, only
unlocked leaves are evicted (LRU: least recent access; LFU: fewest hits, then least recent), and
allocation evicts only the shortfall. The state machines check ``check_invariants()`` after every
operation: pages and page ids conserved, lock counts equal to the running sequences through each
node, the evictable-leaf set and heap current, the accounting aggregates.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simulator.kv.radix import RadixTokenPool, RadixTree, token_key
from tests.simulator.kv.test_allocator_stateful import AllocatorMachine


def admit(pool: RadixTokenPool, seq: int, key, num_tokens: int, final: int) -> int:
    """SGLang's admission of one sequence: match all but the last token, lock, evict, allocate;
    returns the cached tokens."""
    cached, node = pool.match_prefix(key, num_tokens - 1)
    pool.inc_lock_ref(node)
    pool.evict_for((pool.pages_for(num_tokens) - cached // pool.page_size) * pool.page_size)
    pool.admit(seq, key, node, cached, num_tokens, final)
    pool.check_invariants()
    return cached


def run_to_tree(pool: RadixTokenPool, seq: int, key, num_tokens: int) -> int:
    """A sequence that computes ``num_tokens`` and finishes: its tokens end in the tree."""
    cached = admit(pool, seq, key, num_tokens, num_tokens)
    pool.release(seq, num_tokens, insert=True)
    pool.check_invariants()
    return cached


# ----------------------------------------------------------------------------- token identity
@pytest.mark.parametrize(("page_size", "hit"), [(1, 37), (16, 32)])
def test_a_prefix_shared_within_a_prefix_id_hits_to_the_token_or_the_page(page_size, hit):
    """A 37-token prompt named by prefix ids (7, 8, 9) of 16 tokens is cached; a longer prompt
    with the same ids shares those 37 tokens: all of them at page_size 1, the two whole pages at
    page_size 16 (the cached sequence went in page-aligned: 32 tokens)."""
    pool = RadixTokenPool(64, page_size)
    run_to_tree(pool, 0, token_key((7, 8, 9), 16, 37, "w"), 37)
    assert pool.tree.evictable_size == 37 // page_size * page_size
    later = token_key((7, 8, 9, 3), 16, 60, "r")
    assert pool.tree.peek(later, 59)[0] == hit
    assert admit(pool, 1, later, 60, 60) == hit


def test_prompts_share_while_their_leading_prefix_ids_agree():
    pool = RadixTokenPool(200, 1)
    run_to_tree(pool, 0, token_key((1, 2, 3), 10, 30, "a"), 30)
    assert pool.tree.peek(token_key((1, 2, 4), 10, 30, "b"), 29)[0] == 20  # diverge at the third id
    assert pool.tree.peek(token_key((2, 2, 3), 10, 30, "c"), 29)[0] == 0  # the chain starts apart
    assert pool.tree.peek(token_key((1, 2, 3), 5, 30, "d"), 29)[0] == 0  # ids of other sizes
    # the prompt beyond its prefix ids is its own: another prompt with the same ids shares 20
    run_to_tree(pool, 1, token_key((1, 2), 10, 30, "e"), 30)
    assert pool.tree.peek(token_key((1, 2), 10, 40, "f"), 39)[0] == 20
    # ... and only its own later admission (the same owner: a retracted request) finds the rest
    assert pool.tree.peek(token_key((1, 2), 10, 30, "e"), 29)[0] == 29


def test_a_match_ending_inside_a_node_splits_it_and_locks_cover_the_path():
    pool = RadixTokenPool(100, 1)
    run_to_tree(pool, 0, token_key((1, 2), 10, 20, "a"), 20)
    assert len(pool.tree.nodes()) == 1
    key = token_key((1, 2), 10, 30, "b")
    assert admit(pool, 1, key, 30, 30) == 20
    cached, node = pool.match_prefix(token_key((1,), 10, 30, "c"), 29)  # ends inside: split at 10
    assert cached == 10 and len(pool.tree.nodes()) == 2
    assert (node.start, node.end, node.lock_ref) == (0, 10, 1)  # the split keeps the lock count
    assert pool.tree.protected_size == 20 and pool.tree.evictable_size == 0
    pool.release(1, 30, insert=False)
    assert pool.tree.protected_size == 0 and pool.tree.evictable_size == 20
    pool.check_invariants()


# ----------------------------------------------------------------------------- eviction
@pytest.mark.parametrize(("policy", "survivor"), [("lru", "hot-old"), ("lfu", "hot")])
def test_eviction_takes_the_least_recent_or_the_least_hit_unlocked_leaf(policy, survivor):
    """Three cached 10-token sequences: 'hot' inserted first and hit twice more, then 'cold',
    then one locked by a running sequence. Making room for 10 tokens evicts one leaf: LRU the
    least recently used ('hot', last touched before 'cold' was inserted), LFU the least hit
    ('cold': 1 hit against 'hot''s 3)."""
    pool = RadixTokenPool(40, 1, eviction_policy=policy)
    hot, cold = token_key((1,), 10, 10, "hot"), token_key((2,), 10, 10, "cold")
    run_to_tree(pool, 0, hot, 10)
    pool.tree.insert(hot, 10, [], 0)  # two more inserts of the same tokens: two more hits
    pool.tree.insert(hot, 10, [], 0)
    run_to_tree(pool, 1, cold, 10)
    admit(pool, 2, token_key((3,), 10, 10, "busy"), 10, 10)
    pool.cache_unfinished(2, 10)  # locked by sequence 2: never evicted
    assert pool.free_pages == 10 and pool.tree.evictable_size == 20
    pool.evict_for(20)  # 10 short: one leaf goes
    assert pool.free_pages == 20 and pool.tree.num_evicted_tokens == 10
    left = {n.key.prompt_owner for n in pool.tree.nodes()}
    assert left == ({"hot", "busy"} if survivor == "hot" else {"cold", "busy"})
    pool.check_invariants()


def test_allocation_evicts_only_the_shortfall_leaf_by_leaf_and_a_freed_parent_follows():
    pool = RadixTokenPool(30, 1)
    run_to_tree(pool, 0, token_key((1,), 10, 18, "a"), 18)  # [10 shared][8 own]
    run_to_tree(pool, 1, token_key((1,), 10, 14, "b"), 14)  # splits at 10: [10][8 a] [4 b]
    assert sorted(n.end - n.start for n in pool.tree.nodes()) == [4, 8, 10]
    assert pool.free_pages == 8
    pool.evict_for(10)  # 2 short: a's leaf (older) goes whole
    assert pool.free_pages == 16 and pool.tree.evictable_size == 14
    pool.evict_for(30)  # 14 short: b's leaf, then the shared parent, childless now
    assert pool.free_pages == 30 and not pool.tree.nodes()
    pool.check_invariants()


def test_an_eviction_that_rebuilds_the_heap_still_frees_the_whole_shortfall():
    """Two 10-token prefix nodes with 75 prompts of 2 tokens of their own under each (the oldest
    leaves); then 400 other prompts are cached and locked again by running sequences, which
    leaves hundreds of stale entries in the eviction heap, newer than the old leaves. Evicting
    everything evictable makes the first shared node a leaf, and its push rebuilds the mostly
    stale heap; the second shared node becomes a leaf after that. The eviction must see both (a
    rebuild that replaced the list the eviction held lost the second: 10 tokens short)."""
    groups, per_group, locked = 2, 75, 400
    cached = groups * (10 + 2 * per_group)
    pool = RadixTokenPool(cached + 6 * locked, 1)
    for g in range(groups):
        for i in range(per_group):
            run_to_tree(pool, g * 1000 + i, token_key((g,), 10, 12, f"r{g}-{i}"), 12)
    for i in range(locked):
        run_to_tree(pool, 10_000 + i, token_key((100 + i,), 5, 5, f"l{i}"), 5)
        assert admit(pool, 20_000 + i, token_key((100 + i,), 5, 6, f"m{i}"), 6, 6) == 5
    assert pool.free_pages == 0 and pool.tree.evictable_size == cached
    pool.evict_for(cached)
    assert pool.free_pages == cached and pool.tree.evictable_size == 0
    pool.check_invariants()


def test_lockstep_growth_takes_a_page_when_a_token_starts_one():
    pool = RadixTokenPool(32, 4)
    admit(pool, 0, token_key((), 0, 6, "a"), 6, 13)  # 2 pages
    admit(pool, 1, token_key((), 0, 4, "b"), 4, 11)  # 1 page, full
    pool.start_lockstep(0)
    pool.start_lockstep(1)
    taken = []
    for _ in range(7):
        taken.append(pool.lockstep_pages_needed())
        pool.lockstep_step()
        pool.check_invariants()
    # a writes positions 6..12 (new pages at 8 and 12), b positions 4..10 (at 4 and 8)
    assert taken == [1, 0, 1, 0, 1, 0, 1]
    assert (pool.tokens(0), pool.tokens(1)) == (13, 11) and pool.free_pages == 32 - 4 - 3
    snap = pool.snapshot(13 + 11)
    # 7 slots allocated in all, 28; the last pages hold 3 + 1 slots past the final lengths
    assert (snap.token_state, snap.reserved, snap.internal_fragmentation) == (24, 0, 4)


def test_block_tables_bind_page_ids_when_asked_and_the_tree_keeps_them():
    pool = RadixTokenPool(16, 2)
    key = token_key((5,), 8, 8, "a")
    admit(pool, 0, key, 8, 9)
    table = pool.block_table(0)
    assert table == (0, 1, 2, 3)
    pool.cache_unfinished(0, 8)
    assert pool.block_table(0) == table  # the prompt's pages moved to the tree as they were
    assert pool.slot_mapping(0, 6, 2) == [6, 7]
    pool.release(0, 8, insert=True)
    admit(pool, 1, token_key((5,), 8, 12, "b"), 12, 12)
    assert pool.block_table(1)[:4] == table  # a hit reads the cached pages
    pool.check_invariants()


# ----------------------------------------------------------------------------- state machines
def _allocator_machine(name, factory):
    cls = type(name, (AllocatorMachine,), {"make_allocator": staticmethod(factory)})
    cls.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    return cls.TestCase


TestRadixAsAllocator = _allocator_machine("RadixAsAllocator", lambda: RadixTokenPool(90, 1))
TestRadixAsAllocatorPaged = _allocator_machine("RadixAsAllocatorPaged", lambda: RadixTokenPool(24, 4))
TestRadixAsAllocatorNoCache = _allocator_machine(
    "RadixAsAllocatorNoCache", lambda: RadixTokenPool(24, 4, enable_prefix_caching=False))

PREFIXES = [(), (1, 2, 3), (1, 2, 9), (4, 4, 4, 4)]


class RadixPoolMachine(RuleBasedStateMachine):
    """SGLang's own operations in any order: admissions by match + lock + evict, prompts cached
    while running, lockstep decode steps, finishes that insert, retractions that do not, stray
    matches and evictions, block tables. Checks the pool after each and its conservation law."""

    @initialize(page_size=st.sampled_from([1, 2, 4]), num_pages=st.integers(8, 40),
                policy=st.sampled_from(["lru", "lfu"]), caching=st.booleans())
    def setup(self, page_size, num_pages, policy, caching):
        self.pool = RadixTokenPool(num_pages, page_size, enable_prefix_caching=caching,
                                   eviction_policy=policy)
        self.final: dict[int, int] = {}
        self.lockstep: set[int] = set()
        self.next_id = 0

    def _free_total(self) -> int:
        return self.pool.available_tokens() + self.pool.evictable_tokens

    @rule(prefix=st.integers(0, 3), prompt=st.integers(1, 40), extra=st.integers(0, 20),
          owner=st.integers(0, 5))
    def admit(self, prefix, prompt, extra, owner):
        pool = self.pool
        key = token_key(PREFIXES[prefix], 8, prompt, owner)
        cached, evictable = pool.tree.peek(key, prompt - 1) if pool.enable_prefix_caching else (0, 0)
        need = (pool.pages_for(prompt) - cached // pool.page_size) * pool.page_size
        if need > pool.available_tokens() + pool.evictable_tokens - evictable:
            return
        seq = self.next_id
        self.next_id += 1
        assert admit(pool, seq, key, prompt, prompt + extra) == cached
        self.final[seq] = prompt + extra

    @precondition(lambda self: set(self.final) - self.lockstep)
    @rule(data=st.data())
    def cache_prompt(self, data):
        seq = data.draw(st.sampled_from(sorted(set(self.final) - self.lockstep)))
        self.pool.cache_unfinished(seq, self.pool.tokens(seq), chunked=data.draw(st.booleans()))

    @precondition(lambda self: self.final)
    @rule(data=st.data())
    def start_decoding(self, data):
        seq = data.draw(st.sampled_from(sorted(self.final)))
        if seq not in self.lockstep and self.pool.tokens(seq) < self.final[seq]:
            self.pool.start_lockstep(seq)
            self.lockstep.add(seq)

    @precondition(lambda self: self.lockstep)
    @rule()
    def decode_step(self):
        pool = self.pool
        if any(pool.tokens(s) >= self.final[s] for s in self.lockstep):
            return  # a sequence at its final length has finished
        need = pool.lockstep_pages_needed() * pool.page_size
        if need > self._free_total():
            return
        pool.evict_for(need)
        pool.lockstep_step()

    @precondition(lambda self: self.final)
    @rule(data=st.data(), insert=st.booleans())
    def release(self, data, insert):
        seq = data.draw(st.sampled_from(sorted(self.final)))
        self.pool.release(seq, self.pool.tokens(seq), insert=insert)
        del self.final[seq]
        self.lockstep.discard(seq)

    @rule(prefix=st.integers(0, 3), prompt=st.integers(1, 40), owner=st.integers(0, 5))
    def stray_match(self, prefix, prompt, owner):
        key = token_key(PREFIXES[prefix], 8, prompt, owner)
        before = self.pool.tree.peek(key, prompt)[0]
        assert self.pool.match_prefix(key, prompt)[0] == (before if self.pool.enable_prefix_caching else 0)

    @rule(tokens=st.integers(0, 50))
    def evict(self, tokens):
        before = self._free_total()
        self.pool.evict_for(tokens)
        assert self._free_total() == before  # eviction moves evictable tokens to free ones
        assert self.pool.available_tokens() >= min(tokens, before)

    @precondition(lambda self: self.final)
    @rule(data=st.data())
    def block_table(self, data):
        seq = data.draw(st.sampled_from(sorted(self.final)))
        table = self.pool.block_table(seq)
        assert len(table) == self.pool.pages_for(self.pool.tokens(seq))

    @invariant()
    def consistent(self):
        if not hasattr(self, "pool"):
            return
        pool = self.pool
        pool.check_invariants()
        written = sum(pool.tokens(s) for s in self.final)
        snap = pool.snapshot(written)
        parts = (snap.token_state, snap.reserved, snap.internal_fragmentation, snap.free)
        assert all(p >= 0 for p in parts) and sum(parts) == pool.capacity_tokens, snap


TestRadixPool = RadixPoolMachine.TestCase
TestRadixPool.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


def test_the_waiting_queue_tree_has_no_pool():
    """The LPM policy's in-batch tree (RadixCache.create_simulated) matches and inserts keys."""
    tree = RadixTree(1)
    assert tree.insert(token_key((1, 2), 16, 40, "a"), 40, [], 0) == 0
    assert tree.match(token_key((1, 2), 16, 50, "b"), 50)[0] == 32
    assert tree.evictable_size == 40 + 0  # the match split a node, the tokens are the same
    tree.check()
