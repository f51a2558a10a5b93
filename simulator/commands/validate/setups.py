"""From published rows to the scenarios that reproduce them.

Rows that describe one benchmark run (same source, engine, model, GPU, TP, dtypes, lengths and
load: :attr:`PublishedRow.setup_key`) form a :class:`Setup`, simulated once. A setup becomes a
scenario mapping — the same one ``simulate`` reads — with:

* the model from the catalog (a Hugging Face id; an FP8 checkpoint of a catalog model is that
  model with ``quantization: fp8``), the GPU, TP, the KV dtype, and ``quantization`` from the
  row's weight dtype;
* the engine's scheduler knobs (:data:`ENGINE_KNOBS`, each with its source);
* a fixed-length synthetic workload (``input_tokens``/``output_tokens``), offered as the row's
  load: ``concurrency`` N closed-loop clients, Poisson arrivals at ``rate``, a ``burst`` of every
  request at t = 0, or a static ``batch`` of N (a burst of N with room for all of them).

Data parallelism (num_gpus > tensor_parallel): the replicas share the load evenly, so one replica
is simulated with 1/R of it and throughputs are scaled by R.

A row that cannot be simulated — its lengths are not stated (a dataset we do not ship), its
model or GPU is not in the catalog — is kept with the reason, never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.commands.validate.table import PublishedRow

# Requests simulated per setup. Published runs are often longer (1,000–30,000 prompts). A closed
# loop whose request count is stated and short is simulated whole (its first wave, every client
# sending at t = 0, is part of what was measured); otherwise its steady state is measured. A
# Poisson run of a few minutes of traffic gives its steady state.
STEADY_WAVES = 8  # closed loops measured at steady state: 8 waves, the first one warm-up
MAX_CLOSED_LOOP_WAVES = 16  # a stated request count up to 16 waves is simulated whole
MIN_CLOSED_LOOP_REQUESTS = 32
RATE_REQUESTS = (200, 1500)  # at least, at most
RATE_WINDOW_S = 120.0
BURST_DEFAULT_REQUESTS = 1000  # vllm bench serve --num-prompts default (vllm/benchmarks/serve.py)
MAX_BURST_REQUESTS = 30_000


@dataclass(frozen=True)
class EngineKnobs:
    """Scheduler knobs an engine runs a benchmark with, and where they come from."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    gpu_memory_utilization: float
    source: str
    engine: str = "vllm-v1"  # the kvplan engine that schedules the run (allocator paged)


def engine_knobs(row: PublishedRow) -> EngineKnobs:
    """The knobs of the row's engine at its defaults (the published runs rarely change them).

    vLLM V1 (default engine from v0.8.0) picks its batch defaults by GPU and entry point
    (vllm/engine/arg_utils.py, ``EngineArgs.get_batch_defaults``): on GPUs with ≥ 70 GiB that
    are not A100s, ``vllm serve`` 8192 batched tokens / 1024 sequences and the offline ``LLM``
    class (``vllm bench throughput``) 16384 / 1024; elsewhere 2048 / 256 and 8192 / 256. vLLM
    V0 (before v0.8.0) ran 256 sequences without chunked prefill for models with short windows
    (vllm/config.py ``SchedulerConfig``: max_num_seqs 256, max_num_batched_tokens =
    max(max_model_len, 2048)). TensorRT-LLM (and NIM, which serves through it) is benchmarked
    with large batches and chunked context (``trtllm-bench`` tunes max_batch_size /
    max_num_tokens per run; 2048 / 8192 here, its documented upper defaults in
    docs/source/performance/perf-overview.md). Other engines: vLLM V1's serving defaults.
    """
    gpu = get_gpu(row.gpu)
    big = gpu.hbm_gib >= 70 and not gpu.name.startswith("A100")
    offline = row.load in ("burst", "batch")
    engine = row.engine
    if engine == "vllm" and _version(row.engine_version) < (0, 8):
        return EngineKnobs(256, 0, False, 0.9,
                           "vLLM V0 defaults: 256 seqs, no chunked prefill (vllm/config.py)")
    if engine in ("tensorrt-llm", "nim"):
        # kvplan's TensorRT-LLM engine (simulator/scheduler/trtllm.py): its capacity scheduler
        # (GUARANTEED_NO_EVICT by default: a request is admitted only when the blocks of its
        # whole sequence fit, so it never preempts), its micro-batch scheduler and its KV pool
        # (tokens_per_block 32, sized as free_gpu_memory_fraction of the memory left after the
        # weights and activations: trtllm_capacity). perf-overview.md runs "in many cases" with
        # --kv_cache_free_gpu_mem_fraction 0.95, and with chunked context.
        return EngineKnobs(2048, 8192, True, 0.95,
                           "TensorRT-LLM batch limits and KV fraction 0.95 (perf-overview.md),"
                           " GUARANTEED_NO_EVICT", engine="trtllm")
    if big:
        tokens = 16384 if offline and engine == "vllm" else 8192
        return EngineKnobs(1024, tokens, True, 0.9,
                           "vLLM V1 get_batch_defaults, >= 70 GiB (vllm/engine/arg_utils.py)")
    tokens = 8192 if offline and engine == "vllm" else 2048
    return EngineKnobs(256, tokens, True, 0.9,
                       "vLLM V1 get_batch_defaults, < 70 GiB or A100 (vllm/engine/arg_utils.py)")


