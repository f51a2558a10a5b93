"""Model and GPU catalogs: parameter counts from shapes, lookups, config.json loading."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from simulator.errors import KvplanError
from simulator.kv.gpus import GPUSpec, get_gpu, list_gpus
from simulator.kv.models import get_model, list_models, load_model
from simulator.kv.sizing import bytes_per_token

GIB = 2**30

# -- parameter counts ---------------------------------------------------------------------------


def test_exact_llama_counts() -> None:
    # The counts transformers reports for these checkpoints.
    assert get_model("llama-2-7b").num_params == 6_738_415_616
    assert get_model("llama-3.1-8b").num_params == 8_030_261_248


@pytest.mark.parametrize(("name", "published", "rel"), [
    ("llama-2-7b", 6.74e9, 0.01), ("llama-2-13b", 13.0e9, 0.01), ("llama-2-70b", 68.98e9, 0.01),
    ("llama-3.1-8b", 8.03e9, 0.01), ("llama-3.1-70b", 70.6e9, 0.01), ("mistral-7b", 7.24e9, 0.01),
    ("qwen2.5-7b", 7.61e9, 0.01), ("qwen2.5-72b", 72.7e9, 0.01), ("opt-13b", 12.85e9, 0.01),
    ("deepseek-v3", 671e9, 0.03), ("stack-100m", 100e6, 0.05),
])
def test_param_counts_match_published(name: str, published: float, rel: float) -> None:
    assert get_model(name).num_params == pytest.approx(published, rel=rel)


def test_deepseek_v3_moe_and_mla() -> None:
    model = get_model("deepseek-v3")
    assert model.is_mla and model.is_moe
    assert model.num_active_params == pytest.approx(37e9, rel=0.03)
    assert model.num_moe_layers == 58
    assert model.routed_expert_params == 3 * 7168 * 2048
    assert model.num_params - model.num_active_params == 58 * (256 - 8) * 3 * 7168 * 2048
    assert model.quantization is not None and model.quantization.method == "fp8"


def test_dense_model_facts() -> None:
    model = get_model("llama-3.1-70b")
    assert (model.num_hidden_layers, model.num_attention_heads, model.num_key_value_heads,
            model.head_dim, model.hidden_size, model.intermediate_size, model.vocab_size) == (
        80, 64, 8, 128, 8192, 28672, 128256)
    assert not model.is_mla and not model.is_moe
    assert model.num_active_params == model.num_params
    assert model.quantization is None


@pytest.mark.parametrize(("name", "group"), [("llama-2-7b", 1), ("llama-2-70b", 8),
                                             ("llama-3.1-8b", 4), ("qwen2.5-7b", 7),
                                             ("stack-100m", 4), ("tiny", 2)])
def test_q_per_kv(name: str, group: int) -> None:
    assert get_model(name).q_per_kv == group


def test_tied_embeddings_count_once() -> None:
    stack = get_model("stack-100m")
    assert stack.tie_word_embeddings and stack.embedding_lookup_params == 0
    assert stack.num_params == stack.lm_head_params + stack.dense_body_params


def test_tiny_model_shape() -> None:
    tiny = get_model("tiny")
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.num_attention_heads,
            tiny.num_key_value_heads, tiny.head_dim, tiny.vocab_size, tiny.intermediate_size,
            tiny.torch_dtype) == (2, 128, 4, 2, 32, 512, 256, "float32")


# -- lookups ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-3.1-8b", "LLAMA-3.1-8B", "meta-llama/Llama-3.1-8B",
                                  "meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"])
def test_model_lookup_is_case_insensitive_and_takes_hf_ids(name: str) -> None:
    assert get_model(name).name == "Llama-3.1-8B"
    assert load_model(name).name == "Llama-3.1-8B"


def test_every_catalog_model_loads_by_name() -> None:
    for name in list_models():
        assert get_model(name).name == name
    assert len(list_models()) >= 12


def test_unknown_model_suggests() -> None:
    with pytest.raises(KvplanError, match="unknown model 'lama-2-7b' — did you mean 'llama-2-7b'"):
        get_model("lama-2-7b")


# -- config.json --------------------------------------------------------------------------------


def _write(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


LLAMA_8B_CONFIG = {
    "_name_or_path": "meta-llama/Llama-3.1-8B", "model_type": "llama",
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def test_config_json_matches_the_catalog(tmp_path: Path) -> None:
    loaded = load_model(_write(tmp_path, LLAMA_8B_CONFIG))
    catalog = get_model("llama-3.1-8b")
    assert loaded.head_dim == 128  # hidden_size / num_attention_heads
    assert loaded.num_params == catalog.num_params
    assert loaded.name == "meta-llama/Llama-3.1-8B"
    assert load_model(tmp_path).num_params == catalog.num_params  # a folder holding config.json


def test_opt_config_vocabulary(tmp_path: Path) -> None:
    opt = {"model_type": "opt", "num_hidden_layers": 40, "num_attention_heads": 40,
           "hidden_size": 5120, "ffn_dim": 20480, "vocab_size": 50272,
           "max_position_embeddings": 2048, "torch_dtype": "float16"}
    loaded = load_model(_write(tmp_path, opt))
    assert loaded.num_key_value_heads == 40 and loaded.intermediate_size == 20480
    assert loaded.tie_word_embeddings
    assert loaded.num_params == get_model("opt-13b").num_params


def test_deepseek_config_with_fp8_quantization(tmp_path: Path) -> None:
    ds = get_model("deepseek-v3")
    config = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
              "num_key_value_heads": 128, "hidden_size": 7168, "intermediate_size": 18432,
              "vocab_size": 129280, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
              "kv_lora_rank": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1536,
              "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256,
              "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
              "first_k_dense_replace": 3, "n_shared_experts": 1,
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
    loaded = load_model(_write(tmp_path, config))
    assert loaded.num_params == ds.num_params
    assert loaded.num_active_params == ds.num_active_params
    assert loaded.quantization == ds.quantization


def test_missing_field_names_field_and_file(tmp_path: Path) -> None:
    config = dict(LLAMA_8B_CONFIG)
    del config["num_hidden_layers"]
    path = _write(tmp_path, config)
    with pytest.raises(KvplanError, match=f"{path}: missing required field 'num_hidden_layers'"):
        load_model(path)
    del config["intermediate_size"]
    config["num_hidden_layers"] = 2
    with pytest.raises(KvplanError, match="'intermediate_size'"):
        load_model(_write(tmp_path, config))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_hidden_layers", "32", "must be a non-negative integer"),
    ("num_hidden_layers", 0, "must be a positive integer"),
    ("num_key_value_heads", 5, "not a multiple"),
    ("torch_dtype", "float12", "unknown torch_dtype"),
])
def test_bad_field_values(tmp_path: Path, key: str, value: object, message: str) -> None:
    path = _write(tmp_path, {**LLAMA_8B_CONFIG, key: value})
    with pytest.raises(KvplanError, match=message) as err:
        load_model(path)
    assert str(path) in str(err.value)


def test_zero_attention_heads_is_an_error_not_a_division_by_zero(tmp_path: Path) -> None:
    path = _write(tmp_path, {**LLAMA_8B_CONFIG, "num_attention_heads": 0})
    with pytest.raises(KvplanError, match="field 'num_attention_heads' must be a positive integer"):
        load_model(path)


def test_config_without_a_dtype_is_served_in_bfloat16_as_vllm_does(tmp_path: Path) -> None:
    # vLLM reads a missing torch_dtype as float32, and --dtype auto serves a float32 checkpoint
    # in bfloat16 on every GPU kvplan knows (vllm/config/model.py _resolve_auto_dtype).
    config = {k: v for k, v in LLAMA_8B_CONFIG.items() if k != "torch_dtype"}
    assert load_model(_write(tmp_path, config)).torch_dtype == "bfloat16"
    fp32 = load_model(_write(tmp_path, {**config, "torch_dtype": "float32"}))
    assert fp32.torch_dtype == "bfloat16"
    assert bytes_per_token(fp32) == bytes_per_token(get_model("llama-3.1-8b")) == 32 * 8 * 128 * 2 * 2
    assert load_model(_write(tmp_path, {**config, "torch_dtype": "float16"})).torch_dtype == "float16"


@pytest.mark.parametrize(("rope_scaling", "window"), [
    (None, 32_768),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768}, 131_072),
    ({"rope_type": "linear", "factor": 2.0}, 65_536),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 32_768),
])
def test_window_is_the_one_vllm_derives(tmp_path: Path, rope_scaling: object, window: int) -> None:
    config = {**LLAMA_8B_CONFIG, "max_position_embeddings": 32_768, "rope_scaling": rope_scaling}
    assert load_model(_write(tmp_path, config)).max_position_embeddings == window


def test_a_config_file_is_named_after_the_model(tmp_path: Path) -> None:
    unnamed = {k: v for k, v in LLAMA_8B_CONFIG.items() if k != "_name_or_path"}
    (tmp_path / "cfg").mkdir()
    assert load_model(_write(tmp_path / "cfg", unnamed, "llama-8b.json")).name == "llama-8b"
    (tmp_path / "Llama-3.1-8B").mkdir()
    assert load_model(_write(tmp_path / "Llama-3.1-8B", unnamed)).name == "Llama-3.1-8B"
    assert load_model(_write(tmp_path / "cfg", LLAMA_8B_CONFIG, "x.json")).name == "meta-llama/Llama-3.1-8B"


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "num_hidden_layers": 32,\n  oops\n}\n', encoding="utf-8")
    with pytest.raises(KvplanError, match=r"config.json:3: invalid JSON"):
        load_model(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(KvplanError, match="cannot read model config"):
        load_model(tmp_path / "nope.json")


# -- GPUs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("alias", "name"), [
    ("h100", "H100-80GB"), ("H100_80GB", "H100-80GB"), ("h200", "H200-141GB"),
    ("a100", "A100-80GB"), ("a100-40gb", "A100-40GB"), ("L4", "L4"), ("a10g", "A10G"),
    ("rtx4090", "RTX-4090"), ("4090", "RTX-4090"), ("mi300x", "MI300X"),
    ("b200", "B200-180GB"), ("B200-SXM", "B200-180GB"), ("dgx_b200", "B200-180GB"),
    ("b300", "B300-288GB"), ("hgx-b300", "B300-288GB"), ("gb200", "GB200"),
    ("GB200 NVL72", "GB200"), ("gb300", "GB300"), ("gb300-nvl72", "GB300"),
    ("mi325x", "MI325X"), ("Instinct MI355X", "MI355X"), ("mi355", "MI355X"),
])
def test_gpu_aliases(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name


def test_unknown_gpu_suggests() -> None:
    with pytest.raises(KvplanError, match="unknown GPU 'h1000' — did you mean 'H100-80GB'"):
        get_gpu("h1000")


def test_gpu_catalog_is_sane() -> None:
    assert len(list_gpus()) == 14
    for name in list_gpus():
        gpu: GPUSpec = get_gpu(name)
        assert gpu.hbm_bytes > 0 and gpu.hbm_bandwidth_bytes_s > 0 and gpu.dense_bf16_flops > 0
        assert gpu.dense_fp8_flops == 0 or gpu.dense_fp8_flops > gpu.dense_bf16_flops
        # FP4 tensor cores come with FP8 ones and a named block format, and run faster
        assert (gpu.dense_fp4_flops > 0) == bool(gpu.fp4_formats)
        assert gpu.dense_fp4_flops == 0 or gpu.dense_fp4_flops > gpu.dense_fp8_flops > 0
        assert set(gpu.fp4_formats) <= {"nvfp4", "mxfp4"}
        # 0 = no price cited (kvplan capacity leaves the cost empty unless --price gives one)
        assert gpu.pcie_bandwidth_bytes_s > 0 and gpu.price_usd_per_hour >= 0
        assert gpu.interconnect_bandwidth_bytes_s >= gpu.pcie_bandwidth_bytes_s
        assert gpu.gpus_per_node in (8, 72)
    h100 = get_gpu("h100")
    assert h100.hbm_bytes == 80 * GIB and h100.hbm_bandwidth_bytes_s == 3.35e12
    assert get_gpu("a100").dense_fp8_flops == 0  # Ampere has no fp8 tensor cores


def test_blackwell_and_instinct_entries() -> None:
    """The datasheet figures the new entries carry (sources in simulator/kv/gpus.py)."""
    b200, b300 = get_gpu("b200"), get_gpu("b300")
    gb200, gb300 = get_gpu("gb200"), get_gpu("gb300")
    mi325, mi355 = get_gpu("mi325x"), get_gpu("mi355x")
    # HGX B200's platform capacity (1,440 GB over 8 GPUs), not the package's 192 GB
    assert b200.hbm_bytes == 180 * GIB and gb200.hbm_bytes == 186 * GIB
    assert b300.hbm_bytes == gb300.hbm_bytes == mi355.hbm_bytes == 288 * GIB
    assert mi325.hbm_bytes == 256 * GIB
    # dense = half the "with sparsity" figure for BF16 and FP8 on every Blackwell part
    assert (b200.dense_bf16_flops, b200.dense_fp8_flops, b200.dense_fp4_flops) == (
        2250e12, 4500e12, 9000e12)
    assert (gb200.dense_bf16_flops, gb200.dense_fp8_flops, gb200.dense_fp4_flops) == (
        2500e12, 5000e12, 10000e12)
    assert (gb300.dense_fp4_flops, b300.dense_fp4_flops) == (15000e12, 13125e12)
    # Blackwell Ultra cut INT8 to a fraction of FP8
    assert b300.dense_int8_ops < b300.dense_fp8_flops / 10 and gb300.dense_int8_ops < 2e14
    for gpu in (b200, b300, gb200, gb300):
        assert gpu.fp4_formats == ("nvfp4", "mxfp4")
        assert gpu.interconnect_bandwidth_bytes_s == 900e9  # NVLink 5, 1.8 TB/s both ways
    assert mi355.fp4_formats == ("mxfp4",) and mi325.dense_fp4_flops == 0
    assert mi355.dense_fp4_flops == pytest.approx(2 * mi355.dense_fp8_flops, rel=1e-5)
    # NVL72: 72 GPUs in one NVLink domain; HGX and Instinct platforms: 8
    assert (gb200.gpus_per_node, gb300.gpus_per_node) == (72, 72)
    assert b200.gpus_per_node == b300.gpus_per_node == mi355.gpus_per_node == 8
    # the Grace-Blackwell host link (NVLink-C2C) is faster than PCIe 5.0
    assert gb200.pcie_bandwidth_bytes_s > b200.pcie_bandwidth_bytes_s == 64e9
    assert mi355.price_usd_per_hour == 0  # no price cited


def test_reported_memory_is_a_little_under_the_datasheet() -> None:
    """A driver's total (simulator/kv/gpus.py ``reported_bytes``) is the datasheet's GiB less what
    the firmware and ECC keep, and the datasheet's GB read as GiB: within 0–10% under it (an L4's
    21.96 GiB against 24, B300's nvidia-smi total 7% under its 288 GiB, an H100-80GB's 1%); the
    sizing takes it where one is cited."""
    cited = 0
    for name in list_gpus():
        gpu = get_gpu(name)
        if gpu.reported_bytes:
            cited += 1
            assert 0.90 * gpu.hbm_bytes < gpu.reported_bytes <= gpu.hbm_bytes, name
        assert gpu.total_memory_bytes == (gpu.reported_bytes or gpu.hbm_bytes)
    assert cited >= 10
    assert get_gpu("H100-80GB").total_memory_bytes == 85_045_477_376  # deviceQuery, 81,106 MiB
