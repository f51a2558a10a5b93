"""``kv_offload``: the CPU tier through the schedulers, the latency model, the summary and the
scenario file.

The hand-traced run: a pool of 6 blocks of 4 slots, a tier of 16 blocks. R0 (prompt 9 under two
prefix ids: 2 full named blocks) finishes; its 2 blocks stay cached in HBM and were stored in the
tier as they were written. R1 (20 tokens, 5 named blocks, 2 generated) needs all 6 blocks and
evicts R0's 2 from HBM. R2 has R0's prompt: with the tier it finds both blocks there (8 of its 9
tokens; the last is computed for its logits), and its admission step loads them: 2 blocks in
``num_swap_in_blocks``, a 1-token chunk. Without the tier it prefills all 9.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.engine import metrics
from simulator.cli import main
from simulator.config.deployment import GIB, build_deployment
from simulator.engine.core import simulate
from simulator.errors import KvplanWarning
from simulator.kv.gpus import get_gpu
from simulator.kv.models import load_model
from simulator.kv.paged import PagedAllocator
from simulator.latency.roofline import RooflineLatency
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.config.scenario import load_scenario
from simulator.scheduler import SchedulerConfig, make_scheduler
from workloads.request import Request

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4
REQUESTS = [Request(0, 0.0, 9, 2, prefix_ids=(10, 11), prefix_block_tokens=BLOCK),
            Request(1, 1.0, 20, 2, prefix_ids=(20, 21, 22, 23, 24), prefix_block_tokens=BLOCK),
            Request(2, 2.0, 9, 2, prefix_ids=(10, 11), prefix_block_tokens=BLOCK)]


class Recorded:
    """10 ms per step, every plan kept (state: no quiet runs)."""

    quiet_runs = False

    def __init__(self) -> None:
        self.plans: list[StepPlan] = []

    def step_latency_s(self, plan: StepPlan) -> float:
        self.plans.append(plan)
        return 0.01


def run(engine: str, offload_blocks: int):  # type: ignore[no-untyped-def]
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=BLOCK,
                          enable_prefix_caching=True, engine=engine)

    def make(_: int):  # type: ignore[no-untyped-def]
        alloc = PagedAllocator(6, BLOCK, enable_prefix_caching=True, offload_blocks=offload_blocks)
        return make_scheduler(alloc, cfg), alloc

    latency = Recorded()
    return simulate(REQUESTS, make, latency), latency.plans


@pytest.mark.parametrize("engine", ["vllm-v1", "vllm-v0"])
def test_a_prefix_evicted_from_hbm_is_loaded_from_the_tier(engine: str) -> None:
    result, plans = run(engine, 16)
    assert [g.prefix_hit_tokens for g in result.groups] == [0, 0, 8]
    alloc = result.replicas[0].allocator
    assert (alloc.num_hit_blocks, alloc.num_offload_hit_blocks) == (0, 2)
    prefill_steps = [(list(p.prefills), p.num_swap_in_blocks) for p in plans if p.prefills]
    seq = prefill_steps[2][0][0].seq_id
    assert prefill_steps[2] == ([PrefillChunk(seq, 1, 8, True)], 2)
    assert sum(p.num_swap_in_blocks for p in plans) == 2  # loaded once, counted once

    summary = metrics.summarize(result, metrics.requests_frame(result), metrics.steps_frame(result),
                                6 * BLOCK)
    assert summary["prefix_hit_rate"] == 8 / 38
    # over the 38 prompt tokens queried; R0's 2 hashes and R1's 5 stored, nothing dropped
    assert summary["kv_offload"] == {"hbm_hit_rate": 0.0, "cpu_hit_rate": 8 / 38, "loaded_blocks": 2,
                                     "stored_blocks": 7, "cpu_evicted_blocks": 0}


@pytest.mark.parametrize("engine", ["vllm-v1", "vllm-v0"])
def test_without_the_tier_the_prefix_is_prefilled_again(engine: str) -> None:
    result, plans = run(engine, 0)
    assert [g.prefix_hit_tokens for g in result.groups] == [0, 0, 0]
    assert [len(p.prefills) and p.prefills[0].num_tokens for p in plans if p.prefills] == [9, 20, 9]
    assert all(p.num_swap_in_blocks == 0 for p in plans)
    summary = metrics.summarize(result, metrics.requests_frame(result), metrics.steps_frame(result),
                                6 * BLOCK)
    assert "kv_offload" not in summary


def test_loads_cost_their_bytes_over_the_host_link() -> None:
    """Llama-3.1-8B, bf16 KV: 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes = 131,072 bytes a
    token, 2 MiB a 16-token block. Loading 3 blocks over a 50 GB/s link adds 3 × 2 MiB / 50e9 s."""
    model, gpu = load_model("llama-3.1-8b"), get_gpu("h200-141gb")
    plan = StepPlan(0, (PrefillChunk(0, 1, 32, True),), 0, 0, 0.0, 0)
    loaded = plan._replace(num_swap_in_blocks=3)
    for bandwidth in (None, 50e9):
        lat = RooflineLatency(model, gpu, block_size=16, host_bandwidth_bytes_s=bandwidth)
        assert lat.block_bytes == 16 * 131_072
        rate = bandwidth or gpu.pcie_bandwidth_bytes_s
        assert lat.step_cost(loaded).transfer_s == 3 * 16 * 131_072 / rate
        assert lat.step_latency_s(loaded) - lat.step_latency_s(plan) == pytest.approx(3 * 16 * 131_072 / rate)


SCENARIO = """\
name: offload
model: llama-3.1-8b
gpu: h200-141gb
tensor_parallel: 2
allocators: [paged, contiguous-max]
block_size: 16
kv_offload: {size_gib: 64, bandwidth_gb_s: 25}
workload: {trace: bundled:azure-conv, num_requests: 10}
"""


def test_the_deployment_sizes_the_tier_per_replica(tmp_path: Path) -> None:
    """vllm/v1/kv_offload/cpu/spec.py: cpu_bytes_to_use // (block bytes × world size). At TP 2 a
    rank holds 4 of the 8 KV heads: 1 MiB a block, 2 MiB a replica's block, 32,768 in 64 GiB."""
    path = tmp_path / "offload.yaml"
    path.write_text(SCENARIO)
    scenario, base = load_scenario(path)
    with pytest.warns(KvplanWarning, match="allocator paged only; contiguous-max runs without it"):
        dep = build_deployment(scenario, base)
    alloc = dep.make_allocator("paged")
    assert isinstance(alloc, PagedAllocator)
    assert dep.capacity.block_bytes == 1 << 20
    assert alloc.offload_blocks == 64 * GIB // (2 << 20) == 32_768
    assert dep.latency.rates.pcie_bytes_s == 25e9  # type: ignore[attr-defined]
    assert not hasattr(dep.make_allocator("contiguous-max"), "offload_blocks")