def _version(text: str) -> tuple[int, int]:
    """``"0.6.0"`` -> (0, 6); unknown or unparsable versions count as current."""
    digits = [p for p in text.replace("v", " ").replace("-", " ").split() if p[:1].isdigit()]
    if not digits:
        return (99, 0)
    parts = digits[0].split(".")
    try:
        return (int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0)
    except ValueError:
        return (99, 0)


_QUANTIZATION_BY_WEIGHT_DTYPE = {
    "bf16": "none", "fp16": "none", "auto": "auto", "fp8": "fp8", "int8": "int8",
    "int4": "awq", "awq": "awq", "gptq": "gptq", "mxfp4": "mxfp4",
}
_CHECKPOINT_SUFFIXES = ("-fp8-dynamic", "-fp8-kv", "-fp8", "-w8a8", "-awq", "-gptq-int4")
_ORG_REWRITES = {"neuralmagic": "meta-llama", "nvidia": "meta-llama", "redhatai": "meta-llama",
                 "amd": "meta-llama"}


def resolve_model(hf_id: str) -> str:
    """The catalog name for ``hf_id``: the id itself, or the base model of a quantized
    checkpoint (``nvidia/Llama-3.1-8B-Instruct-FP8`` -> Llama-3.1-8B). KvplanError if unknown."""
    try:
        return get_model(hf_id).name
    except KvplanError as first:
        org, _, name = hf_id.lower().rpartition("/")
        for suffix in _CHECKPOINT_SUFFIXES:
            if name.endswith(suffix):
                name = name.removesuffix(suffix)
                break
        else:
            raise first from None
        for candidate in (f"{org}/{name}", f"{_ORG_REWRITES.get(org, org)}/{name}", name):
            try:
                return get_model(candidate).name
            except KvplanError:
                continue
        raise first from None


@dataclass
class Setup:
    """One published benchmark run: its rows, and the scenario that reproduces it (or why not)."""

    rows: list[PublishedRow]
    scenario: dict[str, Any] | None = None
    skip_reason: str | None = None
    num_replicas: int = 1  # data-parallel replicas the published load was spread over
    knobs: EngineKnobs | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> PublishedRow:
        return self.rows[0]

    @property
    def label(self) -> str:
        r = self.first
        load = {"concurrency": f"c={_g(r.load_value)}", "rate": f"{_g(r.load_value)} req/s",
                "burst": "burst", "batch": f"batch {_g(r.load_value)}"}[r.load]
        lengths = f"{r.input_tokens}/{r.output_tokens}" if r.input_tokens else r.dataset
        return f"{r.source}: {r.model.rsplit('/', 1)[-1]} {r.gpu} TP{r.tensor_parallel} {lengths} {load}"


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def group_setups(rows: Sequence[PublishedRow]) -> list[Setup]:
    """Rows grouped by benchmark run (first-seen order), each with its scenario or skip reason."""
    by_key: dict[tuple[object, ...], Setup] = {}
    for row in rows:
        setup = by_key.get(row.setup_key)
        if setup is None:
            setup = by_key[row.setup_key] = Setup([row])
            _build(setup)
        else:
            setup.rows.append(row)
    return list(by_key.values())


