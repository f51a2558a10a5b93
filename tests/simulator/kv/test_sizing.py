"""β (KV bytes per token) and vLLM-style KV capacity: the seed's worked numbers and properties."""

from __future__ import annotations

import math

import pytest

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.kv.sizing import (
    GIB,
    MIB,
    NON_TORCH_OVERHEAD_BYTES,
    activation_bytes,
    bytes_per_token,
    format_vllm_log,
    kv_capacity,
    kv_dtype_bytes,
    kv_layout,
    max_sequences,
    model_kv_layout,
)

# -- the seed chapter's worked numbers ----------------------------------------------------------


def test_llama2_13b_2048_tokens_is_1_56_gib() -> None:
    beta = bytes_per_token(get_model("llama-2-13b"))
    assert beta == 2 * 40 * 40 * 128 * 2 == 819_200
    assert beta / MIB == pytest.approx(0.78125)  # "~0.781 MiB/token"
    assert beta * 2048 / GIB == pytest.approx(1.5625)  # "~1.56 GiB"


def test_stack_100m_beta() -> None:
    assert bytes_per_token(get_model("stack-100m")) == 15_360


def test_seed_exercise_2() -> None:
    beta = kv_layout(32, 8, 128, dtype="fp16").bytes_per_token
    assert beta == 131_072
    assert beta / MIB == 0.125
    assert beta * 6000 / GIB == pytest.approx(0.732, abs=5e-4)
    assert max_sequences(40 * GIB, beta, 6000) == 54
    assert max_sequences(40 * GIB, beta, 6000, block_size=16) == 54  # 6000 = 375 whole blocks


def test_max_sequences_rounds_up_to_blocks() -> None:
    # 17 tokens need 2 blocks of 16: a 64-block pool holds 32 such sequences, not 60.
    assert max_sequences(64 * 16 * 100, 100, 17, block_size=16) == 32
    assert max_sequences(64 * 16 * 100, 100, 17) == 60


# -- dtypes, TP, MLA ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "size"), [("fp32", 4), ("float32", 4), ("fp16", 2),
                                            ("bf16", 2), ("bfloat16", 2), ("fp8", 1),
                                            ("fp8_e4m3", 1), ("fp8_e5m2", 1), ("int8", 1),
                                            ("FP8", 1)])
def test_kv_dtype_bytes(name: str, size: int) -> None:
    assert kv_dtype_bytes(name) == size


def test_unknown_kv_dtype_suggests() -> None:
    with pytest.raises(KvplanError, match="unknown KV cache dtype 'fp9' — did you mean 'fp8'"):
        kv_dtype_bytes("fp9")


def test_auto_is_the_models_torch_dtype() -> None:
    assert bytes_per_token(get_model("tiny")) == 2 * 2 * 2 * 32 * 4  # fp32
    assert model_kv_layout(get_model("llama-3.1-8b")).dtype == "bfloat16"


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-13b", "qwen2.5-7b", "deepseek-v3"])
def test_fp8_halves_beta(name: str) -> None:
    model = get_model(name)
    assert bytes_per_token(model, "fp8") * 2 == bytes_per_token(model, "auto")


@pytest.mark.parametrize(("tp", "beta"), [(1, 327_680), (2, 163_840), (4, 81_920), (8, 40_960)])
def test_tp_splits_kv_heads(tp: int, beta: int) -> None:
    layout = model_kv_layout(get_model("llama-3.1-70b"), tp=tp)
    assert layout.bytes_per_token == beta
    assert layout.num_kv_heads_per_rank == 8 // tp
    assert not layout.replicated and layout.notes == ()


@pytest.mark.parametrize("tp", [16, 32])
def test_tp_beyond_kv_heads_replicates(tp: int) -> None:
    layout = model_kv_layout(get_model("llama-3.1-8b"), tp=tp)
    assert layout.replicated
    assert layout.num_kv_heads_per_rank == 1
    assert layout.bytes_per_token == 2 * 32 * 1 * 128 * 2
    assert "replicated on" in layout.notes[0] and "1 KV head" in layout.notes[0]


def test_tp_that_fits_neither_way_is_an_error() -> None:
    with pytest.raises(KvplanError, match="--tp 3 does not divide"):
        kv_layout(32, 8, 128, tp=3)
    with pytest.raises(KvplanError, match="not a multiple"):
        kv_layout(32, 8, 128, tp=12)
    with pytest.raises(KvplanError, match="attention heads"):
        bytes_per_token(get_model("llama-3.1-8b"), tp=3)


def test_deepseek_v3_mla_beta_is_replicated_on_every_rank() -> None:
    model = get_model("deepseek-v3")
    assert bytes_per_token(model) == 61 * (512 + 64) * 2 == 70_272
    layout = model_kv_layout(model, tp=8)
    assert layout.bytes_per_token == 70_272
    assert layout.replicated and "MLA latent" in layout.notes[0]
    assert model_kv_layout(model).notes == ()


@pytest.mark.parametrize("dims", [(0, 8, 128), (32, 0, 128), (32, 8, -1)])
def test_non_positive_dimensions_are_errors(dims: tuple[int, int, int]) -> None:
    with pytest.raises(KvplanError, match="must be a positive integer"):
        kv_layout(*dims)


# -- capacity -----------------------------------------------------------------------------------


