"""benchmarks/workloads.py at toy sizes: every case runs in its own process and reports the
number of requests it built; the generated trace is a valid Azure trace."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from workloads.loaders import detect_format, load_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "workloads.py"


def benchmark_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("workloads_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_trace_is_a_valid_azure_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    benchmark_module().write_azure_trace(path, 3000)
    assert detect_format(path) == "azure"
    requests = load_trace(path)
    assert len(requests) == 3000 and requests[-1].arrival_s > 0


def test_prints_a_row_per_case_and_the_load_average(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "2000", "--big-rows", "3000", "--synthetic", "1500",
         "--keep-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # case name (40 columns), then requests, CPU s, wall s, peak MiB
    rows = {line[:40].strip(): line[40:].split() for line in done.stdout.splitlines()}
    expected = {"python + imports": "0", "1,000 of a 3,000-row trace": "1,000",
                "1,000 at rate 8 of a 2,000-row trace": "1,000", "a 2,000-row trace in full": "2,000",
                "1,500 synthetic": "1,500"}
    for case, num in expected.items():
        assert rows[case][0] == num, case
        assert float(rows[case][3].replace(",", "")) > 0
    assert "load average (1, 5, 15 min):" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["azure-2000.csv", "azure-3000.csv"]
