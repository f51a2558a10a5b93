"""Nemotron-H (Mamba-2 hybrid): config.json parsing, the Mamba-2 state vLLM keeps per layer,
the parameter count, and `kvplan size` against a hand calculation."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from simulator.errors import KvplanError
from simulator.kv.hf_config import model_from_hf_config
from simulator.kv.model_config import FULL_ATTENTION, LINEAR_ATTENTION, MLP_ONLY
from simulator.kv.models import get_model
from simulator.commands.size import add_parser, run

PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
# nvidia/Nemotron-H-8B-Base-8K config.json, the fields kvplan reads
CONFIG: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "hybrid_override_pattern": PATTERN, "hidden_size": 4096, "num_hidden_layers": 52,
    "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
    "intermediate_size": 21504, "mamba_num_heads": 128, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2, "use_conv_bias": True,
    "vocab_size": 131072, "tie_word_embeddings": False, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
STATE_BYTES = 30720 * 2 + 1048576 * 4  # conv state in bf16, SSM state in fp32 (below)


def test_config_json_is_the_catalog_entry() -> None:
    parsed = model_from_hf_config(CONFIG, name="Nemotron-H-8B")
    catalog = get_model("nemotron-h-8b")
    assert parsed.layer_types == catalog.layer_types
    assert parsed.layer_types.count(LINEAR_ATTENTION) == 24
    assert parsed.layer_types.count(FULL_ATTENTION) == 4
    assert parsed.layer_types.count(MLP_ONLY) == 24
    # "M-M-M-M*-": Mamba and MLP alternate, the 8th layer attends
    assert parsed.layer_types[:9] == (LINEAR_ATTENTION, MLP_ONLY) * 3 + (
        LINEAR_ATTENTION, FULL_ATTENTION, MLP_ONLY)
    for field in ("head_dim", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                  "conv_kernel", "use_conv_bias", "intermediate_size", "num_params"):
        assert getattr(parsed, field) == getattr(catalog, field), field
    # no mamba_ssm_cache_dtype in config.json: vLLM's NemotronH default, float32
    assert parsed.mamba_ssm_cache_dtype == catalog.mamba_ssm_cache_dtype == "float32"
    assert parsed.num_kv_layers == 4


def test_mamba2_state_per_layer_and_rank() -> None:
    model = get_model("nemotron-h-8b")
    conv_dim = 128 * 64 + 2 * 8 * 128  # I + 2 · n_groups · state = 10,240
    assert model.linear_state_elements(1) == (conv_dim * 3, 128 * 64 * 128)
    assert model.linear_state_bytes(1) == STATE_BYTES == 4_255_744
    # TP 2 splits the conv channels and the heads: 5,120 × 3 and 64 × 64 × 128
    assert model.linear_state_elements(2) == (15360, 524288)
    assert model.linear_state_bytes(2) == 15360 * 2 + 524288 * 4
    # TP 16 exceeds the 8 groups: vLLM's MambaMixer2 refuses (n_groups must divide or be 1)
    with pytest.raises(KvplanError, match="Mamba heads"):
        model.linear_state_elements(16)
    bf16_state = model_from_hf_config({**CONFIG, "mamba_ssm_cache_dtype": "bfloat16"}, name="x")
    assert bf16_state.linear_state_bytes(1) == (30720 + 1048576) * 2


def test_mamba2_n_groups_extended_to_the_tp_size() -> None:
    one_group = model_from_hf_config({**CONFIG, "n_groups": 1}, name="one-group")
    # extra_groups_for_head_shards: 1 group at TP 4 becomes 4, conv_dim 8,192 + 2 · 4 · 128
    assert one_group.linear_state_elements(4) == ((8192 + 1024) // 4 * 3, 32 * 64 * 128)


def test_parameter_count_by_hand() -> None:
    h, inner, conv_dim = 4096, 8192, 10240
    embeddings = 2 * 131072 * h  # input embedding and an untied lm_head
    attention = 2 * h * 32 * 128 + 2 * h * 8 * 128  # q, o; k, v
    mlp = 2 * h * 21504  # relu² up, down
    mamba = (h * (2 * inner + 2 * 8 * 128 + 128)  # in_proj: gate, x, B, C, dt
             + conv_dim * 4 + conv_dim  # depthwise conv1d and its bias
             + 3 * 128  # A, D, dt_bias
             + inner  # gated RMSNorm
             + inner * h)  # out_proj
    norms = 52 * h + h  # one per layer, norm_f
    expected = embeddings + 4 * attention + 24 * mlp + 24 * mamba + norms
    assert expected == 8_100_852_736
    assert get_model("nemotron-h-8b").num_params == expected


def test_unmodelled_patterns_are_refused() -> None:
    with pytest.raises(KvplanError, match="'E'"):
        model_from_hf_config({**CONFIG, "hybrid_override_pattern": PATTERN[:-1] + "E"}, name="x")
    with pytest.raises(KvplanError, match="52 layer kinds"):
        model_from_hf_config({**CONFIG, "hybrid_override_pattern": PATTERN[:-1]}, name="x")


def test_size_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert run(parser.parse_args(["size", "--model", "nemotron-h-8b", "--gpu", "h100",
                                  "--seq-len", "2048", "--json"])) == 0
    r = json.loads(capsys.readouterr().out)
    page_token = 2 * 8 * 128 * 2  # K and V of 8 heads of 128, bf16: 4,096 B per layer
    assert r["bytes_per_token"] == 4 * page_token  # the 4 attention layers only
    # a 2,048-token sequence: 4 layers × 2,048 tokens, and 24 fixed Mamba states
    assert r["total_bytes"] == 4 * page_token * 2048 + 24 * STATE_BYTES == 135_692_288
    weights = 8_100_852_736 * 2
    # peak activations at 8,192 batched tokens: residual 2·T·h·2, the relu² MLP's up output and
    # its activation 2·T·21,504·2 (over attention T·(2·32 + 2·8)·128·2 and the logits 2·256·V·4)
    activations = 2 * 8192 * 4096 * 2 + 2 * 8192 * 21504 * 2
    assert (r["weight_bytes"], r["activation_bytes"]) == (weights, activations)
    # 0.9 of the 85,045,477,376 B an H100 reports (79.20 GiB), not its 80 GiB name
    available = int(0.9 * 85_045_477_376) - weights - activations - 2**29
    assert r["available_kv_bytes"] == available == 58_963_492_454
    # groups of 4 layers (4 attention, 24 Mamba: 24 ≥ 1.5 × 4): 1 full and 6 linear groups; a
    # state (4,255,744 B) must fit an attention page: block 16 · ceil(4,255,744 / (16 · 4,096))
    assert r["block_size"] == 16 * 65 == 1040
    assert r["block_bytes"] == 1040 * page_token * 4
    assert r["num_blocks"] == available // (1040 * page_token * 4) == 3460
    # an 8,192-token request: ceil(8,192 / 1,040) = 8 full blocks + 6 state blocks
    assert r["max_concurrency"] == pytest.approx(3460 / 14)
    assert r["capacity_tokens"] == int(3460 / 14 * 8192)
    assert r["max_seqs_at_seq_len"] == 3460 // (2 + 6)


def test_roofline_one_allreduce_per_layer_and_the_float32_state() -> None:
    # A Nemotron-H layer is one block (Mamba-2 mixer, attention or MLP): one all-reduce per
    # layer at TP > 1, not a transformer layer's two. A decode step reads and writes back each
    # sequence's state in all 24 Mamba layers: (conv 30,720 x 2 B + SSM 1,048,576 x 4 B) each.
    from simulator.kv.gpus import get_gpu
    from simulator.latency.roofline import RooflineLatency
    from simulator.scheduler.plan import StepPlan

    model = get_model("nemotron-h-8b")
    tp2 = RooflineLatency(model, get_gpu("h100-80gb"), tp=2)
    plan = StepPlan(0, (), 3, 3 * 100, 0.0, 0)
    assert tp2.step_terms(plan).allreduce_calls == 52
    tp1 = RooflineLatency(model, get_gpu("h100-80gb"))
    state = 30_720 * 2 + 1_048_576 * 4
    kv_token = 16_384  # K and V of the 4 attention layers, per token
    assert tp1.step_terms(plan).kv_read_bytes == 3 * 100 * kv_token + 3 * 2 * 24 * state
