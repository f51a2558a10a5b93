"""vLLM's hybrid KV cache manager as a paged allocator: one block pool, one block table per KV
cache group (:class:`~simulator.kv.sizing.HybridKVLayout`), prefix caching across groups.

A block id spans ``group_size`` layers (one page in each of ``group_size`` tensors), so every
group draws from the same ``num_blocks`` ids (vllm/v1/core/kv_cache_coordinator.py,
``HybridKVCacheCoordinator``: one ``BlockPool`` for all single-type managers). Per sequence and
group (vllm/v1/core/single_type_kv_cache_manager.py):

* full attention holds ``ceil(n / B)`` blocks;
* sliding window and chunked local attention hold the same blocks minus the leading ones their
  attention skips: before making room for more tokens, ``remove_skipped_blocks`` frees the
  ``get_num_skipped_tokens(num_computed) // B`` first blocks (``n − W + 1`` tokens for a
  window W, the whole chunks before the current one for chunked layers), whose ids go back to
  the pool. Here the computed tokens are the most the allocator knows of: the tokens declared
  before the call (grow before write: they are written before the next declaration), the
  written count last passed to ``tokens_until_append``, or at admission the prefix-cache hit.
  A sequence decoding a token at a time thus never holds more than ``ceil(W / B) + 1`` blocks
  in a sliding group;
* linear attention (``MambaManager``, ``mamba_cache_mode`` "none") holds one block, its state.

**Prefix caching** (token groups only) follows the coordinator:

* *Hashes per group.* A full block is registered under its hash in the cache of each group
  that still holds it (vllm/v1/core/block_pool.py, ``BlockPool.cache_full_blocks``: the key is
  ``BlockHashWithGroupId``; null blocks are skipped), when its tokens are declared (as
  ``KVCacheManager.allocate_slots`` calls ``cache_blocks`` for the tokens it schedules). A block
  whose last reference goes (the sequence freed, or a sliding group dropping it) stays findable
  on the evictable (LRU) list until a new block is needed and none is plain free (``BlockPool.
  get_new_blocks`` / ``_maybe_evict_cached_block``). Which list a freed block joins is
  :mod:`simulator.kv.paged`'s rule (vLLM 0.33.0's ``BlockPool.free_blocks``): a full block the
  evictable one (an anonymous full block too: vLLM hashes every full block), a partial one the
  plain free list, reused first. Blocks of a sequence are released group by group, each tail
  first (``KVCacheCoordinator.free``, ``SingleTypeKVCacheManager.free``); a window group's
  skipped blocks newest first (``_remove_blocks_in_range`` iterates backward).
* *The hit* is the longest prefix every group can serve, found by
  ``HybridKVCacheCoordinator.find_longest_cache_hit``: full groups first, each the leading run
  of cached blocks (``FullAttentionManager.find_longest_cache_hit``); then every other group
  either accepts the candidate length or shortens it, until none shortens it (a fixed point).
  A sliding group needs only the ``ceil((W − 1) / B)`` blocks before the hit point, searched
  from the right (``SlidingWindowManager.find_longest_cache_hit``: the earlier ones may be
  evicted already; a run from block 0 shorter than that is a hit too). A chunked group needs
  the blocks from the current chunk's start (``ChunkedLocalAttentionManager.
  find_longest_cache_hit``). At least one prompt token is computed, as in
  :class:`~simulator.kv.paged.PagedAllocator`.
* *Admission.* The hit's skipped blocks are never taken (``allocate_slots`` removes the
  blocks skipped at the computed tokens first); the group's hit blocks after them are shared
  (refcount + 1, taken off the LRU list), fresh blocks follow. Hit blocks are full, and the
  last block of a sequence is always its own, so nothing is ever copied.
* *Linear attention:* no prefix caching. A hit needs the Mamba state saved at the hit's block
  boundary (``MambaManager.find_longest_cache_hit`` looks up a cached state block), which only
  ``mamba_cache_mode`` "align" keeps: it sets the attention block size to the Mamba block size
  (vllm/model_executor/models/config.py, ``HybridAttentionMambaModelConfig.
  verify_and_update_config``) and makes the scheduler cut prefill chunks at block boundaries
  (vllm/v1/core/sched/scheduler.py, ``need_mamba_block_aligned_split``), which kvplan's
  schedulers do not model; such a model's pool runs with the cache off.

Accounting, in slots of one block id (``block_size`` tokens of ``group_size`` layers): a
sequence's allocation is its live blocks in every group × B; its token state is, per token
group, the written tokens its live blocks hold, plus a linear group's whole block (the state is
always written). With ``T`` token groups, ``written`` tokens in all, ``S`` skipped blocks in
all and ``D`` = Σ (refcount − 1) over shared blocks (all full), that is
``T·written − B·S + B·linear blocks − B·D``, and the pool holds ``Σ live blocks − D`` distinct
blocks: O(1) per snapshot.

Not modelled: the CPU offload tier, and shared forks (a fork copies its parent's live blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from simulator.kv.allocator import (
    NO_COPIES,
    AllocFailure,
    Allocation,
    AppendResult,
    KVAllocator,
    blocks_before_eviction,
)
from simulator.kv.model_config import CHUNKED_ATTENTION, LINEAR_ATTENTION, SLIDING_ATTENTION
from simulator.kv.sizing import HybridKVLayout, skipped_tokens


class HybridPagedAllocator(KVAllocator):
    """The block pool of a hybrid model, one block table per KV cache group (module docstring)."""

    forks_share_memory = False

    def __init__(self, num_blocks: int, layout: HybridKVLayout, *,
                 enable_prefix_caching: bool = False, full_blocks_lru: bool = True):
        """``enable_prefix_caching`` is ignored (off) for a model with linear-attention groups
        (module docstring); ``full_blocks_lru`` as :class:`~simulator.kv.paged.PagedAllocator`
        takes it."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        super().__init__()
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = layout.block_size
        self.capacity_tokens = num_blocks * layout.block_size
        # (kind, window) of each group whose blocks follow the tokens; linear groups apart
        self._token_groups = tuple((g.kind, g.window) for g in layout.groups
                                   if g.kind != LINEAR_ATTENTION)
        self._num_linear = len(layout.groups) - len(self._token_groups)
        self.slots_per_token = len(self._token_groups)  # token_state = groups × written − ...
        # a window group drops the blocks its sequences' windows leave at their growths, which
        # breaks the quiet-run argument (nothing freed while a batch only grows): with window
        # groups the engine runs single steps (randomised V1 workloads differed in ~4% of cases)
        self.quiet_runs = not any(window is not None for _, window in self._token_groups)
        self.enable_prefix_caching = enable_prefix_caching and not self._num_linear
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # seq -> per token group: [first live block index, live block ids...]
        self._skipped: dict[int, list[int]] = {}
        self._tables: dict[int, list[list[int]]] = {}
        self._states: dict[int, list[int]] = {}  # seq -> its linear groups' blocks
        self._written: dict[int, int] = {}  # seq -> written count last told (tokens_until_append)
        self._sum_skipped = 0  # Σ skipped blocks over sequences and token groups
        self._sum_blocks = 0  # Σ live blocks per sequence (token and linear groups)
        # the prefix cache (module docstring)
        self.ref_count = [0] * num_blocks
        self.block_hash: list[tuple[int, int] | None] = [None] * num_blocks  # (group, hash)
        self._caches: list[dict[int, int]] = [{} for _ in self._token_groups]  # hash -> block
        # full blocks freed (named or anonymous), unreferenced; least recently freed first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._full_lru = self.enable_prefix_caching and full_blocks_lru
        self._num_cached_free = 0  # named blocks on the evictable list
        self._dup_blocks = 0  # Σ (refcount − 1) over referenced blocks
        self._seq_hashes: dict[int, Sequence[int]] = {}
        self._num_hashed: dict[int, int] = {}  # blocks of the seq whose hash was considered
        self._hash_due: dict[int, int] = {}  # seq -> tokens that fill its next hashable block
        bs = self.block_size
        # the hit finders' order: full groups first, then the others (module docstring)
        self._finders = sorted(
            ((g, kind, window, -(-(window - 1) // bs) if kind == SLIDING_ATTENTION else window)
             for g, (kind, window) in enumerate(self._token_groups)),
            key=lambda f: f[1] in (SLIDING_ATTENTION, CHUNKED_ATTENTION))
        # blocks one block boundary of a decoding sequence takes: one in every token group
        self.blocks_per_growth = max(len(self._token_groups), 1)
        self.num_evictions = 0
        self.num_hit_blocks = 0
        self.num_queried_blocks = 0

    # ------------------------------------------------------------------ sizing rules
    def _blocks_after(self, computed: int, num_tokens: int) -> list[tuple[int, int]]:
        """Per token group, (skipped blocks, total blocks) once ``num_tokens`` are declared and
        the blocks skipped after ``computed`` tokens are dropped."""
        bs = self.block_size
        total = -(-num_tokens // bs)
        return [(min(skipped_tokens(kind, window, computed) // bs, total), total)
                for kind, window in self._token_groups]

    def _computed(self, seq_id: int) -> int:
        """Tokens of ``seq_id`` known to be computed (module docstring)."""
        declared = self.num_tokens[seq_id]
        written = self._written.get(seq_id, 0)
        return written if written > declared else declared

    # ------------------------------------------------------------------ prefix cache
    def _hit_blocks(self, block_hashes: Sequence[int], max_blocks: int) -> int:
        """Blocks of the longest prefix every group serves from the cache (module docstring:
        ``HybridKVCacheCoordinator.find_longest_cache_hit``'s fixed point)."""
        hit = min(len(block_hashes), max_blocks)
        if hit <= 0 or not self.enable_prefix_caching:
            return 0
        caches, bs = self._caches, self.block_size
        for g, kind, _, _ in self._finders:  # full groups: the leading run, once (downward closed)
            if kind not in (SLIDING_ATTENTION, CHUNKED_ATTENTION):
                cache, found = caches[g], 0
                while found < hit and block_hashes[found] in cache:
                    found += 1
                hit = found
        while hit:
            shortened = False
            for g, kind, window, need in self._finders:
                cache = caches[g]
                if kind == SLIDING_ATTENTION:  # the last `need` blocks, searched from the right
                    found = hit if not need else 0
                    run = 0
                    for i in range(hit - 1 if need else -1, -1, -1):
                        if block_hashes[i] in cache:
                            run += 1
                            if run >= need:
                                found = i + run
                                break
                        else:
                            run = 0
                    else:
                        if need:
                            found = run  # a run from block 0, shorter than the window
                elif kind == CHUNKED_ATTENTION:  # the blocks from the current chunk's start
                    found = hit * bs // window * window // bs
                    while found < hit and block_hashes[found] in cache:
                        found += 1
                else:
                    continue
                if found < hit:
                    hit, shortened = found, True
            if not shortened:
                break
        return hit

    def lookup(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """Prompt tokens a new sequence would find in the prefix cache now (module docstring);
        a fully cached prompt reports one block less, its last token being computed."""
        if not block_hashes or not self.enable_prefix_caching:
            return 0
        return self._hit_blocks(block_hashes, (num_prompt_tokens - 1) // self.block_size) * self.block_size

    def _admission(self, num_tokens: int, block_hashes: Sequence[int]) -> tuple[int, list[list[int]], int]:
        """(hit blocks, per token group the hit blocks it shares, blocks to take from the pool)
        for a new sequence of ``num_tokens``; nothing changes."""
        bs = self.block_size
        total = -(-num_tokens // bs)
        hit = self._hit_blocks(block_hashes, max(num_tokens - 1, 0) // bs) if block_hashes else 0
        shared: list[list[int]] = []
        need = self._num_linear
        ref_count = self.ref_count
        for (kind, window), cache in zip(self._token_groups, self._caches):
            skip = skipped_tokens(kind, window, hit * bs) // bs
            blocks = [cache[h] for h in block_hashes[skip:hit]]
            shared.append(blocks)
            need += total - hit + sum(1 for b in blocks if ref_count[b] == 0)
        return hit, shared, need

    def _take(self) -> int:
        """A fresh block with refcount 1: a plain free one, else the least recently released
        cached one (the caller checked there is one)."""
        if self._free:
            b = self._free.pop()
        else:
            b, _ = self._evictable.popitem(False)
            key = self.block_hash[b]
            if key is not None:
                del self._caches[key[0]][key[1]]
                self.block_hash[b] = None
                self._num_cached_free -= 1
                self.num_evictions += 1
                self.cache_generation += 1
        self.ref_count[b] = 1
        return b

    def _take_many(self, n: int) -> list[int]:
        """``n`` fresh blocks in :meth:`_take`'s order; plain free ones in bulk."""
        free = self._free
        if n > len(free):  # all the plain free blocks, then evict the rest, oldest first
            out = free[::-1]
            free.clear()
            pop, caches, block_hash = self._evictable.popitem, self._caches, self.block_hash
            evicted = 0
            for _ in range(n - len(out)):
                b, _ = pop(False)
                key = block_hash[b]
                if key is not None:
                    del caches[key[0]][key[1]]
                    block_hash[b] = None
                    evicted += 1
                out.append(b)
            if evicted:
                self._num_cached_free -= evicted
                self.num_evictions += evicted
                self.cache_generation += 1
        else:
            out = free[len(free) - n:]
            del free[len(free) - n:]
            out.reverse()  # the order of popping one at a time
        ref_count = self.ref_count
        for b in out:
            ref_count[b] = 1
        return out

    def _release(self, b: int, full: bool, front: list[int]) -> None:
        """Drop one reference to ``b``: the last one puts it on the evictable list if named (or
        ``full``, anonymous, with ``full_blocks_lru``), else in ``front`` (the caller puts those
        on the plain free list, the first released on top)."""
        rc = self.ref_count[b] - 1
        self.ref_count[b] = rc
        if rc:
            self._dup_blocks -= 1
        elif self.block_hash[b] is not None:
            self._evictable[b] = None
            self._num_cached_free += 1
        elif full and self._full_lru:
            self._evictable[b] = None
        else:
            front.append(b)

    def _to_free_list(self, front: list[int]) -> None:
        """``front`` (blocks in the order released) on the plain free list, the first on top
        (``prepend_n``)."""
        if front:
            front.reverse()
            self._free.extend(front)

    def _register_hashes(self, seq_id: int, num_tokens: int) -> None:
        """Cache the sequence's blocks that ``num_tokens`` fills and whose hash is known, in each
        group that still holds them (module docstring). Runs once per full block."""
        hashes = self._seq_hashes[seq_id]
        done = self._num_hashed[seq_id]
        bs = self.block_size
        upto = min(len(hashes), num_tokens // bs)
        if upto <= done:
            return
        block_hash, changed = self.block_hash, False
        for g, (table, skip, cache) in enumerate(zip(self._tables[seq_id], self._skipped[seq_id],
                                                     self._caches)):
            for i in range(max(done, skip), upto):
                b, h = table[i - skip], hashes[i]
                if block_hash[b] is None and h not in cache:
                    cache[h] = b
                    block_hash[b] = (g, h)
                    changed = True
        if changed:
            self.cache_generation += 1
        self._num_hashed[seq_id] = upto
        if upto < len(hashes):
            self._hash_due[seq_id] = (upto + 1) * bs
        else:
            self._hash_due.pop(seq_id, None)

    def cache_blocks(self, seq_id: int, block_hashes: Sequence[int], num_tokens: int) -> None:
        """As :meth:`PagedAllocator.cache_blocks`: name the sequence's blocks its first
        ``num_tokens`` fill under ``block_hashes`` (which extend those it was allocated with)."""
        if not self.enable_prefix_caching:
            return
        self._seq_hashes[seq_id] = block_hashes
        done = self._num_hashed.setdefault(seq_id, 0)
        if done < len(block_hashes):
            self._hash_due[seq_id] = (done + 1) * self.block_size
        self._register_hashes(seq_id, num_tokens)

    def has_unreferenced_hit(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> bool:
        """Whether a block that a new sequence of ``num_prompt_tokens`` would share is free
        (cached, unreferenced) now or may become so without a sequence being freed: an eviction
        may then take it and shorten the hit (the question :meth:`PagedAllocator.
        has_unreferenced_hit` answers for one group). A window group's hit blocks count whatever
        their references: their holders drop them as their windows move on (``append``'s
        ``remove_skipped_blocks``), a full group's are dropped only by a ``free``."""
        if not block_hashes or not self.enable_prefix_caching:
            return False
        _, shared, _ = self._admission(num_prompt_tokens, block_hashes)
        ref_count = self.ref_count
        for (kind, _), blocks in zip(self._token_groups, shared):
            if blocks and (kind in (SLIDING_ATTENTION, CHUNKED_ATTENTION)
                           or any(ref_count[b] == 0 for b in blocks)):
                return True
        return False

    def num_cached_free_blocks(self) -> int:
        """As :meth:`PagedAllocator.num_cached_free_blocks`, over every group's blocks."""
        return self._num_cached_free

    def free_blocks_before_eviction(self, limit: int) -> int:
        """As :meth:`PagedAllocator.free_blocks_before_eviction`: block ids, of any group."""
        return blocks_before_eviction(len(self._free), self._evictable, len(self._evictable), self.block_hash,
                                      self._num_cached_free, limit)

    # ------------------------------------------------------------------ interface
    def can_allocate(self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = (),
                     *, reserve_blocks: int = 0) -> bool:
        """As the interface says; ``reserve_blocks`` more block ids of the shared pool must stay
        free after it (an admission watermark: simulator/scheduler/v1.py). The blocks counted
        are vLLM's: the sum over groups (vllm/v1/core/kv_cache_coordinator.py,
        ``KVCacheCoordinator.get_num_blocks_to_allocate``) of each group's blocks past its hit,
        skipped blocks excluded, plus its hit blocks that are free (vllm/v1/core/
        single_type_kv_cache_manager.py, ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``:
        ``num_evictable_blocks``)."""
        need = self._admission(num_tokens, block_hashes)[2]
        return need + reserve_blocks <= len(self._free) + len(self._evictable)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks a new sequence of ``num_tokens`` takes without a cache hit: ``ceil(n / B)`` in
        every token group (nothing computed, nothing skipped) and one per linear group, summed
        as ``KVCacheCoordinator.get_num_blocks_to_allocate`` sums them. A hit never needs more
        (each group's free hit blocks are at most the blocks it saves), so this bounds
        :meth:`can_allocate`'s count from above."""
        return len(self._token_groups) * -(-num_tokens // self.block_size) + self._num_linear

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = ()) -> Allocation | None:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        hit, shared, need = self._admission(num_tokens, block_hashes)
        if need > len(self._free) + len(self._evictable):
            self.last_failure = AllocFailure.NO_SPACE
            return None
        ref_count, evictable = self.ref_count, self._evictable
        for blocks in shared:  # claim the hits before taking new blocks: eviction must not reach them
            for b in blocks:
                if ref_count[b]:
                    self._dup_blocks += 1
                else:  # a named free block: off the evictable list (BlockPool.touch)
                    del evictable[b]
                    self._num_cached_free -= 1
                ref_count[b] += 1
        new = -(-num_tokens // self.block_size) - hit
        tables, skipped = [], []
        for blocks in shared:
            skipped.append(hit - len(blocks))
            tables.append(blocks + self._take_many(new))
        self._tables[seq_id] = tables
        self._skipped[seq_id] = skipped
        self._states[seq_id] = self._take_many(self._num_linear)
        held = sum(map(len, tables)) + self._num_linear
        self._sum_skipped += sum(skipped)
        self._sum_blocks += held
        self.num_tokens[seq_id] = num_tokens
        self.final_tokens[seq_id] = final_tokens
        self._sum_tokens += num_tokens
        self._sum_alloc += held * self.block_size
        if block_hashes and self.enable_prefix_caching:
            self.num_queried_blocks += min(len(block_hashes), max(num_tokens - 1, 0) // self.block_size)
            self.num_hit_blocks += hit
            self._seq_hashes[seq_id] = block_hashes
            self._num_hashed[seq_id] = hit
            if hit < len(block_hashes):
                self._hash_due[seq_id] = (hit + 1) * self.block_size
                self._register_hashes(seq_id, num_tokens)
        return Allocation(seq_id, hit * self.block_size, held * self.block_size)

    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        declared = self.num_tokens[seq_id]
        if num_tokens <= declared:
            return NO_COPIES
        plan = self._blocks_after(self._computed(seq_id), num_tokens)
        skipped, tables, ref_count = self._skipped[seq_id], self._tables[seq_id], self.ref_count
        take = freed = 0
        for (skip, total), old_skip, table in zip(plan, skipped, tables):
            old_total = old_skip + len(table)
            drop = max(0, min(skip, old_total) - old_skip)
            freed += sum(1 for b in table[:drop] if ref_count[b] == 1)
            take += max(0, total - max(old_total, skip))
        if take > len(self._free) + len(self._evictable) + freed:
            self.last_failure = AllocFailure.NO_SPACE
            return None
        dropped = 0
        for g, ((skip, _), table) in enumerate(zip(plan, tables)):
            drop = max(0, min(skip, skipped[g] + len(table)) - skipped[g])
            if drop:  # remove_skipped_blocks, in every group before any block is taken
                front: list[int] = []  # one free_blocks per group
                for b in reversed(table[:drop]):  # newest first (_remove_blocks_in_range); full
                    self._release(b, True, front)
                self._to_free_list(front)
                del table[:drop]
                skipped[g] += drop
                dropped += drop
        if take:
            for g, ((_, total), table) in enumerate(zip(plan, tables)):
                table += self._take_many(total - skipped[g] - len(table))
        self._sum_skipped += dropped
        self._sum_blocks += take - dropped
        self._sum_alloc += (take - dropped) * self.block_size
        self.num_tokens[seq_id] = num_tokens
        self._sum_tokens += num_tokens - declared
        if num_tokens >= self._hash_due.get(seq_id, num_tokens + 1):
            self._register_hashes(seq_id, num_tokens)
        return NO_COPIES

    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        self._written[seq_id] = num_written
        tables = self._tables[seq_id]
        if not tables:  # linear groups only: a fixed state, never grows
            return 1 << 62
        # every token group ends at the same block boundary: window groups drop their skipped
        # blocks at the append made there; the last block is always private (no copy-on-write)
        return (self._skipped[seq_id][0] + len(tables[0])) * self.block_size - num_written

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> AppendResult | None:
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id} is already allocated")
        result = self.allocate(child_id, num_tokens, self.final_tokens[parent_id])
        if result is None:
            return None
        blocks = sum(len(t) for t in self._tables[child_id]) + self._num_linear
        return AppendResult((), blocks * self.block_size)

    def free(self, seq_id: int) -> None:
        tables = self._tables.pop(seq_id)
        states = self._states.pop(seq_id)
        blocks = len(states)
        if self.enable_prefix_caching:  # group by group, each tail first (module docstring)
            release = self._release
            final = self.final_tokens[seq_id]
            for table, skip in zip(tables, self._skipped[seq_id]):  # one free_blocks per group
                # blocks before the last are full; the last when the final length fills it
                full = len(table) if final >= (skip + len(table)) * self.block_size else len(table) - 1
                front: list[int] = []
                for i in range(len(table) - 1, -1, -1):
                    release(table[i], i < full, front)
                self._to_free_list(front)
                blocks += len(table)
            for b in states:
                front = []
                release(b, False, front)
                self._to_free_list(front)
        else:  # nothing is shared or cached (forks copy): every block straight back, in bulk
            free, ref_count = self._free, self.ref_count
            for table in tables:  # group by group, each tail first and put in front (prepend_n)
                for b in table:
                    ref_count[b] = 0
                free.extend(table)
                blocks += len(table)
            for b in states:
                ref_count[b] = 0
            free.extend(states)
        self._sum_skipped -= sum(self._skipped.pop(seq_id))
        self._sum_blocks -= blocks
        self._sum_alloc -= blocks * self.block_size
        self.final_tokens.pop(seq_id)
        self._written.pop(seq_id, None)
        self._seq_hashes.pop(seq_id, None)
        self._num_hashed.pop(seq_id, None)
        self._hash_due.pop(seq_id, None)
        self._sum_tokens -= self.num_tokens.pop(seq_id)

    def allocated_tokens(self, seq_id: int) -> int:
        """Token capacity of the sequence's full-length block table (its next append point)."""
        tables = self._tables[seq_id]
        if not tables:
            return self.num_tokens[seq_id]
        return (self._skipped[seq_id][0] + len(tables[0])) * self.block_size

    def held_blocks(self, seq_id: int) -> tuple[int, ...]:
        """Live blocks of the sequence per group: token groups in layout order, then linear."""
        return (*(len(t) for t in self._tables[seq_id]), *(1 for _ in self._states[seq_id]))

    def num_free_blocks(self) -> int:
        """Blocks a new allocation can take: plain free plus cached unreferenced ones."""
        return len(self._free) + len(self._evictable)

    def num_cached_blocks(self) -> int:
        return sum(map(len, self._caches))

    def num_free_tokens(self) -> int:
        return self.num_free_blocks() * self.block_size

    def free_blocks_for_growth(self) -> int:
        """Sequences that can each grow by one block now: a boundary takes one block in every
        token group (a sliding group may free one, not counted)."""
        return self.num_free_blocks() // max(len(self._token_groups), 1)

    def external_fragmentation(self, head: tuple[int, ...] | None) -> int:
        return 0  # any free block serves any group of any request

    def min_pool_tokens(self, num_prompt: int, final_tokens: int, num_seqs: int) -> int:
        """Slots ``num_seqs`` sequences of ``final_tokens`` hold at their longest, alone, growing
        a block at a time: a window group then holds at most ``ceil(W / B) + 1`` blocks."""
        bs = self.block_size
        total = -(-final_tokens // bs)
        worst = sum(total if window is None else min(total, -(-window // bs) + 1)
                    for _, window in self._token_groups)
        return num_seqs * (worst + self._num_linear) * bs

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """The live blocks of the first group (full attention when the model has one)."""
        tables = self._tables[seq_id]
        return tuple(tables[0]) if tables else tuple(self._states[seq_id])

    def slot_mapping(self, seq_id: int, start: int, num_tokens: int) -> list[int]:
        """Pool slots of positions ``start ..`` in the first group's table (module docstring)."""
        table, bs = self._tables[seq_id][0], self.block_size
        first = self._skipped[seq_id][0]
        return [table[p // bs - first] * bs + p % bs for p in range(start, start + num_tokens)]

    def snapshot_parts(self, num_written_tokens: int | None = None,
                       head: tuple[int, ...] | None = None) -> tuple[int, int, int, int, int, int]:
        """The pool in slots (module docstring): token state, reserved, internal, 0, free, and
        the slots shared blocks save."""
        written = self._sum_tokens if num_written_tokens is None else num_written_tokens
        groups, bs = len(self._token_groups), self.block_size
        linear = self._num_linear * len(self._tables) * bs
        saved = self._dup_blocks * bs
        token_state = groups * written - bs * self._sum_skipped + linear - saved
        reserved = groups * (self._sum_tokens - written)
        if reserved < 0:  # tokens written past the last declaration (grow only at boundaries)
            reserved = 0
        allocated = self._sum_blocks * bs - saved
        internal = allocated - token_state - reserved
        return (token_state, reserved, internal, 0, self.capacity_tokens - allocated, saved)

    def check_invariants(self) -> None:
        bs = self.block_size
        refs = [0] * self.num_blocks
        skipped_sum = blocks = 0
        for seq_id, tables in self._tables.items():
            n = self.num_tokens[seq_id]
            assert len(self._states[seq_id]) == self._num_linear
            for b in self._states[seq_id]:
                refs[b] += 1
            blocks += self._num_linear
            for (kind, window), skip, table in zip(self._token_groups, self._skipped[seq_id], tables):
                assert skip + len(table) == -(-n // bs), (seq_id, kind, skip, len(table), n)
                assert table or not n, (seq_id, kind, "no live block")
                for b in table:
                    refs[b] += 1
                skipped_sum += skip
                blocks += len(table)
        assert refs == self.ref_count, "refcount != number of block tables pointing at the block"
        free, evictable = set(self._free), set(self._evictable)
        used = {b for b in range(self.num_blocks) if refs[b]}
        assert len(free) == len(self._free), "a block is twice on the free list"
        assert not free & evictable and not used & (free | evictable), "a block in two places"
        assert len(free) + len(evictable) + len(used) == self.num_blocks, "blocks not conserved"
        assert all(self.block_hash[b] is None for b in free), "a free block still has a hash"
        assert self._full_lru or all(self.block_hash[b] is not None for b in evictable), \
            "evictable block uncached"
        assert sum(1 for b in evictable if self.block_hash[b] is not None) == self._num_cached_free, \
            "named free blocks miscounted"
        cached = {}
        for g, cache in enumerate(self._caches):
            for h, b in cache.items():
                assert self.block_hash[b] == (g, h), f"cache entry {h} -> {b} disagrees"
                cached[b] = h
        assert cached.keys() == {b for b in range(self.num_blocks) if self.block_hash[b]}
        assert self.enable_prefix_caching or not cached
        assert self._dup_blocks == sum(r - 1 for r in refs if r), "shared-block count"
        assert skipped_sum == self._sum_skipped and blocks == self._sum_blocks
        assert self._sum_alloc == blocks * bs
        assert self._sum_tokens == sum(self.num_tokens.values())
        assert self.num_tokens.keys() == self.final_tokens.keys() == self._tables.keys()
        assert self._written.keys() <= self._tables.keys()
        for seq_id, hashes in self._seq_hashes.items():
            done = self._num_hashed[seq_id]
            due = (done + 1) * bs if done < len(hashes) else None
            assert self._hash_due.get(seq_id) == due, f"sequence {seq_id}: hash threshold {due}"
        assert self._hash_due.keys() <= self._seq_hashes.keys() <= self._tables.keys()


__all__ = ["HybridPagedAllocator"]