def simulate_cli(capsys, *args: object) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    capsys.readouterr()
    rc = main(["simulate", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_tier_off_changes_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The bundled shared-prefix scenario, without the key and with a tier of 0 GiB: the same
    files, byte for byte (run.json records the scenario, key included)."""
    outs = []
    for name, extra in (("none", []), ("zero", ["--set", "kv_offload.size_gib=0"])):
        out = tmp_path / name
        rc, _, err = simulate_cli(capsys, ROOT / "scenarios/shared-prefix.yaml", "--num-requests", 300,
                                  "--out", out, "--quiet", "--no-plots", *extra)
        assert rc == 0, err
        outs.append(out)
    for f in ("requests.csv", "steps.csv", "summary.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    runs = [json.loads((o / "run.json").read_text()) for o in outs]
    assert runs[0]["scenario"]["kv_offload"] is None
    assert runs[1]["scenario"]["kv_offload"] == {"size_gib": 0.0, "bandwidth_gb_s": None}


@pytest.mark.parametrize("sets, expected", [
    (["kv_offload.size_gib=-1"], "kv_offload.size_gib: Input should be greater than or equal to 0"),
    (["engine=sglang", "allocators=[paged]", "kv_offload.size_gib=64"],
     "kv_offload is modelled for vLLM engines (vllm-v1, vllm-v0), not sglang"),
    (["engine=vllm-v0", "kv_offload.size_gib=64"],
     "kv_offload needs enable_prefix_caching: true (its blocks are the prefix cache's; vllm-v0 "
     "defaults it off)"),
])
def test_bad_kv_offload_is_a_one_line_error(  # type: ignore[no-untyped-def]
        tmp_path: Path, capsys, sets, expected) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("kv_offload: {size_gib: 64, bandwidth_gb_s: 25}\n", ""))
    args = [a for s in sets for a in ("--set", s)]
    rc, out, err = simulate_cli(capsys, path, "--out", tmp_path / "o", "--quiet", "--no-plots", *args)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.startswith("kvplan: error: ") and err.count("\n") == 1, err
    assert expected in err, err
