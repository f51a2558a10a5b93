"""vLLM V1's scheduling policy (``engine: vllm-v1``): one token budget, running requests first.

Read from vLLM's source (vllm-project/vllm main, the newest versions at hand:
``vllm/v1/core/sched/scheduler.py`` with ``PauseState``; ``vllm/v1/core/kv_cache_manager.py`` with
``full_sequence_must_fit`` and ``watermark``, which the newer scheduler's waiting loop passes as
``scheduler_reserve_full_isl``). ``Scheduler.schedule`` has no prefill or decode phase: every
request's computed tokens catch up with its tokens, within one budget per step::

    budget = max_num_batched_tokens
    running, in running order (admission order)     waiting, FCFS, only if nobody was preempted
    ┌──────┬──────┬──────┬─────────────┐            ┌──────────────┬─────────┐
    │ dec 1│ dec 1│ dec 1│ chunk ≤ thr │  ...then   │ chunk ≤ left │  ...    │  until budget,
    └──────┴──────┴──────┴─────────────┘            └──────────────┴─────────┘  max_num_seqs or
      each: allocate_slots (grow before write);       allocate_slots(full_sequence_must_fit)  KV
      None -> preempt the newest running request      None -> stop admitting                  end

The rules, each with the function it comes from:

* Running requests first, in running-list order; each takes min(tokens it still needs,
  ``long_prefill_token_threshold`` if > 0, budget left) and its KV blocks are allocated at once
  (``Scheduler.schedule``, ``KVCacheManager.allocate_slots``). When that allocation fails, the
  last request of the running list is preempted (FCFS: ``self.running.pop()``) until it fits, or
  until the victim is the request itself, which ends the pass. A decode always gets its token:
  every running request but the newest got its whole share in the previous step, and its share
  only shrinks (a decode needs 1, a chunk at most what it had), so the budget the requests ahead
  of it leave never runs out before it. The budget a chunk finds is therefore the budget less
  every decode and the chunks ahead of it, which is what :meth:`_schedule_running` charges.
* Waiting requests next, first come first served, only if nothing was preempted in this step
  (``if not preempted_reqs``), while fewer than ``max_num_seqs`` run and budget is left; the first
  that does not fit stops admission. A waiting request computes its tokens (the prompt, or prompt
  plus generated tokens after a preemption) less its prefix-cache hit, capped so that the last
  token is always computed (``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length =
  request.num_tokens - 1``; :meth:`PagedAllocator.lookup` applies it).
* ``scheduler_reserve_full_isl`` (default True): admission passes ``full_sequence_must_fit``, so
  the whole sequence (``request.num_tokens``) must fit the free blocks after its cache hits, not
  just the first chunk (``KVCacheManager.allocate_slots``); off, the first chunk must fit, as
  in the versions before the knob.
* ``watermark`` (default 0.0: off, vllm/config/scheduler.py; vLLM PR #44594):
  ``int(watermark × num_blocks)`` blocks must stay free after a waiting or preempted request's
  allocation when some request is already scheduled (``KVCacheManager.allocate_slots``,
  ``has_scheduled_reqs``), in the full-ISL check and in the allocation itself. Block pools
  only (a contiguous region has no blocks to keep free). A hybrid model's pool
  (:class:`~simulator.kv.hybrid.HybridPagedAllocator`) is one ``BlockPool`` for every group:
  ``num_blocks`` counts its block ids, and a request needs the sum over groups of its blocks
  past the hit, skipped blocks excluded (vllm/v1/core/kv_cache_coordinator.py,
  ``KVCacheCoordinator.get_num_blocks_to_allocate``).
* A request whose prompt KV was computed elsewhere (``Request.kv_ready_tokens``: the decode
  side of prefill/decode disaggregation, simulator/engine/disagg.py) is admitted, at its first
  admission only, as vLLM's NixlConnector has it: ``get_num_new_matched_tokens``
  (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, NixlConnectorScheduler)
  reports every prompt token not found locally as external, the waiting loop of
  ``Scheduler.schedule`` allocates blocks for the local and external tokens together
  (``allocate_slots(..., num_external_computed_tokens=...)``), so the full-ISL and watermark
  checks count them, and once the KV has arrived ``_update_waiting_for_remote_kv`` sets the
  computed tokens to ``request.num_tokens - 1`` when the whole prompt arrived: the last prompt
  token is recomputed, which yields the decode side's first token. ``update_state_after_alloc``
  clears ``do_remote_prefill`` (one transfer per request): a preempted request recomputes
  like any other. The pull itself (WAITING_FOR_REMOTE_KVS, blocks held during it) is the
  caller's: the request arrives here when its transfer is done. Only local hits count as
  prefix-cache hits.
* ``max_num_partial_prefills``: V1's scheduler never reads it; ``SchedulerConfig.__post_init__``
  turns a value above 1 into a default ``long_prefill_token_threshold`` of 4% of
  ``max_model_len`` when none is set, and that is all it does in V1.
* Preemption by recompute only (``Scheduler._preempt_request``: free the blocks, computed tokens
  back to 0, the request to the head of the waiting queue). V1 names every full block of a
  request, generated tokens too (on a hybrid pool, in every group that still holds the block:
  ``BlockPool.cache_full_blocks`` per ``kv_cache_group_id``), and freed blocks stay cached until
  evicted, so a re-admitted request finds its own blocks (``BlockPool.cache_full_blocks``; ``KVCacheManager.free`` frees
  the tail first, so the tail is evicted first). Modelled at preemption only: the victim's full
  blocks are named then (:func:`own_block_hashes`), registered in the cache and freed; its
  re-admission looks them up. Ordinary finishes build no per-block ids.
* Parallel sampling: the frontend fans a request of ``n`` samples out into ``n`` requests
  (vllm/v1/engine/parallel_sampling.py, ``ParentRequest``); the engine schedules, admits and
  preempts each on its own, and with prefix caching the later ones find the prompt's full blocks
  that the first one registered at its admission (the last prompt token is computed by each).
  Here each sample is a group of its own; the request's group reports the first token of its
  first sample and finishes with its last (``ParentRequest.get_outputs``).
* Beam search is no part of V1's engine (``LLM.beam_search`` in vllm/entrypoints/llm.py runs it
  outside, one 1-token request per beam and step): such a request is rejected.
* ``policy: priority`` needs per-request priorities that traces do not carry: FCFS only.

Everything else — the decode counter, growth events keyed by it, the finish heap, the Σ context
totals, quiet runs — is :class:`~simulator.scheduler.core.Scheduler`'s. Its quiet-run argument
(the waiting head, not admitted in a decode-only step, cannot be admitted later in the run: the
running set, the budget left and ``max_num_seqs`` stay the same while free blocks and cache hits
only shrink) holds for these rules but one: a chunk cut by the budget or the threshold needs
fewer blocks once an eviction takes a free block of its cache hit. :meth:`quiet_run` ends the
run before the first growth that could evict, when the head is in that case.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import attrgetter

from simulator.kv.allocator import AllocFailure, KVAllocator
from simulator.kv.hybrid import HybridPagedAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.core import Scheduler
from simulator.scheduler.state import Group, Status, StepOutcome
from workloads.request import Request

# Tags a request's own block ids: 4-tuples, never of the shape of simulator/kv/prefix.py's
# 3-tuples, so a request id can never make an own block look like a shared prefix block.
_OWN = 0x6F776E

_by_admission = attrgetter("admit_order")

# The pools of block ids: the watermark, a preempted request's own blocks and the quiet-run early
# end read their ``num_free_blocks``, ``free_blocks_before_eviction``, ``blocks_needed``,
# ``can_allocate(..., reserve_blocks=)``, ``cache_blocks`` and ``has_unreferenced_hit``.
BlockPool = PagedAllocator | HybridPagedAllocator
_BLOCK_POOLS = (PagedAllocator, HybridPagedAllocator)


def own_block_hashes(hashes: tuple[int, ...], uid: int, num_blocks: int) -> tuple[int, ...]:
    """``hashes`` extended to the ids of ``num_blocks`` blocks: each further block's id chains
    from the one before (as prefix.py chains shared ones) and is named by ``uid``, because its
    content (the rest of a prompt, generated tokens) is that request's alone."""
    if num_blocks <= len(hashes):
        return hashes
    out = list(hashes)
    h = out[-1] if out else 0
    for j in range(len(hashes), num_blocks):
        h = hash((h, uid, j, _OWN))
        out.append(h)
    return tuple(out)


