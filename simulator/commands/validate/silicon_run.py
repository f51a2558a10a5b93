"""The silicon table's rows as kvplan scenarios: what can be expressed, the plausibility check,
and the simulations (one per distinct setup, however many rows measured it).

A measurement becomes a scenario the way :mod:`simulator.commands.validate.setups` builds one
(model and GPU from the catalogs, TP, KV dtype, quantization, the engine's knobs) with the
InferenceX client where the row's method is InferenceX's:

* lengths uniform on [⌊0.8 L⌋, L] for prompts and outputs (``workload: prompt_tokens: {dist:
  uniform}``), outputs run to their length (``--ignore-eos``);
* a closed loop of ``concurrency`` clients sending 10 × concurrency prompts, the engine empty at
  the start (InferenceX drains its 2 × concurrency warm-up before the timed phase, so the timed
  phase starts cold but compiled: kvplan has no compile or cold-cache cost to warm up);
* the engine flags its script passed (validation/inferencex_recipes.csv: max-num-seqs,
  max-num-batched-tokens, memory fraction, KV dtype, block size, prefix caching, EP).

The ten waves are not simulated at once: :data:`SHORT_WAVES` waves are (the first, every
client sending at once; two steady ones; the last, draining) and the means are weighted as the
10-wave run weighs them — the first and last wave once each, the middle ones for the eight
between (:func:`wave_weights`). That holds when the middle waves agree (a steady state:
:data:`STEADY_TTFT`, :data:`STEADY_TPOT`); when they do not — a queue still building, typically a
KV pool too small for the concurrency — the ten waves are simulated (so are runs of at most
:data:`FULL_RUN_REQUESTS` requests and outputs of at most :data:`FULL_RUN_OUTPUT_TOKENS`: none
with the value 0). On 1k/1k loops the weighted four waves land within 1–2% of the ten.
Setups whose scenarios come out equal share one run. Rows whose method is unknown get fixed
lengths and the steady state (the first of :data:`SHORT_WAVES` waves left out), as setups.py
treats a closed loop of unstated length.

Every name is checked against kvplan's catalogs when validate runs (GPUs, models, engines,
quantizations), so rows become simulatable as those grow; the reason a row is not says which.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.commands.validate.setups import resolve_model
from simulator.commands.validate.table import PublishedRow
from simulator.errors import KvplanError, RefusedError
from simulator.kv.gpus import GPUSpec, get_gpu
from simulator.kv.models import get_model
from simulator.latency.constants import RooflineConstants

if TYPE_CHECKING:
    from simulator.commands.validate.predict import Recording
    from simulator.kv.model_config import ModelConfig

FULL_RUN_REQUESTS = 0  # 10 × concurrency up to this: the whole run is simulated at once (0: never;
FULL_RUN_OUTPUT_TOKENS = 2048  # short runs first, the whole run only when they are not steady)
SHORT_WAVES = 4  # otherwise: first wave, two steady ones, last wave (weighted to ten)...
STEADY_TTFT = 0.15  # ... if the two middle waves' mean TTFTs agree this well (and TPOTs to
STEADY_TPOT = 0.05  # 5%); else the loop is still settling (a queue builds) and all ten are run
INFERENCEX_WAVES = 10
ENGINE_BY_BACKEND = {"vllm": ("vllm-v1",), "sglang": ("sglang",),
                     "trtllm": ("trtllm", "tensorrt-llm", "trt-llm")}
# the truth table's weight dtype -> kvplan's --quantization (None: the checkpoint's own)
QUANTIZATION_BY_WEIGHT = {"fp8": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "bf16": "none",
                          "int4": None, "auto": None}
_CHECKPOINT_SUFFIXES = ("-nvfp4-v2", "-fp4-v2", "-nvfp4", "-fp4", "-fp8", "-int4")


@dataclass
class SiliconSetup:
    """The rows one simulation answers: same scenario (engine, model, GPU, layout, dtypes,
    lengths, concurrency, flags), whatever source or date they came from."""

    rows: list[PublishedRow]
    extras: dict[str, dict[str, str]]  # row_id -> the table's extra columns
    scenario: dict[str, Any] | None = None
    reason: str | None = None  # not expressible: why
    waves: int = 0
    weights: tuple[float, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> PublishedRow:
        return self.rows[0]

    def extra(self, row: PublishedRow | None = None) -> dict[str, str]:
        return self.extras[(row or self.first).row_id]


@dataclass
class SiliconResult:
    setup: SiliconSetup
    flat: dict[str, float]
    status: str  # simulated | refused (...) | not expressible: ... | no request completed (...)
    cpu_s: float = 0.0
    num_requests: int = 0
    steady: bool = True  # a short run's middle waves agreed (silicon_run._steady)
    recording: WaveRecording | None = None  # simulate(record=True): the steps, to re-time

    def predicted(self, row: PublishedRow) -> float | None:
        if self.status != "simulated":
            return None
        return self.flat.get({"ttft": "ttft_s.mean", "tpot": "tpot_s.mean", "itl": "tpot_s.mean",
                              "e2e": "e2e_s.mean"}.get(row.metric, ""))


@dataclass
class WaveRecording:
    """A recorded closed loop whose means weigh each request as its wave (:func:`wave_weights`):
    :meth:`predict` re-times it under other constants. A closed loop's batches do not depend on
    the step times (clients send at step ends), so the re-timed means are the simulation's."""

    recording: Recording
    clients: int
    weights: tuple[float, ...]

    def predict(self, c: RooflineConstants, keys: frozenset[str] | None = None) -> dict[str, float]:
        """The weighted means (``ttft_s.mean``, ``tpot_s.mean``, ``e2e_s.mean``) under ``c``
        (all of them, whatever ``keys`` asks: they are three)."""
        rec = self.recording
        if not len(rec.finish_step):
            return {}
        _, sent, first, last = rec.request_times(c)
        assert rec.request_index is not None
        wave = np.minimum(rec.request_index // max(self.clients, 1), len(self.weights) - 1)
        w = np.asarray(self.weights, dtype=np.float64)[wave]
        out: dict[str, float] = {}
        if w.sum() > 0:
            out["ttft_s.mean"] = float(np.sum((first - sent) * w) / np.sum(w))
            out["e2e_s.mean"] = float(np.sum((last - sent) * w) / np.sum(w))
        multi = (rec.output_tokens > 1) & (w > 0)
        if multi.any():
            tpot = (last[multi] - first[multi]) / (rec.output_tokens[multi] - 1)
            out["tpot_s.mean"] = float(np.sum(tpot * w[multi]) / np.sum(w[multi]))
        return out


def engines() -> tuple[str, ...]:
    from simulator.scheduler.config import ENGINES

    return tuple(ENGINES)


def kvplan_engine(backend: str) -> str | None:
    """kvplan's engine for the sample's backend, if kvplan models it (read at run time)."""
    known = engines()
    return next((e for e in ENGINE_BY_BACKEND.get(backend, (backend,)) if e in known), None)


def find_gpu(system: str) -> GPUSpec | None:
    """The catalog GPU for AIConfigurator's system name (``h100_sxm``, ``b200_sxm``, ``gb200``):
    the name itself, then without its ``_sxm`` form factor."""
    for name in dict.fromkeys((system, re.sub(r"[_-]?sxm\d*$", "", system, flags=re.I))):
        try:
            return get_gpu(name)
        except KvplanError:
            continue
    return None


def find_model(served: str, aic_model: str) -> tuple[str | None, bool]:
    """(catalog name, whether it is the served checkpoint itself) for a row: the checkpoint
    served, the same without its quantization suffix, then AIConfigurator's model path."""
    try:
        return get_model(served).name, True
    except KvplanError:
        pass  # not in the catalog under the served name: the variants below, then AIC's path
    # the same checkpoint under the name the catalog has: NVIDIA's NVFP4 re-releases
    # (nvidia/DeepSeek-R1-0528-FP4-V2, -NVFP4-v2) are the architecture and format of its
    # -NVFP4 checkpoint; a release date (-0528) does not change the shape
    for variant in _checkpoint_variants(served):
        try:
            return get_model(variant).name, False
        except KvplanError:
            continue
    lowered = served.lower()
    for suffix in _CHECKPOINT_SUFFIXES:
        if lowered.endswith(suffix):
            base = served[: -len(suffix)]
            for candidate in (base, base.rpartition("/")[2]):
                try:
                    return get_model(candidate).name, False
                except KvplanError:
                    continue
    for candidate in (served, aic_model):
        try:
            return resolve_model(candidate), False
        except KvplanError:
            continue
    return None, False


def _checkpoint_variants(served: str) -> list[str]:
    nvfp4 = re.sub(r"(?i)-(nv)?fp4(-v\d+)?$", "-NVFP4", served)
    out = [nvfp4, re.sub(r"-\d{4}(?=-|$)", "", nvfp4), re.sub(r"-\d{4}(?=-|$)", "", served)]
    return [v for v in dict.fromkeys(out) if v != served]


def wave_weights(waves: int, full: int = INFERENCEX_WAVES) -> tuple[float, ...]:
    """Per-wave weights that make ``waves`` simulated waves stand for ``full``: all ones when
    the whole run is simulated; else the first and last once, the middle ones the rest."""
    if waves >= full:
        return tuple(1.0 for _ in range(full))
    assert waves >= 3
    middle = (full - 2) / (waves - 2)
    return (1.0, *(middle for _ in range(waves - 2)), 1.0)


def weighted_means(values: np.ndarray, clients: int, weights: Sequence[float]) -> float | None:
    """The mean of per-request ``values`` (send order; NaN = not finished / undefined) with
    request i weighted as its wave ``i // clients``."""
    n = len(values)
    wave = np.minimum(np.arange(n) // max(clients, 1), len(weights) - 1)
    w = np.asarray(weights, dtype=np.float64)[wave]
    ok = np.isfinite(values) & (w > 0)
    if not ok.any():
        return None
    return float(np.sum(values[ok] * w[ok]) / np.sum(w[ok]))


def peak_flops(gpu: GPUSpec) -> float:
    """The GPU's highest dense tensor rate of any precision the catalog lists (a field
    ``dense_*_flops`` or ``dense_*_ops``), so that no prefill is called too fast for a format
    the catalog knows a faster rate of."""
    rates = [float(getattr(gpu, f.name)) for f in dataclasses.fields(gpu)
             if f.name.startswith("dense_") and (f.name.endswith("_flops") or f.name.endswith("_ops"))]
    return max(rates) if rates else 0.0


def prefill_rate_check(*, active_params: float, mean_prompt_tokens: float, ttft_s: float,
                       num_gpus: int, peak_flops_per_gpu: float) -> tuple[bool, float]:
    """(implausible, the FLOP/s the TTFT implies): a mean TTFT cannot be shorter than the mean
    prompt's matmuls (2 × active parameters × tokens, attention left out, so this is a lower
    bound on the work) run at the dense peak of every GPU that serves the request. Queueing only
    adds to a TTFT, so a rate above the peak is impossible, not just fast."""
    rate = 2.0 * active_params * mean_prompt_tokens / ttft_s
    return rate > num_gpus * peak_flops_per_gpu, rate


def _catalog_entries(row: PublishedRow, extra: Mapping[str, str]) -> tuple[ModelConfig, GPUSpec] | str:
    """The row's model and GPU from kvplan's catalogs, or the ``not checked`` verdict saying
    which is missing."""
    served, aic_model = extra.get("served_model") or row.model, extra.get("aic_model_path") or row.model
    name, _ = find_model(served, aic_model)
    gpu = find_gpu(row.gpu)
    if name is None or gpu is None:
        return "not checked: " + ("model" if name is None else "GPU") + " not in kvplan's catalog"
    return get_model(name), gpu


def plausibility(row: PublishedRow, extra: Mapping[str, str]) -> str:
    """``ok``, ``implausible: …`` or ``not checked: …`` for the measurement's TTFT."""
    found = _catalog_entries(row, extra)
    if isinstance(found, str):
        return found
    model, gpu = found
    if row.input_tokens is None:
        return "not checked: prompt length not stated"
    uniform = extra.get("lengths", "").startswith("uniform")
    mean_tokens = row.input_tokens * (0.9 if uniform else 1.0)
    gpus = _prefill_gpus(row, extra)
    peak = peak_flops(gpu)
    if peak <= 0:
        return "not checked: no peak rate for the GPU"
    bad, rate = prefill_rate_check(active_params=model.num_active_params, mean_prompt_tokens=mean_tokens,
                                   ttft_s=row.value_si, num_gpus=gpus, peak_flops_per_gpu=peak)
    if bad:
        return (f"implausible: the TTFT implies {rate / 1e15:.3g} PFLOP/s of prefill, above the "
                f"{gpus} × {peak / 1e15:.3g} PFLOP/s dense peak of its GPUs")
    return "ok"


# A TPOT is checked against the KV read only where the batch clearly fits the GPUs' memory (KV of
# every client at its full length in this share of their HBM): a memory-bound engine holds fewer
# requests than its clients, and its steps read less.
DECODE_CHECK_HBM_SHARE = 0.5


def decode_floor_s(*, kv_bytes_per_token: float, decoding: float, context_tokens: float, num_gpus: int,
                   hbm_bandwidth_bytes_s: float) -> float:
    """The shortest decode step the HBM allows: ``decoding`` requests each read the KV of at
    least ``context_tokens`` tokens (``kv_bytes_per_token``: the full-attention layers' KV of
    one token, the whole model's, stored once), over the bandwidth of every GPU. Weights,
    activations and a KV replicated over TP ranks only add to it: a lower bound."""
    return decoding * context_tokens * kv_bytes_per_token / (num_gpus * hbm_bandwidth_bytes_s)


def decode_plausibility(row: PublishedRow, extra: Mapping[str, str], ttft_s: float | None) -> str:
    """``ok``, ``implausible: …`` or ``not checked: …`` for the measurement's TPOT (``row``),
    given its TTFT: a mean TPOT cannot be shorter than :func:`decode_floor_s` for the requests
    decoding at once. In a closed loop of ``concurrency`` clients a request decodes for
    TPOT × (OSL − 1) of its TTFT + TPOT × (OSL − 1), so that share of the clients is decoding at
    any time; each reads at least its prompt (⌊0.8 ISL⌋ for InferenceX's uniform lengths)."""
    from simulator.kv.model_config import FULL_ATTENTION
    from simulator.kv.sizing import kv_dtype_bytes, model_kv_layout

    found = _catalog_entries(row, extra)
    if isinstance(found, str):
        return found
    model, gpu = found
    if row.input_tokens is None or row.output_tokens is None or row.load_value is None or ttft_s is None:
        return "not checked: lengths, concurrency or TTFT not stated"
    if extra.get("mode") == "disagg":
        return "not checked: disaggregated (the decode GPUs' batch is not stated)"
    if model.has_sparse_indexer:
        return "not checked: sparse attention reads a top-k of the KV, not all of it"
    full = model.num_layers_of(FULL_ATTENTION)
    if not full or model.num_kv_layers <= 0:
        return "not checked: no full-attention layer"
    try:
        layout = model_kv_layout(model, row.kv_cache_dtype or "auto", 1)
        kv_dtype_bytes(layout.dtype)
    except KvplanError:
        return f"not checked: KV dtype {row.kv_cache_dtype} not modelled"
    per_token = layout.bytes_per_token * full / model.num_kv_layers
    conc, isl, osl = float(row.load_value), row.input_tokens, row.output_tokens
    if osl < 2:
        return "not checked: one output token"
    held = conc * (isl + osl) * layout.bytes_per_token
    if held > DECODE_CHECK_HBM_SHARE * row.num_gpus * gpu.hbm_bytes:
        return "not checked: the clients' KV may not fit at once (the batch may be smaller)"
    decode_s = row.value_si * (osl - 1)
    decoding = conc * decode_s / (ttft_s + decode_s)
    uniform = extra.get("lengths", "").startswith("uniform")
    context = math.floor(0.8 * isl) if uniform else isl
    floor = decode_floor_s(kv_bytes_per_token=per_token, decoding=decoding, context_tokens=context,
                           num_gpus=row.num_gpus, hbm_bandwidth_bytes_s=gpu.hbm_bandwidth_bytes_s)
    if row.value_si < floor:
        return (f"implausible: the TPOT {row.value_si * 1e3:.3g} ms is below the {floor * 1e3:.3g} ms it takes "
                f"{row.num_gpus} GPUs' HBM to read the KV of ~{decoding:.0f} decoding requests of ≥ {context:,} "
                "tokens each step")
    return "ok"


def _prefill_gpus(row: PublishedRow, extra: Mapping[str, str]) -> int:
    if extra.get("mode") == "disagg":
        m = re.search(r"prefill \S+ × \(TP (\d+) DP (\d+)", extra.get("disagg_layout", ""))
        return int(m.group(1)) * int(m.group(2)) if m else row.tensor_parallel
    return row.num_gpus


def _flags(extra: Mapping[str, str]) -> dict[str, Any]:
    text = extra.get("engine_flags") or ""
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}


def _int_flag(flags: Mapping[str, Any], key: str) -> int | None:
    try:
        v = int(float(str(flags[key])))
    except (KeyError, ValueError):
        return None
    return v if v > 0 else None


def _float_flag(flags: Mapping[str, Any], key: str) -> float | None:
    try:
        v = float(str(flags[key]))
    except (KeyError, ValueError):
        return None
    return v if 0 < v <= 1 else None


def setup_key(row: PublishedRow, extra: Mapping[str, str]) -> tuple[object, ...]:
    return (row.engine, extra.get("served_model") or row.model, extra.get("aic_model_path"), row.gpu,
            row.tensor_parallel, row.num_gpus, extra.get("attention_dp"), extra.get("moe_ep"),
            extra.get("pipeline_parallel"), extra.get("mode"), extra.get("disagg_layout"), row.weight_dtype,
            row.kv_cache_dtype, row.input_tokens, row.output_tokens, row.load_value,
            extra.get("method") == "inferencex", extra.get("engine_flags"))


def group(rows: Sequence[PublishedRow], extras: Mapping[str, dict[str, str]]) -> list[SiliconSetup]:
    """Rows grouped into setups (first-seen order), each built or with its reason."""
    by_key: dict[tuple[object, ...], SiliconSetup] = {}
    for r in rows:
        key = setup_key(r, extras[r.row_id])
        s = by_key.get(key)
        if s is None:
            s = by_key[key] = SiliconSetup([r], {r.row_id: extras[r.row_id]})
            build(s)
        else:
            s.rows.append(r)
            s.extras[r.row_id] = extras[r.row_id]
    return list(by_key.values())


def build(setup: SiliconSetup) -> None:
    """The setup's scenario, or why kvplan cannot express it (in the order a reader would check)."""
    r, x = setup.first, setup.extra()
    if x.get("mode") == "disagg":
        setup.reason = "disaggregated serving, multi-node Dynamo: not mapped"
        return
    if r.load_value is None:
        setup.reason = "concurrency of the run not stated"
        return
    engine = kvplan_engine(r.engine)
    if engine is None:
        setup.reason = f"engine {r.engine} not modelled (kvplan: {', '.join(engines())})"
        return
    gpu = find_gpu(r.gpu)
    if gpu is None:
        setup.reason = f"unknown GPU {r.gpu}"
        return
    served = x.get("served_model") or r.model
    name, exact = find_model(served, x.get("aic_model_path") or r.model)
    if name is None:
        setup.reason = f"unknown model {x.get('aic_model_path') or r.model}"
        return
    if not exact:
        setup.notes.append(f"{served} simulated as the catalog's {name}")
    if int(x.get("pipeline_parallel") or 1) > 1:
        setup.reason = "pipeline parallel not modelled"
        return
    quantization = _quantization(r.weight_dtype, name, exact)
    if isinstance(quantization, tuple):
        setup.reason = quantization[0]
        return
    flags = _flags(x)
    inferencex = x.get("method") == "inferencex"
    conc = int(r.load_value)
    assert r.input_tokens is not None and r.output_tokens is not None
    if inferencex:
        runs = INFERENCEX_WAVES * conc
        whole = runs <= FULL_RUN_REQUESTS and r.output_tokens <= FULL_RUN_OUTPUT_TOKENS
        setup.waves = INFERENCEX_WAVES if whole else SHORT_WAVES
        setup.weights = wave_weights(setup.waves)

        def lengths(n: int) -> dict[str, Any]:
            return {"dist": "uniform", "low": max(1, math.floor(0.8 * n)), "high": n}

        workload: dict[str, Any] = {"prompt_tokens": lengths(r.input_tokens),
                                    "output_tokens": lengths(r.output_tokens),
                                    "concurrency": conc, "num_requests": setup.waves * conc}
        if setup.waves < INFERENCEX_WAVES:
            setup.notes.append(f"{setup.waves} of the run's {INFERENCEX_WAVES} waves simulated, weighted to ten")
    else:
        setup.waves = SHORT_WAVES
        setup.weights = (0.0, *(1.0 for _ in range(SHORT_WAVES - 1)))
        workload = {"prompt_tokens": {"dist": "fixed", "value": r.input_tokens},
                    "output_tokens": {"dist": "fixed", "value": r.output_tokens},
                    "concurrency": conc, "num_requests": SHORT_WAVES * conc}
        setup.notes.append("method not established: fixed lengths, steady state (first wave left out)")
    kv = r.kv_cache_dtype or "auto"
    if kv == "auto" and r.weight_dtype == "fp8" and served.lower().startswith("nvidia/"):
        kv = "fp8"  # ModelOpt FP8 checkpoints declare kv_cache_quant_algo FP8 (setups.py)
        setup.notes.append("KV cache fp8 assumed: ModelOpt FP8 checkpoint")
    max_model_len = _int_flag(flags, "max_model_len") or (r.input_tokens + r.output_tokens + 200)
    max_model_len = max(max_model_len, r.input_tokens + r.output_tokens)
    scenario: dict[str, Any] = {
        "name": r.row_id.rpartition(":")[0] or r.row_id, "model": name, "gpu": gpu.name,
        "tensor_parallel": r.tensor_parallel, "engine": engine, "allocators": ["paged"],
        "kv_cache_dtype": kv, "quantization": quantization or "auto", "max_model_len": max_model_len,
        "workload": workload,
    }
    if engine == "trtllm" and "kv_free_gpu_memory_fraction" in flags:
        flags = {**flags, "gpu_memory_utilization": flags["kv_free_gpu_memory_fraction"]}
    for key, kind in (("max_num_seqs", int), ("max_num_batched_tokens", int), ("block_size", int),
                      ("max_prefill_tokens", int), ("gpu_memory_utilization", float)):
        value = _int_flag(flags, key) if kind is int else _float_flag(flags, key)
        if value is not None and (key != "max_prefill_tokens" or engine == "sglang"):
            scenario[key] = value
    if "enable_prefix_caching" in flags:
        scenario["enable_prefix_caching"] = bool(flags["enable_prefix_caching"])
    elif inferencex:
        scenario["enable_prefix_caching"] = False  # random prompts share no prefix
    if engine == "trtllm" and r.engine_version:
        version = _trtllm_release(r.engine_version)
        if version is not None:
            scenario["engine_version"] = version
        else:
            setup.notes.append(f"TensorRT-LLM {r.engine_version}: kvplan's newest defaults used")
    _layout(setup, scenario, r, x, flags, name, inferencex)
    if flags.get("speculative"):
        setup.reason = "speculative decoding configured by the script, acceptance not in the sample"
        return
    setup.scenario = scenario
    problem = _parse_problem(scenario, r.row_id)
    if problem is not None:
        setup.scenario = None
        setup.reason = problem


def _layout(setup: SiliconSetup, scenario: dict[str, Any], r: PublishedRow, x: Mapping[str, str],
            flags: Mapping[str, Any], name: str, inferencex: bool) -> None:
    """TP, attention DP and the MoE layout of the row as kvplan's scenario names them.

    vLLM (InferenceX): ``--tensor-parallel-size`` TP, ``--enable-expert-parallel`` when EP was on
    (its scripts never ran vLLM data parallel: silicon.py :func:`inferencex_env`). SGLang and
    TensorRT-LLM: attention DP of ``attention_dp`` ranks (also when the script turned it on by
    itself: ``dp_attention`` in its flags), attention TP the rest of the GPUs, and the MoE layers'
    TP × EP grid from AIConfigurator's ``moe_tp`` / ``moe_ep`` (their product must be the GPUs)."""
    dp = int(x.get("attention_dp") or 1)
    ep = int(x.get("moe_ep") or 1)
    moe = get_model(name).is_moe
    if r.engine == "vllm":
        if moe and (ep > 1 or flags.get("enable_expert_parallel")):
            scenario["enable_expert_parallel"] = True
        if dp > 1 and not inferencex:
            scenario["data_parallel_size"] = dp
        return
    world = r.tensor_parallel * dp
    if flags.get("dp_attention") and dp == 1:  # the script chose attention DP for this concurrency
        dp, world = r.tensor_parallel, r.tensor_parallel
        setup.notes.append("attention DP on: the InferenceX script enables it at this concurrency")
    if dp > 1:
        scenario["data_parallel_size"] = dp
        scenario["tensor_parallel"] = max(1, world // dp)
    if moe:
        moe_tp = int(x.get("moe_tp") or 0) or None
        moe_ep = ep if ep > 1 else None
        if moe_ep and moe_tp and moe_ep * moe_tp == world:
            scenario["moe_expert_parallel_size"], scenario["moe_tensor_parallel_size"] = moe_ep, moe_tp
        elif moe_ep and world % moe_ep == 0:
            scenario["moe_expert_parallel_size"], scenario["moe_tensor_parallel_size"] = moe_ep, world // moe_ep


def _trtllm_release(version: str) -> str | None:
    try:
        from simulator.scheduler.trtllm import trtllm_version
    except ImportError:
        return None
    try:
        return trtllm_version(version)
    except ValueError:
        return None


def _quantization(weight_dtype: str, name: str, exact: bool) -> str | None | tuple[str]:
    """kvplan's quantization for the row; a 1-tuple holds the reason there is none."""
    from simulator.kv.quantization import QUANTIZATIONS

    wanted = QUANTIZATION_BY_WEIGHT.get(weight_dtype, weight_dtype)
    model = get_model(name)
    if exact and model.quantization is not None:
        return None  # the served checkpoint itself: its own quantization_config
    if wanted is None:
        return None
    if wanted not in QUANTIZATIONS:
        return (f"weight dtype {weight_dtype} not modelled",)
    ckpt = model.quantization
    if ckpt is not None and wanted != "none" and ckpt.method != wanted:
        return (f"checkpoint not in the catalog: {weight_dtype} {name} (the catalog's is {ckpt.method})",)
    return wanted


def _parse_problem(scenario: dict[str, Any], row_id: str) -> str | None:
    """What kvplan's scenario checks say against ``scenario`` (None: it parses)."""
    from simulator.config.scenario import parse_scenario

    try:
        parse_scenario(scenario, f"silicon row {row_id}")
    except KvplanError as err:
        return "kvplan: " + _short(str(err))
    return None


# kvplan's capacity check raises a plain KvplanError when the weights leave no room (vLLM's
# start-up fails the same way: it cannot allocate the KV cache); that is a refusal too.
_WONT_START = re.compile(r"do not fit|does not fit|no room for the KV|not enough memory", re.I)


def _short(message: str) -> str:
    """A kvplan message without its ``where`` prefix and its numbers' detail, for grouping."""
    text = re.sub(r"^(silicon row|validation row) \S+:\s*", "", message.strip())
    text = re.sub(r"^(scenario|workload)[^:]*:\s*", "", text)
    return text.split(";")[0][:160]


def simulate(setup: SiliconSetup, base_dir: Path | None = None, *, global_set: bool = False,
             record: bool = False) -> SiliconResult:
    """Simulate ``setup`` with kvplan's defaults (the fitted constants; ``global_set``: the global
    set only, as an architecture's fit starts from) and read the weighted mean TTFT / TPOT off its
    requests; with ``record``, keep the steps for re-timing (:class:`WaveRecording`). A
    deployment vLLM would refuse to start is ``refused``; another KvplanError is ``not
    expressible``."""
    assert setup.scenario is not None
    constants = None
    if global_set:
        from simulator.latency.constants import global_constants

        gpu = find_gpu(str(setup.scenario["gpu"]))
        constants = global_constants(gpu) if gpu is not None else None
    start = time.process_time()
    result = _simulate_once(setup, base_dir, constants, record)
    if result.status == "simulated" and setup.waves < INFERENCEX_WAVES and setup.weights[0] > 0 \
            and not result.steady:
        setup.waves, setup.weights = INFERENCEX_WAVES, wave_weights(INFERENCEX_WAVES)
        setup.scenario = {**setup.scenario, "workload": {**setup.scenario["workload"],
                                                           "num_requests": INFERENCEX_WAVES * int(setup.first.load_value or 1)}}
        setup.notes = [n for n in setup.notes if "waves simulated" not in n]
        setup.notes.append("not steady in 4 waves: the whole 10-wave run simulated")
        result = _simulate_once(setup, base_dir, constants, record)
    result.cpu_s = time.process_time() - start
    return result


def _simulate_once(setup: SiliconSetup, base_dir: Path | None, constants: RooflineConstants | None = None,
                   record: bool = False) -> SiliconResult:
    from simulator.commands.validate.predict import Recorder, recording_of
    from simulator.config.deployment import build_deployment
    from simulator.config.scenario import parse_scenario
    from simulator.engine.runs import client_policy, load_workload, run_allocator
    from simulator.latency.roofline import RooflineLatency

    assert setup.scenario is not None
    start = time.process_time()
    where = f"silicon row {setup.first.row_id}"
    base = base_dir or Path.cwd()
    data = dict(setup.scenario)
    if constants is not None:
        data["latency"] = {"model": "roofline", **dataclasses.asdict(constants)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            scenario = parse_scenario(data, where)
            dep = build_deployment(scenario, base, where=where)
            fit = load_workload(scenario, base, dep.scheduler_config.max_model_len)
        except KvplanError as err:
            refused = isinstance(err, RefusedError) or _WONT_START.search(str(err)) is not None
            status = f"refused ({_short(str(err))})" if refused else f"not expressible: kvplan: {_short(str(err))}"
            return SiliconResult(setup, {}, status, time.process_time() - start)
        recorder = None
        if record:
            assert isinstance(dep.latency, RooflineLatency)
            recorder = Recorder(dep.latency)
            dep = dataclasses.replace(dep, latency=recorder)  # type: ignore[arg-type]
        run = run_allocator(dep, scenario.allocators[0], fit.requests,
                            clients=client_policy(scenario, len(fit.requests)), record_steps=record)
    cols = run.request_columns
    conc = int(setup.first.load_value or 1)
    flat: dict[str, float] = {}
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        value = weighted_means(np.asarray(cols[key], dtype=np.float64), conc, setup.weights)
        if value is not None:
            flat[f"{key}.mean"] = value
    completed = int(run.summary["completed"])
    status = "simulated" if completed and "ttft_s.mean" in flat else (
        "no request completed (" + (", ".join(f"{n} {why}" for why, n in run.summary["rejected_by_reason"].items())
                                    or "none finished") + ")")
    result = SiliconResult(setup, flat, status, time.process_time() - start, len(fit.requests))
    if recorder is not None and status == "simulated":
        result.recording = WaveRecording(recording_of(run, recorder, 1), conc, setup.weights)
    result.steady = _steady(np.asarray(cols["ttft_s"], dtype=np.float64),
                            np.asarray(cols["tpot_s"], dtype=np.float64), conc, setup.waves)
    return result


def _steady(ttft: np.ndarray, tpot: np.ndarray, clients: int, waves: int) -> bool:
    """Whether the middle waves of a short run agree (:data:`STEADY_TTFT`, :data:`STEADY_TPOT`)."""
    if waves < 4:
        return True
    means = []
    for w in (1, waves - 2):
        sl = slice(w * clients, (w + 1) * clients)
        a, b = ttft[sl][np.isfinite(ttft[sl])], tpot[sl][np.isfinite(tpot[sl])]
        if not len(a) or not len(b):
            return False
        means.append((float(a.mean()), float(b.mean())))
    (t1, p1), (t2, p2) = means
    return abs(t2 - t1) <= STEADY_TTFT * max(t1, t2) and abs(p2 - p1) <= STEADY_TPOT * max(p1, p2)


def not_run(setup: SiliconSetup) -> SiliconResult:
    assert setup.reason is not None
    return SiliconResult(setup, {}, f"not expressible: {setup.reason}")


def _shared_runs(setups: Sequence[SiliconSetup]) -> dict[int, SiliconSetup]:
    """Each simulatable setup -> the setup whose run answers it: the first with the same
    scenario (flags that change nothing kvplan models leave scenarios equal)."""
    first: dict[str, SiliconSetup] = {}
    same: dict[int, SiliconSetup] = {}
    for s in setups:
        if s.scenario is not None:
            key = json.dumps([{k: v for k, v in s.scenario.items() if k != "name"}, s.weights],
                             sort_keys=True, default=str)
            same[id(s)] = first.setdefault(key, s)
    return same


def cost(setup: SiliconSetup) -> float:
    """A simulation's relative cost, to start the long ones first: the tokens its requests
    schedule (a step's work grows with the batch, and the steps with the output length)."""
    assert setup.scenario is not None
    w = setup.scenario["workload"]

    def high(spec: Mapping[str, Any]) -> float:
        return float(spec.get("high", spec.get("value", 1)))

    return float(w.get("num_requests", 1)) * (high(w["prompt_tokens"]) + high(w["output_tokens"]))


def count_runs(setups: Sequence[SiliconSetup]) -> int:
    """How many simulations :func:`run_all` makes of ``setups``."""
    return len({id(s) for s in _shared_runs(setups).values()})


def run_all(setups: Sequence[SiliconSetup], tick: Callable[[], None] = lambda: None, *,
            jobs: int = 1, global_set: bool = False, record: bool = False) -> list[SiliconResult]:
    """Every setup's result, in order: simulated (in ``jobs`` processes when above 1) or why not;
    ``global_set`` and ``record`` as :func:`simulate` takes them."""
    import functools

    same = _shared_runs(setups)
    runnable = list({id(s): s for s in same.values()}.values())
    done: dict[int, SiliconResult] = {}
    one = functools.partial(simulate, global_set=global_set, record=record)
    if jobs > 1 and len(runnable) > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # longest first, one at a time: a long loop started last would run alone at the end
        # while the other processes idle (the results are the same in any order)
        order = sorted(runnable, key=cost, reverse=True)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(one, s): s for s in order}
            for future in as_completed(futures):
                done[id(futures[future])] = future.result()
                tick()
    else:
        for s in runnable:
            done[id(s)] = one(s)
            tick()
    out = []
    for s in setups:
        if s.scenario is None:
            out.append(not_run(s))
            continue
        ran = same[id(s)]
        res = done[id(ran)]
        if res.setup is not ran:  # simulated in another process: its copy says how many waves ran
            ran.waves, ran.weights, ran.notes, ran.scenario = (res.setup.waves, res.setup.weights,
                                                               res.setup.notes, res.setup.scenario)
            res.setup = ran
        if s is ran:
            out.append(res)
        else:
            s.waves, s.weights, s.notes = ran.waves, ran.weights, [*ran.notes, f"same scenario as {ran.first.row_id}"]
            out.append(SiliconResult(s, res.flat, res.status, 0.0, 0, res.steady, res.recording))
    return out


__all__ = ["FULL_RUN_REQUESTS", "SHORT_WAVES", "SiliconResult", "SiliconSetup", "build", "find_gpu",
           "find_model", "group", "kvplan_engine", "peak_flops", "plausibility", "prefill_rate_check",
           "run_all", "simulate", "wave_weights", "weighted_means"]
