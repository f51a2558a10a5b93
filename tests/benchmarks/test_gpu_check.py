"""benchmarks/gpu_check.py without a GPU: the dry run, argument handling, missing packages, and
reading each stage's key numbers; benchmarks/kernel_check.py in Triton's CPU interpreter."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
STAGES = ["kernels", "kernel-bench", "calibrate", "fidelity"]
# on a GPU machine these would start the real (minutes-long) stages
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device would run the real stage")


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_dry_run_prints_the_plan_and_writes_every_stage_skipped(tmp_path: Path) -> None:
    done = run("--dry-run", "--results-dir", str(tmp_path), "--work-dir", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    for name in STAGES:
        assert f"  {name}" in done.stdout
    assert "$ kvplan calibrate --model llama-3.1-8b --device cuda --layers 4" in done.stdout
    (out,) = tmp_path.glob("gpu-check-*.json")
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    if not torch.cuda.is_available():
        assert result["gpu"] is None and out.name.endswith("-no-gpu.json")
    assert set(result["imports"]) >= {"simpy", "pydantic", "rich", "yaml", "torch", "triton"}
    assert all(result["imports"].values())  # this environment has every package
    assert [s["name"] for s in result["stages"]] == STAGES
    assert all(s["status"] == "skipped: dry run" for s in result["stages"])
    assert sum(s["budget_s"] for s in result["stages"]) <= result["budget_s"] == 480
    assert not (tmp_path / "work").exists()  # a dry run runs nothing


def test_only_and_skip_choose_stages(tmp_path: Path) -> None:
    done = run("--dry-run", "--only", "kernels", "--only", "fidelity", "--skip", "fidelity",
               "--results-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (out,) = tmp_path.glob("*.json")
    assert [s["name"] for s in json.loads(out.read_text())["stages"]] == ["kernels"]


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "kernel"], "invalid choice: 'kernel'"),
    (["--budget-s", "0"], "--budget-s must be positive"),
])
def test_bad_arguments_are_one_clear_error(args: list[str], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2 and message in done.stderr


@needs_no_gpu
def test_without_a_gpu_a_real_run_stops_at_once(tmp_path: Path) -> None:
    done = run("--results-dir", str(tmp_path))
    assert done.returncode == 2
    assert "no CUDA device: nothing to check" in done.stderr
    assert not list(tmp_path.iterdir())


@needs_no_gpu
@pytest.mark.parametrize("stage", ["calibrate", "fidelity"])
def test_internal_stages_reach_kvplan_without_an_install(stage: str, tmp_path: Path) -> None:
    """The stages run kvplan's own parsers from the repository root; without CUDA they stop
    with kvplan's one-line error (exit 2), not an ImportError or a traceback."""
    done = run("--stage", stage, "--work-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "kvplan: error: no CUDA device: use --device cpu"
    assert not (tmp_path / f"{stage}.json").exists()


def test_missing_packages_are_named_with_the_install_command() -> None:
    module = gpu_check()
    message = module.missing_message({"simpy": None, "pydantic": None, "torch": "2.11", "rich": "14"})
    assert message.startswith("missing: simpy, pydantic; install them from local wheels: ")
    assert "pip install --no-index --find-links wheels simpy pydantic" in message
    assert module.missing_message({"torch": "2.11"}) == ""


def test_results_file_is_named_by_date_and_gpu(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    when = datetime(2026, 3, 4, tzinfo=timezone.utc)
    path = gpu_check().results_path(tmp_path, when, "NVIDIA H200")
    assert path == tmp_path / "gpu-check-2026-03-04-nvidia-h200.json"


def test_key_numbers_read_each_stage_output(tmp_path: Path) -> None:
    module = gpu_check()
    (tmp_path / "kernels.json").write_text(json.dumps({"ok": False, "cases": [
        {"op": "store", "kv_dtype": "float16", "ok": True},
        {"op": "decode", "kv_dtype": "float8_e4m3fn", "rel_err": 0.3, "ok": False}]}))
    assert module.key_numbers("kernels", tmp_path) == {
        "all_ok": False, "num_cases": 2, "failed": ["decode float8_e4m3fn"], "max_decode_rel_err": 0.3}
    (tmp_path / "kernel.csv").write_text("batch,paged_gbps,paged_over_copy,max_rel_err\n"
                                         "1,900,0.2,1e-3\n32,3900,0.8,2e-3\n256,4100,0.85,1e-3\n")
    assert module.key_numbers("kernel-bench", tmp_path) == {
        "num_points": 3, "best_paged_gbps": 4100.0, "median_paged_over_copy": 0.8, "max_rel_err": 2e-3}
    assert "unreadable" in module.key_numbers("calibrate", tmp_path)  # the stage wrote nothing


def test_kernel_check_runs_in_the_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, "benchmarks/kernel_check.py", "--device", "cpu", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] and len(result["cases"]) == 12
    kinds = {(c["op"], c["kv_dtype"]) for c in result["cases"]}
    assert kinds == {(op, kv) for op in ("store", "decode") for kv in ("float16", "bfloat16", "float8_e4m3fn")}
