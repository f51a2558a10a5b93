"""Data-parallel attention and expert parallelism: weights and KV per rank, by hand.

DeepSeek-V3 (FP8 checkpoint): 58 MoE layers (61 − first_k_dense_replace 3) of 256 routed experts
of 3 × 7168 × 2048 = 44,040,192 fp8 bytes each; MLA caches 512 + 64 = 576 bf16 values per token
per layer, 61 × 576 × 2 = 70,272 B, on every rank. Qwen3-235B-A22B (bf16): 94 MoE layers of 128
experts of 3 × 4096 × 1536 × 2 = 37,748,736 B; 4 KV heads of 128.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulator.config.deployment import build_deployment
from simulator.errors import KvplanError
from simulator.kv.expert_parallel import ExpertRouting, ParallelLayout
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.kv.sizing import GIB, MIB, NON_TORCH_OVERHEAD_BYTES, kv_capacity
from simulator.config.scenario import load_scenario, parse_scenario
from simulator.commands.size import add_parser, run

H200 = get_gpu("h200")
DSV3 = get_model("DeepSeek-V3")
QWEN235 = get_model("Qwen3-235B-A22B")

DS_EXPERT = 3 * 7168 * 2048  # bytes (fp8)
DS_WEIGHTS = 672_987_199_488  # the whole checkpoint (simulator/kv/quantization.py)
DS_ROUTED = 58 * 256 * DS_EXPERT
DS_DENSE = DS_WEIGHTS - DS_ROUTED  # attention, dense MLPs, shared experts, embeddings, lm_head
DS_BETA = 61 * (512 + 64) * 2

QW_EXPERT = 3 * 4096 * 1536 * 2
QW_WEIGHTS = 470_187_269_120
QW_DENSE = QW_WEIGHTS - 94 * 128 * QW_EXPERT

# 0.9 of the 143,156 MiB (139.80 GiB) an H200 reports (H200.total_memory_bytes), not 141 GiB
BUDGET = int(0.9 * 143_156 * MIB)


def _ds(tp: int, dp: int, ep: bool = True):
    return kv_capacity(DSV3, H200, tp=tp, dp=dp, enable_expert_parallel=ep, max_model_len=8192)


def test_hand_constants_match_the_catalog() -> None:
    assert DS_ROUTED == 653_908_770_816 and DS_DENSE == 19_078_428_672
    assert _ds(8, 1, ep=False).weight_format.weight_bytes == DS_WEIGHTS
    assert DSV3.num_moe_layers == 58 and QWEN235.num_moe_layers == 94


@pytest.mark.parametrize(("tp", "dp", "experts", "weights"), [
    (1, 8, 32, DS_DENSE + 58 * 32 * DS_EXPERT),           # EP 8: 100,817,025,024 B
    (1, 16, 16, DS_DENSE + 58 * 16 * DS_EXPERT),          # EP 16: 59,947,726,848 B
    (1, 32, 8, DS_DENSE + 58 * 8 * DS_EXPERT),            # EP 32: 39,513,077,760 B
    (8, 1, 32, DS_DENSE // 8 + 58 * 32 * DS_EXPERT),      # EP 8 inside one TP-8 engine
    (2, 8, 16, DS_DENSE // 2 + 58 * 16 * DS_EXPERT),      # EP 16 over 8 engines of TP 2
])
def test_deepseek_weights_per_rank(tp: int, dp: int, experts: int, weights: int) -> None:
    cap = _ds(tp, dp)
    assert (cap.ep, cap.experts_per_rank) == (tp * dp, experts)
    assert cap.expert_weight_bytes == 58 * experts * DS_EXPERT
    assert cap.weight_bytes == weights


def test_deepseek_weights_without_ep_are_sharded_by_tp() -> None:
    cap = _ds(8, 1, ep=False)
    assert cap.ep == 1 and cap.weight_bytes == DS_WEIGHTS // 8 == 84_123_399_936
    # the same bytes per rank as EP 8 inside the TP group: 256 experts / 8 = 32 whole ones
    assert cap.weight_bytes == _ds(8, 1).weight_bytes


def test_deepseek_kv_per_rank_dp8_ep8() -> None:
    """Each DP rank holds its own requests' latents: β of one whole latent, the pool per rank."""
    cap = _ds(1, 8)
    # activations: 8192 tokens × 8 experts × (3 × 2048 + 7168) × 2 B (whole experts under EP)
    # beats the dense MLP (8192 × 3 × 18432 × 2) and attention; plus 2 × 8192 × 7168 × 2
    activations = 8192 * 8 * (3 * 2048 + 7168) * 2 + 2 * 8192 * 7168 * 2
    assert cap.activation_bytes == activations == 1_979_711_488
    available = BUDGET - cap.weight_bytes - activations - NON_TORCH_OVERHEAD_BYTES
    assert cap.bytes_per_token == DS_BETA == 70_272
    assert cap.available_kv_bytes == available
    # 135,098,951,270 − 100,817,025,024 − 1,979,711,488 − 536,870,912 = 31,765,343,846 B
    assert available == 31_765_343_846
    assert cap.num_blocks == available // (16 * DS_BETA) == 28_252
    assert cap.max_concurrency == pytest.approx(28_252 * 16 / 8192)
    assert cap.total_concurrency == pytest.approx(8 * 28_252 * 16 / 8192)  # 441.4 requests


