"""``kvplan calibrate --from-results R1 R2 ... --scenario S``: the roofline fitted to measurements.

For people with a GPU cluster who will not run kvplan's own calibration loop: each result (a
``vllm bench serve --save-result`` JSON, a GuideLLM benchmark, a fidelity.json — see
:mod:`.results`) is one measured point of the scenario's deployment at its own load. Each
becomes a setup of ``kvplan validate``'s fit (:mod:`simulator.commands.validate.fit`): the scenario at the
result's load (:func:`.against.scenario_at_load`), its metrics as rows, the result as the
*source*. The fit is the same — mean |log error| with every result weighing the same, rounds of
re-timed fits and re-simulations, Nelder–Mead — and leaving one source out becomes leaving one
result out: the error to expect at a load the fit never saw.

Only the constants the deployment exercises are fitted (the others keep their defaults):
HBM and 16-bit tensor-core efficiency, the per-step and per-request overheads always; the FP8
GEMM efficiency when its GEMMs run in 8 bits; the routed-expert efficiency for a MoE model; the
all-reduce latency at TP > 1. ``prefill_overhead_s`` stays fixed, as in ``validate --fit``.

The output is the scenario with its ``latency:`` section set to the fitted constants (``latency:``
is where a scenario selects the roofline's constants), written next to the scenario by default
(``<stem>-calibrated.yaml``, so that its relative paths still resolve; elsewhere, file paths are
made absolute), the fit's errors as comments at the top.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from simulator.commands.compare.against import (
    DEFAULT_MAX_REQUESTS,
    check_model,
    check_request_cap,
    read_scenario_mapping,
    scenario_at_load,
)
from simulator.commands.compare.measured import METRIC_ORDER
from simulator.commands.compare.results import MeasuredResult, read_result
from simulator.errors import KvplanError, warn_user
from simulator.latency.constants import FIELDS, RooflineConstants, default_constants
from simulator.commands.validate.setups import Setup
from simulator.commands.validate.table import THROUGHPUT_METRICS, PublishedRow

FIT_ROUNDS = 3  # as kvplan validate --fit: the objective settles in 2–3 rounds
ALWAYS_FITTED = ("mem_efficiency", "flops_efficiency", "step_overhead_s", "request_overhead_s")


@dataclasses.dataclass
class CalibrationFit:
    """The fitted constants, what was fitted, and the errors per result and metric."""

    constants: RooflineConstants
    start: RooflineConstants
    params: tuple[str, ...]
    results: list[MeasuredResult]
    rows: list[dict[str, Any]]  # per metric of every result: measured, before, fitted, held_out
    rounds: list[dict[str, float]]
    notes: list[str]

    def mape(self, key: str) -> float | None:
        errors = [abs(r[key] / r["measured"] - 1) for r in self.rows if r.get(key) is not None]
        return sum(errors) / len(errors) if errors else None

    @property
    def beats_defaults(self) -> bool:
        """Whether the fit's mean |relative error| in sample is below the defaults'."""
        before, fitted = self.mape("before"), self.mape("fitted")
        return before is not None and fitted is not None and fitted < before

    def mape_by_metric(self, key: str) -> dict[str, float]:
        groups: dict[str, list[float]] = defaultdict(list)
        for r in self.rows:
            if r.get(key) is not None:
                groups[r["metric"]].append(abs(r[key] / r["measured"] - 1))
        return {m: sum(v) / len(v) for m, v in groups.items()}


def fit_from_results(paths: Sequence[str], scenario_path: str, *, allocator: str | None = None,
                     max_requests: int = DEFAULT_MAX_REQUESTS) -> tuple[CalibrationFit, dict[str, Any]]:
    """Fit the roofline's constants to the results at ``paths`` as measurements of the scenario at
    ``scenario_path`` (module docstring). A result asking for more than ``max_requests`` requests
    is refused before anything is built. Returns the fit and the scenario mapping as read."""
    from simulator.config.deployment import build_deployment
    from simulator.latency.roofline import RooflineLatency
    from simulator.config.scenario import parse_scenario
    from simulator.commands.validate import fit as fitting
    from simulator.commands.validate.predict import simulate_setup

    data = read_scenario_mapping(scenario_path)
    scenario = parse_scenario(data, scenario_path)
    if scenario.disaggregation is not None or scenario.num_replicas != 1:
        raise KvplanError(f"{scenario_path}: calibrate --from-results fits one replica: give num_replicas: 1 "
                          "and no disaggregation")
    base_dir = Path(scenario_path).parent
    engine = scenario.engines[0]
    plain = scenario.for_engine(engine)
    alloc = allocator or ("paged" if "paged" in plain.allocators else plain.allocators[0])
    notes = []
    if scenario.latency.model != "roofline":
        notes.append(f"the scenario's latency model ({scenario.latency.model}) is replaced by the fitted roofline")
    dep = build_deployment(plain.model_copy(update={"latency": type(plain.latency)()}), base_dir,
                           where=scenario_path)
    assert isinstance(dep.latency, RooflineLatency)
    spec = scenario.latency if scenario.latency.model == "roofline" else None
    start = default_constants(dep.gpu).replace(**({k: getattr(spec, k) for k in FIELDS} if spec else {}))
    params = fitted_params(dep.latency, scenario.tensor_parallel)
    results = [read_result(p) for p in paths]
    setups = []
    for index, result in enumerate(results):
        check_model(result, dep.model.name)
        at_load, _ = scenario_at_load(data, result.load, result.path)
        check_request_cap(result, at_load, scenario_path, max_requests, flag="--max-requests")
        at_load.update(engine=engine, allocators=[alloc])
        at_load.pop("latency", None)
        setups.append(Setup(rows=_rows(result, _source(results, index), dep.model.name, dep.gpu.name,
                                       scenario.tensor_parallel),
                            scenario=at_load))
    if not any(s.rows for s in setups):
        raise KvplanError("calibrate --from-results: the results hold no latency or throughput to fit")

    def simulate(setup: Setup, constants: RooflineConstants):  # type: ignore[no-untyped-def]
        result = simulate_setup(setup, constants, record=True, base_dir=base_dir)
        if result.error is not None:
            raise KvplanError(f"{setup.first.source_title}: {result.error}")
        return result

    before = [simulate(s, start) for s in setups]
    constants, final, history = fitting.fit_in_rounds(setups, start, params=params, rounds=FIT_ROUNDS,
                                                      simulate=simulate)
    held = (fitting.leave_one_source_out(final, constants, params=params, simulate=simulate)
            if len(setups) > 1 else {})
    rows = []
    for b, f in zip(before, final):
        for row in f.setup.rows:
            rows.append({"result": row.source, "metric": row.metric_label, "measured": row.value_si,
                         "before": b.predicted(row), "fitted": f.predicted(row),
                         "held_out": held.get(row.row_id)})
    if len(setups) < 2:
        notes.append("one result: no leave-one-out error (give two results or more)")
    fitted = CalibrationFit(constants, start, tuple(params), results, rows, history, notes)
    if not fitted.beats_defaults:
        notes.append(f"the fit does not beat kvplan's defaults on these results (mean |error| "
                     f"{_pct(fitted.mape('fitted'))} fitted, {_pct(fitted.mape('before'))} with the defaults): "
                     "keep the defaults")
    return fitted, data


def fitted_params(roofline: Any, tensor_parallel: int) -> list[str]:
    """The constants this deployment's steps depend on (module docstring), in FIELDS order."""
    wanted = set(ALWAYS_FITTED)
    if roofline.rates.gemm_8bit:
        wanted.add("fp8_flops_efficiency")
    if roofline.model.num_experts:
        wanted.add("moe_flops_efficiency")
    if tensor_parallel > 1:
        wanted.add("allreduce_latency_s")
    return [f for f in FIELDS if f in wanted]


