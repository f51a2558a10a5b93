"""The interface every KV-cache allocator implements, and the records that cross it.

An allocator manages a pool of ``capacity_tokens`` KV slots. Sequences are identified by
integer ``seq_id``. The contract, shared by :class:`~simulator.kv.paged.PagedAllocator` and
:class:`~simulator.kv.contiguous.ContiguousAllocator`:

* ``allocate(seq_id, num_tokens, final_tokens, block_hashes)`` admits a new sequence and makes
  room for its first ``num_tokens`` tokens (a prompt, or the first prefill chunk). It returns an
  :class:`Allocation` or ``None`` when the pool cannot hold it now (nothing changes then).
* ``append(seq_id, num_tokens)`` grows the sequence so that it can hold ``num_tokens`` tokens in
  total — call it *before* writing (grow-before-write). It returns an :class:`AppendResult`
  (with the block copies copy-on-write needs) or ``None`` when the pool is exhausted; then the
  caller must preempt someone and retry.
* ``tokens_until_append(seq_id, num_written)`` says how many more tokens can be written without
  calling ``append``: the simulator touches the allocator only at those points (block boundaries,
  a shared last block), never per token.
* ``grow(seq_id, num_tokens)`` is ``append`` for a growth that copies nothing followed by that
  question, in one call: the room to the next boundary, or ``None`` when the pool is full.
* ``fork(parent_id, child_id, num_tokens)`` gives ``child_id`` the parent's first ``num_tokens``
  tokens (parallel sampling, beam search): shared blocks when paged, a copy when contiguous.
* ``free(seq_id)`` releases everything of the sequence at once.
* ``cache_generation`` (moves whenever the prefix cache's set of hashes changes) and
  ``free_blocks_for_growth()`` (block-boundary appends guaranteed to succeed) let a scheduler keep
  a ``lookup`` result, or grow many sequences, without asking again.
* ``snapshot(...)`` splits the pool into token state / reserved / internal / external / free.
* ``check_invariants()`` raises ``AssertionError`` if any conservation law is broken.

``final_tokens`` is the number of KV tokens the sequence will hold when it finishes (known to a
trace replay). Reservation policies (contiguous ``oracle``/``pow2``) and the accounting of
reserved-vs-never-used slots need it; the paged allocator never allocates ahead of it.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class AllocFailure(enum.Enum):
    """Why the last ``allocate``/``append`` returned ``None``."""

    NO_SPACE = "no space"  # not enough free slots in total
    EXTERNAL_FRAGMENTATION = "external fragmentation"  # enough free in total, but no hole fits
    RESERVATION_EXCEEDED = "reservation exceeded"  # contiguous: the sequence outgrew its region


class Allocation(NamedTuple):
    """A new sequence's allocation: ``num_cached_tokens`` leading prompt tokens were found in the
    prefix cache and need no prefill compute."""

    seq_id: int
    num_cached_tokens: int
    num_allocated_tokens: int  # slots now owned by the sequence (shared ones included)


class AppendResult(NamedTuple):
    """``copies`` are (src_block, dst_block) pairs the executor must copy before this step's write."""

    copies: tuple[tuple[int, int], ...] = ()
    num_copied_tokens: int = 0


NO_COPIES = AppendResult()


class MemorySnapshot(NamedTuple):
    """Where every slot of the KV pool is, in tokens. The five parts sum to ``capacity_tokens``.

    ``token_state``: slots holding KV actually written (a shared slot counts once).
    ``reserved``: allocated slots the owner will write later.
    ``internal_fragmentation``: allocated slots that will never be written (a contiguous
    reservation beyond the final length, the unused tail of a paged last block).
    ``external_fragmentation``: free slots the request at the head of the queue cannot use —
    in holes too small for it, or all of them when the holes cannot take every sequence it
    brings (contiguous only; always 0 when paged).
    ``free``: the rest of the free slots (for paged, cached-but-unreferenced blocks included).
    ``shared_saved_tokens``: slots that sharing (fork, prefix cache) saves against private copies.
    """

    capacity_tokens: int
    token_state: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    shared_saved_tokens: int

    def fractions(self) -> dict[str, float]:
        """The five parts as fractions of the pool (they sum to 1)."""
        cap = self.capacity_tokens
        return {
            "token_state": self.token_state / cap,
            "reserved": self.reserved / cap,
            "internal_fragmentation": self.internal_fragmentation / cap,
            "external_fragmentation": self.external_fragmentation / cap,
            "free": self.free / cap,
        }