def test_deepseek_tp8_replicates_the_latent() -> None:
    """TP 8 keeps the same 70,272 B per token on each of the 8 ranks: one pool for 8 GPUs."""
    tp8, dp8 = _ds(8, 1, ep=False), _ds(1, 8)
    assert tp8.bytes_per_token == DS_BETA and tp8.dp == 1
    assert tp8.total_concurrency == tp8.max_concurrency
    assert dp8.total_concurrency > 5 * tp8.total_concurrency


@pytest.mark.parametrize(("tp", "dp", "beta", "weights"), [
    (1, 8, 94 * 2 * 4 * 128 * 2, QW_DENSE + 94 * 16 * QW_EXPERT),       # 72,768,576,512 B
    (4, 2, 94 * 2 * 1 * 128 * 2, QW_DENSE // 4 + 94 * 16 * QW_EXPERT),  # heads 4 / TP 4
])
def test_qwen3_235b_per_rank(tp: int, dp: int, beta: int, weights: int) -> None:
    cap = kv_capacity(QWEN235, H200, tp=tp, dp=dp, enable_expert_parallel=True,
                      max_model_len=32768)
    assert QW_DENSE == 15_994_477_568
    assert cap.bytes_per_token == beta
    assert cap.weight_bytes == weights
    per_block = 16 * beta
    assert cap.num_blocks == (BUDGET - weights - cap.activation_bytes
                              - NON_TORCH_OVERHEAD_BYTES) // per_block
    assert cap.total_concurrency == pytest.approx(dp * cap.num_blocks * 16 / 32768)


def test_uneven_experts_take_the_fullest_rank() -> None:
    """vLLM gives the first E % ep ranks one expert more: 128 over 3 ranks is 43, 43, 42."""
    model = get_model("Qwen3-30B-A3B")
    cap = kv_capacity(model, H200, dp=3, enable_expert_parallel=True)
    assert cap.experts_per_rank == 43
    assert cap.expert_weight_bytes == 48 * 43 * 3 * 2048 * 768 * 2


@pytest.mark.parametrize(("model", "tp", "dp", "ep", "moe", "message"), [
    ("llama-3.1-8b", 2, 1, True, {}, "dense model"),
    ("llama-3.1-8b", 2, 1, False, {"moe_ep": 2}, "--moe-ep: .* dense model"),
    ("Qwen3-30B-A3B", 1, 1, True, {}, "needs more than one GPU"),
    ("Qwen3-30B-A3B", 1, 256, True, {}, "exceed"),
    ("Qwen3-30B-A3B", 2, 4, False, {"moe_tp": 2, "moe_ep": 2}, "must equal .* = 8"),
    ("Qwen3-30B-A3B", 2, 4, False, {"moe_ep": 3}, "does not divide the 8 GPUs"),
    ("Qwen3-30B-A3B", 2, 4, True, {"moe_tp": 2}, "whole experts"),
    ("Qwen3-30B-A3B", 2, 4, False, {"moe_tp": 2, "moe_dispatch": "all-to-all"}, "all-gather"),
    ("Qwen3-30B-A3B", 8, 1, False, {"moe_ep": 8, "moe_dispatch": "all-gather"}, "--dp > 1"),
])
def test_bad_layouts_are_one_line_errors(model: str, tp: int, dp: int, ep: bool,
                                         moe: dict[str, object], message: str) -> None:
    with pytest.raises(KvplanError, match=message) as err:
        kv_capacity(get_model(model), H200, tp=tp, dp=dp, enable_expert_parallel=ep, **moe)
    assert "\n" not in str(err.value)


def test_dense_model_data_parallel_is_replicas() -> None:
    """DP on a dense model: each rank sizes as TP alone (nothing is shared across DP ranks)."""
    model = get_model("llama-3.1-8b")
    one, four = kv_capacity(model, H200), kv_capacity(model, H200, dp=4)
    assert (four.weight_bytes, four.num_blocks) == (one.weight_bytes, one.num_blocks)
    assert four.total_concurrency == 4 * one.max_concurrency


def test_parallel_layout_sizes() -> None:
    layout = ParallelLayout(tp=2, dp=8, enable_expert_parallel=True)
    assert (layout.world_size, layout.ep_size, layout.uses_all_to_all) == (16, 16, True)
    assert not ParallelLayout(tp=8, enable_expert_parallel=True).uses_all_to_all
    assert ParallelLayout(tp=8).ep_size == 1


def test_zipf_probabilities_sum_to_k_and_cap_at_one() -> None:
    probs = ExpertRouting("zipf", 2.0).expert_probabilities(256, 8)
    assert sum(probs) == pytest.approx(8)
    assert max(probs) == 1.0  # 8 / ζ(2)-ish > 1 for the hottest: capped
    assert ExpertRouting().expert_probabilities(256, 8) == (8 / 256,) * 256


def test_size_command_prints_per_rank_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvplan")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["size", "--model", "deepseek-v3", "--gpu", "h200", "--dp", "8",
                              "--enable-expert-parallel", "--max-model-len", "8192"])
    assert run(args) == 0
    out = capsys.readouterr().out
    weights = DS_DENSE + 58 * 32 * DS_EXPERT
    assert f"{weights / GIB:.2f} GiB, of which routed experts {58 * 32 * DS_EXPERT / GIB:.2f} GiB" in out
    assert "EP 8, 32 routed experts per layer" in out
    # 28,252 blocks a DP rank (test_deepseek_kv_per_rank_dp8_ep8): × 16 / 8192 = 55.18, × 8 = 441.44
    assert "55.18x per DP rank, 441.44x in all" in out


