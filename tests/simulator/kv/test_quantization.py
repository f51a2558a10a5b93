"""Quantized weights: bytes by hand, the GEMM dtype per GPU, and the errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.config.deployment import build_deployment
from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model, list_models, model_from_hf_config
from simulator.kv.quantization import QUANTIZATIONS, canonical_quantization, resolve_quantization
from simulator.kv.sizing import kv_capacity
from simulator.config.scenario import Scenario, parse_scenario

H100, A100 = get_gpu("h100"), get_gpu("a100")
B200, MI355X = get_gpu("b200"), get_gpu("mi355x")

# Llama-3.1-8B, per layer: q, o 4096×4096; k, v 4096×1024; gate, up, down 4096×14336.
LLAMA8_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
LLAMA8_EMBED = 128256 * 4096  # the embedding, and again the (untied) lm_head
LLAMA8_NORMS = 2 * 32 * 4096 + 4096

LLAMA8_AWQ_CONFIG = {  # an AutoAWQ export of Llama-3.1-8B-Instruct (config.json, trimmed)
    "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "float16",
    "tie_word_embeddings": False,
    "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq",
                            "version": "gemm", "zero_point": True}}


def test_fp8_checkpoint_weight_bytes_by_hand() -> None:
    model = get_model("llama-3.1-8b-fp8")
    assert model.linear_body_params == LLAMA8_LINEAR
    fmt = resolve_quantization(model, "auto", H100)
    # 1 byte per linear weight; embedding, lm_head and norms stay bf16 ("ignore": ["lm_head"]).
    expected = LLAMA8_LINEAR + 2 * (2 * LLAMA8_EMBED + LLAMA8_NORMS)
    assert fmt.weight_bytes == expected == 9_081_200_640
    # neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8's two safetensors files hold 5 GB + 4.08 GB
    # (huggingface.co/neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8/tree/main); scales and
    # headers are the rest.
    assert fmt.weight_bytes == pytest.approx(9.08e9, rel=0.005)
    assert fmt.dense_weight_bytes == expected - 2 * LLAMA8_EMBED  # the lookup is not streamed
    assert (fmt.quantization, fmt.origin, fmt.weight_dtype) == ("fp8", "checkpoint", "fp8_e4m3")


LLAMA8_NVFP4_CONFIG = dict(  # a ModelOpt NVFP4 export of Llama-3.1-8B-Instruct (trimmed)
    LLAMA8_AWQ_CONFIG, torch_dtype="bfloat16",
    quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                         "ignore": ["lm_head"]})


def test_nvfp4_checkpoint_weight_bytes_by_hand() -> None:
    model = model_from_hf_config(LLAMA8_NVFP4_CONFIG, name="llama-3.1-8b-nvfp4")
    fmt = resolve_quantization(model, "auto", B200)
    values = LLAMA8_LINEAR // 2  # E2M1, two per byte
    scales = LLAMA8_LINEAR // 16  # one FP8 E4M3 byte per block of 16
    assert fmt.weight_bytes == values + scales + 2 * (2 * LLAMA8_EMBED + LLAMA8_NORMS)
    assert fmt.weight_bytes == 6_027_747_328
    assert (fmt.weight_dtype, fmt.linear_bits, fmt.gemm_dtype) == ("nvfp4", 4.5, "fp4")
    # Hopper has no FP4 tensor cores: the same bytes, read by FP4 Marlin with bf16 activations.
    hopper = resolve_quantization(model, "auto", H100)
    assert (hopper.weight_bytes, hopper.gemm_dtype) == (fmt.weight_bytes, "bf16")
    assert any("no NVFP4 tensor cores" in n and "W4A16" in n for n in hopper.notes)
    # CDNA 4's FP4 tensor cores take MXFP4 (E8M0 scales, blocks of 32), not NVFP4.
    assert resolve_quantization(model, "auto", MI355X).gemm_dtype == "bf16"


def test_fp4_what_ifs_are_sized_like_their_checkpoints() -> None:
    bf16 = get_model("llama-3.1-8b")
    real = resolve_quantization(model_from_hf_config(LLAMA8_NVFP4_CONFIG, name="x"), "auto", B200)
    nvfp4 = resolve_quantization(bf16, "nvfp4", B200)
    assert (nvfp4.weight_bytes, nvfp4.origin, nvfp4.gemm_dtype) == (real.weight_bytes, "what-if",
                                                                   "fp4")
    assert "vLLM needs such a checkpoint" in nvfp4.notes[0]
    mxfp4 = resolve_quantization(bf16, "mxfp4", MI355X)  # AMD Quark's OCP MXFP4 W4A4
    assert mxfp4.weight_bytes == (LLAMA8_LINEAR * (4 + 8 / 32) + 16 * (2 * LLAMA8_EMBED
                                                                    + LLAMA8_NORMS)) / 8
    assert (mxfp4.gemm_dtype, mxfp4.linear_bits) == ("fp4", 4.25)
    emulated = resolve_quantization(bf16, "mxfp4", get_gpu("mi325x"))  # CDNA 3: no FP4
    assert emulated.gemm_dtype == "bf16"
    assert any("no MXFP4 tensor cores" in n for n in emulated.notes)


def test_gpt_oss_mxfp4_stays_weight_only_on_blackwell() -> None:
    # vLLM's MXFP4 MoE backends take bf16 activations by default, Blackwell's included.
    fmt = resolve_quantization(get_model("gpt-oss-120b"), "auto", B200)
    assert (fmt.gemm_dtype, fmt.expert_bits) == ("bf16", 4.25)
    assert any("weight-only on B200-180GB too" in n for n in fmt.notes)
    assert fmt.weight_bytes == resolve_quantization(get_model("gpt-oss-120b"), "auto",
                                                    H100).weight_bytes


def test_awq_checkpoint_weight_bytes_by_hand() -> None:
    model = model_from_hf_config(LLAMA8_AWQ_CONFIG, name="llama-3.1-8b-awq")
    fmt = resolve_quantization(model, "auto", H100)
    qweight = LLAMA8_LINEAR // 2  # 4 bits per weight, packed 8 per int32
    groups = LLAMA8_LINEAR // 128  # one group of 128 input rows per output column
    scales, qzeros = 2 * groups, groups // 2  # fp16 scale and 4-bit zero per group
    assert fmt.weight_bytes == qweight + scales + qzeros + 2 * (2 * LLAMA8_EMBED + LLAMA8_NORMS)
    assert (fmt.weight_dtype, fmt.gemm_dtype, fmt.linear_bits) == ("int4", "fp16", 4.15625)


def test_awq_what_if_is_sized_like_the_checkpoint_and_noted() -> None:
    bf16 = get_model("llama-3.1-8b")
    what_if = resolve_quantization(bf16, "awq", H100)
    real = resolve_quantization(model_from_hf_config(LLAMA8_AWQ_CONFIG, name="x"), "auto", H100)
    assert what_if.weight_bytes == real.weight_bytes  # fp16 and bf16 are both 2 bytes
    assert what_if.origin == "what-if" and "vLLM needs such a checkpoint" in what_if.notes[0]


def test_mxfp4_quantizes_only_the_experts() -> None:
    model = get_model("gpt-oss-20b")
    fmt = resolve_quantization(model, "auto", H100)
    assert (fmt.linear_bits, fmt.expert_bits) == (16.0, 4.25)
    matrices = 24 * 32 * 3 * 2880 * 2880  # routed experts' gate, up, down
    bf16 = model.num_params - matrices  # attention, router, embeddings, biases, norms
    assert fmt.weight_bytes == (matrices * 4.25 + bf16 * 16) / 8
    assert fmt.gemm_dtype == "bf16"  # weight-only on Hopper


def test_deepseek_fp8_keeps_routers_and_norms_in_bf16() -> None:
    ds = get_model("deepseek-v3")
    fmt = resolve_quantization(ds, "auto", get_gpu("h200"))
    experts = 58 * 256 * 3 * 7168 * 2048
    bf16 = ds.num_params - ds.linear_body_params - experts
    # embedding + lm_head, 61 layers × (2 norms + q_a and kv_a norms), 58 routers, final norm
    assert bf16 == 2 * 129280 * 7168 + 61 * (2 * 7168 + 1536 + 512) + 58 * 256 * 7168 + 7168
    assert fmt.weight_bytes == ds.linear_body_params + experts + 2 * bf16


@pytest.mark.parametrize(("model", "quantization", "gpu", "gemm"), [
    ("llama-3.1-8b-fp8", "auto", "h100", "fp8"),
    ("llama-3.1-8b-fp8", "auto", "l4", "fp8"),
    ("llama-3.1-8b-fp8", "auto", "rtx-4090", "fp8"),
    ("llama-3.1-8b-fp8", "auto", "mi300x", "fp8"),
    ("llama-3.1-8b-fp8", "auto", "a100", "bf16"),  # FP8 Marlin: weight-only on Ampere
    ("llama-3.1-8b-fp8", "auto", "a10g", "bf16"),
    ("llama-3.1-8b", "fp8", "h200", "fp8"),  # vLLM's online FP8
    ("llama-3.1-8b", "int8", "a100", "int8"),
    ("llama-3.1-8b", "w8a8", "h100", "int8"),
    ("llama-3.1-8b", "awq", "h100", "bf16"),
    ("llama-2-7b", "gptq", "h100", "fp16"),  # weight-only GEMMs run in the activation dtype
    ("llama-3.1-8b", "none", "h100", "bf16"),
    ("llama-3.1-8b-fp8", "none", "h100", "bf16"),
    ("tiny", "auto", "h100", "fp32"),
    ("gpt-oss-120b", "auto", "h100", "bf16"),
    ("gpt-oss-120b", "auto", "b200", "bf16"),  # MXFP4 MoE with bf16 activations
    ("gpt-oss-120b", "auto", "mi355x", "bf16"),
    ("llama-3.1-8b", "nvfp4", "b200", "fp4"),
    ("llama-3.1-8b", "nvfp4", "b300", "fp4"),
    ("llama-3.1-8b", "modelopt_fp4", "gb200", "fp4"),
    ("llama-3.1-8b", "nvfp4", "gb300", "fp4"),
    ("llama-3.1-8b", "nvfp4", "h100", "bf16"),  # FP4 Marlin, W4A16
    ("llama-3.1-8b", "nvfp4", "a100", "bf16"),
    ("llama-3.1-8b", "nvfp4", "mi355x", "bf16"),  # no NVFP4 on CDNA 4
    ("llama-3.1-8b", "mxfp4", "mi355x", "fp4"),
    ("llama-3.1-8b", "mxfp4", "b200", "fp4"),
    ("llama-3.1-8b", "mxfp4", "mi325x", "bf16"),
    ("llama-3.1-8b", "mxfp4", "h200", "bf16"),
    ("llama-3.1-8b-fp8", "auto", "b200", "fp8"),
    ("llama-3.1-8b-fp8", "auto", "mi325x", "fp8"),
    ("llama-3.1-8b", "int8", "b300", "int8"),
])
def test_gemm_dtype_per_gpu(model: str, quantization: str, gpu: str, gemm: str) -> None:
    assert resolve_quantization(get_model(model), quantization, get_gpu(gpu)).gemm_dtype == gemm


def test_fp8_on_ampere_says_why() -> None:
    fmt = resolve_quantization(get_model("llama-3.1-70b-fp8"), "auto", A100)
    assert any("no FP8 tensor cores" in note and "Marlin" in note for note in fmt.notes)
    # The bytes do not change: Marlin reads the same fp8 weights.
    assert fmt.weight_bytes == resolve_quantization(get_model("llama-3.1-70b-fp8"), "auto",
                                                    H100).weight_bytes


def test_int8_without_int8_tensor_cores_is_an_error() -> None:
    no_int8 = dataclasses.replace(H100, name="NoInt8", dense_int8_ops=0.0)
    with pytest.raises(KvplanError, match="needs int8 tensor cores, which NoInt8 does not have"):
        resolve_quantization(get_model("llama-3.1-8b"), "int8", no_int8)


@pytest.mark.parametrize(("model", "quantization", "message"), [
    ("deepseek-v3", "awq", "does not match DeepSeek-V3's checkpoint"),
    ("llama-3.1-8b-fp8", "gptq", "does not match"),
    ("gpt-oss-20b", "fp8", "does not match"),
    ("llama-3.1-8b", "quark", "needs a checkpoint quantized that way"),
    ("gpt-oss-20b", "nvfp4", "does not match"),
    ("deepseek-v3", "compressed-tensors", "does not match"),
    ("llama-3.1-8b", "fp9", "unknown quantization 'fp9' — did you mean 'fp8'"),
    ("llama-3.1-8b", "awk", "did you mean 'awq'"),
])
def test_bad_quantization_is_one_line(model: str, quantization: str, message: str) -> None:
    with pytest.raises(KvplanError, match=message) as err:
        resolve_quantization(get_model(model), quantization, H100)
    assert "\n" not in str(err.value)


def test_names_follow_vllm() -> None:
    # vLLM's own names (vllm/model_executor/layers/quantization/__init__.py) map to one format.
    assert {canonical_quantization(n) for n in ("awq", "awq_marlin", "AWQ")} == {"awq"}
    assert canonical_quantization("gptq_marlin") == "gptq"
    assert canonical_quantization("compressed-tensors") == "compressed-tensors"
    assert canonical_quantization("modelopt_fp4") == canonical_quantization("NVFP4") == "nvfp4"
    assert resolve_quantization(get_model("llama-3.1-8b-fp8"), "compressed-tensors",
                                H100).quantization == "fp8"


def test_capacity_gains_what_the_weights_lose() -> None:
    bf16 = kv_capacity(get_model("llama-3.1-8b"), H100)
    fp8 = kv_capacity(get_model("llama-3.1-8b-fp8"), H100)
    assert bf16.weight_bytes - fp8.weight_bytes == LLAMA8_LINEAR  # one byte saved per weight
    assert fp8.available_kv_bytes - bf16.available_kv_bytes == LLAMA8_LINEAR
    assert fp8.weight_format.gemm_dtype == "fp8"
    # 70B at TP 2 on A100s: bf16 weights do not fit, AWQ leaves room for KV.
    with pytest.raises(KvplanError, match="do not fit"):
        kv_capacity(get_model("llama-3.3-70b"), A100)
    awq = kv_capacity(get_model("llama-3.3-70b"), A100, tp=2, quantization="awq")
    assert awq.capacity_tokens > 300_000


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(list_models()),
       st.sampled_from(["fp8", "int8", "awq", "gptq", "nvfp4", "mxfp4"]))
def test_quantizing_never_adds_bytes(name: str, quantization: str) -> None:
    model = get_model(name)
    if model.quantization is not None:
        model = dataclasses.replace(model, quantization=None)
    plain = resolve_quantization(model, "none", H100)
    quantized = resolve_quantization(model, quantization, H100)
    assert quantized.weight_bytes <= plain.weight_bytes
    assert quantized.dense_weight_bytes <= plain.dense_weight_bytes
    assert quantized.expert_bytes <= plain.expert_bytes
    assert set(QUANTIZATIONS.values()) >= {quantized.quantization}


# -- wiring: scenario key -> deployment (sizing + roofline) -> run.json ---------------------------


def _scenario(**extra: object) -> Scenario:
    data = {"model": "llama-3.1-70b-fp8", "gpu": "a100", "tensor_parallel": 2,
            "max_model_len": 8192, "workload": {"trace": "bundled:azure-conv"}, **extra}
    return parse_scenario(data, "s.yaml")


def test_scenario_quantization_reaches_sizing_roofline_and_run_json(tmp_path: Path) -> None:
    deployment = build_deployment(_scenario(), tmp_path)
    info = deployment.describe()
    assert (info["quantization"], info["weight_dtype"], info["gemm_dtype"]) == (
        "fp8", "fp8_e4m3", "bf16")  # FP8 Marlin on the A100
    assert info["weight_gib_per_rank"] == pytest.approx(
        deployment.capacity.weight_format.weight_bytes / 2 / 2**30)
    assert any("FP8 Marlin" in note for note in info["notes"])
    assert deployment.latency.gemm_dtype == "bf16"  # type: ignore[attr-defined]
    none = build_deployment(_scenario(quantization="none"), tmp_path)
    assert none.describe()["gemm_dtype"] == "bf16"
    assert none.capacity.weight_bytes > deployment.capacity.weight_bytes


def test_scenario_rejects_an_unknown_quantization_with_a_suggestion() -> None:
    with pytest.raises(KvplanError) as err:
        _scenario(quantization="gptqq")
    message = str(err.value)
    assert message.startswith("s.yaml") and "did you mean 'gptq'" in message
    assert "\n" not in message
