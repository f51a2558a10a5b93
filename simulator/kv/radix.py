"""SGLang's KV pool: pages of ``page_size`` tokens and a radix tree of cached token sequences.

SGLang keeps every KV token in one pool of pages (``page_size`` 1 by default: token-granular, no
block-rounding waste beyond a sequence's last page) and shares prompts through RadixAttention
(python/sglang/srt/mem_cache/radix_cache.py, ``RadixCache``)::

    radix tree (page_size 1)                                   lock_ref
    root ─ [system prompt, ids 7 9 4: 1536 tok] ──┬─ [req 3: 40 prompt tok]      1   req 3 runs
                                                   └─ [req 5: 60 prompt + 130 gen] 0   evictable leaf
         ─ [req 8: 900 prompt tok] ─ [req 8: 55 gen]                               0 / 0

    pool pages:  free | in the tree (locked ▸ protected, unlocked ▸ evictable) | private to a request

* A running request holds the tokens of one tree path (``inc_lock_ref`` on its last node locks
  every node up to the root: ``cache_protected_len``) plus *private* pages: what it computed that
  is not in the tree yet (``req_to_token_pool``). Prefix matches are whole pages (``match_prefix``
  truncates the key to a page multiple; at page_size 1, to the token).
* After a request's prompt is computed its tokens go into the tree and it locks them
  (``cache_unfinished_req``); when it finishes all its tokens do (``cache_finished_req``) and it
  unlocks them. A retracted request frees its private pages without inserting
  (``release_kv_cache(is_insert=False)``); what it had put in the tree stays, evictable.
* Only unlocked leaves are evicted, least recently used first (``LRUStrategy``: last access) or,
  with ``eviction_policy="lfu"``, fewest hits first, then least recent (``LFUStrategy``:
  ``(hit_count, last_access_time)``; python/sglang/srt/mem_cache/evict_policy.py). A match touches
  the nodes it walks; an insert touches them and counts a hit on each (``_inc_hit_count``, skipped
  for a chunked request's partial insert). A node freed down to a childless unlocked parent makes
  that parent a candidate in the same eviction (``RadixCache.evict``). Allocation evicts only the
  shortfall (``evict_from_tree_cache``: ``num_tokens - available_size()``, the newest
  python/sglang/srt/mem_cache/common.py; older versions evicted ``num_tokens``).

Token identity without token ids: a :class:`TokenKey` names a sequence by runs, not one id per
token, so a 4,000-token prompt costs O(prefix ids) to match, insert or lock. Its first
``shared_tokens`` tokens are named by the workload's ``prefix_ids`` (token t is token
``t % block_tokens`` of id ``prefix_ids[t // block_tokens]``, after all the ids before it); the
rest of the prompt is the request's own, and generated tokens are their sequence's own. A tree
node stores a token range of the key that created it; two keys name the same token at position t
when they agree on everything before it and on the run that covers t.

Where time goes: matching, inserting and locking walk the path (O(nodes × prefix ids)); eviction
pops a lazily-cleaned heap of evictable leaves (O(log leaves) per evicted leaf). Decoding
sequences grow in lockstep (:meth:`RadixTokenPool.start_lockstep`): one pool-wide step charges
every decoding sequence its next token in O(1), not one call per sequence. Physical page ids are
bound only when a block table or slot mapping is asked for (the real backend's detail mode); the
simulator's decisions never depend on them.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from simulator.kv.allocator import NO_COPIES, AllocFailure, Allocation, AppendResult, KVAllocator

EVICTION_POLICIES = ("lru", "lfu")  # python/sglang/srt/server_args.py RADIX_EVICTION_POLICY_CHOICES
_PROMPT, _GENERATED = "p", "g"  # labels of a sequence's own tokens (prefix ids label the shared ones)


class TokenKey(NamedTuple):
    """The tokens of a sequence, by runs.

    ``[0, shared_tokens)``: named by ``prefix_ids``, ``block_tokens`` tokens per id;
    ``[shared_tokens, prompt_tokens)``: the rest of the prompt, unique to ``prompt_owner``;
    ``[prompt_tokens, ...)``: generated, unique to ``owner`` (the samples of one prompt share
    ``prompt_owner`` and have owners of their own).
    """

    block_tokens: int
    prefix_ids: tuple[int, ...]
    shared_tokens: int
    prompt_tokens: int
    prompt_owner: Hashable
    owner: Hashable


_ROOT_KEY = TokenKey(1, (), 0, 0, None, None)


def token_key(prefix_ids: Sequence[int], prefix_block_tokens: int, prompt_tokens: int,
              prompt_owner: Hashable, owner: Hashable | None = None) -> TokenKey:
    """The key of a prompt whose leading ``prefix_ids`` name ``prefix_block_tokens`` tokens each
    (a trace's prefix ids, :class:`workloads.request.Request`); ``owner`` (default: the prompt's
    owner) owns the tokens generated after it."""
    shared = min(len(prefix_ids) * prefix_block_tokens, prompt_tokens) if prefix_block_tokens > 0 else 0
    block = prefix_block_tokens if shared else 1
    ids = tuple(prefix_ids[: -(-shared // block)]) if shared else ()
    return TokenKey(block, ids, shared, prompt_tokens, prompt_owner,
                    prompt_owner if owner is None else owner)


def _label(key: TokenKey, t: int, page_size: int) -> Hashable:
    """The identity of the page that starts at position ``t`` (the token, at page_size 1), given
    the tokens before it: the key of a tree node among its parent's children."""
    if page_size == 1:
        if t < key.shared_tokens:
            return (key.block_tokens, key.prefix_ids[t // key.block_tokens])
        return (_PROMPT, key.prompt_owner) if t < key.prompt_tokens else (_GENERATED, key.owner)
    runs = []
    end = t + page_size
    while t < end:
        if t < key.shared_tokens:
            g = key.block_tokens
            stop = min(end, key.shared_tokens, (t // g + 1) * g)
            runs.append(((g, key.prefix_ids[t // g]), stop - t))
        elif t < key.prompt_tokens:
            stop = min(end, key.prompt_tokens)
            runs.append(((_PROMPT, key.prompt_owner), stop - t))
        else:
            stop = end
            runs.append(((_GENERATED, key.owner), stop - t))
        t = stop
    return tuple(runs)


def _common_end(a: TokenKey, b: TokenKey, t: int, limit: int) -> int:
    """The end of the positions from ``t`` (``< limit``) on which ``a`` and ``b`` name the same
    tokens, at most ``limit``; they are known to agree before ``t``."""
    if a is b:
        return limit
    if t < a.shared_tokens and t < b.shared_tokens:
        g = a.block_tokens
        if g != b.block_tokens:
            return t
        end = min(a.shared_tokens, b.shared_tokens, limit)
        j, last = t // g, (end - 1) // g
        ia, ib = a.prefix_ids, b.prefix_ids
        if ia[j:last + 1] != ib[j:last + 1]:
            while ia[j] == ib[j]:
                j += 1
            return max(t, j * g)
        if end == limit:
            return limit
        t = end
    if t < a.shared_tokens or t < b.shared_tokens:
        return t
    if t < a.prompt_tokens and t < b.prompt_tokens:
        if a.prompt_owner != b.prompt_owner:
            return t
        t = min(a.prompt_tokens, b.prompt_tokens, limit)
        if t == limit:
            return limit
    if t < a.prompt_tokens or t < b.prompt_tokens:
        return t
    return limit if a.owner == b.owner else t


class TreeNode:
    """A tree node: positions ``[start, end)`` of ``key`` (page multiples), under ``parent``."""

    __slots__ = ("parent", "children", "key", "start", "end", "lock_ref", "tick", "hits", "uid",
                 "version", "pages")

    def __init__(self, parent: TreeNode | None, key: TokenKey, start: int, end: int, uid: int, tick: int,
                 hits: int) -> None:
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.key = key
        self.start = start
        self.end = end
        self.lock_ref = 0  # paths of running requests through this node
        self.tick = tick  # last access (a logical clock: one tick per match or insert)
        self.hits = hits
        self.uid = uid  # creation order: the tie-break of equal eviction priorities
        self.version = 0  # bumps when its eviction priority or leaf status changes (heap cleanup)
        self.pages: list[int] = []  # bound page ids (empty until a block table asks for them)


class RadixTree:
    """The radix tree of cached token sequences, with SGLang's locking and eviction order.

    ``evictable_size`` / ``protected_size``: tokens of unlocked / locked nodes (``RadixCache``'s
    ``evictable_size_`` / ``protected_size_``); ``shared_tokens``: Σ over locked nodes of
    (lock_ref − 1) × length, the tokens more than one running request addresses; ``generation``
    moves whenever the set of cached sequences changes (insert of new tokens, eviction).
    """

    def __init__(self, page_size: int, eviction_policy: str = "lru") -> None:
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy must be one of {EVICTION_POLICIES}, got {eviction_policy!r}")
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        self.root = TreeNode(None, _ROOT_KEY, 0, 0, 0, 0, 0)
        self.root.lock_ref = 1  # the root is never evicted (RadixCache.reset)
        self.evictable_size = 0
        self.protected_size = 0
        self.shared_tokens = 0
        self.generation = 0
        self.num_evicted_tokens = 0
        self._lfu = eviction_policy == "lfu"
        self._leaves: set[TreeNode] = set()  # evictable leaves: unlocked, childless
        self._heap: list[tuple] = []  # eviction order, entries made stale by ``version``
        self._tick = 0
        self._uid = 1

    # ------------------------------------------------------------------ queries
    def match(self, key: TokenKey, limit: int) -> tuple[int, TreeNode]:
        """``RadixCache.match_prefix``: the longest cached prefix of ``key`` within ``limit``
        tokens (a page multiple), and its last node. Touches the nodes it walks and splits the
        node the match ends inside, as SGLang does."""
        ps = self.page_size
        limit -= limit % ps
        self._tick += 1
        node, t = self.root, 0
        while t < limit:
            child = node.children.get(_label(key, t, ps))
            if child is None:
                break
            self._touch(child, 0)
            e = _common_end(child.key, key, t, min(child.end, limit))
            e -= (e - t) % ps
            assert e > t, "a child's first page matches the key"
            if e < child.end:
                return e, self._split(child, e)
            node, t = child, e
        return t, node

    def peek(self, key: TokenKey, limit: int) -> tuple[int, int]:
        """:meth:`match` without touching or splitting: (tokens matched, tokens of the matched
        path that are evictable now)."""
        ps = self.page_size
        limit -= limit % ps
        node, t, evictable = self.root, 0, 0
        while t < limit:
            child = node.children.get(_label(key, t, ps))
            if child is None:
                break
            e = _common_end(child.key, key, t, min(child.end, limit))
            e -= (e - t) % ps
            if child.lock_ref == 0:
                evictable += e - t
            if e < child.end:
                return e, evictable
            node, t = child, e
        return t, evictable

    # ------------------------------------------------------------------ changes
    def insert(self, key: TokenKey, length: int, pages: list[int], base: int, *,
               chunked: bool = False) -> int:
        """``RadixCache.insert``: put ``key[:length]`` (a page multiple) in the tree; return the
        tokens that were there already. The new leaf, if any, takes the page ids of its range from
        ``pages`` (bound ids of the positions from ``base``) when all of them are bound."""
        ps = self.page_size
        length -= length % ps
        self._tick += 1
        hit = 0 if chunked else 1
        node, t = self.root, 0
        while t < length:
            child = node.children.get(_label(key, t, ps))
            if child is None:
                break
            self._touch(child, 0)
            e = _common_end(child.key, key, t, min(child.end, length))
            e -= (e - t) % ps
            if e < child.end:
                node = self._split(child, e)
                self._touch(node, hit)
                t = e
                break
            self._touch(child, hit)
            node, t = child, e
        if t < length:
            leaf = TreeNode(node, key, t, length, self._uid, self._tick, hit)
            self._uid += 1
            lo, hi = (t - base) // ps, (length - base) // ps
            if len(pages) >= hi:
                leaf.pages = pages[lo:hi]
            node.children[_label(key, t, ps)] = leaf
            self.evictable_size += length - t
            self.generation += 1
            self._update_leaf(node)
            self._update_leaf(leaf)
        return t

    def lock(self, node: TreeNode) -> None:
        """``inc_lock_ref``: one more running request holds the path from ``node`` to the root."""
        root = self.root
        while node is not root:
            n = node.end - node.start
            if node.lock_ref == 0:
                self.evictable_size -= n
                self.protected_size += n
                if node in self._leaves:
                    self._leaves.discard(node)
                    node.version += 1
            else:
                self.shared_tokens += n
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        """``dec_lock_ref``: the reverse of :meth:`lock`."""
        root = self.root
        while node is not root:
            n = node.end - node.start
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += n
                self.protected_size -= n
                self._update_leaf(node)
            else:
                self.shared_tokens -= n
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> tuple[int, list[int]]:
        """``RadixCache.evict``: free evictable leaves in eviction order until ``num_tokens`` are
        freed (or none is left); returns (tokens freed, their bound page ids)."""
        heap, leaves, ps = self._heap, self._leaves, self.page_size
        freed, ids = 0, []
        while freed < num_tokens and heap:
            entry = heapq.heappop(heap)
            node = entry[-1]
            if entry[-2] != node.version:
                continue  # stale: touched, locked or evicted since it was pushed
            leaves.discard(node)
            node.version += 1
            parent = node.parent
            assert parent is not None
            del parent.children[_label(node.key, node.start, ps)]
            n = node.end - node.start
            freed += n
            self.evictable_size -= n
            if node.pages:
                ids.extend(node.pages)
            self._update_leaf(parent)
        if freed:
            self.generation += 1
            self.num_evicted_tokens += freed
        return freed, ids

    def path(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from the root's child down to ``node``."""
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent  # type: ignore[assignment]
        out.reverse()
        return out

    def nodes(self) -> list[TreeNode]:
        """Every node but the root."""
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    # ------------------------------------------------------------------ internals
    def _priority(self, node: TreeNode) -> tuple:
        if self._lfu:  # LFUStrategy: (hit_count, last_access_time)
            return (node.hits, node.tick, node.uid, node.version, node)
        return (node.tick, node.uid, node.version, node)  # LRUStrategy: last_access_time

    def _touch(self, node: TreeNode, hits: int) -> None:
        node.tick = self._tick
        node.hits += hits
        if node in self._leaves:
            node.version += 1
            self._push(node)

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """``RadixCache._split_node``: ``child``'s positions before ``at`` become a new parent
        node (same lock count, hit count copied, accessed now)."""
        ps = self.page_size
        parent = child.parent
        assert parent is not None
        new = TreeNode(parent, child.key, child.start, at, self._uid, self._tick, child.hits)
        self._uid += 1
        new.lock_ref = child.lock_ref
        if child.pages:
            k = (at - child.start) // ps
            new.pages, child.pages = child.pages[:k], child.pages[k:]
        parent.children[_label(child.key, child.start, ps)] = new
        child.start, child.parent = at, new
        new.children[_label(child.key, at, ps)] = child
        return new

    def _update_leaf(self, node: TreeNode) -> None:
        """``_update_leaf_status``: keep the set (and heap) of evictable leaves current."""
        if node.lock_ref == 0 and not node.children and node is not self.root:
            if node not in self._leaves:
                self._leaves.add(node)
                node.version += 1
                self._push(node)
        elif node in self._leaves:
            self._leaves.discard(node)
            node.version += 1

    def _push(self, node: TreeNode) -> None:
        heap = self._heap
        heapq.heappush(heap, self._priority(node))
        if len(heap) > 2 * len(self._leaves) + 256:  # mostly stale entries: rebuild
            # in place: evict() holds the list while it pushes the parents it makes leaves
            heap[:] = [self._priority(n) for n in self._leaves]
            heapq.heapify(heap)

    def check(self) -> None:
        """Structure and counters recomputed from the nodes (locks are checked by the pool)."""
        ps = self.page_size
        evictable = protected = shared = 0
        leaves = set()
        for n in self.nodes():
            parent = n.parent
            assert parent is not None and parent.children[_label(n.key, n.start, ps)] is n
            assert n.start == parent.end and n.start < n.end, (n.start, n.end, parent.end)
            assert n.start % ps == 0 and n.end % ps == 0
            assert not n.pages or len(n.pages) == (n.end - n.start) // ps
            if parent is not self.root:  # the node continues the tokens of its parent's path
                assert _common_end(parent.key, n.key, 0, parent.end) == parent.end
            if n.lock_ref:
                protected += n.end - n.start
                shared += (n.lock_ref - 1) * (n.end - n.start)
            else:
                evictable += n.end - n.start
                assert all(c.lock_ref == 0 for c in n.children.values()), "locked below unlocked"
                if not n.children:
                    leaves.add(n)
            assert n.lock_ref >= max((c.lock_ref for c in n.children.values()), default=0)
        assert (evictable, protected, shared) == (self.evictable_size, self.protected_size,
                                                  self.shared_tokens)
        assert leaves == self._leaves, "evictable leaves out of date"
        live = {id(e[-1]) for e in self._heap if e[-2] == e[-1].version}
        assert {id(n) for n in leaves} <= live, "an evictable leaf has no current heap entry"


@dataclass(slots=True, eq=False)
class _Seq:
    """A running sequence: the tree path it locks (``node``, ``protected`` tokens) and its
    private pages. In lockstep it declares one more token per pool step from ``grow_from``."""

    key: TokenKey
    node: TreeNode
    protected: int
    tokens: int  # declared tokens (grow-before-write); in lockstep, the count at ``grow_from``
    grow_from: int = -1  # pool clock at which lockstep growth began (-1: not in lockstep)
    phase: int = 0  # lockstep: (tokens - grow_from) mod page_size; it takes a page at clocks ≡ -phase
    last_page_at: int = -1  # lockstep: the clock at which it takes its last page
    pages: list[int] = field(default_factory=list)  # bound ids of its private pages, in order


class RadixTokenPool(KVAllocator):
    """SGLang's token pool (``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``) with
    its ``RadixCache``; ``enable_prefix_caching=False`` is ``--disable-radix-cache`` (SGLang's
    ``ChunkCache``: nothing is matched or kept after a request ends).

    Besides the :class:`KVAllocator` interface, it offers SGLang's own operations, which the
    SGLang scheduler uses: :meth:`match_prefix`, :meth:`inc_lock_ref` / :meth:`dec_lock_ref`,
    :meth:`evict_for`, :meth:`admit`, :meth:`extend`, :meth:`cache_unfinished`,
    :meth:`release` and lockstep decode growth. Accounting: a sequence addresses its locked path
    and its private pages; tokens of the tree that no running request locks are *free*
    (evictable at any time), as a paged allocator counts its evictable cached blocks.
    """

    forks_share_memory = False  # a fork shares the tree path and copies the private rest

    def __init__(self, num_pages: int, page_size: int = 1, *, enable_prefix_caching: bool = True,
                 eviction_policy: str = "lru") -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        super().__init__()
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_blocks, self.block_size = num_pages, page_size  # a page is the backend's block
        self.capacity_tokens = num_pages * page_size
        self.enable_prefix_caching = enable_prefix_caching
        self.tree = RadixTree(page_size, eviction_policy)
        self.free_pages = num_pages
        self._free_ids = list(range(num_pages - 1, -1, -1))  # unbound page ids; pop() gives 0 first
        self._seqs: dict[int, _Seq] = {}
        self._private_pages = 0
        # lockstep growth: the pool clock, sequences per phase, last-page overhangs by clock
        self.clock = 0
        self._phase = [0] * page_size
        self._num_lockstep = 0
        self._overhang: dict[int, int] = {}

    # ------------------------------------------------------------------ sizes
    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def available_tokens(self) -> int:
        """``available_size()``: free pages, in tokens."""
        return self.free_pages * self.page_size

    @property
    def evictable_tokens(self) -> int:
        """``evictable_size()``: tokens of the tree no running request locks."""
        return self.tree.evictable_size

    def num_free_tokens(self) -> int:
        return self.free_pages * self.page_size + self.tree.evictable_size

    def free_blocks_for_growth(self) -> int:
        """Free pages plus evictable ones: eviction reaches every unlocked node, leaf by leaf."""
        return self.free_pages + self.tree.evictable_size // self.page_size

    def external_fragmentation(self, head: tuple[int, ...] | None) -> int:
        return 0  # any free page serves any request

    def min_pool_tokens(self, num_prompt: int, final_tokens: int, num_seqs: int) -> int:
        """Samples share the prompt's full pages through the tree; the rest is private to each."""
        ps = self.page_size
        total = self.pages_for(final_tokens) * ps
        return total + (num_seqs - 1) * (total - num_prompt // ps * ps)

    def allocated_tokens(self, seq_id: int) -> int:
        return self.pages_for(self.tokens(seq_id)) * self.page_size

    def tokens(self, seq_id: int) -> int:
        """Tokens the sequence has declared (grow-before-write), lockstep growth included."""
        s = self._seqs[seq_id]
        return s.tokens if s.grow_from < 0 else s.tokens + self.clock - s.grow_from

    # ------------------------------------------------------------------ SGLang's operations
    def match_prefix(self, key: TokenKey, max_tokens: int) -> tuple[int, TreeNode]:
        """``RadixCache.match_prefix``: (cached tokens, last node); nothing without the cache."""
        if not self.enable_prefix_caching or max_tokens <= 0:
            return 0, self.tree.root
        return self.tree.match(key, max_tokens)

    def inc_lock_ref(self, node: TreeNode) -> None:
        before = self.tree.shared_tokens
        self.tree.lock(node)
        self._add_shared(self.tree.shared_tokens - before)

    def dec_lock_ref(self, node: TreeNode) -> None:
        before = self.tree.shared_tokens
        self.tree.unlock(node)
        self._add_shared(self.tree.shared_tokens - before)

    def evict_for(self, num_tokens: int) -> None:
        """``evict_from_tree_cache``: if fewer than ``num_tokens`` are free, evict the shortfall."""
        shortfall = num_tokens - self.free_pages * self.page_size
        if shortfall > 0 and self.tree.evictable_size:
            freed, ids = self.tree.evict(shortfall)
            self.free_pages += freed // self.page_size
            self._free_ids.extend(ids)
            self.cache_generation = self.tree.generation

    def admit(self, seq_id: int, key: TokenKey, node: TreeNode, cached: int, num_tokens: int,
              final_tokens: int) -> Allocation:
        """A new sequence holding the path to ``node`` (``cached`` tokens, already locked for it:
        ``PrefillAdder._req_inc_lock_ref``) and private pages up to ``num_tokens``; the caller
        evicted first (``alloc_for_extend``), so the pages are free."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} is already allocated")
        need = self.pages_for(num_tokens) - cached // self.page_size
        self._take(need)
        self._seqs[seq_id] = _Seq(key, node, cached, num_tokens)
        self.num_tokens[seq_id] = num_tokens
        self.final_tokens[seq_id] = final_tokens
        alloc = self.pages_for(num_tokens) * self.page_size
        self._sum_alloc += alloc
        self._sum_useful += min(alloc, final_tokens)
        self._sum_tokens += num_tokens
        return Allocation(seq_id, cached, alloc)

    def extend(self, seq_id: int, num_tokens: int) -> None:
        """Private pages up to ``num_tokens`` (the caller evicted first)."""
        s = self._seqs[seq_id]
        assert s.grow_from < 0, "a sequence in lockstep grows with the pool clock"
        old = s.tokens
        if num_tokens <= old:
            return
        ps = self.page_size
        self._take(self.pages_for(num_tokens) - self.pages_for(old))
        final = self.final_tokens[seq_id]
        a0, a1 = self.pages_for(old) * ps, self.pages_for(num_tokens) * ps
        self._sum_alloc += a1 - a0
        self._sum_useful += min(a1, final) - min(a0, final)
        self._sum_tokens += num_tokens - old
        s.tokens = self.num_tokens[seq_id] = num_tokens

    def cache_unfinished(self, seq_id: int, num_tokens: int, *, chunked: bool = False) -> None:
        """``cache_unfinished_req``: the sequence's first ``num_tokens`` tokens (page-aligned)
        go into the tree and it locks them instead of its old path."""
        if not self.enable_prefix_caching:
            return
        s = self._seqs[seq_id]
        ps = self.page_size
        length = num_tokens - num_tokens % ps
        if length <= s.protected:
            return
        self._insert(s, length, chunked)
        _, node = self.tree.match(s.key, length)  # the path now ends at the inserted tokens
        self.dec_lock_ref(s.node)
        self.inc_lock_ref(node)
        s.node, s.protected = node, length

    def release(self, seq_id: int, committed_tokens: int, *, insert: bool) -> None:
        """``cache_finished_req`` / ``release_kv_cache``: with ``insert`` the sequence's first
        ``committed_tokens`` tokens (page-aligned) go into the tree; its private pages are freed
        and its path unlocked."""
        s = self._seqs[seq_id]
        if s.grow_from >= 0:
            self.stop_lockstep(seq_id)
        if insert and self.enable_prefix_caching:
            length = committed_tokens - committed_tokens % self.page_size
            if length > s.protected:
                self._insert(s, length, False)
        self._give(self.pages_for(s.tokens) - s.protected // self.page_size, s.pages)
        s.pages = []
        self.dec_lock_ref(s.node)
        del self._seqs[seq_id]
        alloc = self.pages_for(s.tokens) * self.page_size
        final = self.final_tokens.pop(seq_id)
        self._sum_alloc -= alloc
        self._sum_useful -= min(alloc, final)
        self._sum_tokens -= self.num_tokens.pop(seq_id)

    def _insert(self, s: _Seq, length: int, chunked: bool) -> None:
        """Insert ``s``'s tokens up to ``length``: positions already in the tree were computed
        twice, so their private pages are freed (``cache_*_req``: "free the duplicates"); the new
        leaf's pages move from the sequence to the tree."""
        ps = self.page_size
        prefix = self.tree.insert(s.key, length, s.pages, s.protected, chunked=chunked)
        self.cache_generation = self.tree.generation
        dup = (prefix - s.protected) // ps
        moved = (length - prefix) // ps
        bound = s.pages
        self._give(dup, bound[:dup])
        # the leaf took its ids only if all were bound; otherwise the bound ones go back
        leaf_ids = bound[dup:dup + moved]
        if len(leaf_ids) < moved:
            self._free_ids.extend(leaf_ids)
        self._private_pages -= moved
        s.pages = bound[dup + moved:]
        s.protected = length

    # ------------------------------------------------------------------ lockstep decode growth
    def start_lockstep(self, seq_id: int) -> None:
        """From now on the sequence declares one more token per :meth:`lockstep_step`."""
        s = self._seqs[seq_id]
        assert s.grow_from < 0
        ps = self.page_size
        s.grow_from = self.clock
        s.phase = (s.tokens - self.clock) % ps
        self._phase[s.phase] += 1
        self._num_lockstep += 1
        final = self.final_tokens[seq_id]
        last = (self.pages_for(final) - 1) * ps  # the position that takes the last page
        s.last_page_at = -1
        if final % ps and last >= s.tokens:
            s.last_page_at = self.clock + last - s.tokens
            self._overhang[s.last_page_at] = self._overhang.get(s.last_page_at, 0) + \
                self.pages_for(final) * ps - final

    def stop_lockstep(self, seq_id: int) -> None:
        s = self._seqs[seq_id]
        s.tokens = self.num_tokens[seq_id] = self.tokens(seq_id)
        self._phase[s.phase] -= 1
        self._num_lockstep -= 1
        if s.last_page_at >= self.clock:  # its last page not taken yet: drop its overhang
            ps = self.page_size
            final = self.final_tokens[seq_id]
            left = self._overhang[s.last_page_at] - (self.pages_for(final) * ps - final)
            if left:
                self._overhang[s.last_page_at] = left
            else:
                del self._overhang[s.last_page_at]
        s.grow_from = -1

    def lockstep_pages_needed(self, steps_ahead: int = 0) -> int:
        """Pages the lockstep step ``steps_ahead`` steps from now takes (0: the next one): one
        per sequence whose token then starts a page."""
        return self._phase[-(self.clock + steps_ahead) % self.page_size]

    def lockstep_step(self) -> None:
        """Every sequence in lockstep declares its next token (``alloc_for_decode``); the caller
        evicted first, so the pages are free."""
        ps = self.page_size
        need = self._phase[-self.clock % ps]
        assert need <= self.free_pages, "evict before a lockstep step"
        self.free_pages -= need
        self._private_pages += need
        self._sum_tokens += self._num_lockstep
        self._sum_alloc += need * ps
        self._sum_useful += need * ps
        if self._overhang:
            self._sum_useful -= self._overhang.pop(self.clock, 0)
        self.clock += 1

    # ------------------------------------------------------------------ KVAllocator
    def _key_of_hashes(self, seq_id: int, block_hashes: Sequence[int]) -> TokenKey:
        shared = len(block_hashes) * self.page_size
        owner = ("seq", seq_id)
        return TokenKey(self.page_size, tuple(block_hashes), shared, shared, owner, owner)

    def lookup(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """Prompt tokens a new sequence would find cached (at most all but one: the last prompt
        token is always computed, ``Req._compute_max_prefix_len``)."""
        if not block_hashes or not self.enable_prefix_caching:
            return 0
        return self.tree.peek(self._key_of_hashes(-1, block_hashes), num_prompt_tokens - 1)[0]

    def _fits(self, key: TokenKey, num_tokens: int) -> tuple[bool, int]:
        """Whether a sequence of ``num_tokens`` with ``key`` fits now, and its cached tokens."""
        cached, evictable = (self.tree.peek(key, num_tokens - 1) if self.enable_prefix_caching
                             else (0, 0))
        need = self.pages_for(num_tokens) - cached // self.page_size
        return need <= self.free_pages + (self.tree.evictable_size - evictable) // self.page_size, cached

    def can_allocate(self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = ()) -> bool:
        return self._fits(self._key_of_hashes(-1, block_hashes), num_tokens)[0]

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = ()) -> Allocation | None:
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} is already allocated")
        key = self._key_of_hashes(seq_id, block_hashes)
        if not self._fits(key, num_tokens)[0]:
            self.last_failure = AllocFailure.NO_SPACE
            return None
        cached, node = self.match_prefix(key, num_tokens - 1)
        self.inc_lock_ref(node)
        self.evict_for((self.pages_for(num_tokens) - cached // self.page_size) * self.page_size)
        return self.admit(seq_id, key, node, cached, num_tokens, final_tokens)

    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        s = self._seqs[seq_id]
        if s.grow_from >= 0:
            self.stop_lockstep(seq_id)
        need = self.pages_for(num_tokens) - self.pages_for(s.tokens)
        if need > 0:
            if need > self.free_pages + self.tree.evictable_size // self.page_size:
                self.last_failure = AllocFailure.NO_SPACE
                return None
            self.evict_for(need * self.page_size)
        self.extend(seq_id, num_tokens)
        return NO_COPIES

    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        return self.allocated_tokens(seq_id) - num_written

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> AppendResult | None:
        """The child locks the parent's cached prompt pages (up to ``num_tokens``) and copies the
        rest into private pages; ``None`` if those do not fit."""
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already allocated")
        p = self._seqs[parent_id]
        ps = self.page_size
        shared = min(p.protected, num_tokens, p.key.prompt_tokens)
        shared -= shared % ps
        need = self.pages_for(num_tokens) - shared // ps
        if need > self.free_pages + self.tree.evictable_size // ps:
            self.last_failure = AllocFailure.NO_SPACE
            return None
        key = p.key._replace(owner=("fork", child_id))
        node = self.tree.match(p.key, shared)[1] if shared else self.tree.root
        self.inc_lock_ref(node)
        self.evict_for(need * ps)
        self.admit(child_id, key, node, shared, num_tokens, self.final_tokens[parent_id])
        return AppendResult((), num_tokens - shared)

    def free(self, seq_id: int) -> None:
        """Release the sequence; its tokens stay cached (evictable) when prefix caching is on."""
        self.release(seq_id, self.tokens(seq_id), insert=True)

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """The page ids of the sequence's path and private pages, binding any not bound yet."""
        s = self._seqs[seq_id]
        out: list[int] = []
        for node in self.tree.path(s.node):
            if not node.pages:
                node.pages = self._bind((node.end - node.start) // self.page_size)
            out.extend(node.pages)
        missing = self.pages_for(self.tokens(seq_id)) - s.protected // self.page_size - len(s.pages)
        if missing > 0:
            s.pages.extend(self._bind(missing))
        out.extend(s.pages)
        return tuple(out)

    def slot_mapping(self, seq_id: int, start: int, num_tokens: int) -> list[int]:
        table, ps = self.block_table(seq_id), self.page_size
        return [table[p // ps] * ps + p % ps for p in range(start, start + num_tokens)]

    # ------------------------------------------------------------------ pages
    def _take(self, n: int) -> None:
        assert n <= self.free_pages, f"{n} pages asked, {self.free_pages} free: evict first"
        self.free_pages -= n
        self._private_pages += n

    def _give(self, n: int, ids: list[int]) -> None:
        self.free_pages += n
        self._private_pages -= n
        self._free_ids.extend(ids)

    def _bind(self, n: int) -> list[int]:
        ids = self._free_ids[len(self._free_ids) - n:]
        del self._free_ids[len(self._free_ids) - n:]
        ids.reverse()
        return ids

    def _add_shared(self, delta: int) -> None:
        self._dup_slots += delta
        self._saved_tokens += delta

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        tree, ps = self.tree, self.page_size
        tree.check()
        for seq_id, s in self._seqs.items():  # lockstep counts into the declared ones
            self.num_tokens[seq_id] = self.tokens(seq_id)
        locks: dict[int, int] = {}
        sum_alloc = sum_useful = private = 0
        bound = list(self._free_ids)
        phase = [0] * ps
        for seq_id, s in self._seqs.items():
            n = self.num_tokens[seq_id]
            assert s.protected <= n and s.protected % ps == 0, (seq_id, s.protected, n)
            assert s.node.end == s.protected, (seq_id, s.node.end, s.protected)
            for node in tree.path(s.node):
                locks[id(node)] = locks.get(id(node), 0) + 1
                assert _common_end(node.key, s.key, node.start, node.end) == node.end, \
                    f"sequence {seq_id} locks tokens that are not its own"
            pages = self.pages_for(n) - s.protected // ps
            assert len(s.pages) <= pages
            private += pages
            bound.extend(s.pages)
            sum_alloc += self.pages_for(n) * ps
            sum_useful += min(self.pages_for(n) * ps, self.final_tokens[seq_id])
            if s.grow_from >= 0:
                phase[s.phase] += 1
                assert (s.tokens - s.grow_from) % ps == s.phase
        for node in tree.nodes():
            assert node.lock_ref == locks.get(id(node), 0), "lock_ref != running sequences through the node"
            bound.extend(node.pages)
        assert phase == self._phase and sum(phase) == self._num_lockstep
        assert private == self._private_pages
        in_tree = (tree.evictable_size + tree.protected_size) // ps
        assert self.free_pages + in_tree + private == self.num_pages, "pages not conserved"
        # every page id is free, or bound to exactly one node or sequence
        assert sorted(bound) == list(range(self.num_pages)), "page ids not conserved"
        assert self.enable_prefix_caching or not tree.root.children
        assert self.cache_generation == tree.generation
        self._check_aggregates(sum_alloc, sum_useful, tree.shared_tokens, tree.shared_tokens)
