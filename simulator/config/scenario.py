"""Scenario YAML -> a validated, typed :class:`Scenario` (clear one-line errors, nothing eval'd).

::

    name: chat
    model: llama-3.1-8b            # catalog name, HF id, or a path to a config.json
    gpu: h100-80gb
    tensor_parallel: 1
    data_parallel_size: 1          # attention DP ranks (engines of tensor_parallel GPUs each)
    enable_expert_parallel: false  # vLLM's: the MoE expert parallel over all those GPUs
    moe_tensor_parallel_size: null # the MoE layers' own TP and EP sizes (SGLang, TensorRT-LLM),
    moe_expert_parallel_size: null #   their product data_parallel_size × tensor_parallel; null: derived
    moe_dispatch: null             # all-to-all or all-gather: how the MoE gets other DP ranks' tokens
    expert_routing: {distribution: uniform}   # or {distribution: zipf, skew: 1.0}
    allocators: [paged, contiguous-max, contiguous-pow2, contiguous-oracle]
    engine: vllm-v1                # vllm-v1 (default), vllm-v0, sglang, or trtllm
    engine_version: "1.2"          # trtllm only: the TensorRT-LLM release whose defaults apply
    # the engine's knobs, under vLLM's names (SGLang's and TensorRT-LLM's own under theirs)
    gpu_memory_utilization: 0.9    # default: 0.9 (vLLM); SGLang: its mem_fraction_static by GPU;
                                   # TensorRT-LLM: free_gpu_memory_fraction (of the memory left)
    block_size: 16                 # default: 16 (vLLM), 1 (SGLang's page size), 32 (TensorRT-LLM)
    max_model_len: 8192
    max_model_len_policy: reject   # or truncate: cut the output at the window
    kv_cache_dtype: auto
    quantization: auto             # vLLM's --quantization: auto (the checkpoint's), none, fp8, awq...
    max_num_seqs: 256              # default: the engine's for the GPU (vLLM V1: 1024 on H100)
    max_num_batched_tokens: 8192
    enable_chunked_prefill: true   # default: true (vLLM V1, SGLang), false (TensorRT-LLM; vLLM V0
                                   # unless max_model_len > 32768)
    capacity_scheduler_policy: GUARANTEED_NO_EVICT   # trtllm only; or MAX_UTILIZATION
    enable_prefix_caching: false   # default: true for vllm-v1 and sglang, false for vllm-v0
    swap_space: 4                  # GiB of CPU memory per GPU for swapped-out KV
    kv_offload: {size_gib: 64}     # a CPU tier below HBM's prefix cache (vLLM's OffloadingConnector)
    speculative: {method: eagle, num_speculative_tokens: 3, acceptance_rate: 0.7}   # vllm-v1
    preemption_mode: recompute
    latency: {model: roofline}     # or {model: profile, profile: profiles/h100-llama-3.1-8b.yaml}
    workload: {trace: bundled:azure-conv}
    slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.1}
    allow_refused: false           # true: simulate a deployment vLLM would refuse to start

Unknown keys are errors that suggest the near name; values are type- and range-checked (a YAML
boolean where a number belongs is an error, not 1 or 0). A deployment vLLM would refuse to start
(simulator/config/refusals.py) is an error that says why and what would make it start, unless
``allow_refused: true`` (``--set allow_refused=true`` on simulate and capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.errors import KvplanError, ScenarioError, did_you_mean
from simulator.kv.quantization import canonical_quantization
from simulator.scheduler.router import POLICIES, SCORERS, RouterConfig
from simulator.scheduler.config import CAPACITY_SCHEDULER_POLICIES, ENGINES, EngineName
from simulator.yamlfile import read_yaml
from workloads.spec import WorkloadSpec, format_validation_error, no_bool_for_number

V1_KNOBS = ("long_prefill_token_threshold", "max_num_partial_prefills", "scheduler_reserve_full_isl",
            "watermark")
SGLANG_KNOBS = ("schedule_policy", "radix_eviction_policy", "max_prefill_tokens",
                "schedule_conservativeness")
TRTLLM_KNOBS = ("capacity_scheduler_policy", "engine_version")
# engines that run their own block or token pool: allocator paged only
POOL_ENGINES = ("sglang", "trtllm")
ALLOCATORS: tuple[str, ...] = ("paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle")
ALLOCATOR_ALIASES = {"max": "contiguous-max", "pow2": "contiguous-pow2", "oracle": "contiguous-oracle"}


def canonical_allocator(name: str) -> str:
    """The canonical allocator name for ``name`` (short aliases: max, pow2, oracle)."""
    name = ALLOCATOR_ALIASES.get(name, name)
    if name not in ALLOCATORS:
        choices = ALLOCATORS + tuple(ALLOCATOR_ALIASES)
        raise ScenarioError(f"unknown allocator '{name}'{did_you_mean(name, choices) or ' (known: ' + ', '.join(ALLOCATORS) + ')'}")
    return name


def _one_of(value: str, known: Sequence[str], what: str) -> str:
    """``value`` if it is one of ``known``; else a ValueError naming the near one (or all)."""
    if value not in known:
        hint = did_you_mean(value, known) or f" (known: {', '.join(known)})"
        raise ValueError(f"unknown {what} {value!r}{hint}")
    return value


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_number(cls, data: object) -> object:
        return no_bool_for_number(cls, data)


class LatencySpec(_Spec):
    model: Literal["roofline", "profile", "constant"] = "roofline"
    profile: str | None = None  # profile file (relative to the scenario file)
    # roofline constants; None = the defaults fitted to published measurements for the GPU
    # (simulator/latency/constants.py, `kvplan validate`)
    mem_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    flops_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    fp8_flops_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    moe_flops_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    step_overhead_s: Annotated[float, Field(ge=0, le=10)] | None = None
    prefill_overhead_s: Annotated[float, Field(ge=0, le=10)] | None = None
    allreduce_latency_s: Annotated[float, Field(ge=0, le=1)] | None = None
    # per expert-parallel dispatch or combine; None = allreduce_latency_s's value
    alltoall_latency_s: Annotated[float, Field(ge=0, le=1)] | None = None
    request_overhead_s: Annotated[float, Field(ge=0, le=10)] | None = None
    step_s: Annotated[float, Field(gt=0, le=100)] | None = None  # constant model

    @model_validator(mode="after")
    def _needs(self) -> LatencySpec:
        if self.model == "profile" and not self.profile:
            raise ValueError("model 'profile' needs 'profile: PATH'")
        if self.model == "constant" and self.step_s is None:
            raise ValueError("model 'constant' needs 'step_s'")
        return self


class SLOSpec(_Spec):
    ttft_p99_s: Annotated[float, Field(gt=0)] | None = None
    tpot_p99_s: Annotated[float, Field(gt=0)] | None = None
    e2e_p99_s: Annotated[float, Field(gt=0)] | None = None
    max_rejected_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0


class RouterSpec(_Spec):
    """``router:``: how requests are spread over ``num_replicas`` (:mod:`simulator.scheduler.router`)."""

    policy: str = "least-outstanding"
    # 0: the router reads each replica's state at the send; T > 0: as reported every T seconds
    refresh_interval_s: Annotated[float, Field(ge=0, le=86400)] = 0.0
    # weighted: scorer -> weight (queue, kv-utilization, prefix); default {queue: 1,
    # kv-utilization: 1, prefix: 2}
    scorers: dict[str, Annotated[float, Field(ge=0, le=1000)]] | None = None
    # prefix-affinity (SGLang's cache-aware router; its command line's defaults)
    cache_threshold: Annotated[float, Field(ge=0, le=1)] = 0.3
    balance_abs_threshold: Annotated[int, Field(ge=0)] = 64
    balance_rel_threshold: Annotated[float, Field(ge=1)] = 1.5
    # the router-side prefix cache: block size (tokens), LRU capacity per replica (blocks)
    block_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 16
    lru_capacity_blocks: Annotated[int, Field(ge=1)] = 31250

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, data: object) -> object:
        """``router: least-outstanding`` (a policy name where the mapping belongs) is an error
        that shows how to write it, rather than pydantic's "a valid dictionary or instance of
        RouterSpec"."""
        if isinstance(data, str):
            raise ValueError(f"a mapping, not a policy name: write router: {{policy: {data}}} (on the "
                             f"command line, --set router.policy={data})")
        return data

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        return _one_of(value, POLICIES, "routing policy")

    @model_validator(mode="after")
    def _scorers(self) -> RouterSpec:
        if self.scorers is not None:
            if self.policy != "weighted":
                raise ValueError(f"scorers are for policy 'weighted', not {self.policy!r}")
            for name in self.scorers:
                if name not in SCORERS:
                    hint = did_you_mean(name, SCORERS) or f" (known: {', '.join(SCORERS)})"
                    raise ValueError(f"unknown scorer {name!r}{hint}")
            if not any(self.scorers.values()):
                raise ValueError("give at least one scorer a weight above 0")
        return self

    def config(self) -> RouterConfig:
        """The engine's :class:`RouterConfig` for this spec."""
        extra = {} if self.scorers is None else {"scorers": tuple(self.scorers.items())}
        return RouterConfig(self.policy, self.refresh_interval_s, cache_threshold=self.cache_threshold,
                            balance_abs_threshold=self.balance_abs_threshold,
                            balance_rel_threshold=self.balance_rel_threshold,
                            block_tokens=self.block_tokens, lru_capacity_blocks=self.lru_capacity_blocks,
                            **extra)


