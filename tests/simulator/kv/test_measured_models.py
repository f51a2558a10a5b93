"""The model families of the real-GPU measurement rows: MiniMax-M2.5, Qwen3.5 (hybrid Gated
DeltaNet), Kimi-K2.5 (MLA MoE, int4 experts), DeepSeek-V3.2 and GLM-5 (MLA with DeepSeek Sparse
Attention's indexer), and their FP8 / NVFP4 checkpoints. Every β and parameter count below is
worked out by hand from the config.json values the catalog cites."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from simulator import api
from simulator.errors import KvplanError
from simulator.kv import catalog
from simulator.kv.catalog import get_model, not_modelled
from simulator.kv.models import load_model, model_from_hf_config
from simulator.kv.sizing import kv_cache_groups, model_kv_layout

def _beta(name: str, tp: int = 1, kv: str = "auto") -> int:
    return model_kv_layout(get_model(name), kv, tp).bytes_per_token


# -- parameter counts against the published totals -----------------------------------------------

@pytest.mark.parametrize(("name", "total", "rel_total", "active", "rel_active", "with_embedding"), [
    # MiniMax-M2 model card: "230 billion total parameters with 10 billion active" (M2.5 keeps
    # the architecture); "10B" is rounded (10.4B without the embedding lookup): 5%.
    ("minimax-m2.5", 230e9, 0.01, 10e9, 0.05, False),
    # Qwen3.5 model cards: "397B in total and 17B activated", "122B ... 10B activated", 27B
    # dense, 35B total; the activated figures count the embedding, as Qwen3's do (the vision
    # encoder, ~0.4B, is not counted).
    ("qwen3.5-397b-a17b", 397e9, 0.005, 17e9, 0.03, True),
    ("qwen3.5-122b-a10b", 122e9, 0.005, 10e9, 0.03, True),
    ("qwen3.5-35b-a3b", 35e9, 0.015, None, None, True),  # "A3B" rounds 3.45B: not compared
    ("qwen3.5-27b", 27e9, 0.005, 27e9, 0.005, True),
    # Kimi K2 model card: "1 trillion total parameters, 32 billion activated" (K2.5 keeps the
    # language model; the 1T is rounded from 1.03T: 3%).
    ("kimi-k2.5", 1e12, 0.03, 32e9, 0.03, True),
    # GLM-5 release: "744B parameters (40B active)".
    ("glm-5", 744e9, 0.002, 40e9, 0.03, False),
])
def test_param_counts_match_published(name: str, total: float, rel_total: float,
                                      active: float | None, rel_active: float | None,
                                      with_embedding: bool) -> None:
    model = get_model(name)
    assert model.num_params == pytest.approx(total, rel=rel_total)
    if active is not None:
        counted = model.num_active_params - (0 if with_embedding else model.embedding_lookup_params)
        assert counted == pytest.approx(active, rel=rel_active)


def test_minimax_m2_5_params_by_hand() -> None:
    h, layers, experts = 3072, 62, 256
    attention = 2 * h * 48 * 128 + 2 * h * 8 * 128  # q, o and k, v (no biases)
    qk_norms = 48 * 128 + 8 * 128  # "per_layer": one norm over all q heads, one over all k heads
    per_layer = attention + qk_norms + 2 * h + h * experts + experts * 3 * h * 1536
    assert get_model("minimax-m2.5").num_params == 2 * 200064 * h + layers * per_layer + h


def test_qwen3_5_397b_params_by_hand() -> None:
    h, e = 4096, 1024  # hidden; routed and shared expert width
    moe = 512 * 3 * h * e + 3 * h * e + h * 512 + h  # routed, shared, router, shared_expert_gate
    full = h * (32 * 256 * 2) + 2 * h * 2 * 256 + 32 * 256 * h + 2 * 256  # gated q, k, v, o, norms
    key_dim, value_dim = 16 * 128, 64 * 128
    gdn = (h * (2 * key_dim + 2 * value_dim) + h * 2 * 64  # in_proj_qkvz, in_proj_ba
           + (2 * key_dim + value_dim) * 4 + 64 + 64 + 128  # conv1d, dt_bias, A_log, norm
           + value_dim * h)  # out_proj
    body = 60 * (2 * h + moe) + 15 * full + 45 * gdn + h
    assert get_model("qwen3.5-397b-a17b").num_params == 2 * 248320 * h + body


def test_deepseek_v3_2_is_v3_plus_its_indexer() -> None:
    per_layer = (1536 * 64 * 128  # wq_b: q_lora_rank -> index_n_heads × index_head_dim
                 + 7168 * 128 + 7168 * 64  # wk, weights_proj
                 + 2 * 128)  # k_norm: LayerNorm weight and bias
    v32, v3 = get_model("deepseek-v3.2"), get_model("deepseek-v3")
    assert v32.num_params - v3.num_params == 61 * per_layer == 851_524_864
    # wk / weights_proj are built unquantized (quant_config=None): only wq_b is a quantized linear
    assert v32.linear_body_params - v3.linear_body_params == 61 * 1536 * 64 * 128


@pytest.mark.parametrize(("checkpoint", "base"), [
    ("qwen3-235b-a22b-fp8", "qwen3-235b-a22b"), ("qwen3-32b-fp8", "qwen3-32b"),
    ("glm-5-fp8", "glm-5"), ("llama-3.1-8b-modelopt-fp8", "llama-3.1-8b"),
    ("llama-3.1-70b-modelopt-fp8", "llama-3.1-70b"), ("minimax-m2.5-nvfp4", "minimax-m2.5"),
    ("qwen3.5-397b-a17b-nvfp4", "qwen3.5-397b-a17b"), ("kimi-k2.5-nvfp4", "kimi-k2.5"),
    ("glm-5-nvfp4", "glm-5"), ("deepseek-r1-nvfp4", "deepseek-r1"),
    ("deepseek-v3.1-nvfp4", "deepseek-v3"), ("qwen3-32b-nvfp4", "qwen3-32b"),
    ("qwen3-235b-a22b-nvfp4", "qwen3-235b-a22b"),
])
def test_quantized_checkpoints_are_their_base_network(checkpoint: str, base: str) -> None:
    if checkpoint in {k.lower() for k in not_modelled()}:  # listed, its quantization not read yet:
        pytest.skip(f"{checkpoint}: {not_modelled()}")
    a, b = get_model(checkpoint), get_model(base)
    assert (a.num_params, a.num_active_params, a.layer_types) == (b.num_params, b.num_active_params,
                                                                 b.layer_types)
    assert a.quantization is not None and a.quantization != b.quantization


# -- β by hand, per tensor-parallel rank -------------------------------------------------------

@pytest.mark.parametrize(("name", "tp", "kv", "beta"), [
    # MiniMax-M2.5: 62 full layers, K and V of 8 heads of 128, bf16
    ("minimax-m2.5", 1, "auto", 62 * 2 * 8 * 128 * 2),
    ("minimax-m2.5", 4, "auto", 62 * 2 * 2 * 128 * 2),
    ("minimax-m2.5", 8, "fp8", 62 * 2 * 1 * 128 * 1),
    # Qwen3.5: only the full-attention layers (every 4th) keep KV per token; 2 KV heads of 256
    ("qwen3.5-397b-a17b", 1, "auto", 15 * 2 * 2 * 256 * 2),
    ("qwen3.5-397b-a17b", 8, "auto", 15 * 2 * 1 * 256 * 2),  # TP 8 > 2 heads: one replica each
    ("qwen3.5-27b", 1, "auto", 16 * 2 * 4 * 256 * 2),
    # Kimi-K2.5: one MLA latent (512 + 64) per layer, on every rank
    ("kimi-k2.5", 8, "auto", 61 * (512 + 64) * 2),
    # DeepSeek Sparse Attention: the latent plus the indexer key, 128 fp8 + one fp32 scale
    ("deepseek-v3.2", 8, "auto", 61 * ((512 + 64) * 2 + 128 + 4)),
    # fp8: FlashMLA-sparse's fp8_ds_mla record, 512 fp8 + 4 fp32 scales + 64 bf16 = 656 bytes
    ("deepseek-v3.2", 8, "fp8", 61 * (512 + 16 + 128 + 132)),
    ("glm-5", 8, "auto", 78 * ((512 + 64) * 2 + 132)),
    ("glm-5-fp8", 8, "fp8", 78 * (656 + 132)),
    # ModelOpt checkpoints declare an FP8 KV cache: auto is fp8 for them (bf16 on request)
    ("llama-3.1-8b-modelopt-fp8", 1, "auto", 32 * 2 * 8 * 128 * 1),
    ("llama-3.1-8b-modelopt-fp8", 1, "bf16", 32 * 2 * 8 * 128 * 2),
    ("qwen3-32b-nvfp4", 1, "auto", 64 * 2 * 8 * 128 * 1),
    ("deepseek-r1-nvfp4", 8, "auto", 61 * (512 + 64) * 1),  # dense MLA in fp8: 576 bytes
    ("glm-5-nvfp4", 8, "auto", 78 * (656 + 132)),
    # Qwen's own FP8 checkpoints say nothing of the KV cache: the model dtype
    ("qwen3-235b-a22b-fp8", 4, "auto", 94 * 2 * 1 * 128 * 2),
])
def test_kv_bytes_per_token_by_hand(name: str, tp: int, kv: str, beta: int) -> None:
    if name in {k.lower() for k in not_modelled()}:  # listed, its quantization not read yet:
        pytest.skip(f"{name}: {not_modelled()}")
    assert _beta(name, tp, kv) == beta


def test_qwen3_5_linear_state_and_hybrid_groups_at_tp_8() -> None:
    model = get_model("qwen3.5-397b-a17b")
    # conv state: (2 × 16 key heads × 128 + 64 value heads × 128) / 8 × (kernel 4 − 1), bf16;
    # temporal state: 64 / 8 value heads × 128 × 128 in mamba_ssm_dtype float32
    conv = (2 * 16 * 128 + 64 * 128) // 8 * 3 * 2
    temporal = 64 // 8 * 128 * 128 * 4
    assert model.linear_state_bytes(8) == conv + temporal == 533_504
    layout = model_kv_layout(model, "auto", 8)
    groups = kv_cache_groups(model, layout, 16)
    assert groups is not None
    # the attention page (1,024 bytes a token) grows to hold a state: 16 × ceil(533,504 / 16,384)
    assert groups.block_size == 16 * math.ceil(533_504 / (16 * 1024)) == 528
    # 15 full and 45 linear layers: groups of 15, one full group and three linear ones
    assert groups.group_size == 15
    assert sorted((g.kind, g.num_layers) for g in groups.groups) == [
        ("full_attention", 15)] + [("linear_attention", 15)] * 3


def test_sparse_attention_and_checkpoint_kv_notes() -> None:
    notes = model_kv_layout(get_model("deepseek-v3.2"), "fp8", 8).notes
    assert any("fp8_ds_mla" in n and "656" in n for n in notes)
    assert any("indexer" in n and "132" in n and "2,048" in n for n in notes)
    ckpt = model_kv_layout(get_model("llama-3.1-8b-modelopt-fp8"), "auto", 1)
    assert ckpt.dtype == "fp8_e4m3" and any("checkpoint" in n for n in ckpt.notes)
    # a model without either keeps its notes as they were
    assert model_kv_layout(get_model("deepseek-v3"), "auto", 1).notes == ()


# -- config.json: the files the catalog transcribes parse to the same models --------------------
# Trimmed transcriptions of the AIConfigurator copies (aiconfigurator-core 0.12.0,
# aiconfigurator_core/model_configs/<org>--<name>_config.json): every field kvplan reads.

QWEN3_5_397B: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False, "vision_config": {"depth": 27, "hidden_size": 1152},
    "text_config": {
        "attention_bias": False, "attn_output_gate": True, "dtype": "bfloat16",
        "full_attention_interval": 4, "head_dim": 256, "hidden_size": 4096,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],  # × 15 below
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 64, "linear_value_head_dim": 128,
        "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 1024, "mtp_num_hidden_layers": 1, "num_attention_heads": 32,
        "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 60,
        "num_key_value_heads": 2, "shared_expert_intermediate_size": 1024, "vocab_size": 248320,
        "mamba_ssm_dtype": "float32",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25}}}
QWEN3_5_397B["text_config"]["layer_types"] *= 15

MINIMAX_M2_5: dict[str, Any] = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
    "num_hidden_layers": 62, "hidden_size": 3072, "num_attention_heads": 48,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 1536, "vocab_size": 200064,
    "num_experts_per_tok": 8, "num_local_experts": 256, "max_position_embeddings": 196608,
    "rotary_dim": 64, "tie_word_embeddings": False, "use_qk_norm": True,
    "qk_norm_type": "per_layer", "use_routing_bias": True, "shared_intermediate_size": 0,
    "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                            "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                            "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                       "lm_head"]}}

KIMI_K2_5: dict[str, Any] = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "dtype": "bfloat16", "tie_word_embeddings": False, "vision_config": {"vt_hidden_size": 1152},
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "dtype": "bfloat16",
        "first_k_dense_replace": 1, "hidden_size": 7168, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 262144, "moe_intermediate_size": 2048,
        "n_routed_experts": 384, "n_shared_experts": 1, "num_attention_heads": 64,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 163840, "tie_word_embeddings": False,
        "rope_scaling": {"factor": 64.0, "original_max_position_embeddings": 4096,
                         "type": "yarn"},
        "quantization_config": {
            "config_groups": {"group_0": {
                "input_activations": None, "targets": ["Linear"],
                "weights": {"group_size": 32, "num_bits": 4, "strategy": "group",
                            "symmetric": True, "type": "int"}}},
            "format": "pack-quantized", "quant_method": "compressed-tensors",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}}}

_DEEPSEEK_V3_FIELDS: dict[str, Any] = {
    "attention_bias": False, "first_k_dense_replace": 3, "hidden_size": 7168,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}}
DEEPSEEK_V3_2: dict[str, Any] = {
    **_DEEPSEEK_V3_FIELDS, "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}

GLM_5: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "dtype": "bfloat16",
    "first_k_dense_replace": 3, "head_dim": 64, "hidden_size": 6144, "index_head_dim": 128,
    "index_n_heads": 32, "index_topk": 2048, "intermediate_size": 12288, "kv_lora_rank": 512,
    "max_position_embeddings": 202752, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_attention_heads": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 78, "num_key_value_heads": 64, "q_lora_rank": 2048, "qk_head_dim": 256,
    "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "tie_word_embeddings": False,
    "v_head_dim": 256, "vocab_size": 154880,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}}


def _same_network(loaded: Any, catalog_name: str, *, skip: tuple[str, ...] = ()) -> None:
    entry = get_model(catalog_name)
    for field in dataclasses.fields(entry):
        if field.name in ("name", "hf_id", "config_path", *skip):
            continue
        assert getattr(loaded, field.name) == getattr(entry, field.name), field.name


@pytest.mark.parametrize(("raw", "name"), [
    (QWEN3_5_397B, "qwen3.5-397b-a17b"), (MINIMAX_M2_5, "minimax-m2.5"),
    (DEEPSEEK_V3_2, "deepseek-v3.2"), (GLM_5, "glm-5"),
])
def test_config_json_parses_to_the_catalog_entry(raw: dict[str, Any], name: str) -> None:
    _same_network(model_from_hf_config(copy.deepcopy(raw), name="m"), name)


def test_qwen3_5_config_reads_text_config_and_the_ssm_dtype() -> None:
    model = model_from_hf_config(copy.deepcopy(QWEN3_5_397B), name="q")
    assert model.mamba_ssm_cache_dtype == "float32" and model.n_shared_experts == 1
    assert model.num_layers_of("linear_attention") == 45
    # no intermediate_size: the routed width stands in (no layer has a dense MLP)
    assert model.intermediate_size == 1024 and model.num_moe_layers == 60


def test_kimi_k2_5_config_reads_its_deepseek_text_config() -> None:
    model = model_from_hf_config(copy.deepcopy(KIMI_K2_5), name="k")
    # the parser reads the int4 scheme; which modules it spares (ignore) is the catalog's word
    _same_network(model, "kimi-k2.5", skip=("quantization",))
    quant, entry = model.quantization, get_model("kimi-k2.5").quantization
    assert quant is not None and entry is not None
    assert (quant.bits, quant.group_size, quant.weight_only) == (4, 32, True)
    assert entry.experts_only  # attention, shared experts and the dense MLP stay bf16
    assert model.max_position_embeddings == 64 * 4096  # YaRN


def test_an_indexer_needs_every_field_and_mla() -> None:
    partial = {k: v for k, v in DEEPSEEK_V3_2.items() if k != "index_head_dim"}
    with pytest.raises(KvplanError, match="index_head_dim"):
        model_from_hf_config(partial, name="d")
    with pytest.raises(KvplanError, match="multi-head latent attention"):
        dataclasses.replace(get_model("llama-3.1-8b"), index_n_heads=8, index_head_dim=128,
                            index_topk=2048)


def test_a_modelopt_folder_brings_its_hf_quant_config(tmp_path: Path) -> None:
    # nvidia/Llama-3.1-70B-Instruct-FP8: config.json without quantization_config, and
    # hf_quant_config.json (AIC copy) beside it, which vLLM reads as the quantization_config
    config = {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "hidden_size": 8192, "intermediate_size": 28672,
              "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.23.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                         "exclude_modules": ["lm_head"]}}))
    model = load_model(tmp_path)
    _same_network(model, "llama-3.1-70b-modelopt-fp8")
    assert model.checkpoint_kv_cache_dtype == "fp8_e4m3"
    assert model_kv_layout(model, "auto", 2).bytes_per_token == 80 * 2 * 4 * 128 * 1
    # without the file it is the bf16 base model
    (tmp_path / "hf_quant_config.json").unlink()
    assert load_model(tmp_path).quantization is None


def test_a_checkpoint_whose_quantization_is_not_modelled_says_so(monkeypatch) -> None:
    monkeypatch.setattr(catalog, "_NOT_MODELLED", dict(catalog._NOT_MODELLED))
    monkeypatch.setattr(catalog, "_ALIASES", dict(catalog._ALIASES))
    catalog._quantized_checkpoint(get_model("qwen3-32b"), "Qwen3-32B-BNB", ("acme/Qwen3-32B-bnb",),
                                  {"quant_method": "bitsandbytes"})
    assert "Qwen3-32B-BNB" in not_modelled() and "Qwen3-32B-BNB" not in catalog.list_models()
    with pytest.raises(KvplanError, match="bitsandbytes.*not modelled.*'Qwen3-32B' is the same"):
        get_model("acme/Qwen3-32B-bnb")


# -- a tiny simulate on an H200 or a B200 at a tensor parallelism that fits ----------------------

SCENARIO = """\
name: smoke
seed: 1
model: {model}
gpu: {gpu}
tensor_parallel: {tp}
allocators: [paged]
max_model_len: 4096
latency: {{model: roofline}}
workload:
  num_requests: 8
  arrival: {{process: poisson, rate: 4}}
  prompt_tokens: {{dist: fixed, value: 512}}
  output_tokens: {{dist: fixed, value: 16}}
