"""The MoE layers' own layout in the roofline: per-rank expert shapes under moe_tp, the
all-to-all only under expert parallelism across DP ranks, the all-gather of data-parallel
attention's tokens before a TP-sharded MoE, and the NVLink domain that decides their link.

DeepSeek-R1 (FP8): 58 MoE layers of 256 routed experts, top 8, of 3 × 7168 × 2048 =
44,040,192 fp8 bytes (and parameters) each; hidden 7168 in bf16 (14,336 B a token).
"""

from __future__ import annotations

import math

import pytest

from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import PrefillChunk, StepPlan

H200 = get_gpu("h200")  # 8 GPUs to an NVLink domain, 450 GB/s; 50 GB/s beyond
GB200 = get_gpu("gb200")  # 72 GPUs to an NVLink domain (NVL72), 900 GB/s
R1 = get_model("DeepSeek-R1")
EXPERT = 3 * 7168 * 2048
TOKEN_BYTES = 7168 * 2

# the three layouts of 8 GPUs the tests compare (kvplan's keys)
DP8_EP8 = {"tp": 1, "dp": 8, "moe_ep": 8}           # SGLang --tp 8 --dp 8 --enable-dp-attention --ep 8
DP8_MOE_TP8 = {"tp": 1, "dp": 8, "moe_tp": 8}       # the same, without --ep (MoE TP over all 8)
TP8 = {"tp": 8}                                     # --tp 8: attention and MoE TP 8


def _decode(n: int, context: int = 1000) -> StepPlan:
    return StepPlan(0, (), n, n * context, 0.0, context)


def _prefill(tokens: int) -> StepPlan:
    return StepPlan(0, (PrefillChunk(1, tokens, 0, True),), 0, 0, 0.0, 0)


def _lat(gpu=H200, **layout) -> RooflineLatency:
    return RooflineLatency(R1, gpu, alltoall_latency_s=1e-5, **layout)


def test_the_all_to_all_appears_only_with_expert_parallelism_across_dp_ranks() -> None:
    costs = {name: _lat(**layout).step_cost(_decode(64)) for name, layout in (
        ("dp8 ep8", DP8_EP8), ("dp8 moe-tp8", DP8_MOE_TP8), ("tp8", TP8),
        ("tp8 ep8", {"tp": 8, "moe_ep": 8}), ("tp8 moe tp2 x ep4", {"tp": 8, "moe_tp": 2, "moe_ep": 4}))}
    assert costs["dp8 ep8"].alltoall_s > 0 and costs["dp8 ep8"].gather_s == 0.0
    for name in ("dp8 moe-tp8", "tp8", "tp8 ep8", "tp8 moe tp2 x ep4"):
        assert costs[name].alltoall_s == 0.0, name
    # data-parallel attention before a TP-sharded MoE gathers the DP ranks' tokens instead
    assert costs["dp8 moe-tp8"].gather_s > 0
    # one DP rank of 8: every rank already holds every token; the layer's all-reduce sums
    for name in ("tp8", "tp8 ep8", "tp8 moe tp2 x ep4"):
        assert costs[name].gather_s == 0.0 and costs[name].allreduce_s > 0, name
    assert costs["dp8 ep8"].allreduce_s == costs["dp8 moe-tp8"].allreduce_s == 0.0  # attention TP 1


def test_all_gather_by_hand() -> None:
    """DP 8 decoding 64 each: G = 64 + 7 × 64 = 512 tokens per MoE layer; an all-gather and a
    reduce-scatter of 7/8 of them over NVLink (8 GPUs fit the H200's 8-GPU domain), per layer."""
    lat = _lat(**DP8_MOE_TP8)
    per_call = 512 * 7 / 8 * TOKEN_BYTES / 450e9 + 1e-5
    assert lat.step_cost(_decode(64)).gather_s == pytest.approx(2 * 58 * per_call, rel=1e-12)
    # a prefill chunk of 300: the others' 0 decodes add nothing: G = 300
    per_call = 300 * 7 / 8 * TOKEN_BYTES / 450e9 + 1e-5
    assert lat.step_cost(_prefill(300)).gather_s == pytest.approx(2 * 58 * per_call, rel=1e-12)


def test_the_nvlink_domain_decides_the_gathers_link() -> None:
    """DP 16: beyond an H200 node the gather takes the 50 GB/s scale-out; inside a GB200 NVL72
    rack the 900 GB/s NVLink."""
    step = _decode(32)
    g = 32 * 16
    h200 = _lat(H200, tp=1, dp=16, moe_tp=16).step_cost(step).gather_s
    gb200 = _lat(GB200, tp=1, dp=16, moe_tp=16).step_cost(step).gather_s
    assert h200 == pytest.approx(116 * (g * 15 / 16 * TOKEN_BYTES / 50e9 + 1e-5), rel=1e-12)
    assert gb200 == pytest.approx(116 * (g * 15 / 16 * TOKEN_BYTES / 900e9 + 1e-5), rel=1e-12)


