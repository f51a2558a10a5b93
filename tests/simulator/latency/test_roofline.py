"""Roofline step latency: analytic anchors (weights / bandwidth), monotonicity, TP and fp8."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.kv.quantization import resolve_quantization
from simulator.latency.constants import RooflineConstants, default_constants, read_fit
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import PrefillChunk, StepPlan

LLAMA = get_model("llama-3.1-8b")
H100 = get_gpu("h100")
# Round constants for analytic anchors (the shipped defaults are fitted and change with the data).
HAND = RooflineConstants(mem_efficiency=0.8, flops_efficiency=0.6, fp8_flops_efficiency=0.6,
                         moe_flops_efficiency=0.6, step_overhead_s=0.003, prefill_overhead_s=0.0,
                         allreduce_latency_s=0.0)


def decode(num_seqs: int, context_tokens: int, **extra: object) -> StepPlan:
    """``num_seqs`` decoding sequences of ``context_tokens`` each."""
    return StepPlan(step_id=0, prefills=(), num_decode_seqs=num_seqs,
                    decode_context_tokens=num_seqs * context_tokens,
                    decode_context_sq=float(num_seqs * context_tokens**2),
                    decode_max_context=context_tokens if num_seqs else 0, **extra)  # type: ignore[arg-type]


def prefill(num_tokens: int, num_computed_tokens: int = 0) -> StepPlan:
    chunk = PrefillChunk(seq_id=1, num_tokens=num_tokens, num_computed_tokens=num_computed_tokens,
                         samples_token=True)
    return StepPlan(step_id=0, prefills=(chunk,), num_decode_seqs=0, decode_context_tokens=0,
                    decode_context_sq=0.0, decode_max_context=0)


def test_decode_batch_1_is_weights_over_bandwidth() -> None:
    model = RooflineLatency(LLAMA, H100, constants=HAND)
    cost = model.step_cost(decode(1, 1))
    # The embedding table is gathered, not streamed: weights read = everything but it.
    assert cost.weight_bytes == 2 * (LLAMA.num_params - 128_256 * 4096)
    assert not cost.compute_bound
    expected = cost.bytes_moved / (3.35e12 * 0.8) + 0.003
    assert model.step_latency_s(decode(1, 1)) == pytest.approx(expected)
    assert 8e-3 < expected < 10e-3  # ≈ 16 GB / (3.35 TB/s × 0.8) + 3 ms


def test_prefill_of_4096_tokens_is_compute_bound() -> None:
    cost = RooflineLatency(LLAMA, H100).step_cost(prefill(4096))
    assert cost.compute_bound
    assert cost.compute_s > 10 * cost.memory_s


def test_flops_formula_on_tiny() -> None:
    tiny = get_model("tiny")
    model = RooflineLatency(tiny, H100)
    plan = prefill(10, num_computed_tokens=6)
    pairs = 10 * 6 + 10 * 11 // 2
    body = tiny.dense_body_params
    expected = 2 * body * 10 + 2 * tiny.lm_head_params * 1 + 4 * pairs * 4 * 32 * 2
    assert model.step_cost(plan).flops == expected
    assert model.peak_flops == H100.dense_bf16_flops / 2  # fp32 runs as TF32


@pytest.mark.parametrize("context", [128, 4096])
def test_monotonic_in_batch(context: int) -> None:
    model = RooflineLatency(LLAMA, H100)
    times = [model.step_latency_s(decode(b, context)) for b in (1, 2, 8, 32, 128, 512)]
    assert times == sorted(times) and times[-1] > times[0]


def test_monotonic_in_context() -> None:
    model = RooflineLatency(LLAMA, H100)
    times = [model.step_latency_s(decode(64, c)) for c in (16, 256, 2048, 16384, 131072)]
    assert times == sorted(times) and times[-1] > times[0]
    prefill_times = [model.step_latency_s(prefill(512, c)) for c in (0, 1024, 8192)]
    assert prefill_times == sorted(prefill_times)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 256), st.integers(1, 8192), st.integers(0, 2048), st.integers(0, 4096))
def test_more_work_never_takes_less_time(seqs: int, context: int, chunk: int, done: int) -> None:
    model = RooflineLatency(LLAMA, H100)
    chunks = (PrefillChunk(7, chunk, done, False),) if chunk else ()
    base = StepPlan(0, chunks, seqs, seqs * context, float(seqs * context**2), context)
    more = StepPlan(0, chunks, seqs + 1, (seqs + 1) * context,
                    float((seqs + 1) * context**2), context)
    assert model.step_latency_s(more) >= model.step_latency_s(base) > 0


def test_tp2_halves_the_memory_term() -> None:
    plan = decode(16, 2048)
    one = RooflineLatency(LLAMA, H100, constants=HAND).step_cost(plan)
    two = RooflineLatency(LLAMA, H100, tp=2, constants=HAND).step_cost(plan)
    assert two.memory_s == pytest.approx(one.memory_s / 2)
    assert two.compute_s == pytest.approx(one.compute_s / 2)
    # two all-reduces per layer of 16 tokens × 4096 × 2 bytes, ring factor 2(2-1)/2 = 1
    assert two.allreduce_s == pytest.approx(2 * 32 * (16 * 4096 * 2) / H100.interconnect_bandwidth_bytes_s)
    assert one.allreduce_s == 0
    # ... plus a fixed latency per call: 2 per layer, whatever the batch
    slow = RooflineLatency(LLAMA, H100, tp=2, constants=HAND, allreduce_latency_s=25e-6)
    assert slow.step_cost(plan).allreduce_s - two.allreduce_s == pytest.approx(2 * 32 * 25e-6)


def test_fp8_kv_reduces_the_kv_term() -> None:
    plan = decode(64, 8192)
    bf16 = RooflineLatency(LLAMA, H100).step_cost(plan)
    fp8 = RooflineLatency(LLAMA, H100, kv_cache_dtype="fp8").step_cost(plan)
    assert fp8.kv_read_bytes == bf16.kv_read_bytes / 2
    assert fp8.kv_write_bytes == bf16.kv_write_bytes / 2
    assert fp8.weight_bytes == bf16.weight_bytes
    assert fp8.memory_s < bf16.memory_s


def test_empty_plan_costs_nothing() -> None:
    assert RooflineLatency(LLAMA, H100).step_latency_s(decode(0, 0)) == 0.0


def test_swaps_and_copies_cost_block_transfers() -> None:
    model = RooflineLatency(LLAMA, H100, constants=HAND)
    block_bytes = 16 * 131_072
    base = model.step_latency_s(decode(4, 100))
    swapped = model.step_latency_s(decode(4, 100, num_swap_out_blocks=6, num_swap_in_blocks=4))
    assert swapped - base == pytest.approx(10 * block_bytes / H100.pcie_bandwidth_bytes_s)
    copied = model.step_latency_s(decode(4, 100, cow_copies=((1, 2), (3, 4))))
    assert copied - base == pytest.approx(2 * 2 * block_bytes / (3.35e12 * 0.8))
    only_swap = model.step_latency_s(decode(0, 0, num_swap_out_blocks=1))
    assert only_swap == pytest.approx(block_bytes / H100.pcie_bandwidth_bytes_s)


def test_moe_reads_only_the_experts_it_routes_to() -> None:
    ds = get_model("deepseek-v3")
    model = RooflineLatency(ds, get_gpu("h200"), tp=8)
    one = model.step_cost(decode(1, 1000))
    expert_bytes = ds.routed_expert_params * 1 / 8  # fp8 weights, 8 ranks
    # fp8 linears (1 byte); norms, routers and the lm_head stay bf16 (2 bytes)
    bf16_params = ds.dense_body_params - ds.linear_body_params + ds.lm_head_params
    dense_bytes = (ds.linear_body_params + 2 * bf16_params) / 8
    assert one.weight_bytes == pytest.approx(dense_bytes + 58 * 8 * expert_bytes)
    many = model.step_cost(decode(512, 1000))
    assert many.weight_bytes > one.weight_bytes
    assert many.weight_bytes <= dense_bytes + 58 * 256 * expert_bytes
    assert model.peak_flops == get_gpu("h200").dense_fp8_flops


def test_fp8_weights_need_fp8_tensor_cores() -> None:
    fp8 = RooflineLatency(LLAMA, H100, quantization="fp8")
    assert (fp8.gemm_dtype, fp8.peak_flops) == ("fp8", H100.dense_fp8_flops)
    a100 = get_gpu("a100")
    marlin = RooflineLatency(LLAMA, a100, quantization="fp8")  # FP8 Marlin: W8A16
    assert (marlin.gemm_dtype, marlin.peak_flops) == ("bf16", a100.dense_bf16_flops)
    assert marlin.step_cost(decode(1, 1)).weight_bytes == fp8.step_cost(decode(1, 1)).weight_bytes


def test_describe_is_json() -> None:
    info = RooflineLatency(LLAMA, H100, tp=2).describe()
    json.dumps(info)
    assert info["latency_model"] == "roofline" and info["tp"] == 2
    assert info["bytes_per_token"] == 65_536
    assert info["constants_from"] == "fitted defaults" and info["fit"]
    fitted = default_constants(H100)
    assert info["mem_efficiency"] == fitted.mem_efficiency
    given = RooflineLatency(LLAMA, H100, constants=HAND, step_overhead_s=0.01).describe()
    assert given["constants_from"] == "given" and given["step_overhead_s"] == 0.01


def test_the_defaults_are_the_fit_and_every_constant_can_be_overridden() -> None:
    fit = read_fit()
    assert default_constants(H100).mem_efficiency == fit["constants"]["mem_efficiency"]
    assert default_constants(H100).allreduce_latency_s == fit["allreduce_latency_s"]["fabric"]
    model = RooflineLatency(LLAMA, H100, mem_efficiency=0.5, fp8_flops_efficiency=0.3)
    assert model.constants.mem_efficiency == 0.5 and model.constants.fp8_flops_efficiency == 0.3
    assert model.constants.step_overhead_s == fit["constants"]["step_overhead_s"]


def test_fp8_gemms_and_expert_gemms_have_their_own_efficiency() -> None:
    plan = prefill(4096)
    bf16 = RooflineLatency(LLAMA, H100, constants=HAND).step_cost(plan)
    fp8 = RooflineLatency(LLAMA, H100, quantization="fp8", constants=HAND,
                          fp8_flops_efficiency=0.3).step_cost(plan)
    # (about) twice the peak at half the share: the GEMM time is unchanged, attention (16-bit) too
    assert fp8.compute_s == pytest.approx(bf16.compute_s, rel=1e-3)  # 1978.9 vs 2 × 989.4 TFLOPS
    mixtral = get_model("mixtral-8x7b")
    fast = RooflineLatency(mixtral, H100, tp=2, constants=HAND).step_cost(plan)
    slow = RooflineLatency(mixtral, H100, tp=2, constants=HAND, moe_flops_efficiency=0.3).step_cost(plan)
    expert_s = fast.expert_flops / (H100.dense_bf16_flops * 0.6)
    assert slow.compute_s - fast.compute_s == pytest.approx(expert_s)
    assert LLAMA.num_moe_layers == 0 and bf16.expert_flops == 0


def test_prefill_overhead_only_on_steps_that_prefill() -> None:
    model = RooflineLatency(LLAMA, H100, constants=HAND, prefill_overhead_s=0.002)
    assert model.step_cost(prefill(100)).overhead_s == pytest.approx(0.005)
    assert model.step_cost(decode(8, 100)).overhead_s == pytest.approx(0.003)


@pytest.mark.parametrize("kwargs", [{"mem_efficiency": 0.0}, {"flops_efficiency": 1.5},
                                    {"step_overhead_s": -1.0}, {"tp": 3}, {"block_size": 0},
                                    {"kv_cache_dtype": "fp9"}, {"quantization": "fp7"}])
def test_bad_parameters(kwargs: dict[str, object]) -> None:
    with pytest.raises(KvplanError):
        RooflineLatency(LLAMA, H100, **kwargs)  # type: ignore[arg-type]


def test_fast_path_equals_the_full_formula():
    """step_latency_s has inlined paths for decode steps and for steps with prefill chunks
    (dense model, TP 1, no copies or swaps); they must give exactly step_cost().total_s."""
    import random

    from simulator.kv.gpus import get_gpu
    from simulator.kv.models import get_model
    from simulator.latency.roofline import RooflineLatency
    from simulator.scheduler.plan import PrefillChunk, StepPlan

    rng = random.Random(0)
    for model in ("llama-3.1-8b", "qwen2.5-7b", "tiny", "llama-2-7b"):
        for gpu in ("h100-80gb", "a100-80gb"):
            lat = RooflineLatency(get_model(model), get_gpu(gpu))
            for _ in range(200):
                n = rng.randint(0, 512)
                ctx = n * rng.randint(1, 8000)
                chunks = tuple(PrefillChunk(s, rng.randint(1, 8192), rng.choice((0, rng.randint(1, 30000))),
                                            rng.random() < 0.5) for s in range(rng.choice((0, 1, 1, 2, 5))))
                if not n and not chunks:
                    continue
                plan = StepPlan(0, chunks, n, ctx, float(ctx * ctx), ctx)
                assert lat.step_latency_s(plan) == lat.step_cost(plan).total_s, plan


# -- quantized weights: bytes streamed and the tensor cores the GEMMs use ------------------------


@pytest.mark.parametrize(("model", "quantization", "gpu", "gemm", "peak_field"), [
    ("llama-3.1-8b-fp8", "auto", "h100", "fp8", "dense_fp8_flops"),
    ("llama-3.1-8b-fp8", "auto", "a100", "bf16", "dense_bf16_flops"),
    ("llama-3.1-8b", "int8", "a100", "int8", "dense_int8_ops"),
    ("llama-3.1-8b", "awq", "h100", "bf16", "dense_bf16_flops"),
    ("gpt-oss-20b", "auto", "h100", "bf16", "dense_bf16_flops"),
    ("gpt-oss-20b", "auto", "b200", "bf16", "dense_bf16_flops"),  # MXFP4 MoE, bf16 activations
    ("llama-3.1-8b", "nvfp4", "b200", "fp4", "dense_fp4_flops"),
    ("llama-3.1-8b", "nvfp4", "gb300", "fp4", "dense_fp4_flops"),
    ("llama-3.1-8b", "nvfp4", "h100", "bf16", "dense_bf16_flops"),  # FP4 Marlin, W4A16
    ("llama-3.1-8b", "mxfp4", "mi355x", "fp4", "dense_fp4_flops"),
    ("llama-3.1-8b", "mxfp4", "mi325x", "bf16", "dense_bf16_flops"),
])
def test_gemm_dtype_picks_the_peak(model: str, quantization: str, gpu: str, gemm: str,
                                   peak_field: str) -> None:
    device = get_gpu(gpu)
    lat = RooflineLatency(get_model(model), device, quantization=quantization)
    assert lat.gemm_dtype == gemm
    assert lat.peak_flops == getattr(device, peak_field)


def test_awq_streams_its_packed_weights() -> None:
    fmt = resolve_quantization(LLAMA, "awq", H100)
    lat = RooflineLatency(LLAMA, H100, quantization="awq", tp=2)
    assert lat.step_cost(decode(1, 1)).weight_bytes == fmt.dense_weight_bytes / 2
    bf16 = RooflineLatency(LLAMA, H100, tp=2).step_cost(decode(1, 1)).weight_bytes
    assert lat.step_cost(decode(1, 1)).weight_bytes < 0.4 * bf16  # 4.16 of 16 bits on linears
    # The format resolved once (as the deployment passes it) gives the same roofline.
    assert RooflineLatency(LLAMA, H100, quantization=fmt, tp=2).step_cost(
        decode(1, 1)).weight_bytes == lat.step_cost(decode(1, 1)).weight_bytes


def test_mxfp4_experts_stream_at_4_25_bits() -> None:
    oss = get_model("gpt-oss-120b")
    lat = RooflineLatency(oss, H100)
    matrices = 3 * 2880 * 2880
    bias = oss.routed_expert_bias_params
    assert lat.step_cost(decode(1, 1)).weight_bytes == pytest.approx(
        lat.weight_format.dense_weight_bytes + 36 * 4 * (matrices * 4.25 + bias * 16) / 8, rel=1e-9)


def test_fp4_gemms_run_on_the_fp4_peak_at_the_fp8_efficiency() -> None:
    b200 = get_gpu("b200")
    plan = prefill(4096)
    # roofline_fit.json has no FP4 constant: W4A4 GEMMs take fp8_flops_efficiency
    fp4 = RooflineLatency(LLAMA, b200, quantization="nvfp4", constants=HAND,
                          fp8_flops_efficiency=0.3)
    fp8 = RooflineLatency(LLAMA, b200, quantization="fp8", constants=HAND,
                          fp8_flops_efficiency=0.3)
    assert fp4.rates.gemm_8bit and fp4.peak_flops == 9000e12 == b200.dense_fp4_flops
    c4, c8 = fp4.step_cost(plan), fp8.step_cost(plan)
    assert c4.gemm_flops == c8.gemm_flops and c4.attention_flops == c8.attention_flops
    # the same attention on the 16-bit peak; the GEMMs at half the FP8 time
    assert c8.compute_s - c4.compute_s == pytest.approx(
        c4.gemm_flops / (4500e12 * 0.3) - c4.gemm_flops / (9000e12 * 0.3), rel=1e-9)
    # 4.5 bits per linear weight streamed, and the fast path agrees with the full formula
    assert fp4.step_cost(decode(1, 1)).weight_bytes == fp4.weight_format.dense_weight_bytes
    for p in (plan, decode(8, 500)):
        assert fp4.step_latency_s(p) == fp4.step_cost(p).total_s


def test_nvl72_keeps_an_expert_parallel_all_to_all_on_nvlink() -> None:
    from simulator.kv.expert_parallel import ExpertRouting, ParallelLayout, remote_ranks_per_token

    ds = get_model("deepseek-v3")
    layout = ParallelLayout(1, 16, True)  # EP 16: two HGX boards, or 16 GPUs of one NVL72 rack
    on8, off8 = remote_ranks_per_token(ds, layout, ExpertRouting(), 8)
    on72, off72 = remote_ranks_per_token(ds, layout, ExpertRouting(), 72)
    assert off8 > 0 and off72 == 0 and on72 == pytest.approx(on8 + off8)
    token_bytes, calls, tokens = ds.hidden_size * 2, 2 * ds.num_moe_layers, 4
    costs = {}
    for name in ("b200", "gb200"):
        gpu = get_gpu(name)
        lat = RooflineLatency(ds, gpu, dp=16, enable_expert_parallel=True,
                              alltoall_latency_s=0.0, constants=HAND)
        costs[name] = lat.step_cost(decode(tokens, 100)).alltoall_s
    assert costs["gb200"] == pytest.approx(calls * tokens * token_bytes * on72 / 900e9)
    assert costs["b200"] == pytest.approx(calls * tokens * token_bytes * max(on8 / 900e9,
                                                                              off8 / 50e9))
    assert costs["b200"] > 5 * costs["gb200"]  # the second board is reached at 50 GB/s
