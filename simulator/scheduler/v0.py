"""vLLM V0's scheduling policy (``engine: vllm-v0``), as its last release ran it.

Read from vLLM 0.10.2, the last release that ships V0 (0.11.0 no longer has ``vllm/core/``):
``vllm/core/scheduler.py`` (``Scheduler._schedule_default``, ``_schedule_chunked_prefill``,
``_schedule_running``, ``_schedule_swapped``, ``_schedule_prefills``,
``_chunk_new_tokens_to_schedule``) and ``vllm/core/block_manager.py``
(``SelfAttnBlockSpaceManager``: ``can_allocate``, ``allocate``, ``can_append_slots``,
``_can_swap``). The rules, each with the function it comes from:

* **A prompt's blocks are all taken at admission**, chunked or not: ``_allocate_and_set_running``
  → ``block_manager.allocate`` builds the block table of every token of the sequence (the prompt,
  or prompt plus generated tokens after a recompute). A later chunk therefore never needs a
  block and never preempts; only a decode's growth can.
* **Admission keeps a 1% watermark free**: ``can_allocate`` admits when the free blocks (plain
  free plus evictable cached ones) less every block of the sequence — its cache hits are not
  subtracted — leave ``int(0.01 × num_gpu_blocks)`` free (``watermark=0.01``, the block
  manager's default, which the scheduler does not override); a request that does not fit stops
  admission (``AllocStatus.LATER``). A prompt that could never leave the watermark free
  (``num_blocks − its blocks < watermark``: ``AllocStatus.NEVER``) is refused, as vLLM marks
  it ``FINISHED_IGNORED``. Swapping in keeps the same watermark (``_can_swap``); a decode's
  growth does not (``can_append_slots``: the touched blocks must fit the free ones).
* **Without chunked prefill** (``_schedule_default``): waiting requests first, whole prompts
  within ``max_num_batched_tokens`` and ``max_num_seqs`` (running sequences counted), only if no
  request is swapped out; a step that admits any runs **prefills only** ("Don't schedule
  decodes if prefills are scheduled"): every decode waits a step. Otherwise the running
  requests decode (growing, preempting), then swapped-out requests come back if none was
  preempted.
* **With chunked prefill** (``_schedule_chunked_prefill``): the running queue first — every
  decode, then the partly prefilled prompts, each taking what is left of the budget — then the
  swapped-out requests (none if any was preempted in this step, each within the budget), then
  waiting requests FCFS with the budget left: admitted even in a step that preempted (the
  victims rejoin the waiting queue only after admission) or while others are swapped out. With
  prefix caching the budget a chunk may take is cut to a multiple of the block size first, so
  a prompt's rest that would just fit it can still take one more step.
* **The victim** is the last request of the running queue (``running_queue.pop()``). V0's
  queue holds the decodes in the order they began decoding and partly prefilled prompts after
  every decode, so the newest prefilling prompt goes first, then the decode that began last. A
  swapped-in request rejoins the queue at its front with chunked prefill
  (``_schedule_chunked_prefill`` extends ``self.running`` with the swapped-in requests first)
  and at its end without (``_schedule_default`` extends it with them after the decodes). Growths
  are served in queue order when the free blocks do not hold them all.
* **Every running request wants free blocks each step**: ``can_append_slots`` is a worst-case
  heuristic — each sequence's first touched block counts even when it has room — so a decode
  needs a free block per sequence before its turn (and a partly prefilled prompt whose last
  block is partial one), and V0 preempts from the tail of the queue until it has them: the
  pool's last block is never filled in a decode step.
* Recompute or swap as :class:`~simulator.scheduler.core.Scheduler` preempts (``_preempt``:
  swap for a group of several sequences, else ``preemption_mode``).

Defaults (``EngineArgs._set_default_args_v0`` in vllm/engine/arg_utils.py, ``SchedulerConfig``
in vllm/config/scheduler.py): 256 sequences; chunked prefill only for a context above 32,768
tokens (not for MLA or sliding-window models); a budget of 2,048 tokens with chunked prefill,
else ``max(max_model_len, 2048)``; prefix caching off (:func:`~simulator.config.deployment.
engine_defaults`).

Left out: ``delay_factor`` (0 by default), ``policy: priority``, ``max_num_partial_prefills``
above 1, LoRA and prompt-embedding batches. Two edges differ: a fully cached prompt computes one
token in V0 and its last block here (the allocator's lookup stops a block short); a recompute
whose blocks could never leave the watermark free, which V0 would drop (``NEVER``), is admitted
here once nothing else runs, and a swapped-out request that cannot fit restarts instead; a
request left alone in the pool that wants a free block it does not need goes on (V0 would
preempt it at every step). Two rules of 0.10.2 are not followed (benchmarks/parity_vllm_v0.py
shows both): it fans a request of ``n`` samples out into ``n`` requests of one sequence
(``ParallelSampleSequenceGroup``), where kvplan forks them after the prompt and shares its blocks,
as the PagedAttention paper's engine did; and its prefix cache names the full blocks of
generated tokens too, so a recomputed request finds more of its own blocks than here.
"""

