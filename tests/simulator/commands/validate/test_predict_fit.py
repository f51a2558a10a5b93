"""Re-timing recorded runs is exact where the module says so, and the fit finds known constants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.latency.constants import RooflineConstants
from simulator.commands.validate.fit import fit, leave_one_source_out
from simulator.commands.validate.optimize import nelder_mead
from simulator.commands.validate.predict import SetupResult, simulate_setup
from simulator.commands.validate.setups import group_setups
from simulator.commands.validate.table import PublishedRow

C1 = RooflineConstants(mem_efficiency=0.8, flops_efficiency=0.6, fp8_flops_efficiency=0.6,
                       moe_flops_efficiency=0.6, step_overhead_s=0.003, prefill_overhead_s=0.001,
                       allreduce_latency_s=1e-5)
C2 = RooflineConstants(mem_efficiency=0.65, flops_efficiency=0.45, fp8_flops_efficiency=0.4,
                       moe_flops_efficiency=0.3, step_overhead_s=0.0015, prefill_overhead_s=0.004,
                       allreduce_latency_s=3e-5, request_overhead_s=0.02)

BASE = PublishedRow(
    row_id="a", source="s1", source_title="t", source_url="https://example.org", engine="vllm",
    engine_version="0.10.1", model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB",
    tensor_parallel=1, num_gpus=1, weight_dtype="bf16", kv_cache_dtype="auto", input_tokens=300,
    output_tokens=40, dataset="random", load="concurrency", load_value=8, num_prompts=24,
    metric="ttft", statistic="mean", unit="ms", value=50.0, notes="n")


def rows_for(**changes: object) -> list[PublishedRow]:
    """A run's rows: every metric the table knows, so every key of the summary is compared."""
    base = dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]
    metrics = [("ttft", "mean", "ms"), ("ttft", "p99", "ms"), ("itl", "median", "ms"),
               ("e2e", "p90", "s"), ("output_throughput", "value", "tok/s"),
               ("total_throughput", "value", "tok/s"), ("request_throughput", "value", "req/s")]
    return [dataclasses.replace(base, row_id=f"{base.row_id}-{m}-{s}", metric=m, statistic=s, unit=u)
            for m, s, u in metrics]


CLOSED_LOOP = rows_for()
BURST = rows_for(row_id="b", load="burst", load_value=None, num_prompts=40, input_tokens=2000)
TP2_MOE = rows_for(row_id="c", source="s2", model="mistralai/Mixtral-8x7B-Instruct-v0.1",
                   tensor_parallel=2, num_gpus=2, load_value=4, num_prompts=12)


@pytest.mark.parametrize("rows", [CLOSED_LOOP, BURST, TP2_MOE], ids=["closed-loop", "burst", "tp2-moe"])
def test_retiming_a_recorded_run_equals_simulating_again(rows: list[PublishedRow]) -> None:
    (setup,) = group_setups(rows)
    recorded = simulate_setup(setup, C1, record=True)
    assert recorded.recording is not None
    # under the recording's own constants, and under others: the decisions are the same
    for c, again in ((C1, recorded), (C2, simulate_setup(setup, C2))):
        retimed = recorded.recording.predict(c)
        assert retimed.keys() == again.flat.keys()
        for key, value in again.flat.items():
            assert retimed[key] == pytest.approx(value, rel=1e-9), key


def test_the_fit_recovers_what_generated_the_data() -> None:
    setups = group_setups(CLOSED_LOOP + BURST + TP2_MOE)
    truth = [simulate_setup(s, C2) for s in setups]
    published = [dataclasses.replace(r, value=res.predicted(r) / r.value_si * r.value)  # type: ignore[operator]
                 for res in truth for r in res.setup.rows]
    recorded: list[SetupResult] = [simulate_setup(s, C1, record=True) for s in group_setups(published)]
    start = dataclasses.replace(C1, request_overhead_s=0.005)  # a time starts above its floor
    outcome = fit(recorded, start, max_evals=3000)
    assert outcome.objective < 0.01  # mean |log error| under 1%
    assert fit(recorded, start, max_evals=1).objective > 5 * outcome.objective
    held = leave_one_source_out(recorded, start, max_evals=400)
    assert set(held) == {r.row_id for r in published}


def test_nelder_mead_on_rosenbrock() -> None:
    x, value = nelder_mead(lambda p: float((1 - p[0]) ** 2 + 100 * (p[1] - p[0] ** 2) ** 2),
                           np.array([-1.2, 1.0]), step=0.5)
    assert value < 1e-8 and np.allclose(x, [1.0, 1.0], atol=1e-3)
