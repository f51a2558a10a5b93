"""`kvplan fidelity`: replay one trace on the real engine and in the simulator, and measure the gap.

::

    1. calibrate this device for the scenario's model (or take --profile): the shape sweep of
       `calibrate`, then a refit on a training run of the requests that follow the evaluated
       ones in the trace (never the evaluated requests themselves)
    2. serve the scenario's trace on the real engine, in wall-clock time, with the scenario's
       engine (vllm-v1, vllm-v0 or sglang) deciding every step, on a runner sized for the largest
       step it can plan (--repeats times: the spread between repeats is the noise floor of the
       measurement itself)
    3a. replay the real run's step durations in the simulator: the decisions must be identical
    3b. simulate the trace with the calibrated profile: the prediction
    4. fidelity.json + fidelity.png: simulated vs measured throughput, TTFT, TPOT and E2E with
       their relative errors, and per-step predicted vs measured latency (MAPE)

The machine's load average is read before and after every timed stage. A target is judged met
or missed only when the measurement can tell: if the real runs' own spread, or the timing shift
a load change between calibration and the real runs implies, exceeds the target's bound, the
verdict is "inconclusive" with the reason (:func:`simulator.report.fidelity.judge_target`).

The real engine serves paged KV only (its kernels read block tables); contiguous allocators in the
scenario are skipped, and the report says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from backend.calibrate import CalibrateOptions, calibrate, resolve_device, write_profile
from backend.machine_load import StageLoad, sample_load
from backend.realtime import RealtimeResult, ReplayLatency, max_step_tokens, run_realtime
from backend.runner import ModelRunner
from simulator.engine import metrics
from simulator.config.deployment import Deployment, build_deployment
from simulator.engine.core import SimResult, simulate
from simulator.errors import KvplanError
from simulator.report.fidelity import (
    compare_decisions,
    judge_target,
    metric_errors,
    metric_spread,
    step_errors,
    timing_shift_from_load,
)
from simulator.report.fidelity_plots import write_fidelity_plot
from simulator.kv.sizing import resolve_kv_dtype
from simulator.latency.profile import (
    FEATURES,
    ProfileLatency,
    check_profile_matches,
    fit_linear,
    mape,
    read_profile,
)
from simulator.report.outputs import OutputFolder, RunSource, default_out_dir, open_output, shown_run
from simulator.report.files import write_csv, write_json
from simulator.engine.runs import load_workload
from simulator.config.scenario import load_scenario

# the targets: relative error bounds on a warm, otherwise idle machine
TARGETS = {"throughput_tok_s": 0.05, "tpot_s.mean": 0.05, "e2e_s.mean": 0.05, "ttft_s.p99": 0.10}
MAX_POOL_FRACTION_OF_RAM = 0.5
# What fidelity wrote before its folders carried outputs.MARKER: such a folder may be replaced.
FIDELITY_FILES = ("fidelity.json", "real_steps.csv", "sim_steps.csv")


@dataclass(frozen=True)
class FidelityOptions:
    scenario: str
    device: str | None = None
    profile: str | None = None
    repeats: int = 2
    out: str | None = None
    force: bool = False
    quick_calibrate: bool = False
    threads: int | None = None
    overrides: dict[str, object] | None = None
    replace: bool = False  # write over a folder holding a run of another scenario


@dataclass
class FidelityReport:
    out_dir: Path
    report: dict[str, Any]
    real: RealtimeResult
    simulated: SimResult
    predicted_s: list[float]


def _runner(dep: Deployment, device: torch.device) -> ModelRunner:
    cfg = dep.scheduler_config
    rank_kv_bytes = dep.capacity.bytes_per_token * cfg.block_size * dep.num_blocks
    if device.type == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if rank_kv_bytes > MAX_POOL_FRACTION_OF_RAM * ram:
            raise KvplanError(
                f"the KV pool ({dep.num_blocks:,} blocks, {rank_kv_bytes / 2**30:.1f} GiB) does not fit this "
                "machine's memory: set num_gpu_blocks_override in the scenario"
            )
    return ModelRunner(
        dep.model, num_blocks=dep.num_blocks, block_size=cfg.block_size, device=device,
        dtype=dep.model.torch_dtype, kv_dtype=resolve_kv_dtype(dep.model, dep.scenario.kv_cache_dtype),
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=max_step_tokens(cfg),
        max_model_len=cfg.max_model_len, tp=dep.scenario.tensor_parallel, seed=dep.scenario.seed,
    )


def _profile(opts: FidelityOptions, dep: Deployment, device: torch.device, out_dir: Path):  # type: ignore[no-untyped-def]
    cfg = dep.scheduler_config
    if opts.profile:
        profile = read_profile(opts.profile)
        if not opts.force:
            check_profile_matches(profile, model=dep.model.name, tensor_parallel=dep.scenario.tensor_parallel,
                                  kv_cache_dtype=dep.capacity.kv_cache_dtype, gpu=None)
        return profile
    result = calibrate(CalibrateOptions(
        model=dep.model.name, tp=dep.scenario.tensor_parallel, device=str(device),
        block_size=cfg.block_size, kv_cache_dtype=dep.scenario.kv_cache_dtype,
        quick=True if opts.quick_calibrate else None,  # None: quick on a CPU, full on a GPU
        seed=dep.scenario.seed, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=max_step_tokens(cfg), max_model_len=cfg.max_model_len,
    ))
    path = write_profile(result.profile, out_dir / "profile.yaml")
    return read_profile(path)


def _training_overrides(opts: FidelityOptions, scenario, requests) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The workload of the training run: the trace right after the evaluated slice (or, for a
    synthetic workload, the next seed) — as many requests, never the evaluated ones."""
    out = dict(opts.overrides or {})
    if scenario.workload.trace is not None:
        end = (scenario.workload.start_s or 0.0) + (requests[-1].arrival_s if requests else 0.0)
        out["workload.start_s"] = end + 1e-6
        out["workload.num_requests"] = len(requests)
    else:
        out["seed"] = scenario.seed + 1
    return out