def _build(setup: Setup) -> None:
    r = setup.first
    if r.input_tokens is None or r.output_tokens is None:
        setup.skip_reason = f"lengths not stated (dataset '{r.dataset or '?'}' is not shipped)"
        return
    try:
        model = resolve_model(r.model)
    except KvplanError as err:
        setup.skip_reason = f"model not in the catalog ({err})"
        return
    try:
        gpu = get_gpu(r.gpu).name
    except KvplanError:
        setup.skip_reason = f"GPU '{r.gpu}' not in the catalog"
        return
    if r.load != "burst" and r.load_value is None:
        setup.skip_reason = f"the {r.load} of the run is not stated"
        return
    quantization = _QUANTIZATION_BY_WEIGHT_DTYPE.get(r.weight_dtype)
    if quantization is None:
        setup.skip_reason = f"weight dtype '{r.weight_dtype}' not modelled"
        return
    knobs = engine_knobs(r)
    setup.knobs = knobs
    replicas = r.num_replicas
    setup.num_replicas = replicas
    workload = _workload(r, replicas)
    if isinstance(workload, str):
        setup.skip_reason = workload
        return
    max_model_len = r.input_tokens + r.output_tokens
    kv_dtype = "auto" if r.kv_cache_dtype in ("", "auto") else r.kv_cache_dtype
    modelopt_fp8 = r.weight_dtype == "fp8" and (r.model.lower().startswith("nvidia/") or r.engine == "nim")
    if kv_dtype == "auto" and r.model.lower().endswith("-fp8-kv"):
        kv_dtype = "fp8"  # AMD's Quark checkpoints name their FP8 KV cache ("...-FP8-KV")
        setup.notes.append("KV cache fp8: the checkpoint quantizes its KV cache (-FP8-KV)")
    elif kv_dtype == "auto" and modelopt_fp8:
        # NVIDIA's ModelOpt FP8 checkpoints declare an FP8 KV cache in hf_quant_config.json
        # ("kv_cache_quant_algo": "FP8", the format vLLM's ModelOpt loader documents in
        # vllm/model_executor/layers/quantization/modelopt.py), so "auto" means fp8 for them;
        # NIM's fp8 profiles are TensorRT-LLM engines built from such checkpoints (an
        # assumption, consistent with the NIM rows: 917 tok/s at 93 ms ITL is ~85 sequences of
        # 5.5k tokens, a pool only an FP8 KV cache leaves on 2 × H100 next to 70B FP8 weights).
        kv_dtype = "fp8"
        setup.notes.append("KV cache fp8 assumed: ModelOpt FP8 checkpoints declare kv_cache_quant_algo FP8")
    scenario: dict[str, Any] = {
        "name": r.row_id, "model": model, "gpu": gpu, "tensor_parallel": r.tensor_parallel,
        "engine": knobs.engine, "allocators": ["paged"], "kv_cache_dtype": kv_dtype,
        "quantization": quantization, "max_model_len": max_model_len,
        "gpu_memory_utilization": knobs.gpu_memory_utilization,
        "max_num_seqs": knobs.max_num_seqs, "enable_chunked_prefill": knobs.enable_chunked_prefill,
        "workload": workload,
    }
    if r.load == "batch":  # a static batch: all N run together
        scenario["max_num_seqs"] = max(knobs.max_num_seqs, int(r.load_value or 1))
    if knobs.max_num_batched_tokens:
        scenario["max_num_batched_tokens"] = max(knobs.max_num_batched_tokens, scenario["max_num_seqs"])
    else:  # no chunked prefill: a step holds a whole prompt
        scenario["max_num_batched_tokens"] = max(max_model_len, 2048, scenario["max_num_seqs"])
    setup.scenario = scenario


def _workload(r: PublishedRow, replicas: int) -> dict[str, Any] | str:
    """The workload mapping of one replica's share of the row's load (or why it cannot be made)."""
    assert r.input_tokens is not None and r.output_tokens is not None
    base: dict[str, Any] = {"prompt_tokens": {"dist": "fixed", "value": r.input_tokens},
                            "output_tokens": {"dist": "fixed", "value": r.output_tokens}}
    if r.load == "concurrency":
        assert r.load_value is not None
        clients = r.load_value / replicas
        if clients != int(clients):
            return f"{r.load_value:g} clients do not split evenly over {replicas} replicas"
        n = int(clients)
        prompts = r.num_prompts // replicas if r.num_prompts else None
        if prompts is not None and prompts <= MAX_CLOSED_LOOP_WAVES * max(n, 8):
            return {**base, "concurrency": n, "num_requests": max(prompts, 1)}
        # Unknown or long runs: the steady state — the first wave (all clients sending at once
        # at t = 0) is warm-up, as it is a small share of a long benchmark's requests.
        count = max(STEADY_WAVES * n, MIN_CLOSED_LOOP_REQUESTS)
        return {**base, "concurrency": n, "num_requests": count, "warmup_requests": n}
    if r.load == "rate":
        assert r.load_value is not None
        rate = r.load_value / replicas
        count = int(min(max(rate * RATE_WINDOW_S, RATE_REQUESTS[0]), RATE_REQUESTS[1]))
        if r.num_prompts:
            count = min(count, max(1, r.num_prompts // replicas))
        return {**base, "arrival": {"process": "poisson"}, "rate": rate, "num_requests": count}
    if r.load == "batch":
        assert r.load_value is not None
        return {**base, "rate": math.inf, "num_requests": max(1, int(r.load_value) // replicas)}
    total = r.num_prompts or (int(r.load_value) if r.load_value else BURST_DEFAULT_REQUESTS)
    return {**base, "rate": math.inf, "num_requests": max(1, min(total, MAX_BURST_REQUESTS) // replicas)}
