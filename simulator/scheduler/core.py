"""Continuous batching, one StepPlan per step, no notion of time: the machinery every vLLM-style
engine here shares (queues, growth events keyed by a decode counter, preemption, swapping, forks,
quiet runs), under the plainest policy it supports. The engines refine that policy in their own
modules: :mod:`simulator.scheduler.v0` (vLLM V0: whole-prompt admission with a watermark,
prefill-only steps), :mod:`simulator.scheduler.v1` and :mod:`simulator.scheduler.trtllm`.

Every step of the plain policy:

1. Sequences that reach the end of their KV allocation (a block boundary, a shared last block)
   grow first — *before* this step writes their next token. If the pool is exhausted, the most
   recently admitted running request is preempted (recompute or swap) until the growth fits.
2. Swapped-out requests come back first, oldest first, when their KV fits again.
3. Every decoding sequence decodes one token (the token budget always holds them:
   ``max_num_batched_tokens >= max_num_seqs``).
4. Partly prefilled prompts continue with the budget that is left, then waiting requests are
   admitted first come, first served while the budget, ``max_num_seqs`` and the allocator allow.
   The first request that does not fit stops admission (no overtaking); no admission happens in
   a step that had to preempt.

``complete(plan)`` applies the step: prefills advance, a finished prompt emits the first token
and forks its samples/beams, decodes advance, and finished requests free their KV in the same
step so the next step can admit into it.

Per-step work is proportional to what changed, not to the batch: decoding sequences are not
visited. A group's KV length is ``anchor_len + decode_counter - anchor_counter``; the step at
which it next needs the allocator (``tokens_until_append``, or the room ``grow`` answers at a
single sequence's boundary) or finishes is known in advance and kept in a dict keyed by decode
counter. The totals a latency model needs (Σ context, Σ context²,
max context) are kept incrementally.
"""

from __future__ import annotations

import heapq
import random
from collections import deque

from simulator.kv.allocator import AllocFailure, KVAllocator
from simulator.kv.prefix import block_hashes
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.scheduler.beams import reshuffle_beams
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.details import step_details
from simulator.scheduler.state import Group, Status, StepOutcome, reject
from workloads.request import Request

_GROW, _BEAM = 0, 1

_NOTHING = StepOutcome((), ())


