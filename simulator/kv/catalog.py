"""The model catalog: public checkpoints by name, with their config.json values.

Every entry's numbers are the public ``config.json`` of its first Hugging Face id
(huggingface.co/<id>/blob/main/config.json); where another source was read to confirm them it
is named next to the entry. Names are case-insensitive and every listed HF id (with or without
its organisation) is an alias.

The entries marked "(AIC copy)" were read from the copies of those files that AIConfigurator's
core wheel ships (aiconfigurator-core 0.12.0, Apache-2.0: ``aiconfigurator_core/model_configs/
<org>--<name>_config.json``, with ``_hf_quant_config.json`` beside ModelOpt checkpoints).

A checkpoint whose ``quantization_config`` kvplan's parser does not model yet
(:mod:`simulator.kv.quant_config`: NVFP4 until that parser reads it) is listed with its
config as the file gives it; looking it up raises that parser's error instead of sizing its
weights in a width they are not stored in. It becomes a catalog model, unchanged, once the
parser reads its ``quantization_config``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator.errors import KvplanError, did_you_mean
from simulator.kv.model_config import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
    ModelConfig,
    nemotron_h_layer_types,
)
from simulator.kv.hf_config import checkpoint_kv_cache_dtype
from simulator.kv.quant_config import CheckpointQuant, parse_quantization_config

_CATALOG: dict[str, ModelConfig] = {}
_ALIASES: dict[str, str] = {}  # lower-case name or HF id -> catalog key
# catalog key -> the parser's error, for checkpoints whose quantization is not modelled yet
_NOT_MODELLED: dict[str, tuple[str, str]] = {}  # key -> (name, the parser's error)

# llm-compressor FP8 checkpoints (compressed-tensors): fp8 weights and activations on every
# Linear but the lm_head (recipe "scheme: FP8, targets: [Linear], ignore: [lm_head]", e.g.
# huggingface.co/neuralmagic/Llama-3.2-1B-Instruct-FP8/blob/main/recipe.yaml). neuralmagic's
# Llama-3.1 FP8 use static per-tensor scales, RedHatAI's "-FP8-dynamic" per-channel weight
# scales and dynamic per-token activation scales; both store 8 bits per weight.
_COMPRESSED_FP8 = CheckpointQuant("fp8", "compressed-tensors", 8)
# gpt-oss: quantization_config {"quant_method": "mxfp4", "modules_to_not_convert":
# ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
# (the same block transformers' convert_gpt_oss_weights_to_hf.py writes).
_GPT_OSS_MXFP4 = CheckpointQuant("mxfp4", "mxfp4", 4, 32, 8, weight_only=True, experts_only=True)


def _register(model: ModelConfig, *hf_ids: str) -> None:
    key = model.name.lower()
    _CATALOG[key] = model
    _ALIASES[key] = key
    for hf_id in hf_ids:
        _ALIASES[hf_id.lower()] = key
        _ALIASES[hf_id.lower().rsplit("/", 1)[-1]] = key


def _quantized_checkpoint(base: ModelConfig, name: str, hf_ids: tuple[str, ...],
                          quantization_config: dict[str, Any]) -> None:
    """``base``'s shape under a checkpoint's ``quantization_config`` (its weights' format and,
    for ModelOpt, its KV cache dtype); listed as not modelled when the parser refuses it."""
    try:
        quant = parse_quantization_config(quantization_config)
    except KvplanError as err:
        key = name.lower()
        stored = base.quantization.describe() if base.quantization else base.torch_dtype
        _NOT_MODELLED[key] = (name, f"{err}; '{base.name}' is the same network in {stored}")
        _ALIASES[key] = key
        for hf_id in hf_ids:
            _ALIASES[hf_id.lower()] = key
            _ALIASES[hf_id.lower().rsplit("/", 1)[-1]] = key
        return
    _register(replace(base, name=name, hf_id=hf_ids[0], quantization=quant,
                      checkpoint_kv_cache_dtype=checkpoint_kv_cache_dtype(quantization_config)),
              *hf_ids)


def _nvfp4(exclude: list[str]) -> dict[str, Any]:
    """A ModelOpt NVFP4 checkpoint's quantization block as its hf_quant_config.json gives it
    (``quantization``: quant_algo NVFP4, kv_cache_quant_algo FP8, group_size 16), under the
    ``quant_method`` vLLM gives ModelOpt checkpoints. ``exclude``: its ``exclude_modules``, with
    ``*`` standing for "every layer" where the file lists each layer."""
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
            "group_size": 16, "exclude_modules": exclude}


def _model(name: str, hf_ids: tuple[str, ...], layers: int, heads: int, kv_heads: int,
           hidden: int, inter: int, vocab: int, dtype: str, max_pos: int, *,
           model_type: str = "llama", tie: bool = False, head_dim: int | None = None,
           **extra: Any) -> None:
    _register(ModelConfig(
        name=name, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads, hidden_size=hidden,
        intermediate_size=inter, vocab_size=vocab, torch_dtype=dtype, tie_word_embeddings=tie,
        max_position_embeddings=max_pos, model_type=model_type, hf_id=hf_ids[0] if hf_ids else "",
        **extra,
    ), *hf_ids)


def _every(period: int, layers: int, other: str = SLIDING_ATTENTION) -> tuple[str, ...]:
    """Layer kinds where every ``period``-th layer (1-based) is full and the rest are ``other``."""
    return tuple(FULL_ATTENTION if (i + 1) % period == 0 else other for i in range(layers))


_model("OPT-13B", ("facebook/opt-13b",), 40, 40, 40, 5120, 20480, 50272, "float16", 2048,
       model_type="opt", tie=True)
_model("Llama-2-7B", ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
       32, 32, 32, 4096, 11008, 32000, "float16", 4096)
_model("Llama-2-13B", ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"),
       40, 40, 40, 5120, 13824, 32000, "float16", 4096)
_model("Llama-2-70B", ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
       80, 64, 8, 8192, 28672, 32000, "float16", 4096)
_model("Llama-3.1-8B", ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                        "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
       32, 32, 8, 4096, 14336, 128256, "bfloat16", 131072)
_model("Llama-3.1-70B", ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                         "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
       80, 64, 8, 8192, 28672, 128256, "bfloat16", 131072)
# Llama 3 (April 2024): the 3.1 widths with an 8K window ("max_position_embeddings": 8192,
# "rope_theta": 500000.0 in meta-llama/Meta-Llama-3-8B(-Instruct) and -70B config.json).
_model("Llama-3-8B", ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"),
       32, 32, 8, 4096, 14336, 128256, "bfloat16", 8192)
_model("Llama-3-70B", ("meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct"),
       80, 64, 8, 8192, 28672, 128256, "bfloat16", 8192)
# Llama 3.3 70B: the 3.1-70B architecture (LlamaForCausalLM, same widths and rope_scaling).
_model("Llama-3.3-70B", ("meta-llama/Llama-3.3-70B-Instruct",),
       80, 64, 8, 8192, 28672, 128256, "bfloat16", 131072)
# FP8 checkpoints: the base model's config.json plus a compressed-tensors quantization_config
# (config_groups.group_0.weights: {"num_bits": 8, "type": "float"}, "ignore": ["lm_head"]).
_model("Llama-3.1-8B-FP8", ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
                            "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8"),
       32, 32, 8, 4096, 14336, 128256, "bfloat16", 131072, quantization=_COMPRESSED_FP8)
_model("Llama-3.1-70B-FP8", ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
                             "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"),
       80, 64, 8, 8192, 28672, 128256, "bfloat16", 131072, quantization=_COMPRESSED_FP8)
_model("Llama-3.3-70B-FP8", ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",),
       80, 64, 8, 8192, 28672, 128256, "bfloat16", 131072, quantization=_COMPRESSED_FP8)
# Mistral-7B-v0.1 attends over a sliding window of 4096 tokens on every layer
# ("sliding_window": 4096 in its config.json).
_model("Mistral-7B", ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"),
       32, 32, 8, 4096, 14336, 32000, "bfloat16", 32768, model_type="mistral",
       layer_types=(SLIDING_ATTENTION,) * 32, sliding_window=4096)
# Mistral-7B-v0.3: the v0.1 widths with a 32768-token vocabulary and full attention
# (mistralai/Mistral-7B-Instruct-v0.3 config.json: "vocab_size": 32768, "sliding_window": null,
# "rope_theta": 1000000.0).
_model("Mistral-7B-v0.3", ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
       32, 32, 8, 4096, 14336, 32768, "bfloat16", 32768, model_type="mistral")
# Mixtral-8x7B-v0.1: num_local_experts 8, num_experts_per_tok 2, each expert the 14336-wide
# SwiGLU, "sliding_window": null.
_model("Mixtral-8x7B", ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
       32, 32, 8, 4096, 14336, 32000, "bfloat16", 32768, model_type="mixtral",
       n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336)
# The -Instruct configs of Qwen2.5 say max_position_embeddings 32768 (131072 with YaRN); the
# shapes that size the KV cache and the weights are identical.
_model("Qwen2.5-7B", ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
       28, 28, 4, 3584, 18944, 152064, "bfloat16", 131072, model_type="qwen2")
_model("Qwen2.5-72B", ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
       80, 64, 8, 8192, 29568, 152064, "bfloat16", 131072, model_type="qwen2")
# Qwen3: head_dim 128 with q/k RMSNorms, no biases, "use_sliding_window": false (so the
# "sliding_window" value they carry is unused), max_position_embeddings 40960. Confirmed against
# the model cards' tables (layers, Q/KV heads, experts) and the MindSpeed-RL model configs
# (gitcode.com/Ascend/MindSpeed-RL/blob/master/configs/model/qwen3_{32b,30b_a3b,235b_a22b}.yaml).
_model("Qwen3-8B", ("Qwen/Qwen3-8B",), 36, 32, 8, 4096, 12288, 151936, "bfloat16", 40960,
       model_type="qwen3", head_dim=128)
_model("Qwen3-32B", ("Qwen/Qwen3-32B",), 64, 64, 8, 5120, 25600, 151936, "bfloat16", 40960,
       model_type="qwen3", head_dim=128)
# Qwen3-MoE: num_experts 128, num_experts_per_tok 8, decoder_sparse_step 1, mlp_only_layers []
# (every layer MoE, no shared expert); intermediate_size is unused by the released models.
_model("Qwen3-30B-A3B", ("Qwen/Qwen3-30B-A3B",), 48, 32, 4, 2048, 6144, 151936, "bfloat16",
       40960, model_type="qwen3_moe", head_dim=128,
       n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
# Qwen3-235B-A22B-Instruct-2507 is the same network with a 262,144-token window
# (max_position_embeddings); the shapes that size weights and KV are unchanged.
_model("Qwen3-235B-A22B", ("Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B-Instruct-2507"), 94, 64, 4, 4096, 12288, 151936,
       "bfloat16", 40960, model_type="qwen3_moe", head_dim=128,
       n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536)
# gpt-oss: hidden 2880, 64 query heads of 64, 8 KV heads, attention_bias true, experts of 2880,
# 4 per token, vocab 201088, untied; "layer_types" alternates sliding_attention (first) and
# full_attention, "sliding_window": 128.
_model("gpt-oss-20b", ("openai/gpt-oss-20b",), 24, 64, 8, 2880, 2880, 201088, "bfloat16",
       131072, model_type="gpt_oss", head_dim=64, attention_bias=True,
       quantization=_GPT_OSS_MXFP4, layer_types=_every(2, 24), sliding_window=128,
       n_routed_experts=32, num_experts_per_tok=4, moe_intermediate_size=2880)
_model("gpt-oss-120b", ("openai/gpt-oss-120b",), 36, 64, 8, 2880, 2880, 201088, "bfloat16",
       131072, model_type="gpt_oss", head_dim=64, attention_bias=True,
       quantization=_GPT_OSS_MXFP4, layer_types=_every(2, 36), sliding_window=128,
       n_routed_experts=128, num_experts_per_tok=4, moe_intermediate_size=2880)
# Gemma 3 27B (text tower; the 0.4B SigLIP vision tower is not counted): text_config
# {head_dim 128, hidden 5376, intermediate 21504, 62 layers, 32 heads, 16 KV heads,
# sliding_window 1024}; vocab_size 262208, max_position_embeddings 131072, tied embeddings and
# sliding_window_pattern 6 (5 local layers per global one) are Gemma3TextConfig's defaults.
_model("Gemma-3-27B", ("google/gemma-3-27b-it", "google/gemma-3-27b-pt"), 62, 32, 16, 5376,
       21504, 262208, "bfloat16", 131072, model_type="gemma3_text", head_dim=128, tie=True,
       layer_types=_every(6, 62), sliding_window=1024)
# Gemma 3 12B (text tower): text_config {head_dim 256, hidden 3840, intermediate 15360,
# 48 layers, 16 heads, 8 KV heads, sliding_window 1024}; the rest as the 27B (Gemma3TextConfig
# defaults: vocab 262208, window 131072, tied, sliding_window_pattern 6).
_model("Gemma-3-12B", ("google/gemma-3-12b-it", "google/gemma-3-12b-pt"), 48, 16, 8, 3840,
       15360, 262208, "bfloat16", 131072, model_type="gemma3_text", head_dim=256, tie=True,
       layer_types=_every(6, 48), sliding_window=1024)
# Llama 4 (text model; the vision tower is not counted): text_config {hidden 5120, 40 heads,
# 8 KV heads, head_dim 128, 48 layers, intermediate_size 8192 (each routed and the shared
# expert), intermediate_size_mlp 16384 (dense layers), num_experts_per_tok 1, vocab 202048,
# attention_chunk_size 8192, no_rope_layers 1,1,1,0 repeated (3 chunked-local layers per
# global NoPE layer)}. Scout: 16 experts, interleave_moe_layer_step 1 (every layer MoE),
# max_position_embeddings 262144 (meta-llama/Llama-4-Scout-17B-16E); Maverick: 128 experts,
# interleave_moe_layer_step 2 (odd layers MoE), max_position_embeddings 1048576.
_LLAMA4_LAYERS = _every(4, 48, CHUNKED_ATTENTION)
_model("Llama-4-Scout", ("meta-llama/Llama-4-Scout-17B-16E",
                         "meta-llama/Llama-4-Scout-17B-16E-Instruct"),
       48, 40, 8, 5120, 16384, 202048, "bfloat16", 262144, model_type="llama4_text",
       head_dim=128, layer_types=_LLAMA4_LAYERS, attention_chunk_size=8192,
       n_routed_experts=16, num_experts_per_tok=1, moe_intermediate_size=8192, n_shared_experts=1)
_model("Llama-4-Maverick", ("meta-llama/Llama-4-Maverick-17B-128E",
                            "meta-llama/Llama-4-Maverick-17B-128E-Instruct"),
       48, 40, 8, 5120, 16384, 202048, "bfloat16", 1048576, model_type="llama4_text",
       head_dim=128, layer_types=_LLAMA4_LAYERS, attention_chunk_size=8192,
       n_routed_experts=128, num_experts_per_tok=1, moe_intermediate_size=8192,
       n_shared_experts=1, decoder_sparse_step=2)
# Qwen3-Next-80B-A3B: hidden 2048, 48 layers, full_attention_interval 4 (36 Gated DeltaNet
# layers, 12 gated full-attention layers of 16 heads, 2 KV heads, head_dim 256), linear_num_key_heads
# 16, linear_num_value_heads 32, linear_key/value_head_dim 128, linear_conv_kernel_dim 4;
# 512 experts of 512, 10 per token, shared_expert_intermediate_size 512; vocab 151936, untied,
# max_position_embeddings 262144 (Qwen/Qwen3-Next-80B-A3B-Instruct config.json).
_model("Qwen3-Next-80B-A3B", ("Qwen/Qwen3-Next-80B-A3B-Instruct",
                              "Qwen/Qwen3-Next-80B-A3B-Thinking"),
       48, 16, 2, 2048, 5120, 151936, "bfloat16", 262144, model_type="qwen3_next", head_dim=256,
       layer_types=_every(4, 48, LINEAR_ATTENTION), linear_num_key_heads=16,
       linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
       linear_conv_kernel_dim=4, n_routed_experts=512, num_experts_per_tok=10,
       moe_intermediate_size=512, n_shared_experts=1)
# Nemotron-H-8B (nvidia/Nemotron-H-8B-Base-8K config.json, as transcribed in NVIDIA
# Megatron-Bridge's Nemotron-H bridge tests): model_type nemotron_h, hidden 4096, 52 layers,
# hybrid_override_pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" (24 Mamba-2, 4
# attention, 24 MLP-only layers), 32 heads, 8 KV heads, attention_head_dim 128,
# intermediate_size 21504 (relu2 up/down), mamba_num_heads 128, mamba_head_dim 64 (= expand 2 ×
# hidden), ssm_state_size 128, n_groups 8, conv_kernel 4, use_conv_bias true, vocab 131072,
# untied, max_position_embeddings 8192, bfloat16; no mamba_ssm_cache_dtype, so vLLM keeps the SSM
# state in float32 (vllm/model_executor/models/config.py, NemotronHForCausalLMConfig).
_model("Nemotron-H-8B", ("nvidia/Nemotron-H-8B-Base-8K",),
       52, 32, 8, 4096, 21504, 131072, "bfloat16", 8192, model_type="nemotron_h", head_dim=128,
       layer_types=nemotron_h_layer_types("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
       mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4,
       use_conv_bias=True, mamba_ssm_cache_dtype="float32")
# Stack-100M: a ~100M-parameter teaching-scale model (L=30, H_kv=2, d_h=64, bf16). Its other widths
# are chosen here to give ~101M parameters: hidden 512 = 8 heads × 64, SwiGLU 1408 = 2.75 × hidden.
_model("Stack-100M", (), 30, 8, 2, 512, 1408, 32000, "bfloat16", 2048, tie=True)
# tiny: the model the real backend's CPU tests run end to end (fp32 so CPU torch is exact).
_model("tiny", (), 2, 4, 2, 128, 256, 512, "float32", 2048)

# DeepSeek-V3, and R1 (the same DeepseekV3ForCausalLM config). config.json has no head_dim; the
# HF default hidden/heads = 56 is unused by MLA, whose widths are qk_nope/qk_rope/v_head_dim and
# kv_lora_rank. quantization_config: {"quant_method": "fp8", "fmt": "e4m3",
# "activation_scheme": "dynamic", "weight_block_size": [128, 128]}.
_DEEPSEEK_V3: dict[str, Any] = dict(
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, head_dim=56,
    hidden_size=7168, intermediate_size=18432, vocab_size=129280, torch_dtype="bfloat16",
    tie_word_embeddings=False, max_position_embeddings=163840, model_type="deepseek_v3",
    quantization=CheckpointQuant("fp8", "fp8", 8),
    kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128,
    n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
    first_k_dense_replace=3, n_shared_experts=1)
_register(ModelConfig(name="DeepSeek-V3", hf_id="deepseek-ai/DeepSeek-V3", **_DEEPSEEK_V3),
          "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base")
_register(ModelConfig(name="DeepSeek-R1", hf_id="deepseek-ai/DeepSeek-R1", **_DEEPSEEK_V3),
          "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-0528")  # 0528: same architecture

# -- today's real-GPU measurement rows ---------------------------------------------------------
# (AIC copy) marks the config.json values read from aiconfigurator-core 0.12.0's copy (module
# docstring). FP8 "block" checkpoints: quantization_config {"quant_method": "fp8", "fmt":
# "e4m3" (MiniMax: "float8_e4m3fn"), "activation_scheme": "dynamic", "weight_block_size":
# [128, 128]}, the routers (and MiniMax's e_score_correction_bias, Qwen's and GLM's norms, GLM's
# indexer weights_proj) in modules_to_not_convert.
_FP8_BLOCK = CheckpointQuant("fp8", "fp8", 8)

# MiniMax-M2.5 (AIC copy of MiniMaxAI/MiniMax-M2.5): MiniMaxM2ForCausalLM, 62 layers, hidden
# 3072, 48 heads, 8 KV heads, head_dim 128 (rotary_dim 64), use_qk_norm with qk_norm_type
# "per_layer", 256 experts (num_local_experts) of intermediate_size 1536, 8 per token,
# shared_intermediate_size 0, vocab 200064, untied, max_position_embeddings 196608, FP8 block
# weights. The file names no torch_dtype: vLLM reads float32 and serves bfloat16
# (simulator/kv/hf_config.py). Every layer is full attention with an MoE
# (vllm/model_executor/models/minimax_m2.py, MiniMaxM2DecoderLayer); the 3 MTP modules
# (use_mtp) are skipped unless speculative decoding loads them.
_model("MiniMax-M2.5", ("MiniMaxAI/MiniMax-M2.5",), 62, 48, 8, 3072, 1536, 200064, "bfloat16",
       196608, model_type="minimax_m2", head_dim=128, quantization=_FP8_BLOCK,
       n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=1536)

# Qwen3.5 (AIC copies of Qwen/Qwen3.5-397B-A17B, -122B-A10B, -35B-A3B, -27B; text_config,
# the vision tower not counted): Qwen3-Next's hybrid layout, layer_types linear_attention ×3 then
# full_attention (full_attention_interval 4), gated attention (attn_output_gate) of head_dim 256,
# Gated DeltaNet with linear_num_key_heads 16, key/value head dims 128, conv kernel 4,
# mamba_ssm_dtype float32 (the temporal state's cache dtype in vLLM: simulator/kv/hf_config.py),
# vocab 248320, untied, max_position_embeddings 262144, dtype bfloat16. The MoE models have
# every layer sparse with one shared expert of the routed width (shared_expert_intermediate_size
# = moe_intermediate_size) and no intermediate_size (no dense MLP; the routed width stands in,
# as simulator/kv/hf_config.py reads them). mtp_num_hidden_layers 1 is skipped by vLLM's loader
# (skip_prefixes ["mtp."], vllm/model_executor/models/qwen3_5.py).
_QWEN3_5: dict[str, Any] = dict(
    model_type="qwen3_5_moe_text", head_dim=256, linear_num_key_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    mamba_ssm_cache_dtype="float32", n_shared_experts=1)
_model("Qwen3.5-397B-A17B", ("Qwen/Qwen3.5-397B-A17B",), 60, 32, 2, 4096, 1024, 248320,
       "bfloat16", 262144, layer_types=_every(4, 60, LINEAR_ATTENTION), linear_num_value_heads=64,
       n_routed_experts=512, num_experts_per_tok=10, moe_intermediate_size=1024, **_QWEN3_5)
_model("Qwen3.5-122B-A10B", ("Qwen/Qwen3.5-122B-A10B",), 48, 32, 2, 3072, 1024, 248320,
       "bfloat16", 262144, layer_types=_every(4, 48, LINEAR_ATTENTION), linear_num_value_heads=64,
       n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=1024, **_QWEN3_5)
_model("Qwen3.5-35B-A3B", ("Qwen/Qwen3.5-35B-A3B",), 40, 16, 2, 2048, 512, 248320,
       "bfloat16", 262144, layer_types=_every(4, 40, LINEAR_ATTENTION), linear_num_value_heads=32,
       n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, **_QWEN3_5)
# The dense 27B: a SwiGLU MLP of intermediate_size 17408 on every layer, 48 value heads.
_model("Qwen3.5-27B", ("Qwen/Qwen3.5-27B",), 64, 24, 4, 5120, 17408, 248320, "bfloat16", 262144,
       layer_types=_every(4, 64, LINEAR_ATTENTION), linear_num_value_heads=48,
       **dict(_QWEN3_5, model_type="qwen3_5_text", n_shared_experts=0))

# Qwen3 FP8 checkpoints (AIC copies of Qwen/Qwen3-235B-A22B-FP8 and Qwen/Qwen3-32B-FP8): the base
# models' config.json values with FP8 block weights.
_register(replace(_CATALOG["qwen3-235b-a22b"], name="Qwen3-235B-A22B-FP8",
                  hf_id="Qwen/Qwen3-235B-A22B-FP8", quantization=_FP8_BLOCK),
          "Qwen/Qwen3-235B-A22B-FP8")
_register(replace(_CATALOG["qwen3-32b"], name="Qwen3-32B-FP8", hf_id="Qwen/Qwen3-32B-FP8",
                  quantization=_FP8_BLOCK), "Qwen/Qwen3-32B-FP8")

# Kimi-K2.5 (AIC copy of moonshotai/Kimi-K2.5, its text_config; the MoonViT vision tower is not
# counted): a DeepseekV3ForCausalLM of 61 layers, hidden 7168, 64 heads, MLA (kv_lora_rank 512,
# q_lora_rank 1536, qk_nope 128, qk_rope 64, v_head_dim 128), 384 routed experts of 2048, 8 per
# token, 1 shared, first_k_dense_replace 1 (one dense layer of 18432), vocab 163840, untied,
# max_position_embeddings 262144 (YaRN factor 64 over 4096), dtype bfloat16; no head_dim, so HF's
# hidden/heads = 112 (unused by MLA). quantization_config: compressed-tensors "pack-quantized" int4
# weights (type int, symmetric, strategy group, group_size 32, no input_activations) with
# ignore ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
# "re:.*mlp\.(gate|up|gate_up|down)_proj.*"]: only the routed experts are int4.
_model("Kimi-K2.5", ("moonshotai/Kimi-K2.5",), 61, 64, 64, 7168, 18432, 163840, "bfloat16",
       262144, model_type="kimi_k2", head_dim=112,
       quantization=CheckpointQuant("gptq", "compressed-tensors", 4, 32, 16, weight_only=True,
                                    experts_only=True),
       kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536, qk_nope_head_dim=128,
       v_head_dim=128, n_routed_experts=384, num_experts_per_tok=8, moe_intermediate_size=2048,
       first_k_dense_replace=1, n_shared_experts=1)

# DeepSeek-V3.2 (AIC copy of deepseek-ai/DeepSeek-V3.2): DeepseekV32ForCausalLM, DeepSeek-V3's
# config.json values (61 layers, MLA 512 + 64, 256 experts, first_k_dense_replace 3, FP8 block
# weights, max_position_embeddings 163840) plus DeepSeek Sparse Attention's indexer:
# index_n_heads 64, index_head_dim 128, index_topk 2048. vLLM serves it with
# vllm/model_executor/models/deepseek_v2.py (its Indexer on every layer).
_register(ModelConfig(name="DeepSeek-V3.2", hf_id="deepseek-ai/DeepSeek-V3.2",
                      **dict(_DEEPSEEK_V3, model_type="deepseek_v32"), index_n_heads=64,
                      index_head_dim=128, index_topk=2048), "deepseek-ai/DeepSeek-V3.2")

# GLM-5 (AIC copies of zai-org/GLM-5 and zai-org/GLM-5-FP8, the same values; zhipuai/GLM-5 is
# how the measurement rows name it): GlmMoeDsaForCausalLM, served by vLLM's DeepSeek-V2 code
# with its indexer (deepseek_v2.py; glm_moe_dsa routes in fp32). 78 layers, hidden 6144, 64
# heads, MLA (kv_lora_rank 512, q_lora_rank 2048, qk_nope 192, qk_rope 64, v_head_dim 256),
# head_dim 64 (unused by MLA), 256 routed experts of 2048, 8 per token, 1 shared,
# first_k_dense_replace 3 (dense layers of 12288), vocab 154880, untied,
# max_position_embeddings 202752, dtype bfloat16; indexer index_n_heads 32, index_head_dim 128,
# index_topk 2048. GLM-5 is bfloat16; GLM-5-FP8 has FP8 block weights.
_GLM_5: dict[str, Any] = dict(
    num_hidden_layers=78, num_attention_heads=64, num_key_value_heads=64, head_dim=64,
    hidden_size=6144, intermediate_size=12288, vocab_size=154880, torch_dtype="bfloat16",
    tie_word_embeddings=False, max_position_embeddings=202752, model_type="glm_moe_dsa",
    kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=2048, qk_nope_head_dim=192,
    v_head_dim=256, n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
    first_k_dense_replace=3, n_shared_experts=1, index_n_heads=32, index_head_dim=128,
    index_topk=2048)
_register(ModelConfig(name="GLM-5", hf_id="zai-org/GLM-5", **_GLM_5), "zai-org/GLM-5",
          "zhipuai/GLM-5")
_register(ModelConfig(name="GLM-5-FP8", hf_id="zai-org/GLM-5-FP8", quantization=_FP8_BLOCK,
                      **_GLM_5), "zai-org/GLM-5-FP8")

# NVIDIA ModelOpt FP8 checkpoints: the base model's config.json values; hf_quant_config.json
# {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules":
# ["lm_head"]}} (AIC copy of nvidia/Llama-3.1-70B-Instruct-FP8, producer modelopt 0.23.0). The
# 8B's file is not in that copy: taken to be its sibling's (same producer and release); the
# TensorRT-LLM docs quote an earlier upload of both (modelopt 0.23.0rc1) with
# "kv_cache_quant_algo": null (docs/source/performance/perf-benchmarking.md).
_MODELOPT_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                 "exclude_modules": ["lm_head"]}
_quantized_checkpoint(_CATALOG["llama-3.1-8b"], "Llama-3.1-8B-ModelOpt-FP8",
                      ("nvidia/Llama-3.1-8B-Instruct-FP8",), _MODELOPT_FP8)
_quantized_checkpoint(_CATALOG["llama-3.1-70b"], "Llama-3.1-70B-ModelOpt-FP8",
                      ("nvidia/Llama-3.1-70B-Instruct-FP8",), _MODELOPT_FP8)

# NVIDIA ModelOpt NVFP4 checkpoints (_nvfp4): each base model's config.json values (the AIC
# copies of the NVFP4 config.json files give the same shapes) and its hf_quant_config.json.
_DS_MLA_BF16 = ["model.layers.*.self_attn.kv_a_proj_with_mqa", "model.layers.*.self_attn.kv_b_proj",
                "model.layers.*.self_attn.q_a_proj", "model.layers.*.self_attn.q_b_proj"]
# nvidia/DeepSeek-V3.1-NVFP4 (AIC copy): DeepSeek-V3's shape; MLA projections but o_proj and
# the MTP layer 61 kept in bfloat16.
_quantized_checkpoint(_CATALOG["deepseek-v3"], "DeepSeek-V3.1-NVFP4", ("nvidia/DeepSeek-V3.1-NVFP4",),
                      _nvfp4(["lm_head", *_DS_MLA_BF16, "model.layers.61*"]))
# nvidia/DeepSeek-R1-NVFP4: DeepSeek-R1's config.json; its hf_quant_config.json is in neither
# copy read here, so DeepSeek-V3.1-NVFP4's (the same exporter on the same network) is assumed.
_quantized_checkpoint(_CATALOG["deepseek-r1"], "DeepSeek-R1-NVFP4", ("nvidia/DeepSeek-R1-NVFP4",),
                      _nvfp4(["lm_head", *_DS_MLA_BF16, "model.layers.61*"]))
# nvidia/Qwen3-32B-NVFP4: Qwen3-32B's config.json; hf_quant_config.json excludes only lm_head
# (github.com/ai-dynamo/aiconfigurator, src/aiconfigurator/model_configs/
# nvidia--Qwen3-32B-NVFP4_hf_quant_config.json at f577ab8, producer modelopt 0.33.0).
_quantized_checkpoint(_CATALOG["qwen3-32b"], "Qwen3-32B-NVFP4", ("nvidia/Qwen3-32B-NVFP4",),
                      _nvfp4(["lm_head"]))
# nvidia/Qwen3-235B-A22B-NVFP4 (AIC copy): the routers stay bfloat16, the lm_head is NVFP4 too.
_quantized_checkpoint(_CATALOG["qwen3-235b-a22b"], "Qwen3-235B-A22B-NVFP4",
                      ("nvidia/Qwen3-235B-A22B-NVFP4",), _nvfp4(["model.layers.*.mlp.gate"]))
# nvidia/MiniMax-M2.5-NVFP4 (AIC copy): attention and routers bfloat16, experts NVFP4.
_quantized_checkpoint(_CATALOG["minimax-m2.5"], "MiniMax-M2.5-NVFP4", ("nvidia/MiniMax-M2.5-NVFP4",),
                      _nvfp4(["lm_head", "model.layers.*.block_sparse_moe.gate",
                              "model.layers.*.self_attn*"]))
# nvidia/Qwen3.5-397B-A17B-NVFP4 (AIC copy): only the routed experts are NVFP4.
_quantized_checkpoint(_CATALOG["qwen3.5-397b-a17b"], "Qwen3.5-397B-A17B-NVFP4",
                      ("nvidia/Qwen3.5-397B-A17B-NVFP4",),
                      _nvfp4(["lm_head", "*.mlp.shared_expert.*",
                              "model.language_model.layers.*.linear_attn*",
                              "model.language_model.layers.*.mlp.shared_expert*",
                              "model.language_model.layers.*.mlp.shared_expert_gate",
                              "model.language_model.layers.*.self_attn*", "model.visual*",
                              "mtp.layers.0*"]))
# nvidia/Kimi-K2.5-NVFP4 (AIC copy; config.json only): quantization_config {"quant_method":
# "modelopt", "quant_algo": "NVFP4", config_groups weights and input_activations 4-bit float
# group 16, "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"}, ignore
# attention, the lm_head and the vision parts}.
# Its text_config says model_type deepseek_v3 (Kimi-K2.5's says kimi_k2): the same network.
_quantized_checkpoint(replace(_CATALOG["kimi-k2.5"], model_type="deepseek_v3"), "Kimi-K2.5-NVFP4",
                      ("nvidia/Kimi-K2.5-NVFP4",), {
    "quant_method": "modelopt", "quant_algo": "NVFP4",
    "config_groups": {"group_0": {
        "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
        "input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
        "targets": ["Linear"]}},
    "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
    "ignore": ["language_model.model.layers.*.self_attn*", "language_model.lm_head",
               "mm_projector*", "vision_tower*"]})
# nvidia/GLM-5-NVFP4 (AIC copy): MLA (o_proj too), the indexer and the MTP layer 78 bfloat16.
_quantized_checkpoint(_CATALOG["glm-5"], "GLM-5-NVFP4", ("nvidia/GLM-5-NVFP4",),
                      _nvfp4(["lm_head", "model.layers.*.self_attn.indexer*", *_DS_MLA_BF16,
                              "model.layers.*.self_attn.o_proj", "model.layers.78*"]))

def list_models() -> tuple[str, ...]:
    """Display names of the catalog's models."""
    return tuple(model.name for model in _CATALOG.values())


def get_model(name: str) -> ModelConfig:
    """The catalog model called ``name`` (case-insensitive; HF ids such as
    ``"meta-llama/Llama-3.1-8B"`` accepted). Unknown -> KvplanError with a suggestion."""
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        known = list_models()
        hint = did_you_mean(name.strip().lower(), _ALIASES)
        raise KvplanError(f"unknown model '{name}'{hint} (known: {', '.join(known)};"
                          " or give a path to a config.json)")
    if key in _NOT_MODELLED:
        raise KvplanError(f"model '{name}': its checkpoint's {_NOT_MODELLED[key][1]}")
    return _CATALOG[key]


def not_modelled() -> dict[str, str]:
    """Catalog checkpoints whose quantization the parser does not read yet: name -> why."""
    return dict(_NOT_MODELLED.values())


__all__ = ["get_model", "list_models", "not_modelled"]
