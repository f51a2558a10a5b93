"""Deployments vLLM would refuse to start: refused with vLLM's reason and a remedy that works,
simulated anyway under ``allow_refused``, failed rows in a capacity sweep; and the warnings."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity.sweep import read_capacity_scenario, resolve_points
from simulator.cli import main
from simulator.config.deployment import Deployment, build_deployment
from simulator.errors import KvplanError, KvplanWarning
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.kv.sizing import kv_capacity
from simulator.config.refusals import VLLM_BLOCK_SIZES, check_block_size
from simulator.config.scenario import parse_scenario

WORKLOAD: dict[str, Any] = {"rate": "inf", "num_requests": 4,
                            "prompt_tokens": {"dist": "fixed", "value": 32},
                            "output_tokens": {"dist": "fixed", "value": 4}}
# Llama-3.1-70B at TP 2 on an H100 with the model's own window (131,072): 27,312 KV tokens with
# 256 sequences and 8192 batched tokens (`kvplan size`'s defaults; the activation peak they set):
# 0.9 × 85,045,477,376 bytes (the H100's total as the driver reports it) − 65.71 GiB of weights
# − 0.91 GiB of activations − 0.5 GiB non-torch = 4.17 GiB, 1,707 blocks of 16 tokens at
# 163,840 bytes a token. vLLM's start-up check and estimate count all 1,707 blocks; V1's
# scheduler hands out 1,706 of them (block 0 is its null block).
NUM_BLOCKS = 1_707
ESTIMATE = NUM_BLOCKS * 16  # 27,312: vLLM's estimated maximum model length
REFUSED: dict[str, Any] = {"model": "llama-3.1-70b", "gpu": "h100", "tensor_parallel": 2,
                           "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                           "latency": {"model": "constant", "step_s": 0.01}, "workload": WORKLOAD}


def deploy(**changes: Any) -> Deployment:
    return build_deployment(parse_scenario({**REFUSED, **changes}, "s.yaml"), Path("."), where="s.yaml")


def refusal(**changes: Any) -> str:
    with pytest.raises(KvplanError) as err:
        deploy(**changes)
    return str(err.value)


def quietly(**changes: Any) -> Deployment:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KvplanWarning)
        return deploy(**changes)


# --- KV memory below one max_model_len request (vLLM's check_enough_kv_cache_memory) ------------


def test_kv_that_cannot_hold_one_request_is_refused_with_vllms_estimate() -> None:
    cap = kv_capacity(get_model("llama-3.1-70b"), get_gpu("h100"), tp=2)
    assert cap.capacity_tokens == ESTIMATE == 27_312 < 131_072
    message = refusal()
    assert message.startswith("s.yaml: vLLM would refuse to start this deployment: one request of"
                              " max_model_len 131,072 tokens")
    assert "the estimated maximum model length is 27312" in message
    assert "vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory" in message
    assert "lower max_model_len to 27,312" in message
    assert "raise tensor_parallel to 4" in message
    assert "allow_refused: true" in message
    assert "--tp" not in message and "\n" not in message


def test_every_remedy_it_names_makes_vllm_start() -> None:
    # vLLM's estimate is the longest window that fits: it and the TP it names both start (the
    # scheduler's pool is one block short of it: vLLM V1's null block) ...
    assert deploy(max_model_len=ESTIMATE).capacity_tokens == ESTIMATE - 16  # the null block
    assert deploy(tensor_parallel=4).capacity_tokens >= 131_072
    # ... and one token more than the estimate does not.
    assert "estimated maximum model length is 27312" in refusal(max_model_len=ESTIMATE + 1)
    # A gap small enough for gpu_memory_utilization: the utilization it names starts. At 0.89
    # the KV memory is 0.89 × 85,045,477,376 − 72,063,655,936 bytes (weights, activations,
    # non-torch) = 3.38 GiB: 1,383 bf16 blocks (22,128 tokens) or 2,767 fp8 ones (44,272), so
    # fp8 holds the 40,000 tokens and bf16 needs 0.93 (2,500 blocks).
    message = refusal(max_model_len=40_000, gpu_memory_utilization=0.89)
    assert "set kv_cache_dtype: fp8" in message
    utilization = float(message.split("raise gpu_memory_utilization to ")[1][:4])
    assert utilization == 0.93
    assert deploy(max_model_len=40_000, gpu_memory_utilization=utilization)
    assert deploy(max_model_len=40_000, gpu_memory_utilization=0.89, kv_cache_dtype="fp8")
    with pytest.raises(KvplanError):
        deploy(max_model_len=40_000, gpu_memory_utilization=utilization - 0.01)


def test_allow_refused_simulates_it_and_says_so() -> None:
    with pytest.warns(KvplanWarning, match="vLLM would refuse to start this deployment"):
        dep = deploy(allow_refused=True)
    assert dep.capacity_tokens == (NUM_BLOCKS - 1) * 16  # vLLM's null block
    assert dep.warnings and "simulated anyway" in dep.warnings[0]
    assert dep.warnings[0] in dep.describe()["notes"]


def test_sliding_window_model_is_warned_not_refused() -> None:
    # Gemma 3 sized as full attention holds 42,368 tokens on an H100; vLLM sizes its 52 sliding
    # layers by their window, so it may start: with the hybrid manager off (and every layer
    # sized as full), a warning, not a refusal.
    with pytest.warns(KvplanWarning, match="sliding-window layers"):
        dep = deploy(model="gemma-3-27b", tensor_parallel=1, disable_hybrid_kv_cache_manager=True)
    assert dep.capacity_tokens < dep.scheduler_config.max_model_len == 131_072


def test_hybrid_manager_sizes_one_request_by_its_groups() -> None:
    # With the hybrid manager (the default) the start-up check sums each group's most blocks:
    # Gemma 3's sliding groups hold only a window (1,024) plus a step's tokens, so one 131,072-token
    # request fits on one H100 and nothing is said.
    with warnings.catch_warnings():
        warnings.simplefilter("error", KvplanWarning)
        dep = deploy(model="gemma-3-27b", tensor_parallel=1)
    assert dep.scheduler_config.max_model_len == 131_072


# --- the window, block sizes, num_gpu_blocks_override -------------------------------------------


def test_max_model_len_beyond_the_window_is_refused() -> None:
    message = refusal(tensor_parallel=8, max_model_len=131_073)
    assert "greater than Llama-3.1-70B's window of 131,072 tokens" in message
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in message
    assert "vllm/config/model.py _get_and_verify_max_len" in message
    assert deploy(tensor_parallel=8, max_model_len=131_072).scheduler_config.max_model_len == 131_072


def test_block_sizes_outside_vllms_choices_are_refused() -> None:
    refused = [size for size in range(1, 513) if check_block_size(size) is not None]
    assert sorted(set(range(1, 513)) - set(refused)) == list(VLLM_BLOCK_SIZES)
    message = refusal(max_model_len=8192, block_size=24)
    assert "accepts 1, 8, 16, 32, 64, 128, 256" in message and "use block_size 16" in message
    assert "vllm/config/cache.py BlockSize" in message


@pytest.mark.parametrize(("block_size", "warned"), [(1, True), (8, True), (16, False), (256, False)])
def test_block_sizes_flash_attention_does_not_take_are_warned(block_size: int, warned: bool) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dep = deploy(max_model_len=8192, block_size=block_size)
    said = [str(w.message) for w in caught if issubclass(w.category, KvplanWarning)]
    assert bool(said) == warned == bool(dep.warnings)
    if warned:
        assert "multiples of 16" in said[0] and "flash_attn.py" in said[0]


def test_num_gpu_blocks_override_larger_than_the_gpu_is_refused() -> None:
    cap = quietly(max_model_len=8192).capacity
    room_bytes = (get_gpu("h100").total_memory_bytes - cap.weight_bytes - cap.activation_bytes
                  - cap.non_torch_bytes)
    most = room_bytes // cap.block_bytes
    message = refusal(max_model_len=8192, num_gpu_blocks_override=most + 1)
    assert f"lower num_gpu_blocks_override to {most:,} or less" in message
    assert "CUDA out of memory" in message and "may_override_num_blocks" in message
    with pytest.warns(KvplanWarning, match="fit only in the memory it holds back"):
        assert deploy(max_model_len=8192, num_gpu_blocks_override=most).num_blocks == most
    assert deploy(max_model_len=8192, num_gpu_blocks_override=cap.num_blocks).warnings == ()


def test_a_small_override_pool_is_not_a_refusal() -> None:
    # vLLM checks the KV *memory* against max_model_len, then takes the override as given:
    # a pool smaller than one request starts (the fidelity scenarios rely on it).
    dep = deploy(max_model_len=8192, num_gpu_blocks_override=64)
    assert dep.capacity_tokens == (64 - 1) * 16 < 8192 and dep.warnings == ()  # vLLM's null block


# --- the seams: CLI, capacity sweeps ------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["simulate", str(path), "--quiet", "--no-plots", *args])
    return rc, capsys.readouterr().err


def test_simulate_refuses_in_one_line_and_goes_on_when_asked(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(REFUSED))
    rc, err = run(capsys, path, "--out", str(tmp_path / "a"))
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"kvplan: error: {path}: vLLM would refuse to start this deployment")
    assert not (tmp_path / "a" / "summary.json").exists()
    rc, err = run(capsys, path, "--out", str(tmp_path / "b"), "--set", "allow_refused=true")
    assert rc == 0 and err.startswith("kvplan: warning: ") and "Traceback" not in err
    assert (tmp_path / "b" / "summary.json").exists()


def test_capacity_sweep_keeps_a_refused_point_as_a_failed_row(tmp_path: Path) -> None:
    data = {**REFUSED, "slo": {"ttft_p99_s": 1.0},
            "sweep": {"max_model_len": [8192, 131_072], "block_size": [16, 24]}}
    path = tmp_path / "cap.yaml"
    path.write_text(yaml.safe_dump(data))
    points = resolve_points(read_capacity_scenario(path))
    failed = {(p.knobs["max_model_len"], p.knobs["block_size"]): p.error for p in points}
    assert failed[(8192, 16)] is None
    assert "estimated maximum model length is 27312" in str(failed[(131_072, 16)])
    assert "use block_size 16" in str(failed[(8192, 24)])
    with pytest.warns(KvplanWarning, match="simulated anyway"):
        points = resolve_points(read_capacity_scenario(path, {"allow_refused": True}))
    assert [p.error for p in points] == [None] * 4


def test_refusal_math_matches_vllms_block_rounding() -> None:
    # vLLM needs ceil(max_model_len / block_size) whole blocks: at block 256 a window one token
    # past a block boundary needs one block more than the token count suggests.
    dep = quietly(max_model_len=8192, block_size=256)
    fits = dep.capacity.num_blocks * 256
    assert deploy(max_model_len=fits, block_size=256)
    message = refusal(max_model_len=fits + 1, block_size=256)
    assert f"{math.ceil((fits + 1) / 256) * dep.capacity.block_bytes / 2**30:.2f} GiB" in message


def test_hybrid_model_too_long_is_refused_with_vllms_estimate() -> None:
    # gpt-oss-120b on one H100 at 0.82: its 18 full-attention layers need every token of a
    # 131,072-token request; the longest length that fits is the largest L whose grouped blocks
    # fit, found by the binary search vLLM's estimate_max_model_len runs.
    from simulator.config.refusals import one_request_kv_bytes

    message = refusal(model="gpt-oss-120b", gpu="h100-80gb", tensor_parallel=1,
                      max_model_len=131_072, gpu_memory_utilization=0.82)
    fits = int(message.split("estimated maximum model length is ")[1].split("'")[0])
    model, gpu = get_model("gpt-oss-120b"), get_gpu("h100-80gb")
    cap = kv_capacity(model, gpu, gpu_memory_utilization=0.82, max_model_len=131_072)
    assert cap.kv_groups is not None
    assert one_request_kv_bytes(cap, fits, 8192) <= cap.available_kv_bytes
    assert one_request_kv_bytes(cap, fits + 1, 8192) > cap.available_kv_bytes
    assert 0 < fits < 131_072
