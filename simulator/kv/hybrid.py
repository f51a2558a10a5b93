"""vLLM's hybrid KV cache manager as a paged allocator: one block pool, one block table per KV
cache group (:class:`~simulator.kv.sizing.HybridKVLayout`).

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
  before the call (grow before write: they are written before the next declaration) or the
  written count last passed to ``tokens_until_append``. A sequence decoding a token at a time
  thus never holds more than ``ceil(W / B) + 1`` blocks in a sliding group;
* linear attention (``MambaManager``, ``mamba_cache_mode`` "none") holds one block, its state.

Accounting, in slots of one block id (``block_size`` tokens of ``group_size`` layers): a
sequence's allocation is its live blocks in every group × B; its token state is, per token
group, the written tokens its live blocks hold, plus a linear group's whole block (the state is
always written). With ``T`` token groups, ``written`` tokens in all and ``S`` skipped blocks in
all, that is ``T·written − B·S + B·linear blocks``: O(1) per snapshot.

Not modelled here: prefix caching (``lookup`` finds nothing), the CPU offload tier, and shared
forks (a fork copies its parent's live blocks). vLLM's prefix-cache hit for a sliding group
needs only the last ``ceil((W − 1) / B)`` blocks resident (``SlidingWindowManager.
find_longest_cache_hit``); kvplan's block hashes are not kept per group yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.kv.allocator import NO_COPIES, AllocFailure, Allocation, AppendResult, KVAllocator
from simulator.kv.model_config import LINEAR_ATTENTION
from simulator.kv.sizing import HybridKVLayout, skipped_tokens


class HybridPagedAllocator(KVAllocator):
    """The block pool of a hybrid model, one block table per KV cache group (module docstring)."""

    forks_share_memory = False

    def __init__(self, num_blocks: int, layout: HybridKVLayout):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        super().__init__()
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = layout.block_size
        self.capacity_tokens = num_blocks * layout.block_size
        self.enable_prefix_caching = False
        # (kind, window) of each group whose blocks follow the tokens; linear groups apart
        self._token_groups = tuple((g.kind, g.window) for g in layout.groups
                                   if g.kind != LINEAR_ATTENTION)
        self._num_linear = len(layout.groups) - len(self._token_groups)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # seq -> per token group: [first live block index, live block ids...]
        self._skipped: dict[int, list[int]] = {}
        self._tables: dict[int, list[list[int]]] = {}
        self._states: dict[int, list[int]] = {}  # seq -> its linear groups' blocks
        self._written: dict[int, int] = {}  # seq -> written count last told (tokens_until_append)
        self._sum_skipped = 0  # Σ skipped blocks over sequences and token groups
        self._sum_blocks = 0  # Σ live blocks (token and linear groups)

    # ------------------------------------------------------------------ sizing rules
    def _blocks_after(self, declared: int, num_tokens: int) -> list[tuple[int, int]]:
        """Per token group, (skipped blocks, total blocks) once ``num_tokens`` are declared and
        the blocks skipped after ``declared`` computed tokens are dropped."""
        bs = self.block_size
        total = -(-num_tokens // bs)
        return [(min(skipped_tokens(kind, window, declared) // bs, total), total)
                for kind, window in self._token_groups]

    def _new_blocks(self, seq_id: int | None, num_tokens: int) -> tuple[int, int]:
        """(blocks to take, blocks freed by skipping) for growing ``seq_id`` (None: a new
        sequence) to ``num_tokens``."""
        if seq_id is None:
            plan = self._blocks_after(0, num_tokens)
            return sum(total - skip for skip, total in plan) + self._num_linear, 0
        declared = self._computed(seq_id)
        take = freed = 0
        for (skip, total), old_skip, table in zip(self._blocks_after(declared, num_tokens),
                                                  self._skipped[seq_id], self._tables[seq_id]):
            old_total = old_skip + len(table)
            freed += max(0, min(skip, old_total) - old_skip)
            take += max(0, total - max(old_total, skip))
        return take, freed

    def _computed(self, seq_id: int) -> int:
        """Tokens of ``seq_id`` known to be computed (module docstring)."""
        declared = self.num_tokens[seq_id]
        written = self._written.get(seq_id, 0)
        return written if written > declared else declared

    # ------------------------------------------------------------------ interface
    def can_allocate(self, num_tokens: int, final_tokens: int,
                     block_hashes: Sequence[int] = ()) -> bool:
        return self._new_blocks(None, num_tokens)[0] <= len(self._free)

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = ()) -> Allocation | None:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        need, _ = self._new_blocks(None, num_tokens)
        if need > len(self._free):
            self.last_failure = AllocFailure.NO_SPACE
            return None
        free = self._free
        tables = []
        for _, total in self._blocks_after(0, num_tokens):
            tables.append([free.pop() for _ in range(total)])
        self._tables[seq_id] = tables
        self._skipped[seq_id] = [0] * len(tables)
        self._states[seq_id] = [free.pop() for _ in range(self._num_linear)]
        self._sum_blocks += need
        self.num_tokens[seq_id] = num_tokens
        self.final_tokens[seq_id] = final_tokens
        self._sum_tokens += num_tokens
        self._sum_alloc += need * self.block_size
        return Allocation(seq_id, 0, need * self.block_size)

    def append(self, seq_id: int, num_tokens: int) -> AppendResult | None:
        declared = self.num_tokens[seq_id]
        if num_tokens <= declared:
            return NO_COPIES
        take, freed = self._new_blocks(seq_id, num_tokens)
        if take > len(self._free) + freed:
            self.last_failure = AllocFailure.NO_SPACE
            return None
        free, bs = self._free, self.block_size
        plan = self._blocks_after(self._computed(seq_id), num_tokens)
        skipped = self._skipped[seq_id]
        for g, ((skip, total), table) in enumerate(zip(plan, self._tables[seq_id])):
            drop = max(0, min(skip, skipped[g] + len(table)) - skipped[g])
            if drop:  # remove_skipped_blocks: the ids return to the pool, oldest first
                free.extend(reversed(table[:drop]))
                del table[:drop]
                skipped[g] += drop
                self._sum_skipped += drop
            for _ in range(total - skipped[g] - len(table)):
                table.append(free.pop())
        self._sum_blocks += take - freed
        self._sum_alloc += (take - freed) * bs
        self.num_tokens[seq_id] = num_tokens
        self._sum_tokens += num_tokens - declared
        return NO_COPIES

    def tokens_until_append(self, seq_id: int, num_written: int) -> int:
        self._written[seq_id] = num_written
        tables = self._tables[seq_id]
        if not tables:  # linear groups only: a fixed state, never grows
            return 1 << 62
        # every token group ends at the same block boundary: window groups drop their skipped
        # blocks at the append made there
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
        free = self._free
        blocks = 0
        for table in tables:
            free.extend(reversed(table))
            blocks += len(table)
        states = self._states.pop(seq_id)
        free.extend(states)
        blocks += len(states)
        self._sum_skipped -= sum(self._skipped.pop(seq_id))
        self._sum_blocks -= blocks
        self._sum_alloc -= blocks * self.block_size
        self.final_tokens.pop(seq_id)
        self._written.pop(seq_id, None)
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

    def num_free_tokens(self) -> int:
        return len(self._free) * self.block_size

    def free_blocks_for_growth(self) -> int:
        """Sequences that can each grow by one block now: a boundary takes one block in every
        token group (a sliding group may free one, not counted)."""
        return len(self._free) // max(len(self._token_groups), 1)

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
        """The pool in slots (module docstring): token state, reserved, internal, 0, free, 0."""
        written = self._sum_tokens if num_written_tokens is None else num_written_tokens
        groups, bs = len(self._token_groups), self.block_size
        linear = self._num_linear * len(self._tables) * bs
        token_state = groups * written - bs * self._sum_skipped + linear
        reserved = groups * (self._sum_tokens - written)
        if reserved < 0:  # tokens written past the last declaration (grow only at boundaries)
            reserved = 0
        allocated = self._sum_blocks * bs
        internal = allocated - token_state - reserved
        return (token_state, reserved, internal, 0, self.capacity_tokens - allocated, 0)

    def check_invariants(self) -> None:
        bs = self.block_size
        seen = list(self._free)
        skipped_sum = blocks = 0
        for seq_id, tables in self._tables.items():
            n = self.num_tokens[seq_id]
            assert len(self._states[seq_id]) == self._num_linear
            seen += self._states[seq_id]
            blocks += self._num_linear
            for (kind, window), skip, table in zip(self._token_groups, self._skipped[seq_id], tables):
                assert skip + len(table) == -(-n // bs), (seq_id, kind, skip, len(table), n)
                seen += table
                skipped_sum += skip
                blocks += len(table)
        assert len(seen) == len(set(seen)) == self.num_blocks, "blocks not conserved"
        assert skipped_sum == self._sum_skipped and blocks == self._sum_blocks
        assert self._sum_alloc == blocks * bs
        assert self._sum_tokens == sum(self.num_tokens.values())
        assert self.num_tokens.keys() == self.final_tokens.keys() == self._tables.keys()
        assert self._written.keys() <= self._tables.keys()


__all__ = ["HybridPagedAllocator"]