from __future__ import annotations

from collections import deque

from simulator.kv.allocator import KVAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.core import _BEAM, Scheduler
from simulator.scheduler.details import step_details
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.scheduler.state import Group, Status, StepOutcome
from workloads.request import Request

# vllm/core/block_manager.py: SelfAttnBlockSpaceManager(..., watermark: float = 0.01)
V0_WATERMARK = 0.01


class V0Scheduler(Scheduler):
    """vLLM V0's policy behind :class:`Scheduler`'s interface (see the module docstring)."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                 keep_groups: bool = True):
        super().__init__(allocator, config, detail=detail, keep_groups=keep_groups)
        # a block pool's watermark; contiguous regions (kvplan's baselines) have no blocks to keep free
        self._pool: PagedAllocator | None = allocator if isinstance(allocator, PagedAllocator) else None
        self._watermark = int(V0_WATERMARK * allocator.num_blocks) if self._pool is not None else 0
        # chunks of an unfinished prompt are whole blocks (_chunk_new_tokens_to_schedule)
        self._block_chunks = config.enable_prefix_caching and self._pool is not None
        self._prefill_only = False  # the step scheduled last runs prefills only (no chunked prefill)
        self._hold: list[Group] | None = None  # preempted in this step, back in the queue after admission
        self._swap_budget = 0  # tokens the budget leaves swapped-in requests in this step
        self._swapped_in: list[Group] = []

    # ------------------------------------------------------------------ requests
    def add_request(self, request: Request, *, queue: bool = True) -> Group:
        """As :meth:`Scheduler.add_request`; a prompt whose blocks could never leave the watermark
        free is refused too (``can_allocate`` answers ``NEVER``)."""
        g = super().add_request(request, queue=False)
        if g.status is Status.REJECTED:
            return g
        pool = self._pool
        need = pool.blocks_needed(request.prompt_tokens) if pool is not None else 0
        if pool is not None and pool.num_blocks - need < self._watermark:
            return self._reject(g, f"kv_capacity: the prompt's {need} blocks leave fewer than vLLM V0's "
                                   f"watermark of {self._watermark} free of {pool.num_blocks}")
        if queue:
            self.waiting.append(g)
        return g

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepPlan:
        cfg = self.config
        d = self.decode_counter
        self._preempted, self._copies = [], []
        self.newly_admitted = []
        self._copy_tokens, self._pending_copy_tokens = self._pending_copy_tokens, 0
        self._swap_out_tokens = self._swap_in_tokens = 0
        chunks: list[PrefillChunk] = []
        if not cfg.enable_chunked_prefill:
            if self.waiting and not self.swapped:
                self._admit(cfg.max_num_batched_tokens, chunks)
            self._prefill_only = bool(chunks)
            if chunks:
                return self._plan(d, chunks)
            self._grow_due(d)
            if self.swapped and not self._preempted:
                self._swap_in_within(d, cfg.max_num_batched_tokens - self._n_dec)
            return self._plan(d, chunks)
        self._prefill_only = False
        self._hold = []
        self._grow_due(d)
        budget = cfg.max_num_batched_tokens - self._n_dec
        for g in self.prefilling.values():
            n = self._chunk_tokens(g.num_prefill_target - g.num_computed, budget)
            if n <= 0:
                break
            chunks.append(self._chunk(g, n))
            budget -= n
        if self.swapped and not self._preempted:
            budget = self._swap_in_within(d, budget)
        if self.waiting:
            self._admit(budget, chunks)
        held, self._hold = self._hold, None
        for g in held:  # in preemption order: the last victim ends at the head, as appendleft leaves it
            self.waiting.appendleft(g)
        return self._plan(d, chunks)

    def _chunk_tokens(self, rest: int, budget: int) -> int:
        """Tokens of a prompt's ``rest`` to compute with ``budget`` left: as many as the budget
        holds; with prefix caching the budget is first cut to whole blocks, even for the chunk
        that ends the prompt (``_chunk_new_tokens_to_schedule`` rounds the budget, not the chunk)."""
        if self._block_chunks:
            bs = self.config.block_size
            budget = budget // bs * bs
        return rest if rest <= budget else budget

    def _spare(self) -> int:
        """Free blocks V0's check wants of one running request beyond its growth: one per sequence
        (``can_append_slots`` counts the last block touched even when it has room)."""
        if not self._multi_seq_decoding:
            return 1
        return max(len(g.seq_ids) for g in self.decoding.values())

    def _quiet_free(self) -> int:
        return self.alloc.free_blocks_for_growth() - self._spare() if self._pool is not None else \
            super()._quiet_free()

    def _grow_due(self, d: int) -> None:
        """The running queue's ``can_append_slots`` checks and growths at step ``d``.

        V0 walks the queue (decodes in order, then partly prefilled prompts) and wants, before
        each request, as many free blocks as the blocks it touches — one per decoding sequence,
        whether or not its last block has room (``get_num_blocks_touched_by_append_slots``: the
        first touched block counts), one for a prefilling prompt whose last block is partial
        — and preempts from the queue's tail until that holds. When the free blocks exceed the
        growths due by the largest such want, every check passes and the growths are made as
        filed; otherwise the queue is walked (block pools only: a contiguous region never needs
        a block to decode)."""
        pending = self._events.pop(d, None)
        live = [] if pending is None else [
            (kind, g) for kind, g, epoch, token in pending
            if g.epoch == epoch and g.status is Status.DECODING and (kind == _BEAM or token == g.grow_token)]
        pool = self._pool
        if pool is not None and (self.decoding or self.prefilling):
            need = sum(len(g.seq_ids) for _, g in live) if self._multi_seq_decoding else len(live)
            if pool.num_free_blocks() < need + self._spare():
                self._walk_running_queue(d, live)
                return
        if len(live) > 1 and (self._multi_seq_decoding or len(live) > self.alloc.free_blocks_for_growth()):
            order = {rid: i for i, rid in enumerate(self.running)}
            live.sort(key=lambda e: order[e[1].request_id])
        for kind, g in live:
            if g.status is not Status.DECODING:  # preempted by an earlier growth
                continue
            if kind == _BEAM:
                self._reshuffle_beams(g, d)
            self._grow(g, d)

    def _walk_running_queue(self, d: int, live: list[tuple[int, Group]]) -> None:
        """``_schedule_running``'s loop near a full pool (see :meth:`_grow_due`)."""
        pool = self._pool
        assert pool is not None
        due = {g.request_id: kind for kind, g in live}
        bs = self.config.block_size
        queue = deque(g for g in self.running.values() if g.status is Status.DECODING)
        queue.extend(self.prefilling.values())
        while queue:
            g = queue.popleft()
            if g.status is Status.DECODING:
                touched = len(g.seq_ids)
            elif g.status is Status.PREFILLING:
                touched = 1 if g.num_prefill_target % bs else 0
            else:
                continue  # preempted from the tail already
            while pool.num_free_blocks() < touched:
                while queue and queue[-1].status not in (Status.DECODING, Status.PREFILLING):
                    queue.pop()
                if not queue and len(self.running) == 1:
                    break  # alone: V0 would preempt it at every step, forever; it goes on here
                victim = queue.pop() if queue else g
                self._preempt(victim)
                if victim is g:
                    break
            if g.status is Status.DECODING or g.status is Status.PREFILLING:
                kind = due.get(g.request_id)
                if kind is not None and g.status is Status.DECODING:
                    if kind == _BEAM:
                        self._reshuffle_beams(g, d)
                    self._grow(g, d)

    def _admit(self, budget: int, chunks: list[PrefillChunk]) -> int:
        """Admit waiting requests FCFS (``_schedule_prefills``): each takes every block of its
        sequence now, with the watermark left free; returns the budget left."""
        cfg, pool = self.config, self._pool
        chunked = cfg.enable_chunked_prefill
        while self.waiting and budget > 0:
            g = self.waiting[0]
            target = g.num_prefill_target
            if pool is not None:
                need = pool.blocks_needed(target)
                # a recompute V0 would drop (NEVER) waits for an empty pool instead
                reserve = self._watermark if self.running or pool.num_blocks - need >= self._watermark else 0
                if need + reserve > pool.num_free_blocks():
                    self.num_kv_refusals += 1
                    break
            cached = self._cached_prefix(g, target) if g.block_hashes else 0
            n = target - cached
            if chunked:
                n = self._chunk_tokens(n, budget)
                if n <= 0:
                    break
            elif n > budget:
                break
            k = g.num_seqs
            if self._num_running_seqs + k > cfg.max_num_seqs:
                break
            seq = self._allocate_group(g, target, cached)
            if seq is None:
                break
            self._admitted(g, seq, target, cached, n, chunks)
            budget -= n
        return budget

    # ------------------------------------------------------------------ swapping
    def _swap_in_within(self, d: int, budget: int) -> int:
        """Swap requests back in (``_schedule_swapped``), each within the token budget left (one
        token per sequence) and the watermark: to the front of the running queue with chunked
        prefill (``_schedule_chunked_prefill`` extends ``self.running`` with them first), else
        to its end (``_schedule_default`` extends it with them after the decodes). Returns the
        budget left."""
        self._swap_budget = budget
        self._swapped_in = []
        before = self._n_dec
        self._swap_in(d)
        back = {g.request_id: g for g in self._swapped_in if g.status is Status.DECODING}
        if back and self.config.enable_chunked_prefill:
            running = self.running
            rest = [(rid, g) for rid, g in running.items() if rid not in back]
            running.clear()
            running.update(back)
            running.update(rest)
        return budget - (self._n_dec - before)

    def _swap_in_fits(self, g: Group, length: int) -> bool:
        k = len(g.seq_ids)
        if k > self._swap_budget:
            return False
        pool = self._pool
        if pool is not None and self.running:  # alone in the pool it comes back whatever the watermark
            need = k * pool.blocks_needed(length + 1)
            if need + self._watermark > pool.num_free_blocks():
                return False
        self._swap_budget -= k
        self._swapped_in.append(g)
        return True

    # ------------------------------------------------------------------ preemption
    def _preempt_newest(self, needy: Group) -> bool:
        """Preempt the last request of V0's running queue: the newest partly prefilled prompt,
        else the decode that began last; False if that is ``needy`` itself."""
        if self.prefilling:
            victim = next(reversed(self.prefilling.values()))
        else:
            victim = next(reversed(self.running.values()))
        self._preempt(victim)
        return victim is not needy

    def _preempt(self, g: Group) -> None:
        super()._preempt(g)
        if self._hold is not None and g.status is Status.WAITING:
            assert self.waiting[0] is g
            self._hold.append(self.waiting.popleft())

    def _start_decode(self, g: Group, length: int, d: int) -> None:
        super()._start_decode(g, length, d)
        running = self.running  # V0's running queue: decodes in the order they began decoding
        running[g.request_id] = running.pop(g.request_id)

    # ------------------------------------------------------------------ plan and complete
    def _plan(self, d: int, chunks: list[PrefillChunk]) -> StepPlan:
        if not self._prefill_only:
            return super()._plan(d, chunks)
        # a prefill-only step: no decode runs, nothing grows or is preempted or swapped
        details = step_details(self.alloc, chunks, (), d) if self.detail else None
        return StepPlan(self.step_id, tuple(chunks), 0, 0, 0.0, 0, 0, self.alloc.take_loaded_blocks(),
                        (), self._copy_tokens, (), details)

    def complete(self, plan: StepPlan) -> StepOutcome:
        if not self._prefill_only:
            return super().complete(plan)
        # decodes did not run: the decode counter, and every decoding request's KV, stay put
        assert plan.step_id == self.step_id, "complete() must follow its own schedule()"
        self.step_id += 1
        first: list[Group] = []
        finished: list[Group] = []
        self._complete_prefills(plan, self.decode_counter, first, finished)
        return StepOutcome(tuple(first), tuple(finished))
