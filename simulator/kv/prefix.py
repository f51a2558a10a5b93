"""Chained block ids for prefix caching, from a trace's prefix ids (no token ids needed).

A KV block can be reused by another request only if *everything before it* is identical too, so a
block's id is chained from the previous block's id (as vLLM hashes ``(parent_hash, tokens)``).
Traces name prompt prefixes at their own granularity (Mooncake: one id per 512 tokens; synthetic
shared prefixes: one per 16 tokens); this maps them onto blocks of ``block_size`` tokens::

    prefix ids (G=512):  [   id 7   |   id 9   |  id 4 ...
    blocks (B=128):      [b0|b1|b2|b3|b4|b5|b6|b7|...
    b5 = hash((b4, (9,), 128))    -- previous id, the ids it covers, offset inside the first id

Python's hash of a tuple of ints is deterministic across runs (PYTHONHASHSEED only affects str
and bytes), so runs are reproducible. Only *full* blocks inside the named prefix get an id.
"""

from __future__ import annotations

from collections.abc import Sequence


def block_hashes(
    prefix_ids: Sequence[int], prefix_block_tokens: int, block_size: int, num_prompt_tokens: int
) -> tuple[int, ...]:
    """Ids of the prompt's full blocks that lie inside the prefix named by ``prefix_ids``."""
    if not prefix_ids or prefix_block_tokens <= 0:
        return ()
    g, bs = prefix_block_tokens, block_size
    covered = min(len(prefix_ids) * g, num_prompt_tokens)
    num_blocks = covered // bs
    out: list[int] = []
    h = 0
    if g % bs == 0:  # the common case: each block lies inside one prefix id
        per = g // bs
        for j in range(num_blocks):
            h = hash((h, prefix_ids[j // per], j % per))
            out.append(h)
        return tuple(out)
    for j in range(num_blocks):
        lo, hi = j * bs, (j + 1) * bs
        first, last = lo // g, (hi - 1) // g
        h = hash((h, tuple(prefix_ids[first : last + 1]), lo - first * g))
        out.append(h)
    return tuple(out)
