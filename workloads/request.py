"""The request record every loader and generator produces and the scheduler consumes."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request of a trace.

    ``prefix_ids`` names the prompt's leading blocks of ``prefix_block_tokens`` tokens each
    (e.g. Mooncake's ``hash_ids`` of 512-token blocks, or a synthetic system prompt's ids):
    two requests whose ``prefix_ids`` share a leading run share that much prompt prefix, so
    a paged allocator with prefix caching can reuse those KV blocks. Empty = no prefix info.

    ``kv_ready_tokens``: the first that many prompt tokens already have their KV computed by
    another replica (prefill/decode disaggregation); 0, the default, changes nothing.
    """

    request_id: int
    arrival_s: float  # seconds since the trace start
    prompt_tokens: int
    output_tokens: int  # tokens generated per sequence (forced length; EOS is ignored)
    n: int = 1  # parallel samples (fork after prefill)
    beam_width: int = 1  # beam search width (1 = no beam search)
    prefix_ids: tuple[int, ...] = ()
    prefix_block_tokens: int = 0  # tokens named by one prefix id (0 when prefix_ids is empty)
    # leading prompt tokens whose KV arrives computed from elsewhere (a disaggregated prefill
    # replica, simulator/engine/disagg.py): admitted with blocks for them, not computed (V1 only)
    kv_ready_tokens: int = 0

    @property
    def num_seqs(self) -> int:
        """Sequences this request decodes at once (samples or beams)."""
        return max(self.n, self.beam_width)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a workload's requests are built.

    Every ``Request`` is a container the collector tracks, and building a million of them
    triggers full collections again and again, each rescanning every request built so far
    (0.67 of the 1.5 CPU seconds that building 10^6 synthetic requests took).
    The requests form no reference cycles, so reference counting frees whatever the build
    discards and nothing is left for the collector; it resumes afterwards (if it was running),
    as ``simulator.engine.core.simulate`` does around its event loop.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
