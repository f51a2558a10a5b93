"""Published rows -> scenarios: model resolution, engine knobs, loads, and honest skips."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.errors import KvplanError
from simulator.commands.validate.setups import engine_knobs, group_setups, resolve_model
from simulator.commands.validate.table import PublishedRow

ROW = PublishedRow(
    row_id="r-1", source="s", source_title="t", source_url="https://example.org", engine="vllm",
    engine_version="0.10.1", model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB",
    tensor_parallel=1, num_gpus=1, weight_dtype="bf16", kv_cache_dtype="auto", input_tokens=1000,
    output_tokens=100, dataset="random", load="concurrency", load_value=8, num_prompts=None,
    metric="ttft", statistic="mean", unit="ms", value=100.0, notes="n")


def row(**changes: object) -> PublishedRow:
    return dataclasses.replace(ROW, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("hf_id", "name"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "Llama-3.1-8B-ModelOpt-FP8"),  # its own catalog entry
    ("nvidia/Llama-3.3-70B-Instruct-FP8", "Llama-3.3-70B"),
    ("amd/Llama-3.1-70B-Instruct-FP8-KV", "Llama-3.1-70B"),
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "Llama-3.1-8B-FP8"),
    ("deepseek-ai/DeepSeek-R1-0528", "DeepSeek-R1"),
])
def test_resolve_model(hf_id: str, name: str) -> None:
    assert resolve_model(hf_id) == name


def test_unknown_model_keeps_the_catalog_error() -> None:
    with pytest.raises(KvplanError, match="unknown model"):
        resolve_model("acme/Nonexistent-9B-FP8")


def test_engine_knobs_follow_vllm_defaults_by_gpu_and_entry_point() -> None:
    assert engine_knobs(row()).max_num_seqs == 1024  # H100, vllm serve
    assert engine_knobs(row()).max_num_batched_tokens == 8192
    assert engine_knobs(row(load="burst")).max_num_batched_tokens == 16384  # offline LLM class
    a100 = engine_knobs(row(gpu="A100-80GB"))
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    v0 = engine_knobs(row(engine_version="0.6.0"))
    assert v0.max_num_seqs == 256 and not v0.enable_chunked_prefill
    # TensorRT-LLM (and NIM, served through it) run on kvplan's trtllm engine, paged blocks,
    # perf-overview.md's KV fraction 0.95 and its 2048 / 8192 batch limits with chunked context
    for engine in ("tensorrt-llm", "nim"):
        trt = engine_knobs(row(engine=engine))
        assert (trt.engine, trt.gpu_memory_utilization) == ("trtllm", 0.95), engine
        assert (trt.max_num_seqs, trt.max_num_batched_tokens, trt.enable_chunked_prefill) == (2048, 8192, True)
        (setup,) = group_setups([row(engine=engine)])
        assert setup.scenario is not None
        assert (setup.scenario["engine"], setup.scenario["allocators"]) == ("trtllm", ["paged"]), engine
    assert engine_knobs(row()).engine == "vllm-v1"
    (setup,) = group_setups([row()])
    assert setup.scenario is not None and setup.scenario["allocators"] == ["paged"]


def test_rows_of_one_run_share_a_setup() -> None:
    setups = group_setups([row(), row(row_id="r-2", metric="itl"), row(row_id="r-3", load_value=16)])
    assert [len(s.rows) for s in setups] == [2, 1]
    s = setups[0].scenario
    assert s is not None and s["model"] == "Llama-3.1-8B" and s["quantization"] == "none"
    assert s["max_model_len"] == 1100
    # no request count stated: steady state, 8 waves with the first one left out
    assert s["workload"]["concurrency"] == 8 and s["workload"]["num_requests"] == 64
    assert s["workload"]["warmup_requests"] == 8


def test_a_stated_short_run_is_simulated_whole() -> None:
    (s,) = group_setups([row(num_prompts=40)])
    assert s.scenario is not None
    assert s.scenario["workload"]["num_requests"] == 40 and "warmup_requests" not in s.scenario["workload"]


def test_loads() -> None:
    burst, batch, rate = group_setups([
        row(row_id="b", load="burst", load_value=None, num_prompts=500),
        row(row_id="s", load="batch", load_value=8),
        row(row_id="p", load="rate", load_value=4.0),
    ])
    assert burst.scenario["workload"] == {**burst.scenario["workload"], "rate": math.inf, "num_requests": 500}
    assert batch.scenario["workload"]["num_requests"] == 8 and batch.scenario["max_num_seqs"] >= 8
    assert rate.scenario["workload"]["arrival"] == {"process": "poisson"}
    assert rate.scenario["workload"]["rate"] == 4.0


def test_data_parallel_splits_the_load_evenly() -> None:
    (s,) = group_setups([row(num_gpus=4, load_value=32)])
    assert s.num_replicas == 4 and s.scenario["workload"]["concurrency"] == 8
    (odd,) = group_setups([row(num_gpus=4, load_value=30)])
    assert odd.scenario is None and "split evenly" in (odd.skip_reason or "")


@pytest.mark.parametrize(("changes", "reason"), [
    ({"input_tokens": None, "dataset": "sharegpt"}, "lengths not stated"),
    ({"gpu": "L40S"}, "GPU 'L40S' not in the catalog"),
    ({"model": "acme/Nonexistent-9B"}, "model not in the catalog"),
    ({"load": "rate", "load_value": None}, "rate of the run is not stated"),
    ({"weight_dtype": "nf4"}, "weight dtype 'nf4' not modelled"),
])
def test_rows_that_cannot_be_simulated_say_why(changes: dict[str, object], reason: str) -> None:
    (s,) = group_setups([row(**changes)])
    assert s.scenario is None and reason in (s.skip_reason or "")


def test_modelopt_fp8_checkpoints_bring_an_fp8_kv_cache() -> None:
    (s,) = group_setups([row(model="nvidia/Llama-3.1-8B-Instruct-FP8", weight_dtype="fp8",
                             engine="tensorrt-llm", load="burst", load_value=None)])
    assert s.scenario is not None and s.scenario["kv_cache_dtype"] == "fp8"
    assert s.scenario["quantization"] == "fp8" and s.notes