def test_llama31_8b_on_h100_capacity_terms() -> None:
    model = get_model("llama-3.1-8b")
    cap = kv_capacity(model, get_gpu("h100"))
    assert cap.weight_bytes == 8_030_261_248 * 2
    # 2·T·hidden·2 (residual) + T·3·14336·2 (SwiGLU, the largest buffer) with T = 8192
    assert cap.activation_bytes == 2 * 8192 * 4096 * 2 + 8192 * 3 * 14336 * 2
    # 0.9 of the total the driver reports (85,045,477,376 bytes = 79.20 GiB), not the 80 GiB name
    assert cap.budget_bytes == int(0.9 * 85_045_477_376) == 76_540_929_638
    assert cap.available_kv_bytes == (cap.budget_bytes - cap.weight_bytes - cap.activation_bytes
                                      - NON_TORCH_OVERHEAD_BYTES)
    assert cap.block_bytes == 16 * 131_072
    assert cap.num_blocks == cap.available_kv_bytes // cap.block_bytes
    assert cap.capacity_tokens == cap.num_blocks * 16
    # 76,540,929,638 − 16,060,522,496 − 838,860,800 − 536,870,912 = 59,104,675,430 bytes
    # -> 28,183 blocks of 2 MiB = 450,928 tokens; vLLM logs ~447k tokens (54.6 GiB) here: the
    # ~0.5 GiB left between them is in the terms vLLM measures (activations, non-torch memory).
    assert cap.available_kv_bytes == 59_104_675_430
    assert cap.num_blocks == 59_104_675_430 // (16 * 131_072) == 28_183
    assert 400_000 <= cap.capacity_tokens <= 500_000
    assert cap.max_model_len == 131_072
    assert cap.max_concurrency == pytest.approx(cap.capacity_tokens / 131_072)


def test_fp8_kv_doubles_the_blocks() -> None:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100")
    bf16, fp8 = kv_capacity(model, gpu), kv_capacity(model, gpu, kv_cache_dtype="fp8")
    assert fp8.available_kv_bytes == bf16.available_kv_bytes
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)


def test_capacity_properties() -> None:
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100")
    tp4, tp8 = kv_capacity(model, gpu, tp=4), kv_capacity(model, gpu, tp=8)
    assert tp8.capacity_tokens > tp4.capacity_tokens  # per rank: fewer weights and heads
    small = kv_capacity(model, gpu, tp=4, max_num_batched_tokens=2048)
    assert small.activation_bytes < tp4.activation_bytes
    assert small.num_blocks >= tp4.num_blocks
    b32 = kv_capacity(model, gpu, tp=4, block_size=32)
    assert abs(b32.capacity_tokens - tp4.capacity_tokens) < 32
    lower = kv_capacity(model, gpu, tp=4, gpu_memory_utilization=0.8)
    assert lower.num_blocks < tp4.num_blocks


def test_weights_that_do_not_fit() -> None:
    with pytest.raises(KvplanError) as err:
        kv_capacity(get_model("llama-3.1-70b"), get_gpu("h100"))
    assert str(err.value) == ("Llama-3.1-70B weights (131.4 GiB per rank) do not fit in"
                              " 0.90 × 79.20 GiB of H100-80GB; raise --tp")  # 85,045,477,376 B


def test_no_room_left_after_activations() -> None:
    with pytest.raises(KvplanError, match="no room for the KV cache"):
        kv_capacity(get_model("llama-3.1-8b"), get_gpu("l4"), max_num_batched_tokens=65536)


def test_max_model_len_beyond_capacity_is_noted() -> None:
    cap = kv_capacity(get_model("qwen2.5-7b"), get_gpu("l4"))
    assert cap.capacity_tokens < 131_072
    assert cap.max_concurrency < 1
    assert any("max_model_len" in note for note in cap.notes)
    assert kv_capacity(get_model("qwen2.5-7b"), get_gpu("l4"), max_model_len=8192).notes == ()


def test_deepseek_v3_fits_8_h200_with_its_fp8_weights() -> None:
    ds = get_model("deepseek-v3")
    cap = kv_capacity(ds, get_gpu("h200"), tp=8)
    # fp8 linears and experts (1 byte), bf16 embedding, lm_head, norms and routers (2 bytes).
    other = ds.num_params - ds.linear_body_params - 58 * 256 * ds.routed_expert_params
    assert cap.weight_bytes == math.ceil((ds.num_params + other) / 8)
    assert cap.weight_format.gemm_dtype == "fp8"
    assert cap.bytes_per_token == 70_272
    with pytest.raises(KvplanError, match="do not fit"):
        kv_capacity(ds, get_gpu("h200"), tp=8, quantization="none")


@pytest.mark.parametrize("kwargs", [{"block_size": 0}, {"gpu_memory_utilization": 0.0},
                                    {"gpu_memory_utilization": 1.5}, {"max_num_seqs": 0},
                                    {"max_model_len": -1}, {"tp": 0}])
def test_bad_capacity_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(KvplanError):
        kv_capacity(get_model("llama-3.1-8b"), get_gpu("h100"), **kwargs)  # type: ignore[arg-type]


def test_activation_estimate_takes_the_largest_buffer() -> None:
    model = get_model("llama-3.1-8b")
    # Few tokens, many sequences: the fp32 logits dominate.
    logits = 2 * 4096 * 128_256 * 4
    assert activation_bytes(model, max_num_batched_tokens=16, max_num_seqs=4096) == (
        2 * 16 * 4096 * 2 + logits)
    assert activation_bytes(model, tp=2) < activation_bytes(model)


def test_vllm_style_log() -> None:
    cap = kv_capacity(get_model("llama-3.1-8b"), get_gpu("h100"))
    log = format_vllm_log(cap).splitlines()
    assert f"Available KV cache memory: {cap.available_kv_bytes / GIB:.2f} GiB" in log
    # 28,183 blocks: test_llama31_8b_on_h100_capacity_terms's derivation
    assert f"GPU KV cache size: {cap.capacity_tokens:,} tokens (28,183 blocks of 16)" in log
    assert (f"Maximum concurrency for 131,072 tokens per request: {cap.max_concurrency:.2f}x"
            in log)
