"""`calibrate`: the quick CPU sweep writes a profile the simulator reads; bad input is refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from backend.calibrate import Shape, SweepLimits, build_plan, estimate_sweep_s, match_gpu, sweep_shapes
from backend.cli import add_calibrate_parser
from simulator.errors import KvplanError
from simulator.kv.models import get_model
from simulator.kv.paged import PagedAllocator
from simulator.kv.sizing import resolve_kv_dtype
from simulator.latency.profile import FEATURES, ProfileLatency, check_profile_matches, features, read_profile
from simulator.scheduler.plan import StepPlan


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvplan")
    add_calibrate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", *argv])
    return args.func(args)


def decode_plan(num_seqs: int, context: int) -> StepPlan:
    return StepPlan(step_id=0, prefills=(), num_decode_seqs=num_seqs,
                    decode_context_tokens=num_seqs * context, decode_context_sq=float(num_seqs * context**2),
                    decode_max_context=context)


def test_quick_cpu_calibration_writes_a_profile_the_simulator_uses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profiles" / "cpu-tiny.yaml"
    assert run_cli("--model", "tiny", "--device", "cpu", "--out", str(out)) == 0  # quick: the CPU default
    captured = capsys.readouterr()
    printed = captured.out
    assert "MAPE train" in printed and f"wrote {out}" in printed and "(quick sweep)" in printed
    assert "load average" in printed
    # the estimate comes first, on stderr: the sweep's size and its predicted time
    assert "calibrate: building tiny (2 of 2 layers" in captured.err
    assert "sweep of 26 shapes × 4 runs: about" in captured.err

    profile = read_profile(out)
    tiny = get_model("tiny")
    assert (profile.model, profile.tensor_parallel, profile.block_size, profile.device, profile.gpu) == (
        "tiny", 1, 16, "cpu", None)
    assert profile.kv_cache_dtype == resolve_kv_dtype(tiny, "auto")
    check_profile_matches(profile, model=tiny.name, tensor_parallel=1,
                          kv_cache_dtype=resolve_kv_dtype(tiny, "auto"), gpu="H100-80GB")
    raw = profile.raw
    assert set(raw["versions"]) == {"kvplan", "torch", "triton", "python"} and raw["created"].endswith("Z")
    fit, sweep = raw["fit"], raw["sweep"]
    assert fit["num_samples"] + fit["num_heldout"] == len(sweep) == 26
    assert fit["num_samples"] >= 2 * len(FEATURES) and fit["num_heldout"] >= 6
    assert fit["sweep_size"] == "quick" and fit["wall_s"] > 0
    assert set(fit["machine_load"]) == {"stage", "load_1m_before", "load_1m_after", "num_cpus"}
    assert [s["heldout"] for s in sweep] == [i % 4 == 3 for i in range(len(sweep))]
    assert all(s["measured_s"] > 0 for s in sweep)
    assert {s["kind"] for s in sweep} == {"decode", "prefill", "mixed", "copy", "swap"}

    latency = ProfileLatency(profile, block_size=16)
    assert latency.step_latency_s(decode_plan(4, 100)) > 0
    assert latency.step_latency_s(decode_plan(64, 1000)) >= latency.step_latency_s(decode_plan(4, 100))


def test_quiet_layers_run_prints_nothing_and_records_the_layers(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    argv = ["--model", "tiny", "--quick", "--device", "cpu", "--layers", "1", "--quiet", "--out", str(out)]
    assert run_cli(*argv) == 0
    assert capsys.readouterr() == ("", "")  # no estimate, no bar, no summary
    assert read_profile(out).raw["layers"] == {"run": 1, "total": 2}


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "llama-9"], "unknown model 'llama-9'"),
    (["--model", "deepseek-v3", "--device", "cpu"], "DeepSeek-V3 uses MLA"),
    (["--model", "tiny", "--device", "cpu", "--tp", "3"], "--tp 3 does not divide"),
    (["--model", "tiny", "--device", "cpu", "--layers", "3"], "--layers must be in 1..2"),
    (["--model", "tiny", "--device", "tpu"], "unknown --device 'tpu'"),
    (["--model", "tiny", "--device", "cpu", "--kv-cache-dtype", "fp4"], "unknown KV cache dtype 'fp4'"),
    (["--model", "tiny", "--device", "cpu", "--kv-cache-dtype", "fp16"], "KV cache must be stored in"),
    (["--model", "tiny", "--device", "cpu", "--dtype", "int3"], "unknown --dtype 'int3'"),
])
def test_bad_input_is_a_kvplan_error(argv: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(KvplanError, match=message):
        run_cli(*argv, "--quick", "--out", str(tmp_path / "p.yaml"))
    assert not (tmp_path / "p.yaml").exists()


def test_cuda_requested_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KvplanError, match="no CUDA device: use --device cpu"):
        run_cli("--model", "tiny", "--device", "cuda", "--quick")


@pytest.mark.parametrize(("name", "gpu"), [
    ("NVIDIA H200", "H200-141GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("NVIDIA H100 NVL", None),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("AMD Instinct MI300X", "MI300X"),
    ("NVIDIA L40S", None), ("cpu", None),
])
def test_match_gpu(name: str, gpu: str | None) -> None:
    assert match_gpu(name) == gpu


@pytest.mark.parametrize("quick", [True, False])
def test_sweep_shapes_fit_the_limits_and_build_consistent_plans(quick: bool) -> None:
    limits = SweepLimits(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192)
    shapes = sweep_shapes(limits, quick=quick, block_size=16)
    assert shapes == sweep_shapes(limits, quick=quick, block_size=16)  # seeded
    alloc = PagedAllocator(max(s.num_blocks(16) for s in shapes), 16)
    for shape in shapes:
        plan, seqs = build_plan(shape, alloc)
        assert plan.details is not None and len(plan.details) == plan.batch_size <= limits.max_num_seqs
        assert plan.num_batched_tokens <= limits.max_num_batched_tokens
        assert plan.decode_max_context < limits.max_model_len
        assert plan.decode_context_tokens == sum(d.context_len for d in plan.details[len(plan.prefills):])
        for d in plan.details:
            assert d.context_len == d.position + d.num_tokens and len(d.slot_mapping) == d.num_tokens
        x = dict(zip(FEATURES, features(plan, 16)))
        assert x["prefill_tokens"] == shape.chunk_tokens
        assert x["decode_seqs"] == len(shape.decode_contexts)
        assert x["prefill_seqs"] == (1 if shape.chunk_tokens else 0)
        assert x["swap_tokens"] == 16 * (shape.num_swap_out_blocks + shape.num_swap_in_blocks)
        if shape.num_copies:
            assert len(plan.cow_copies) == shape.num_copies
            assert plan.num_copy_tokens == shape.num_copies * 8  # half a block each
        for seq in seqs:
            alloc.free(seq)
        alloc.check_invariants()
        assert alloc.num_free_blocks() == alloc.num_blocks


def test_full_and_quick_are_exclusive_and_default_to_the_device() -> None:
    parser = argparse.ArgumentParser(prog="kvplan")
    add_calibrate_parser(parser.add_subparsers(dest="command", required=True))
    assert parser.parse_args(["calibrate", "--model", "tiny"]).quick is None  # the device decides
    assert parser.parse_args(["calibrate", "--model", "tiny", "--full"]).quick is False
    assert parser.parse_args(["calibrate", "--model", "tiny", "--quick"]).quick is True
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--model", "tiny", "--quick", "--full"])


def test_estimate_interpolates_run_time_in_work_tokens() -> None:
    """Two shapes timed at 1 and 257 work tokens (0.1 s and 0.9 s a run) bound a line; a shape at
    129 tokens costs the midpoint. Four runs per shape."""
    light, mid, heavy = Shape("decode", "one", (10,)), Shape("prefill", "mid", chunk_tokens=129), \
        Shape("prefill", "big", chunk_tokens=257)
    assert (light.work_tokens, mid.work_tokens, heavy.work_tokens) == (1, 129, 257)
    assert estimate_sweep_s([light, mid, heavy], 0.1, 0.9, 4) == pytest.approx(4 * (0.1 + 0.5 + 0.9))
    assert estimate_sweep_s([light, light], 0.2, 0.2, 3) == pytest.approx(1.2)  # one size: no slope
    assert estimate_sweep_s([], 0.2, 0.4, 3) == 0.0


def test_quick_sweep_has_room_for_a_fit_and_a_held_out_set() -> None:
    limits = SweepLimits(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=131072)
    shapes = sweep_shapes(limits, quick=True, block_size=16)
    assert len(shapes) == 26
    assert {s.kind for s in shapes} == {"decode", "prefill", "mixed", "copy", "swap"}
    assert max(s.work_tokens for s in shapes) <= 256  # no 8k-token prefill on a CPU by default
