"""Paged allocator throughput on a realistic operation trace, against baselines in the same run.

    python benchmarks/allocator.py [--requests 4000] [--repeats 3]

The operation trace comes from real traces: Azure 2023 conversation requests (admit, one grow per
generated token, free) and Mooncake requests (their hash ids give real prefix-cache hits), with
every 8th request sampled n=4 (fork). A driver keeps a realistic number of sequences live and
decodes them round-robin, one token each, as an engine does. The same recorded trace is replayed,
once with prefix caching on and once with it off, on:

* ``nano-vllm style``: a minimal list + dict block manager in the style of nano-vllm's (free
  deque, hash -> block dict, ``deque.remove`` when a cached free block is reused), no accounting;
* ``vLLM V1, every step``: :class:`VllmV1KVCacheManager`, vLLM V1's ``BlockPool`` +
  ``KVCacheManager`` algorithm, with ``allocate_slots`` called for every running request every
  step, as vLLM's scheduler does;
* ``vLLM V1, boundaries``: the same, called only when a token crosses a block boundary — no call
  at all for a token that stays inside its block (its last block is never shared, so the replay
  knows that from the position alone);
* ``kvplan, per token``: :class:`simulator.kv.paged.PagedAllocator` (refcounts, COW, prefix cache
  with O(1) LRU eviction, O(1) accounting), ``append`` called per token;
* ``kvplan, lazy``: ``tokens_until_append`` asked per token, ``append`` only when it says 0;
* ``kvplan, events (simulator)``: what the simulator does — a boundary's ``grow`` (``append``
  and ``tokens_until_append`` of a forked sequence) answers the room, and no call is made until
  that many tokens are written.

It prints operations per second, the ratio to each baseline (higher is faster), and the load
average. Times are this process's CPU time, the best of ``--repeats`` runs taken in turns, so that
other work on the machine moves every row alike; the ratios, measured in the same run, are what
carries over between machines.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.kv.paged import PagedAllocator  # noqa: E402
from simulator.kv.prefix import block_hashes  # noqa: E402
from workloads.loaders import bundled_trace_path, load_trace  # noqa: E402

BLOCK = 16
NUM_BLOCKS = 60_000


class BaselineBlockManager:
    """A plain block manager: what most from-scratch engines write first."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cache: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _take(self) -> int:
        b = self.free.popleft()
        h = self.hash_of[b]
        if h is not None:
            self.cache.pop(h, None)
            self.hash_of[b] = None
        self.ref[b] = 1
        return b

    def allocate(self, seq: int, n: int, final: int, hashes=()) -> bool:
        table = []
        for i in range(-(-n // self.block_size)):
            b = self.cache.get(hashes[i]) if i < len(hashes) else None
            if b is not None:
                if self.ref[b] == 0:
                    self.free.remove(b)  # O(n): the cost an intrusive list avoids
                self.ref[b] += 1
            else:
                b = self._take()
                if i < len(hashes):
                    self.cache[hashes[i]] = b
                    self.hash_of[b] = hashes[i]
            table.append(b)
        self.tables[seq] = table
        self.lens[seq] = n
        return True

    def append(self, seq: int, n: int) -> bool:
        table = self.tables[seq]
        while len(table) * self.block_size < n:
            table.append(self._take())
        last = table[-1]
        if self.ref[last] > 1:  # copy on write
            self.ref[last] -= 1
            table[-1] = self._take()
        self.lens[seq] = n
        return True

    def fork(self, parent: int, child: int, n: int) -> bool:
        table = self.tables[parent][: -(-n // self.block_size)]
        for b in table:
            self.ref[b] += 1
        self.tables[child] = list(table)
        self.lens[child] = n
        return True

    def free_seq(self, seq: int) -> None:
        for b in reversed(self.tables.pop(seq)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        del self.lens[seq]


# ---------------------------------------------------------------------------------------------
# vLLM V1's block pool, after vLLM 0.11.0 (pip download vllm==0.11.0 --no-deps):
#   vllm/v1/core/kv_cache_utils.py             KVCacheBlock, FreeKVCacheBlockQueue
#   vllm/v1/core/block_pool.py                 BlockHashToBlockMap, BlockPool
#   vllm/v1/core/single_type_kv_cache_manager.py  SingleTypeKVCacheManager, FullAttentionManager
#   vllm/v1/core/kv_cache_manager.py           KVCacheManager.get_computed_blocks/allocate_slots/free
# The data structures and the per-call steps are vLLM's; left out, which only makes the baseline
# faster than vLLM itself: the KVCacheCoordinator layer (one KV cache group here), KV events,
# prefix-cache statistics, lookahead and encoder tokens, the KVCacheBlocks result wrapper, and
# the bytes hash keys (block hash + 4-byte group id): plain ints here.
# ---------------------------------------------------------------------------------------------


@dataclass
class VllmBlock:
    """``KVCacheBlock``: metadata of one block, also the node of the free queue's linked list."""

    block_id: int
    ref_cnt: int = 0
    _block_hash: int | None = None
    prev_free_block: VllmBlock | None = None
    next_free_block: VllmBlock | None = None
    is_null: bool = False

    @property
    def block_hash(self) -> int | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: int) -> None:
        assert self._block_hash is None, "The block already has a hash."
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        self._block_hash = None


class VllmFreeBlockQueue:
    """``FreeKVCacheBlockQueue``: a doubly linked list threaded through the blocks themselves
    (fake head and tail), in eviction order: LRU first, a freed sequence's tail before its prefix."""

    def __init__(self, blocks: list[VllmBlock]) -> None:
        self.num_free_blocks = len(blocks)
        for i in range(self.num_free_blocks):
            if i > 0:
                blocks[i].prev_free_block = blocks[i - 1]
            if i < self.num_free_blocks - 1:
                blocks[i].next_free_block = blocks[i + 1]
        self.fake_free_list_head = VllmBlock(block_id=-1)
        self.fake_free_list_tail = VllmBlock(block_id=-1)
        self.fake_free_list_head.next_free_block = blocks[0]
        blocks[0].prev_free_block = self.fake_free_list_head
        self.fake_free_list_tail.prev_free_block = blocks[-1]
        blocks[-1].next_free_block = self.fake_free_list_tail

    def popleft(self) -> VllmBlock:
        first = self.fake_free_list_head.next_free_block
        assert first is not None and first.next_free_block is not None, "no free blocks"
        self.fake_free_list_head.next_free_block = first.next_free_block
        first.next_free_block.prev_free_block = self.fake_free_list_head
        first.prev_free_block = first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[VllmBlock]:
        if n == 0:
            return []
        assert self.num_free_blocks >= n
        self.num_free_blocks -= n
        curr = self.fake_free_list_head.next_free_block
        ret = []
        for _ in range(n):
            assert curr is not None
            ret.append(curr)
            last = curr
            curr = curr.next_free_block
            last.prev_free_block = None
            last.next_free_block = None
        if curr is not None:
            self.fake_free_list_head.next_free_block = curr
            curr.prev_free_block = self.fake_free_list_head
        return ret

    def remove(self, block: VllmBlock) -> None:
        if block.prev_free_block is None or block.next_free_block is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append_n(self, blocks: list[VllmBlock]) -> None:
        if len(blocks) == 0:
            return
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = last
        self.num_free_blocks += len(blocks)


class VllmBlockHashToBlockMap:
    """``BlockHashToBlockMap``: hash -> one block, or -> {block_id: block} for duplicates (vLLM
    caches a full block even when an identical one is cached, so block tables stay append-only)."""

    def __init__(self) -> None:
        self._cache: dict[int, VllmBlock | dict[int, VllmBlock]] = {}

    def get_one_block(self, key: int) -> VllmBlock | None:
        blocks = self._cache.get(key)
        if blocks is not None:
            if isinstance(blocks, VllmBlock):
                return blocks
            if isinstance(blocks, dict):
                return next(iter(blocks.values()))
        return None

    def insert(self, key: int, block: VllmBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, VllmBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: int, block_id: int) -> VllmBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if isinstance(blocks, VllmBlock):
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks
            return None
        block = blocks.pop(block_id, None)
        if len(blocks) > 0:
            self._cache[key] = blocks
        return block


class VllmBlockPool:
    """``BlockPool``: one free queue for never-used and cached-free blocks alike (LRU first), the
    hash map, and block 0 kept back as the null block."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.enable_caching = enable_caching
        self.blocks = [VllmBlock(idx) for idx in range(num_gpu_blocks)]
        self.free_block_queue = VllmFreeBlockQueue(self.blocks)
        self.cached_block_hash_to_block = VllmBlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: int, kv_cache_group_ids: list[int]) -> list[VllmBlock] | None:
        cached_blocks = []
        for _ in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(block_hash)
            if not block:
                return None
            cached_blocks.append(block)
        return cached_blocks

    def cache_full_blocks(
        self, request: VllmRequest, blocks: list[VllmBlock], num_cached_blocks: int, num_full_blocks: int
    ) -> None:
        if num_cached_blocks == num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        assert len(request.block_hashes) >= num_full_blocks
        new_block_hashes = request.block_hashes[num_cached_blocks:]
        for i, blk in enumerate(new_full_blocks):
            assert blk.block_hash is None
            block_hash = new_block_hashes[i]
            blk.block_hash = block_hash
            self.cached_block_hash_to_block.insert(block_hash, blk)

    def get_new_blocks(self, num_blocks: int) -> list[VllmBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self.enable_caching:
            for block in ret:
                self._maybe_evict_cached_block(block)
                assert block.ref_cnt == 0
                block.ref_cnt += 1
        else:
            for block in ret:
                assert block.ref_cnt == 0
                block.ref_cnt += 1
        return ret

    def _maybe_evict_cached_block(self, block: VllmBlock) -> bool:
        block_hash = block.block_hash
        if block_hash is None:
            return False
        if self.cached_block_hash_to_block.pop(block_hash, block.block_id) is None:
            return False
        block.reset_hash()
        return True

    def touch(self, blocks: tuple[list[VllmBlock], ...]) -> None:
        for blocks_per_group in blocks:
            for block in blocks_per_group:
                if block.ref_cnt == 0 and not block.is_null:
                    self.free_block_queue.remove(block)
                block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[VllmBlock]) -> None:
        blocks_list = list(ordered_blocks)
        for block in blocks_list:
            block.ref_cnt -= 1
        self.free_block_queue.append_n([b for b in blocks_list if b.ref_cnt == 0 and not b.is_null])

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks


class VllmRequest:
    """The fields of vLLM's ``Request`` the KV cache manager reads."""

    __slots__ = ("request_id", "num_tokens", "num_computed_tokens", "block_hashes")

    def __init__(self, request_id: int, num_tokens: int, block_hashes: Sequence[int]) -> None:
        self.request_id = request_id
        self.num_tokens = num_tokens  # prompt + output tokens so far
        self.num_computed_tokens = 0
        self.block_hashes = block_hashes


class VllmV1KVCacheManager:
    """``KVCacheManager`` over one ``FullAttentionManager``, driven by this benchmark's op trace.

    vLLM V1 implements parallel sampling (n > 1) as n child requests of the same prompt
    (vllm/v1/engine/parallel_sampling.py): a ``fork`` is a new request whose full prompt blocks
    are prefix-cache hits when caching is on, and a full copy of the prompt when it is off.
    ``hashes_of`` gives each sequence its ``Request.block_hashes`` for every full block it will
    ever have (vLLM hashes all tokens; blocks outside a trace's named prefix get unique ids),
    prepared before the clock starts.
    """

    def __init__(
        self, num_blocks: int, block_size: int, enable_caching: bool, hashes_of: dict[int, list[int]]
    ) -> None:
        # vLLM keeps block 0 back as the null block: one more block gives the same usable pool
        self.block_pool = VllmBlockPool(num_blocks + 1, enable_caching)
        self.enable_caching = enable_caching
        self.block_size = block_size
        self.hashes_of = hashes_of
        self.requests: dict[int, VllmRequest] = {}
        self.req_to_blocks: dict[int, list[VllmBlock]] = {}
        self.num_cached_block: dict[int, int] = {}

    # -------------------------------------------------------------- KVCacheManager
    def get_computed_blocks(self, request: VllmRequest) -> tuple[list[VllmBlock], int]:
        if not self.enable_caching:
            return [], 0
        max_cache_hit_length = request.num_tokens - 1  # the last prompt token is always computed
        computed = self.find_longest_cache_hit(request.block_hashes, max_cache_hit_length)
        return computed, len(computed) * self.block_size

    def allocate_slots(
        self,
        request: VllmRequest,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[VllmBlock] | None = None,
    ) -> list[VllmBlock] | None:
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        new_computed_block_list = new_computed_blocks if new_computed_blocks is not None else []
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        num_blocks_to_allocate = self.get_num_blocks_to_allocate(
            request.request_id, num_tokens_need_slot, new_computed_block_list
        )
        if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
            return None
        if self.enable_caching:
            self.block_pool.touch((new_computed_block_list,))
        self.save_new_computed_blocks(request.request_id, new_computed_block_list)
        new_blocks = self.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        if not self.enable_caching:
            return new_blocks
        num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, request.num_tokens)
        self.cache_blocks(request, num_tokens_to_cache)
        return new_blocks

    # -------------------------------------------------------------- FullAttentionManager
    def find_longest_cache_hit(self, block_hashes: Sequence[int], max_length: int) -> list[VllmBlock]:
        computed_blocks: list[VllmBlock] = []
        for block_hash in itertools.islice(block_hashes, max_length // self.block_size):
            if cached_block := self.block_pool.get_cached_block(block_hash, [0]):
                computed_blocks.append(cached_block[0])
            else:
                break
        return computed_blocks

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, new_computed_blocks: list[VllmBlock]
    ) -> int:
        num_required_blocks = -(-num_tokens // self.block_size)
        num_new_blocks = (
            num_required_blocks - len(new_computed_blocks) - len(self.req_to_blocks.get(request_id, ()))
        )
        # a hit on a block in the free queue takes it out of the queue: it counts as allocated
        num_evictable_computed_blocks = sum(
            blk.ref_cnt == 0 and not blk.is_null for blk in new_computed_blocks
        )
        return num_new_blocks + num_evictable_computed_blocks

    def save_new_computed_blocks(self, request_id: int, new_computed_blocks: list[VllmBlock]) -> None:
        if request_id not in self.num_cached_block:
            req_blocks = self.req_to_blocks.setdefault(request_id, [])
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(new_computed_blocks)

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> list[VllmBlock]:
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = -(-num_tokens // self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: VllmRequest, num_tokens: int) -> None:
        num_cached_blocks = self.num_cached_block[request.request_id]
        num_full_blocks = num_tokens // self.block_size
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request.request_id], num_cached_blocks, num_full_blocks
        )
        self.num_cached_block[request.request_id] = num_full_blocks

    # -------------------------------------------------------------- the op trace
    def allocate(self, seq: int, n: int, final: int, hashes: Sequence[int] = ()) -> list[VllmBlock] | None:
        """A new request's prefill of ``n`` prompt tokens (the scheduler's first allocate_slots)."""
        request = VllmRequest(seq, n, self.hashes_of[seq] if self.enable_caching else ())
        computed, num_computed = self.get_computed_blocks(request)
        new = self.allocate_slots(request, n - num_computed, num_computed, computed)
        if new is not None:
            request.num_computed_tokens = n
            self.requests[seq] = request
        return new

    def append(self, seq: int, n: int) -> list[VllmBlock] | None:
        """A decode step that writes position ``n - 1`` (one new token)."""
        request = self.requests[seq]
        request.num_computed_tokens = n - 1
        request.num_tokens = n
        return self.allocate_slots(request, 1)

    def fork(self, parent: int, child: int, n: int) -> list[VllmBlock] | None:
        """Parallel sampling: a child request of the same ``n``-token prompt."""
        return self.allocate(child, n, n)

    def free(self, seq: int) -> None:
        del self.requests[seq]
        req_blocks = self.req_to_blocks.pop(seq, [])
        self.block_pool.free_blocks(reversed(req_blocks))  # tail first: evicted before the prefix
        self.num_cached_block.pop(seq, None)


def vllm_block_hashes(ops: list[tuple], block_size: int) -> dict[int, list[int]]:
    """Every sequence's ``Request.block_hashes``: the trace's prefix hashes, then unique ids up to
    its final length; a parallel-sampling child shares its parent's full prompt blocks."""
    unique = itertools.count(1 << 62)  # far from the tuple hashes of the trace's prefix ids
    out: dict[int, list[int]] = {}
    final_of: dict[int, int] = {}
    for op in ops:
        if op[0] == "alloc":
            seq, _, final, hashes = op[1:]
            final_of[seq] = final
            out[seq] = list(hashes) + [next(unique) for _ in range(len(hashes), final // block_size)]
        elif op[0] == "fork":
            parent, child, n = op[1:]
            final_of[child] = final = final_of[parent]
            shared = out[parent][: n // block_size]
            out[child] = shared + [next(unique) for _ in range(len(shared), final // block_size)]
    return out


# ---------------------------------------------------------------------------------------------
def build_trace(num_requests: int) -> list[tuple]:
    """Record an operation trace by driving a PagedAllocator like an engine would."""
    conv = load_trace(bundled_trace_path("azure-conv"))[: num_requests // 2]
    moon = load_trace(bundled_trace_path("mooncake"))[: num_requests // 2]
    reqs = []
    for i in range(max(len(conv), len(moon))):
        if i < len(conv):
            r = conv[i]
            reqs.append((min(r.prompt_tokens, 4096), min(r.output_tokens, 512), ()))
        if i < len(moon):
            r = moon[i]
            p = min(r.prompt_tokens, 8192)
            reqs.append((p, min(r.output_tokens, 256), block_hashes(r.prefix_ids, 512, BLOCK, p)))
    alloc = PagedAllocator(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
    ops: list[tuple] = []
    live: dict[int, list[int]] = {}  # seq -> [length, final]
    next_seq = 0
    pending = deque(enumerate(reqs))
    while pending or live:
        while pending and len(live) < 192:
            i, (p, o, hashes) = pending[0]
            final = p + o - 1
            if alloc.allocate(next_seq, p, final, hashes) is None:
                break
            pending.popleft()
            ops.append(("alloc", next_seq, p, final, hashes))
            live[next_seq] = [p, final]
            parent = next_seq
            next_seq += 1
            if i % 8 == 0 and o > 1:
                for _ in range(3):
                    alloc.fork(parent, next_seq, p)
                    ops.append(("fork", parent, next_seq, p))
                    live[next_seq] = [p, final]
                    next_seq += 1
        for seq in list(live):
            length, final = live[seq]
            if length >= final:
                alloc.free(seq)
                ops.append(("free", seq))
                del live[seq]
                continue
            if alloc.append(seq, length + 1) is None:
                alloc.free(seq)  # out of blocks: preempt it (dropped from the trace)
                ops.append(("free", seq))
                del live[seq]
                continue
            ops.append(("append", seq, length + 1))
            live[seq][0] = length + 1
    return ops


def replay(ops: list[tuple], allocate, append, fork, free, until=None) -> float:  # type: ignore[no-untyped-def]
    """CPU seconds to apply ``ops``; with ``until`` (lazy), appends inside the allocation are skipped."""
    t = time.process_time()
    for op in ops:
        kind = op[0]
        if kind == "append":
            if until is not None and until(op[1], op[2] - 1) > 0:
                continue
            append(op[1], op[2])
        elif kind == "alloc":
            allocate(op[1], op[2], op[3], op[4])
        elif kind == "fork":
            fork(op[1], op[2], op[3])
        else:
            free(op[1])
    return time.process_time() - t


def replay_events(ops: list[tuple], a: PagedAllocator) -> float:
    """CPU seconds to apply ``ops`` as the simulator's scheduler does: it calls nothing until a
    sequence's room is used up. A lone sequence grows with ``grow``, which answers the room to its
    next boundary; a forked one (its last block may be shared: copy-on-write) with ``append``,
    then ``tokens_until_append``, as after allocate and fork."""
    allocate, append, fork, free = a.allocate, a.append, a.fork, a.free
    grow, until = a.grow, a.tokens_until_append
    due: dict[int, int] = {}  # seq -> the largest token count reachable without a call
    forked: set[int] = set()
    t = time.process_time()
    for op in ops:
        kind = op[0]
        if kind == "append":
            seq, n = op[1], op[2]
            if n <= due[seq]:
                continue
            if seq in forked:
                append(seq, n)
                due[seq] = n - 1 + until(seq, n - 1)
            else:
                due[seq] = n - 1 + grow(seq, n)  # type: ignore[operator]
        elif kind == "alloc":
            seq, n = op[1], op[2]
            allocate(seq, n, op[3], op[4])
            due[seq] = n + until(seq, n)
        elif kind == "fork":
            parent, child, n = op[1], op[2], op[3]
            fork(parent, child, n)
            forked.add(parent)
            forked.add(child)
            due[parent] = n + until(parent, n)  # its last block may be shared now
            due[child] = n + until(child, n)
        else:
            free(op[1])
            del due[op[1]]
            forked.discard(op[1])
    return time.process_time() - t


def replay_boundaries(ops: list[tuple], m: VllmV1KVCacheManager) -> float:
    """CPU seconds to apply ``ops`` calling ``append`` only for a token that starts a new block."""
    allocate, append, fork, free, bs = m.allocate, m.append, m.fork, m.free, m.block_size
    t = time.process_time()
    for op in ops:
        kind = op[0]
        if kind == "append":
            if (op[2] - 1) % bs:
                continue
            append(op[1], op[2])
        elif kind == "alloc":
            allocate(op[1], op[2], op[3], op[4])
        elif kind == "fork":
            fork(op[1], op[2], op[3])
        else:
            free(op[1])
    return time.process_time() - t


def runs(ops: list[tuple], caching: bool) -> dict[str, Callable[[], float]]:
    """The rows of one table: name -> a fresh allocator's replay time in seconds."""
    no_hashes = [op if op[0] != "alloc" else op[:4] + ((),) for op in ops]
    nano_ops = ops if caching else no_hashes
    hashes_of = vllm_block_hashes(ops, BLOCK) if caching else {}

    def nano() -> float:
        m = BaselineBlockManager(NUM_BLOCKS, BLOCK)
        return replay(nano_ops, m.allocate, m.append, m.fork, m.free_seq)

    def vllm(boundaries: bool) -> float:
        m = VllmV1KVCacheManager(NUM_BLOCKS, BLOCK, caching, hashes_of)
        return replay_boundaries(ops, m) if boundaries else replay(ops, m.allocate, m.append, m.fork, m.free)

    def kvplan(mode: str) -> float:
        a = PagedAllocator(NUM_BLOCKS, BLOCK, enable_prefix_caching=caching)
        if mode == "events":
            return replay_events(ops, a)
        until = a.tokens_until_append if mode == "lazy" else None
        return replay(ops, a.allocate, a.append, a.fork, a.free, until)

    return {
        "nano-vllm style": nano,
        "vLLM V1, every step": lambda: vllm(boundaries=False),
        "vLLM V1, boundaries": lambda: vllm(boundaries=True),
        "kvplan, per token": lambda: kvplan("per token"),
        "kvplan, lazy": lambda: kvplan("lazy"),
        "kvplan, events (simulator)": lambda: kvplan("events"),
    }


BASELINES = {  # row -> its ratio column's heading
    "nano-vllm style": "vs nano",
    "vLLM V1, every step": "vs V1 step",
    "vLLM V1, boundaries": "vs V1 bound",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ops = build_trace(args.requests)
    counts = {k: sum(1 for o in ops if o[0] == k) for k in ("alloc", "append", "fork", "free")}
    print(f"operation trace: {len(ops):,} ops ({', '.join(f'{k} {v:,}' for k, v in counts.items())})")
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    heads = "".join(f" {label:>11}" for label in BASELINES.values())
    for caching in (True, False):
        rows = runs(ops, caching)
        # interleave the repeats so that a burst of load on the machine hits every row alike
        best = {name: float("inf") for name in rows}
        for _ in range(args.repeats):
            for name, fn in rows.items():
                best[name] = min(best[name], fn())
        print(f"\nprefix caching {'on' if caching else 'off'}")
        print(f"{'allocator':<28} {'seconds':>8} {'M ops/s':>8}{heads}")
        for name, secs in best.items():
            ratios = "".join(f" {best[b] / secs:>10.2f}x" for b in BASELINES)
            print(f"{name:<28} {secs:>8.3f} {len(ops) / secs / 1e6:>8.2f}{ratios}")
    print("\nload average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