def _refit_on_run(profile_path: Path, train: RealtimeResult) -> None:
    """Refit the profile's coefficients on a training run's steps (features -> measured seconds):
    the steps a served trace really has, with every cost the engine pays between two steps."""
    raw = yaml.safe_load(profile_path.read_text())
    x = np.array([s.features for s in train.samples])
    y = np.array([s.measured_s for s in train.samples])
    if len(y) < 2 * len(FEATURES):
        return  # too few steps to fit: keep the sweep's coefficients
    heldout = np.arange(len(y)) % 4 == 3
    coef = fit_linear(x[~heldout], y[~heldout], relative=False)  # unbiased in total time
    pred = x @ coef
    raw["fit"]["sweep_coefficients_s"] = raw["latency_model"]["coefficients_s"]
    raw["latency_model"]["coefficients_s"] = {n: float(c) for n, c in zip(FEATURES, coef)}
    raw["fit"]["source"] = "training run of the scenario's trace (disjoint requests) on this device"
    raw["fit"]["run_steps"] = int(len(y))
    raw["fit"]["run_mape_train"] = float(mape(pred[~heldout], y[~heldout]))
    raw["fit"]["run_mape_heldout"] = float(mape(pred[heldout], y[heldout]))
    profile_path.write_text(yaml.safe_dump(raw, sort_keys=False, width=120))


def run_fidelity(opts: FidelityOptions, *, on_stage=None) -> FidelityReport:  # type: ignore[no-untyped-def]
    """Steps 1–4 of the module docstring; returns the report (also written to the out folder)."""
    if opts.repeats < 1:
        raise KvplanError(f"--repeats must be >= 1, got {opts.repeats}")
    scenario, base = load_scenario(opts.scenario, opts.overrides)
    if "paged" not in scenario.allocators:
        raise KvplanError(f"{opts.scenario}: fidelity runs the real engine, which serves paged KV only: "
                          "list 'paged' in allocators")
    dep = build_deployment(scenario, base, force_profile=True, where=opts.scenario)
    device = resolve_device(opts.device)
    if device.type == "cpu":
        torch.set_num_threads(opts.threads or 1)  # a shared machine: one thread times steadily
    out_dir = Path(opts.out) if opts.out else default_out_dir(scenario.name, suffix="-fidelity",
                                                              where=opts.scenario)
    given = _profile(opts, dep, device, out_dir) if opts.profile else None  # checked before any writing
    # Locked from here: a second run into out_dir is refused; the results (the calibrated
    # profile.yaml among them) replace the folder once all are written (simulator/report/outputs.py).
    source = RunSource.of("fidelity", [opts.scenario], {"scenario": scenario.model_dump(mode="json"),
                                                         "device": opts.device, "repeats": opts.repeats,
                                                         "profile": opts.profile},
                          shown_run(opts.scenario, opts.overrides))
    with open_output(out_dir, command="fidelity", recognised=FIDELITY_FILES, source=source,
                     replace=opts.replace) as folder:
        return _measure(opts, scenario, base, dep, device, folder, given, on_stage)


