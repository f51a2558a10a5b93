"""SGLang's scheduler (``engine: sglang``): a prefill batch or a decode batch per step, over a
:class:`~simulator.kv.radix.RadixTokenPool`.

Read from SGLang's source (sgl-project/sglang main, the newest versions the project could read,
v0.5.x): python/sglang/srt/managers/scheduler.py, schedule_policy.py, schedule_batch.py,
scheduler_components/new_token_ratio_tracker.py, tokenizer_manager.py, python/sglang/srt/
environ.py and server_args.py (the pool's sources are in :mod:`simulator.kv.radix`). One step is
one ``Scheduler.get_next_batch_to_run``::

    get_next_batch_to_run
    ├─ a prefill batch, if one forms (get_new_batch_prefill, PrefillAdder):
    │     [the chunked request's next chunk][waiting requests in policy order ... until a budget]
    │     nothing decodes in that step (enable_mixed_chunk is off by default)
    └─ else the decode batch (update_running_batch): every running request, one token
          KV short (check_decode_mem): retract requests, new_token_ratio from the survivors
          else: new_token_ratio decays
    no batch at all: idle, new_token_ratio back to its initial value (self_check_during_idle)

The rules, each with the function it comes from:

* Admission (``PrefillAdder``, schedule_policy.py). The KV budget is free + evictable tokens less
  a reserve for the running requests' futures, Σ min(max_new_tokens − generated,
  CLIP_MAX_NEW_TOKENS) × new_token_ratio (``_get_running_request_total_token_offset``; finished
  requests not yet filtered out of the running batch reserve 0). A candidate needs its tokens to
  compute + min(max_new_tokens − generated, CLIP) + one page below that budget, checked before
  and after locking its cached prefix (``add_one_req``: ``total_tokens >= rem_total_tokens`` →
  NO_TOKEN). An admitted request charges its computed tokens (page-rounded) + min(max_new_tokens,
  CLIP) + one page, a first chunk only its tokens + one page (``_update_prefill_budget``).
  Admission stops at the first request that does not fit (no overtaking), once
  ``chunked_prefill_size`` or ``max_prefill_tokens`` is spent or the KV budget is gone
  (``budget_state``), or at ``max_running_requests`` (``get_num_allocatable_reqs``). A request
  with more to compute than the chunk budget left gets that budget, rounded down to a page, and
  its next chunks go first in the following steps (``add_chunked_req``: the rest, or the chunk
  budget, or the KV budget if smaller).
* ``batch_is_full`` (scheduler.py): NO_TOKEN or a full running batch sets it, and no prefill is
  tried again until the running batch shrinks: a request leaves the decode batch (a finish,
  filtered out at the next decode step by ``update_running_batch``, or a retraction), or the last
  prefill batch held a finished or still-chunked request (``get_next_batch_to_run``). So a
  decaying new_token_ratio alone never lets a waiting request in; a request leaving does.
* Policies (``SchedulePolicy.calc_priority``): ``fcfs`` keeps the queue's order; ``lpm`` sorts it
  (stably) by the longest cached prefix, putting last a request with a short cached prefix whose
  prefix a request ahead of it in the queue will bring (in-batch prefix caching, 32-token
  thresholds), and is FCFS above 128 waiting requests (``_determine_active_policy``).
* new_token_ratio (scheduler_components/new_token_ratio_tracker.py, environ.py): starts at
  min(0.7 × schedule_conservativeness, 1), decays by (init − min) / 600 per decode step to
  min = init × 0.14; a retraction sets it to (Σ generated + 20 × requests) / (Σ max_new_tokens +
  1) over the requests left, at most 1 (``retract_decode``). Kept as (value, decays since) and
  read as max(value − decays × decay, min), so one step and a quiet run of many agree exactly.
* Decode out of memory (``check_decode_mem``): every request whose next token starts a page needs
  one, cache evicted first. ``retract_decode`` sorts the batch by (generated, −prompt) descending
  and retracts from the end — fewest generated tokens first, the longest prompt among equals —
  until the rest fit the next step, always keeping one; the batch keeps that sorted order. A
  retracted request frees its private KV without inserting it (its prompt, cached at prefill,
  stays in the tree), then eviction frees 20 tokens per request left (``release_req``); it goes
  to the *tail* of the waiting queue (``_add_request_to_queue``) and later recomputes its prompt
  and generated tokens. Retractions are counted in ``num_preemptions`` (the report's preemptions
  column) and in the group's.
* Requests: ``output_tokens`` is the request's max_new_tokens (a benchmark client's forced
  length). Refused: prompt + output reaching ``max_model_len`` (``TokenizerManager.
  _validate_one_request``: ``>=`` the context length); prompt + output + a page reaching the pool
  (admission asks for prompt + max_new_tokens + a page below the free KV: alone in the pool such a
  request could stall or run out); beam search (not part of SGLang's engine). Parallel sampling
  (``n > 1``, ``TokenizerManager._handle_batch_request``): the prompt is first sent with
  max_new_tokens = 0 to cache it, and the ``n`` samples are sent when it returns (here: they join
  the waiting queue when it completes). Each sample is a request of its own; the group reports its
  first sample's first token and ends with its last sample.

Not modelled: the overlap scheduler (it processes a step's results one step later: a latency
matter), mixed chunks, priorities, ``add_one_req_ignore_eos`` (SGLang's path only with the radix
cache off and ``ignore_eos`` set; requests here stop at max_new_tokens by themselves), the
hierarchical cache, LoRA.

Per-step work is proportional to what changed: decoding requests are not visited. A request's KV
length is ``anchor_len + decode_counter - anchor_counter``; finishes are kept by the decode counter
of their step; the admission reserve, Σ context and Σ context² are kept incrementally; the pool
grows every decoding sequence in lockstep. Quiet runs: a decode step that admits nothing and will
not try to (no waiting request, or ``batch_is_full``) repeats until a finish or until a step's KV
cannot be found (free + evictable tokens short of what it takes: closed form); evictions inside a
run happen at their step, in order.

Knobs, kvplan → SGLang: ``max_num_seqs`` → ``--max-running-requests``; ``max_num_batched_tokens``
→ ``--chunked-prefill-size`` (``enable_chunked_prefill: false`` → chunked prefill off, -1);
``block_size`` → ``--page-size``; ``schedule_policy``, ``radix_eviction_policy``,
``max_prefill_tokens``, ``schedule_conservativeness`` keep SGLang's names; ``enable_prefix_caching:
false`` → ``--disable-radix-cache`` (SGLang's default is the radix cache on). KV memory:
``--mem-fraction-static`` is (weights + KV pool) / GPU memory, activations and CUDA graphs outside
it, unlike vLLM's ``gpu_memory_utilization`` (everything vLLM uses): the KV pool is
mem_fraction_static × HBM − weights, with no profiled activation peak to subtract
(:func:`sglang_defaults` gives the GPU-dependent defaults).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from simulator.kv.allocator import KVAllocator
from simulator.kv.radix import RadixTokenPool, RadixTree, TokenKey, TreeNode, token_key
from simulator.scheduler.plan import PrefillChunk, SeqDetail, StepPlan
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.state import Group, Status, StepOutcome, reject
from workloads.request import Request

# schedule_policy.py
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32  # a cached prefix this short: check the waiting queue
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32  # a queue-shared prefix this long: go last
LPM_MAX_WAITING = 128  # SchedulePolicy._determine_active_policy: lpm falls back to fcfs above it
_NO_TOKEN, _OTHER, _CONTINUE = range(3)  # AddReqResult
_WHOLE, _PREFIX, _SAMPLE = range(3)  # a request; a parallel-sampling prompt; one of its samples

_NOTHING = StepOutcome((), ())


@dataclass(slots=True, eq=False)
class _Req:
    """One request as SGLang's scheduler holds it (``Req``): a group's request, or for parallel
    sampling the prompt request or one sample."""

    group: Group
    kind: int
    key: TokenKey
    max_new: int  # sampling max_new_tokens
    final_tokens: int  # KV tokens when it finishes (its last token has no KV)
    fill: int  # prompt + generated tokens: what an admission computes (``fill_ids``)
    output: int = 0  # generated tokens (``len(output_ids)``), as of its last prefill or retraction
    seq_id: int = -1
    node: TreeNode | None = None  # ``last_node`` of its prefix match
    prefix: int = 0  # cached tokens found by that match
    computed: int = 0  # KV tokens of this admission computed so far
    extend: int = 0  # tokens this step computes
    anchor_len: int = 0  # decoding: KV length = anchor_len + decode_counter - anchor_counter
    anchor_counter: int = 0
    end: int = 0  # decoding: the decode counter after its last step
    epoch: int = 0  # bumps when pending events of the request must be ignored
    capped: bool = False  # decoding: its admission reserve is CLIP_MAX_NEW_TOKENS for now
    lpm_tokens: int = 0


class SGLangScheduler:
    """SGLang's policy behind the StepPlan seam; the same interface as
    :class:`~simulator.scheduler.core.Scheduler` (see the module docstring for the rules)."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                 keep_groups: bool = True):
        """``keep_groups``: remember every request's group in :attr:`groups` (by request id)."""
        if not isinstance(allocator, RadixTokenPool):
            raise TypeError(f"engine sglang runs on a RadixTokenPool, not {type(allocator).__name__}")
        if allocator.page_size != config.block_size:
            raise ValueError(f"the pool's page_size {allocator.page_size} != block_size {config.block_size}")
        if allocator.tree.eviction_policy != config.radix_eviction_policy:
            raise ValueError(f"the pool evicts by {allocator.tree.eviction_policy}, the config says "
                             f"{config.radix_eviction_policy}")
        _check_sglang_knobs(config)
        self.alloc = self.pool = allocator
        self.config = config
        self.detail = detail
        self.keep_groups = keep_groups
        self.max_running_requests = config.max_num_seqs
        self.chunked_prefill_size = config.max_num_batched_tokens if config.enable_chunked_prefill else None
        self.waiting: deque[_Req] = deque()
        self.swapped: deque[Group] = deque()  # SGLang never swaps
        self.groups: dict[int, Group] = {}
        self.newly_admitted: list[Group] = []  # groups admitted by the last schedule()
        self.step_id = 0
        self.decode_counter = 0  # decode steps completed
        # new_token_ratio (NewTokenRatioTracker.from_server_args)
        self.init_new_token_ratio = min(config.init_new_token_ratio * config.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * config.min_new_token_ratio_factor, 1.0)
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / \
            config.new_token_ratio_decay_steps
        self._ratio_value = self.init_new_token_ratio
        self._ratio_decays = 0
        # the running batch (decoding requests, batch order), its finished-but-not-filtered count,
        # the chunked request, the last prefill batch
        self._running: dict[int, _Req] = {}
        self._unfiltered = 0
        self._chunked: _Req | None = None
        self._batch: list[_Req] = []
        self._batch_is_full = False
        self._idle = False  # SGLang went idle after the last step (nothing left to run)
        self._pending: dict[int, _Req] = {}  # accepted by add_request(queue=False)
        self._samples_left: dict[int, int] = {}  # request id -> samples not finished
        self._next_seq_id = 0
        self._preempted: list[int] = []
        # decode bookkeeping: finishes by decode counter, the longest context, Σ context, Σ context²
        self._finishes: dict[int, list[tuple[_Req, int]]] = {}
        self._finish_heap: list[int] = []
        self._max_heap: list[tuple[int, int, int, _Req]] = []
        self._n_dec = 0
        self._s1 = 0
        self._s2 = 0
        # admission reserve: Σ min(end - d, CLIP) = lin_ends - d × lin_n + CLIP × cap_n
        self._lin_ends = 0
        self._lin_n = 0
        self._cap_n = 0
        self._cap_heap: list[tuple[int, int, int, _Req]] = []  # (counter it turns linear, ...)
        # totals
        self.num_preemptions = 0
        self.num_swaps = 0
        self.num_finished = 0
        self.num_rejected = 0
        # prefill admissions refused for KV (NO_TOKEN): KV memory held concurrency back
        self.num_kv_refusals = 0
        self.prefix_hit_tokens = 0  # first admissions only
        self.prefix_query_tokens = 0
        self.readmission_hit_tokens = 0

    # ------------------------------------------------------------------ requests
    def add_request(self, request: Request, *, queue: bool = True) -> Group:
        """Queue a request, or refuse it (``status == REJECTED`` with a reason); with
        ``queue=False`` an accepted request waits for :meth:`enqueue`."""
        cfg, pool = self.config, self.pool
        prompt, out = request.prompt_tokens, request.output_tokens
        g = Group(request, prompt + out - 1, num_prefill_target=prompt)
        if self.keep_groups:
            self.groups[request.request_id] = g
        if request.beam_width > 1:
            return self._reject(g, "beam_search: SGLang's engine has no beam search (beam_width "
                                   f"{request.beam_width})")
        if prompt + out >= cfg.max_model_len:
            return self._reject(g, f"max_model_len: prompt + output = {prompt + out} tokens >= "
                                   f"{cfg.max_model_len}, SGLang's limit")
        need = prompt + out + pool.page_size
        if need >= pool.capacity_tokens:
            return self._reject(g, f"kv_capacity: prompt + output + a page = {need} KV slots, the "
                                   f"whole pool holds {pool.capacity_tokens}: SGLang would never admit it")
        rid = request.request_id
        if request.n > 1:
            self._samples_left[rid] = request.n
            req = _Req(g, _PREFIX, self._key(request, (rid, -1)), 0, prompt, prompt)
        else:
            req = _Req(g, _WHOLE, self._key(request, rid), out, prompt + out - 1, prompt)
        if queue:
            self.waiting.append(req)
        else:
            self._pending[rid] = req
        return g

    def enqueue(self, g: Group) -> None:
        """Queue a request accepted by ``add_request(..., queue=False)``."""
        assert g.status is Status.WAITING and not g.num_admissions
        self.waiting.append(self._pending.pop(g.request_id))

    def _key(self, request: Request, owner: object) -> TokenKey:
        return token_key(request.prefix_ids, request.prefix_block_tokens, request.prompt_tokens,
                         request.request_id, owner)

    def _reject(self, g: Group, reason: str) -> Group:
        self.num_rejected += 1
        return reject(g, reason)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self._running or self._chunked)

    @property
    def num_running_seqs(self) -> int:
        """Sequences holding KV: the decode batch and a request in chunked prefill."""
        return len(self._running) + (self._chunked is not None)

    @property
    def new_token_ratio(self) -> float:
        return max(self._ratio_value - self._ratio_decays * self.new_token_ratio_decay,
                   self.min_new_token_ratio)

    def written_tokens(self) -> int:
        """Σ over resident sequences of KV tokens written (shared ones per sharer)."""
        return self._s1 + (self._chunked.computed if self._chunked is not None else 0)

    def head(self) -> tuple[int, int, int] | None:
        if not self.waiting:
            return None
        r = self.waiting[0]
        return (r.fill, r.final_tokens, 1)

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepPlan:
        """Decide the next step (``get_next_batch_to_run``). Valid until :meth:`complete`."""
        self.newly_admitted = []
        self._preempted = []
        if self._idle:  # SGLang idled since the last step: the batch filtered, the ratio reset
            self._idle = False
            self._unfiltered = 0
            self._batch_is_full = False
            self._ratio_value, self._ratio_decays = self.init_new_token_ratio, 0
        for _ in range(2):
            batch = self._get_new_batch_prefill()
            if batch is not None:
                return self._prefill_plan(batch)
            if self._update_running_batch():
                return self._decode_plan()
            # No batch: SGLang idles (self_check_during_idle) and loops at once; a prefill the
            # emptied running batch no longer blocks forms in that next iteration.
            self._ratio_value, self._ratio_decays = self.init_new_token_ratio, 0
            if not self.waiting or self._batch_is_full:
                break
        return StepPlan(self.step_id, (), 0, 0, 0.0, 0)

    def _get_new_batch_prefill(self) -> list[_Req] | None:
        """``Scheduler._get_new_batch_prefill_raw``: the prefill batch, or None."""
        chunked = self._chunked
        if (self._batch_is_full or not self.waiting) and chunked is None:
            return None
        allocatable = self.max_running_requests - (len(self._running) + self._unfiltered)
        if allocatable <= 0 and chunked is not None:
            self._batch_is_full = True
            return None
        self._calc_priority()
        adder = _PrefillAdder(self, self._reserve() * self.new_token_ratio)
        if chunked is not None:
            self._chunked = adder.add_chunked_req(chunked)
        for req in self.waiting:
            if len(adder.can_run) >= allocatable:
                self._batch_is_full = True
            if self._batch_is_full:
                break
            # Req.init_next_round_input: match all but the last token (_compute_max_prefix_len)
            req.prefix, req.node = self.pool.match_prefix(req.key, req.fill - 1)
            result = adder.add_one_req(req)
            if result != _CONTINUE:
                if result == _NO_TOKEN:
                    self._batch_is_full = True
                    self.num_kv_refusals += 1
                break
        if not adder.can_run:
            return None
        for _ in range(adder.num_new):  # the admitted requests are the queue's first ones
            self.waiting.popleft()
        if adder.new_chunked is not None:
            assert self._chunked is None, "one chunked request at a time"
            self._chunked = adder.new_chunked
        self._allocate_extend(adder.can_run)
        self._batch = adder.can_run
        return adder.can_run

    def _calc_priority(self) -> None:
        """``SchedulePolicy.calc_priority`` for ``lpm`` (``fcfs`` keeps the queue as it is)."""
        waiting, pool = self.waiting, self.pool
        if self.config.schedule_policy != "lpm" or not pool.enable_prefix_caching or \
                len(waiting) > LPM_MAX_WAITING:
            return
        queue_tree = RadixTree(1)  # RadixCache.create_simulated(): the waiting queue's prefixes
        last: set[_Req] = set()
        for r in waiting:  # _compute_prefix_matches: the whole fill, then at most all but one
            matched, _ = pool.match_prefix(r.key, r.fill)
            r.lpm_tokens = min(matched, r.fill - 1)
            if matched <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                if queue_tree.match(r.key, r.fill)[0] >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    last.add(r)
                else:
                    queue_tree.insert(r.key, r.fill, [], 0)
        self.waiting = deque(sorted(waiting, key=lambda r: float("inf") if r in last else -r.lpm_tokens))

    def _allocate_extend(self, batch: list[_Req]) -> None:
        """``ScheduleBatch.prepare_for_extend`` (``alloc_for_extend``): evict what the batch
        needs (paged: a page more per request), then give each request its pages."""
        pool, ps = self.pool, self.pool.page_size
        total = sum(r.extend for r in batch)
        pool.evict_for(total if ps == 1 else total + len(batch) * ps)
        for r in batch:
            if r.seq_id >= 0:  # the chunked request's next chunk
                pool.extend(r.seq_id, r.computed + r.extend)
                continue
            r.seq_id = self._next_seq_id
            self._next_seq_id += 1
            assert r.node is not None
            pool.admit(r.seq_id, r.key, r.node, r.prefix, r.prefix + r.extend, r.final_tokens)
            r.computed = r.prefix
            self._count_admission(r)

    def _count_admission(self, r: _Req) -> None:
        """The report's prefix-cache figures: a group's first admission counts toward the hit
        rate (the workload's sharing); later ones (after a retraction; parallel samples finding
        their prompt) only in ``readmission_hit_tokens``."""
        g = r.group
        g.num_admissions += 1
        g.seq_ids.append(r.seq_id)  # the group's sequences holding KV
        if g.status is Status.WAITING:
            g.status = Status.PREFILLING
        if not self.newly_admitted or self.newly_admitted[-1] is not g:  # samples come together
            self.newly_admitted.append(g)
        if g.num_admissions > 1:
            g.readmission_hit_tokens += r.prefix
            self.readmission_hit_tokens += r.prefix
            return
        query = r.key.prompt_tokens if self.pool.enable_prefix_caching and g.request.prefix_ids else 0
        g.prefix_hit_tokens, g.prefix_query_tokens = r.prefix, query
        self.prefix_hit_tokens += r.prefix
        self.prefix_query_tokens += query

    def _reserve(self) -> int:
        """Σ over the decode batch of min(max_new_tokens − generated, CLIP_MAX_NEW_TOKENS)."""
        d, heap = self.decode_counter, self._cap_heap
        while heap and heap[0][0] <= d:  # requests whose remaining tokens fell to CLIP
            _, _, epoch, r = heapq.heappop(heap)
            if r.epoch == epoch and r.capped:
                r.capped = False
                self._cap_n -= 1
                self._lin_n += 1
                self._lin_ends += r.end
        return self._lin_ends - d * self._lin_n + self.config.clip_max_new_tokens * self._cap_n

    def _update_running_batch(self) -> bool:
        """``Scheduler.update_running_batch``: filter finished requests, check the next step's KV
        (retract, or decay the ratio) and allocate it; False if there is no decode batch."""
        initial = len(self._running) + self._unfiltered
        self._unfiltered = 0
        if not self._running:
            self._batch_is_full = False
            return False
        pool, ps = self.pool, self.pool.page_size
        if not self._decode_fits(pool.lockstep_pages_needed() * ps):
            self._retract()
        else:
            self._ratio_decays += 1
        if len(self._running) < initial:
            self._batch_is_full = False
        pool.evict_for(len(self._running) * ps)  # alloc_for_decode (paged: a page each, at most)
        pool.lockstep_step()
        return True

    def _decode_fits(self, num_tokens: int) -> bool:
        """``check_decode_mem``: evict the shortfall, then whether ``num_tokens`` are free."""
        self.pool.evict_for(num_tokens)
        return self.pool.available_tokens() >= num_tokens

    def _retract(self) -> None:
        """``ScheduleBatch.retract_decode`` and the new ratio it returns."""
        d, ps, cfg = self.decode_counter, self.pool.page_size, self.config
        order = sorted(self._running.values(), reverse=True,
                       key=lambda r: (self._kv_len(r, d) - r.key.prompt_tokens + 1, -r.key.prompt_tokens))
        need = sum(ps for r in order if self._kv_len(r, d) % ps == 0)
        first = True
        while first or not self._decode_fits(need):
            if len(order) == 1:
                break
            first = False
            r = order.pop()
            if self._kv_len(r, d) % ps == 0:
                need -= ps
            self._retract_one(r, d)
            self.pool.evict_for(len(order) * cfg.retract_decode_steps)  # release_req
        # add_request refused what cannot run alone, so the last request always fits (SGLang
        # would abort it)
        assert len(order) > 1 or self._decode_fits(need), "a request alone does not fit the pool"
        self._running = {r.seq_id: r for r in order}  # filter_batch(keep_indices=sorted order)
        generated = sum(self._kv_len(r, d) - r.key.prompt_tokens + 1 for r in order)
        max_new = sum(r.max_new for r in order)
        self._ratio_value = min(1.0, (generated + cfg.retract_decode_steps * len(order)) / (max_new + 1))
        self._ratio_decays = 0

    def _retract_one(self, r: _Req, d: int) -> None:
        length = self._kv_len(r, d)
        self._leave_decode(r, length)
        del self._running[r.seq_id]
        self.pool.release(r.seq_id, length, insert=False)  # release_kv_cache(is_insert=False)
        r.group.seq_ids.remove(r.seq_id)
        r.output = length - r.key.prompt_tokens + 1
        r.fill = r.key.prompt_tokens + r.output  # prompt + generated, recomputed at re-admission
        r.seq_id, r.computed, r.prefix, r.node = -1, 0, 0, None
        r.epoch += 1
        g = r.group
        g.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted.append(g.request_id)
        if r.kind == _WHOLE:
            g.status = Status.WAITING
        self.waiting.append(r)

    # ------------------------------------------------------------------ plans
    def _prefill_plan(self, batch: list[_Req]) -> StepPlan:
        chunks = tuple(PrefillChunk(r.seq_id, r.extend, r.computed, r.computed + r.extend == r.fill)
                       for r in batch)
        details = None
        if self.detail:
            pool = self.pool
            details = tuple(SeqDetail(c.seq_id, c.num_computed_tokens, c.num_tokens, c.context_tokens,
                                      pool.block_table(c.seq_id),
                                      tuple(pool.slot_mapping(c.seq_id, c.num_computed_tokens, c.num_tokens)))
                            for c in chunks)
        return StepPlan(self.step_id, chunks, 0, 0, 0.0, 0, 0, 0, (), 0, (), details)

    def _decode_plan(self) -> StepPlan:
        d, n, s1, s2 = self.decode_counter, self._n_dec, self._s1, self._s2
        details = None
        if self.detail:
            pool, out = self.pool, []
            for r in self._running.values():
                length = self._kv_len(r, d)
                out.append(SeqDetail(r.seq_id, length, 1, length + 1, pool.block_table(r.seq_id),
                                     tuple(pool.slot_mapping(r.seq_id, length, 1))))
            details = tuple(out)
        return StepPlan(self.step_id, (), n, s1 + n, float(s2 + 2 * s1 + n), self._max_context(d) + 1,
                        0, 0, (), 0, tuple(self._preempted), details)

    # ------------------------------------------------------------------ complete
    def complete(self, plan: StepPlan) -> StepOutcome:
        """Apply a step the executor has run (``process_batch_result``)."""
        assert plan.step_id == self.step_id, "complete() must follow its own schedule()"
        self.step_id += 1
        outcome = self._complete_prefill() if plan.prefills else self._complete_decode()
        if not self.has_work:
            self._idle = True
        return outcome

    def _complete_prefill(self) -> StepOutcome:
        """``process_batch_result_prefill``, then what the next ``get_next_batch_to_run`` does
        first: cache the chunked request's tokens (``stash_chunked_request``) and merge the batch
        into the running one; a finished or still-chunked request leaving it clears
        ``batch_is_full``."""
        first: list[Group] = []
        finished: list[Group] = []
        pool, chunked, shrunk = self.pool, self._chunked, False
        for r in self._batch:
            r.computed += r.extend
            if r is chunked:
                continue
            r.output += 1  # the prompt (or prompt + generated) is computed: a token is sampled
            g = r.group
            if r.kind != _PREFIX and not g.first_token_emitted:
                g.first_token_emitted = True
                first.append(g)
            if r.output >= r.max_new:  # check_finished
                pool.release(r.seq_id, r.fill, insert=True)
                self._finish(r, finished)
                shrunk = True
            else:
                pool.cache_unfinished(r.seq_id, r.fill)
                self._start_decode(r)
        if chunked is not None:
            pool.cache_unfinished(chunked.seq_id, chunked.computed, chunked=True)
            shrunk = True
        if shrunk:
            self._batch_is_full = False
        self._batch = []
        if not first and not finished:
            return _NOTHING
        return StepOutcome(tuple(first), tuple(finished))

    def _complete_decode(self) -> StepOutcome:
        """``process_batch_result_decode``: one token each; finished requests go into the tree
        and stay in the batch until the next decode step filters them."""
        n = self._n_dec
        self._s2 += 2 * self._s1 + n
        self._s1 += n
        self.decode_counter += 1
        finished: list[Group] = []
        for r, epoch in self._finishes.pop(self.decode_counter, ()):
            if r.epoch != epoch:
                continue
            self._leave_decode(r, r.final_tokens)
            del self._running[r.seq_id]
            self._unfiltered += 1
            self.pool.release(r.seq_id, r.final_tokens, insert=True)
            self._finish(r, finished)
        if not finished:
            return _NOTHING
        return StepOutcome((), tuple(finished))

    def _finish(self, r: _Req, finished: list[Group]) -> None:
        """A request ended: a parallel-sampling prompt sends its samples; a group ends with its
        last sample."""
        g = r.group
        g.seq_ids.remove(r.seq_id)
        r.seq_id = -1
        r.epoch += 1
        request = g.request
        rid = request.request_id
        if r.kind == _PREFIX:  # TokenizerManager._handle_batch_request: now the n copies
            prompt, out = request.prompt_tokens, request.output_tokens
            for s in range(request.n):
                self.waiting.append(_Req(g, _SAMPLE, self._key(request, (rid, s)), out,
                                         prompt + out - 1, prompt))
            return
        if r.kind == _SAMPLE:
            left = self._samples_left[rid] - 1
            if left:
                self._samples_left[rid] = left
                return
            del self._samples_left[rid]
        g.status = Status.FINISHED
        self.num_finished += 1
        finished.append(g)

    # ------------------------------------------------------------------ decode bookkeeping
    @staticmethod
    def _kv_len(r: _Req, d: int) -> int:
        return r.anchor_len + d - r.anchor_counter

    def _start_decode(self, r: _Req) -> None:
        d, length = self.decode_counter, r.fill
        r.anchor_len, r.anchor_counter = length, d
        r.end = d + r.final_tokens - length
        r.group.status = Status.DECODING
        self._running[r.seq_id] = r
        self._n_dec += 1
        self._s1 += length
        self._s2 += length * length
        heapq.heappush(self._max_heap, (d - length, r.seq_id, r.epoch, r))
        pending = self._finishes.get(r.end)
        if pending is None:
            self._finishes[r.end] = [(r, r.epoch)]
            heapq.heappush(self._finish_heap, r.end)
        else:
            pending.append((r, r.epoch))
        clip = self.config.clip_max_new_tokens
        if r.end - d > clip:  # reserves CLIP until it has CLIP tokens left to generate
            r.capped = True
            self._cap_n += 1
            heapq.heappush(self._cap_heap, (r.end - clip, r.seq_id, r.epoch, r))
        else:
            r.capped = False
            self._lin_n += 1
            self._lin_ends += r.end
        self.pool.start_lockstep(r.seq_id)

    def _leave_decode(self, r: _Req, length: int) -> None:
        self._n_dec -= 1
        self._s1 -= length
        self._s2 -= length * length
        if r.capped:
            self._cap_n -= 1
        else:
            self._lin_n -= 1
            self._lin_ends -= r.end

    def _max_context(self, d: int) -> int:
        heap = self._max_heap
        while heap:
            key, _, epoch, r = heap[0]
            if r.epoch == epoch:
                return d - key
            heapq.heappop(heap)
        return 0

    # ------------------------------------------------------------------ quiet runs
    def is_quiet(self, plan: StepPlan) -> bool:
        """Whether ``plan`` may start a quiet run: a decode step that retracted nothing, with no
        chunked request and no prefill to try (nothing waiting, or ``batch_is_full``)."""
        return not (plan.prefills or plan.preempted or self.detail or not plan.num_decode_seqs
                    or self._chunked is not None or (self.waiting and not self._batch_is_full))

    def steps_to_next_finish(self) -> int:
        """Steps from the one just scheduled to the first that finishes a request, inclusive."""
        d = self.decode_counter
        heap, finishes = self._finish_heap, self._finishes
        while heap and (heap[0] <= d or heap[0] not in finishes):
            heapq.heappop(heap)
        return heap[0] - d if heap else 1 << 62

    def quiet_run(self, plan: StepPlan, limit: int) -> int:
        """How many steps, ``plan`` first, are sure to be the same decode step (up to ``limit``).

        The batch stays the same until a finish (that step ends the run) or a step whose KV is
        short, which retracts (it is not part of the run): step j (j >= 1) takes the pages its
        sequences' next tokens start, and free + evictable tokens only shrink by what the steps
        take (eviction moves evictable tokens to free). Nothing joins: no prefill is tried while
        nothing waits or ``batch_is_full`` holds, and neither changes before a finish or a
        retraction (an arrival is the engine's to cut the run for).
        """
        limit = min(limit, self.steps_to_next_finish())
        if limit <= 1:
            return max(limit, 1)
        pool, ps, n = self.pool, self.pool.page_size, self._n_dec
        left = pool.available_tokens() + pool.evictable_tokens  # after step 0 took its pages
        if ps == 1:  # every step takes n tokens: step j fails once left - (j-1)·n < n
            return min(limit, left // n + 1)
        cycle = n * ps  # every sequence takes one page per ps steps
        j = 1 + left // cycle * ps  # whole cycles that fit whatever their order within
        if j >= limit:
            return limit
        left %= cycle
        while j < limit:  # less than a cycle left: it fails within ps steps
            need = pool.lockstep_pages_needed(j - 1) * ps
            if left < need:
                return j
            left -= need
            j += 1
        return limit

    def advance_quiet(self, plan: StepPlan, k: int,
                      record: Callable[[int, int], None] | None = None) -> StepOutcome:
        """Complete ``plan`` and the ``k - 1`` identical steps after it, as ``k`` alternations of
        :meth:`schedule` and :meth:`complete` would: each later step's evictions and page
        allocation at its step, in order, then the last step's finishes.

        ``k`` must not exceed :meth:`quiet_run`. ``record(j, written_tokens)``, if given, is called
        after step ``j`` (0-based) with the allocator in its state after that step, for the first
        step, each step that took pages (every step at page_size 1) and the last step.
        """
        assert plan.step_id == self.step_id, "advance_quiet() must follow its own schedule()"
        pool, ps = self.pool, self.pool.page_size
        n, s1 = self._n_dec, self._s1
        if record is not None and k > 1:
            record(0, s1 + n)
        evict, step, pages_needed = pool.evict_for, pool.lockstep_step, pool.lockstep_pages_needed
        for j in range(1, k):  # step j's update_running_batch: check, decay, allocate
            need = pages_needed()
            if pool.free_pages < n:  # else both evictions below have nothing to do
                evict(need * ps)
                evict(n * ps)
            step()
            if need and record is not None and j < k - 1:
                record(j, s1 + n * (j + 1))
        m = k - 1  # steps 0 .. k-2 completed in closed form, step k-1 by complete()
        self._ratio_decays += m
        self.step_id += m
        self._s2 += m * (2 * s1 + n) + n * m * (m - 1)
        self._s1 += m * n
        self.decode_counter += m
        outcome = self.complete(plan._replace(step_id=self.step_id))
        if record is not None:
            record(k - 1, self.written_tokens())
        return outcome


class _PrefillAdder:
    """``PrefillAdder`` for one prefill batch: SGLang's KV, chunk and input budgets.

    ``rem_total_tokens`` = free + evictable − (reserve of the running batch + what the batch
    admitted will take, its future included); ``cur_rem_tokens`` the same without futures.
    Evictable tokens are read live: locking a candidate's cached prefix takes it out.
    """

    def __init__(self, sched: SGLangScheduler, reserve: float) -> None:
        self.pool = sched.pool
        self.page_size = sched.pool.page_size
        self.clip = sched.config.clip_max_new_tokens
        self.available = self.pool.available_tokens()  # nothing is allocated before the batch forms
        self.total_offset = reserve
        self.cur_offset = 0
        self.rem_input = sched.config.max_prefill_tokens
        self.rem_chunk = sched.chunked_prefill_size
        self.can_run: list[_Req] = []
        self.num_new = 0  # waiting requests admitted (the queue's first ones)
        self.new_chunked: _Req | None = None

    def rem_total(self) -> float:
        return self.available + self.pool.evictable_tokens - self.total_offset

    def cur_rem(self) -> int:
        return self.available + self.pool.evictable_tokens - self.cur_offset

    def _ceil(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def _charge(self, extend: int, max_new: int) -> None:
        """``_update_prefill_budget``: pages of the extend, the future tokens, one page more."""
        extend = self._ceil(extend)
        self.total_offset += extend + max_new + self.page_size
        self.cur_offset += extend + self.page_size
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend

    def budget_state(self) -> int:
        if self.rem_total() <= 0 or self.cur_rem() <= 0:
            return _NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return _OTHER
        return _CONTINUE

    def add_chunked_req(self, req: _Req) -> _Req | None:
        """The chunked request's next chunk: the rest, capped by the chunk budget and the KV
        budget (the chunk budget when the KV one is gone: "The chunked_req must be added to the
        list; otherwise, it will cause a memory leak"); the request while more remain.

        One departure: when the KV budget is gone because of the running batch's reserve, the
        chunk budget may ask more pages than the pool has free and evictable, and SGLang then
        stops with "Prefill out of memory" (``alloc_token_slots``). The chunk is cut to what the
        pool holds (a page kept, as ``alloc_for_extend`` needs), or waits a step when nothing is
        left, so that the simulation goes on where the server would have failed."""
        assert self.rem_chunk is not None
        limit = min(self.rem_chunk, int(self.rem_total()))
        if limit <= 0:
            ps = self.page_size
            held = (self.available + self.pool.evictable_tokens) // ps * ps - ps
            limit = min(self.rem_chunk, held)
            if limit <= 0:
                return req  # not in this batch: it keeps its pages and tries next step
        left = req.fill - req.computed
        truncated = left > limit
        req.extend = min(left, limit)
        self.can_run.append(req)
        self._charge(req.extend, 0 if truncated else min(req.max_new, self.clip))
        return req if truncated else None

    def add_one_req(self, req: _Req) -> int:
        """A waiting request (its prefix matched): whole, as a first chunk, or not at all."""
        ps = self.page_size
        max_new = min(max(req.max_new - req.output, 0), self.clip)
        extend = req.fill - req.prefix
        total = extend + max_new + ps
        input_tokens = self._ceil(extend)
        if total >= self.rem_total():
            return _NO_TOKEN
        if self.rem_chunk is None and self.can_run and input_tokens >= self.rem_input:
            return _OTHER  # without chunking a first request may exceed max_prefill_tokens
        pool = self.pool
        node = req.node
        assert node is not None
        pool.inc_lock_ref(node)  # _lock_node: the cached prefix is not evictable budget
        try:
            if total >= self.rem_total():
                return _NO_TOKEN
            if self.rem_chunk is None or input_tokens <= self.rem_chunk:
                req.extend = extend
                self._admit(req)
                self._charge(input_tokens, min(req.max_new, self.clip))
            else:
                end = (self.rem_chunk // ps * ps + req.prefix) // ps * ps
                if end <= req.prefix:
                    return _OTHER
                req.extend = end - req.prefix
                self._admit(req)
                self.new_chunked = req
                self._charge(req.extend, 0)
        finally:
            pool.dec_lock_ref(node)
        return self.budget_state()

    def _admit(self, req: _Req) -> None:
        assert req.node is not None
        self.pool.inc_lock_ref(req.node)  # _req_inc_lock_ref: the request holds its prefix
        self.can_run.append(req)
        self.num_new += 1


def _check_sglang_knobs(cfg: SchedulerConfig) -> None:
    if cfg.schedule_policy not in ("fcfs", "lpm"):
        raise ValueError(f"schedule_policy must be 'fcfs' or 'lpm', got {cfg.schedule_policy!r}")
    for name in ("max_prefill_tokens", "new_token_ratio_decay_steps", "clip_max_new_tokens"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.retract_decode_steps < 0:
        raise ValueError(f"retract_decode_steps must be >= 0, got {cfg.retract_decode_steps}")
    if not cfg.schedule_conservativeness > 0 or not cfg.init_new_token_ratio > 0:
        raise ValueError("schedule_conservativeness and init_new_token_ratio must be positive")
    if not 0 <= cfg.min_new_token_ratio_factor <= 1:
        raise ValueError("min_new_token_ratio_factor must be in [0, 1], got "
                         f"{cfg.min_new_token_ratio_factor}")


# ---------------------------------------------------------------------- SGLang's defaults
def sglang_defaults(gpu_memory_gib: float, *, tensor_parallel: int = 1) -> dict[str, object]:
    """SGLang's server defaults that depend on the GPU (``ServerArgs._handle_gpu_memory_settings``,
    python/sglang/srt/server_args.py): ``chunked_prefill_size`` by GPU memory, and
    ``mem_fraction_static`` = (memory − reserved) / memory with reserved = 512 MiB + 1.5 MiB per
    chunk token (at least 2048) + 2 MiB per CUDA-graph batch size (SGLang's default
    ``cuda_graph_max_bs`` for the GPU and ``tensor_parallel``) + TP/8 GiB, at least 10 GiB on GPUs
    above 60 GB, rounded to 3 decimals. SGLang measures memory in MiB (``get_device_memory_capacity``);
    ``gpu_memory_gib`` × 1024 stands for it. Not covered: speculative decoding, DP attention,
    piecewise CUDA graphs, multimodal models.

    ``max_running_requests`` has no fixed default: see :func:`sglang_max_running_requests`.
    """
    if not gpu_memory_gib > 0:
        raise ValueError(f"gpu_memory_gib must be positive, got {gpu_memory_gib}")
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    mib = gpu_memory_gib * 1024
    small_tp = tensor_parallel < 4
    if mib < 20 * 1024:  # T4, 4080
        chunk, graph_bs = 2048, 8
    elif mib < 35 * 1024:  # A10, 4090, 5090
        chunk, graph_bs = 2048, 24 if small_tp else 80
    elif mib < 60 * 1024:  # A100 40GB, L40
        chunk, graph_bs = 4096, 32 if small_tp else 160
    elif mib < 160 * 1024:  # H100, A100 80GB, H20, H200
        chunk, graph_bs = 8192, 256 if small_tp else 512
    else:  # B200, MI300
        chunk, graph_bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tensor_parallel / 8 * 1024
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return {"chunked_prefill_size": chunk, "mem_fraction_static": round((mib - reserved) / mib, 3)}


def sglang_max_running_requests(capacity_tokens: int, context_len: int,
                                requested: int | None = None) -> int:
    """SGLang's ``max_running_requests`` for a KV pool of ``capacity_tokens``
    (``ModelRunner._resolve_max_num_reqs``, python/sglang/srt/model_executor/model_runner.py):
    the request pool holds int(capacity / context_len × 512) clamped to [2048, 4096]; unset, the
    limit is the smaller of that and capacity // 2; set, the smaller of it and capacity // 2."""
    if requested is not None:
        return max(min(requested, capacity_tokens // 2), 1)
    estimated = max(min(int(capacity_tokens / context_len * 512), 4096), 2048)
    return max(min(estimated, capacity_tokens // 2), 1)
