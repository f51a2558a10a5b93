"""The parallel layouts of measured runs on 8 GPUs, sized by hand: attention DP with the MoE
expert parallel, attention DP with the MoE tensor parallel, and TP 8 throughout.

DeepSeek-R1 (FP8 checkpoint, as DeepSeek-V3): 672,987,199,488 weight bytes, of which 58 MoE layers
× 256 routed experts × 3 × 7168 × 2048 = 653,908,770,816; the rest (attention, 3 dense MLPs,
shared experts, embeddings, lm_head) 19,078,428,672. MLA caches 61 × (512 + 64) × 2 = 70,272 B a
token on every rank. On an H200 at 0.9: int(0.9 × 143,156 MiB) bytes of budget (the total the driver
reports, 139.80 GiB, not the 141 GiB of its name), 0.5 GiB non-torch.
Activations for 8,192 batched tokens (bf16, max_num_seqs 256):

* residual 2 × 8192 × 7168 × 2 = 234,881,024;
* fused MoE at full expert width: 8192 × 8 × (3 × 2048 + 7168) × 2 = 1,744,830,464;
  at 1/8 width: per (token, expert) 3 × 256 + 7168 = 7,936 values;
* a gathered MoE (DP 8 into one TP-8 MoE): 8 × 8192 = 65,536 tokens gathered (65,536 × 7168 × 2
  = 939,524,096 B), run in chunks of 16,384 (16,384 × 8 × 7,936 × 2 = 2,080,374,784 B).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import api
from simulator.config.deployment import build_deployment
from simulator.config.scenario import load_scenario, parse_scenario
from simulator.errors import KvplanError
from simulator.kv.expert_parallel import ParallelLayout
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.kv.sizing import MIB, NON_TORCH_OVERHEAD_BYTES, kv_capacity

H200 = get_gpu("h200")
R1 = get_model("DeepSeek-R1")
EXPERT = 3 * 7168 * 2048
ROUTED = 58 * 256 * EXPERT
WEIGHTS = 672_987_199_488
DENSE = WEIGHTS - ROUTED
BETA = 61 * (512 + 64) * 2
BUDGET = int(0.9 * 143_156 * MIB)  # H200.total_memory_bytes
RESIDUAL = 2 * 8192 * 7168 * 2

# (weights per rank, of which routed experts, activations, KV pools holding requests)
LAYOUTS = {
    # SGLang --tp 8 --dp 8 --enable-dp-attention --ep 8; TRT-LLM tp_size 8, enable_attention_dp,
    # moe_expert_parallel_size 8; vLLM --data-parallel-size 8 --enable-expert-parallel
    "dp8-ep8": ({"tp": 1, "dp": 8, "moe_ep": 8},
                DENSE + 58 * 32 * EXPERT, 58 * 32 * EXPERT,
                RESIDUAL + 8192 * 8 * (3 * 2048 + 7168) * 2, 8),
    # SGLang --tp 8 --dp 8 --enable-dp-attention (MoE TP 8); TRT-LLM moe_tensor_parallel_size 8;
    # vLLM --data-parallel-size 8 without EP
    "dp8-moetp8": ({"tp": 1, "dp": 8, "moe_tp": 8},
                   DENSE + 58 * 256 * EXPERT // 8, 58 * 256 * EXPERT // 8,
                   RESIDUAL + 65536 * 7168 * 2 + 16384 * 8 * (3 * 256 + 7168) * 2, 8),
    # --tp 8 everywhere: every tensor split 8 ways; one pool for the 8 GPUs
    "tp8": ({"tp": 8}, WEIGHTS // 8, ROUTED // 8, RESIDUAL + 8192 * 8 * (3 * 256 + 7168) * 2, 1),
}


def _cap(layout: dict[str, int]):
    return kv_capacity(R1, H200, max_model_len=8192, **layout)


def test_hand_constants() -> None:
    cap = _cap({"tp": 8})
    assert cap.weight_format.weight_bytes == WEIGHTS and cap.weight_format.expert_bytes == EXPERT
    assert (DENSE, ROUTED) == (19_078_428_672, 653_908_770_816)


@pytest.mark.parametrize("name", LAYOUTS)
def test_weights_and_kv_per_rank_by_hand(name: str) -> None:
    layout, weights, experts, activations, pools = LAYOUTS[name]
    cap = _cap(layout)
    assert cap.weight_bytes == weights
    assert cap.expert_weight_bytes == experts
    assert cap.activation_bytes == activations
    assert cap.bytes_per_token == BETA  # the MLA latent: whole on every rank at any TP
    available = BUDGET - weights - activations - NON_TORCH_OVERHEAD_BYTES
    assert cap.available_kv_bytes == available
    assert cap.num_blocks == available // (16 * BETA)
    assert cap.max_concurrency == pytest.approx(cap.num_blocks * 16 / 8192)
    # each attention DP rank's pool holds its own requests: dp pools for the deployment
    assert cap.total_concurrency == pytest.approx(pools * cap.num_blocks * 16 / 8192)


def test_the_three_layouts_differ_where_they_should() -> None:
    ep, moe_tp, tp = (_cap(LAYOUTS[n][0]) for n in LAYOUTS)
    # 32 whole experts or 1/8 of 256: the same expert bytes per rank, the same weights (attention
    # and the dense part whole on each DP rank of one GPU)
    assert ep.weight_bytes == moe_tp.weight_bytes == 100_817_025_024
    assert ep.expert_weight_bytes == moe_tp.expert_weight_bytes == tp.expert_weight_bytes
    # TP 8 splits the dense part too: 16.7 GB less per rank
    assert ep.weight_bytes - tp.weight_bytes == DENSE - DENSE // 8
    # the gathered MoE runs every DP rank's tokens: more activation memory, less KV
    assert moe_tp.activation_bytes > ep.activation_bytes > tp.activation_bytes
    assert ep.num_blocks > moe_tp.num_blocks
    # TP 8 has the most KV a rank, but a TP rank holds the same latents as the others: one pool
    assert tp.num_blocks > ep.num_blocks
    # 8 pools of 27,118 blocks (30.5 GB of KV a rank) against one of 43,726 (49.2 GB): 4.96 ×
    assert ep.total_concurrency > moe_tp.total_concurrency > 4.9 * tp.total_concurrency
    assert (ep.ep, ep.moe_tp, ep.moe_dispatch) == (8, 1, "all-to-all")
    assert (moe_tp.ep, moe_tp.moe_tp, moe_tp.moe_dispatch) == (1, 8, "all-gather")
    assert (tp.ep, tp.moe_tp, tp.moe_dispatch) == (1, 8, "none")


def test_vllm_dp_with_ep_is_moe_ep_over_every_gpu() -> None:
    """vLLM's flags and the explicit MoE sizes are one layout, byte for byte."""
    assert _cap({"tp": 1, "dp": 8, "enable_expert_parallel": True}) == _cap(LAYOUTS["dp8-ep8"][0])
    assert _cap({"tp": 1, "dp": 8}) == _cap(LAYOUTS["dp8-moetp8"][0])  # vLLM DP without EP
    assert _cap({"tp": 8, "moe_tp": 8, "moe_ep": 1}) == _cap({"tp": 8})


