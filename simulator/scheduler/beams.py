"""Beam search, statistically: which beams die at a block boundary and whom their replacements fork.

The simulator does not know token probabilities, so it models what matters for memory: at each
block boundary every beam dies with probability ``replace_prob`` (at least one survives); a dead
beam's KV is freed and its slot is refilled by forking a random survivor, which shares the
survivor's blocks and copies only the partially filled last block on its next write.
"""

from __future__ import annotations

import random

from simulator.kv.allocator import KVAllocator
from simulator.scheduler.state import Group


def reshuffle_beams(g: Group, length: int, alloc: KVAllocator, rng: random.Random, replace_prob: float,
                    new_seq_id) -> int:  # type: ignore[no-untyped-def]
    """Replace the dying beams of ``g`` (KV length ``length``) in place; returns KV tokens copied
    (contiguous forks copy, paged forks share)."""
    k = len(g.seq_ids)
    dead = [i for i in range(k) if rng.random() < replace_prob]
    if len(dead) == k:
        dead.remove(rng.randrange(k))
    alive = [i for i in range(k) if i not in dead]
    copied = 0
    for i in dead:
        donor = g.seq_ids[rng.choice(alive)]
        alloc.free(g.seq_ids[i])
        child = new_seq_id()
        r = alloc.fork(donor, child, length)
        assert r is not None, "a freed region of the same size always fits a fork"
        copied += r.num_copied_tokens
        g.seq_ids[i] = child
    return copied