class PoolSpec(_Spec):
    """One side of ``disaggregation:``: its replicas, and the GPU and tensor parallelism they run
    (None: the scenario's ``gpu`` / ``tensor_parallel``)."""

    replicas: Annotated[int, Field(ge=1, le=4096)] = 1
    gpu: str | None = None
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] | None = None


class LinkSpec(_Spec):
    """The KV link of each prefill replica: one transfer at a time, ``latency_s`` plus the
    request's KV bytes over ``bandwidth_gb_s`` (10^9 bytes per second)."""

    bandwidth_gb_s: Annotated[float, Field(gt=0)]
    latency_s: Annotated[float, Field(ge=0, le=60)] = 0.0


class DisaggregationSpec(_Spec):
    """``disaggregation:``: prefill and decode on separate replicas, the prompt's KV moved between
    them (simulator/engine/disagg.py)."""

    prefill: PoolSpec
    decode: PoolSpec
    link: LinkSpec


class KVOffloadSpec(_Spec):
    """``kv_offload:``: a CPU tier below HBM's prefix cache, per replica, as vLLM's
    OffloadingConnector with its CPU backend keeps it (rules: simulator/kv/paged.py). Engines
    vllm-v1 and vllm-v0, allocator ``paged`` (contiguous allocators run without it). SGLang's
    counterpart, HiCache (a host-memory radix tree below the device one, written through or
    back, loaded before the prefill: python/sglang/srt/mem_cache/hiradix_cache.py), is not
    modelled."""

    # CPU memory for the whole replica (every rank's share of a block): vLLM's
    # cpu_bytes_to_use // (page bytes x layers x world_size) blocks (vllm/v1/kv_offload/cpu/spec.py)
    size_gib: Annotated[float, Field(ge=0, le=1 << 20)] = 64.0
    # host-to-device rate of loads, GB/s per GPU; None = the GPU's PCIe (simulator/kv/gpus.py)
    bandwidth_gb_s: Annotated[float, Field(gt=0, le=100_000)] | None = None


