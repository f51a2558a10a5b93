"""Expert parallelism in the roofline: all-to-all bytes, experts per rank, routing skew."""

from __future__ import annotations

import math

import pytest

from simulator.kv.expert_parallel import ExpertRouting
from simulator.kv.gpus import get_gpu
from simulator.kv.models import ModelConfig, get_model
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import PrefillChunk, StepPlan

H200 = get_gpu("h200")
DSV3 = get_model("DeepSeek-V3")
DS_EXPERT_PARAMS = 3 * 7168 * 2048
# 1 routed expert per token (k = 1), 16 experts, bf16: the all-to-all is (ep − 1)/ep of the tokens
TOY = ModelConfig(name="toy-moe", num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                  head_dim=64, hidden_size=512, intermediate_size=1024, vocab_size=1000,
                  torch_dtype="bfloat16", tie_word_embeddings=False, max_position_embeddings=4096,
                  n_routed_experts=16, num_experts_per_tok=1, moe_intermediate_size=256)


def _decode(n: int, context: int = 1000) -> StepPlan:
    return StepPlan(0, (), n, n * context, 0.0, context)


def _prefill(tokens: int) -> StepPlan:
    return StepPlan(0, (PrefillChunk(1, tokens, 0, True),), 0, 0, 0.0, 0)


def test_alltoall_with_one_expert_per_token_is_the_remote_share() -> None:
    """k = 1, EP 8 on one node: each token goes to one rank, remote with probability 7/8; two
    calls (dispatch, combine) per MoE layer, each tokens × hidden × 2 B × 7/8 over NVLink."""
    lat = RooflineLatency(TOY, H200, dp=8, enable_expert_parallel=True, alltoall_latency_s=1e-5)
    tokens = 64
    per_call = tokens * 512 * 2 * 7 / 8 / 450e9 + 1e-5
    assert lat.step_cost(_decode(tokens)).alltoall_s == pytest.approx(2 * 4 * per_call, rel=1e-12)


def test_alltoall_deepseek_ep8_by_hand() -> None:
    """Top-8 of 256: each of the 8 picks misses a remote rank (32 experts) with probability 7/8."""
    lat = RooflineLatency(DSV3, H200, dp=8, enable_expert_parallel=True, alltoall_latency_s=2e-5)
    remote = 7 * (1 - (7 / 8) ** 8)
    tokens = 128
    per_call = tokens * 7168 * 2 * remote / 450e9 + 2e-5
    assert lat.step_cost(_decode(tokens)).alltoall_s == pytest.approx(2 * 58 * per_call, rel=1e-12)


def test_alltoall_beyond_a_node_takes_the_scale_out_link() -> None:
    """EP 16 on 8-GPU nodes: 7 remote ranks share rank 0's node, 8 are off it; the slower share
    (8 ranks at 50 GB/s against 7 at 450 GB/s) sets each call."""
    lat = RooflineLatency(DSV3, H200, dp=16, enable_expert_parallel=True, alltoall_latency_s=0.0)
    hit = 1 - (15 / 16) ** 8
    tokens = 32
    per_call = tokens * 7168 * 2 * max(7 * hit / 450e9, 8 * hit / 50e9)
    assert lat.step_cost(_decode(tokens)).alltoall_s == pytest.approx(2 * 58 * per_call, rel=1e-12)


def test_no_alltoall_without_data_parallelism() -> None:
    """EP inside one TP group: every rank already holds every token; the all-reduce stays."""
    ep, tp = (RooflineLatency(DSV3, H200, tp=8, enable_expert_parallel=e) for e in (True, False))
    cost_ep, cost_tp = ep.step_cost(_decode(64)), tp.step_cost(_decode(64))
    assert cost_ep.alltoall_s == 0.0
    assert cost_ep.allreduce_s == cost_tp.allreduce_s > 0