class Scheduler:
    def __init__(self, allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                 keep_groups: bool = True):
        """``keep_groups``: remember every request's group in :attr:`groups` (by request id) for
        callers that look requests up; an engine that keeps its own list passes False, so a run
        of 10^6 requests does not hold a second index of them."""
        self.alloc = allocator
        self.config = config
        self.detail = detail
        self.keep_groups = keep_groups
        self.waiting: deque[Group] = deque()
        self.swapped: deque[Group] = deque()
        self.running: dict[int, Group] = {}  # admission order: the last is preempted first
        self.prefilling: dict[int, Group] = {}
        self.decoding: dict[int, Group] = {}
        self.groups: dict[int, Group] = {}
        self.decode_counter = 0
        self.step_id = 0
        # decode counter -> (kind, group, epoch, grow token): growth and beam events of that step
        self._events: dict[int, list[tuple[int, Group, int, int]]] = {}
        self._finishes: dict[int, list[tuple[Group, int]]] = {}
        self._finish_heap: list[int] = []  # the counters of ``_finishes`` (lazily deleted)
        self._max_heap: list[tuple[int, int, int, Group]] = []
        self._n_dec = 0  # decoding sequences
        self._multi_seq_decoding = 0  # decoding groups of several sequences (samples, beams)
        self._s1 = 0  # Σ KV length over decoding sequences
        self._s2 = 0  # Σ KV length²
        self._prefill_written = 0  # KV tokens written by groups still prefilling
        self._prefill_owner: dict[int, Group] = {}  # seq id of a prefilling prompt -> its group
        self._num_running_seqs = 0
        self._next_seq_id = 0
        self._next_admit = 0
        self._swap_used_tokens = 0
        self._rng = random.Random(config.seed)
        # per-step scratch
        self.newly_admitted: list[Group] = []  # groups admitted by the last schedule()
        self._preempted: list[int] = []
        self._copies: list[tuple[int, int, int, int]] = []  # (seq, src, dst, tokens) of this step
        self._copy_tokens = 0  # tokens copied by contiguous forks this step
        self._pending_copy_tokens = 0  # forks made in complete(): their copies run in the next step
        self._swap_out_tokens = 0
        self._swap_in_tokens = 0
        # totals
        self.num_preemptions = 0
        self.num_swaps = 0
        self.num_finished = 0
        self.num_rejected = 0
        # admissions the KV pool refused (full, or no hole fits): KV memory held concurrency back
        self.num_kv_refusals = 0
        self.prefix_hit_tokens = 0  # first admissions only (see _count_prefix_hits)
        self.prefix_query_tokens = 0
        self.readmission_hit_tokens = 0

    # ------------------------------------------------------------------ requests
    def add_request(self, request: Request, *, queue: bool = True) -> Group:
        """Queue a request, or reject it at once (``status == REJECTED``, with a reason) when it
        could never run: longer than max_model_len, or more KV than the whole pool. With
        ``queue=False`` an accepted request is not queued yet: :meth:`enqueue` does it later (the
        engine holds a request sent during a quiet run until the run's step that sees it)."""
        cfg = self.config
        final = request.prompt_tokens + request.output_tokens - 1
        hashes: tuple[int, ...] = ()
        if cfg.enable_prefix_caching and request.prefix_ids:
            hashes = block_hashes(
                request.prefix_ids, request.prefix_block_tokens, cfg.block_size, request.prompt_tokens
            )
        g = Group(request, final, hashes, num_prefill_target=request.prompt_tokens)
        if self.keep_groups:
            self.groups[request.request_id] = g
        total = request.prompt_tokens + request.output_tokens
        if total > cfg.max_model_len:
            return self._reject(g, f"max_model_len: prompt + output = {total} tokens > {cfg.max_model_len}")
        need = self.alloc.min_pool_tokens(request.prompt_tokens, final, request.num_seqs)
        if need > self.alloc.capacity_tokens:
            return self._reject(
                g, f"kv_capacity: needs {need} KV slots, the whole pool holds {self.alloc.capacity_tokens}"
            )
        if request.num_seqs > cfg.max_num_seqs:
            return self._reject(g, f"max_num_seqs: {request.num_seqs} sequences > {cfg.max_num_seqs}")
        if queue:
            self.waiting.append(g)
        return g

    def enqueue(self, g: Group) -> None:
        """Queue a request accepted by ``add_request(..., queue=False)``."""
        assert g.status is Status.WAITING and not g.num_admissions
        self.waiting.append(g)

    def _reject(self, g: Group, reason: str) -> Group:
        self.num_rejected += 1
        return reject(g, reason)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped)

    @property
    def num_running_seqs(self) -> int:
        return self._num_running_seqs

    def written_tokens(self) -> int:
        """Σ over resident sequences of KV tokens written (shared ones per sharer)."""
        return self._s1 + self._prefill_written

    def head(self) -> tuple[int, int, int] | None:
        """(tokens, final tokens, sequences) of the request that would be admitted next, for
        fragmentation: each of its sequences needs that many tokens."""
        q = self.swapped or self.waiting
        if not q:
            return None
        g = q[0]
        if g.status is Status.SWAPPED:
            return (g.swapped_len + 1, g.final_tokens, len(g.seq_ids))
        return (g.num_prefill_target, g.final_tokens, g.num_seqs)

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepPlan:
        """Decide the next step. Valid until the matching :meth:`complete`."""
        cfg = self.config
        d = self.decode_counter
        self._preempted, self._copies = [], []
        self.newly_admitted = []
        self._copy_tokens, self._pending_copy_tokens = self._pending_copy_tokens, 0
        self._swap_out_tokens = self._swap_in_tokens = 0

        for kind, g, epoch, token in self._events.pop(d, ()):
            if g.epoch != epoch or g.status is not Status.DECODING:
                continue  # preempted or finished since
            if kind == _BEAM:
                self._reshuffle_beams(g, d)
                self._grow(g, d)
            elif token == g.grow_token:
                self._grow(g, d)

        if self.swapped and not self._preempted:
            self._swap_in(d)

        budget = cfg.max_num_batched_tokens - self._n_dec
        chunks: list[PrefillChunk] = []
        if self.prefilling:
            for g in list(self.prefilling.values()):
                if budget <= 0:
                    break
                if g.status is not Status.PREFILLING:  # preempted by an earlier chunk's growth
                    continue
                n = min(g.num_prefill_target - g.num_computed, budget)
                if not cfg.enable_chunked_prefill and n < g.num_prefill_target - g.num_computed:
                    break
                if not self._grow_prefill(g, g.num_computed + n):
                    continue
                chunks.append(self._chunk(g, n))
                budget -= n
        if self.waiting and not self._preempted and not self.swapped:
            budget = self._admit(budget, chunks)  # swapped-out requests come back before new ones
        if chunks and self._preempted:
            # a later chunk's growth may have preempted a group that already had a chunk
            chunks = [c for c in chunks if c.seq_id in self._prefill_owner]
        return self._plan(d, chunks)

    def _chunk(self, g: Group, n: int) -> PrefillChunk:
        last = g.num_computed + n == g.num_prefill_target
        return PrefillChunk(g.seq_ids[0], n, g.num_computed, last)

    def _admit(self, budget: int, chunks: list[PrefillChunk]) -> int:
        cfg = self.config
        while self.waiting and budget > 0:
            g = self.waiting[0]
            k = g.num_seqs
            if self._num_running_seqs + k > cfg.max_num_seqs:
                break
            target = g.num_prefill_target
            cached = self._cached_prefix(g, target) if g.block_hashes else 0
            n = target - cached
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    break
                n = budget
            seq = self._allocate_group(g, cached + n, cached)
            if seq is None:
                break
            self._admitted(g, seq, target, cached, n, chunks)
            budget -= n
        return budget

    def _admitted(self, g: Group, seq: int, target: int, cached: int, n: int,
                  chunks: list[PrefillChunk]) -> None:
        """The head of the waiting queue, ``g``, admitted with KV in ``seq``: running, with its
        first chunk of ``n`` tokens in ``chunks``."""
        self.waiting.popleft()
        self._start_prefill(g, seq, target, cached)
        self.newly_admitted.append(g)
        self._num_running_seqs += g.num_seqs
        self._prefill_written += cached
        chunks.append(self._chunk(g, n))

    def _allocate_group(self, g: Group, num_tokens: int, cached: int) -> int | None:
        """KV for an admission of ``g``: ``num_tokens`` of its first sequence (``cached`` of them
        found in the prefix cache), and, where forks cannot share memory, a region per further
        sample. Returns the first sequence's id (``g.seq_ids`` set), or None (a KV refusal)."""
        alloc = self.alloc
        seq = self._new_seq_id()
        got = alloc.allocate(seq, num_tokens, g.final_tokens, g.block_hashes)
        if got is None:
            self.num_kv_refusals += 1
            if alloc.last_failure is AllocFailure.EXTERNAL_FRAGMENTATION:
                g.blocked_by_external_fragmentation = True
            return None
        assert got.num_cached_tokens == cached, (got.num_cached_tokens, cached)
        g.seq_ids = [seq]
        k = g.num_seqs
        if k > 1 and not alloc.forks_share_memory:
            # without sharing, every sample needs its own region from the start
            for _ in range(k - 1):
                child = self._new_seq_id()
                if alloc.fork(seq, child, 0) is None:
                    break
                g.seq_ids.append(child)
            if len(g.seq_ids) < k:
                for s in g.seq_ids:
                    alloc.free(s)
                g.seq_ids = []
                return None
        return seq

    def _start_prefill(self, g: Group, seq: int, target: int, cached: int) -> None:
        """An admission's bookkeeping once its allocation succeeded: ``seq`` holds the first
        ``cached`` of the ``target`` tokens to prefill, found in the prefix cache."""
        g.status = Status.PREFILLING
        g.num_computed = cached
        g.admit_order = self._next_admit
        self._next_admit += 1
        self._count_prefix_hits(g, target, cached)
        self.running[g.request_id] = g
        self.prefilling[g.request_id] = g
        self._prefill_owner[seq] = g

    def _cached_prefix(self, g: Group, target: int) -> int:
        """``alloc.lookup`` for the head of the queue, remembered until the prefix cache changes
        (``cache_generation``): a head blocked for many steps costs O(1) per step, not a walk
        over its block hashes."""
        key = (self.alloc.cache_generation, target)
        if g.lookup_key != key:
            g.lookup_key = key
            g.lookup_tokens = self.alloc.lookup(g.block_hashes, target)
        return g.lookup_tokens

    def _count_prefix_hits(self, g: Group, target: int, cached: int) -> None:
        """Prefix-cache accounting of one admission. The hit rate is a property of the workload
        (how much prompt it shares), so only the first admission counts toward it; a re-admitted
        request mostly finds its own blocks, freed at preemption and not yet evicted, and those
        hits are kept apart in ``readmission_hit_tokens``."""
        g.num_admissions += 1
        if g.num_admissions > 1:
            g.readmission_hit_tokens += cached
            self.readmission_hit_tokens += cached
            return
        assert target == g.request.prompt_tokens, "a first admission prefills the prompt"
        query = target if g.block_hashes else 0
        g.prefix_hit_tokens, g.prefix_query_tokens = cached, query
        self.prefix_hit_tokens += cached
        self.prefix_query_tokens += query

    def _swap_in(self, d: int) -> None:
        cfg, alloc = self.config, self.alloc
        while self.swapped:
            g = self.swapped[0]
            k = len(g.seq_ids)
            if self._num_running_seqs + k > cfg.max_num_seqs:
                return
            length = g.swapped_len
            if not self._swap_in_fits(g, length):
                return
            seqs: list[int] = []
            for _ in range(k):  # grow-before-write: room for this step's token too
                s = self._new_seq_id()
                if alloc.allocate(s, length + 1, g.final_tokens) is None:
                    break
                seqs.append(s)
            if len(seqs) < k:
                for s in seqs:
                    alloc.free(s)
                if not self.running:  # it cannot fit even alone (sharing is lost on swap): restart
                    self.swapped.popleft()
                    self._swap_used_tokens -= self._swap_tokens(length, k)
                    g.status = Status.WAITING
                    g.num_prefill_target = g.request.prompt_tokens
                    g.seq_ids = []
                    self.waiting.appendleft(g)
                    continue
                return
            self.swapped.popleft()
            self._swap_used_tokens -= self._swap_tokens(length, k)
            self._swap_in_tokens += self._swap_tokens(length, k)
            g.seq_ids = seqs
            self.running[g.request_id] = g
            self._num_running_seqs += k
            self._start_decode(g, length, d)

    def _swap_in_fits(self, g: Group, length: int) -> bool:
        """An engine's own condition for swapping ``g`` in now (its KV ``length`` tokens), beside
        ``max_num_seqs`` and the allocation: none here."""
        return True

    # ------------------------------------------------------------------ growth and preemption
    def _grow(self, g: Group, d: int) -> None:
        """Grow-before-write for every sequence of a decoding group that needs it at step ``d``."""
        alloc = self.alloc
        length = g.anchor_len + d - g.anchor_counter
        if len(g.seq_ids) == 1:  # the common case, without the loop
            s = g.seq_ids[0]
            # an event fires only where growth is due. A lone sequence never copies: only forks
            # share a partially filled block (prefix-cache hits and registered hashes are full
            # blocks), so grow() answers the room to the next boundary in the same call
            while (room := alloc.grow(s, length + 1)) is None:
                if not self._preempt_newest(g):
                    return
            g.grow_token += 1
            due = d + room
            if due < g.anchor_counter + g.final_tokens - g.anchor_len:
                self._events.setdefault(due, []).append((_GROW, g, g.epoch, g.grow_token))
            return
        for s in g.seq_ids:
            if alloc.tokens_until_append(s, length) > 0:
                continue
            while (r := alloc.append(s, length + 1)) is None:
                if not self._preempt_newest(g):
                    return  # g itself was preempted
            self._copies.extend((s, src, dst, r.num_copied_tokens) for src, dst in r.copies)
        self._schedule_grow(g, d, length)

    def _grow_prefill(self, g: Group, num_tokens: int) -> bool:
        """Room for the next prompt chunk; False if ``g`` had to be preempted itself."""
        s = g.seq_ids[0]
        while self.alloc.append(s, num_tokens) is None:
            if not self._preempt_newest(g):
                return False
        return True

    def _preempt_newest(self, needy: Group) -> bool:
        """Preempt the most recently admitted running group; False if that is ``needy`` itself."""
        victim = next(reversed(self.running.values()))
        self._preempt(victim)
        return victim is not needy

    def _preempt(self, g: Group) -> None:
        cfg, alloc = self.config, self.alloc
        d = self.decode_counter
        del self.running[g.request_id]
        k = g.num_seqs
        self._num_running_seqs -= k
        g.epoch += 1
        g.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted.append(g.request_id)
        if g.status is Status.PREFILLING:
            del self.prefilling[g.request_id]
            del self._prefill_owner[g.seq_ids[0]]
            self._prefill_written -= g.num_computed
            length = -1
        else:
            length = g.kv_len(d)
            self._leave_decode(g, length)
        for s in g.seq_ids:
            alloc.free(s)
        # vLLM's rule: a multi-sequence group is swapped (its samples cannot be recomputed cheaply)
        want_swap = length >= 0 and (cfg.preemption_mode == "swap" or k > 1)
        need = self._swap_tokens(length, k) if length >= 0 else 0
        # swapped-in sequences come back as private copies (sharing is not restored), so swap
        # only a group that can then finish alone in the pool; otherwise it restarts
        fits = alloc.min_pool_tokens(0, g.final_tokens, k) <= alloc.capacity_tokens
        if want_swap and fits and need <= cfg.swap_space_tokens - self._swap_used_tokens:
            g.status = Status.SWAPPED
            g.swapped_len = length
            g.num_swaps += 1
            self.num_swaps += 1
            self._swap_used_tokens += need
            self._swap_out_tokens += need
            self.swapped.append(g)
            return
        g.status = Status.WAITING
        if length >= 0 and k == 1:
            g.num_prefill_target = length + 1  # prompt + every generated token: recompute them
        elif length >= 0:
            g.num_prefill_target = g.request.prompt_tokens  # samples restart from the prompt
        g.num_computed = 0
        g.seq_ids = []
        self.waiting.appendleft(g)

    def _swap_tokens(self, length: int, k: int) -> int:
        bs = self.config.block_size
        return k * -(-length // bs) * bs

    # ------------------------------------------------------------------ decode bookkeeping
    def _start_decode(self, g: Group, length: int, d: int) -> None:
        k = len(g.seq_ids)
        g.status = Status.DECODING
        g.anchor_len, g.anchor_counter = length, d
        self.decoding[g.request_id] = g
        self._n_dec += k
        if k > 1:
            self._multi_seq_decoding += 1
        self._s1 += k * length
        self._s2 += k * length * length
        heapq.heappush(self._max_heap, (d - length, g.request_id, g.epoch, g))
        end = d + g.final_tokens - length  # counter after the step that writes the last token
        pending = self._finishes.get(end)
        if pending is None:
            self._finishes[end] = [(g, g.epoch)]
            heapq.heappush(self._finish_heap, end)
        else:
            pending.append((g, g.epoch))
        if g.request.beam_width > 1 and d + self.config.block_size < end:
            self._events.setdefault(d + self.config.block_size, []).append((_BEAM, g, g.epoch, 0))
        self._schedule_grow(g, d, length)

    def _leave_decode(self, g: Group, length: int) -> None:
        k = len(g.seq_ids)
        del self.decoding[g.request_id]
        self._n_dec -= k
        if k > 1:
            self._multi_seq_decoding -= 1
        self._s1 -= k * length
        self._s2 -= k * length * length

    def _schedule_grow(self, g: Group, d: int, length: int) -> None:
        """One pending growth event per group: a newer one (after a beam fork) voids the older."""
        seqs, until = g.seq_ids, self.alloc.tokens_until_append
        room = until(seqs[0], length) if len(seqs) == 1 else min(until(s, length) for s in seqs)
        due = d + room
        g.grow_token += 1
        if due < g.anchor_counter + g.final_tokens - g.anchor_len:  # only if it still writes then
            self._events.setdefault(due, []).append((_GROW, g, g.epoch, g.grow_token))

    def _reshuffle_beams(self, g: Group, d: int) -> None:
        self._copy_tokens += reshuffle_beams(g, g.kv_len(d), self.alloc, self._rng,
                                             self.config.beam_replace_prob, self._new_seq_id)
        end = g.anchor_counter + g.final_tokens - g.anchor_len
        if d + self.config.block_size < end:
            self._events.setdefault(d + self.config.block_size, []).append((_BEAM, g, g.epoch, 0))

    def _max_context(self, d: int) -> int:
        heap = self._max_heap
        while heap:
            key, _, epoch, g = heap[0]
            if g.epoch == epoch and g.status is Status.DECODING:
                return d - key
            heapq.heappop(heap)
        return 0

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id - 1

    # ------------------------------------------------------------------ plan
    def _plan(self, d: int, chunks: list[PrefillChunk]) -> StepPlan:
        n, s1, s2 = self._n_dec, self._s1, self._s2
        bs = self.config.block_size
        swap_in = self._swap_in_tokens // bs + self.alloc.take_loaded_blocks()  # + kv_offload loads
        copies = self._copies
        if copies and self._preempted:  # a copy for a sequence preempted later this step is void
            copies = [c for c in copies if c[0] in self.alloc]
        details = step_details(self.alloc, chunks, self.decoding.values(), d) if self.detail else None
        if not copies:  # the common step: positional fields, no generator work (hot path)
            return StepPlan(
                self.step_id, tuple(chunks), n, s1 + n, float(s2 + 2 * s1 + n),
                self._max_context(d) + 1 if n else 0, self._swap_out_tokens // bs,
                swap_in, (), self._copy_tokens, tuple(self._preempted), details,
            )
        return StepPlan(
            step_id=self.step_id,
            prefills=tuple(chunks),
            num_decode_seqs=n,
            decode_context_tokens=s1 + n,
            decode_context_sq=float(s2 + 2 * s1 + n),
            decode_max_context=self._max_context(d) + 1 if n else 0,
            num_swap_out_blocks=self._swap_out_tokens // bs,
            num_swap_in_blocks=swap_in,
            cow_copies=tuple((src, dst) for _, src, dst, _ in copies),
            num_copy_tokens=self._copy_tokens + sum(t for *_, t in copies),
            preempted=tuple(self._preempted),
            details=details,
        )

    # ------------------------------------------------------------------ quiet runs
    def is_quiet(self, plan: StepPlan) -> bool:
        """Whether ``plan`` (just scheduled) may start a quiet run: decodes only, nothing admitted,
        preempted, swapped or copied, and no per-sequence detail to build."""
        return not (plan.prefills or plan.preempted or plan.cow_copies or plan.num_copy_tokens
                    or plan.num_swap_in_blocks or plan.num_swap_out_blocks or self.detail
                    or not plan.num_decode_seqs)

    def steps_to_next_finish(self) -> int:
        """Steps from the one just scheduled to the first that finishes a group, inclusive (a
        huge number when no group is decoding)."""
        d = self.decode_counter
        heap, finishes = self._finish_heap, self._finishes
        while heap and (heap[0] <= d or heap[0] not in finishes):
            heapq.heappop(heap)
        return heap[0] - d if heap else 1 << 62

    def quiet_run(self, plan: StepPlan, limit: int) -> int:
        """How many steps, ``plan`` first, are sure to be the same decode step (up to ``limit``).

        ``plan`` must be :meth:`is_quiet`. Its batch then stays the same — every decoding sequence
        writes one token per step, nothing joins — until one of these, which ends the run:

        * a finish: the step that writes a group's last token is the run's last step;
        * a growth that could fail or copy: a multi-sequence group's growth or beam event, or a
          block boundary once the growths before it have used every block free now
          (``free_blocks_for_growth``); boundaries the free blocks cover cannot fail, so they
          are no event: :meth:`advance_quiet` performs them at their step, in order.

        Nothing else can change the batch without an outside event (a request sent here, which
        the engine cuts the run for): the waiting (or swapped) head could not be admitted in
        ``plan``'s step, and in a quiet run no block is freed, the running set and the token
        budget stay the same and prefix-cache hits only shrink, so it cannot be admitted in the
        run's later steps either.
        """
        d = self.decode_counter
        limit = min(limit, self.steps_to_next_finish())
        events = self._events
        if not events or limit <= 1:
            return max(limit, 1)
        bs = self.config.block_size
        free = self._quiet_free()
        if free < 0:
            return 1
        if len(self.decoding) * (1 + (limit - 1) // bs) <= free and not self._multi_seq_decoding:
            return limit  # room for every group to grow at every boundary it can reach
        # counter -> the end counters of the groups whose growth the run itself schedules there
        later: dict[int, list[int]] = {}
        for j in range(1, limit):
            c = d + j
            ends = later.pop(c, [])
            for kind, g, epoch, token in events.get(c, ()):
                if g.epoch != epoch or g.status is not Status.DECODING:
                    continue
                if kind == _BEAM or len(g.seq_ids) > 1:
                    return j
                if token == g.grow_token:
                    ends.append(g.anchor_counter + g.final_tokens - g.anchor_len)
            need = len(ends)
            for end in ends:  # a fresh block's room: the group's next growth is one block later
                if c + bs < end:
                    later.setdefault(c + bs, []).append(end)
            if need:
                if need > free:
                    return j
                free -= need
        return limit

    def _quiet_free(self) -> int:
        """Blocks the growths of a quiet run may take before one could fail (negative: the next
        step may preempt even without a growth)."""
        return self.alloc.free_blocks_for_growth()

    def advance_quiet(self, plan: StepPlan, k: int, record=None) -> StepOutcome:  # type: ignore[no-untyped-def]
        """Complete ``plan`` and the ``k - 1`` identical steps after it, as ``k`` alternations of
        :meth:`schedule` and :meth:`complete` would, without building their plans.

        ``k`` must not exceed :meth:`quiet_run`. ``record(j, written_tokens)``, if given, is called
        after step ``j`` (0-based) with the KV tokens written then, the allocator in its state
        after that step, for the first step, each step whose growth changed the allocator, and
        the last step (after its finishes). Between two calls only the written tokens change:
        ``num_decode_seqs`` more per step. Returns the last step's outcome.
        """
        assert plan.step_id == self.step_id, "advance_quiet() must follow its own schedule()"
        events = self._events
        d0 = self.decode_counter
        n, s1 = self._n_dec, self._s1
        written = s1 + self._prefill_written  # before step 0; each step writes n more
        if record is not None and k > 1:
            record(0, written + n)
        alloc = self.alloc
        grow, pop = alloc.grow, events.pop
        decoding = Status.DECODING
        last = d0 + k - 1
        for d in range(d0 + 1, last + 1):  # step d - d0's schedule(): the growths due at counter d
            pending = pop(d, None)
            if pending is None:
                continue
            grew = False
            for kind, g, epoch, token in pending:
                if g.epoch != epoch or g.status is not decoding or token != g.grow_token:
                    continue
                grew = True
                seqs = g.seq_ids
                if len(seqs) > 1:
                    self._grow(g, d)
                    continue
                # _grow's single-sequence path, inlined (a quiet run's growth cannot fail)
                s = seqs[0]
                base = g.anchor_counter - g.anchor_len  # the counter at which the KV length is 0
                room = grow(s, d - base + 1)
                if room is None:
                    raise AssertionError("a quiet run's growth failed")
                token = g.grow_token = token + 1
                due = d + room
                if due < base + g.final_tokens:
                    later = events.get(due)
                    if later is None:
                        events[due] = [(_GROW, g, epoch, token)]
                    else:
                        later.append((_GROW, g, epoch, token))
            assert not self._preempted and not self._copies, "a quiet run's growth failed"
            if grew and record is not None and d < last:
                record(d - d0, written + n * (d - d0 + 1))
        m = k - 1  # steps 0 .. k-2 completed in closed form, step k-1 by complete()
        self.step_id += m
        self._s2 += m * (2 * s1 + n) + n * m * (m - 1)
        self._s1 += m * n
        self.decode_counter += m
        outcome = self.complete(plan._replace(step_id=self.step_id))
        if record is not None:
            record(k - 1, self._s1 + self._prefill_written)
        return outcome

    # ------------------------------------------------------------------ complete
    def complete(self, plan: StepPlan) -> StepOutcome:
        """Apply a step the executor has run: advance prefills and decodes, emit, fork, free."""
        assert plan.step_id == self.step_id, "complete() must follow its own schedule()"
        self.step_id += 1
        n = self._n_dec
        self._s2 += 2 * self._s1 + n
        self._s1 += n
        self.decode_counter += 1
        d = self.decode_counter
        first: list[Group] = []
        finished: list[Group] = []
        if plan.prefills:
            self._complete_prefills(plan, d, first, finished)
        for g, epoch in self._finishes.pop(d, ()):
            if g.epoch == epoch and g.status is Status.DECODING:
                self._leave_decode(g, g.final_tokens)
                self._finish(g)
                finished.append(g)
        if not first and not finished:
            return _NOTHING
        return StepOutcome(tuple(first), tuple(finished))

    def _complete_prefills(self, plan: StepPlan, d: int, first: list[Group], finished: list[Group]) -> None:
        """The prefill chunks of a completed step: a finished prompt emits its first token and
        starts decoding at decode counter ``d`` (or finishes: an output of one token)."""
        for c in plan.prefills:
            g = self._prefill_owner[c.seq_id]
            g.num_computed += c.num_tokens
            self._prefill_written += c.num_tokens
            if g.num_computed < g.num_prefill_target:
                continue
            del self.prefilling[g.request_id]
            del self._prefill_owner[c.seq_id]
            self._prefill_written -= g.num_computed
            length = g.num_prefill_target
            if not g.first_token_emitted:
                g.first_token_emitted = True
                first.append(g)
            if g.generated(length) >= g.request.output_tokens:
                self._finish(g)
                finished.append(g)
                continue
            self._fork_samples(g, length)
            self._start_decode(g, length, d)

    def _fork_samples(self, g: Group, length: int) -> None:
        k = g.num_seqs
        if k == 1:
            return
        alloc = self.alloc
        parent = g.seq_ids[0]
        if alloc.forks_share_memory:
            for _ in range(k - 1):
                child = self._new_seq_id()
                alloc.fork(parent, child, length)
                g.seq_ids.append(child)
        else:  # regions were reserved at admission: copy the prompt's KV into them
            for child in g.seq_ids[1:]:
                alloc.append(child, length)
                self._pending_copy_tokens += length

    def _finish(self, g: Group) -> None:
        for s in g.seq_ids:
            self.alloc.free(s)
        del self.running[g.request_id]
        self._num_running_seqs -= g.num_seqs
        g.status = Status.FINISHED
        self.num_finished += 1