class KVAllocator(ABC):
    """Common bookkeeping: per-sequence token counts and the O(1) accounting aggregates.

    Subclasses keep these sums current on every change so that :meth:`snapshot` is O(1) (the
    simulator takes one per step):

    * ``_sum_alloc``: Σ over sequences of slots the sequence can address (shared ones per sharer);
    * ``_sum_useful``: Σ min(allocated, final_tokens) — the slots each sequence will eventually use;
    * ``_dup_slots``: Σ over shared blocks of (refcount − 1) × block size (double-counted slots);
    * ``_saved_tokens``: Σ over shared blocks of (refcount − 1) × filled slots;
    * ``_sum_tokens``: Σ of the token counts last declared through allocate/append/fork.

    ``cache_generation`` counts changes to the set of block hashes held in the prefix cache (a
    hash registered, a cached block evicted); it only ever increases. Contract: ``lookup(hashes,
    n)`` returns the same value for the same arguments as long as ``cache_generation`` has not
    changed, so a caller may keep a lookup's result until the generation moves (a scheduler
    re-checking the same waiting request every step). Allocators without a prefix cache keep it
    at 0.
    """

    capacity_tokens: int
    cache_generation: int  # see the class docstring; 0 forever without a prefix cache
    forks_share_memory: bool = False  # fork shares KV (paged) or copies it into a new region
    # token-state slots one written token fills: 1, or a hybrid pool's token groups (each token
    # has a slot in every group); the engine's quiet runs grow the token state by this per token
    slots_per_token: int = 1
    # whether the engine may run quiet runs over this pool: their argument (simulator/scheduler/
    # core.py quiet_run) needs that no block is freed while a batch only grows
    quiet_runs: bool = True

    def __init__(self) -> None:
        self.num_tokens: dict[int, int] = {}  # seq_id -> tokens declared (grow-before-write)
        self.final_tokens: dict[int, int] = {}
        self.last_failure: AllocFailure | None = None
        self._sum_alloc = 0
        self._sum_useful = 0
        self._dup_slots = 0
        self._saved_tokens = 0
        self._sum_tokens = 0
        self.cache_generation = 0

    # ------------------------------------------------------------------ interface
    @abstractmethod
    def can_allocate(
        self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = ()
    ) -> bool:
        """Whether ``allocate`` with these arguments would succeed now (changes nothing)."""

    @abstractmethod
    def allocate(
        self, seq_id: int, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = ()
    ) -> Allocation | None:
        """Admit ``seq_id`` with room for ``num_tokens`` tokens, or ``None`` (nothing changed)."""

    @abstractmethod
    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        """Make room for ``num_tokens`` tokens in total, before they are written; ``None`` = full."""

    @abstractmethod
    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        """Tokens that can still be written (after ``num_written``) without calling ``append``."""

    @abstractmethod
    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> AppendResult | None:
        """Give ``child_id`` the parent's first ``num_tokens`` tokens; ``None`` if out of memory."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release the sequence's slots. Unknown ids raise ``KeyError``."""

    @abstractmethod
    def allocated_tokens(self, seq_id: int) -> int:
        """Slots the sequence can address now (its capacity before the next ``append``)."""

    @abstractmethod
    def num_free_tokens(self) -> int:
        """Free slots in total (for paged: free blocks × block size, evictable cached ones too)."""

    @abstractmethod
    def external_fragmentation(self, head: tuple[int, ...] | None) -> int:
        """Free slots unusable by the request waiting at the head: ``(num_tokens, final_tokens)``
        of its sequences, and optionally how many sequences it brings (default 1)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Recompute everything from the primary state; raise AssertionError on any mismatch."""

    @abstractmethod
    def min_pool_tokens(self, num_prompt: int, final_tokens: int, num_seqs: int) -> int:
        """Slots a request of ``num_seqs`` sequences needs to finish alone in an empty pool."""

    @abstractmethod
    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Physical blocks of the sequence (contiguous: ``(start_slot,)`` of its region)."""

    @abstractmethod
    def slot_mapping(self, seq_id: int, start: int, num_tokens: int) -> list[int]:
        """Flat pool slots of positions ``start .. start + num_tokens - 1``."""

    # ------------------------------------------------------------------ shared
    def lookup(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """Prompt tokens a new sequence would find in the prefix cache (none without one)."""
        return 0

    def take_loaded_blocks(self) -> int:
        """Blocks loaded from a KV offload tier below HBM since the last call, which resets the
        count: the scheduler adds them to its step's host-to-device copies. The default, 0, is
        every allocator's without such a tier (:class:`~simulator.kv.paged.PagedAllocator` has
        one under ``kv_offload``)."""
        return 0

    def free_blocks_for_growth(self) -> int:
        """How many single-block appends — each by a different sequence whose last block is
        private and full — are guaranteed to succeed now, whatever order they come in.

        A scheduler can grow that many sequences without asking the allocator one by one. The
        default, 0, is the contiguous allocator's: contiguous regions never grow (a sequence's
        region is reserved whole at admission), so there is no block to hand out.
        """
        return 0

    def grow(self, seq_id: int, num_tokens: int) -> int | None:
        """:meth:`append` for a growth that copies nothing, then :meth:`tokens_until_append` of
        the tokens written before it: how many tokens, from position ``num_tokens - 1`` on, can
        be written before the next ``append``. ``None`` when the pool is full (nothing changed).

        A scheduler growing a single-sequence group at its boundary needs both answers; one call
        saves the second per block boundary. A growth that copies (copy-on-write of a shared,
        partially filled last block, which only forks make) raises ``ValueError``: such a
        sequence must go through ``append``, which reports the copies.
        """
        r = self.append(seq_id, num_tokens)
        if r is None:
            return None
        if r.copies:
            raise ValueError(f"grow() of sequence {seq_id} copied blocks {r.copies}: use append()")
        return self.tokens_until_append(seq_id, num_tokens - 1)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.num_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.num_tokens)

    def snapshot(
        self, num_written_tokens: int | None = None, head: tuple[int, ...] | None = None
    ) -> MemorySnapshot:
        """O(1) breakdown of the pool (contiguous: O(holes) when ``head`` changes).

        ``num_written_tokens`` is Σ over live sequences of tokens actually written; callers that
        write tokens without declaring each one (the simulator) pass it; by default the declared
        counts are used. ``head`` is the (num_tokens, final_tokens[, num_seqs]) of the request
        waiting at the head of the queue, for external fragmentation.
        """
        return MemorySnapshot(self.capacity_tokens, *self.snapshot_parts(num_written_tokens, head))

    def snapshot_parts(
        self, num_written_tokens: int | None = None, head: tuple[int, ...] | None = None
    ) -> tuple[int, int, int, int, int, int]:
        """:meth:`snapshot` as a plain tuple (token state, reserved, internal, external, free,
        shared saved): what the engine records every step, without building a record."""
        written = self._sum_tokens if num_written_tokens is None else num_written_tokens
        allocated = self._sum_alloc - self._dup_slots
        token_state = written - self._saved_tokens
        reserved = self._sum_useful - written - (self._dup_slots - self._saved_tokens)
        if reserved < 0:
            reserved = 0
        internal = allocated - token_state - reserved
        free = self.capacity_tokens - allocated
        external = self.external_fragmentation(head) if head is not None else 0
        return (token_state, reserved, internal, external, free - external, self._saved_tokens)

    def _check_aggregates(self, sum_alloc: int, sum_useful: int, dup: int, saved: int) -> None:
        assert self._sum_alloc == sum_alloc, (self._sum_alloc, sum_alloc)
        assert self._sum_useful == sum_useful, (self._sum_useful, sum_useful)
        assert self._dup_slots == dup, (self._dup_slots, dup)
        assert self._saved_tokens == saved, (self._saved_tokens, saved)
        assert self._sum_tokens == sum(self.num_tokens.values())
        assert self.num_tokens.keys() == self.final_tokens.keys()


def blocks_before_eviction(num_free: int, evictable: Iterable[int], num_evictable: int,
                           block_hash: Sequence[object], num_named: int, limit: int) -> int:
    """Blocks a block pool hands out (up to ``limit``) before one that holds a cached hash: its
    ``num_free`` plain free blocks first, then its ``num_evictable`` evictable ones (oldest first)
    up to the first named block — its anonymous full blocks evict nothing (simulator/kv/paged.py).
    ``num_named``: the named blocks on the evictable list."""
    n = num_free
    if n >= limit or not num_named:
        return min(limit, n + num_evictable)
    for b in evictable:
        if n >= limit or block_hash[b] is not None:
            break
        n += 1
    return n


def check_sizes(num_tokens: int, final_tokens: int) -> None:
    """Programming errors, not user input: the scheduler validates requests before this."""
    if num_tokens < 0 or final_tokens < 0:
        raise ValueError(f"negative token count ({num_tokens}, {final_tokens})")