def test_expert_terms_per_rank_under_ep_by_hand() -> None:
    """TP 8 with EP: the rank holds 32 whole experts; T tokens touch 32(1 − (1 − 1/32)^T) of
    them, and the busiest rank gets T·1 + sqrt(2 ln 8 · T · 32 · (1/32)(31/32)) pairs."""
    lat = RooflineLatency(DSV3, H200, tp=8, enable_expert_parallel=True)
    t = 100
    expert_bytes = lat.weight_format.expert_bytes  # whole expert, fp8: 44,040,192 B
    assert expert_bytes == DS_EXPERT_PARAMS
    touched = 32 * (1 - (1 - 8 / 256) ** t)
    terms = lat.step_terms(_decode(t))
    dense = lat.weight_format.dense_weight_bytes / 8
    assert terms.weight_bytes == pytest.approx(dense + 58 * touched * expert_bytes, rel=1e-12)
    pairs = t + math.sqrt(2 * math.log(8) * t * 32 * (1 / 32) * (31 / 32))
    assert terms.expert_flops == pytest.approx(2 * 58 * DS_EXPERT_PARAMS * pairs, rel=1e-12)


def test_dp_ranks_route_each_others_decode_tokens() -> None:
    """DP 8: a step of n decodes routes 8n tokens through the MoE layers (the other DP ranks
    decode as many); a prefill chunk is routed alone, with the others' decodes."""
    lat = RooflineLatency(DSV3, H200, dp=8, enable_expert_parallel=True)
    routed = 8 * 16
    pairs = routed * 8 / 8 + math.sqrt(2 * math.log(8) * routed * 32 * (8 / 256) * (1 - 8 / 256))
    assert lat.step_terms(_decode(16)).expert_flops == pytest.approx(
        2 * 58 * DS_EXPERT_PARAMS * pairs, rel=1e-12)


def test_ep_off_terms_are_unchanged() -> None:
    """Without EP (uniform routing) the MoE terms are the single-rank formula, TP-sharded."""
    lat = RooflineLatency(DSV3, H200, tp=8)
    t = 300
    terms = lat.step_terms(_prefill(t))
    touched = 256 * (1 - (1 - 8 / 256) ** t)
    expert = lat.weight_format.expert_bytes / 8
    assert terms.weight_bytes == lat.weight_format.dense_weight_bytes / 8 + 58 * touched * expert
    assert terms.expert_flops == 2 * 58 * 8 * DS_EXPERT_PARAMS / 8 * t
    assert terms.alltoall_s == 0.0
    assert lat.step_latency_s(_prefill(t)) == RooflineLatency(
        DSV3, H200, tp=8, dp=1, enable_expert_parallel=False,
        expert_routing=ExpertRouting()).step_latency_s(_prefill(t))


# Skews below the cap: at s ≈ 1 the hottest expert's pick probability reaches 1 and the excess
# spreads over the others, which can lower the hottest rank's sum again.
ROUTINGS = (ExpertRouting(), *(ExpertRouting("zipf", s) for s in (0.25, 0.5, 0.75)))


def test_skew_raises_the_step_time_monotonically() -> None:
    """A compute-bound step (a 4,096-token prefill) on one node: more skew, a busier busiest
    rank, a longer step. The times are the roofline's modelled seconds (no clock is read)."""
    times = [RooflineLatency(DSV3, H200, dp=8, enable_expert_parallel=True,
                             expert_routing=routing).step_latency_s(_prefill(4096))
             for routing in ROUTINGS]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_skew_raises_the_busiest_ranks_flops_across_nodes() -> None:
    """EP 16: the busiest rank's expert FLOPs grow with skew; the all-to-all may shrink (a token
    concentrated on popular experts reaches fewer ranks), so only the FLOPs are monotone."""
    flops = [RooflineLatency(DSV3, H200, dp=16, enable_expert_parallel=True,
                             expert_routing=routing).step_terms(_prefill(4096)).expert_flops
             for routing in ROUTINGS]
    assert flops == sorted(flops) and len(set(flops)) == len(flops)


def test_busiest_pairs_bounds() -> None:
    """The busiest rank's pairs exceed the mean share and never exceed every token's k picks."""
    lat = RooflineLatency(DSV3, H200, dp=8, enable_expert_parallel=True,
                          expert_routing=ExpertRouting("zipf", 1.0))
    load = lat._rank_load
    assert load is not None
    for tokens in (1, 10, 1000, 100_000):
        assert tokens * 8 / 8 < load.busiest_pairs(tokens) <= tokens * 8


def test_describe_names_the_layout() -> None:
    d = RooflineLatency(DSV3, H200, dp=8, enable_expert_parallel=True).describe()
    assert (d["data_parallel_size"], d["expert_parallel_size"]) == (8, 8)
    assert d["alltoall_latency_s"] == d["allreduce_latency_s"]
