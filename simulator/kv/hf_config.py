"""A parsed Hugging Face ``config.json`` -> :class:`ModelConfig`.

Vocabularies read: Llama, Mistral, Qwen2/Qwen3, OPT, Gemma 2/3 (multimodal configs keep the
language model under ``text_config``), DeepSeek-V2/V3 (MLA, ``n_routed_experts``), Mixtral and
gpt-oss and MiniMax-M2 (``num_local_experts``), Qwen2/Qwen3-MoE (``num_experts``,
``decoder_sparse_step``, ``mlp_only_layers``, ``shared_expert_intermediate_size``), Qwen3-Next,
Qwen3.5 (dense and MoE, under ``text_config``), Kimi-K2.5 (a DeepSeek-V3 ``text_config``),
DeepSeek-V3.2 and GLM-5 (MLA with a sparse-attention indexer: ``index_n_heads``,
``index_head_dim``, ``index_topk``), Nemotron-H.

Sliding-window attention, as transformers derives ``layer_types`` when a config does not list
them (so kvplan flags exactly the layers the model runs with a window):

* ``layer_types`` given (gpt-oss, recent Gemma 3 and Qwen3 exports): taken as is;
* ``use_sliding_window: false`` (Qwen2/Qwen3 carry a ``sliding_window`` value but disable it):
  every layer full; ``use_sliding_window: true``: layers ``i >= max_window_layers`` slide
  (transformers Qwen2Config);
* ``sliding_window_pattern`` p (Gemma 3, default 6; Gemma 2 alternates, p = 2): layer i is full
  when ``(i + 1) % p == 0``, else sliding;
* otherwise a ``sliding_window`` applies to every layer (Mistral-7B-v0.1).

Chunked local attention (Llama 4, ``attention_chunk_size``): the layers with RoPE
(``no_rope_layers[i] == 1``) attend within their chunk, the NoPE layers (0) to everything
(vllm/model_executor/models/llama4.py, ``Llama4Attention.__init__``: ``use_chunked_local_attn =
not self.nope and config.attention_chunk_size is not None``). Without the list, transformers'
Llama4TextConfig derives it: ``int((i + 1) % no_rope_layer_interval != 0)``, interval 4.
Llama 4's MoE layers are every ``interleave_moe_layer_step``-th (``(i + 1) % step == 0``,
``Llama4DecoderLayer``), with one shared expert of the routed width; its dense layers use
``intermediate_size_mlp``.

Linear attention (Qwen3-Next, ``model_type`` qwen3_next): ``layer_types`` if given, else
transformers' Qwen3NextConfig rule, ``linear_attention`` unless ``(i + 1) %
full_attention_interval == 0``; the Gated DeltaNet widths are its ``linear_*`` fields. Qwen3.5
(``qwen3_5_text``, ``qwen3_5_moe_text``) lists ``layer_types`` and keeps its Gated DeltaNet state
in the config's ``mamba_ssm_dtype`` (float32 in the released checkpoints): vLLM's
``Qwen3_5ForConditionalGenerationConfig.verify_and_update_config`` sets ``mamba_ssm_cache_dtype``
from it when the flag is "auto" (vllm/model_executor/models/config.py), and
``MambaStateDtypeCalculator.gated_delta_net_state_dtype`` keeps the conv state in the model dtype
and the temporal state in that dtype (vllm/model_executor/layers/mamba/mamba_utils.py).

The checkpoint's KV cache dtype: vLLM resolves ``--kv-cache-dtype auto`` to the KV quantization
a ModelOpt checkpoint declares, ``kv_cache_quant_algo`` "FP8" (or a ``kv_cache_scheme`` of 8-bit
static floats) -> ``fp8_e4m3`` (vllm/utils/torch_utils.py ``resolve_kv_cache_dtype_string`` and
``get_kv_cache_quant_algo_string``, called by ``EngineArgs.create_engine_config`` before the
CacheConfig is built); other methods leave it at the model dtype.

Nemotron-H (``model_type`` nemotron_h): ``hybrid_override_pattern`` gives each layer's kind ("M"
Mamba-2 -> linear_attention, "*" attention -> full_attention, "-" MLP -> mlp_only; the MoE "E"
of later Nemotron models is refused), the Mamba-2 widths are ``mamba_num_heads``,
``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``, ``use_conv_bias`` (true when
absent: transformers' NemotronHConfig defaults ``mamba_conv_bias`` to True), and the attention head
width is ``attention_head_dim`` when there is no ``head_dim``. The SSM state is kept in the
config's ``mamba_ssm_cache_dtype``, float32 when absent (vllm/model_executor/models/config.py,
``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``, vLLM main: ``DEFAULT_MAMBA_SSM_
CACHE_DTYPE = "float32"``; releases before it defaulted to float16).

Two fields are read the way vLLM reads them, since vLLM is what kvplan sizes:

* the dtype: a config without ``torch_dtype`` (or ``dtype``) is float32 to vLLM, and vLLM's
  ``--dtype auto`` serves a float32 checkpoint in the platform's first supported dtype, bfloat16
  on every GPU kvplan knows (vllm/config/model.py ``_find_dtype`` and ``_resolve_auto_dtype``;
  vllm/platforms/cuda.py ``supported_dtypes``: bfloat16 first from compute capability 8.0 on);
* the window (``max_position_embeddings``, the default and the upper bound of max_model_len):
  vLLM multiplies it by ``rope_scaling.factor`` (YaRN: ``original_max_position_embeddings`` ×
  factor), except for ``llama3``, ``longrope`` and ``su`` scaling and Gemma 3, whose window is
  already scaled (vllm/config/model.py ``_get_and_verify_max_len``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError
from simulator.kv.model_config import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
    ModelConfig,
    nemotron_h_layer_types,
)
from simulator.kv.quant_config import parse_quantization_config

_REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
             "max_position_embeddings")

# Fields config.json may leave out because transformers' config class has a default
# (Gemma3TextConfig in transformers/models/gemma3/configuration_gemma3.py: vocab_size 262_208,
# max_position_embeddings 131_072, sliding_window 4096, tie_word_embeddings True; the 27B
# checkpoint's text_config lists only the widths and sliding_window 1024).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072,
                    "sliding_window": 4096, "tie_word_embeddings": True},
}
# Local:global layer pattern when a config gives neither layer_types nor a pattern:
# Gemma 2 alternates sliding and full layers, Gemma 3 has 5 sliding layers per full one.
_DEFAULT_SLIDING_PATTERN = {"gemma2": 2, "gemma3_text": 6}
_TIED_BY_DEFAULT = frozenset({"opt", "gemma2", "gemma3_text"})
_LLAMA4_NO_ROPE_INTERVAL = 4  # transformers Llama4TextConfig no_rope_layer_interval default
_MAMBA2_FIELDS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel")
_NEMOTRON_H_SSM_CACHE_DTYPE = "float32"  # vLLM's NemotronHForCausalLMConfig default (docstring)
_QWEN3_5_TYPES = frozenset({"qwen3_5_text", "qwen3_5_moe_text"})
# vLLM's MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP (vllm/utils/torch_utils.py): "fp8" -> "fp8_e4m3"
_MODELOPT_FP8_KV = "fp8_e4m3"
_LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim")
# What vLLM serves a float32 (or dtype-less) checkpoint in under --dtype auto: the platform's first
# supported dtype, bfloat16 on Ampere and later (vllm/platforms/cuda.py supported_dtypes) and on
# ROCm MI300X; every GPU in simulator/kv/gpus.py is one of those.
_VLLM_AUTO_DTYPE_FOR_FLOAT32 = "bfloat16"
# rope_scaling types whose max_position_embeddings vLLM takes as is (already the scaled window).
_ROPE_TYPES_WINDOW_AS_IS = frozenset({"su", "longrope", "llama3", "default"})
# Fields that size the model: zero would divide by zero or describe no model at all.
_POSITIVE = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
             "max_position_embeddings")


def model_from_hf_config(raw: dict[str, Any], *, name: str, source: str = "") -> ModelConfig:
    """A ModelConfig from a parsed ``config.json`` (module docstring for the vocabularies), read
    from the file ``source`` (kept in :attr:`ModelConfig.config_path`, for the errors that the
    model's shape meets later, e.g. a tensor parallelism that does not divide its heads).

    Missing required field or a value of the wrong type -> KvplanError naming it.
    """
    raw = _language_model(raw)
    for key in _REQUIRED:
        if raw.get(key) is None:
            raise KvplanError(f"missing required field '{key}'")
    inter_key = "ffn_dim" if raw.get("intermediate_size") is None else "intermediate_size"
    if raw.get("intermediate_size_mlp") is not None:  # Llama 4: the dense layers' width
        inter_key = "intermediate_size_mlp"
    if raw.get(inter_key) is None and _every_layer_moe(raw):
        # Qwen3.5-MoE lists no intermediate_size: no layer has a dense MLP, and the width is read
        # only by the activation estimate, whose fused-MoE term exceeds it (simulator/kv/sizing.py)
        inter_key = "moe_intermediate_size"
    if raw.get(inter_key) is None:
        raise KvplanError("missing required field 'intermediate_size' (or OPT's 'ffn_dim')")
    model_type = str(raw.get("model_type") or "llama")
    for key in _POSITIVE:
        _positive(raw, key)
    heads = _int(raw, "num_attention_heads")
    hidden = _int(raw, "hidden_size")
    layers = _int(raw, "num_hidden_layers")
    head_key = "head_dim" if raw.get("head_dim") is not None else "attention_head_dim"
    head_dim = _int(raw, head_key) if raw.get(head_key) is not None else None
    if head_dim is None:
        if hidden % heads:
            raise KvplanError(f"no head_dim, and hidden_size ({hidden}) is not a multiple of"
                              f" num_attention_heads ({heads})")
        head_dim = hidden // heads
    mla: dict[str, Any] = {}
    if raw.get("kv_lora_rank") is not None:
        mla = {key: _int(raw, key) for key in
               ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
        mla["q_lora_rank"] = _int(raw, "q_lora_rank") if raw.get("q_lora_rank") else None
        if raw.get("index_topk") is not None:  # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5)
            # vLLM builds the indexer when the config has index_topk (deepseek_v2.py: is_v32)
            mla.update({key: _positive(raw, key) for key in
                        ("index_n_heads", "index_head_dim", "index_topk")})
    layer_types, window = _attention_layout(raw, model_type, layers)
    chunk = _int(raw, "attention_chunk_size") if CHUNKED_ATTENTION in layer_types else None
    linear: dict[str, Any] = {}
    if LINEAR_ATTENTION in layer_types and model_type == "nemotron_h":
        linear = {key: _int(raw, key) for key in _MAMBA2_FIELDS}
        linear["use_conv_bias"] = raw.get("use_conv_bias", True) is True
        linear["mamba_ssm_cache_dtype"] = str(raw.get("mamba_ssm_cache_dtype")
                                              or _NEMOTRON_H_SSM_CACHE_DTYPE)
    elif LINEAR_ATTENTION in layer_types:
        linear = {key: _int(raw, key) for key in _LINEAR_FIELDS}
        ssm_dtype = raw.get("mamba_ssm_dtype")
        if model_type in _QWEN3_5_TYPES and ssm_dtype is not None:
            linear["mamba_ssm_cache_dtype"] = str(ssm_dtype)
    quant = raw.get("quantization_config")
    return ModelConfig(
        name=name, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=_int(raw, "num_key_value_heads", heads), head_dim=head_dim,
        hidden_size=hidden, intermediate_size=_int(raw, inter_key),
        vocab_size=_int(raw, "vocab_size"), torch_dtype=_served_dtype(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        max_position_embeddings=_window(raw, model_type), model_type=model_type,
        hf_id=str(raw.get("_name_or_path") or ""),
        attention_bias=raw.get("attention_bias") is True,
        quantization=parse_quantization_config(quant),
        checkpoint_kv_cache_dtype=checkpoint_kv_cache_dtype(quant),
        layer_types=layer_types, sliding_window=window, attention_chunk_size=chunk,
        **linear, **mla, **_moe_fields(raw, inter_key), config_path=source,
    )


def checkpoint_kv_cache_dtype(quant: Any) -> str | None:
    """The KV cache dtype a ``quantization_config`` asks vLLM for under ``--kv-cache-dtype
    auto`` (module docstring): ``fp8_e4m3`` for a ModelOpt checkpoint whose
    ``kv_cache_quant_algo`` is FP8 or whose ``kv_cache_scheme`` is 8-bit static floats; None
    otherwise (vLLM warns and keeps "auto" for an algorithm it does not know)."""
    if not isinstance(quant, dict):
        return None
    if not str(quant.get("quant_method", "")).lower().startswith("modelopt"):
        return None
    inner = quant.get("quantization", quant)
    inner = inner if isinstance(inner, dict) else quant
    algo = (inner.get("kv_cache_scheme") or quant.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or quant.get("kv_cache_quant_algo"))
    if isinstance(algo, dict):
        fp8 = (algo.get("dynamic") is False and algo.get("num_bits") == 8
               and algo.get("type") == "float")
        return _MODELOPT_FP8_KV if fp8 else None
    if isinstance(algo, str) and algo.lower() == "fp8":
        return _MODELOPT_FP8_KV
    return None


def config_model_name(raw: dict[str, Any], path: Path) -> str:
    """The name of the model a ``config.json`` at ``path`` describes: its ``_name_or_path``;
    else the folder of a checkpoint (``Llama-3.1-8B/config.json``); else the file's own name
    (``cfg/llama-70b.json`` is ``llama-70b``, not ``cfg``)."""
    named = raw.get("_name_or_path")
    if isinstance(named, str) and named.strip():
        return named.strip()
    folder = path.resolve().parent.name
    return folder if path.stem == "config" and folder else path.stem


def _served_dtype(raw: dict[str, Any]) -> str:
    """The dtype vLLM serves the checkpoint in under ``--dtype auto`` (module docstring)."""
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"  # vLLM's _find_dtype
    if not isinstance(dtype, str):
        raise KvplanError(f"field 'torch_dtype' must be a dtype name, got {dtype!r}")
    return _VLLM_AUTO_DTYPE_FOR_FLOAT32 if dtype.lower() in ("float32", "float", "fp32") else dtype


def _window(raw: dict[str, Any], model_type: str) -> int:
    """The context window vLLM derives from the config (module docstring)."""
    window = _int(raw, "max_position_embeddings")
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not isinstance(scaling, dict) or model_type.startswith("gemma3"):
        return window
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type in _ROPE_TYPES_WINDOW_AS_IS:
        return window
    factor = scaling.get("factor", 1.0)
    # vLLM multiplies the window by the factor and serves int() of it (_get_and_verify_max_len):
    # NaN, infinity, zero, a negative or a non-number leave it no window to serve.
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
            or not (math.isfinite(factor) and factor > 0)):
        key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
        raise KvplanError(f"field '{key}.factor' must be a positive finite number, got {factor!r}")
    if rope_type == "yarn" and isinstance(scaling.get("original_max_position_embeddings"), int):
        window = scaling["original_max_position_embeddings"]
    return int(window * factor)


def _language_model(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: a multimodal config's ``text_config`` over the top level
    (which keeps torch_dtype and quantization_config), then the model type's defaults."""
    text = raw.get("text_config")
    merged = dict(raw)
    if isinstance(text, dict):
        merged.pop("text_config")
        merged.pop("model_type", None)
        merged.update({key: value for key, value in text.items() if value is not None})
    for key, value in _DEFAULTS.get(str(merged.get("model_type")), {}).items():
        merged.setdefault(key, value)
    return merged


def _moe_fields(raw: dict[str, Any], inter_key: str) -> dict[str, Any]:
    """The MoE fields of :class:`ModelConfig` (empty for a dense model).

    An expert count of 0 is not a dense model everywhere: a DeepSeek, Mixtral, gpt-oss or
    Llama 4 layer built with no expert has nothing to route to, so ``n_routed_experts: 0`` and
    ``num_local_experts: 0`` are errors; Qwen2/Qwen3-MoE build a dense MLP wherever
    ``num_experts`` is 0 (vllm/model_executor/models/qwen2_moe.py and qwen3_moe.py,
    ``*DecoderLayer.__init__``: ``config.num_experts > 0 and (layer_idx + 1) %
    config.decoder_sparse_step == 0``), so ``num_experts: 0`` is a dense model. Llama 4 with
    ``interleave_moe_layer_step: 0`` has no MoE layer either (vllm/model_executor/models/llama4.py,
    ``Llama4DecoderLayer.__init__``: ``config.interleave_moe_layer_step > 0 and ...``)."""
    for key in ("n_routed_experts", "num_local_experts"):
        if raw.get(key) is not None:
            _positive(raw, key)
    if raw.get("n_routed_experts") is not None:  # DeepSeek
        moe = {key: _int(raw, key) for key in
               ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")}
        moe["first_k_dense_replace"] = _int(raw, "first_k_dense_replace", 0)
        moe["n_shared_experts"] = _int(raw, "n_shared_experts", 0)
        return moe
    llama4 = raw.get("intermediate_size_mlp") is not None  # Llama 4: its dense layers' width
    if raw.get("num_local_experts") is not None and llama4:
        step = _int(raw, "interleave_moe_layer_step", 1)
        if step == 0:  # no MoE layer
            return {}
        return {"n_routed_experts": _int(raw, "num_local_experts"),
                "num_experts_per_tok": _int(raw, "num_experts_per_tok"),
                "moe_intermediate_size": _int(raw, "intermediate_size"), "n_shared_experts": 1,
                "decoder_sparse_step": step}
    if raw.get("num_local_experts") is not None:  # Mixtral, gpt-oss: every layer MoE of MLP-wide experts
        return {"n_routed_experts": _int(raw, "num_local_experts"),
                "num_experts_per_tok": _int(raw, "num_experts_per_tok"),
                "moe_intermediate_size": _int(raw, inter_key)}
    if raw.get("num_experts") is not None and _int(raw, "num_experts"):  # Qwen2-MoE, Qwen3-MoE
        expert = _int(raw, "moe_intermediate_size")
        moe = {"n_routed_experts": _int(raw, "num_experts"),
               "num_experts_per_tok": _int(raw, "num_experts_per_tok"),
               "moe_intermediate_size": expert,
               # (layer_idx + 1) % decoder_sparse_step in vLLM's layers: 0 divides by zero
               "decoder_sparse_step": _positive(raw, "decoder_sparse_step", 1),
               "mlp_only_layers": _int_list(raw, "mlp_only_layers")}
        shared = _int(raw, "shared_expert_intermediate_size", 0)
        if shared % expert:
            raise KvplanError(f"shared_expert_intermediate_size ({shared}) is not a multiple of"
                              f" moe_intermediate_size ({expert}); not modelled")
        # A shared expert of k × the routed width has exactly the parameters of k routed experts.
        moe["n_shared_experts"] = shared // expert
        return moe
    return {}


def _every_layer_moe(raw: dict[str, Any]) -> bool:
    """True for a Qwen-MoE config whose every layer is sparse (``num_experts`` > 0,
    ``decoder_sparse_step`` 1, no ``mlp_only_layers``), with a ``moe_intermediate_size``."""
    return (isinstance(raw.get("num_experts"), int) and raw["num_experts"] > 0
            and raw.get("decoder_sparse_step", 1) == 1 and not raw.get("mlp_only_layers")
            and raw.get("moe_intermediate_size") is not None)


def _attention_layout(raw: dict[str, Any], model_type: str,
                      layers: int) -> tuple[tuple[str, ...], int | None]:
    """(layer_types, sliding_window) by the rules of the module docstring; ``()`` and None
    when every layer is full attention."""
    window = raw.get("sliding_window")
    if raw.get("attention_chunk_size") is not None and raw.get("layer_types") is None:
        interval = _positive(raw, "no_rope_layer_interval", _LLAMA4_NO_ROPE_INTERVAL)
        flags = raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        if not isinstance(flags, list) or len(flags) != layers:
            raise KvplanError(f"field 'no_rope_layers' must list {layers} flags, got {flags!r}")
        return tuple(CHUNKED_ATTENTION if flag else FULL_ATTENTION for flag in flags), None
    if model_type == "nemotron_h":
        pattern = raw.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != layers:
            raise KvplanError(f"field 'hybrid_override_pattern' must be a string of {layers}"
                              f" layer kinds, got {pattern!r}")
        return nemotron_h_layer_types(pattern), None
    if model_type == "qwen3_next" and raw.get("layer_types") is None:
        interval = _positive(raw, "full_attention_interval", 4)
        return tuple(LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION
                     for i in range(layers)), None
    given = raw.get("layer_types")
    if raw.get("use_sliding_window") is False and given is None:
        return (), None
    if given is not None:
        if not isinstance(given, list) or not all(isinstance(kind, str) for kind in given):
            raise KvplanError(f"field 'layer_types' must be a list of strings, got {given!r}")
        if len(given) != layers:
            raise KvplanError(f"layer_types lists {len(given)} layers, num_hidden_layers is"
                              f" {layers}")
        kinds = tuple(given)
    elif window is None:
        return (), None
    else:
        pattern = (raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern")
                   or _DEFAULT_SLIDING_PATTERN.get(model_type))
        max_window = raw.get("max_window_layers")
        if raw.get("use_sliding_window") is True and isinstance(max_window, int):
            sliding = [i >= max_window for i in range(layers)]
        elif isinstance(pattern, int) and pattern > 0:
            sliding = [(i + 1) % pattern != 0 for i in range(layers)]
        else:
            sliding = [True] * layers
        kinds = tuple(SLIDING_ATTENTION if slides else FULL_ATTENTION for slides in sliding)
    if all(kind == FULL_ATTENTION for kind in kinds):
        return (), None
    if SLIDING_ATTENTION in kinds:
        window = _int(raw, "sliding_window")
    return kinds, window if isinstance(window, int) else None


def _int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key)
    if value is None:
        if default is None:
            raise KvplanError(f"missing required field '{key}'")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KvplanError(f"field '{key}' must be a non-negative integer, got {value!r}")
    return value


def _positive(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = _int(raw, key, default)
    if value == 0:
        raise KvplanError(f"field '{key}' must be a positive integer, got 0")
    return value


def _int_list(raw: dict[str, Any], key: str) -> tuple[int, ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise KvplanError(f"field '{key}' must be a list of layer indices, got {value!r}")
    return tuple(value)


__all__ = ["checkpoint_kv_cache_dtype", "config_model_name", "model_from_hf_config"]
