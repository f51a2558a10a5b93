"""StepPlan: what one engine step does — the seam between the scheduler and an executor.

The scheduler produces one :class:`StepPlan` per step; the simulator turns it into a duration
(``latency_model.step_latency_s(plan)``) and the real backend executes it on a device. Both
then call ``Scheduler.complete(plan)``.

Aggregates (token and context totals) are always filled: they are all a latency model needs
and they cost O(1) per step. The per-sequence detail (decode ids, block tables, slot mapping)
is filled only when the scheduler runs with ``detail=True`` (the real backend); the decisions
are identical either way.
"""

from __future__ import annotations

from typing import NamedTuple


class PrefillChunk(NamedTuple):
    """``num_tokens`` prompt tokens of ``seq_id`` computed this step, after
    ``num_computed_tokens`` tokens already in the KV cache (earlier chunks or prefix-cache hits)."""

    seq_id: int
    num_tokens: int
    num_computed_tokens: int
    samples_token: bool  # True for the last chunk: this step emits the sequence's first token

    @property
    def context_tokens(self) -> int:
        """KV tokens the chunk's attention reads (cached context plus the chunk itself)."""
        return self.num_computed_tokens + self.num_tokens


class SeqDetail(NamedTuple):
    """Per-sequence tensors' source for the real backend (detail mode only).

    ``block_table`` is the sequence's physical block ids (paged) or ``(start_slot,)`` of its
    contiguous region; ``slot_mapping`` is the flat pool slot of each token written this step.
    ``position`` is the position of the first token written this step.
    """

    seq_id: int
    position: int
    num_tokens: int
    context_len: int  # KV tokens valid after this step's write
    block_table: tuple[int, ...]
    slot_mapping: tuple[int, ...]


class StepPlan(NamedTuple):
    """One engine step (a NamedTuple: the simulator builds one per step, so creation is hot)."""

    step_id: int
    prefills: tuple[PrefillChunk, ...]
    num_decode_seqs: int
    decode_context_tokens: int  # Σ over decoding sequences of KV tokens read (after this step's write)
    decode_context_sq: float  # Σ context²: with the sum it gives the spread of context lengths
    decode_max_context: int  # the longest decoding context this step (split-K matters for it)
    num_swap_out_blocks: int = 0  # KV blocks copied GPU -> CPU this step (swap preemption)
    num_swap_in_blocks: int = 0  # KV blocks copied CPU -> GPU this step
    cow_copies: tuple[tuple[int, int], ...] = ()  # (src_block, dst_block) copies before the write
    num_copy_tokens: int = 0  # KV tokens copied on device this step (COW blocks, contiguous forks)
    preempted: tuple[int, ...] = ()  # request ids preempted while building this step
    # Detail mode only (None otherwise): one SeqDetail per scheduled sequence, prefills first.
    details: tuple[SeqDetail, ...] | None = None
    # speculative decoding: draft tokens verified this step, over every decoding sequence (each
    # decode's query is its next token plus its drafts; decode_context_tokens still counts each
    # sequence's KV up to its first query token). 0 without speculation.
    num_spec_tokens: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens the step computes: prefill chunks, one per decode, and the drafts verified."""
        return self.num_prefill_tokens + self.num_decode_seqs + self.num_spec_tokens

    @property
    def batch_size(self) -> int:
        """Sequences in this step (prefill chunks and decodes)."""
        return len(self.prefills) + self.num_decode_seqs

    @property
    def prefill_attention_pairs(self) -> int:
        """(query, key) pairs of causal attention over this step's prefill chunks."""
        return sum(
            c.num_tokens * c.num_computed_tokens + c.num_tokens * (c.num_tokens + 1) // 2
            for c in self.prefills
        )

    @property
    def prefill_context_tokens(self) -> int:
        """KV tokens read by this step's prefill chunks."""
        return sum(c.context_tokens for c in self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and self.num_decode_seqs == 0