def test_size_command_needs_gpu_for_dp() -> None:
    parser = argparse.ArgumentParser(prog="kvplan")
    add_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(KvplanError, match="give --gpu"):
        run(parser.parse_args(["size", "--model", "deepseek-v3", "--dp", "8"]))


SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "deepseek-ep.yaml"


def test_scenario_runs_one_replica_per_dp_rank() -> None:
    scenario, base = load_scenario(SCENARIO)
    dep = build_deployment(scenario, base)
    assert dep.scenario.num_replicas == 8 and dep.capacity.ep == 8
    assert dep.num_blocks == 28_252  # test_deepseek_kv_per_rank_dp8_ep8's pool
    described = dep.describe()
    assert (described["data_parallel_size"], described["expert_parallel_size"]) == (8, 8)


def test_scenario_keys_are_checked() -> None:
    base = {"model": "deepseek-v3", "gpu": "h200", "workload": {"trace": "bundled:azure-conv"}}
    with pytest.raises(KvplanError, match="not vllm-v0"):
        parse_scenario({**base, "engine": "vllm-v0", "data_parallel_size": 8,
                        "enable_expert_parallel": True}, "x.yaml")
    with pytest.raises(KvplanError, match="not as a grid"):  # vLLM: all EP or all TP
        parse_scenario({**base, "tensor_parallel": 8, "moe_expert_parallel_size": 4}, "x.yaml")
    with pytest.raises(KvplanError, match="skew > 0"):
        parse_scenario({**base, "expert_routing": {"distribution": "zipf"}}, "x.yaml")
    with pytest.raises(KvplanError, match="moe_dispatch"):
        parse_scenario({**base, "moe_dispatch": "broadcast"}, "x.yaml")
    # SGLang and TensorRT-LLM lay the MoE out as a grid; vLLM's DP without EP is MoE TP over dp × tp
    grid = parse_scenario({**base, "engine": "trtllm", "tensor_parallel": 8,
                           "moe_expert_parallel_size": 4}, "x.yaml")
    assert (grid.moe_expert_parallel_size, grid.moe_tensor_parallel_size) == (4, None)
    dp_tp = build_deployment(parse_scenario({**base, "data_parallel_size": 2, "tensor_parallel": 4,
                                             "max_model_len": 8192}, "x.yaml"), Path.cwd(), where="x.yaml")
    assert (dp_tp.capacity.moe_tp, dp_tp.capacity.ep, dp_tp.capacity.moe_dispatch) == (8, 1, "all-gather")
    with pytest.raises(KvplanError, match="x.yaml: moe_expert_parallel_size 3 does not divide"):
        build_deployment(parse_scenario({**base, "engine": "sglang", "tensor_parallel": 8,
                                         "moe_expert_parallel_size": 3}, "x.yaml"),
                         Path.cwd(), where="x.yaml")
    zipf = parse_scenario({**base, "expert_routing": {"distribution": "zipf", "skew": 1.2}}, "x.yaml")
    assert (zipf.expert_routing.distribution, zipf.expert_routing.skew) == ("zipf", 1.2)