def test_the_all_to_all_takes_nvlink_inside_an_nvl72_rack() -> None:
    """EP 16 on H200 nodes sends 8 of its 15 remote ranks over the scale-out network; on GB200
    all 15 share the rack's NVLink."""
    hit = 1 - (15 / 16) ** 8
    h200 = _lat(H200, tp=1, dp=16, moe_ep=16).step_cost(_decode(32)).alltoall_s
    gb200 = _lat(GB200, tp=1, dp=16, moe_ep=16).step_cost(_decode(32)).alltoall_s
    assert h200 == pytest.approx(116 * (32 * TOKEN_BYTES * max(7 * hit / 450e9, 8 * hit / 50e9)
                                        + 1e-5), rel=1e-12)
    assert gb200 == pytest.approx(116 * (32 * TOKEN_BYTES * 15 * hit / 900e9 + 1e-5), rel=1e-12)


def test_moe_gemms_at_each_ranks_share_by_hand() -> None:
    """The routed-expert bytes and FLOPs of one decode step of 64 on each layout."""
    n = 64
    # DP 8 + MoE TP 8: every rank runs 1/8 of all 256 experts on all G = 512 tokens
    g = 8 * n
    terms = _lat(**DP8_MOE_TP8).step_terms(_decode(n))
    dense = R1_DENSE_STEP_BYTES
    touched = 256 * (1 - (1 - 8 / 256) ** g)
    assert terms.weight_bytes == pytest.approx(dense + 58 * touched * EXPERT / 8, rel=1e-12)
    assert terms.expert_flops == pytest.approx(2 * 58 * 8 * EXPERT / 8 * g, rel=1e-12)
    # TP 8: the same shapes, on the rank's own 64 tokens (and the dense part / 8)
    terms = _lat(**TP8).step_terms(_decode(n))
    touched = 256 * (1 - (1 - 8 / 256) ** n)
    assert terms.weight_bytes == pytest.approx(dense / 8 + 58 * touched * EXPERT / 8, rel=1e-12)
    assert terms.expert_flops == pytest.approx(2 * 58 * 8 * EXPERT / 8 * n, rel=1e-12)
    # DP 8 + EP 8: 32 whole experts, the busiest of 8 ranks' pairs over G = 512 tokens
    terms = _lat(**DP8_EP8).step_terms(_decode(n))
    touched = 32 * (1 - (1 - 8 / 256) ** g)
    pairs = g + math.sqrt(2 * math.log(8) * g * 32 * (8 / 256) * (1 - 8 / 256))
    assert terms.weight_bytes == pytest.approx(dense + 58 * touched * EXPERT, rel=1e-12)
    assert terms.expert_flops == pytest.approx(2 * 58 * EXPERT * pairs, rel=1e-12)


def test_a_tp_by_ep_grid_splits_each_expert_over_moe_tp() -> None:
    """TensorRT-LLM's moe_tp 2 × moe_ep 4 at tp_size 8 (no attention DP): 64 experts a rank,
    half of each; the busiest of 4 EP groups' pairs, at half an expert's FLOPs each."""
    n = 100
    terms = _lat(tp=8, moe_tp=2, moe_ep=4).step_terms(_decode(n))
    touched = 64 * (1 - (1 - 8 / 256) ** n)
    p = 64 * 8 / 256
    pairs = n * p + math.sqrt(2 * math.log(4) * n * 64 * (8 / 256) * (1 - 8 / 256))
    assert terms.weight_bytes == pytest.approx(R1_DENSE_STEP_BYTES / 8 + 58 * touched * EXPERT / 2,
                                               rel=1e-12)
    assert terms.expert_flops == pytest.approx(2 * 58 * EXPERT / 2 * pairs, rel=1e-12)


def test_a_grid_under_attention_dp_gathers() -> None:
    """DP 8 with moe_tp 2 × moe_ep 4 (TensorRT-LLM's attention DP without its all-to-all):
    all-gather by default; an all-to-all of split experts is refused."""
    lat = _lat(tp=1, dp=8, moe_tp=2, moe_ep=4)
    cost = lat.step_cost(_decode(16))
    assert cost.alltoall_s == 0.0 and cost.gather_s > 0
    assert lat.describe()["moe_dispatch"] == "all-gather"
    with pytest.raises(Exception, match="all-gather"):
        _lat(tp=1, dp=8, moe_tp=2, moe_ep=4, moe_dispatch="all-to-all")


def test_ep_with_all_gather_dispatch() -> None:
    """vLLM's default all2all backend (allgather_reducescatter) or SGLang without DeepEP: whole
    experts on 8 ranks, the tokens gathered instead of dispatched."""
    a2a = _lat(**DP8_EP8).step_cost(_decode(64))
    gathered = _lat(**DP8_EP8, moe_dispatch="all-gather").step_cost(_decode(64))
    assert gathered.alltoall_s == 0.0 and a2a.gather_s == 0.0
    assert gathered.gather_s == pytest.approx(116 * (512 * 7 / 8 * TOKEN_BYTES / 450e9 + 1e-5),
                                              rel=1e-12)
    assert (gathered.weight_bytes, gathered.expert_flops) == (a2a.weight_bytes, a2a.expert_flops)


def test_describe_names_the_moe_layout() -> None:
    d = _lat(**DP8_MOE_TP8).describe()
    assert (d["data_parallel_size"], d["expert_parallel_size"], d["moe_tensor_parallel_size"],
            d["moe_dispatch"]) == (8, 1, 8, "all-gather")
    d = _lat(**TP8).describe()
    assert (d["expert_parallel_size"], d["moe_tensor_parallel_size"], d["moe_dispatch"]) == (1, 8, "none")


R1_DENSE_STEP_BYTES = RooflineLatency(R1, H200).weight_format.dense_weight_bytes
