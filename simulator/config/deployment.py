"""A scenario resolved into the concrete things a run needs: model, GPU, KV pool, latency model.

Every allocator of a scenario gets the *same* KV memory (``usable_blocks × block_size`` token
slots per replica, from vLLM's capacity formula or ``num_gpu_blocks_override``); they differ only
in how they use it. ``num_blocks`` is the pool as the engine's start-up log counts it; vLLM V1
keeps one of them as its null block (:attr:`Deployment.usable_blocks`).

**Data parallelism** (``data_parallel_size`` = dp): vLLM runs dp engines of ``tensor_parallel``
GPUs, each with its own scheduler, requests and KV cache, behind one front end that picks an
engine per request (vLLM's DP load balancer: router policy ``vllm-dp``); SGLang's DP attention and
TensorRT-LLM's attention DP run one scheduler and KV pool per attention DP rank the same way.
kvplan simulates them as dp replicas for each of the scenario's ``num_replicas``: the built
deployment's ``scenario.num_replicas`` counts engine replicas (``num_replicas × dp``), so runs,
reports and GPU counts (replicas × tensor_parallel) see every DP rank. The MoE layers' own layout
(``moe_tensor_parallel_size`` × ``moe_expert_parallel_size`` over the dp × tp GPUs, and
``moe_dispatch``) sizes each rank's experts and costs their collectives
(simulator/kv/expert_parallel.py). What this approximates: with an MoE model the engines step
their DP ranks together — every MoE layer is a collective across them, and an idle rank runs
dummy batches (vllm/v1/engine/core.py ``DPEngineCoreProc``) — so a step lasts as long as the
slowest rank's; kvplan's replicas step independently, each costed as if the other DP ranks
decoded as many sequences as it does (simulator/latency/roofline.py).

A deployment vLLM would refuse to start (simulator/config/refusals.py: a block size it does not take, a
max_model_len beyond the model's window or beyond the KV memory, an override larger than the GPU)
is a KvplanError saying why and what would make it start, unless the scenario says
``allow_refused: true``. What remains worth knowing (refusals allowed, block sizes its fastest
kernel does not take, ...) is in :attr:`Deployment.warnings`, emitted once as KvplanWarning when
the deployment is built and listed in run.json's notes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from simulator.errors import KvplanError, warn_user
from simulator.kv.allocator import KVAllocator
from simulator.kv.expert_parallel import ExpertRouting, ParallelLayout
from simulator.kv.gpus import GPUSpec, get_gpu
from simulator.kv.hybrid import HybridPagedAllocator
from simulator.kv.models import ModelConfig, load_model
from simulator.kv.paged import PagedAllocator
from simulator.kv.quantization import resolve_quantization
from simulator.kv.sizing import SCENARIO_KEYS, KVCapacity, hybrid_capacity_tokens, kv_capacity, weights_per_rank
from simulator.latency import LatencyModel
from simulator.latency.constant import ConstantLatency
from simulator.latency.roofline import RooflineLatency
from simulator.latency.speculative import SpeculativeLatency, draft_head_model
from simulator.config.refusals import check_startup
from simulator.config.scenario import SGLANG_KNOBS, V1_KNOBS, Scenario
from simulator.scheduler import Scheduler, SchedulerConfig, make_scheduler

GIB = 1 << 30


@dataclass(frozen=True)
class Deployment:
    scenario: Scenario
    model: ModelConfig
    gpu: GPUSpec
    capacity: KVCapacity
    num_blocks: int  # per replica (per rank: every rank holds its heads' share of each block)
    scheduler_config: SchedulerConfig
    latency: LatencyModel
    # what vLLM's start-up would warn about, and refusals simulated anyway (allow_refused)
    warnings: tuple[str, ...] = ()

    @property
    def usable_blocks(self) -> int:
        """Blocks the scheduler can hand out. vLLM V1's ``BlockPool`` takes block 0 off its free
        queue as the null block, a placeholder no request's KV is written to
        (vllm/v1/core/block_pool.py, ``BlockPool.__init__``: ``self.null_block =
        self.free_block_queue.popleft()``; read in vLLM 0.33.0), so N blocks give N − 1; the
        other engines use all of theirs."""
        return self.num_blocks - 1 if self.scheduler_config.engine == "vllm-v1" else self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """Tokens of KV the pool holds: usable blocks × block size; for a hybrid model's groups,
        the context it holds at peak (:func:`simulator.kv.sizing.hybrid_capacity_tokens`: a
        block id spans one group's layers only)."""
        cfg, groups = self.scheduler_config, self.capacity.kv_groups
        if groups is None:
            return self.usable_blocks * cfg.block_size
        per_request = groups.max_blocks_per_request(cfg.max_model_len, cfg.max_num_batched_tokens)
        return hybrid_capacity_tokens(self.usable_blocks, per_request, cfg.max_model_len)

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens the pool holds at once, as vLLM's start-up line
        counts them: over all ``num_blocks``, the null block included
        (vllm/v1/core/kv_cache_utils.py, ``get_max_concurrency_for_kv_cache_config``)."""
        cfg, groups = self.scheduler_config, self.capacity.kv_groups
        if groups is None:
            return self.num_blocks * cfg.block_size / cfg.max_model_len
        return self.num_blocks / groups.max_blocks_per_request(cfg.max_model_len, cfg.max_num_batched_tokens)

    def make_allocator(self, name: str) -> KVAllocator:
        cfg = self.scheduler_config
        if name == "paged" and cfg.engine == "sglang":
            from simulator.kv.radix import RadixTokenPool
            return RadixTokenPool(self.num_blocks, cfg.block_size,
                                  enable_prefix_caching=cfg.enable_prefix_caching,
                                  eviction_policy=cfg.radix_eviction_policy)
        if name == "paged" and self.capacity.kv_groups is not None:
            return HybridPagedAllocator(self.usable_blocks, self.capacity.kv_groups,
                                        enable_prefix_caching=cfg.enable_prefix_caching)
        if name == "paged":
            # vLLM (V1 and V0) hashes every full block, so its full blocks wait for eviction in
            # one least-recently-freed order (simulator/kv/paged.py); TensorRT-LLM stores a
            # context's blocks for reuse (storeContextBlocks), kvplan's rule before vLLM 0.33.0
            return PagedAllocator(self.usable_blocks, cfg.block_size,
                                  enable_prefix_caching=cfg.enable_prefix_caching,
                                  offload_blocks=offload_blocks(self.scenario, self.capacity),
                                  full_blocks_lru=cfg.engine != "trtllm")
        # the contiguous baselines: loaded by the runs that compare against them
        from simulator.kv.contiguous import ContiguousAllocator
        from simulator.kv.hybrid_contiguous import HybridContiguousAllocator

        policy = name.removeprefix("contiguous-")
        if self.capacity.kv_groups is not None:  # the same block ids, reserved per group
            return HybridContiguousAllocator(self.usable_blocks, self.capacity.kv_groups,
                                             policy=policy,  # type: ignore[arg-type]
                                             max_model_len=cfg.max_model_len,
                                             max_num_batched_tokens=cfg.max_num_batched_tokens)
        return ContiguousAllocator(self.capacity_tokens, policy=policy,  # type: ignore[arg-type]
                                   max_model_len=cfg.max_model_len)

    def replica_factory(self, allocator: str, *, detail: bool = False) -> Callable[[int], tuple[Scheduler, KVAllocator]]:
        def make(_: int) -> tuple[Scheduler, KVAllocator]:
            alloc = self.make_allocator(allocator)
            return make_scheduler(alloc, self.scheduler_config, detail=detail, keep_groups=False), alloc
        return make

    def describe(self) -> dict[str, Any]:
        cap = self.capacity
        describe = getattr(self.latency, "describe", None)
        extra: dict[str, Any] = {}
        if self.scheduler_config.engine == "trtllm":
            from simulator.scheduler.trtllm import TRTLLM_NEWEST

            extra = {"engine_version": self.scenario.engine_version or TRTLLM_NEWEST,
                     "capacity_scheduler_policy": self.scheduler_config.capacity_scheduler_policy,
                     "enable_chunked_prefill": self.scheduler_config.enable_chunked_prefill}
        return {
            "engine": self.scheduler_config.engine,
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tensor_parallel": cap.tp,
            "data_parallel_size": cap.dp,
            "expert_parallel_size": cap.ep,
            "moe_tensor_parallel_size": cap.moe_tp,
            "moe_dispatch": cap.moe_dispatch,
            "num_replicas": self.scenario.num_replicas,  # engine replicas: one per DP rank
            "kv_cache_dtype": cap.kv_cache_dtype,
            "bytes_per_token": cap.bytes_per_token,
            "block_size": self.scheduler_config.block_size,
            "num_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "kv_capacity_tokens": self.capacity_tokens,
            "available_kv_gib": cap.available_kv_bytes / GIB,
            "kv_pool_gib": self.num_blocks * cap.block_bytes / GIB,
            "weight_gib_per_rank": cap.weight_bytes / GIB,
            "expert_weight_gib_per_rank": cap.expert_weight_bytes / GIB,
            "quantization": cap.weight_format.quantization,
            "weight_dtype": cap.weight_format.weight_dtype,
            "gemm_dtype": cap.weight_format.gemm_dtype,
            "activation_gib_per_rank": cap.activation_bytes / GIB,
            "max_model_len": self.scheduler_config.max_model_len,
            "max_num_seqs": self.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": self.scheduler_config.max_num_batched_tokens,
            "enable_prefix_caching": self.scheduler_config.enable_prefix_caching,
            "max_concurrency_at_max_model_len": self.max_concurrency,
            "notes": list(cap.notes) + list(self.warnings),
            "warnings": list(self.warnings),
            "latency_model": describe() if describe else {},
            **extra,
        }


class EngineKnobs(NamedTuple):
    """The scheduler knobs a scenario leaves to its engine, resolved for the GPU."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    enable_prefix_caching: bool
    gpu_memory_utilization: float  # SGLang: its mem_fraction_static; TensorRT-LLM: free_gpu_memory_fraction
    engine_knobs: dict[str, Any]  # the engine's own knobs, set only where the scenario sets them
    enable_chunked_prefill: bool = True


def engine_defaults(scenario: Scenario, gpu: GPUSpec, max_model_len: int,
                    model: ModelConfig | None = None) -> EngineKnobs:
    """The scenario's knobs, each unset one at the default its engine would start with on ``gpu``.

    * vllm-v1: ``max_num_seqs`` / ``max_num_batched_tokens`` as ``vllm serve`` sets them
      (vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults``, OPENAI_API_SERVER context):
      1024 / 8192 on a GPU of at least 70 GiB that is not an A100 ("Setting large
      max_num_batched_tokens for A100 reduces throughput, see PR #17885"), else 256 / 2048; an
      unset ``max_num_seqs`` is cut to the token budget (``min(max_num_seqs,
      max_num_batched_tokens)``, arg_utils.py ``_set_default_max_num_seqs_and_batched_tokens_args``);
      without chunked prefill the budget must hold a whole prompt: max(max_model_len, that)
      (vllm/config/scheduler.py). Prefix caching on (vllm/engine/arg_utils.py: V1 turns it on
      for generative models unless --no-enable-prefix-caching). Block size 16
      (vllm/config/cache.py ``block_size`` default for CUDA).
    * vllm-v0: as vLLM 0.10.2, the last release with V0, starts it
      (``EngineArgs._set_default_args_v0`` in vllm/engine/arg_utils.py): 256 sequences; chunked
      prefill only when ``max_model_len`` > 32,768 ("Enable chunked prefill by default for long
      context (> 32K) models"), never for an MLA or sliding-window ``model``; the budget
      ``SchedulerConfig.__post_init__`` (vllm/config/scheduler.py) gives: 2048 tokens
      (``DEFAULT_MAX_NUM_BATCHED_TOKENS``) with chunked prefill, else ``max(max_model_len,
      2048)``, at most ``max_num_seqs × max_model_len``; prefix caching off
      (``CacheConfig.enable_prefix_caching`` None); block 16.
    * sglang: :func:`simulator.scheduler.sglang.sglang_defaults` (SGLang's server_args):
      ``chunked_prefill_size`` (kvplan's ``max_num_batched_tokens``) and ``mem_fraction_static``
      (kvplan's ``gpu_memory_utilization``: :func:`simulator.kv.sizing.kv_capacity`
      ``static_fraction``) by GPU memory and ``--tp-size`` (``data_parallel_size`` ×
      ``tensor_parallel``); page size 1; the radix cache on. With ``data_parallel_size`` > 1 (DP
      attention) each DP rank's chunk and conservativeness are the flags' as SGLang divides them
      (:func:`sglang_dp_attention_knobs`); the CUDA-graph memory DP attention adds to the reserve
      is not modelled. ``max_num_seqs``
      (``max_running_requests``) follows from the pool once sized
      (:func:`simulator.scheduler.sglang.sglang_max_running_requests`): 0 here.
    * trtllm: the defaults of the TensorRT-LLM release ``engine_version`` (the newest kvplan
      follows when unset: :data:`simulator.scheduler.trtllm.TRTLLM_DEFAULTS`), as ``trtllm-serve``
      starts with them, the same on every GPU: ``max_batch_size`` 2048 (kvplan's
      ``max_num_seqs``), ``max_num_tokens`` 8192 (``max_num_batched_tokens``), ``tokens_per_block``
      32 (``block_size``), ``free_gpu_memory_fraction`` 0.9 of the memory free after the model
      loads (``gpu_memory_utilization``: :func:`simulator.scheduler.trtllm.trtllm_capacity`),
      block reuse on, chunked context off, capacity scheduler GUARANTEED_NO_EVICT.
    """
    engine = scenario.engine
    knobs: dict[str, Any] = {}
    chunked = True if scenario.enable_chunked_prefill is None else scenario.enable_chunked_prefill
    if engine == "trtllm":
        from simulator.scheduler.trtllm import trtllm_defaults
        trt = trtllm_defaults(scenario.engine_version)
        caching = (trt.enable_block_reuse if scenario.enable_prefix_caching is None
                   else scenario.enable_prefix_caching)
        chunked = (trt.enable_chunked_prefill if scenario.enable_chunked_prefill is None
                   else scenario.enable_chunked_prefill)
        knobs["capacity_scheduler_policy"] = (scenario.capacity_scheduler_policy
                                              or trt.capacity_scheduler_policy)
        return EngineKnobs(scenario.max_num_seqs or trt.max_batch_size,
                           scenario.max_num_batched_tokens or trt.max_num_tokens,
                           scenario.block_size or trt.tokens_per_block, caching,
                           scenario.gpu_memory_utilization or trt.free_gpu_memory_fraction, knobs, chunked)
    if engine == "sglang":
        from simulator.scheduler.sglang import sglang_defaults
        # SGLang's --tp-size is the replica's GPUs: attention DP ranks × their TP
        sg = sglang_defaults(gpu.hbm_gib,
                             tensor_parallel=scenario.tensor_parallel * scenario.data_parallel_size)
        # max_running_requests follows from the pool's size: build_deployment sets it once sized
        seqs = scenario.max_num_seqs or 0
        batched = scenario.max_num_batched_tokens or int(sg["chunked_prefill_size"])
        block = scenario.block_size or 1  # server_args.py: page_size None -> 1
        caching = True if scenario.enable_prefix_caching is None else scenario.enable_prefix_caching
        for name in SGLANG_KNOBS:
            if getattr(scenario, name) is not None:
                knobs[name] = getattr(scenario, name)
        if scenario.data_parallel_size > 1:  # DP attention: one scheduler per DP rank
            batched, conservativeness = sglang_dp_attention_knobs(
                batched, scenario.schedule_conservativeness, scenario.data_parallel_size)
            knobs["schedule_conservativeness"] = conservativeness
        fraction = scenario.gpu_memory_utilization or float(sg["mem_fraction_static"])
        return EngineKnobs(seqs, batched, block, caching, fraction, knobs, chunked)
    block = scenario.block_size or 16
    fraction = scenario.gpu_memory_utilization or 0.9  # vllm/config/cache.py default
    if engine == "vllm-v1":
        big = gpu.hbm_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
        batched = scenario.max_num_batched_tokens or (8192 if big else 2048)
        # an unset max_num_seqs is the default cut to the token budget (arg_utils.py
        # _set_default_max_num_seqs_and_batched_tokens_args: "if orig_max_num_seqs is None: ...
        # min(self.max_num_seqs, self.max_num_batched_tokens)"), before the scheduler config
        # raises an unchunked budget to max_model_len
        seqs = scenario.max_num_seqs or min(1024 if big else 256, batched)
        if scenario.max_num_batched_tokens is None and not chunked:
            batched = max(max_model_len, batched)
        caching = True if scenario.enable_prefix_caching is None else scenario.enable_prefix_caching
        for name in V1_KNOBS:
            if getattr(scenario, name) is not None:
                knobs[name] = getattr(scenario, name)
        return EngineKnobs(seqs, batched, block, caching, fraction, knobs, chunked)
    seqs = scenario.max_num_seqs or 256
    if scenario.enable_chunked_prefill is None:
        # arg_utils.py _set_default_args_v0: "Chunked prefill not supported for Multimodal or
        # MLA in V0", and not with a sliding window
        windowed = model is not None and (model.is_mla or model.sliding_window is not None)
        chunked = max_model_len > 32768 and not windowed
    batched = scenario.max_num_batched_tokens
    if batched is None:  # vllm/config/scheduler.py SchedulerConfig.__post_init__
        batched = min(seqs * max_model_len, 2048 if chunked else max(max_model_len, 2048))
    return EngineKnobs(seqs, batched, block, bool(scenario.enable_prefix_caching), fraction, knobs, chunked)


def sglang_dp_attention_knobs(chunked_prefill_size: int, schedule_conservativeness: float | None,
                              dp: int) -> tuple[int, float]:
    """Each DP rank's chunk and conservativeness under SGLang's DP attention, from the server's
    flags: ``ServerArgs._handle_data_parallelism`` (python/sglang/srt/server_args.py) divides
    ``chunked_prefill_size`` by ``dp_size`` and multiplies ``schedule_conservativeness`` (default
    1.0) by 0.3. kvplan's ``max_num_batched_tokens``, ``schedule_conservativeness`` and
    ``max_num_seqs`` keep the flags' values (``max_running_requests`` is divided by ``dp_size``
    when the pool is sized)."""
    return chunked_prefill_size // dp, (1.0 if schedule_conservativeness is None
                                        else schedule_conservativeness) * 0.3