class ExpertRoutingSpec(_Spec):
    """``expert_routing:``: how an MoE model's tokens pick experts, for the busiest expert-parallel
    rank's load (simulator/kv/expert_parallel.py): ``uniform``, or ``zipf`` with ``skew`` > 0."""

    distribution: Literal["uniform", "zipf"] = "uniform"
    skew: Annotated[float, Field(ge=0, le=10)] = 0.0

    @model_validator(mode="after")
    def _skew(self) -> ExpertRoutingSpec:
        if self.distribution == "zipf" and self.skew <= 0:
            raise ValueError("distribution zipf needs skew > 0")
        if self.distribution == "uniform" and self.skew:
            raise ValueError("skew is for distribution zipf")
        return self


SPEC_METHODS: tuple[str, ...] = ("eagle", "draft_model", "mtp", "ngram")
# Draft tokens a request may verify in one step: vLLM's rejection sampler takes at most
# MAX_SPEC_LEN = 128 (vllm/v1/sample/rejection_sampler.py; RejectionSampler.forward asserts
# metadata.max_spec_len <= MAX_SPEC_LEN, so a step with more drafts fails).
MAX_SPECULATIVE_TOKENS = 128


class SpeculativeSpec(_Spec):
    """``speculative:``: speculative decoding, as vLLM's ``--speculative-config`` names it
    (vllm/config/speculative.py: ``method``, ``num_speculative_tokens``, ``model``). The target
    accepts draft i with probability ``per_position[i]`` given drafts 1..i-1 were accepted, or
    ``acceptance_rate`` at every position (simulator/scheduler/spec.py). Engine vllm-v1 only."""

    method: str
    num_speculative_tokens: int
    acceptance_rate: float | None = None
    per_position: tuple[float, ...] | None = None
    draft_model: str | None = None  # catalog name of the draft model (method draft_model only)

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        return _one_of(value, SPEC_METHODS, "speculative method")

    @model_validator(mode="after")
    def _rates(self) -> SpeculativeSpec:
        k = self.num_speculative_tokens
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        if k > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens {k} exceeds vLLM's limit of"
                             f" {MAX_SPECULATIVE_TOKENS} draft tokens per request and step")
        if (self.acceptance_rate is None) == (self.per_position is None):
            raise ValueError("give acceptance_rate or per_position (one of them)")
        if self.per_position is not None and len(self.per_position) != k:
            raise ValueError(f"per_position needs {k} rates (num_speculative_tokens), got "
                             f"{len(self.per_position)}")
        for rate in self.rates:
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"acceptance rates must be in [0, 1], got {rate}")
        if self.method == "draft_model" and not self.draft_model:
            raise ValueError("method draft_model needs draft_model: <catalog model name>")
        if self.method != "draft_model" and self.draft_model:
            raise ValueError(f"draft_model is for method draft_model, not {self.method}")
        return self

    @property
    def rates(self) -> tuple[float, ...]:
        """P(draft i accepted | drafts before it accepted), one per position."""
        if self.per_position is not None:
            return tuple(self.per_position)
        return (float(self.acceptance_rate),) * self.num_speculative_tokens  # type: ignore[arg-type]


