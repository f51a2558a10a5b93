"""Per-request scheduling state.

A *group* is one request: one sequence, or ``n`` samples / ``beam_width`` beams forked from it
after prefill. All sequences of a group have the same length at every step (they fork at the
current length and each decodes one token per step), so the group carries the length and its
sequences carry only their ids.

No prefill phase and decode phase as such: a group's KV length catches up with its prompt in
chunks (``num_computed``), then grows by one token per step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from workloads.request import Request


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(slots=True, eq=False)
class Group:
    request: Request
    final_tokens: int  # KV tokens of each sequence when done: prompt + output - 1
    block_hashes: tuple[int, ...] = ()
    status: Status = Status.WAITING
    seq_ids: list[int] = field(default_factory=list)
    # prefill of the current admission
    num_prefill_target: int = 0  # tokens to prefill: the prompt, or prompt + generated on recompute
    num_computed: int = 0
    # decode anchors: KV length = anchor_len + (decode_counter - anchor_counter)
    anchor_len: int = 0
    anchor_counter: int = 0
    epoch: int = 0  # bumps whenever pending events of the group must be ignored
    grow_token: int = 0  # identifies the group's one pending growth event
    admit_order: int = 0
    swapped_len: int = 0
    # what the report needs
    num_preemptions: int = 0
    num_swaps: int = 0
    num_admissions: int = 0  # from the waiting queue: 1 + re-admissions after preemption or restart
    # prefix cache at the first admission only: prompt tokens found cached / looked up
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    readmission_hit_tokens: int = 0  # cached tokens found by later admissions (often its own blocks)
    first_token_emitted: bool = False
    blocked_by_external_fragmentation: bool = False
    reject_reason: str = ""
    index: int = -1  # position in the run's request list (set by the engine)
    # the last prefix-cache lookup while waiting: (cache generation, prompt tokens) -> tokens hit
    lookup_key: tuple[int, int] = (-1, -1)
    lookup_tokens: int = 0

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def num_seqs(self) -> int:
        """Sequences the group runs when decoding."""
        return self.request.num_seqs

    def kv_len(self, decode_counter: int) -> int:
        """KV tokens written per sequence (valid while decoding)."""
        return self.anchor_len + decode_counter - self.anchor_counter

    def generated(self, kv_len: int) -> int:
        """Output tokens emitted so far, given the KV length (the newest token has no KV yet)."""
        return kv_len - self.request.prompt_tokens + 1


def reject(g: Group, reason: str) -> Group:
    """Mark ``g`` refused at arrival, with the one-line reason the requests table shows."""
    g.status = Status.REJECTED
    g.reject_reason = reason
    return g


class StepOutcome(NamedTuple):
    """What a completed step changed, for the executor to time-stamp."""

    first_token: tuple[Group, ...]  # groups that emitted their first token this step
    finished: tuple[Group, ...]
