"""Per-sequence step details for an executor (detail mode): block tables and slot mappings.

The simulator never needs them; the real backend builds its step tensors from them. Building them
visits every scheduled sequence, which is why it is kept out of the scheduler's hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simulator.kv.allocator import KVAllocator
from simulator.scheduler.plan import PrefillChunk, SeqDetail
from simulator.scheduler.state import Group


def step_details(alloc: KVAllocator, chunks: Sequence[PrefillChunk], decoding: Iterable[Group],
                 decode_counter: int) -> tuple[SeqDetail, ...]:
    """One SeqDetail per scheduled sequence: the prefill chunks first, then every decode."""
    out = [
        SeqDetail(c.seq_id, c.num_computed_tokens, c.num_tokens, c.context_tokens,
                  alloc.block_table(c.seq_id),
                  tuple(alloc.slot_mapping(c.seq_id, c.num_computed_tokens, c.num_tokens)))
        for c in chunks
    ]
    for g in decoding:
        length = g.kv_len(decode_counter)
        for s in g.seq_ids:
            out.append(SeqDetail(s, length, 1, length + 1, alloc.block_table(s),
                                 tuple(alloc.slot_mapping(s, length, 1))))
    return tuple(out)