def _source(results: Sequence[MeasuredResult], index: int) -> str:
    """A result's name as a fit source: its label, numbered when two results share one."""
    label = results[index].label
    return label if sum(r.label == label for r in results) == 1 else f"{label}[{index + 1}]"


def _rows(result: MeasuredResult, source: str, model: str, gpu: str, tp: int) -> list[PublishedRow]:
    """The result's metrics as the fit's rows (goodput is left out: it needs SLOs the fit has not)."""
    rows = []
    for metric, stat in METRIC_ORDER:
        value = result.metrics.get((metric, stat))
        if value is None or metric == "request_goodput" or not value > 0:
            continue
        unit = ("req/s" if metric == "request_throughput" else "tok/s") if metric in THROUGHPUT_METRICS else "s"
        rows.append(PublishedRow(
            row_id=f"{source}:{metric}.{stat}", source=source, source_title=result.path, source_url="",
            engine="", engine_version="", model=model, gpu=gpu, tensor_parallel=tp, num_gpus=tp,
            weight_dtype="auto", kv_cache_dtype="auto", input_tokens=None, output_tokens=None, dataset="",
            load="rate", load_value=None, num_prompts=None, metric=metric, statistic=stat, unit=unit,
            value=value, notes=""))
    return rows


def write_calibrated(path: Path, data: dict[str, Any], fit: CalibrationFit, scenario_path: str) -> None:
    """The scenario with the fitted ``latency:`` section, the fit's errors as comments."""
    from simulator.report.outputs import replace_file

    out = dict(data)
    out["latency"] = {"model": "roofline", **{k: _round(getattr(fit.constants, k)) for k in FIELDS}}
    src_dir, out_dir = Path(scenario_path).parent.resolve(), path.parent.resolve()
    if src_dir != out_dir:
        _absolute_paths(out, src_dir)
    header = [f"Calibrated by `kvplan calibrate --from-results` from {scenario_path} and "
              f"{len(fit.results)} measured result(s):"]
    header += [f"  {r.path} ({r.format}; {r.load.describe()})" for r in fit.results]
    header.append(f"fitted: {', '.join(fit.params)}; the other constants are kvplan's defaults")
    header.append(_error_line(fit))
    header += [f"note: {n}" for n in fit.notes]
    text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(out, sort_keys=False, allow_unicode=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replace_file(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as err:
        raise KvplanError(f"{path}: cannot write ({err.strerror or err})") from None


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _absolute_paths(data: dict[str, Any], base_dir: Path) -> None:
    """File paths a scenario resolves against its folder (a config.json model, a trace, the trace
    of empirical lengths), made absolute so that the copy written elsewhere reads the same files."""
    def fix(node: dict[str, Any], key: str) -> None:
        value = node.get(key)
        if isinstance(value, str) and not value.startswith("bundled:") and not Path(value).is_absolute() \
                and (base_dir / value).exists():
            node[key] = str((base_dir / value).resolve())

    fix(data, "model")
    workload = data.get("workload")
    if isinstance(workload, dict):
        workload = data["workload"] = dict(workload)
        fix(workload, "trace")
        for key in ("prompt_tokens", "output_tokens"):
            if isinstance(workload.get(key), dict):
                workload[key] = dict(workload[key])
                fix(workload[key], "trace")


def _error_line(fit: CalibrationFit) -> str:
    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f}%"

    return (f"MAPE over {len(fit.rows)} metrics: defaults {pct(fit.mape('before'))}, fitted (in sample) "
            f"{pct(fit.mape('fitted'))}, leaving each result out {pct(fit.mape('held_out'))}")


def print_fit(fit: CalibrationFit, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=120)
    constants = Table(title="roofline constants", title_justify="left")
    for col in ("constant", "default", "fitted"):
        constants.add_column(col, justify="left" if col == "constant" else "right")
    for name in FIELDS:
        mark = "" if name in fit.params else " (kept)"
        constants.add_row(name + mark, f"{getattr(fit.start, name):.4g}", f"{getattr(fit.constants, name):.4g}")
    console.print(constants)
    errors = Table(title="mean |relative error| per metric", title_justify="left")
    for col in ("metric", "defaults", "fitted", "leave one result out"):
        errors.add_column(col, justify="left" if col == "metric" else "right")
    by = {k: fit.mape_by_metric(k) for k in ("before", "fitted", "held_out")}
    for metric in dict.fromkeys(r["metric"] for r in fit.rows):
        errors.add_row(metric, *(_pct(by[k].get(metric)) for k in ("before", "fitted", "held_out")))
    errors.add_row("all", *(_pct(fit.mape(k)) for k in ("before", "fitted", "held_out")))
    console.print(errors)
    for note in fit.notes:
        if not note.startswith("the fit does not beat"):  # warned on stderr by run_from_results
            console.print(f"note: {note}")
    if fit.beats_defaults:
        console.print(f"wrote {out} (simulate it, or copy its latency: section into your scenario)")
    else:
        console.print(f"wrote {out} (its constants do not beat the defaults: keep the defaults)")


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def run_from_results(paths: Sequence[str], scenario_path: str, *, out: str | None, allocator: str | None,
                     quiet: bool, max_requests: int = DEFAULT_MAX_REQUESTS) -> int:
    """The ``calibrate --from-results`` command (backend/cli.py dispatches here; no torch)."""
    p = Path(scenario_path)
    target = Path(out) if out else p.with_name(f"{p.stem}-calibrated.yaml")
    if target.resolve() == p.resolve():
        raise KvplanError(f"--out {target} would overwrite the scenario it calibrates")
    if max_requests < 1:
        raise KvplanError(f"--max-requests must be at least 1, got {max_requests}")
    fit, data = fit_from_results(paths, scenario_path, allocator=allocator, max_requests=max_requests)
    write_calibrated(target, data, fit, scenario_path)
    if not fit.beats_defaults:
        warn_user(f"calibrate --from-results: the fit does not beat kvplan's defaults on these results "
                  f"(mean |error| in sample {_pct(fit.mape('fitted'))} fitted vs {_pct(fit.mape('before'))} "
                  f"with the defaults): {target} is written, but keep the defaults")
    if not quiet:
        print_fit(fit, target)
    return 0
