"""TensorRT-LLM's scheduling policy (``engine: trtllm``), as its PyTorch backend schedules.

Read from NVIDIA/TensorRT-LLM (the source index's stored versions; see "Sources" below). One step
of the PyTorch executor (``PyExecutor``) is ``SimpleScheduler.schedule_request``
(tensorrt_llm/_torch/pyexecutor/scheduler.py): a *capacity* scheduler picks the active requests
whose KV blocks fit, then a *micro-batch* scheduler cuts that list to ``max_batch_size`` requests
and ``max_num_tokens`` tokens::

    active requests, in arrival order (running first: they arrived first)
    ┌───────┬───────┬────────────┬────────┬────────┐
    │ gen A │ gen B │ ctx C (2nd │ new D  │ new E  │ ...  ≤ max_batch_size requests
    └───────┴───────┴─chunk)─────┴────────┴────────┘
    capacity (KV blocks)          micro-batch (tokens)
      GUARANTEED_NO_EVICT:          each gen: 1 token
        D fits if its whole          contexts: chunked context off -> the whole rest must fit,
        sequence's blocks fit          else stop; on -> first come first served chunks of the
        beside every running           budget left, a cut chunk rounded down to tokens_per_block
        request's to completion
      MAX_UTILIZATION: D fits if
        its prompt's blocks fit now;
        a gen short of a block pauses
        the newest started request

The rules, each with the function it comes from:

* **GUARANTEED_NO_EVICT** (the default: ``SchedulerConfig.capacity_scheduler_policy``,
  tensorrt_llm/llmapi/llm_args.py; ``trtllm-serve`` sets it explicitly, tensorrt_llm/commands/
  serve.py ``get_llm_args``). ``GuaranteedNoEvictScheduler::impl`` (cpp/tensorrt_llm/
  batch_manager/capacityScheduler.cpp): every generating request is scheduled, and the blocks it
  still needs to finish are taken off the free blocks (``NoEvictScheduledBlocksManager``,
  scheduledBlocksManager.cpp: ``getRemainingBlocksToCompletion``); then context requests, in
  order, each needing its remaining blocks to completion; the first that does not fit stops the
  pass. ``KVCacheManager::getRemainingBlocksToCompletion`` (kvCacheManager.cpp) is
  ``ceil((prompt + max_new_tokens) / tokens_per_block)`` less the blocks the request holds, 0 held
  for a request not started: a prefix-cache hit is not credited at admission. Summed over the
  running requests, the blocks a new request may take are ``num_blocks − Σ ceil((P + O) / B) +
  S``, S the blocks held by more than one request counted once per extra holder (a shared block
  is in every holder's count): kept as one sum, O(1) per admission. So no running request is
  ever short of a block: nothing is preempted.
* **MAX_UTILIZATION**. ``MaxUtilizationScheduler::operator()`` (capacityScheduler.cpp): requests
  in order, each needing the blocks of its next step (``getNeededBlocksOneStep``: a generating
  request one block at a block boundary, a context request's first chunk the blocks of its whole
  prompt, a later chunk none) against the free blocks at the start of the step
  (``MaxUtilizationScheduledBlocksManager``). A request that does not fit makes the scheduler
  pause the last *started* request (generating, or a context past its first chunk) at or after
  it (``pausedRequests``, ``schedulingRemoveSequence``) and retry; with none, the pass stops. A
  paused request moves its generated tokens into its prompt (``LlmRequest::pause``: prompt + the
  tokens generated, back to the first context chunk) and frees its blocks
  (``PyExecutor._pause_requests``): it recomputes them. The requests after it are not reached in
  that step, so nothing new is admitted in a step that paused.
* **The micro-batch** (``MicroBatchScheduler::operator()``, cpp/tensorrt_llm/batch_manager/
  microBatchScheduler.cpp; ``BindMicroBatchScheduler(max_batch_size, max_num_tokens,
  ctx_chunk_config)``, scheduler.py): at most ``max_batch_size`` requests; a generating request
  takes one token; without chunked context (``enable_chunked_prefill`` False, the default) a
  context request takes all its tokens (prompt, or prompt + generated after a pause) and the
  first that does not fit the budget left stops the contexts; with it, the contexts are chunked
  after every generating request has been counted, first come first served
  (``setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>``, the default ``context_chunking_policy``:
  tensorrt_llm/_torch/pyexecutor/py_executor_creator.py ``create_py_executor``): each takes
  min(its remaining tokens, the budget left, ``max_num_tokens``), a cut chunk rounded down to a
  multiple of ``chunk_unit_size`` = ``tokens_per_block``; a chunk of 0 is not scheduled.
* **KV allocation** (``KVCacheManager.prepare_resources``, tensorrt_llm/_torch/pyexecutor/
  resource_manager.py): a context request's first chunk allocates the blocks of its whole prompt
  (``add_sequence(request_id, prompt_len, ...)``); a generating request adds one token a step
  (``add_token``), a block at each boundary. With block reuse (``KvCacheConfig.enable_block_reuse``,
  on by default) the prompt's cached blocks are shared and not computed: the chunk's tokens start
  after them, but the micro-batch budget was charged the chunk as if nothing were cached (it is
  sized before the blocks are found), and a prompt's blocks are stored for reuse when its context
  ends (``storeContextBlocks``), not while it is being computed.
* **Waiting for a prefix** (``beneficialToSkip``, capacityScheduler.cpp, block reuse on): a
  context request's first chunk is skipped for the step (the requests after it still go) when
  the first block it would compute is one that a context scheduled before it in the step, or a
  chunked context still running, is computing: next step it finds that block cached.
* **Requests** (tensorrt_llm/llmapi/llm.py ``_check_arguments``; tests/unittest/llmapi/
  test_llm.py ``test_max_num_token_check``): without chunked context a prompt longer than
  ``max_num_tokens`` is refused ("should not exceed max_num_tokens"); prompt + output beyond
  ``max_seq_len`` is refused (kvplan's max_model_len check). Beam search and parallel sampling
  (``n`` > 1: TensorRT-LLM's child requests) are not modelled: such a request is refused.

Not modelled: the overlap scheduler (on by default: a step is scheduled while the previous one
runs, so a finished request frees its blocks a step later; a latency matter), KV cache manager
V2, partial block reuse (``enable_partial_reuse``: a partly matching block is copied), reuse of a
paused request's generated blocks, ``LlmRequest::pause``'s cut of the new prompt at
``max_input_len``, priorities, LoRA pages, attention data parallelism.

Everything else — the decode counter, growth events, the finish heap, the Σ context totals,
quiet runs — is :class:`~simulator.scheduler.core.Scheduler`'s. Quiet runs hold as they do for
vLLM: in a decode-only step nothing was admitted and nothing was ready to chunk; in the run no
block is freed, so neither the no-evict sum (constant: nothing joins or leaves) nor the free
blocks (only fewer) can let the waiting head in; a growth that could fail ends the run (the
core's count), under MAX_UTILIZATION its pause happens in an ordinary step.

Sources (NVIDIA/TensorRT-LLM, the versions the source index holds): capacityScheduler.cpp @
02a10fed0dbf5db74c7da035be9c5fbef6d2df7a; microBatchScheduler.cpp @
0a949d3128bfaf4ddedefb0259125622a9ec830f; scheduledBlocksManager.cpp @
ca64fd93be51dc8dae7e87fd7018976517acd586; tensorrt_llm/_torch/pyexecutor/scheduler.py @
034fffb0900632b2aefdec1ce9a5b5cbe63d22ba; py_executor_creator.py @
000429d57d42ecc8d481e5cdf653fff238be5974; tensorrt_llm/commands/serve.py @
00209af149e7774406881a37283dce303571eb11; kvCacheManager.cpp, resource_manager.py, _util.py,
llm_args.py, llmRequest.h: stored versions read by function (their commits are not named by the
index's text search). The defaults per release are in :data:`TRTLLM_DEFAULTS`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from operator import attrgetter

from simulator.errors import KvplanError
from simulator.kv.allocator import KVAllocator
from simulator.kv.paged import PagedAllocator
from simulator.kv.sizing import KVCapacity
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.core import Scheduler
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.scheduler.state import Group, Status, StepOutcome
from workloads.request import Request

_by_admission = attrgetter("admit_order")
GIB = 1 << 30


# ----------------------------------------------------------------------------- defaults
@dataclass(frozen=True)
class TRTLLMDefaults:
    """What ``trtllm-serve MODEL`` starts with when a knob is not given (PyTorch backend)."""

    max_batch_size: int  # trtllm-serve --max_batch_size: BuildConfig's max_batch_size
    max_num_tokens: int  # trtllm-serve --max_num_tokens: BuildConfig's max_num_tokens
    free_gpu_memory_fraction: float  # --kv_cache_free_gpu_memory_fraction / KvCacheConfig
    tokens_per_block: int  # KvCacheConfig.tokens_per_block
    enable_chunked_prefill: bool  # --enable_chunked_prefill / BaseLlmArgs
    enable_block_reuse: bool  # KvCacheConfig.enable_block_reuse
    capacity_scheduler_policy: str  # SchedulerConfig.capacity_scheduler_policy
    source: str


# Each release's defaults. The values are the same in every source read: trtllm-serve's options
# (tensorrt_llm/commands/serve.py @ 00209af1: --max_batch_size / --max_num_tokens default to
# BuildConfig's fields, --kv_cache_free_gpu_memory_fraction 0.9, --enable_chunked_prefill a flag
# off by default, GUARANTEED_NO_EVICT set in get_llm_args); BuildConfig (tensorrt_llm/builder.py @
# 008b2b8d: max_batch_size 2048, max_num_tokens 8192, max_seq_len None: from the model);
# llm_args.py (BaseLlmArgs max_batch_size 2048, max_num_tokens 8192, enable_chunked_prefill False;
# KvCacheConfig free_gpu_memory_fraction 0.9, tokens_per_block 32, enable_block_reuse True;
# SchedulerConfig GUARANTEED_NO_EVICT); the release documentation's KvCacheConfig reference
# (nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/KvCacheConfig.html: 0.9, 32). The
# index holds versions by commit, not by release tag: no value here was read at a tag.
_SOURCE = ("trtllm-serve (tensorrt_llm/commands/serve.py), BuildConfig, KvCacheConfig and "
           "SchedulerConfig (tensorrt_llm/llmapi/llm_args.py)")
TRTLLM_DEFAULTS: dict[str, TRTLLMDefaults] = {
    version: TRTLLMDefaults(max_batch_size=2048, max_num_tokens=8192, free_gpu_memory_fraction=0.9,
                            tokens_per_block=32, enable_chunked_prefill=False,
                            enable_block_reuse=True, capacity_scheduler_policy="GUARANTEED_NO_EVICT",
                            source=_SOURCE)
    for version in ("1.0", "1.2")
}
TRTLLM_VERSIONS: tuple[str, ...] = tuple(TRTLLM_DEFAULTS)
TRTLLM_NEWEST = "1.2"  # the release kvplan follows when engine_version is not given


def trtllm_version(text: str) -> str:
    """The release of :data:`TRTLLM_DEFAULTS` that ``text`` names (``1.2``, ``1.2.1``,
    ``v1.0.0``, ``1.2.0rc6``); ValueError naming the known ones otherwise."""
    parts = text.strip().lower().removeprefix("v").split(".")
    key = ".".join(parts[:2])
    if len(parts) >= 2 and key in TRTLLM_DEFAULTS:
        return key
    raise ValueError(f"engine_version {text!r}: kvplan knows TensorRT-LLM {', '.join(TRTLLM_VERSIONS)} "
                     "(a patch release or release candidate of one of them is read as it)")


def trtllm_defaults(version: str | None = None) -> TRTLLMDefaults:
    """The defaults of TensorRT-LLM ``version`` (None: the newest kvplan follows)."""
    return TRTLLM_DEFAULTS[trtllm_version(version) if version else TRTLLM_NEWEST]


# ----------------------------------------------------------------------------- KV pool sizing
def trtllm_capacity(cap: KVCapacity, free_gpu_memory_fraction: float) -> KVCapacity:
    """The KV pool as TensorRT-LLM's PyTorch backend sizes it, from ``cap`` sized with all of HBM
    (``gpu_memory_utilization`` 1): weights, peak activations and non-torch memory out of HBM.

    ``KvCacheCreator.configure_kv_cache_capacity`` (tensorrt_llm/_torch/pyexecutor/_util.py) runs
    dummy requests of ``max_num_tokens`` tokens, measures the peak (torch + non-torch) and sizes
    the KV memory in ``_cal_max_memory``: ``(total GPU memory − peak + the estimation run's KV) ×
    free_gpu_memory_fraction``, then ``max_tokens = memory // kv bytes per token``;
    ``KVCacheManager.calculate_max_num_blocks`` (resource_manager.py) makes that
    ``ceil(max_tokens / tokens_per_block)`` blocks. So the fraction is of the memory *free after*
    the model and its activations, unlike vLLM's ``gpu_memory_utilization`` (of all HBM)."""
    if not 0 < free_gpu_memory_fraction < 1:
        # KVCacheManager.calculate_max_num_blocks asserts freeMemFraction < 1.0
        raise KvplanError(f"free_gpu_memory_fraction (gpu_memory_utilization) must be in (0, 1) for "
                          f"engine trtllm, got {free_gpu_memory_fraction}")
    free = cap.available_kv_bytes
    kv_bytes = int(free * free_gpu_memory_fraction)
    max_tokens = kv_bytes // cap.bytes_per_token
    num_blocks = -(-max_tokens // cap.block_size)
    if num_blocks < 1:
        raise KvplanError(f"no room for the KV cache of {cap.model_name} on {cap.gpu_name}: "
                          f"{free_gpu_memory_fraction:g} × {free / GIB:.2f} GiB free leaves no block")
    tokens = num_blocks * cap.block_size
    notes = [n for n in cap.notes if "one full-length request does not fit" not in n]
    notes.append(f"TensorRT-LLM KV pool: free_gpu_memory_fraction {free_gpu_memory_fraction:g} × "
                 f"{free / GIB:.2f} GiB free after weights, activations and non-torch memory = "
                 f"{kv_bytes / GIB:.2f} GiB: max_tokens {max_tokens:,}, {num_blocks:,} blocks of "
                 f"{cap.block_size} (tensorrt_llm/_torch/pyexecutor/_util.py _cal_max_memory)")
    # the pool is whole blocks: ceil(max_tokens / tokens_per_block) of them, a little over kv_bytes
    return dataclasses.replace(cap, available_kv_bytes=num_blocks * cap.block_bytes, num_blocks=num_blocks,
                               capacity_tokens=tokens, max_concurrency=tokens / cap.max_model_len,
                               notes=tuple(notes))


def format_trtllm_log(cap: KVCapacity, free_gpu_memory_fraction: float) -> str:
    """The capacity as TensorRT-LLM's start-up log reports it (_util.py ``_cal_max_memory`` and
    resource_manager.py ``KVCacheManager.__init__``), one line each."""
    return (f"Peak memory during memory usage profiling (torch + non-torch): "
            f"{(cap.weight_bytes + cap.activation_bytes + cap.non_torch_bytes) / GIB:.2f} GiB, "
            f"available KV cache memory when calculating max tokens: {cap.available_kv_bytes / GIB:.2f} GiB, "
            f"fraction is set {free_gpu_memory_fraction:g}\n"
            f"max_tokens={cap.capacity_tokens:,}, blocks_in_primary_pool={cap.num_blocks:,}, "
            f"tokens_per_block={cap.block_size}")


# ----------------------------------------------------------------------------- the scheduler
class TRTLLMScheduler(Scheduler):
    """TensorRT-LLM's capacity + micro-batch scheduling behind :class:`Scheduler`'s interface
    (the module docstring)."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                 keep_groups: bool = True):
        if config.preemption_mode == "swap":
            raise ValueError("preemption_mode swap: TensorRT-LLM pauses a request and recomputes it")
        if not isinstance(allocator, PagedAllocator):
            raise ValueError("engine trtllm runs TensorRT-LLM's block pool: allocator paged, not "
                             f"{type(allocator).__name__}")
        super().__init__(allocator, config, detail=detail, keep_groups=keep_groups)
        self.pool: PagedAllocator = allocator
        self.no_evict = config.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"
        self._reuse = config.enable_prefix_caching and allocator.enable_prefix_caching
        # GUARANTEED_NO_EVICT: Σ over running requests of the blocks of their whole sequence
        self.reserved_blocks = 0
        # first block a running context computes (beneficialToSkip), by request id
        self._contributes: dict[int, int] = {}

    # ------------------------------------------------------------------ requests
    def sequence_blocks(self, g: Group) -> int:
        """Blocks of the whole sequence, ``ceil((prompt + max_new_tokens) / tokens_per_block)``
        (kvCacheManager.cpp ``getRemainingBlocksToCompletion``; a pause moves generated tokens
        from max_new_tokens into the prompt, so the sum stays)."""
        r = g.request
        return -(-(r.prompt_tokens + r.output_tokens) // self.config.block_size)

    def add_request(self, request: Request, *, queue: bool = True) -> Group:
        """As :meth:`Scheduler.add_request`, and refused as TensorRT-LLM refuses (module
        docstring): beams or samples, a prompt beyond ``max_num_tokens`` without chunked context,
        a sequence whose blocks exceed the pool under GUARANTEED_NO_EVICT."""
        cfg = self.config
        if request.beam_width > 1 or request.n > 1:
            g = Group(request, request.prompt_tokens + request.output_tokens - 1)
            if self.keep_groups:
                self.groups[request.request_id] = g
            return self._reject(g, f"trtllm: beam search and parallel sampling are not modelled for "
                                   f"engine trtllm (beam_width {request.beam_width}, n {request.n})")
        g = super().add_request(request, queue=False)
        if g.status is Status.REJECTED:
            return g
        if not cfg.enable_chunked_prefill and request.prompt_tokens > cfg.max_num_batched_tokens:
            # tensorrt_llm/llmapi/llm.py _check_arguments
            return self._reject(g, f"max_num_tokens: the prompt length ({request.prompt_tokens}) "
                                   f"should not exceed max_num_tokens ({cfg.max_num_batched_tokens}) "
                                   "without chunked context")
        if self.no_evict and self.sequence_blocks(g) > self.pool.num_blocks:
            return self._reject(g, f"kv_capacity: the whole sequence needs {self.sequence_blocks(g)} "
                                   f"blocks, the pool has {self.pool.num_blocks} (GUARANTEED_NO_EVICT)")
        if queue:
            self.waiting.append(g)
        return g

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepPlan:
        """Decide the next step (``SimpleScheduler.schedule_request``). Valid until the matching
        :meth:`complete`."""
        d = self.decode_counter
        self._preempted, self._copies = [], []
        self.newly_admitted = []
        self._copy_tokens, self._pending_copy_tokens = self._pending_copy_tokens, 0
        self._swap_out_tokens = self._swap_in_tokens = 0
        self._grow_running(d)
        candidates = self._capacity_pass() if self.waiting and not self._preempted else []
        chunks = self._micro_batch(candidates)
        return self._plan(d, chunks)

    def _grow_running(self, d: int) -> None:
        """The generating requests' blocks of step ``d``. Under GUARANTEED_NO_EVICT they cannot
        run short (their blocks to completion are reserved). Under MAX_UTILIZATION a request short
        of a block pauses the newest started request (the last started one at or after it in the
        active list: every request older than it has been scheduled already), itself last
        (:meth:`Scheduler._grow` preempts the newest running group until the block fits); the
        growths run in admission order when they may not all fit, in filing order otherwise
        (which block ids they take is all that order decides then)."""
        pending = self._events.pop(d, None)
        if pending is None:
            return
        decoding = Status.DECODING
        grows = [g for _, g, epoch, token in pending
                 if g.epoch == epoch and g.status is decoding and token == g.grow_token]
        if len(grows) > self.pool.free_blocks_for_growth():
            grows.sort(key=_by_admission)
        for g in grows:
            if g.status is decoding:  # not paused by an earlier growth
                self._grow(g, d)

    def _capacity_pass(self) -> list[Group]:
        """The waiting requests the capacity scheduler fits this step, in order (first chunk of a
        context request: new, or paused), before the micro-batch cut."""
        cfg, pool, bs = self.config, self.pool, self.config.block_size
        room = cfg.max_num_seqs - len(self.running)
        if room <= 0:
            return []
        if self.no_evict:  # num_blocks − Σ (whole sequence − held) over the running requests
            avail = pool.num_blocks - self.reserved_blocks + pool._dup_slots // bs
        else:  # the free blocks now (this step's growths taken)
            avail = pool.num_free_blocks()
        contributed = set(self._contributes.values()) if self._reuse else set()
        out: list[Group] = []
        # the executor's active list holds at most max_batch_size requests, running ones included
        # (py_executor.py PyExecutor.__init__: max_num_active_requests =
        # model_engine.get_max_num_sequences(), the most it fetches): only the first ``room``
        # waiting requests are in it, whether they are scheduled or skipped
        for i, g in enumerate(self.waiting):
            if i >= room:
                break
            if self._reuse and g.block_hashes:
                key = self._first_new_block(g)
                if key is not None:
                    if key in contributed:
                        continue  # beneficialToSkip: next step it finds the block cached
                    contributed.add(key)
            need = self.sequence_blocks(g) if self.no_evict else -(-g.num_prefill_target // bs)
            if need > avail:
                self.num_kv_refusals += 1
                break
            avail -= need
            out.append(g)
        return out

    def _first_new_block(self, g: Group) -> int | None:
        """The id of the first prompt block ``g`` would compute, if it is a shared one
        (``findNewContextBlock``); None when that block's content is the request's own."""
        hashes = g.block_hashes
        # every cached leading block, the last prompt token's too (the admission's hit stops a
        # block short of a fully cached prompt; the block it then computes is cached already)
        hit = self.pool.lookup(hashes, (len(hashes) + 1) * self.config.block_size) // self.config.block_size
        return hashes[hit] if hit < len(hashes) else None

    def _micro_batch(self, candidates: list[Group]) -> list[PrefillChunk]:
        """The step's context chunks (``MicroBatchScheduler::operator()``): running contexts
        first, then the capacity pass's candidates, within the tokens the decodes leave."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens - self._n_dec
        chunks: list[PrefillChunk] = []
        contexts = [g for g in self.prefilling.values() if g.status is Status.PREFILLING]
        contexts += candidates
        if not contexts:
            return chunks
        unit, cap = cfg.block_size, cfg.max_num_batched_tokens
        admitted: list[Group] = []
        first = True
        for g in contexts:
            rest = g.num_prefill_target - g.num_computed
            if not cfg.enable_chunked_prefill:
                # the whole rest must fit; a context longer than max_num_tokens (a paused one's
                # prompt + generated) runs alone where TensorRT-LLM would fail its TLLM_CHECK
                if rest > budget and not (first and rest > cap):
                    break
                n = rest
            else:  # setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>
                n = min(rest, budget, cap)
                if n < rest:
                    n = n // unit * unit
                if n <= 0:
                    continue
            first = False
            budget -= n
            if g.status is Status.PREFILLING:
                chunks.append(PrefillChunk(g.seq_ids[0], n, g.num_computed,
                                           g.num_computed + n == g.num_prefill_target))
                continue
            chunk = self._admit_one(g, n)
            if chunk is None:
                break
            chunks.append(chunk)
            admitted.append(g)
        if admitted:
            waiting = self.waiting
            for g in admitted:
                if waiting[0] is g:
                    waiting.popleft()
                else:  # a request ahead of it waits for a prefix (beneficialToSkip)
                    waiting.remove(g)
        return chunks

    def _admit_one(self, g: Group, n: int) -> PrefillChunk | None:
        """Start ``g``'s context: the blocks of its whole prompt (``add_sequence``), its cached
        blocks shared; ``n`` is the chunk the budget was charged, computed from the first token
        not cached. None if the pool refuses (the capacity pass makes that impossible)."""
        target = g.num_prefill_target
        hashes = g.block_hashes if self._reuse else ()
        cached = self._cached_prefix(g, target) if hashes else 0
        bs = self.config.block_size
        seq = self._new_seq_id()
        # only the hits are named now: the prompt's other blocks are stored for reuse when its
        # context ends (storeContextBlocks, in complete())
        got = self.pool.allocate(seq, target, g.final_tokens, hashes[:cached // bs])
        if got is None:
            self.num_kv_refusals += 1
            return None
        assert got.num_cached_tokens == cached, (got.num_cached_tokens, cached)
        g.seq_ids = [seq]
        self._start_prefill(g, seq, target, cached)
        self.newly_admitted.append(g)
        self._num_running_seqs += 1
        self._prefill_written += cached
        if self.no_evict:
            self.reserved_blocks += self.sequence_blocks(g)
        if hashes and cached // bs < len(hashes):
            self._contributes[g.request_id] = hashes[cached // bs]
        computed = min(n, target - cached)
        return PrefillChunk(seq, computed, cached, cached + computed == target)

    # ------------------------------------------------------------------ preemption and finishes
    def _preempt(self, g: Group) -> None:
        """MAX_UTILIZATION's pause (``LlmRequest::pause`` + ``_pause_requests``): free the blocks,
        prompt + generated tokens to recompute, back to the waiting queue ahead of the requests
        that arrived after it (it keeps its place in the active list)."""
        if self.no_evict:
            self.reserved_blocks -= self.sequence_blocks(g)
        self._contributes.pop(g.request_id, None)
        super()._preempt(g)

    def _finish(self, g: Group) -> None:
        if self.no_evict:
            self.reserved_blocks -= self.sequence_blocks(g)
        self._contributes.pop(g.request_id, None)
        super()._finish(g)

    # ------------------------------------------------------------------ complete
    def complete(self, plan: StepPlan) -> StepOutcome:
        """As :meth:`Scheduler.complete`; a context that ends stores its prompt's blocks for
        reuse first (``storeContextBlocks``)."""
        if self._reuse:
            for c in plan.prefills:
                if c.samples_token:
                    g = self._prefill_owner[c.seq_id]
                    self._contributes.pop(g.request_id, None)
                    if g.block_hashes:
                        self.pool.cache_blocks(c.seq_id, g.block_hashes, g.num_prefill_target)
        return super().complete(plan)


__all__ = ["TRTLLMDefaults", "TRTLLMScheduler", "TRTLLM_DEFAULTS", "TRTLLM_NEWEST", "TRTLLM_VERSIONS",
           "format_trtllm_log", "trtllm_capacity", "trtllm_defaults", "trtllm_version"]
