"""`engine:` in scenarios: which engine runs, with which defaults, and what each refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.config.deployment import build_deployment, engine_defaults
from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.config.scenario import load_scenario, parse_scenario
from simulator.kv.models import load_model
from simulator.scheduler.v0 import V0Scheduler

BASE = {
    "model": "llama-3.1-8b",
    "gpu": "h100",
    "max_model_len": 4096,
    "latency": {"model": "constant", "step_s": 0.01},
    "workload": {"arrival": {"process": "poisson", "rate": 50.0}, "num_requests": 40, "prompt_tokens": {"dist": "fixed", "value": 300},
                 "output_tokens": {"dist": "fixed", "value": 20}},
}


def scenario(**over):  # type: ignore[no-untyped-def]
    return parse_scenario({**BASE, **over}, "s.yaml")


def error(**over) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(KvplanError) as err:
        scenario(**over)
    return str(err.value)


def test_the_default_engine_is_vllm_v1_and_v0_is_vllm_v0_s_scheduler() -> None:
    assert scenario().engine == "vllm-v1"
    dep = build_deployment(scenario(engine="vllm-v0"), Path("."))
    sched, _ = dep.replica_factory("paged")(0)
    assert type(sched) is V0Scheduler
    assert dep.scheduler_config.engine == "vllm-v0"


def test_v1_defaults_follow_vllm_serve_by_gpu() -> None:
    # vllm/engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER: >= 70 GiB and not A100
    # -> 1024 seqs / 8192 tokens, else 256 / 2048; prefix caching on in V1
    h100 = engine_defaults(scenario(), get_gpu("h100"), 4096)
    assert (h100.max_num_seqs, h100.max_num_batched_tokens, h100.enable_prefix_caching) == (1024, 8192, True)
    a100 = engine_defaults(scenario(gpu="a100-80gb"), get_gpu("a100-80gb"), 4096)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    l4 = engine_defaults(scenario(gpu="l4"), get_gpu("l4"), 4096)
    assert (l4.max_num_seqs, l4.max_num_batched_tokens) == (256, 2048)
    given = engine_defaults(scenario(max_num_seqs=64, enable_prefix_caching=False), get_gpu("h100"), 4096)
    assert (given.max_num_seqs, given.max_num_batched_tokens, given.enable_prefix_caching) == (64, 8192, False)
    # without chunked prefill the budget holds a whole prompt
    whole = engine_defaults(scenario(enable_chunked_prefill=False), get_gpu("a100-80gb"), 32768)
    assert whole.max_num_batched_tokens == 32768


def test_v1_cuts_an_unset_max_num_seqs_to_the_token_budget() -> None:
    # arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args: with max_num_seqs unset,
    # min(default, max_num_batched_tokens) -- so `vllm serve --max-num-batched-tokens 512` starts
    # on an H100 with 512 sequences; a max_num_seqs given above the budget is still refused
    small = engine_defaults(scenario(max_num_batched_tokens=512), get_gpu("h100"), 4096)
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (512, 512)
    dep = build_deployment(scenario(max_num_batched_tokens=512), Path("."))
    assert dep.scheduler_config.max_num_seqs == 512
    a100 = engine_defaults(scenario(gpu="a100-80gb", max_num_batched_tokens=128), get_gpu("a100-80gb"), 4096)
    assert a100.max_num_seqs == 128
    with pytest.raises(KvplanError, match=r"max_num_batched_tokens \(512\) must be >= max_num_seqs \(1024\)"):
        build_deployment(scenario(max_num_batched_tokens=512, max_num_seqs=1024), Path("."))


def test_v0_defaults_are_vllm_0_10_2_s() -> None:
    # vllm/engine/arg_utils.py _set_default_args_v0 and vllm/config/scheduler.py __post_init__
    # (vLLM 0.10.2): chunked prefill only above a 32K context, 2048 tokens with it, else
    # max(max_model_len, 2048); 256 sequences; no prefix caching; block 16
    v0 = engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100"), 4096)
    assert (v0.max_num_seqs, v0.max_num_batched_tokens, v0.block_size, v0.enable_prefix_caching,
            v0.enable_chunked_prefill) == (256, 4096, 16, False, False)
    short = engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100"), 1024)
    assert (short.max_num_batched_tokens, short.enable_chunked_prefill) == (2048, False)
    long = engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100"), 32769)
    assert (long.max_num_batched_tokens, long.enable_chunked_prefill) == (2048, True)
    edge = engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100"), 32768)
    assert (edge.max_num_batched_tokens, edge.enable_chunked_prefill) == (32768, False)
    mla = engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100"), 65536, load_model("deepseek-v3"))
    assert (mla.max_num_batched_tokens, mla.enable_chunked_prefill) == (65536, False)
    window = engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100"), 65536, load_model("gpt-oss-20b"))
    assert not window.enable_chunked_prefill
    given = engine_defaults(scenario(engine="vllm-v0", enable_chunked_prefill=True, max_num_seqs=8),
                            get_gpu("h100"), 200)
    assert (given.max_num_batched_tokens, given.enable_chunked_prefill) == (1600, True)  # 8 × 200


def test_a_knob_of_another_engine_is_an_error() -> None:
    assert "schedule_policy is a knob of engine sglang; this scenario's engine is vllm-v1" in error(
        schedule_policy="lpm")
    assert "long_prefill_token_threshold is a knob of engine vllm-v1" in error(
        engine="vllm-v0", long_prefill_token_threshold=512)
    assert "preempts by recompute only" in error(preemption_mode="swap")
    assert "allocators must be [paged]" in error(engine="sglang", allocators=["paged", "max"])
    assert "list it" in error(engine=["vllm-v1", "sglang"], allocators=["max"])
    assert "engine" in error(engine="vllm-v2") and "'vllm-v1'" in error(engine="vllm-v2")
    assert "listed twice" in error(engine=["vllm-v1", "vllm-v1"])


def test_engine_specific_knobs_reach_the_scheduler() -> None:
    dep = build_deployment(scenario(long_prefill_token_threshold=256, max_num_partial_prefills=2,
                                    scheduler_reserve_full_isl=False), Path("."))
    cfg = dep.scheduler_config
    assert (cfg.long_prefill_token_threshold, cfg.max_num_partial_prefills,
            cfg.scheduler_reserve_full_isl) == (256, 2, False)


def test_several_engines_build_only_for_simulate() -> None:
    s = scenario(engine=["vllm-v1", "vllm-v0"])
    assert s.engines == ("vllm-v1", "vllm-v0")
    with pytest.raises(KvplanError, match="only for `simulate`"):
        build_deployment(s, Path("."))
    assert s.for_engine("vllm-v0").engine == "vllm-v0"
    assert scenario(engine=["sglang"]).engine == "sglang"  # a list of one is that engine


def test_simulate_runs_every_engine_side_by_side(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({**BASE, "engine": ["vllm-v1", "vllm-v0", "sglang"],
                                "allocators": ["paged", "contiguous-max"]}))
    out = tmp_path / "out"
    assert main(["simulate", str(path), "--out", str(out), "--no-plots", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    # SGLang runs its own token pool only
    assert list(summary) == ["vllm-v1/paged", "vllm-v1/contiguous-max", "vllm-v0/paged",
                             "vllm-v0/contiguous-max", "sglang/paged"]
    for name, s in summary.items():
        assert s["completed"] + s["rejected"] == 40, name
    run = json.loads((out / "run.json").read_text())
    assert set(run["deployments"]) == {"vllm-v1", "vllm-v0", "sglang"}
    assert run["deployments"]["sglang"]["block_size"] == 1  # SGLang's page size
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) == 1 + 5 * 40


def test_set_engine_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(BASE))
    s, _ = load_scenario(path, {"engine": "sglang"})
    assert s.engine == "sglang"


def test_engine_is_a_capacity_sweep_knob_and_sglang_points_run_its_pool(tmp_path: Path) -> None:
    from simulator.commands.capacity.sweep import read_capacity_scenario, resolve_points

    path = tmp_path / "cap.yaml"
    path.write_text(json.dumps({**BASE, "allocators": ["paged", "contiguous-max"],
                                "slo": {"ttft_p99_s": 1.0},
                                "sweep": {"engine": ["vllm-v1", "vllm-v0", "sglang"]}}))
    points = resolve_points(read_capacity_scenario(path))
    assert [p.error for p in points] == [None, None, None]
    runs = {p.knobs["engine"]: (p.scenario.allocators, p.deployment.scheduler_config.engine)
            for p in points}
    assert runs == {"vllm-v1": (("paged", "contiguous-max"), "vllm-v1"),
                    "vllm-v0": (("paged", "contiguous-max"), "vllm-v0"),
                    "sglang": (("paged",), "sglang")}


def test_capacity_sweeps_a_scenario_that_lists_several_engines(tmp_path: Path) -> None:
    from simulator.commands.capacity.sweep import read_capacity_scenario, resolve_points

    path = tmp_path / "cap.yaml"
    path.write_text(json.dumps({**BASE, "engine": ["vllm-v1", "sglang"], "slo": {"ttft_p99_s": 1.0},
                                "sweep": {"block_size": [16, 32]}}))
    file = read_capacity_scenario(path)
    assert file.sweep == {"engine": ["vllm-v1", "sglang"], "block_size": [16, 32]}
    points = resolve_points(file)
    assert [(p.knobs["engine"], p.knobs["block_size"], p.error) for p in points] == [
        ("vllm-v1", 16, None), ("vllm-v1", 32, None), ("sglang", 16, None), ("sglang", 32, None)]
    assert {p.scenario.allocators for p in points} == {("paged",)}