class Scenario(_Spec):
    name: str = ""
    description: str = ""
    seed: int = 0
    model: str
    gpu: str
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    # Attention data parallelism (simulator/kv/expert_parallel.py): data_parallel_size DP ranks of
    # tensor_parallel GPUs each, every one with its own requests and KV cache (KV heads split over
    # its tensor_parallel ranks), simulated as that many replicas per num_replicas. vLLM:
    # --data-parallel-size, --tensor-parallel-size. SGLang (--tp-size N --dp-size D
    # --enable-dp-attention): data_parallel_size D, tensor_parallel N / D. TensorRT-LLM
    # (tp_size N, enable_attention_dp): data_parallel_size N, tensor_parallel 1. AIConfigurator's
    # attention_dp_size and tp_size.
    data_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    # vLLM's --enable-expert-parallel: the MoE layers expert parallel over all the
    # data_parallel_size × tensor_parallel GPUs, whole experts (moe_expert_parallel_size = them,
    # moe_tensor_parallel_size 1)
    enable_expert_parallel: bool = False
    # The MoE layers' own layout over those same GPUs: the routed experts split over
    # moe_expert_parallel_size groups, each expert TP-sharded over moe_tensor_parallel_size ranks;
    # moe_tensor_parallel_size × moe_expert_parallel_size = data_parallel_size × tensor_parallel
    # (TensorRT-LLM's Mapping check). SGLang: moe_expert_parallel_size = --ep-size (its MoE TP is
    # --tp-size / --ep-size). TensorRT-LLM: moe_tensor_parallel_size / moe_expert_parallel_size.
    # AIConfigurator: moe_tp_size / moe_ep_size. None: derived, one from the other; both unset,
    # vLLM's layout (enable_expert_parallel: all EP; else every expert TP-sharded over all GPUs).
    moe_tensor_parallel_size: Annotated[int, Field(ge=1, le=4096)] | None = None
    moe_expert_parallel_size: Annotated[int, Field(ge=1, le=4096)] | None = None
    # How the MoE layers get the other DP ranks' tokens (data_parallel_size > 1): all-to-all
    # (dispatch to the experts' ranks and combine back: vLLM's deepep_* / pplx all2all backends,
    # SGLang's --moe-a2a-backend deepep, TensorRT-LLM's all-to-all) or all-gather (all-gather
    # before, reduce-scatter after: vLLM's allgather_reducescatter, SGLang without an a2a backend,
    # TensorRT-LLM's fallback). None: all-to-all for whole experts over every GPU
    # (moe_tensor_parallel_size 1), else all-gather.
    moe_dispatch: Literal["all-to-all", "all-gather"] | None = None
    expert_routing: ExpertRoutingSpec = ExpertRoutingSpec()
    num_replicas: Annotated[int, Field(ge=1, le=4096)] = 1
    router: RouterSpec = RouterSpec()  # which replica each request goes to (simulator/scheduler/router.py)
    allocators: tuple[str, ...] = ("paged",)
    # the serving engine whose scheduling and KV policy decide (simulator/scheduler/__init__.py);
    # `simulate` also takes a list, and runs every engine on the same requests side by side
    engine: EngineName | tuple[EngineName, ...] = "vllm-v1"
    # TensorRT-LLM only: the release whose defaults fill the knobs left unset (simulator/scheduler/
    # trtllm.py TRTLLM_DEFAULTS: 1.0, 1.2; a patch release or rc reads as its release); None = the
    # newest kvplan follows
    engine_version: str | None = None
    # share of HBM for the engine (vLLM); SGLang's mem_fraction_static. None = the engine's
    # default: 0.9 (vLLM), SGLang's by GPU memory
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    # KV block (vLLM) or page (SGLang) size in tokens; None = the engine's default (16 / 1)
    block_size: Annotated[int, Field(ge=1, le=4096)] | None = None
    max_model_len: Annotated[int, Field(ge=2, le=10_000_000)] | None = None
    # a request longer than the window: refused at arrival as a vLLM server does (reject), or cut
    # to fit (truncate); see workloads.synthetic.fit_to_max_model_len
    max_model_len_policy: Literal["reject", "truncate"] = "reject"
    kv_cache_dtype: str = "auto"
    # vLLM's --quantization names (simulator/kv/quantization.py); auto = the checkpoint's
    quantization: str = "auto"
    # None = the engine's default for the GPU (simulator/config/deployment.py engine_defaults)
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    # None = the engine's default: on for vLLM and SGLang, off for TensorRT-LLM (BaseLlmArgs)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    # vLLM V1 only (vllm/config/scheduler.py); None = vLLM's default
    long_prefill_token_threshold: Annotated[int, Field(ge=0, le=10_000_000)] | None = None
    max_num_partial_prefills: Annotated[int, Field(ge=1, le=65536)] | None = None
    scheduler_reserve_full_isl: bool | None = None
    watermark: Annotated[float, Field(ge=0, lt=1)] | None = None
    # SGLang only (python/sglang/srt/server_args.py); None = SGLang's default
    schedule_policy: Literal["fcfs", "lpm"] | None = None
    radix_eviction_policy: Literal["lru", "lfu"] | None = None
    max_prefill_tokens: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    schedule_conservativeness: Annotated[float, Field(gt=0, le=100)] | None = None
    # TensorRT-LLM only (SchedulerConfig.capacity_scheduler_policy, tensorrt_llm/llmapi/llm_args.py);
    # None = the release's default (GUARANTEED_NO_EVICT)
    capacity_scheduler_policy: Literal["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"] | None = None
    swap_space: Annotated[float, Field(ge=0, le=4096)] = 4.0
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    num_gpu_blocks_override: Annotated[int, Field(ge=1)] | None = None
    beam_replace_prob: Annotated[float, Field(ge=0, le=1)] = 0.5
    latency: LatencySpec = LatencySpec()
    workload: WorkloadSpec
    slo: SLOSpec | None = None
    # knob -> values, read by `kvplan capacity`; `simulate` runs the scenario as written
    sweep: dict[str, list[Any]] | None = None
    # simulate a deployment vLLM would refuse to start (simulator/config/refusals.py): the refusal
    # becomes a warning and a note in run.json instead of an error
    allow_refused: bool = False
    # prefill/decode disaggregation (simulator/engine/disagg.py): engine vllm-v1, allocator paged
    disaggregation: DisaggregationSpec | None = None
    kv_offload: KVOffloadSpec | None = None
    speculative: SpeculativeSpec | None = None  # speculative decoding (vllm-v1)
    # vLLM's --disable-hybrid-kv-cache-manager: size sliding/chunked layers as full attention
    disable_hybrid_kv_cache_manager: bool = False

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_list(cls, value: object) -> object:
        names = list(value) if isinstance(value, (list, tuple)) else [value]
        if not names:
            raise ValueError("list at least one engine")
        for name in names:
            if name not in ENGINES:
                hint = did_you_mean(str(name), ENGINES) or f" (known: {', '.join(ENGINES)})"
                raise ValueError(f"unknown engine {name!r}{hint}")
        if len(set(names)) != len(names):
            raise ValueError("an engine is listed twice")
        return names[0] if len(names) == 1 else tuple(names)

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines to run: one, or several side by side (``simulate`` only)."""
        return (self.engine,) if isinstance(self.engine, str) else self.engine

    def allocators_of(self, engine: str) -> tuple[str, ...]:
        """The allocators ``engine`` runs: SGLang and TensorRT-LLM only their own pool (``paged``)."""
        return ("paged",) if engine in POOL_ENGINES else self.allocators

    def for_engine(self, engine: str) -> Scenario:
        """This scenario with ``engine`` alone (and the allocators it runs)."""
        return self.model_copy(update={"engine": engine, "allocators": self.allocators_of(engine)})

    @model_validator(mode="after")
    def _engine_knobs(self) -> Scenario:
        """A knob of an engine not listed, or a policy the engine does not have, is an error."""
        engines = self.engines
        owner = ({name: "vllm-v1" for name in V1_KNOBS} | {name: "sglang" for name in SGLANG_KNOBS}
                 | {name: "trtllm" for name in TRTLLM_KNOBS})
        for name, engine in owner.items():
            if getattr(self, name) is not None and engine not in engines:
                raise ValueError(f"{name} is a knob of engine {engine}; this scenario's engine "
                                 f"is {', '.join(engines)}")
        others = [e for e in engines if e != "vllm-v0"]
        if others and self.preemption_mode == "swap":
            # vllm/v1/core/sched/scheduler.py (_preempt_request): V1 frees and recomputes;
            # SGLang retracts (python/sglang/srt/managers/schedule_batch.py retract_decode);
            # TensorRT-LLM pauses (LlmRequest::pause: generated tokens into the prompt)
            raise ValueError(f"preemption_mode swap: engine {others[0]} preempts by "
                             "recompute only (swap is engine vllm-v0's)")
        for pool in POOL_ENGINES:
            if pool in engines and "paged" not in self.allocators:
                what = "token pool" if pool == "sglang" else "block pool"
                raise ValueError(f"engine {pool} runs its own {what}, allocator paged: list it")
        if self.disaggregation is not None:
            if engines != ("vllm-v1",):
                raise ValueError(f"disaggregation: engine vllm-v1 only, not {', '.join(engines)}")
            if self.allocators != ("paged",):
                raise ValueError("disaggregation: allocators must be [paged] (the prompt's KV "
                                 "moves as blocks)")
            if self.num_replicas != 1:
                raise ValueError("disaggregation: give replicas under disaggregation.prefill and "
                                 f".decode, not num_replicas ({self.num_replicas})")
        if len(engines) == 1 and engines[0] in POOL_ENGINES and self.allocators != ("paged",):
            raise ValueError(f"engine {engines[0]} manages its own pool: allocators must be "
                             "[paged] (compare contiguous reservation under engine vllm-v0)")
        return self

    @field_validator("engine_version")
    @classmethod
    def _engine_version(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from simulator.scheduler.trtllm import trtllm_version

        trtllm_version(str(value))  # a ValueError names the releases kvplan knows
        return str(value)

    @field_validator("engine_version", mode="before")
    @classmethod
    def _version_text(cls, value: object) -> object:
        """``engine_version: 1.2`` (a YAML number) is the release 1.2, not an error."""
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @field_validator("capacity_scheduler_policy", mode="before")
    @classmethod
    def _policy_name(cls, value: object) -> object:
        """TensorRT-LLM's names, in any case (``max_utilization``)."""
        if isinstance(value, str) and value.upper() in CAPACITY_SCHEDULER_POLICIES:
            return value.upper()
        return value

    @model_validator(mode="after")
    def _data_parallel(self) -> Scenario:
        """Data-parallel attention and the MoE layers' layout are simulated for vLLM V1, SGLang
        and TensorRT-LLM (``enable_expert_parallel`` reads as all EP for each); vLLM lays its MoE
        out all EP or all TP, never as a grid."""
        moe_keys = (self.moe_tensor_parallel_size, self.moe_expert_parallel_size, self.moe_dispatch)
        if (self.data_parallel_size == 1 and not self.enable_expert_parallel
                and all(key is None for key in moe_keys)):
            return self
        names = "data_parallel_size / enable_expert_parallel / moe_*"
        if "vllm-v0" in self.engines:
            raise ValueError(f"{names}: simulated for engines vllm-v1, sglang and trtllm, not "
                             "vllm-v0")
        if self.disaggregation is not None:
            raise ValueError(f"{names}: not with disaggregation")
        if "trtllm" in self.engines and self.data_parallel_size > 1 and self.tensor_parallel > 1:
            # _ParallelConfig.to_mapping (tensorrt_llm/llmapi/llm_args.py) passes no attention TP:
            # with enable_attention_dp every one of the tp_size ranks is an attention DP rank
            raise ValueError(f"engine trtllm: attention DP (enable_attention_dp) makes each GPU a DP "
                             f"rank of its own: give tensor_parallel 1 and data_parallel_size "
                             f"{self.data_parallel_size * self.tensor_parallel}, not tensor_parallel "
                             f"{self.tensor_parallel}")
        if "vllm-v1" in self.engines:
            from simulator.kv.expert_parallel import ParallelLayout

            world = self.data_parallel_size * self.tensor_parallel
            layout = ParallelLayout(self.tensor_parallel, self.data_parallel_size,
                                    self.enable_expert_parallel, self.moe_tensor_parallel_size,
                                    self.moe_expert_parallel_size)
            if layout.moe_tp * layout.moe_ep == world and 1 < layout.moe_ep < world:
                raise ValueError(
                    f"moe_tensor_parallel_size {layout.moe_tp} x moe_expert_parallel_size "
                    f"{layout.moe_ep}: vLLM runs the MoE layers all expert parallel "
                    f"(enable_expert_parallel) or all tensor parallel over the {world} GPUs, not "
                    "as a grid (vllm/model_executor/layers/fused_moe/config.py, "
                    "FusedMoEParallelConfig.make)")
        return self

    @model_validator(mode="after")
    def _speculative(self) -> Scenario:
        """Speculative decoding is simulated on vLLM V1's scheduler only."""
        if self.speculative is not None and self.engines != ("vllm-v1",):
            raise ValueError(f"speculative: simulated for engine vllm-v1 only, not "
                             f"{', '.join(e for e in self.engines if e != 'vllm-v1')}")
        return self

    @model_validator(mode="after")
    def _kv_offload(self) -> Scenario:
        """The tier stores prefix-cache block hashes, under vLLM's schedulers only."""
        if self.kv_offload is None:
            return self
        for engine in POOL_ENGINES:
            if engine in self.engines:
                raise ValueError(f"kv_offload is modelled for vLLM engines (vllm-v1, vllm-v0), not {engine}")
        if self.enable_prefix_caching is False or (
                self.enable_prefix_caching is None and "vllm-v0" in self.engines):
            raise ValueError("kv_offload needs enable_prefix_caching: true (its blocks are the "
                             "prefix cache's; vllm-v0 defaults it off)")
        return self

    @field_validator("quantization")
    @classmethod
    def _quantization(cls, value: str) -> str:
        try:
            canonical_quantization(value)
        except KvplanError as err:
            raise ValueError(str(err)) from None
        return value.strip().lower()

    @field_validator("allocators", mode="before")
    @classmethod
    def _allocators(cls, value: object) -> object:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError("list at least one allocator")
            out = []
            for v in value:
                if not isinstance(v, str):
                    raise ValueError(f"allocator names are strings, got {v!r}")
                try:
                    out.append(canonical_allocator(v))
                except KvplanError as err:
                    raise ValueError(str(err)) from None
            if len(set(out)) != len(out):
                raise ValueError("an allocator is listed twice")
            return tuple(out)
        return value


def parse_scenario(data: object, where: str) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario is a mapping of keys (model, gpu, workload, ...)")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err, where, model=Scenario) from None


def load_scenario(path: str | Path, overrides: dict[str, object] | None = None) -> tuple[Scenario, Path]:
    """Read ``path`` (YAML, loaded safely), apply dotted-key ``overrides``, validate.

    Returns the scenario and the folder relative paths in it are resolved against. The scenario's
    name defaults to the file's stem.
    """
    p = Path(path)
    where = str(path)
    data = read_yaml(p, "scenario")
    if data is None:
        raise ScenarioError(f"{where}: the scenario file is empty")
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario is a mapping of keys (model, gpu, workload, ...)")
    data.setdefault("name", p.stem)
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return parse_scenario(data, where), p.parent


def set_dotted(data: dict, key: str, value: object) -> None:
    """``set_dotted(d, "workload.rate", 8)`` sets ``d["workload"]["rate"] = 8``."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ScenarioError(f"cannot set '{key}': '{part}' is not a mapping")
        node = child
    node[parts[-1]] = value
