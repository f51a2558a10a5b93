"""vLLM-style paged KV allocator: a block pool, per-sequence block tables, copy-on-write, prefix caching.

::

    sequence A (23 tokens, B=8)        block table      physical pool
    ┌────────┬────────┬───────┐        [7, 1, 4]        0 [........]
    │tok 0-7 │tok 8-15│16-22 _│  ──>                     1 [AAAAAAAA]
    └────────┴────────┴───────┘                          4 [AAAAAAA_]  <- 1 slot of internal waste
                                                         7 [AAAAAAAA]

Every block has a reference count (how many block tables point at it). A block is in exactly one
of three places: referenced by at least one table, on the plain free list, or — when prefix caching
is on and it holds a full block — on the *evictable* list, where a block of known content (a
hash) is still findable until it is reused.

Orderings that matter:

* **Grow before write.** ``append(seq, n)`` is called before the tokens are written; the position
  ``n - 1`` must already have a block. A prompt that fills its last block exactly therefore gets
  its next block on the first decode step, not at prefill.
* **Copy-on-write per block.** Writing into a partially filled last block that another table
  shares first copies that one block (``(src, dst)`` reported to the executor); full shared blocks
  are never copied.
* **Which free block is reused** — vLLM V1's rule since vllm-project/vllm#42656 ("Apply LRU
  policy only to proper cache entries", merged 2026-05-14; read in vLLM 0.33.0's
  vllm/v1/core/block_pool.py, ``BlockPool.free_blocks`` / ``get_new_blocks``). The free blocks
  are one queue (``FreeKVCacheBlockQueue``): new blocks are popped from its head, and a popped
  block that holds a cached hash is evicted then. ``free_blocks`` puts a freed block without a
  hash at the *head* ("LIFO reuse of non-cached blocks") and one with a hash at the *tail*
  ("FIFO reuse of cached blocks for LRU eviction"). vLLM hashes every full block, generated
  tokens included (``cache_full_blocks``), so the head gets the partial last blocks and the
  tail every full one. Here that is the plain free list (a stack: the last block freed onto it
  is reused first; at start block 0 first) ahead of the evictable list (least recently freed
  first). A sequence's blocks are released tail first (vllm/v1/core/single_type_kv_cache_manager.py,
  ``free``: ``reversed``), so within one sequence the tail is evicted before the prefix — the part
  other requests are likeliest to share. Hashes are the workload's (trace hash ids, a preempted
  request's own blocks: simulator/scheduler/v1.py): a full block nobody names is *anonymous* — it
  joins the evictable list as vLLM's hashed block does, but nothing can hit it, so the hits, the
  evictions of named blocks and the block each request gets are vLLM's without hashing every
  block. A sequence's last block counts as full when the sequence's final length fills it: exact
  for a finished sequence; a sequence freed earlier (preempted) may not have filled it yet, so
  one block per preemption may join the evictable list where vLLM would put it in front (vLLM V1
  names a preempted request's full blocks itself: simulator/scheduler/v1.py). Before vllm#42656
  every freed block went to the tail; ``full_blocks_lru=False`` keeps the earlier kvplan rule
  (only named blocks are evictable), which the TensorRT-LLM engine uses.

**The CPU offload tier** (``offload_blocks > 0``, scenario key ``kv_offload``) models vLLM's
OffloadingConnector with its CPU backend (vllm/distributed/kv_transfer/kv_connector/v1/
offloading/scheduler.py, ``OffloadingConnectorScheduler``; vllm/v1/kv_offload/cpu/manager.py,
``CPUOffloadingManager``; newest versions read):

* *What is stored, when.* Write-through, not on eviction: every step the connector hands each
  scheduled request's newly full blocks to ``prepare_store`` (``_get_reqs_to_store``), which
  skips hashes already stored. So a block is copied to CPU as soon as it is full and computed,
  and stays in HBM's prefix cache too: **a hash may be in both tiers** (HBM eviction does not
  touch the CPU tier). Here the store happens where the block's hash is registered in HBM's
  cache (``_register_hashes``), with the same range: from the first block not yet stored (block
  0 for a request that loaded nothing: ``_next_stored_block_idx`` starts at 0, so HBM hits
  missing from the CPU tier are stored again) to the last full one.
* *Eviction.* LRU over hashes (vllm/v1/kv_offload/cpu/policies/lru.py, ``LRUCachePolicy``): a
  store that does not fit drops the least recently used hashes, never one of the blocks being
  stored (``protected``); if even that cannot make room the store is skipped
  (``prepare_store`` returns ``None``). After a store, the request's blocks from the first are
  touched in reverse order, so its first block is the most recently used (``touch``).
* *Lookup order.* HBM's cache first, then the CPU tier from the first HBM miss on
  (``get_num_new_matched_tokens(request, num_computed_tokens)``: ``manager.lookup`` of the
  hashes from ``num_computed_tokens // block_size``), counting consecutive hits. Capped, like
  HBM hits, to leave the last prompt token to compute (vLLM loads that block and recomputes the
  token: vllm/v1/core/sched/scheduler.py, ``_update_waiting_for_remote_kv``).
* *Loads.* A CPU hit needs a fresh HBM block (``update_state_after_alloc`` loads into the
  blocks the scheduler allocated), which becomes a cached HBM block again. vLLM loads them
  asynchronously before the request's first step; here they are counted
  (:meth:`take_loaded_blocks`) and the scheduler adds them to the admitting step's
  ``num_swap_in_blocks``, costed over PCIe like a swap-in. The request's hashes are touched at
  its admission (vLLM touches them at every ``get_num_new_matched_tokens`` call).
* Simplified: stores complete at once (vLLM's become loadable when the worker reports them
  done), and the offloaded block is the GPU block (the default: ``offloaded_block_size`` is
  the GPU block size unless ``block_size`` is set, vllm/v1/kv_offload/spec.py,
  ``OffloadingSpec.__init__``).

The tier holds hashes only: ``OrderedDict`` hash -> None, least recently used first. Off, it is
``None`` and costs one ``is not None`` test per registration and per allocation.

Where the time goes: the simulator calls the allocator only at a block boundary, and there
``grow``, which takes the block and answers the room to the next boundary in one call (``append``
then ``tokens_until_append`` for a forked sequence), so the hot paths are a private last block
growing by one block (from the free list, or by evicting one cached block) and
``allocate``/``free`` of whole prompts. Those are written out inline, a request without block
hashes skips the prefix-cache walk, and per-block prefix-cache work (registering a full block's
hash) runs only once a block is full, never for a token that stays inside its block. The
evictable list is a plain list read from a head index, so a finished request's full blocks join
it, and a new request's blocks leave it, as list slices; a prefix-cache hit on a free block
leaves that block's entry behind, skipped when it reaches the head. (As an ordered dict, one
entry per block, it made a paged chat.yaml run about 30% slower.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import islice

from simulator.kv.allocator import (
    NO_COPIES,
    AllocFailure,
    Allocation,
    AppendResult,
    KVAllocator,
    blocks_before_eviction,
)


class PagedAllocator(KVAllocator):
    forks_share_memory = True

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 offload_blocks: int = 0, full_blocks_lru: bool = True):
        """``offload_blocks``: size of the CPU offload tier in blocks (0: none); it needs prefix
        caching, whose block hashes it stores. ``full_blocks_lru``: with prefix caching, every full
        block freed joins the evictable list as vLLM's hashed blocks do (module docstring); False:
        only named ones."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if offload_blocks < 0 or (offload_blocks and not enable_prefix_caching):
            raise ValueError(f"offload_blocks {offload_blocks} needs to be >= 0, and prefix caching")
        super().__init__()
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.capacity_tokens = num_blocks * block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.fill = [0] * num_blocks  # written slots of a block as last declared (exact when shared)
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tables: dict[int, list[int]] = {}
        # pop() hands out block 0 first: easier to read in tests and plots
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # the evictable list: full blocks freed (named ones, with a hash, and anonymous ones),
        # least recently freed first, as _lru[_lru_head:]. A hit takes a block out of the middle
        # lazily: its entry stays, counted in _stale (a block's entries are in the order they
        # were appended and only its newest can be live, so the first met from the head is a
        # stale one while its count is above 0). Appends and takes are list slices (C speed)
        self._lru: list[int] = []
        self._lru_head = 0
        self._lru_live = 0  # live entries
        self._stale = [0] * num_blocks
        self._num_stale = 0
        self._full_lru = enable_prefix_caching and full_blocks_lru
        self._num_cached_free = 0  # named blocks on the evictable list
        self._cache: dict[int, int] = {}  # block hash -> block id
        self._seq_hashes: dict[int, Sequence[int]] = {}
        self._num_hashed: dict[int, int] = {}  # blocks of the seq whose hash was considered
        # seq -> token count at which its next hash can be registered (its next block is full);
        # only sequences with hashes still to consider, so that append checks one threshold
        self._hash_due: dict[int, int] = {}
        # sequences that took part in a fork: without prefix caching, only their blocks can be
        # shared, so any other sequence's blocks all go back to the free list in bulk
        self._fork_family: set[int] = set()
        # statistics
        self.num_cow_copies = 0
        self.num_evictions = 0
        self.num_hit_blocks = 0
        self.num_queried_blocks = 0
        # the CPU offload tier (module docstring): hash -> None, least recently used first
        self.offload_blocks = offload_blocks
        self._offload: OrderedDict[int, None] | None = OrderedDict() if offload_blocks else None
        self._offload_next: dict[int, int] = {}  # seq -> its first block not yet stored
        self._loaded_blocks = 0  # loaded from the CPU tier since take_loaded_blocks()
        self.num_offload_hit_blocks = 0  # CPU-tier hits (= blocks loaded), all admissions
        self.num_offload_stored_blocks = 0
        self.num_offload_evictions = 0

    # ------------------------------------------------------------------ queries
    def num_free_blocks(self) -> int:
        """Blocks a new allocation can take: plain free plus evictable cached ones."""
        return len(self._free) + self._lru_live

    def num_free_tokens(self) -> int:
        return self.num_free_blocks() * self.block_size

    def free_blocks_for_growth(self) -> int:
        """Every free block, evictable cached ones included: a sequence growing its private last
        block by one block takes a plain free block or evicts one, never needs more."""
        return self.num_free_blocks()

    def num_cached_blocks(self) -> int:
        return len(self._cache)

    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached hash (findable until reused)."""
        return self._num_cached_free

    def free_blocks_before_eviction(self, limit: int) -> int:
        """Blocks that can be taken (up to ``limit``) before one that holds a cached hash is:
        that many single-block appends evict nothing (:func:`~simulator.kv.allocator.
        blocks_before_eviction`)."""
        return blocks_before_eviction(len(self._free), self._lru_blocks(), self._lru_live, self.block_hash,
                                      self._num_cached_free, limit)

    def evictable_blocks(self) -> list[int]:
        """The evictable list, least recently freed (the next reused) first."""
        return list(self._lru_blocks())

    def _lru_blocks(self) -> Iterator[int]:
        """The evictable list's live entries, head first."""
        lru, stale = self._lru, self._stale
        if not self._num_stale:
            yield from islice(lru, self._lru_head, None)
            return
        seen: dict[int, int] = {}
        for b in islice(lru, self._lru_head, None):
            k = seen.get(b, 0)
            if k < stale[b]:
                seen[b] = k + 1
            else:
                yield b

    def has_unreferenced_hit(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> bool:
        """Whether a block that :meth:`lookup` would find is free (cached, unreferenced): an
        eviction may then take it and shorten the hit. Walks the hits until the first such one."""
        if not block_hashes or not self._num_cached_free:
            return False
        max_blocks = (num_prompt_tokens - 1) // self.block_size
        ref_count = self.ref_count
        return any(ref_count[b] == 0 for b in self._leading_hits(block_hashes, max_blocks))

    def allocated_tokens(self, seq_id: int) -> int:
        return len(self.block_tables[seq_id]) * self.block_size

    def external_fragmentation(self, head: tuple[int, ...] | None) -> int:
        return 0  # any free block serves any request

    def min_pool_tokens(self, num_prompt: int, final_tokens: int, num_seqs: int) -> int:
        """The full prompt blocks are shared by all sequences; the rest is private to each."""
        total = self.blocks_needed(final_tokens)
        private = total - num_prompt // self.block_size
        return (total + (num_seqs - 1) * private) * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _leading_hits(self, block_hashes: Sequence[int], max_blocks: int) -> list[int]:
        hits: list[int] = []
        if not self.enable_prefix_caching:
            return hits
        cache = self._cache
        for h in block_hashes[:max_blocks]:
            b = cache.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def lookup(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """Prompt tokens a new sequence would find in the prefix cache now.

        At least one prompt token is always computed (its logits produce the first output token),
        so a fully cached prompt reports one block less. The answer depends only on which hashes
        are cached, so it stays valid while ``cache_generation`` does not change.
        """
        if not block_hashes or not self.enable_prefix_caching:
            return 0
        max_blocks = (num_prompt_tokens - 1) // self.block_size
        hits = len(self._leading_hits(block_hashes, max_blocks))
        if self._offload is not None:  # HBM first, then the CPU tier from the first miss on
            hits += self._offload_hits(block_hashes, hits, max_blocks)
        return hits * self.block_size

    def cache_blocks(self, seq_id: int, block_hashes: Sequence[int], num_tokens: int) -> None:
        """Register the sequence's blocks that its first ``num_tokens`` tokens fill under
        ``block_hashes`` (the ids of its blocks from the first on; it extends the hashes the
        sequence was allocated with), so that they stay findable once it is freed.

        vLLM V1 names every full block of a request, generated tokens included, and keeps the
        ids on the request "in case it will be preempted" (vllm/v1/core/block_pool.py,
        ``BlockPool.cache_full_blocks``). The simulator names a sequence's own blocks only when
        it is preempted (simulator/scheduler/v1.py): ordinary sequences never pay for it.
        Without prefix caching nothing is cached.
        """
        if not self.enable_prefix_caching:
            return
        self._seq_hashes[seq_id] = block_hashes
        done = self._num_hashed.setdefault(seq_id, 0)
        if done < len(block_hashes):
            self._hash_due[seq_id] = (done + 1) * self.block_size
        self._register_hashes(seq_id, num_tokens)

    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        table = self.block_tables[seq_id]
        capacity = len(table) * self.block_size
        if num_written < capacity:  # the common case first: room left in the last block
            if self.ref_count[table[-1]] > 1:
                return 0  # the next write lands in a shared block: copy-on-write first
            return capacity - num_written
        return capacity - num_written if table else 0

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self.block_tables[seq_id])

    def slot_mapping(self, seq_id: int, start: int, num_tokens: int) -> list[int]:
        """Flat pool slots (block * block_size + offset) of positions start .. start+num_tokens-1."""
        table, bs = self.block_tables[seq_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, start + num_tokens)]

    def take_loaded_blocks(self) -> int:
        """Blocks loaded from the CPU offload tier since the last call (and reset to 0)."""
        n = self._loaded_blocks
        self._loaded_blocks = 0
        return n

    # ------------------------------------------------------------------ CPU offload tier
    def _offload_hits(self, block_hashes: Sequence[int], start: int, max_blocks: int) -> int:
        """Consecutive hashes from ``start`` (below ``max_blocks``) held by the CPU tier
        (vLLM's ``OffloadingManager.lookup`` of the hashes after the HBM hit)."""
        tier = self._offload
        n = 0
        for h in block_hashes[start:max_blocks]:
            if h not in tier:  # type: ignore[operator]
                break
            n += 1
        return n

    def _offload_touch(self, block_hashes: Sequence[int]) -> None:
        """Make the held ones of ``block_hashes`` the most recently used, the first one last
        (vllm/v1/kv_offload/cpu/policies/lru.py, ``LRUCachePolicy.touch``: reversed order)."""
        tier = self._offload
        move = tier.move_to_end  # type: ignore[union-attr]
        for h in reversed(block_hashes):
            if h in tier:  # type: ignore[operator]
                move(h)

    def _offload_store(self, seq_id: int, hashes: Sequence[int], upto: int) -> None:
        """Store the sequence's full blocks up to ``upto`` not stored yet, as the connector's
        ``_get_reqs_to_store`` and ``CPUOffloadingManager.prepare_store`` do: skip hashes the
        tier holds, make room by dropping least recently used hashes other than this range's,
        give up (retried at the next store) when that cannot make room, touch the sequence's
        blocks."""
        tier = self._offload
        assert tier is not None
        start = self._offload_next.get(seq_id, 0)
        new = [h for h in hashes[start:upto] if h not in tier]
        if new:
            over = len(tier) + len(new) - self.offload_blocks
            if over > 0:
                protected = set(hashes[start:upto])
                victims = []
                for h in tier:  # least recently used first
                    if h not in protected:
                        victims.append(h)
                        if len(victims) == over:
                            break
                if len(victims) < over:
                    return  # prepare_store returns None: nothing stored, nothing advanced
                for h in victims:
                    del tier[h]
                self.num_offload_evictions += over
            for h in new:
                tier[h] = None
            self._offload_touch(hashes[:upto])
            self.num_offload_stored_blocks += len(new)
            self.cache_generation += 1
        self._offload_next[seq_id] = upto

    # ------------------------------------------------------------------ block pool
    def _take_block(self) -> int:
        """A fresh block with refcount 1 (the caller checked availability)."""
        if self._free:
            b = self._free.pop()
        else:
            b = self._evict(1)[0]
        self.ref_count[b] = 1
        return b

    def _evict(self, n: int) -> list[int]:
        """Take the ``n`` least recently freed blocks of the evictable list (the caller checked
        there are that many), oldest first, evicting the hashes of the named ones; their
        refcounts stay 0."""
        lru, head = self._lru, self._lru_head
        if not self._num_stale:
            out = lru[head:head + n]
            head += n
        else:
            stale, out = self._stale, []
            while len(out) < n:
                b = lru[head]
                head += 1
                if stale[b]:
                    stale[b] -= 1
                    self._num_stale -= 1
                else:
                    out.append(b)
        self._lru_live -= n
        if head > 4096 and 2 * head > len(lru):  # drop the taken entries, amortised O(1)
            del lru[:head]
            head = 0
        self._lru_head = head
        if self._num_cached_free:
            cache, block_hash = self._cache, self.block_hash
            evicted = 0
            for b in out:
                h = block_hash[b]
                if h is not None:
                    del cache[h]
                    block_hash[b] = None
                    evicted += 1
            if evicted:
                self._num_cached_free -= evicted
                self.num_evictions += evicted
                self.cache_generation += 1
        return out

    def _release(self, b: int) -> None:
        """Drop one reference to ``b``, a block another table shares (copy-on-write's source)."""
        rc = self.ref_count[b] - 1
        assert rc > 0, "copy-on-write releases a shared block"
        self.ref_count[b] = rc
        self._dup_slots -= self.block_size
        self._saved_tokens -= self.fill[b]

    def _share(self, b: int) -> None:
        """Add one reference to a block already referenced or evictable."""
        rc = self.ref_count[b]
        if rc == 0:  # a named free block (a prefix-cache hit): off the evictable list (touch)
            self._stale[b] += 1
            self._num_stale += 1
            self._lru_live -= 1
            self._num_cached_free -= 1
            if self._num_stale > self.num_blocks:  # rebuild without the stale entries
                self._lru = list(self._lru_blocks())
                self._lru_head = 0
                self._stale = [0] * self.num_blocks
                self._num_stale = 0
        else:
            self._dup_slots += self.block_size
            self._saved_tokens += self.fill[b]
        self.ref_count[b] = rc + 1

    def _register_hashes(self, seq_id: int, num_tokens: int) -> None:
        """Cache the sequence's blocks that ``num_tokens`` fills and whose hash is known.

        Callers skip it below ``_hash_due[seq_id]`` (nothing new is full): the check is one dict
        lookup per append, the loop runs once per full block.
        """
        hashes = self._seq_hashes.get(seq_id)
        if not hashes:
            return
        done = self._num_hashed[seq_id]
        bs = self.block_size
        upto = min(len(hashes), num_tokens // bs)
        if self._offload is not None and upto > self._offload_next.get(seq_id, 0):
            self._offload_store(seq_id, hashes, upto)
        if upto <= done:
            return
        table, cache, block_hash = self.block_tables[seq_id], self._cache, self.block_hash
        num_cached = len(cache)
        for h, b in zip(hashes[done:upto], table[done:upto]):
            if block_hash[b] is None and h not in cache:
                cache[h] = b
                block_hash[b] = h
        if len(cache) != num_cached:
            self.cache_generation += 1
        self._num_hashed[seq_id] = upto
        if upto < len(hashes):
            self._hash_due[seq_id] = (upto + 1) * bs
        else:
            self._hash_due.pop(seq_id, None)

    # ------------------------------------------------------------------ interface
    def can_allocate(
        self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = (), *,
        reserve_blocks: int = 0,
    ) -> bool:
        """As the interface says; ``reserve_blocks`` more must stay free after it (an admission
        watermark: simulator/scheduler/v1.py)."""
        need = self.blocks_needed(num_tokens)
        hits = self._leading_hits(block_hashes, max(num_tokens - 1, 0) // self.block_size)
        evictable_hits = sum(1 for b in hits if self.ref_count[b] == 0)
        return need - len(hits) + evictable_hits + reserve_blocks <= self.num_free_blocks()

    def allocate(
        self, seq_id: int, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = ()
    ) -> Allocation | None:
        if seq_id in self.block_tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        bs = self.block_size
        need = -(-num_tokens // bs)
        hashed = bool(block_hashes) and self.enable_prefix_caching
        max_hits = min(len(block_hashes), max(num_tokens - 1, 0) // bs) if hashed else 0
        if need - max_hits > len(self._free) + self._lru_live:  # too big whatever is cached:
            self.last_failure = AllocFailure.NO_SPACE  # no walk over the hashes (a head waiting)
            return None
        hits: list[int] = []
        loaded = 0
        if hashed:  # a request without hashes (or caching off) has no hit: it fits, as checked
            hits = self._leading_hits(block_hashes, max(num_tokens - 1, 0) // bs)
            evictable_hits = sum(1 for b in hits if self.ref_count[b] == 0)
            # CPU-tier hits need fresh blocks like any miss: counted in need - len(hits) already
            if need - len(hits) + evictable_hits > self.num_free_blocks():
                self.last_failure = AllocFailure.NO_SPACE
                return None
            self.num_queried_blocks += min(len(block_hashes), max(num_tokens - 1, 0) // bs)
            self.num_hit_blocks += len(hits)
            if self._offload is not None:
                self._offload_touch(block_hashes)
                loaded = self._offload_hits(block_hashes, len(hits), max(num_tokens - 1, 0) // bs)
                # vLLM stores from block 0 unless it loaded (_next_stored_block_idx)
                self._offload_next[seq_id] = len(hits) + loaded if loaded else 0
                self._loaded_blocks += loaded
                self.num_offload_hit_blocks += loaded
        for b in hits:  # claim the hits before taking new blocks: eviction must not reach them
            self._share(b)
        num_new = need - len(hits)
        free_list, ref_count, fill = self._free, self.ref_count, self.fill
        if num_new <= len(free_list):  # the common case, in bulk: no eviction needed
            new = free_list[len(free_list) - num_new :]
            del free_list[len(free_list) - num_new :]
            new.reverse()  # the same order as popping one at a time
        else:  # all the plain free blocks (in pop order), then evict the rest, oldest first
            new = free_list[::-1]
            free_list.clear()
            new += self._evict(num_new - len(new))
        for b in new:
            ref_count[b] = 1
            fill[b] = bs
        table = hits + new if hits else new
        if need:  # the last block is a new one: the hits stop before the last prompt token's block
            fill[table[-1]] = num_tokens - (need - 1) * bs
        self.block_tables[seq_id] = table
        self.num_tokens[seq_id] = num_tokens
        self.final_tokens[seq_id] = final_tokens
        self._sum_alloc += need * bs
        self._sum_useful += min(need * bs, final_tokens)
        self._sum_tokens += num_tokens
        if hashed:
            self._seq_hashes[seq_id] = block_hashes
            self._num_hashed[seq_id] = len(hits)
            if len(hits) < len(block_hashes):
                self._hash_due[seq_id] = (len(hits) + 1) * bs
            self._register_hashes(seq_id, num_tokens)
        return Allocation(seq_id, (len(hits) + loaded) * bs, need * bs)

    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        table = self.block_tables[seq_id]
        bs, ref_count = self.block_size, self.ref_count
        old_len = len(table)
        capacity = old_len * bs
        # the common cases first. A caller that appends per token lands here: room left in a
        # private last block
        if 0 < num_tokens <= capacity and ref_count[table[-1]] == 1:
            old_tokens = self.num_tokens[seq_id]
            if num_tokens > old_tokens:
                self.fill[table[-1]] = num_tokens - capacity + bs
                self.num_tokens[seq_id] = num_tokens
                self._sum_tokens += num_tokens - old_tokens
                hash_due = self._hash_due
                if hash_due and num_tokens >= hash_due.get(seq_id, num_tokens + 1):
                    self._register_hashes(seq_id, num_tokens)
            return NO_COPIES
        fill = self.fill
        private_last = not old_len or ref_count[table[-1]] == 1
        # the simulator's hot path: one new block after a private full one (grow's fast path, the
        # same conditions), or nothing to declare; everything else takes the general path
        if private_last and num_tokens <= capacity + bs and (
            num_tokens <= capacity or self._free or self._lru_live
        ):
            if num_tokens > capacity:
                self.grow(seq_id, num_tokens)
            return NO_COPIES  # else num_tokens <= 0: the common case above took every other
        cow = False
        if table:
            last = table[-1]
            # the write reaches into a shared, partially filled last block -> copy it first
            cow = ref_count[last] > 1 and fill[last] < bs and num_tokens > (old_len - 1) * bs + fill[last]
        need = max(self.blocks_needed(num_tokens), old_len)
        extra = need - old_len
        if extra + cow > self.num_free_blocks():
            self.last_failure = AllocFailure.NO_SPACE
            return None
        result = NO_COPIES
        if cow:
            src = table[-1]
            dst = self._take_block()
            fill[dst] = fill[src]
            self._release(src)
            table[-1] = dst
            self.num_cow_copies += 1
            result = AppendResult(((src, dst),), fill[src])
        for _ in range(extra):
            table.append(self._take_block())
        if extra:
            final = self.final_tokens[seq_id]
            self._sum_alloc += extra * bs
            self._sum_useful += min(need * bs, final) - min(old_len * bs, final)
        old_tokens = self.num_tokens[seq_id]
        if num_tokens > old_tokens:
            for i in range(max(old_len - 1, 0), need - 1):
                fill[table[i]] = bs  # the old last block and any skipped ones are full now
            fill[table[need - 1]] = num_tokens - (need - 1) * bs
            self.num_tokens[seq_id] = num_tokens
            self._sum_tokens += num_tokens - old_tokens
            if num_tokens >= self._hash_due.get(seq_id, num_tokens + 1):
                self._register_hashes(seq_id, num_tokens)
        return result

    def grow(self, seq_id: int, num_tokens: int) -> int | None:
        """As the interface says. Its fast path — one new block after a private last block, which
        is every block boundary of a decoding sequence — is written out: the room it returns is
        the new block's, known without asking. Anything else goes through :meth:`append`."""
        table = self.block_tables[seq_id]
        bs, ref_count, free = self.block_size, self.ref_count, self._free
        old_len = len(table)
        capacity = old_len * bs
        if not (capacity < num_tokens <= capacity + bs and (free or self._lru_live)
                and (not old_len or ref_count[table[-1]] == 1)):
            return super().grow(seq_id, num_tokens)
        if free:
            b = free.pop()
        else:  # on a full pool this is every decode block
            b = self._evict(1)[0]
        ref_count[b] = 1
        fill = self.fill
        if old_len:
            fill[table[-1]] = bs
        fill[b] = num_tokens - capacity
        table.append(b)
        final = self.final_tokens[seq_id]
        self._sum_alloc += bs
        if final > capacity:  # Σ min(allocated, final) grows by what of the block is useful
            self._sum_useful += bs if final >= capacity + bs else final - capacity
        declared = self.num_tokens
        self._sum_tokens += num_tokens - declared[seq_id]
        declared[seq_id] = num_tokens
        hash_due = self._hash_due
        if hash_due and num_tokens >= hash_due.get(seq_id, num_tokens + 1):
            self._register_hashes(seq_id, num_tokens)
        return capacity + bs - num_tokens + 1  # tokens_until_append(seq_id, num_tokens - 1)

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> AppendResult | None:
        if child_id in self.block_tables:
            raise ValueError(f"sequence {child_id} is already allocated")
        table = self.block_tables[parent_id]
        bs = self.block_size
        if num_tokens > len(table) * bs:
            raise ValueError(f"fork of {num_tokens} tokens but sequence {parent_id} holds {len(table) * bs} slots")
        # bring the parent's declared length up to date: the fill of the block about to be shared
        # must be exact, since nobody may write into it while it is shared
        self.append(parent_id, num_tokens)
        n = self.blocks_needed(num_tokens)
        child = table[:n]
        for b in child:
            self._share(b)
        final = self.final_tokens[parent_id]
        self.block_tables[child_id] = child
        self.num_tokens[child_id] = num_tokens
        self.final_tokens[child_id] = final
        self._sum_alloc += n * bs
        self._sum_useful += min(n * bs, final)
        self._sum_tokens += num_tokens
        self._fork_family.add(parent_id)
        self._fork_family.add(child_id)
        if parent_id in self._seq_hashes:
            hashes = self._seq_hashes[child_id] = self._seq_hashes[parent_id]
            done = self._num_hashed[child_id] = min(self._num_hashed[parent_id], n)
            if done < len(hashes):
                self._hash_due[child_id] = (done + 1) * bs
        return NO_COPIES

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks tail first (module docstring, "Which free block is
        reused"): with prefix caching its full blocks join the evictable list (anonymous ones
        too, unless ``full_blocks_lru`` is off), its partial last block and every block without
        prefix caching go on the plain free list, the first released reused first."""
        table = self.block_tables.pop(seq_id)
        ref_count = self.ref_count
        bs = self.block_size
        full = 0  # blocks before the last are full; the last when the final length fills it
        if self._full_lru:
            full = len(table) if self.final_tokens[seq_id] >= len(table) * bs else len(table) - 1
        if (seq_id not in self._seq_hashes and seq_id not in self._fork_family) or (
            not self._cache and not self._dup_slots
        ):
            # nothing of it is shared or named: every block goes straight back, in bulk. Only a
            # fork or a prefix-cache hit shares a block, and only a sequence given block hashes
            # (``_seq_hashes``) hits or names its blocks.
            for b in table:
                ref_count[b] = 0
            if not self._full_lru:
                self._free.extend(table)  # the tail on top: reused first
            else:
                if full < len(table):
                    self._free.append(table[-1])
                if full:
                    self._lru.extend(table[full - 1::-1])  # tail first
                    self._lru_live += full
        else:  # per block, written out: this loop runs once per block of every request
            block_hash, lru, fill = self.block_hash, self._lru, self.fill
            full_lru = self._full_lru
            front: list[int] = []
            dup = saved = named = 0
            joined = len(lru)
            for i in range(len(table) - 1, -1, -1):  # tail first: evicted before the shared prefix
                b = table[i]
                rc = ref_count[b] - 1
                ref_count[b] = rc
                if rc:
                    dup += bs
                    saved += fill[b]
                elif block_hash[b] is not None:
                    lru.append(b)  # most recently freed: evicted last
                    named += 1
                elif full_lru and i < full:
                    lru.append(b)  # anonymous: in the same order, nothing to evict
                else:
                    front.append(b)
            if front:
                front.reverse()
                self._free.extend(front)  # the first released on top: reused first
            self._dup_slots -= dup
            self._saved_tokens -= saved
            self._num_cached_free += named
            self._lru_live += len(lru) - joined
        final = self.final_tokens.pop(seq_id)
        self._sum_alloc -= len(table) * bs
        self._sum_useful -= min(len(table) * bs, final)
        self._sum_tokens -= self.num_tokens.pop(seq_id)
        self._seq_hashes.pop(seq_id, None)
        self._num_hashed.pop(seq_id, None)
        self._hash_due.pop(seq_id, None)
        self._fork_family.discard(seq_id)
        if self._offload is not None:
            self._offload_next.pop(seq_id, None)

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        bs = self.block_size
        refs = [0] * self.num_blocks
        sum_alloc = sum_useful = 0
        for seq_id, table in self.block_tables.items():
            for b in table:
                refs[b] += 1
            n = self.num_tokens[seq_id]
            assert len(table) == self.blocks_needed(n), (seq_id, len(table), n)
            sum_alloc += len(table) * bs
            sum_useful += min(len(table) * bs, self.final_tokens[seq_id])
        assert refs == self.ref_count, "refcount != number of block tables pointing at the block"
        free = set(self._free)
        live = self.evictable_blocks()
        evictable = set(live)
        assert len(evictable) == len(live) == self._lru_live, "a block is twice on the evictable list"
        assert self._num_stale == sum(self._stale) <= len(self._lru) - self._lru_head
        assert len(free) == len(self._free), "a block is twice on the free list"
        assert not free & evictable, "a block is both free and evictable"
        used = {b for b in range(self.num_blocks) if refs[b] > 0}
        assert not used & (free | evictable), "a referenced block is on a free list"
        assert len(free) + len(evictable) + len(used) == self.num_blocks, "blocks not conserved"
        for b in free:
            assert self.block_hash[b] is None, f"free block {b} still has a hash"
        named = 0
        for b in evictable:
            h = self.block_hash[b]
            assert h is not None or self._full_lru, f"evictable block {b} not in the cache"
            if h is not None:
                assert self._cache[h] == b, f"evictable block {b} not in the cache"
                named += 1
        assert named == self._num_cached_free, "named free blocks miscounted"
        for h, b in self._cache.items():
            assert self.block_hash[b] == h, f"cache entry {h} -> {b} disagrees with the block"
        assert self.enable_prefix_caching or not self._cache
        for seq_id, hashes in self._seq_hashes.items():
            done = self._num_hashed[seq_id]
            due = (done + 1) * bs if done < len(hashes) else None
            assert self._hash_due.get(seq_id) == due, f"sequence {seq_id}: hash threshold {due} is stale"
        assert self._hash_due.keys() <= self._seq_hashes.keys() <= self.block_tables.keys()
        if not self.enable_prefix_caching:  # only forks share blocks, so free() may skip the rest
            for seq_id, table in self.block_tables.items():
                if seq_id not in self._fork_family:
                    assert all(refs[b] == 1 for b in table), f"sequence {seq_id} shares, unforked"
        if self._offload is None:
            assert not self.offload_blocks and not self._offload_next and not self._loaded_blocks
        else:
            # no disjointness to check: vLLM's stores are write-through, so a hash is in both
            # tiers while HBM's cache keeps it (module docstring)
            assert len(self._offload) <= self.offload_blocks, "CPU tier over its size"
            assert self._offload_next.keys() <= self.block_tables.keys(), "store index of a freed seq"
            for seq_id, nxt in self._offload_next.items():
                assert nxt <= self.num_tokens[seq_id] // bs, f"sequence {seq_id} stored unwritten blocks"
        dup = saved = 0
        for b in used:
            assert 0 < self.fill[b] <= bs or refs[b] == 1, f"shared block {b} with fill {self.fill[b]}"
            dup += (refs[b] - 1) * bs
            saved += (refs[b] - 1) * self.fill[b]
        self._check_aggregates(sum_alloc, sum_useful, dup, saved)
