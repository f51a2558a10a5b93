"""Contiguous KV reservations for a hybrid model: one region per sequence, holding per KV cache
group what that group keeps for the policy's reserved length.

The pool is the hybrid manager's (:class:`~simulator.kv.sizing.HybridKVLayout`): ``num_blocks``
block ids of ``block_size`` slots, a slot being one token in the ``group_size`` layers of one
group (the unit :class:`~simulator.kv.hybrid.HybridPagedAllocator` counts in), so both
allocators get the same bytes. A sequence whose policy reserves ``L`` tokens (``max``, ``pow2``,
``oracle``: :meth:`ContiguousAllocator.reservation`) takes one region of, per group::

    full attention     L
    sliding window     min(L, B · (ceil((W − 1 + C) / B) + 1))
    chunked local      min(L, B · ceil((chunk + C) / B))
    linear attention   B                                   (its state, padded to a page)

with ``C`` = ``max_num_batched_tokens``: the most one group's live blocks span, vLLM's
``max_memory_usage_bytes`` of ``SlidingWindowSpec`` / ``ChunkedLocalAttentionSpec`` in tokens
(vllm/v1/kv_cache_interface.py: the window before the chunk being computed, plus the block the
window starts inside). A window group's sub-region is a ring: position p sits at slot
``p mod size``. A sequence admitted with more tokens than that (a swapped-out sequence coming
back whole) gets ``ceil(n / B) · B`` there instead, still at most L. Regions are placed first-fit
in the one shared pool, so external fragmentation is defined on it exactly as for
:class:`~simulator.kv.contiguous.ContiguousAllocator`.

**Token state** counts what :class:`~simulator.kv.hybrid.HybridPagedAllocator` counts, so the two
agree on the same operations: per full group the written tokens; per window group the written
tokens minus ``B ·`` the blocks its attention skips, those being ``get_num_skipped_tokens(c) //
B`` (vllm/v1/core/single_type_kv_cache_manager.py, :func:`~simulator.kv.sizing.skipped_tokens`)
at the tokens ``c`` known computed when the sequence last grew (the tokens declared before that
``append``, or the written count last passed to ``tokens_until_append`` if larger), never
more than the blocks declared then; per linear group B slots. With ``T`` token groups,
``written`` tokens in all and ``S`` skipped blocks in all that is ``T·written − B·S +
B·linear groups·sequences``, O(1) per snapshot. A window layout therefore answers
``tokens_until_append`` up to the next block boundary (as the paged allocator does), so the
skipped blocks follow the sequence; without window groups it answers up to L, as the plain
contiguous allocator.

**Reserved** is the rest of what the sequence will ever write: per group ``min(size, final)``
slots (a ring wraps only past its size; a linear group's page always), less the token state;
**internal fragmentation** the slots of the region no token will ever reach.

Forks copy the parent's region: the child holds the parent's live tokens (its skipped blocks
too), where the paged allocator's fork re-allocates every block of the prefix in every group
and drops the skipped ones at the child's next growth.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.kv.allocator import NO_COPIES, AllocFailure, Allocation, AppendResult
from simulator.kv.contiguous import ContiguousAllocator, ReservationPolicy
from simulator.kv.model_config import CHUNKED_ATTENTION, LINEAR_ATTENTION, SLIDING_ATTENTION
from simulator.kv.sizing import HybridKVLayout, skipped_tokens


class HybridContiguousAllocator(ContiguousAllocator):
    """One contiguous region per sequence, sized per KV cache group (module docstring)."""

    def __init__(self, num_blocks: int, layout: HybridKVLayout, *, policy: ReservationPolicy,
                 max_model_len: int, max_num_batched_tokens: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {max_num_batched_tokens}")
        bs = layout.block_size
        super().__init__(num_blocks * bs, policy=policy, max_model_len=max_model_len)
        self.layout = layout
        self.block_size = bs
        token_groups = [g for g in layout.groups if g.kind != LINEAR_ATTENTION]
        self._num_token_groups = len(token_groups)
        self.slots_per_token = len(token_groups)  # each token has a slot in every token group
        self._linear_slots = (len(layout.groups) - len(token_groups)) * bs
        # per token group, the most tokens its live blocks span (at least max_model_len if full)
        self._spans = tuple(bs * g.max_blocks(max_model_len, max_num_batched_tokens, bs)
                            for g in token_groups)
        # (index among token groups, kind, window) of the groups that skip leading tokens
        self._windows = tuple((i, g.kind, g.window) for i, g in enumerate(token_groups)
                              if g.kind in (SLIDING_ATTENTION, CHUNKED_ATTENTION))
        self._length: dict[int, int] = {}  # seq -> reserved length L
        self._caps: dict[int, tuple[int, ...]] = {}  # seq -> slots per token group
        self._skipped: dict[int, list[int]] = {}  # seq -> skipped blocks per window group
        self._written: dict[int, int] = {}  # seq -> written count last told (window layouts)
        self._sum_skipped = 0

    # ------------------------------------------------------------------ policy
    def reserved_length(self, num_tokens: int, final_tokens: int) -> int:
        """Tokens the policy reserves (L): the plain contiguous allocator's reservation."""
        return super().reservation(num_tokens, final_tokens)

    def _group_slots(self, length: int, num_tokens: int) -> tuple[int, ...]:
        """Slots of each token group for a sequence reserving ``length`` and admitted with
        ``num_tokens`` (module docstring)."""
        held = -(-num_tokens // self.block_size) * self.block_size
        return tuple(min(length, span if span > held else held) for span in self._spans)

    def reservation(self, num_tokens: int, final_tokens: int) -> int:
        """Slots of the region a new sequence takes: every group's share."""
        length = self.reserved_length(num_tokens, final_tokens)
        return sum(self._group_slots(length, num_tokens)) + self._linear_slots

    def _useful(self, caps: tuple[int, ...], final_tokens: int) -> int:
        """Slots of a region that some token reaches before the sequence ends."""
        return sum(c if c < final_tokens else final_tokens for c in caps) + self._linear_slots

    # ------------------------------------------------------------------ interface
    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = ()) -> Allocation | None:
        if seq_id in self.regions:
            raise ValueError(f"sequence {seq_id} is already allocated")
        length = self.reserved_length(num_tokens, final_tokens)
        caps = self._group_slots(length, num_tokens)
        size = sum(caps) + self._linear_slots
        start = self._claim(size)
        if start is None:
            return None
        self._admit(seq_id, start, size, length, caps, num_tokens, final_tokens,
                    [0] * len(self._windows))
        return Allocation(seq_id, 0, size)

    def _admit(self, seq_id: int, start: int, size: int, length: int, caps: tuple[int, ...],
               num_tokens: int, final_tokens: int, skipped: list[int]) -> None:
        self.regions[seq_id] = (start, size)
        self._length[seq_id] = length
        self._caps[seq_id] = caps
        if self._windows:
            self._skipped[seq_id] = skipped
            self._sum_skipped += sum(skipped)
        self.num_tokens[seq_id] = num_tokens
        self.final_tokens[seq_id] = final_tokens
        self._sum_alloc += size
        self._sum_useful += self._useful(caps, final_tokens)
        self._sum_tokens += num_tokens

    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        declared = self.num_tokens[seq_id]
        if num_tokens <= declared:
            return NO_COPIES
        length = self._length[seq_id]
        if num_tokens > length:  # a region never moves or grows: the reservation was the promise
            self.last_failure = AllocFailure.RESERVATION_EXCEEDED
            return None
        if self._windows:
            bs = self.block_size
            written = self._written.get(seq_id, 0)
            computed = written if written > declared else declared
            declared_blocks = -(-declared // bs)
            top = min(length, -(-num_tokens // bs) * bs)  # the most it writes before growing again
            caps, skipped = self._caps[seq_id], self._skipped[seq_id]
            new = []
            for (i, kind, window), old in zip(self._windows, skipped):
                skip = min(skipped_tokens(kind, window, computed) // bs, declared_blocks)
                skip = skip if skip > old else old
                if top - bs * skip > caps[i]:  # more live tokens than the group's ring holds
                    self.last_failure = AllocFailure.RESERVATION_EXCEEDED
                    return None
                new.append(skip)
            self._sum_skipped += sum(new) - sum(skipped)
            self._skipped[seq_id] = new
        self.num_tokens[seq_id] = num_tokens
        self._sum_tokens += num_tokens - declared
        return NO_COPIES

    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        length = self._length[seq_id]
        if not self._windows:
            return length - num_written
        self._written[seq_id] = num_written
        bs = self.block_size
        return min(length, -(-self.num_tokens[seq_id] // bs) * bs) - num_written

    def allocated_tokens(self, seq_id: int) -> int:
        """Tokens the sequence can reach: its reserved length L."""
        return self._length[seq_id]

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> AppendResult | None:
        """A child gets a region of its own, the parent's sizes, and a copy of its live KV."""
        if child_id in self.regions:
            raise ValueError(f"sequence {child_id} is already allocated")
        length = self._length[parent_id]
        if num_tokens > length:
            raise ValueError(f"fork of {num_tokens} tokens but sequence {parent_id} reserves {length}")
        if self.append(parent_id, num_tokens) is None:
            return None
        size = self.regions[parent_id][1]
        start = self._claim(size)
        if start is None:
            return None
        skipped = list(self._skipped[parent_id]) if self._windows else []
        self._admit(child_id, start, size, length, self._caps[parent_id], num_tokens,
                    self.final_tokens[parent_id], skipped)
        return AppendResult((), num_tokens)

    def free(self, seq_id: int) -> None:
        start, size = self.regions.pop(seq_id)
        self._release(start, size)
        self._free_total += size
        self._length.pop(seq_id)
        self._sum_alloc -= size
        self._sum_useful -= self._useful(self._caps.pop(seq_id), self.final_tokens.pop(seq_id))
        self._sum_tokens -= self.num_tokens.pop(seq_id)
        if self._windows:
            self._sum_skipped -= sum(self._skipped.pop(seq_id))
            self._written.pop(seq_id, None)

    def slot_mapping(self, seq_id: int, start: int, num_tokens: int) -> list[int]:
        """Pool slots of positions ``start ..`` in the first group's sub-region (a ring for a
        window group)."""
        base = self.regions[seq_id][0]
        caps = self._caps[seq_id]
        cap = caps[0] if caps else self.block_size
        return [base + p % cap for p in range(start, start + num_tokens)]

    def snapshot_parts(self, num_written_tokens: int | None = None,
                       head: tuple[int, ...] | None = None) -> tuple[int, int, int, int, int, int]:
        """The pool in slots (module docstring): token state, reserved, internal, external, free."""
        written = self._sum_tokens if num_written_tokens is None else num_written_tokens
        bs = self.block_size
        token_state = (self._num_token_groups * written - bs * self._sum_skipped
                       + self._linear_slots * len(self.regions))
        reserved = self._sum_useful - token_state
        if reserved < 0:
            reserved = 0
        allocated = self._sum_alloc
        internal = allocated - token_state - reserved
        external = self.external_fragmentation(head) if head is not None else 0
        return (token_state, reserved, internal, external,
                self.capacity_tokens - allocated - external, 0)

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        self._check_holes()
        bs = self.block_size
        sum_alloc = sum_useful = skipped_sum = 0
        for q, (_, size) in self.regions.items():
            length, caps, n = self._length[q], self._caps[q], self.num_tokens[q]
            assert n <= length, f"seq {q} declares {n} tokens, reserves {length}"
            assert len(caps) == self._num_token_groups and all(0 < c <= length for c in caps)
            assert size == sum(caps) + self._linear_slots, f"seq {q}: region != its groups"
            if self._windows:
                skipped = self._skipped[q]
                top = min(length, -(-n // bs) * bs)
                for (i, kind, _), skip in zip(self._windows, skipped):
                    assert 0 <= skip <= -(-n // bs), (q, kind, skip, n)
                    assert top - bs * skip <= caps[i], f"seq {q}: {kind} ring overflows"
                skipped_sum += sum(skipped)
            sum_alloc += size
            sum_useful += self._useful(caps, self.final_tokens[q])
        assert skipped_sum == self._sum_skipped, "skipped-block total drifted"
        self._check_aggregates(sum_alloc, sum_useful, 0, 0)
        assert self.regions.keys() == self._length.keys() == self._caps.keys()
        assert self.regions.keys() == self.num_tokens.keys()
        if self._windows:
            assert self._skipped.keys() == self.regions.keys()
        assert self._written.keys() <= self.regions.keys()


__all__ = ["HybridContiguousAllocator"]
