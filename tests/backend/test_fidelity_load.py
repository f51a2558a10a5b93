"""Machine load around fidelity's stages, and how the table says a verdict is inconclusive
(synthetic numbers: nothing here depends on timing)."""

from __future__ import annotations

import pytest

from backend.cli import print_fidelity
from backend.fidelity import _machine_load
from backend.machine_load import LoadSample, StageLoad, sample_load


def stage(name: str, before: float, after: float, cpus: int = 2) -> StageLoad:
    return StageLoad(name, LoadSample(before, cpus), LoadSample(after, cpus))


def test_load_sample_is_per_cpu() -> None:
    assert LoadSample(3.0, 2).per_cpu == 1.5
    assert stage("x", 1.0, 4.0).peak_per_cpu == 2.0
    assert StageLoad("x", None, None).peak_per_cpu is None
    now = sample_load()
    assert now is None or (now.load_1m >= 0 and now.num_cpus >= 1)


def test_machine_load_compares_fitted_stages_with_real_runs() -> None:
    loads = [stage("calibration", 0.4, 1.0), stage("training run", 1.0, 1.2),
             stage("real run 1/2", 1.2, 3.0), stage("real run 2/2", 3.0, 4.0)]
    machine = _machine_load(loads)
    assert machine["fitted_per_cpu"] == pytest.approx(0.6) and machine["real_runs_per_cpu"] == 2.0
    assert machine["timing_shift"] == pytest.approx(1.0)  # 1 -> 2 processes per CPU: steps twice as long
    assert [s["stage"] for s in machine["stages"]] == [x.stage for x in loads]
    assert machine["stages"][0] == {"stage": "calibration", "load_1m_before": 0.4, "load_1m_after": 1.0,
                                    "num_cpus": 2}
    assert _machine_load([stage("real run 1/1", 1.0, 1.0)])["timing_shift"] is None  # --profile: no fit


def test_table_prints_inconclusive_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    metric = {"measured": 1.0, "simulated": 1.3, "relative_error": 0.3}
    report = {
        "scenario": "s", "device": "cpu", "skipped_allocators": [],
        "machine_load": _machine_load([stage("calibration", 0.5, 0.5), stage("real run 1/2", 0.5, 0.6)]),
        "allocators": {"paged": {
            "metrics": {"tpot_s.mean": metric, "e2e_s.mean": metric},
            "measurement_spread": {"tpot_s.mean": 0.35, "e2e_s.mean": 0.01},
            "targets": {
                "tpot_s.mean": {"bound": 0.05, "error": 0.3, "met": None, "verdict": "inconclusive",
                                "reason": "run-to-run spread 35% > target 5%"},
                "e2e_s.mean": {"bound": 0.05, "error": 0.3, "met": False, "verdict": "missed", "reason": ""},
            },
            "steps": {"mape": 0.1, "bias": 0.0, "num_steps": 10},
            "load": {"peak_kv_used": 0.5, "num_preemptions": 0},
            "decisions": {"identical": True, "first_divergence": "", "num_steps_real": 10, "preemptions_real": 0},
        }},
    }
    print_fidelity(report)
    out = capsys.readouterr().out
    assert "±5% inconclusive" in out and "±5% MISSED" in out
    assert "tpot_s.mean: inconclusive: run-to-run spread 35% > target 5%" in out
    assert "calibration 0.50->0.50, real run 1/2 0.50->0.60" in out
