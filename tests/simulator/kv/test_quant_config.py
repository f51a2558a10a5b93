"""quantization_config as checkpoints spell it -> CheckpointQuant (small inline fixtures)."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.errors import KvplanError
from simulator.kv.quant_config import CheckpointQuant, parse_quantization_config

# The spellings of real checkpoints (trimmed to the keys that matter).
DEEPSEEK_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]}
NEURALMAGIC_FP8 = {  # neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8: static per-tensor scales
    "quant_method": "compressed-tensors", "format": "naive-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
                    "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                              "dynamic": False}}}}
FP8_DYNAMIC = {  # RedHatAI "-FP8-dynamic": per-channel weights, per-token dynamic activations
    "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                              "dynamic": True}}}}
W8A8_INT8 = {
    "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                              "dynamic": True}}}}
W4A16 = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                    "symmetric": True},
        "input_activations": None}}}
AWQ = {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm", "zero_point": True}
GPT_OSS = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
# ModelOpt NVFP4 as config.json spells it (nvidia/*-FP4 checkpoints: quant_algo, group_size 16,
# what stays unquantized under "ignore"), and the legacy hf_quant_config.json nesting.
MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                  "ignore": ["lm_head"], "kv_cache_scheme": None}
MODELOPT_NVFP4_NESTED = {"quant_method": "modelopt", "quantization": {
    "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
    "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]}}
# llm-compressor's NVFP4 scheme ("nvfp4-pack-quantized"): FP4 weights and activations in
# tensor_group blocks of 16; NVFP4A16 is the same weights with input_activations null.
CT_NVFP4 = {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                    "group_size": 16, "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                              "group_size": 16, "dynamic": "local"}}}}
CT_NVFP4A16 = dict(CT_NVFP4, config_groups={"group_0": dict(
    CT_NVFP4["config_groups"]["group_0"], input_activations=None)})
# AMD Quark OCP MXFP4 (amd/*-MXFP4 checkpoints): fp4 weights and inputs, per_group of 32.
QUARK_MXFP4 = {"quant_method": "quark", "exclude": ["lm_head"], "global_quant_config": {
    "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
               "scale_format": "e8m0", "is_dynamic": False},
    "input_tensors": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
                      "scale_format": "e8m0", "is_dynamic": True},
    "output_tensors": None}}


@pytest.mark.parametrize(("raw", "expected"), [
    (DEEPSEEK_FP8, CheckpointQuant("fp8", "fp8", 8)),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0},
     CheckpointQuant("fp8", "fbgemm_fp8", 8)),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, CheckpointQuant("fp8", "modelopt", 8)),
    (NEURALMAGIC_FP8, CheckpointQuant("fp8", "compressed-tensors", 8)),
    (FP8_DYNAMIC, CheckpointQuant("fp8", "compressed-tensors", 8)),
    (W8A8_INT8, CheckpointQuant("int8", "compressed-tensors", 8)),
    (W4A16, CheckpointQuant("gptq", "compressed-tensors", 4, 128, 16, weight_only=True)),
    (AWQ, CheckpointQuant("awq", "awq", 4, 128, 16, zero_point=True, weight_only=True)),
    ({"w_bit": 4, "q_group_size": 64, "zero_point": False, "quant_method": "awq"},
     CheckpointQuant("awq", "awq", 4, 64, 16, weight_only=True)),
    ({"bits": 8, "group_size": 128, "sym": True, "desc_act": False, "quant_method": "gptq"},
     CheckpointQuant("gptq", "gptq", 8, 128, 16, zero_point=True, weight_only=True)),
    ({"bits": 4, "group_size": -1, "quant_method": "gptq"},  # one group per column
     CheckpointQuant("gptq", "gptq", 4, weight_only=True)),
    (GPT_OSS, CheckpointQuant("mxfp4", "mxfp4", 4, 32, 8, weight_only=True, experts_only=True)),
    (MODELOPT_NVFP4, CheckpointQuant("nvfp4", "modelopt", 4, 16, 8)),
    (MODELOPT_NVFP4_NESTED, CheckpointQuant("nvfp4", "modelopt", 4, 16, 8, experts_only=True)),
    ({"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "group_size": 16},
     CheckpointQuant("nvfp4", "modelopt", 4, 16, 8, weight_only=True)),
    ({"quant_method": "modelopt", "quant_algo": "nvfp4"},  # ModelOpt may write it lower-case
     CheckpointQuant("nvfp4", "modelopt", 4, 16, 8)),
    (CT_NVFP4, CheckpointQuant("nvfp4", "compressed-tensors", 4, 16, 8)),
    (CT_NVFP4A16, CheckpointQuant("nvfp4", "compressed-tensors", 4, 16, 8, weight_only=True)),
    (QUARK_MXFP4, CheckpointQuant("mxfp4", "quark", 4, 32, 8)),
    (dict(QUARK_MXFP4, global_quant_config=dict(QUARK_MXFP4["global_quant_config"],
                                                 input_tensors=None)),
     CheckpointQuant("mxfp4", "quark", 4, 32, 8, weight_only=True)),
])
def test_spellings(raw: dict[str, Any], expected: CheckpointQuant) -> None:
    assert parse_quantization_config(raw) == expected


def test_weight_only_fp8_is_flagged() -> None:
    w8a16 = dict(FP8_DYNAMIC, config_groups={"group_0": dict(
        FP8_DYNAMIC["config_groups"]["group_0"], input_activations=None)})
    parsed = parse_quantization_config(w8a16)
    assert parsed is not None and parsed.method == "fp8" and parsed.weight_only


def test_bits_per_weight_counts_scales_and_zeros() -> None:
    awq = parse_quantization_config(AWQ)
    assert awq is not None and awq.bits_per_weight == 4 + (16 + 4) / 128
    mx = parse_quantization_config(GPT_OSS)
    assert mx is not None and mx.bits_per_weight == 4 + 8 / 32
    nv = parse_quantization_config(MODELOPT_NVFP4)  # an FP8 E4M3 scale per 16 FP4 values
    assert nv is not None and nv.bits_per_weight == 4 + 8 / 16 == 4.5
    assert CheckpointQuant("fp8", "fp8", 8).bits_per_weight == 8.0


def test_absent_is_none() -> None:
    assert parse_quantization_config(None) is None


@pytest.mark.parametrize(("raw", "message"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes' is not modelled"),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"},
     r"quant_algo MIXED_PRECISION\) is not modelled"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32},
     "modelopt NVFP4 with group_size 32 is not modelled"),
    ({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp8_e4m3"}}},
     "quark with fp8_e4m3 weights is not modelled"),
    ({"quant_method": "awq", "bits": 3}, "awq with 3 bits"),
    ({"quant_method": "gptq", "bits": "4"}, "'bits' must be an integer"),
    ({"quant_method": "compressed-tensors"}, "without config_groups"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}}},
     "float 4-bit weights with group_size none are not modelled"),
    ("fp8", "must be an object"),
])
def test_unmodelled_or_malformed_is_one_clear_error(raw: Any, message: str) -> None:
    with pytest.raises(KvplanError, match=message):
        parse_quantization_config(raw)
