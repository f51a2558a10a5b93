"""TensorRT-LLM's defaults per release, its KV pool sizing, its scenario keys, and a ``simulate
--set engine=trtllm`` run (simulator/scheduler/trtllm.py, simulator/config/deployment.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.config.deployment import build_deployment, engine_defaults
from simulator.config.scenario import parse_scenario
from simulator.errors import KvplanError, ScenarioError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import load_model
from simulator.kv.sizing import SCENARIO_KEYS, kv_capacity
from simulator.scheduler.trtllm import (TRTLLM_DEFAULTS, TRTLLM_NEWEST, format_trtllm_log,
                                        trtllm_capacity, trtllm_defaults, trtllm_version)

WORKLOAD = {"arrival": {"process": "poisson", "rate": 20.0}, "num_requests": 60,
            "prompt_tokens": {"dist": "fixed", "value": 600}, "output_tokens": {"dist": "fixed", "value": 60}}


def scenario(**keys: object):  # type: ignore[no-untyped-def]
    data = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "engine": "trtllm", "max_model_len": 8192,
            "workload": WORKLOAD, **keys}
    return parse_scenario(data, "test")


# ----------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("version", [None, "1.0", "1.2", "1.2.1", "v1.0.0", "1.2.0rc6", 1.2])
def test_trtllm_serve_defaults(version):
    """trtllm-serve's defaults (tensorrt_llm/commands/serve.py; BuildConfig; KvCacheConfig;
    SchedulerConfig): max_batch_size 2048, max_num_tokens 8192, tokens_per_block 32,
    free_gpu_memory_fraction 0.9, block reuse on, chunked context off, GUARANTEED_NO_EVICT; the
    same on every GPU."""
    for gpu in ("h100-80gb", "a100-40gb"):
        s = scenario(gpu=gpu, **({} if version is None else {"engine_version": version}))
        knobs = engine_defaults(s, get_gpu(gpu), 8192)
        assert (knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.block_size) == (2048, 8192, 32)
        assert knobs.gpu_memory_utilization == 0.9 and knobs.enable_prefix_caching
        assert not knobs.enable_chunked_prefill
        assert knobs.engine_knobs == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}


def test_versions_and_the_newest():
    assert set(TRTLLM_DEFAULTS) == {"1.0", "1.2"} and TRTLLM_NEWEST == "1.2"
    assert trtllm_defaults() is TRTLLM_DEFAULTS["1.2"]
    assert trtllm_version("1.2.1") == "1.2" and trtllm_version("V1.0.0") == "1.0"
    with pytest.raises(ValueError, match="1.0, 1.2"):
        trtllm_version("0.21")


def test_scenario_keys_set_what_they_name():
    s = scenario(max_num_seqs=64, max_num_batched_tokens=2048, block_size=64, gpu_memory_utilization=0.8,
                 enable_chunked_prefill=True, enable_prefix_caching=False,
                 capacity_scheduler_policy="max_utilization")
    knobs = engine_defaults(s, get_gpu("h100-80gb"), 8192)
    assert (knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.block_size) == (64, 2048, 64)
    assert knobs.gpu_memory_utilization == 0.8 and not knobs.enable_prefix_caching
    assert knobs.enable_chunked_prefill
    assert knobs.engine_knobs == {"capacity_scheduler_policy": "MAX_UTILIZATION"}


def test_other_engines_keep_their_chunked_prefill_default():
    for engine in ("vllm-v1", "sglang"):
        knobs = engine_defaults(scenario(engine=engine), get_gpu("h100-80gb"), 8192)
        assert knobs.enable_chunked_prefill, engine
    # vLLM V0 chunks only a context above 32K (arg_utils.py _set_default_args_v0)
    assert not engine_defaults(scenario(engine="vllm-v0"), get_gpu("h100-80gb"), 8192).enable_chunked_prefill


@pytest.mark.parametrize(("keys", "message"), [
    ({"engine": "vllm-v1", "engine_version": "1.2"}, "engine_version is a knob of engine trtllm"),
    ({"engine": "sglang", "capacity_scheduler_policy": "MAX_UTILIZATION"},
     "capacity_scheduler_policy is a knob of engine trtllm"),
    ({"engine_version": "0.9"}, "kvplan knows TensorRT-LLM 1.0, 1.2"),
    ({"capacity_scheduler_policy": "STATIC_BATCH"}, "capacity_scheduler_policy"),
    ({"preemption_mode": "swap"}, "engine trtllm preempts by recompute only"),
    ({"allocators": ["contiguous-max"]}, "engine trtllm runs its own block pool"),
    ({"allocators": ["paged", "contiguous-max"]}, "allocators must be [paged]"),
    ({"kv_offload": {"size_gib": 8}}, "not trtllm"),
    ({"long_prefill_token_threshold": 8}, "a knob of engine vllm-v1"),
])
def test_scenario_errors(keys, message):
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scenario(**keys)


def test_an_engine_list_runs_trtllm_on_its_own_pool():
    s = scenario(engine=["vllm-v0", "trtllm"], allocators=["paged", "contiguous-max"])
    assert s.allocators_of("trtllm") == ("paged",)
    assert s.allocators_of("vllm-v0") == ("paged", "contiguous-max")


# ----------------------------------------------------------------------------- KV pool
def test_the_pool_is_a_fraction_of_the_memory_left_after_the_model():
    """_util.py ``_cal_max_memory``: (total − peak) × free_gpu_memory_fraction, then
    ``max_tokens // bytes per token`` and ceil(max_tokens / tokens_per_block) blocks
    (resource_manager.py ``calculate_max_num_blocks``). The peak is weights + activations of
    ``max_num_tokens`` + non-torch memory: kvplan's kv_capacity at utilization 1. Against vLLM's
    utilization 0.9 of all HBM the pool is larger by 0.1 × the peak."""
    dep = build_deployment(scenario(), Path("."))
    model, gpu = load_model("llama-3.1-8b"), get_gpu("h100-80gb")
    whole = kv_capacity(model, gpu, block_size=32, gpu_memory_utilization=1.0,
                        max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=8192,
                        knobs=SCENARIO_KEYS, hybrid_kv_cache_manager=False)
    free = whole.budget_bytes - whole.weight_bytes - whole.activation_bytes - whole.non_torch_bytes
    assert free == whole.available_kv_bytes
    max_tokens = int(free * 0.9) // whole.bytes_per_token
    assert dep.num_blocks == math.ceil(max_tokens / 32)
    assert dep.capacity_tokens == dep.num_blocks * 32 and dep.scheduler_config.block_size == 32
    vllm = kv_capacity(model, gpu, block_size=32, gpu_memory_utilization=0.9, max_num_batched_tokens=8192,
                       max_num_seqs=1, max_model_len=8192, knobs=SCENARIO_KEYS, hybrid_kv_cache_manager=False)
    extra = 0.1 * (whole.weight_bytes + whole.activation_bytes + whole.non_torch_bytes)
    assert abs((dep.num_blocks - vllm.num_blocks) * vllm.block_bytes - extra) < 2 * vllm.block_bytes
    log = format_trtllm_log(dep.capacity, 0.9)
    assert f"blocks_in_primary_pool={dep.num_blocks:,}" in log and "fraction is set 0.9" in log
    described = dep.describe()
    assert described["engine"] == "trtllm" and described["engine_version"] == "1.2"
    assert described["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"
    assert any("free_gpu_memory_fraction 0.9" in note for note in described["notes"])


def test_a_fraction_of_one_is_refused():
    """KVCacheManager.calculate_max_num_blocks asserts free_gpu_memory_fraction < 1.0."""
    cap = kv_capacity(load_model("llama-3.1-8b"), get_gpu("h100-80gb"), block_size=32,
                      gpu_memory_utilization=1.0, knobs=SCENARIO_KEYS)
    with pytest.raises(KvplanError, match=r"in \(0, 1\)"):
        trtllm_capacity(cap, 1.0)


def test_a_window_beyond_the_pool_is_lowered_not_refused(recwarn):
    """vLLM refuses to start when one max_model_len request does not fit; TensorRT-LLM lowers
    max_seq_len and the attention window to the pool (resource_manager.py
    ``get_max_atten_window_upper_bound``). 8B on a 24 GiB L4 at its 131,072-token window."""
    dep = build_deployment(scenario(gpu="l4", max_model_len=None), Path("."))
    fits = dep.num_blocks * 32
    assert fits < 131072 and dep.scheduler_config.max_model_len == fits
    assert any("TensorRT-LLM lowers max_seq_len" in w for w in dep.warnings)


# ----------------------------------------------------------------------------- simulate
def test_simulate_set_engine_trtllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kvplan simulate plan.yaml --set engine=trtllm`` of a vLLM scenario: runs TensorRT-LLM's
    scheduler on its block pool and records its knobs."""
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps({"name": "plan", "model": "llama-3.1-8b", "gpu": "h100-80gb",
                                "max_model_len": 4096, "workload": WORKLOAD}), encoding="utf-8")
    out = tmp_path / "run"
    for policy in ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION"):
        assert main(["simulate", str(path), "--set", "engine=trtllm", "--set",
                     f"capacity_scheduler_policy={policy}", "--out", str(out), "--replace"]) == 0
        run = json.loads((out / "run.json").read_text(encoding="utf-8"))
        dep = run["deployment"]
        assert dep["engine"] == "trtllm" and dep["block_size"] == 32 and dep["max_num_seqs"] == 2048
        assert dep["max_num_batched_tokens"] == 8192 and dep["capacity_scheduler_policy"] == policy
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert summary["paged"]["completed"] == 60 and summary["paged"]["num_preemptions"] == 0
    assert "trtllm: block 32" in capsys.readouterr().out


def test_a_batch_above_the_token_budget_runs_at_most_the_budget(recwarn):
    """TensorRT-LLM accepts max_batch_size above max_num_tokens (InferenceX's DeepSeek-R1 scripts
    run 2048 / 1152): its micro-batch stops at max_num_tokens, so no more requests than that
    generate in a step. kvplan runs at most that many at once, and says so."""
    dep = build_deployment(scenario(max_num_seqs=2048, max_num_batched_tokens=1152), Path("."))
    assert dep.scheduler_config.max_num_seqs == 1152
    assert any("at most 1152 requests generate in a step" in w for w in dep.warnings)
    assert any("at most 1152 requests generate" in str(w.message) for w in recwarn)


@pytest.mark.parametrize("engine", ["trtllm", "sglang", "vllm-v0"])
def test_linear_attention_state_is_sized_for_vllm_v1_only(engine):
    with pytest.raises(KvplanError, match=f"linear-attention layers.*not {engine}'s own state pool"):
        build_deployment(scenario(engine=engine, model="qwen3-next-80b-a3b", gpu="h200-141gb",
                                  tensor_parallel=4), Path("."))