def test_a_grid_splits_experts_and_shards_each() -> None:
    """TensorRT-LLM's moe_tp 2 × moe_ep 4 on 8 GPUs: 64 experts a rank, half of each."""
    cap = _cap({"tp": 8, "moe_tp": 2, "moe_ep": 4})
    assert (cap.experts_per_rank, cap.moe_tp, cap.ep) == (64, 2, 4)
    assert cap.expert_weight_bytes == 58 * 64 * EXPERT // 2 == ROUTED // 8
    assert cap.weight_bytes == -(-DENSE // 8) + ROUTED // 8
    # the other size follows from the one given
    layout = ParallelLayout(tp=1, dp=8, moe_ep_size=4)
    assert (layout.moe_tp, layout.moe_ep, layout.dispatch) == (2, 4, "all-gather")
    assert ParallelLayout(tp=4, dp=2, moe_tp_size=1).moe_ep == 8


def test_size_command_takes_the_moe_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    result = api.size("deepseek-r1", gpu="h200", dp=8, moe_tp=8, max_model_len=8192)
    figures = result.as_dict()
    assert (figures["moe_tensor_parallel_size"], figures["expert_parallel_size"],
            figures["moe_dispatch"]) == (8, 1, "all-gather")
    assert figures["weight_bytes"] == LAYOUTS["dp8-moetp8"][1]
    assert "each TP-sharded over 8 ranks; tokens of other DP ranks by all-gather" in result.table()
    with pytest.raises(KvplanError, match="--moe-tp x --moe-ep = 2 x 2 = 4 must equal"):
        api.size("deepseek-r1", gpu="h200", dp=8, moe_tp=2, moe_ep=2)
    with pytest.raises(KvplanError, match="give --gpu"):
        api.size("deepseek-r1", moe_ep=8)


BASE = {"name": "tiny", "seed": 1, "model": "deepseek-r1", "gpu": "h200", "max_model_len": 4096,
        "latency": {"model": "roofline"},
        "workload": {"num_requests": 24, "arrival": {"process": "poisson", "rate": 20},
                     "prompt_tokens": {"dist": "fixed", "value": 200},
                     "output_tokens": {"dist": "fixed", "value": 8}}}
SCENARIO_LAYOUTS = {"dp8-ep8": {"data_parallel_size": 8, "moe_expert_parallel_size": 8},
                    "dp8-moetp8": {"data_parallel_size": 8, "moe_tensor_parallel_size": 8},
                    "tp8": {"tensor_parallel": 8}}


@pytest.mark.parametrize("engine", ["vllm-v1", "sglang", "trtllm"])
def test_simulate_each_layout(engine: str) -> None:
    """A tiny DeepSeek-R1 scenario under each layout: every request served, one replica per
    attention DP rank, and the latencies of the three layouts apart."""
    tpot = {}
    for name, keys in SCENARIO_LAYOUTS.items():
        result = api.simulate({**BASE, **keys, "engine": engine})
        summary = result.summaries["paged"]
        described = result.plan.deployment.describe()
        assert summary["completed"] == 24, name
        assert described["num_replicas"] == (1 if name == "tp8" else 8)
        assert (described["expert_parallel_size"], described["moe_tensor_parallel_size"]) == {
            "dp8-ep8": (8, 1), "dp8-moetp8": (1, 8), "tp8": (1, 8)}[name]
        assert described["latency_model"]["moe_dispatch"] == {
            "dp8-ep8": "all-to-all", "dp8-moetp8": "all-gather", "tp8": "none"}[name]
        tpot[name] = summary["tpot_s"]["p50"]
    assert len(set(tpot.values())) == 3


def test_sglang_spelling_of_dp_attention() -> None:
    """SGLang's --tp 8 --dp 8 --enable-dp-attention --ep 8 is tensor_parallel 1 (8 / 8),
    data_parallel_size 8, moe_expert_parallel_size 8. Its defaults are those of --tp-size 8, and
    each DP rank's scheduler gets the chunk / 8 and the conservativeness × 0.3
    (ServerArgs._handle_data_parallelism), its request limit / 8 (_resolve_max_num_reqs)."""
    from simulator.scheduler.sglang import sglang_defaults

    defaults = sglang_defaults(H200.hbm_gib, tensor_parallel=8)
    scenario = parse_scenario({**BASE, **SCENARIO_LAYOUTS["dp8-ep8"], "engine": "sglang",
                               "max_num_seqs": 256}, "x.yaml")
    dep = build_deployment(scenario, Path.cwd(), where="x.yaml")
    assert dep.capacity.tp == 1 and dep.scenario.num_replicas == 8
    assert dep.capacity.budget_bytes == int(defaults["mem_fraction_static"] * H200.total_memory_bytes)
    cfg = dep.scheduler_config
    assert cfg.max_num_batched_tokens == defaults["chunked_prefill_size"] // 8
    assert cfg.schedule_conservativeness == pytest.approx(0.3)
    assert cfg.max_num_seqs == 256 // 8
    one = build_deployment(parse_scenario({**BASE, "engine": "sglang", "tensor_parallel": 8},
                                          "x.yaml"), Path.cwd(), where="x.yaml")
    assert one.scheduler_config.max_num_batched_tokens == defaults["chunked_prefill_size"]
    assert one.scheduler_config.schedule_conservativeness == 1.0


def test_trtllm_attention_dp_is_one_rank_a_dp_rank() -> None:
    with pytest.raises(KvplanError, match="give tensor_parallel 1 and data_parallel_size 8"):
        parse_scenario({**BASE, "engine": "trtllm", "tensor_parallel": 2, "data_parallel_size": 4},
                       "x.yaml")


SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "deepseek-ep.yaml"


def test_deepseek_ep_scenario_is_unchanged() -> None:
    """scenarios/deepseek-ep.yaml (vLLM DP 8 + EP 8) gives what it gave before the MoE layout
    keys: the first 500 requests' figures as the code before them computed them, re-pinned for the
    refitted roofline constants (simulator/latency/roofline_fit.json: with the previous fit these
    are the previous figures exactly; the KV pool does not bind here, so the driver-reported
    total changes none of them)."""
    scenario, base = load_scenario(SCENARIO, {"workload.num_requests": 500})
    summary = api.simulate(scenario).summaries["paged"]
    assert summary["completed"] == 500
    assert summary["ttft_s"]["p99"] == 0.37168373369897184
    assert summary["tpot_s"]["p99"] == 0.038256430439201614
    assert summary["throughput_tok_s"] == 2918.4157684294796
    explicit, _ = load_scenario(SCENARIO, {"workload.num_requests": 500,
                                           "enable_expert_parallel": False,
                                           "moe_expert_parallel_size": 8})
    assert api.simulate(explicit).summaries["paged"] == summary
