"""`kvplan fidelity`'s exit status: 0 all met, 3 a target missed (or decisions diverged), 4 only
inconclusive verdicts; the table is printed whatever the status (synthetic reports, no timing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import backend.fidelity
from backend.cli import EXIT_INCONCLUSIVE, EXIT_TARGETS_MISSED, fidelity_exit_code
from simulator.cli import main


def report(verdicts: dict[str, str], *, identical: bool = True) -> dict[str, Any]:
    metric = {"measured": 1.0, "simulated": 1.02, "relative_error": 0.02}
    return {
        "scenario": "s", "device": "cpu", "skipped_allocators": [], "machine_load": None,
        "allocators": {"paged": {
            "metrics": {name: metric for name in verdicts},
            "measurement_spread": {name: 0.01 for name in verdicts},
            "targets": {name: {"bound": 0.05, "error": 0.02, "met": {"met": True, "missed": False}.get(v),
                               "verdict": v, "reason": "run-to-run spread 9% > target 5%"
                               if v == "inconclusive" else ""} for name, v in verdicts.items()},
            "steps": {"mape": 0.1, "bias": 0.0, "num_steps": 10},
            "load": {"peak_kv_used": 0.5, "num_preemptions": 0},
            "decisions": {"identical": identical, "first_divergence": "" if identical else "step 3: batch",
                          "num_steps_real": 10, "preemptions_real": 0},
        }},
    }


@pytest.mark.parametrize(("verdicts", "identical", "code", "why"), [
    ({"tpot_s.mean": "met", "ttft_s.p99": "n/a"}, True, 0, ""),
    ({"tpot_s.mean": "met", "e2e_s.mean": "inconclusive"}, True, EXIT_INCONCLUSIVE, "inconclusive: e2e_s.mean"),
    ({"tpot_s.mean": "missed", "e2e_s.mean": "inconclusive"}, True, EXIT_TARGETS_MISSED,
     "targets missed: tpot_s.mean"),
    ({"tpot_s.mean": "missed", "e2e_s.mean": "missed"}, True, EXIT_TARGETS_MISSED,
     "targets missed: tpot_s.mean, e2e_s.mean"),
    ({"tpot_s.mean": "met"}, False, EXIT_TARGETS_MISSED, "the replayed decisions diverged"),
])
def test_exit_code_per_verdict(verdicts: dict[str, str], identical: bool, code: int, why: str) -> None:
    assert fidelity_exit_code(report(verdicts, identical=identical)) == (code, why)
    assert (EXIT_TARGETS_MISSED, EXIT_INCONCLUSIVE) == (3, 4)  # README documents these numbers


def test_cli_prints_the_table_then_exits_with_the_status(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    missed = report({"tpot_s.mean": "missed", "e2e_s.mean": "met"})
    result = backend.fidelity.FidelityReport(tmp_path, missed, None, None, None)  # type: ignore[arg-type]
    monkeypatch.setattr(backend.fidelity, "run_fidelity", lambda opts, on_stage=None: result)
    assert main(["fidelity", "scenarios/fidelity-cpu.yaml", "--device", "cpu"]) == 3
    captured = capsys.readouterr()
    assert "±5% MISSED" in captured.out and f"results in {tmp_path}/" in captured.out
    assert "kvplan: fidelity: targets missed: tpot_s.mean (exit status 3)" in captured.err