"""


@pytest.mark.parametrize(("name", "gpu", "tp"), [
    ("MiniMax-M2.5", "h200", 4), ("Qwen3.5-397B-A17B", "h200", 8), ("Qwen3.5-27B", "h200", 1),
    ("Kimi-K2.5", "h200", 8), ("DeepSeek-V3.2", "h200", 8), ("GLM-5-FP8", "h200", 8),
    ("Qwen3-235B-A22B-FP8", "h200", 4), ("Llama-3.1-8B-ModelOpt-FP8", "h200", 1),
    ("Qwen3-32B-NVFP4", "h200", 1), ("DeepSeek-R1-NVFP4", "h200", 8),
    # NVFP4 on FP4 tensor cores
    ("Qwen3-32B-NVFP4", "b200", 1), ("DeepSeek-R1-NVFP4", "b200", 4), ("GLM-5-NVFP4", "b200", 8),
    ("Kimi-K2.5-NVFP4", "b200", 8), ("Qwen3.5-397B-A17B-NVFP4", "b200", 4),
    ("MiniMax-M2.5-NVFP4", "b200", 2),
])
def test_a_tiny_simulate_runs(tmp_path: Path, name: str, gpu: str, tp: int) -> None:
    if name in not_modelled():  # listed, its quantization not read yet: the catalog says so
        pytest.skip(f"{name}: {not_modelled()[name]}")
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(model=name, gpu=gpu, tp=tp))
    result = api.simulate(path)
    summary = result.summary["paged"]
    assert summary.completed == 8
    deployment = result.plan.deployment
    assert deployment.capacity.bytes_per_token == _beta(name, tp)  # the β the tests above derive
    assert summary.kv.capacity_tokens == deployment.capacity_tokens > 8 * (512 + 16)
