"""Today's catalog models: published parameter counts, β by hand, MoE and sliding-window
config.json vocabularies (Qwen3-MoE, gpt-oss, Gemma 3), and the full-attention note."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model, model_from_hf_config
from simulator.kv.sizing import bytes_per_token, kv_capacity, model_kv_layout


@pytest.mark.parametrize(("name", "total", "active", "rel"), [
    # Model cards: Qwen3-8B "8.2B", Qwen3-32B "32.8B", Qwen3-30B-A3B "30.5B in total and 3.3B
    # activated", Qwen3-235B-A22B "235B in total and 22B activated".
    ("qwen3-8b", 8.2e9, 8.2e9, 0.01),
    ("qwen3-32b", 32.8e9, 32.8e9, 0.01),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.02),
    # Mistral AI, "Mixtral of experts": 46.7B total, 12.9B used per token.
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01),
    ("llama-3.3-70b", 70.6e9, 70.6e9, 0.01),
    ("llama-3.1-70b-fp8", 70.6e9, 70.6e9, 0.01),
    ("deepseek-r1", 671e9, 37e9, 0.03),
])
def test_param_counts_match_published(name: str, total: float, active: float,
                                      rel: float) -> None:
    model = get_model(name)
    assert model.num_params == pytest.approx(total, rel=rel)
    assert model.num_active_params == pytest.approx(active, rel=rel)


@pytest.mark.parametrize(("name", "total", "active"), [
    # OpenAI's gpt-oss model card: 116.83B total / 5.13B active, 20.91B / 3.61B; the active
    # figure counts the unembedding but not the embedding lookup.
    ("gpt-oss-120b", 116.83e9, 5.13e9),
    ("gpt-oss-20b", 20.91e9, 3.61e9),
])
def test_gpt_oss_counts(name: str, total: float, active: float) -> None:
    model = get_model(name)
    assert model.num_params == pytest.approx(total, rel=0.002)
    assert model.num_active_params - model.embedding_lookup_params == pytest.approx(active,
                                                                                    rel=0.002)


def test_gemma3_27b_text_tower() -> None:
    # "27B" counts the 0.4B SigLIP vision tower too; the text tower alone is ~27.0B.
    model = get_model("gemma-3-27b")
    assert model.num_params == pytest.approx(27.0e9, rel=0.01)
    assert model.tie_word_embeddings and model.embedding_lookup_params == 0


@pytest.mark.parametrize(("name", "beta"), [
    ("llama-3.3-70b", 2 * 80 * 8 * 128 * 2),
    ("qwen3-8b", 2 * 36 * 8 * 128 * 2),
    ("qwen3-32b", 2 * 64 * 8 * 128 * 2),
    ("qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),
    ("qwen3-235b-a22b", 2 * 94 * 4 * 128 * 2),
    ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),
    ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),
    ("gemma-3-27b", 2 * 62 * 16 * 128 * 2),
    ("deepseek-r1", 61 * (512 + 64) * 2),
])
def test_kv_bytes_per_token_by_hand(name: str, beta: int) -> None:
    assert bytes_per_token(get_model(name)) == beta


def test_hybrid_models_state_their_layer_mix() -> None:
    note = "18 of 36 layers are sliding-window 128"
    gpt_oss = get_model("gpt-oss-120b")
    assert gpt_oss.attention_note == note
    assert model_kv_layout(gpt_oss).notes == (note,)
    assert note in kv_capacity(gpt_oss, get_gpu("h100")).notes
    assert get_model("gemma-3-27b").attention_note == "52 of 62 layers are sliding-window 1024"
    assert get_model("mistral-7b").num_sliding_window_layers == 32
    for full in ("qwen3-8b", "llama-3.3-70b", "deepseek-v3", "mixtral-8x7b"):
        assert get_model(full).attention_note is None


# -- config.json vocabularies --------------------------------------------------------------------

QWEN3_30B_A3B: dict[str, Any] = {  # huggingface.co/Qwen/Qwen3-30B-A3B config.json (trimmed)
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
    "max_position_embeddings": 40960, "sliding_window": None, "use_sliding_window": False,
    "max_window_layers": 48, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_qwen3_moe_config_matches_the_catalog() -> None:
    loaded = model_from_hf_config(QWEN3_30B_A3B, name="q")
    catalog = get_model("Qwen/Qwen3-30B-A3B")
    assert (loaded.num_params, loaded.num_active_params) == (catalog.num_params,
                                                             catalog.num_active_params)
    assert loaded.num_moe_layers == 48 and loaded.n_shared_experts == 0


def test_qwen_moe_sparse_step_mlp_only_layers_and_shared_experts() -> None:
    sparse = dict(QWEN3_30B_A3B, decoder_sparse_step=2, mlp_only_layers=[1, 2])
    model = model_from_hf_config(sparse, name="q")
    assert model.num_moe_layers == 23  # layers 1, 3, ..., 47 are MoE, less layer 1
    dense_layers = 48 - 23
    attention = 2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128  # q, o and k, v
    assert model.linear_body_params == 48 * attention + dense_layers * 3 * 2048 * 6144
    shared = model_from_hf_config(dict(QWEN3_30B_A3B, shared_expert_intermediate_size=1536),
                                  name="q")
    assert shared.n_shared_experts == 2  # a 1536-wide shared expert = two 768-wide ones
    with pytest.raises(KvplanError, match="not a multiple of moe_intermediate_size"):
        model_from_hf_config(dict(QWEN3_30B_A3B, shared_expert_intermediate_size=1000), name="q")


def test_gpt_oss_config_matches_the_catalog() -> None:
    raw = {"model_type": "gpt_oss", "num_hidden_layers": 24, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880,
           "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
           "vocab_size": 201088, "max_position_embeddings": 131072, "attention_bias": True,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 12,
           "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
               "model.layers.*.self_attn", "model.layers.*.mlp.router",
               "model.embed_tokens", "lm_head"]}}
    loaded, catalog = model_from_hf_config(raw, name="g"), get_model("openai/gpt-oss-20b")
    assert loaded.num_params == catalog.num_params
    assert loaded.layer_types == catalog.layer_types and loaded.sliding_window == 128
    assert loaded.quantization == catalog.quantization


def test_gemma3_multimodal_config_reads_text_config_and_defaults() -> None:
    raw = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152},
           "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                           "model_type": "gemma3_text", "num_attention_heads": 32,
                           "num_hidden_layers": 62, "num_key_value_heads": 16,
                           "query_pre_attn_scalar": 168, "sliding_window": 1024}}
    loaded = model_from_hf_config(raw, name="gemma")
    catalog = get_model("google/gemma-3-27b-it")
    assert loaded.num_params == catalog.num_params  # vocab 262208, tied: Gemma3TextConfig's
    assert loaded.layer_types == catalog.layer_types  # 5 local layers per global one
    assert loaded.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)


@pytest.mark.parametrize(("extra", "sliding"), [
    ({"sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28}, 0),  # Qwen2
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 20}, 12),
    ({"sliding_window": 4096}, 32),  # Mistral-7B-v0.1: every layer
    ({"sliding_window": None}, 0),
    ({"sliding_window": 512, "sliding_window_pattern": 4}, 24),
    ({"sliding_window": 512, "layer_types": ["full_attention"] * 32}, 0),
])
def test_which_layers_slide(extra: dict[str, Any], sliding: int) -> None:
    raw = {"model_type": "qwen2", "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 11008,
           "vocab_size": 32000, "max_position_embeddings": 32768, **extra}
    model = model_from_hf_config(raw, name="m")
    assert model.num_sliding_window_layers == sliding
    assert (model.attention_note is None) == (sliding == 0)


def test_layer_types_of_the_wrong_length_is_an_error() -> None:
    raw = dict(QWEN3_30B_A3B, layer_types=["full_attention", "sliding_attention"],
               sliding_window=64, use_sliding_window=None)
    with pytest.raises(KvplanError, match="layer_types lists 2 layers, num_hidden_layers is 48"):
        model_from_hf_config(raw, name="q")
