"""A scenario resolved into the concrete things a run needs: model, GPU, KV pool, latency model.

Every allocator of a scenario gets the *same* KV memory (``num_blocks × block_size`` token slots
per replica, from vLLM's capacity formula or ``num_gpu_blocks_override``); they differ only in how
they use it.

A deployment vLLM would refuse to start (simulator/refusals.py: a block size it does not take, a
max_model_len beyond the model's window or beyond the KV memory, an override larger than the GPU)
is a KvplanError saying why and what would make it start, unless the scenario says
``allow_refused: true``. What remains worth knowing (refusals allowed, block sizes its fastest
kernel does not take, ...) is in :attr:`Deployment.warnings`, emitted once as KvplanWarning when
the deployment is built and listed in run.json's notes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError, warn_user
from simulator.kv.allocator import KVAllocator
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.gpus import GPUSpec, get_gpu
from simulator.kv.models import ModelConfig, load_model
from simulator.kv.paged import PagedAllocator
from simulator.kv.sizing import SCENARIO_KEYS, KVCapacity, kv_capacity
from simulator.latency import LatencyModel
from simulator.latency.constant import ConstantLatency
from simulator.latency.profile import ProfileLatency, check_profile_matches, read_profile
from simulator.latency.roofline import RooflineLatency
from simulator.refusals import check_startup
from simulator.scenario import Scenario
from simulator.scheduler import Scheduler, SchedulerConfig

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
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.scheduler_config.block_size

    def make_allocator(self, name: str) -> KVAllocator:
        cfg = self.scheduler_config
        if name == "paged":
            return PagedAllocator(self.num_blocks, cfg.block_size,
                                  enable_prefix_caching=cfg.enable_prefix_caching)
        policy = name.removeprefix("contiguous-")
        return ContiguousAllocator(self.capacity_tokens, policy=policy,  # type: ignore[arg-type]
                                   max_model_len=cfg.max_model_len)

    def replica_factory(self, allocator: str, *, detail: bool = False) -> Callable[[int], tuple[Scheduler, KVAllocator]]:
        def make(_: int) -> tuple[Scheduler, KVAllocator]:
            alloc = self.make_allocator(allocator)
            return Scheduler(alloc, self.scheduler_config, detail=detail, keep_groups=False), alloc
        return make

    def describe(self) -> dict[str, Any]:
        cap = self.capacity
        describe = getattr(self.latency, "describe", None)
        return {
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tensor_parallel": cap.tp,
            "num_replicas": self.scenario.num_replicas,
            "kv_cache_dtype": cap.kv_cache_dtype,
            "bytes_per_token": cap.bytes_per_token,
            "block_size": self.scheduler_config.block_size,
            "num_blocks": self.num_blocks,
            "kv_capacity_tokens": self.capacity_tokens,
            "available_kv_gib": cap.available_kv_bytes / GIB,
            "kv_pool_gib": self.num_blocks * cap.block_bytes / GIB,
            "weight_gib_per_rank": cap.weight_bytes / GIB,
            "quantization": cap.weight_format.quantization,
            "weight_dtype": cap.weight_format.weight_dtype,
            "gemm_dtype": cap.weight_format.gemm_dtype,
            "activation_gib_per_rank": cap.activation_bytes / GIB,
            "max_model_len": self.scheduler_config.max_model_len,
            "max_concurrency_at_max_model_len": self.capacity_tokens / self.scheduler_config.max_model_len,
            "notes": list(cap.notes) + list(self.warnings),
            "warnings": list(self.warnings),
            "latency_model": describe() if describe else {},
        }


def build_deployment(scenario: Scenario, base_dir: Path, *, force_profile: bool = False,
                     where: str = "scenario") -> Deployment:
    """Resolve names and sizes; any inconsistency, or a deployment vLLM would refuse to start
    (unless ``scenario.allow_refused``), is a one-line KvplanError naming ``where``. Warnings are
    emitted as KvplanWarning and kept in :attr:`Deployment.warnings`."""
    try:
        model = load_model(_resolve(scenario.model, base_dir) if scenario.model.endswith(".json") else scenario.model)
    except KvplanError as err:
        raise KvplanError(f"{where}: model: {err}") from None
    try:
        gpu = get_gpu(scenario.gpu)
    except KvplanError as err:
        raise KvplanError(f"{where}: gpu: {err}") from None
    max_model_len = scenario.max_model_len or model.max_position_embeddings
    max_seqs = scenario.max_num_seqs
    batched = scenario.max_num_batched_tokens
    if batched is None:  # vLLM's defaults: 8192 with chunked prefill, else a whole prompt
        batched = max(8192, max_seqs) if scenario.enable_chunked_prefill else max(max_model_len, max_seqs)

    def capacity_at(tp: int, kv_cache_dtype: str) -> KVCapacity:
        return kv_capacity(
            model, gpu, tp=tp, kv_cache_dtype=kv_cache_dtype, quantization=scenario.quantization,
            block_size=scenario.block_size, gpu_memory_utilization=scenario.gpu_memory_utilization,
            max_num_batched_tokens=batched, max_num_seqs=max_seqs, max_model_len=max_model_len,
            knobs=SCENARIO_KEYS)

    try:
        cap = capacity_at(scenario.tensor_parallel, scenario.kv_cache_dtype)
    except KvplanError as err:
        raise KvplanError(f"{where}: {err}") from None
    startup = check_startup(model, gpu, cap, block_size=scenario.block_size,
                            max_model_len=max_model_len,
                            num_gpu_blocks_override=scenario.num_gpu_blocks_override,
                            capacity_at=capacity_at)
    said = startup.raise_or_warnings(where, scenario.allow_refused)
    for warning in said:
        warn_user(f"{where}: {warning}")
    num_blocks = scenario.num_gpu_blocks_override or cap.num_blocks
    swap_tokens = int(scenario.swap_space * GIB // cap.bytes_per_token)
    try:
        sched = SchedulerConfig(
            max_num_seqs=max_seqs, max_num_batched_tokens=batched, max_model_len=max_model_len,
            block_size=scenario.block_size, enable_chunked_prefill=scenario.enable_chunked_prefill,
            enable_prefix_caching=scenario.enable_prefix_caching,
            preemption_mode=scenario.preemption_mode, swap_space_tokens=swap_tokens,
            beam_replace_prob=scenario.beam_replace_prob, seed=scenario.seed,
        )
    except ValueError as err:
        raise KvplanError(f"{where}: {err}") from None
    latency = _latency_model(scenario, base_dir, model, gpu, cap, force_profile)
    return Deployment(scenario, model, gpu, cap, num_blocks, sched, latency, said)


def _resolve(path: str, base_dir: Path) -> str:
    p = Path(path)
    return str(p if p.is_absolute() or p.exists() else base_dir / p)


def _latency_model(scenario: Scenario, base_dir: Path, model: ModelConfig, gpu: GPUSpec,
                   cap: KVCapacity, force_profile: bool) -> LatencyModel:
    spec = scenario.latency
    if spec.model == "constant":
        assert spec.step_s is not None
        return ConstantLatency(spec.step_s)
    if spec.model == "profile":
        assert spec.profile is not None
        profile = read_profile(_resolve(spec.profile, base_dir))
        if not force_profile:
            check_profile_matches(profile, model=model.name, tensor_parallel=scenario.tensor_parallel,
                                  kv_cache_dtype=cap.kv_cache_dtype, gpu=gpu.name)
        return ProfileLatency(profile, block_size=scenario.block_size)
    return RooflineLatency(
        model, gpu, tp=scenario.tensor_parallel, kv_cache_dtype=scenario.kv_cache_dtype,
        quantization=cap.weight_format,  # the one sizing resolved: same bytes, same GEMM dtype
        block_size=scenario.block_size, mem_efficiency=spec.mem_efficiency,
        flops_efficiency=spec.flops_efficiency, fp8_flops_efficiency=spec.fp8_flops_efficiency,
        moe_flops_efficiency=spec.moe_flops_efficiency,
        step_overhead_s=spec.step_overhead_s, prefill_overhead_s=spec.prefill_overhead_s,
        allreduce_latency_s=spec.allreduce_latency_s, request_overhead_s=spec.request_overhead_s,
    )