def _measure(opts: FidelityOptions, scenario, base: Path, dep: Deployment, device: torch.device,  # type: ignore[no-untyped-def]
             folder: OutputFolder, given, on_stage) -> FidelityReport:
    """Steps 1–4 of the module docstring, writing into ``folder.staging``."""
    out_dir = folder.staging
    stage = on_stage or (lambda _msg: None)

    window = dep.scheduler_config.max_model_len
    workload = load_workload(scenario, base, window)  # the scenario's max_model_len_policy
    requests = workload.requests
    runner = _runner(dep, device)
    factory = dep.replica_factory("paged", detail=True)
    loads: list[StageLoad] = []

    def timed(name: str, run):  # type: ignore[no-untyped-def]
        stage(f"{name} (load average {_load_text()})")
        before = sample_load()
        out = run()
        loads.append(StageLoad(name, before, sample_load()))
        return out

    if given is not None:
        profile = given
    else:
        profile = timed("calibration", lambda: _profile(opts, dep, device, out_dir))
        train_scenario, train_base = load_scenario(opts.scenario, _training_overrides(opts, scenario, requests))
        train_requests = load_workload(train_scenario, train_base, window).requests
        if train_requests:
            train = timed("training run", lambda: run_realtime(train_requests, factory, runner))
            _refit_on_run(Path(profile.path), train)
            profile = read_profile(profile.path)
    latency = ProfileLatency(profile, block_size=dep.scheduler_config.block_size)

    reals: list[RealtimeResult] = []
    for i in range(opts.repeats):
        reals.append(timed(f"real run {i + 1}/{opts.repeats}",
                           lambda: run_realtime(requests, factory, runner)))
    real = reals[0]
    real_frames = [(metrics.requests_frame(r), metrics.steps_frame(r)) for r in reals]
    real_summaries = [metrics.summarize(r, q, s, dep.capacity_tokens) for r, (q, s) in zip(reals, real_frames)]

    stage("simulating")
    durations = [row[3] for row in real.steps]
    replay = simulate(real.requests, dep.replica_factory("paged"), ReplayLatency(durations))
    decisions = compare_decisions(real, replay)
    sim = simulate(requests, dep.replica_factory("paged"), latency)
    sim_req, sim_steps = metrics.requests_frame(sim), metrics.steps_frame(sim)
    sim_summary = metrics.summarize(sim, sim_req, sim_steps, dep.capacity_tokens)

    coef = np.array([profile.coefficients_s[n] for n in FEATURES])
    predicted = [float(np.dot(coef, s.features)) for s in real.samples]
    measured = [s.measured_s for s in real.samples]
    errors = metric_errors(real_summaries[0], sim_summary)
    spread = metric_spread(real_summaries)
    machine = _machine_load(loads)
    verdicts = {name: judge_target(errors[name]["relative_error"], bound, spread=spread.get(name),
                                   load_shift=machine["timing_shift"])
                for name, bound in TARGETS.items()}
    kv = real_summaries[0]["kv"]
    report = {
        "scenario": scenario.name,
        "device": profile.device,
        "engine": dep.scheduler_config.engine,
        "model": dep.model.name,
        # a calibrated profile: where it will be once the run is swapped in
        "profile": profile.path if given is not None else str(folder.published(Path(profile.path))),
        "repeats": opts.repeats,
        "skipped_allocators": [a for a in scenario.allocators if a != "paged"],
        "max_model_len_policy": workload.as_dict(),
        "machine_load": machine,
        "allocators": {"paged": {
            "metrics": errors,
            "measurement_spread": spread,
            "steps": step_errors(predicted, measured),
            "targets": {name: {"bound": bound, "error": errors[name]["relative_error"],
                               "met": verdicts[name].met, "verdict": verdicts[name].verdict,
                               "reason": verdicts[name].reason}
                        for name, bound in TARGETS.items()},
            "load": {"peak_kv_used": (decisions.peak_kv_tokens_real / dep.capacity_tokens),
                     "mean_kv_token_state": kv["token_state"],
                     "num_preemptions": real_summaries[0]["num_preemptions"]},
            "decisions": decisions.as_dict(),
        }},
    }
    write_json(out_dir / "fidelity.json", report)
    write_csv(out_dir / "real_requests.csv", real_frames[0][0])
    write_csv(out_dir / "real_steps.csv", real_frames[0][1])
    write_csv(out_dir / "sim_requests.csv", sim_req)
    write_csv(out_dir / "sim_steps.csv", sim_steps)
    write_fidelity_plot(out_dir / "fidelity.png", report["allocators"]["paged"], predicted, measured,
                        title=f"{scenario.name}: {dep.model.name} on {profile.device}")
    return FidelityReport(folder.path, report, real, sim, predicted)


def _load_text() -> str:
    now = sample_load()
    return "unknown" if now is None else f"{now.load_1m:.2f} on {now.num_cpus} CPUs"


def _machine_load(loads: list[StageLoad]) -> dict[str, Any]:
    """Every stage's load, and the timing shift a load change between the stages the profile was
    fitted on (calibration, training run) and the measured runs implies."""
    peaks = [(x.stage.startswith("real run"), x.peak_per_cpu) for x in loads if x.peak_per_cpu is not None]
    fitted = [peak for is_real, peak in peaks if not is_real]
    real = [peak for is_real, peak in peaks if is_real]
    fitted_peak, real_peak = (max(fitted) if fitted else None), (max(real) if real else None)
    return {"stages": [x.as_dict() for x in loads],
            "fitted_per_cpu": fitted_peak, "real_runs_per_cpu": real_peak,
            "timing_shift": timing_shift_from_load(fitted_peak, real_peak)}
