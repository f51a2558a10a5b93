"""Contiguous KV allocation: one region per sequence in a linear space of token slots.

This is the baseline paged allocation is measured against (Orca and HuggingFace ``StaticCache``
style). Each sequence reserves one contiguous region at admission, sized by a policy:

* ``max``    — ``max_model_len`` slots, whatever the request (the naive server);
* ``pow2``   — the next power of two ≥ the final length, capped at ``max_model_len``
               (Orca (Pow2): over-reserves by less than 2x);
* ``oracle`` — exactly the final length (Orca (Oracle): knows the output length in advance).

::

    0                                                            capacity
    |AAAAAAAA....|  hole  |BBBB........|CC.| hole |DDDDDDDDDDD.......|
      A: token state + reserved (will be written) + internal (never written)

Regions are placed first-fit in address order; a freed region becomes a hole that coalesces with
its neighbours. When the head request's reservation fits in no hole although the free total would
hold it, it is blocked by *external* fragmentation (:attr:`num_external_blocked`).

A hybrid model (sliding-window, chunked-local or linear-attention layers) reserves per KV cache
group instead: :class:`~simulator.kv.hybrid_contiguous.HybridContiguousAllocator`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Literal

from simulator.kv.allocator import (
    NO_COPIES,
    AllocFailure,
    Allocation,
    AppendResult,
    KVAllocator,
)

ReservationPolicy = Literal["max", "pow2", "oracle"]
POLICIES: tuple[str, ...] = ("max", "pow2", "oracle")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class ContiguousAllocator(KVAllocator):
    def __init__(self, capacity_tokens: int, *, policy: ReservationPolicy, max_model_len: int):
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens}")
        if policy not in POLICIES:
            raise ValueError(f"unknown reservation policy {policy!r} (known: {', '.join(POLICIES)})")
        if max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        super().__init__()
        self.capacity_tokens = capacity_tokens
        self.policy = policy
        self.max_model_len = max_model_len
        self.regions: dict[int, tuple[int, int]] = {}  # seq_id -> (start slot, size)
        self._hole_starts: list[int] = [0]  # sorted
        self._hole_size: dict[int, int] = {0: capacity_tokens}
        self._free_total = capacity_tokens
        self._version = 0  # bumps on every hole change (caches external fragmentation)
        self._ext_cache: tuple[int, int, int, int] = (-1, -1, -1, 0)  # version, need, seqs, value
        self.num_external_blocked = 0  # allocate() calls refused by external fragmentation

    # ------------------------------------------------------------------ policy
    def reservation(self, num_tokens: int, final_tokens: int) -> int:
        """Slots a new sequence reserves (never fewer than ``num_tokens``)."""
        if self.policy == "max":
            size = self.max_model_len
        elif self.policy == "pow2":
            size = min(next_pow2(final_tokens), self.max_model_len)
        else:
            size = final_tokens
        return max(size, num_tokens, 1)

    # ------------------------------------------------------------------ holes
    def _find_hole(self, size: int) -> int | None:
        """First fit: the lowest-addressed hole of at least ``size`` slots."""
        hole_size = self._hole_size
        for start in self._hole_starts:
            if hole_size[start] >= size:
                return start
        return None

    def _carve(self, start: int, size: int) -> None:
        hole = self._hole_size.pop(start)
        i = bisect.bisect_left(self._hole_starts, start)
        if hole == size:
            del self._hole_starts[i]
        else:  # the rest of the hole stays in place, still in address order
            self._hole_starts[i] = start + size
            self._hole_size[start + size] = hole - size
        self._free_total -= size
        self._version += 1

    def _release(self, start: int, size: int) -> None:
        starts, hole_size = self._hole_starts, self._hole_size
        i = bisect.bisect_left(starts, start)
        if i < len(starts) and start + size == starts[i]:  # merge with the next hole
            size += hole_size.pop(starts[i])
            del starts[i]
        if i > 0 and starts[i - 1] + hole_size[starts[i - 1]] == start:  # and the previous one
            hole_size[starts[i - 1]] += size
        else:
            starts.insert(i, start)
            hole_size[start] = size
        self._version += 1

    def largest_hole(self) -> int:
        return max(self._hole_size.values(), default=0)

    def num_holes(self) -> int:
        return len(self._hole_starts)

    # ------------------------------------------------------------------ interface
    def num_free_tokens(self) -> int:
        return self._free_total

    def allocated_tokens(self, seq_id: int) -> int:
        return self.regions[seq_id][1]

    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        return self.regions[seq_id][1] - num_written

    def min_pool_tokens(self, num_prompt: int, final_tokens: int, num_seqs: int) -> int:
        return num_seqs * self.reservation(num_prompt, final_tokens)

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return (self.regions[seq_id][0],)

    def slot_mapping(self, seq_id: int, start: int, num_tokens: int) -> list[int]:
        base = self.regions[seq_id][0]
        return list(range(base + start, base + start + num_tokens))

    def region(self, seq_id: int) -> tuple[int, int]:
        """(start slot, size) of the sequence's region."""
        return self.regions[seq_id]

    def can_allocate(
        self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = ()
    ) -> bool:
        return self._find_hole(self.reservation(num_tokens, final_tokens)) is not None

    def _claim(self, size: int) -> int | None:
        """Carve a region of ``size`` slots first-fit and return its start, or None (recording
        why: external fragmentation when the free total would hold it, else no space)."""
        start = self._find_hole(size)
        if start is None:
            if size <= self._free_total:
                self.last_failure = AllocFailure.EXTERNAL_FRAGMENTATION
                self.num_external_blocked += 1
            else:
                self.last_failure = AllocFailure.NO_SPACE
            return None
        self._carve(start, size)
        return start

    def _place(self, seq_id: int, size: int, num_tokens: int, final_tokens: int) -> bool:
        start = self._claim(size)
        if start is None:
            return False
        self.regions[seq_id] = (start, size)
        self.num_tokens[seq_id] = num_tokens
        self.final_tokens[seq_id] = final_tokens
        self._sum_alloc += size
        self._sum_useful += min(size, final_tokens)
        self._sum_tokens += num_tokens
        return True

    def allocate(
        self, seq_id: int, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = ()
    ) -> Allocation | None:
        if seq_id in self.regions:
            raise ValueError(f"sequence {seq_id} is already allocated")
        size = self.reservation(num_tokens, final_tokens)
        if not self._place(seq_id, size, num_tokens, final_tokens):
            return None
        return Allocation(seq_id, 0, size)

    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        size = self.regions[seq_id][1]
        if num_tokens > size:  # a region never moves or grows: the reservation was the promise
            self.last_failure = AllocFailure.RESERVATION_EXCEEDED
            return None
        old = self.num_tokens[seq_id]
        if num_tokens > old:
            self.num_tokens[seq_id] = num_tokens
            self._sum_tokens += num_tokens - old
        return NO_COPIES

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> AppendResult | None:
        """A child gets a region of its own (same reservation) and a copy of the parent's KV."""
        if child_id in self.regions:
            raise ValueError(f"sequence {child_id} is already allocated")
        size = self.regions[parent_id][1]
        if num_tokens > size:
            raise ValueError(f"fork of {num_tokens} tokens but sequence {parent_id} holds {size} slots")
        self.append(parent_id, num_tokens)
        if not self._place(child_id, size, num_tokens, self.final_tokens[parent_id]):
            return None
        return AppendResult((), num_tokens)

    def free(self, seq_id: int) -> None:
        start, size = self.regions.pop(seq_id)
        self._release(start, size)
        self._free_total += size
        final = self.final_tokens.pop(seq_id)
        self._sum_alloc -= size
        self._sum_useful -= min(size, final)
        self._sum_tokens -= self.num_tokens.pop(seq_id)

    def external_fragmentation(self, head: tuple[int, ...] | None) -> int:
        """Free slots the head request cannot use: those in holes too small for its reservation,
        or every free slot when the holes cannot take all its ``num_seqs`` regions (a group of
        samples or beams needs one region per sequence: admission frees all of them if one fails,
        so a pool with room for three of four regions leaves the group waiting beside free memory).

        ``head`` is ``(num_tokens, final_tokens)`` or ``(num_tokens, final_tokens, num_seqs)``."""
        if head is None:
            return 0
        need = self.reservation(head[0], head[1])
        num_seqs = head[2] if len(head) > 2 else 1
        version, cached_need, cached_seqs, value = self._ext_cache
        if version == self._version and cached_need == need and cached_seqs == num_seqs:
            return value
        holes = self._hole_size.values()
        if sum(s // need for s in holes) < num_seqs:
            value = self._free_total
        else:
            value = sum(s for s in holes if s < need)
        self._ext_cache = (self._version, need, num_seqs, value)
        return value

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        self._check_holes()
        sum_alloc = sum_useful = 0
        for q, (_, size) in self.regions.items():
            assert self.num_tokens[q] <= size, f"seq {q} holds more tokens than its region"
            sum_alloc += size
            sum_useful += min(size, self.final_tokens[q])
        self._check_aggregates(sum_alloc, sum_useful, 0, 0)

    def _check_holes(self) -> None:
        """Regions and holes tile the pool in address order, holes coalesced, free total exact."""
        starts = self._hole_starts
        assert starts == sorted(starts), "holes out of address order"
        assert set(starts) == set(self._hole_size), "hole index and sizes disagree"
        spans = [(s, self._hole_size[s], "hole") for s in starts]
        spans += [(s, size, f"seq {q}") for q, (s, size) in self.regions.items()]
        spans.sort()
        pos = 0
        prev_kind = ""
        for start, size, kind in spans:
            assert size > 0, f"empty {kind}"
            assert start == pos, f"{kind} at {start} but previous span ends at {pos} (overlap or leak)"
            assert not (kind == "hole" and prev_kind == "hole"), f"adjacent holes at {start} not coalesced"
            pos, prev_kind = start + size, kind
        assert pos == self.capacity_tokens, "regions and holes do not cover the pool exactly"
        assert self._free_total == sum(self._hole_size.values()), "free total drifted"