def build_deployment(scenario: Scenario, base_dir: Path, *, force_profile: bool = False,
                     where: str = "scenario") -> Deployment:
    """Resolve names and sizes; any inconsistency, or a deployment vLLM would refuse to start
    (unless ``scenario.allow_refused``), is a one-line KvplanError naming ``where``. Warnings are
    emitted as KvplanWarning and kept in :attr:`Deployment.warnings`. One engine: a scenario
    listing several is built per engine (:meth:`Scenario.for_engine`)."""
    if scenario.disaggregation is not None:  # simulator/engine/disagg.py builds each pool's
        raise KvplanError(f"{where}: disaggregation: not yet supported here (only `simulate` "
                          "runs it)")
    if not isinstance(scenario.engine, str):
        raise KvplanError(f"{where}: engine: {', '.join(scenario.engine)}: list several engines "
                          "only for `simulate`; elsewhere give one (capacity: sweep: {engine: [...]})")
    try:
        model = load_model(_resolve(scenario.model, base_dir) if scenario.model.endswith(".json") else scenario.model)
    except KvplanError as err:
        raise KvplanError(f"{where}: model: {err}") from None
    try:
        gpu = get_gpu(scenario.gpu)
    except KvplanError as err:
        raise KvplanError(f"{where}: gpu: {err}") from None
    max_model_len = scenario.max_model_len or model.max_position_embeddings
    knobs = engine_defaults(scenario, gpu, max_model_len, model)
    max_seqs, batched, block_size = knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.block_size
    sglang = scenario.engine == "sglang"
    trtllm = scenario.engine == "trtllm"
    _check_drafting_slots(scenario, batched, where)
    _check_linear_state(scenario, model, where)
    if trtllm and max_seqs is not None and max_seqs > batched:
        # TensorRT-LLM's micro-batch gives each generating request one token and stops at
        # max_num_tokens (MicroBatchScheduler::operator(), cpp/tensorrt_llm/batch_manager/
        # microBatchScheduler.cpp): no more than max_num_tokens requests generate in a step.
        # kvplan decodes every running request each step, so it runs at most that many at once
        # (the same whenever fewer are in flight: a closed loop of up to max_num_tokens clients).
        batch_notes = [f"engine trtllm: max_num_seqs (max_batch_size {max_seqs}) above max_num_batched_tokens "
                       f"(max_num_tokens {batched}): at most {batched} requests generate in a step; kvplan "
                       "runs at most that many at once"]
        max_seqs = batched
    else:
        batch_notes = []

    layout = {"dp": scenario.data_parallel_size,
              "enable_expert_parallel": scenario.enable_expert_parallel,
              "moe_tp": scenario.moe_tensor_parallel_size,
              "moe_ep": scenario.moe_expert_parallel_size, "moe_dispatch": scenario.moe_dispatch}

    def capacity_at(tp: int, kv_cache_dtype: str) -> KVCapacity:
        if trtllm:  # a fraction of the memory left once the model and its activations are in
            from simulator.scheduler.trtllm import trtllm_capacity
            return trtllm_capacity(kv_capacity(
                model, gpu, tp=tp, kv_cache_dtype=kv_cache_dtype, quantization=scenario.quantization,
                block_size=block_size, gpu_memory_utilization=1.0, max_num_batched_tokens=batched,
                max_num_seqs=_trtllm_profiling_requests(batched, max_model_len),
                max_model_len=max_model_len, knobs=SCENARIO_KEYS, hybrid_kv_cache_manager=False,
                **layout), knobs.gpu_memory_utilization)
        return kv_capacity(
            model, gpu, tp=tp, kv_cache_dtype=kv_cache_dtype, quantization=scenario.quantization,
            block_size=block_size, gpu_memory_utilization=knobs.gpu_memory_utilization,
            max_num_batched_tokens=batched, max_num_seqs=max_seqs or 1, max_model_len=max_model_len,
            knobs=SCENARIO_KEYS, static_fraction=sglang,
            hybrid_kv_cache_manager=_hybrid_manager(scenario), **layout)

    try:
        cap = capacity_at(scenario.tensor_parallel, scenario.kv_cache_dtype)
    except KvplanError as err:
        raise KvplanError(f"{where}: {err}") from None
    clamped: list[str] = []
    if trtllm:
        max_model_len, clamped = _trtllm_max_seq_len(scenario, cap, max_model_len)
    startup = check_startup(model, gpu, cap, block_size=block_size, engine=scenario.engine,
                            max_num_batched_tokens=batched,
                            max_model_len=max_model_len,
                            num_gpu_blocks_override=scenario.num_gpu_blocks_override,
                            capacity_at=capacity_at)
    said = tuple(batch_notes) + tuple(clamped) + startup.raise_or_warnings(where, scenario.allow_refused) + tuple(
        _offload_dropped(scenario, cap))
    for warning in said:
        warn_user(f"{where}: {warning}")
    num_blocks = scenario.num_gpu_blocks_override or cap.num_blocks
    drafter = _drafter_model(scenario, model, where)
    if drafter is not None and not scenario.num_gpu_blocks_override:
        num_blocks = _blocks_less_draft_weights(scenario, drafter, gpu, cap, num_blocks, where)
    if sglang:
        from simulator.scheduler.sglang import sglang_max_running_requests
        requested = scenario.max_num_seqs
        if requested is not None and scenario.data_parallel_size > 1:
            # each DP rank's share (ModelRunnerKVCacheMixin._resolve_max_num_reqs: "per dp worker",
            # max_running_requests // dp_size)
            requested //= scenario.data_parallel_size
        max_seqs = sglang_max_running_requests(num_blocks * block_size, max_model_len, requested)
    swap_tokens = int(scenario.swap_space * GIB // cap.bytes_per_token)
    try:
        sched = SchedulerConfig(
            max_num_seqs=max_seqs, max_num_batched_tokens=batched, max_model_len=max_model_len,
            block_size=cap.block_size, enable_chunked_prefill=knobs.enable_chunked_prefill,
            enable_prefix_caching=knobs.enable_prefix_caching,
            preemption_mode=scenario.preemption_mode, swap_space_tokens=swap_tokens,
            beam_replace_prob=scenario.beam_replace_prob, seed=scenario.seed,
            engine=scenario.engine, **knobs.engine_knobs, **_spec_knobs(scenario),
        )
    except ValueError as err:
        raise KvplanError(f"{where}: {err}") from None
    latency = _latency_model(scenario, base_dir, model, gpu, cap, block_size, force_profile)
    if scenario.speculative is not None:
        latency = _speculative_latency(scenario, latency, drafter, gpu, block_size, where)
    if scenario.engine == "vllm-v1" and num_blocks < 2:  # the null block leaves none (usable_blocks)
        raise KvplanError(f"{where}: a pool of {num_blocks} block leaves vLLM V1 no block beside its "
                          "null block (vllm/v1/core/block_pool.py BlockPool.__init__); give more KV memory "
                          "or num_gpu_blocks_override >= 2")
    if scenario.data_parallel_size > 1:  # one engine replica per DP rank (module docstring)
        scenario = scenario.model_copy(update={
            "num_replicas": scenario.num_replicas * scenario.data_parallel_size})
    return Deployment(scenario, model, gpu, cap, num_blocks, sched, latency, said)


def _trtllm_profiling_requests(max_num_tokens: int, max_seq_len: int) -> int:
    """The dummy requests TensorRT-LLM profiles its peak memory with: prompts of
    min(max_num_tokens, max_seq_len − 1) tokens until max_num_tokens are used
    (``KvCacheCreator._create_dummy_context_requests``, tensorrt_llm/_torch/pyexecutor/_util.py);
    they stand for kvplan's ``max_num_seqs`` in the activation estimate (sampling buffers)."""
    per_request = max(1, min(max_num_tokens, max_seq_len - 1))
    return -(-max_num_tokens // per_request)


def _trtllm_max_seq_len(scenario: Scenario, cap: KVCapacity, max_model_len: int) -> tuple[int, list[str]]:
    """TensorRT-LLM does not refuse to start when one ``max_seq_len`` request exceeds its KV pool:
    it lowers the attention window to the tokens the pool holds, ``blocks × tokens_per_block``
    (``KVCacheManager.get_max_atten_window_upper_bound``, tensorrt_llm/_torch/pyexecutor/
    resource_manager.py), and the sequence length with it (``create_py_executor`` takes back
    ``kv_cache_creator._max_seq_len``). kvplan runs with that max_model_len and says so."""
    fits = cap.num_blocks * cap.block_size
    if max_model_len <= fits or scenario.num_gpu_blocks_override:
        return max_model_len, []
    return fits, [f"max_model_len {max_model_len:,} exceeds the KV pool ({fits:,} tokens): "
                  f"TensorRT-LLM lowers max_seq_len and the attention window to {fits:,} "
                  "(resource_manager.py get_max_atten_window_upper_bound); simulated with "
                  f"max_model_len {fits:,}"]


def offload_blocks(scenario: Scenario, cap: KVCapacity) -> int:
    """Blocks of the ``kv_offload`` CPU tier of one replica (0 without it): vLLM's
    ``cpu_bytes_to_use // (page bytes × layers × world_size)``, a block holding every rank's
    share (vllm/v1/kv_offload/cpu/spec.py)."""
    offload = scenario.kv_offload
    return int(offload.size_gib * GIB) // (cap.block_bytes * cap.tp) if offload else 0


def _offload_dropped(scenario: Scenario, cap: KVCapacity) -> list[str]:
    """What of ``kv_offload:`` the run leaves out, to be said rather than dropped in silence:
    a tier too small for one block (size_gib 0 included), a hybrid model's pool (its allocator
    models no tier), the contiguous allocators (which model none)."""
    if scenario.kv_offload is None:
        return []
    size = scenario.kv_offload.size_gib
    if not offload_blocks(scenario, cap):
        less = "" if size == 0 else (f" is less than one KV block ({cap.block_bytes * cap.tp:,}"
                                     " bytes a replica), so it")
        return [f"kv_offload: size_gib {size:g}{less} gives no CPU tier: the run is the same as"
                " without kv_offload"]
    said = []
    if "paged" in scenario.allocators and cap.kv_groups is not None:
        said.append("kv_offload: the CPU tier is not modelled for a model with several KV cache"
                    " groups (sliding-window, chunked or linear-attention layers): allocator paged"
                    " runs without it")
    contiguous = [a for a in scenario.allocators if a != "paged"]
    if contiguous:
        said.append(f"kv_offload: the CPU tier is modelled for allocator paged only; "
                    f"{', '.join(contiguous)} run{'s' if len(contiguous) == 1 else ''} without it")
    return said


def _drafter_model(scenario: Scenario, target: ModelConfig, where: str) -> ModelConfig | None:
    """The model whose weights and passes speculative decoding adds: the catalog draft model,
    an EAGLE/MTP head (simulator/latency/speculative.py), or None (n-gram, or no speculation)."""
    spec = scenario.speculative
    if spec is None or spec.method == "ngram":
        return None
    if spec.method in ("eagle", "mtp"):
        return draft_head_model(target)
    try:
        drafter = load_model(spec.draft_model)  # type: ignore[arg-type]
    except KvplanError as err:
        raise KvplanError(f"{where}: speculative.draft_model: {err}") from None
    # vLLM refuses a draft model whose vocabulary size differs from the target's
    # (vllm/config/speculative.py, SpeculativeConfig.verify_equal_vocab_size_if_draft_model,
    # called by _verify_args unless use_heterogeneous_vocab, which kvplan does not model)
    if drafter.vocab_size != target.vocab_size:
        raise KvplanError(f"{where}: speculative.draft_model: {drafter.name} has a vocabulary of"
                          f" {drafter.vocab_size:,} tokens, {target.name} of {target.vocab_size:,};"
                          " vLLM requires a draft model with the target's vocabulary size")
    return drafter


def _blocks_less_draft_weights(scenario: Scenario, drafter: ModelConfig, gpu: GPUSpec,
                               cap: KVCapacity, num_blocks: int, where: str) -> int:
    """KV blocks left once the drafter's weights (per rank, at the scenario's quantization) are
    loaded: vLLM profiles memory with the draft model loaded beside the target
    (vllm/v1/worker/gpu_model_runner.py ``load_model`` loads the drafter), so its weights come
    out of the KV budget. An EAGLE/MTP head's embedding and lm_head are the target's (shared in
    ``EagleProposer.load_model``, vllm/v1/spec_decode/eagle.py): only its layer counts."""
    fmt = resolve_quantization(drafter, scenario.quantization, gpu)
    # per rank as the target's: TP-sharded, an MoE drafter's experts over the EP ranks
    moe = drafter.is_moe
    per_rank, _ = weights_per_rank(drafter, fmt, ParallelLayout(
        scenario.tensor_parallel, scenario.data_parallel_size,
        scenario.enable_expert_parallel and moe, scenario.moe_tensor_parallel_size if moe else None,
        scenario.moe_expert_parallel_size if moe else None))
    if scenario.speculative is not None and scenario.speculative.method in ("eagle", "mtp"):
        shared = drafter.vocab_size * drafter.hidden_size * (1 if drafter.tie_word_embeddings else 2)
        per_rank = math.ceil(per_rank * max(drafter.num_params - shared, 0) / drafter.num_params)
    left = num_blocks - math.ceil(per_rank / cap.block_bytes)  # a hybrid pool's block spans its groups
    if left < 1:
        raise KvplanError(f"{where}: speculative: the draft weights ({per_rank / GIB:.1f} GiB per "
                          "rank) leave no KV block; raise tensor_parallel or pick a smaller draft")
    return left


def _speculative_latency(scenario: Scenario, base: LatencyModel, drafter: ModelConfig | None,
                         gpu: GPUSpec, block_size: int, where: str) -> LatencyModel:
    """The target's verify pass plus the drafter's passes (simulator/latency/speculative.py)."""
    spec = scenario.speculative
    assert spec is not None
    if not isinstance(base, RooflineLatency):
        raise KvplanError(f"{where}: speculative: needs latency model roofline (the verify and "
                          f"draft passes are costed from the catalog), not {scenario.latency.model}")
    draft = None
    if drafter is not None:
        # the drafter's passes run inside the engine's step: its per-step overheads are the
        # target's, paid once
        draft = RooflineLatency(drafter, gpu, tp=scenario.tensor_parallel,
                                kv_cache_dtype=scenario.kv_cache_dtype, block_size=block_size,
                                constants=base.constants, step_overhead_s=0.0, prefill_overhead_s=0.0)
    return SpeculativeLatency(base, spec.num_speculative_tokens, draft)


def _check_drafting_slots(scenario: Scenario, max_num_batched_tokens: int, where: str) -> None:
    """vLLM refuses to start when the token budget holds no more than the KV slots a request
    reserves past its scheduled tokens (vllm/config/vllm.py, ``VllmConfig._set_max_num_scheduled_tokens``,
    0.33.0: "does not have enough slots to schedule a token", when ``max_num_batched_tokens <=
    num_lookahead_tokens``; ``VllmConfig.num_lookahead_tokens``: k for EAGLE, MTP and draft models,
    0 for n-gram). Past that vLLM starts, and its scheduler cuts each verify to the budget (drafts
    that do not fit are dropped), as kvplan's does (simulator/scheduler/spec.py)."""
    spec = scenario.speculative
    if spec is None:
        return
    lookahead = 0 if spec.method == "ngram" else spec.num_speculative_tokens
    if max_num_batched_tokens <= lookahead:
        raise KvplanError(f"{where}: speculative: max_num_batched_tokens {max_num_batched_tokens}"
                          f" holds no more than the {lookahead} KV slots a {spec.method} request reserves"
                          " ahead; vLLM refuses to start: raise max_num_batched_tokens")


def _spec_knobs(scenario: Scenario) -> dict[str, Any]:
    """SchedulerConfig's speculative fields; lookahead slots as vLLM's ``Scheduler.__init__``
    sets them: k when the proposer keeps KV (``use_eagle()``: eagle, eagle3, mtp;
    ``uses_draft_model()``), else 0 (vllm/v1/core/sched/scheduler.py)."""
    spec = scenario.speculative
    if spec is None:
        return {}
    k = spec.num_speculative_tokens
    return {"num_speculative_tokens": k, "spec_acceptance": spec.rates,
            "num_lookahead_tokens": 0 if spec.method == "ngram" else k,
            # SpeculativeConfig.max_num_new_slots_for_drafting (vllm/config/speculative.py)
            "num_draft_slots": 1 if spec.method == "draft_model" else 0}


def _check_linear_state(scenario: Scenario, model: ModelConfig, where: str) -> None:
    """A model with linear-attention (recurrent state) layers: kvplan sizes that state only as
    vLLM V1's hybrid KV cache manager does (simulator/kv/sizing.py ``kv_cache_groups``). The other
    engines keep it in pools of their own (SGLang's ``MambaPool``, TensorRT-LLM's Mamba cache
    manager), which kvplan does not model: refuse rather than size every layer as attention."""
    from simulator.kv.model_config import LINEAR_ATTENTION

    if scenario.engine != "vllm-v1" and model.num_layers_of(LINEAR_ATTENTION):
        raise KvplanError(
            f"{where}: {model.name} has linear-attention layers; kvplan sizes their state as vLLM V1's "
            f"hybrid KV cache manager does, and not {scenario.engine}'s own state pool: give engine: vllm-v1")


def _hybrid_manager(scenario: Scenario) -> bool:
    """Whether the pool is sized as vLLM's hybrid KV cache manager sizes it: vLLM V1 unless
    ``disable_hybrid_kv_cache_manager``. Its paged allocator is the hybrid manager's, its
    contiguous ones reserve per KV cache group in the same block ids
    (:class:`~simulator.kv.hybrid_contiguous.HybridContiguousAllocator`); V0 and SGLang size
    every layer as full attention here, so those pools keep every token of every layer."""
    return scenario.engine == "vllm-v1" and not scenario.disable_hybrid_kv_cache_manager


def _resolve(path: str, base_dir: Path) -> str:
    p = Path(path)
    return str(p if p.is_absolute() or p.exists() else base_dir / p)


def _latency_model(scenario: Scenario, base_dir: Path, model: ModelConfig, gpu: GPUSpec,
                   cap: KVCapacity, block_size: int, force_profile: bool) -> LatencyModel:
    spec = scenario.latency
    if spec.model == "constant":
        assert spec.step_s is not None
        return ConstantLatency(spec.step_s)
    if spec.model == "profile":
        # a measured profile is fitted with numpy (~0.07 s of CPU to import): only its runs pay
        from simulator.latency.profile import ProfileLatency, check_profile_matches, read_profile

        assert spec.profile is not None
        profile = read_profile(_resolve(spec.profile, base_dir))
        if not force_profile:
            check_profile_matches(profile, model=model.name, tensor_parallel=scenario.tensor_parallel,
                                  kv_cache_dtype=cap.kv_cache_dtype, gpu=gpu.name)
        return ProfileLatency(profile, block_size=block_size)
    return RooflineLatency(
        model, gpu, tp=scenario.tensor_parallel, kv_cache_dtype=scenario.kv_cache_dtype,
        quantization=cap.weight_format,  # the one sizing resolved: same bytes, same GEMM dtype
        block_size=block_size, mem_efficiency=spec.mem_efficiency,
        flops_efficiency=spec.flops_efficiency, fp8_flops_efficiency=spec.fp8_flops_efficiency,
        moe_flops_efficiency=spec.moe_flops_efficiency,
        step_overhead_s=spec.step_overhead_s, prefill_overhead_s=spec.prefill_overhead_s,
        allreduce_latency_s=spec.allreduce_latency_s, request_overhead_s=spec.request_overhead_s,
        host_bandwidth_bytes_s=scenario.kv_offload.bandwidth_gb_s * 1e9
        if scenario.kv_offload and scenario.kv_offload.bandwidth_gb_s else None,
        dp=scenario.data_parallel_size, enable_expert_parallel=scenario.enable_expert_parallel,
        moe_tp=scenario.moe_tensor_parallel_size, moe_ep=scenario.moe_expert_parallel_size,
        moe_dispatch=scenario.moe_dispatch,
        expert_routing=ExpertRouting(scenario.expert_routing.distribution,
                                     scenario.expert_routing.skew, seed=scenario.seed),
        alltoall_latency_s=spec.alltoall_latency_s,
    )
