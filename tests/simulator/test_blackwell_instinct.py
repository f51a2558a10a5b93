"""The Blackwell and Instinct GPUs end to end: ``kvplan size`` of MXFP4 and NVFP4 checkpoints on
B200 and H100 (weight bytes and GEMM dtype derived by hand), and ``kvplan simulate`` with the
roofline on every new GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.kv.gpus import get_gpu

GIB = 2**30

# gpt-oss-120b (huggingface.co/openai/gpt-oss-120b config.json): 36 layers, hidden 2880, 64 query
# heads and 8 KV heads of 64 with biases, 128 experts of 2880 (gate, up, down), untied vocab
# 201088, one attention sink per head. Only the experts' matrices are MXFP4.
L, H, V, E = 36, 2880, 201088, 128
OSS_EXPERT_MATRICES = L * E * 3 * H * H
OSS_EXPERT_BIASES = L * E * 3 * H  # gate_up and down biases, bf16
OSS_BF16 = (L * (H * 4096 + 4096 + 2 * (H * 512 + 512) + 4096 * H + H)  # q, k, v, o (+ biases)
            + L * (H * E + E)  # routers
            + L * 2 * H + H  # norms
            + 2 * V * H  # embedding and lm_head
            + L * 64)  # sinks
OSS_WEIGHT_BYTES = (OSS_EXPERT_MATRICES * (4 + 8 / 32) + (OSS_EXPERT_BIASES + OSS_BF16) * 16) / 8

# A ModelOpt NVFP4 export of Llama-3.1-8B (config.json, trimmed): every Linear but the lm_head.
LLAMA8_NVFP4 = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                            "ignore": ["lm_head"]}}
LLAMA8_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
LLAMA8_BF16 = 2 * 128256 * 4096 + 2 * 32 * 4096 + 4096  # embedding, lm_head, norms
# 4-bit E2M1 values and one FP8 E4M3 scale per 16: 4.5 bits per linear weight
LLAMA8_NVFP4_BYTES = LLAMA8_LINEAR // 2 + LLAMA8_LINEAR // 16 + 2 * LLAMA8_BF16


def size_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    assert main(["size", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("gpu", ["b200", "h100"])
def test_size_gpt_oss_120b(capsys: pytest.CaptureFixture[str], gpu: str) -> None:
    out = size_json(capsys, "--model", "gpt-oss-120b", "--gpu", gpu)
    assert OSS_EXPERT_MATRICES + OSS_EXPERT_BIASES + OSS_BF16 == 116_829_156_672
    assert out["weight_bytes"] == OSS_WEIGHT_BYTES == 65_248_815_744
    assert out["expert_weight_bytes"] == (OSS_EXPERT_MATRICES * 4.25 + OSS_EXPERT_BIASES * 16) / 8
    # weight-only on both: vLLM's MXFP4 MoE takes bf16 activations on Blackwell as on Hopper
    assert out["weights"]["gemm_dtype"] == "bf16"
    assert (out["weights"]["expert_bits"], out["weights"]["linear_bits"]) == (4.25, 16.0)
    spec = get_gpu(gpu)
    total = spec.total_memory_bytes  # the driver's total, what vLLM takes 0.9 of
    assert out["budget_bytes"] == int(0.9 * total)
    assert out["available_kv_bytes"] == (out["budget_bytes"] - out["weight_bytes"]
                                         - out["activation_bytes"] - out["non_torch_bytes"])
    if gpu == "b200":
        # 182,642 MiB (178.36 GiB) reported of the 180 GiB the datasheet gives
        assert (spec.hbm_bytes, total) == (180 * GIB, 182_642 * 2**20)
        assert any("weight-only on B200-180GB too" in note for note in out["notes"])
    else:
        assert (spec.hbm_bytes, total) == (80 * GIB, 85_045_477_376)


@pytest.mark.parametrize(("gpu", "gemm"), [("b200", "fp4"), ("h100", "bf16")])
def test_size_nvfp4_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path, gpu: str,
                               gemm: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA8_NVFP4))
    out = size_json(capsys, "--model", str(config), "--gpu", gpu)
    assert out["weight_bytes"] == LLAMA8_NVFP4_BYTES == 6_027_747_328
    assert (out["weights"]["quantization"], out["weights"]["weight_dtype"]) == ("nvfp4", "nvfp4")
    assert (out["weights"]["gemm_dtype"], out["weights"]["linear_bits"]) == (gemm, 4.5)
    if gemm == "bf16":  # Hopper: FP4 Marlin, weight-only
        assert any("no NVFP4 tensor cores" in note for note in out["notes"])


SCENARIO = """\
name: {gpu}
seed: 7
model: llama-3.1-8b
gpu: {gpu}
quantization: {quantization}
allocators: [paged]
max_model_len: 4096
latency: {{model: roofline}}
workload:
  num_requests: 40
  arrival: {{process: poisson, rate: 20}}
  prompt_tokens: {{dist: lognormal, mean: 400, p99: 2000, max: 3000}}
  output_tokens: {{dist: lognormal, mean: 50, p99: 200, max: 300}}
"""


@pytest.mark.parametrize(("gpu", "quantization", "gemm", "peak"), [
    ("b200", "nvfp4", "fp4", "dense_fp4_flops"),
    ("b300", "nvfp4", "fp4", "dense_fp4_flops"),
    ("gb200", "nvfp4", "fp4", "dense_fp4_flops"),
    ("gb300", "mxfp4", "fp4", "dense_fp4_flops"),
    ("mi325x", "fp8", "fp8", "dense_fp8_flops"),
    ("mi355x", "mxfp4", "fp4", "dense_fp4_flops"),
])
def test_simulate_on_each_new_gpu(tmp_path: Path, gpu: str, quantization: str, gemm: str,
                                  peak: str) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO.format(gpu=gpu, quantization=quantization))
    out = tmp_path / "out"
    assert main(["simulate", str(scenario), "--out", str(out), "--quiet"]) == 0
    deployment = json.loads((out / "run.json").read_text())["deployment"]
    spec = get_gpu(gpu)
    assert (deployment["gpu"], deployment["gemm_dtype"]) == (spec.name, gemm)
    latency = deployment["latency_model"]
    assert latency["latency_model"] == "roofline" and latency["peak_flops"] == getattr(spec, peak)
    summary = json.loads((out / "summary.json").read_text())["paged"]
    assert summary["completed"] == 40 and summary["ttft_s"]["p50"] > 0