@dataclass(slots=True, eq=False)
class _Samples:
    """The samples of one parallel-sampling request, while any of them is unfinished."""

    parent: Group  # the group the caller holds: its times and counts are the request's
    samples: list[Group]
    left: int  # samples not finished


class V1Scheduler(Scheduler):
    """vLLM V1's policy behind :class:`Scheduler`'s interface (see the module docstring)."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                 keep_groups: bool = True):
        if config.preemption_mode == "swap":
            raise ValueError("preemption_mode swap: vLLM V1 preempts by recompute only")
        super().__init__(allocator, config, detail=detail, keep_groups=keep_groups)
        threshold = config.long_prefill_token_threshold
        if not threshold and config.max_num_partial_prefills > 1:
            # vllm/config/scheduler.py (SchedulerConfig.__post_init__)
            threshold = int(config.max_model_len * 0.04)
        self.long_prefill_token_threshold = threshold
        pool: BlockPool | None = allocator if isinstance(allocator, _BLOCK_POOLS) else None
        # the prefix cache that keeps a preempted request's own blocks (a block pool, caching on)
        self._cache: BlockPool | None = None
        if config.enable_prefix_caching and pool is not None and pool.enable_prefix_caching:
            self._cache = pool
        # the admission watermark in blocks (KVCacheManager: int(watermark * num_blocks)); a
        # block pool's, in the ids every group shares: contiguous regions have no blocks to keep free
        self._cache_pool = pool
        self._watermark_blocks = int(config.watermark * allocator.num_blocks) if pool is not None else 0
        # blocks one decoding sequence's block boundary takes (one per token group on a hybrid pool)
        self._growth_blocks = allocator.blocks_per_growth if isinstance(allocator, HybridPagedAllocator) else 1
        self._done: list[Group] = []  # finished in the step being completed, KV not yet freed
        self._families: dict[int, _Samples] = {}  # parallel-sampling request id -> its samples
        self._family_of: dict[int, _Samples] = {}  # a sample's (negative) request id -> family
        self._next_sample_id = -1

    # ------------------------------------------------------------------ requests
    def add_request(self, request: Request, *, queue: bool = True) -> Group:
        """As :meth:`Scheduler.add_request`; a request with beams is rejected, one with ``n``
        samples becomes ``n`` requests of one sample (accepted if one sample could run), queued
        one after the other as vLLM's frontend adds them."""
        if request.beam_width > 1:
            g = Group(request, request.prompt_tokens + request.output_tokens - 1)
            if self.keep_groups:
                self.groups[request.request_id] = g
            return self._reject(g, f"beam_search: vLLM V1's engine has no beam search "
                                   f"(beam_width {request.beam_width})")
        if request.n == 1:
            return super().add_request(request, queue=queue)
        sample = dataclasses.replace(request, n=1)
        g = super().add_request(sample, queue=False)
        g.request = request
        if g.status is Status.REJECTED:
            return g
        hashes = g.block_hashes
        if self._cache is not None:  # the samples share the prompt's full blocks by their ids
            hashes = own_block_hashes(hashes, request.request_id,
                                      request.prompt_tokens // self.config.block_size)
        samples = []
        for _ in range(request.n):
            samples.append(Group(dataclasses.replace(sample, request_id=self._next_sample_id),
                                 g.final_tokens, hashes, num_prefill_target=request.prompt_tokens))
            self._next_sample_id -= 1
        family = _Samples(g, samples, request.n)
        self._families[request.request_id] = family
        for s in samples:
            self._family_of[s.request_id] = family
        if queue:
            self.waiting.extend(samples)
        return g

    def enqueue(self, g: Group) -> None:
        family = self._families.get(g.request_id)
        if family is None:
            super().enqueue(g)
            return
        assert family.parent is g and g.status is Status.WAITING and not g.num_admissions
        self.waiting.extend(family.samples)

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepPlan:
        """Decide the next step (``Scheduler.schedule`` in vLLM V1). Valid until the matching
        :meth:`complete`."""
        d = self.decode_counter
        self._preempted = []
        self.newly_admitted = []
        chunks, budget = self._schedule_running(d)
        if self.waiting and not self._preempted:
            self._admit(budget, chunks)
        return self._plan(d, chunks)

    def _schedule_running(self, d: int) -> tuple[list[PrefillChunk], int]:
        """The running requests' part of step ``d``: every decode's growth that is due and every
        prefilling request's next chunk, in running order. Returns the chunks and the budget left.

        A step's growths that all fit the free blocks cannot fail, and their order only decides
        which block ids they take: they run in the order they were filed, as
        :meth:`advance_quiet` runs them. Otherwise the order decides who is preempted and which
        cached blocks are evicted, and they run in running (admission) order, as vLLM's do.
        """
        pending = self._events.pop(d, None)
        decoding = Status.DECODING
        prefilling = self.prefilling
        if not prefilling:
            if pending is not None:
                free = self.alloc.free_blocks_for_growth()
                if len(pending) <= free:  # the common case: no list built, no sort
                    for _, g, epoch, token in pending:
                        if g.epoch == epoch and g.status is decoding and token == g.grow_token:
                            self._grow(g, d)
                else:
                    grows = [g for _, g, epoch, token in pending
                             if g.epoch == epoch and g.status is decoding and token == g.grow_token]
                    if len(grows) > free:
                        grows.sort(key=_by_admission)
                    for g in grows:
                        if g.status is decoding:  # not preempted by an earlier growth
                            self._grow(g, d)
            return [], self.config.max_num_batched_tokens - self._n_dec
        grows = [] if pending is None else [
            g for _, g, epoch, token in pending
            if g.epoch == epoch and g.status is decoding and token == g.grow_token]
        visits = grows + list(prefilling.values())
        visits.sort(key=_by_admission)
        chunks: list[PrefillChunk] = []
        used = 0
        threshold = self.long_prefill_token_threshold
        max_tokens = self.config.max_num_batched_tokens
        for g in visits:
            status = g.status
            if status is Status.DECODING:
                self._grow(g, d)
            elif status is Status.PREFILLING:
                n = g.num_prefill_target - g.num_computed
                if 0 < threshold < n:
                    n = threshold
                budget = max_tokens - self._n_dec - used
                if n > budget:
                    n = budget
                assert n > 0, "a running request's share ran out (see the module docstring)"
                if not self._grow_prefill(g, g.num_computed + n):
                    break  # it was the newest: every request after it is preempted already
                chunks.append(self._chunk(g, n))
                used += n
        return chunks, max_tokens - self._n_dec - used

    def _admit(self, budget: int, chunks: list[PrefillChunk]) -> int:
        """Admit waiting requests, first come first served (the waiting loop of vLLM V1's
        ``Scheduler.schedule``); returns the budget left."""
        cfg, alloc = self.config, self.alloc
        threshold = self.long_prefill_token_threshold
        waiting = self.waiting
        # a draft model's request takes a draft slot of the budget beside its tokens (vLLM's
        # waiting loop: ``input_budget <= draft_slots`` stops it, a request gets at most
        # ``input_budget - draft_slots`` and is charged ``num_new_tokens + draft_slots``)
        slots = cfg.num_draft_slots
        budget -= slots
        while waiting and budget > 0:
            if self._num_running_seqs >= cfg.max_num_seqs:
                break
            g = waiting[0]
            target = g.num_prefill_target  # request.num_tokens: prompt (+ generated on recompute)
            local = cached = self._cached_prefix(g, target) if g.block_hashes else 0
            ready = g.request.kv_ready_tokens
            if ready and not g.num_admissions:  # remote KV: computed, but the last token is not
                cached = max(local, min(ready, target - 1))
            n = target - cached
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    break
                n = budget
            # KVCacheManager.allocate_slots: the watermark applies to a waiting (or preempted)
            # request when some request is already scheduled (has_scheduled_reqs=bool(running))
            reserve = self._watermark_blocks if self.running else 0
            if cfg.scheduler_reserve_full_isl and cached + n < target and not self._fits_whole(g, local, reserve):
                self.num_kv_refusals += 1
                break
            if reserve and not self._cache_pool.can_allocate(cached + n, g.final_tokens, g.block_hashes,
                                                             reserve_blocks=reserve):
                self.num_kv_refusals += 1
                break
            seq = self._new_seq_id()
            got = alloc.allocate(seq, cached + n, g.final_tokens, g.block_hashes)
            if got is None:
                self.num_kv_refusals += 1
                if alloc.last_failure is AllocFailure.EXTERNAL_FRAGMENTATION:
                    g.blocked_by_external_fragmentation = True
                    family = self._family_of.get(g.request_id)
                    if family is not None:
                        family.parent.blocked_by_external_fragmentation = True
                break
            assert got.num_cached_tokens == local, (got.num_cached_tokens, local)
            waiting.popleft()
            g.seq_ids = [seq]
            self._start_prefill(g, seq, target, local)  # prefix hits: the local ones only
            g.num_computed = cached
            family = self._family_of.get(g.request_id) if self._family_of else None
            if family is None:
                self.newly_admitted.append(g)
            else:
                if family.parent.status is Status.WAITING:
                    family.parent.status = Status.PREFILLING
                self.newly_admitted.append(family.parent)
            self._num_running_seqs += 1
            self._prefill_written += cached
            chunks.append(self._chunk(g, n))
            budget -= n + slots
        return budget + slots

    def _fits_whole(self, g: Group, cached: int, reserve: int = 0) -> bool:
        """``full_sequence_must_fit``: the whole sequence's blocks, less its cache hits, fit the
        free ones now with ``reserve`` (the watermark) left over (hits that are cached but
        unreferenced count as taken: claiming them takes them off the free queue). O(1) unless
        the answer depends on which hits are referenced."""
        alloc, target = self.alloc, g.num_prefill_target
        if target - cached > alloc.num_free_tokens():
            return False
        if reserve:
            return self._cache_pool.can_allocate(target, g.final_tokens, g.block_hashes,
                                                 reserve_blocks=reserve)
        cache = self._cache
        if cache is not None and cache.blocks_needed(target) <= cache.num_free_blocks():
            return True
        return alloc.can_allocate(target, g.final_tokens, g.block_hashes)

    def _count_prefix_hits(self, g: Group, target: int, cached: int) -> None:
        """As the core counts them; a sample's counts are added to its request's too (each sample
        is a request to vLLM V1, with its own lookup)."""
        family = self._family_of.get(g.request_id) if self._family_of else None
        if family is None:
            super()._count_prefix_hits(g, target, cached)
            return
        before = (g.prefix_hit_tokens, g.prefix_query_tokens, g.readmission_hit_tokens)
        super()._count_prefix_hits(g, target, cached)
        p = family.parent
        p.num_admissions += 1
        p.prefix_hit_tokens += g.prefix_hit_tokens - before[0]
        p.prefix_query_tokens += g.prefix_query_tokens - before[1]
        p.readmission_hit_tokens += g.readmission_hit_tokens - before[2]

    # ------------------------------------------------------------------ preemption
    def _preempt(self, g: Group) -> None:
        """vLLM V1's ``_preempt_request``: free the KV, computed tokens back to 0, head of the
        waiting queue; a decoding request then recomputes its prompt and every generated token.
        With prefix caching its full blocks are named and stay cached, for it to find again."""
        del self.running[g.request_id]
        self._num_running_seqs -= 1
        g.epoch += 1
        g.num_preemptions += 1
        self.num_preemptions += 1
        family = self._family_of.get(g.request_id) if self._family_of else None
        if family is None:
            self._preempted.append(g.request_id)
        else:
            family.parent.num_preemptions += 1
            self._preempted.append(family.parent.request_id)
        seq = g.seq_ids[0]
        if g.status is Status.PREFILLING:
            del self.prefilling[g.request_id]
            del self._prefill_owner[seq]
            self._prefill_written -= g.num_computed
            written = g.num_computed
        else:
            written = g.kv_len(self.decode_counter)
            self._leave_decode(g, written)
            g.num_prefill_target = written + 1  # request.num_tokens: the newest token has no KV yet
        cache = self._cache
        if cache is not None and written // cache.block_size > len(g.block_hashes):
            g.block_hashes = own_block_hashes(g.block_hashes, g.request_id, written // cache.block_size)
            cache.cache_blocks(seq, g.block_hashes, written)
        self.alloc.free(seq)
        g.status = Status.WAITING
        g.num_computed = 0
        g.seq_ids = []
        self.waiting.appendleft(g)

    # ------------------------------------------------------------------ quiet runs
    def quiet_run(self, plan: StepPlan, limit: int) -> int:
        """:meth:`Scheduler.quiet_run`, ended early where an eviction could admit the waiting
        head without anything being freed.

        That happens when the head's prefix-cache hit includes a free (cached, unreferenced)
        block and its chunk is (or, the hit shortened, becomes) cut by the budget or the
        threshold: claiming that block counts as taking a free one, so when a growth evicts it
        the head's chunk of the same size needs a block less (or more, the hit shortening there)
        while the free blocks drop by one. Then the run may only go as far as its growths take
        the free blocks handed out before the first named one (``free_blocks_before_eviction``),
        which evict nothing. On a hybrid pool a window group's hit block counts as free even
        while referenced: a running sequence may drop it in the run, as its window moves on
        (:meth:`HybridPagedAllocator.has_unreferenced_hit`).
        """
        k = super().quiet_run(plan, limit)
        cache = self._cache
        if k <= 1 or cache is None or not self.waiting or not self.waiting[0].block_hashes:
            return k
        head = self.waiting[0]
        target = head.num_prefill_target
        threshold = self.long_prefill_token_threshold
        # could its chunk be cut, once evictions shorten its hit (to nothing at worst)?
        cut = 0 < threshold < target or (self.config.enable_chunked_prefill and
                                          target > self.config.max_num_batched_tokens - self._n_dec)
        if not cut or not cache.has_unreferenced_hit(head.block_hashes, target):
            return k  # a chunk of the whole rest needs the more blocks the shorter the hit
        # growths in k steps: at most one per decoding group per block boundary it reaches
        most = len(self.decoding) * (1 + k // self.config.block_size) * self._growth_blocks
        return self._steps_before_eviction(k, cache.free_blocks_before_eviction(most) // self._growth_blocks)

    def _steps_before_eviction(self, k: int, free: int) -> int:
        """The steps, up to ``k``, before the first whose growths would be more than ``free``
        counted from now (the core's count in :meth:`Scheduler.quiet_run`: the growths due, and
        those the run's own growths file one block later). Blocks a window group drops in the
        run are not counted back: the count errs on the early side."""
        d, bs, events = self.decode_counter, self.config.block_size, self._events
        later: dict[int, list[int]] = {}  # counter -> the end counters of groups that grow there
        for j in range(1, k):
            c = d + j
            ends = later.pop(c, [])
            for _, g, epoch, token in events.get(c, ()):
                if g.epoch == epoch and g.status is Status.DECODING and token == g.grow_token:
                    ends.append(g.anchor_counter + g.final_tokens - g.anchor_len)
            if ends:
                if len(ends) > free:
                    return j
                free -= len(ends)
                for end in ends:
                    if c + bs < end:
                        later.setdefault(c + bs, []).append(end)
        return k

    # ------------------------------------------------------------------ complete
    def complete(self, plan: StepPlan) -> StepOutcome:
        """As :meth:`Scheduler.complete`; the step's finished requests free their KV in running
        order (``update_from_output`` frees them in scheduling order, which sets the order in
        which their cached blocks are evicted); a parallel-sampling request emits its first token
        with its first sample's and finishes with its last sample."""
        outcome = super().complete(plan)
        done = self._done
        if done:  # in running order, as update_from_output frees them: the order of the cache's LRU
            if len(done) > 1:
                done.sort(key=_by_admission)
            for g in done:
                self.alloc.free(g.seq_ids[0])
            done.clear()
        family_of = self._family_of
        if not family_of or not (outcome.first_token or outcome.finished):
            return outcome
        first: list[Group] = []
        for g in outcome.first_token:
            family = family_of.get(g.request_id)
            if family is None:
                first.append(g)
            elif not family.parent.first_token_emitted:
                family.parent.first_token_emitted = True
                if family.parent.status is Status.PREFILLING:
                    family.parent.status = Status.DECODING
                first.append(family.parent)
        finished: list[Group] = []
        for g in outcome.finished:
            family = family_of.pop(g.request_id, None)
            if family is None:
                finished.append(g)
            elif not family.left and self._families.pop(family.parent.request_id, None) is not None:
                finished.append(family.parent)  # once, with the step's last sample to finish
        return StepOutcome(tuple(first), tuple(finished))

    def _finish(self, g: Group) -> None:
        """Finish a request (its KV is freed at the end of :meth:`complete`); a parallel-sampling
        request is finished with its last sample."""
        self._done.append(g)
        del self.running[g.request_id]
        self._num_running_seqs -= 1
        g.status = Status.FINISHED
        family = self._family_of.get(g.request_id) if self._family_of else None
        if family is None:
            self.num_finished += 1
            return
        family.left -= 1
        if not family.left:
            family.parent.status = Status.FINISHED
            self.num_finished += 1
