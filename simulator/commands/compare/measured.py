"""``kvplan compare RESULT --against SCENARIO|RUN_DIR``: measured vs predicted, with the errors.

Against a scenario, the scenario is simulated at the result's load (:mod:`.against`) with one
allocator (``paged`` when listed) and its first engine; against a ``simulate`` folder, that
run's requests are read back. Either way the predictions follow the measuring tool's own
definitions (:mod:`.predict`). The output folder holds:

* ``compare.json`` — ``{"kind": "measured-vs-predicted", "result": {path, format, model, load,
  notes}, "against": {kind, path, run, model, gpu, latency_model, load}, "inferred": [...],
  "goodput_slo_ms": {...} | null, "metrics": [{metric, statistic, label, unit, measured,
  predicted, relative_error}], "summary": {num_compared, mape, worst}}``;
* ``compare.csv`` — the ``metrics`` rows;
* ``compare.png`` — the relative error of every compared metric, ±10% and ±20% bands;
* ``simulated/`` — against a scenario: the simulation's own files, as ``simulate`` writes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.commands.compare.against import (
    DEFAULT_MAX_REQUESTS,
    RunFolder,
    check_model,
    check_request_cap,
    read_scenario_mapping,
    scenario_at_load,
)
from simulator.commands.compare.predict import CONVENTIONS, GOODPUT_SLOS, predicted_metrics, relative_error
from simulator.commands.compare.results import LATENCY_STATS, THROUGHPUTS, MeasuredResult, MetricKey
from simulator.errors import KvplanError

_LATENCY_ORDER = ("ttft", "tpot", "itl", "e2e")
METRIC_ORDER: tuple[MetricKey, ...] = (
    *((m, s) for m in _LATENCY_ORDER for s in LATENCY_STATS), *((t, "value") for t in THROUGHPUTS))
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "request_throughput": "throughput",
          "output_throughput": "output throughput", "total_throughput": "total throughput",
          "request_goodput": "goodput"}
_UNITS = {"request_throughput": "req/s", "output_throughput": "tok/s", "total_throughput": "tok/s",
          "request_goodput": "req/s"}


@dataclass(frozen=True)
class MetricRow:
    metric: str
    statistic: str
    measured: float
    predicted: float | None

    @property
    def label(self) -> str:
        return _NAMES[self.metric] if self.statistic == "value" else f"{_NAMES[self.metric]} {self.statistic}"

    @property
    def unit(self) -> str:
        return _UNITS.get(self.metric, "s")

    @property
    def relative_error(self) -> float | None:
        return relative_error(self.predicted, self.measured)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "statistic": self.statistic, "label": self.label, "unit": self.unit,
                "measured": self.measured, "predicted": self.predicted, "relative_error": self.relative_error}


def metric_rows(measured: Mapping[MetricKey, float], predicted: Mapping[MetricKey, float]) -> list[MetricRow]:
    """One row per measured metric, in table order, with its prediction (None if none)."""
    return [MetricRow(m, s, measured[(m, s)], predicted.get((m, s))) for m, s in METRIC_ORDER
            if (m, s) in measured]


def summarize(rows: Sequence[MetricRow]) -> dict[str, Any]:
    """How many metrics were compared, their mean |relative error| and the worst one."""
    errors = [(abs(r.relative_error), r.label) for r in rows if r.relative_error is not None]
    if not errors:
        return {"num_compared": 0, "mape": None, "worst": None}
    worst = max(errors)
    return {"num_compared": len(errors), "mape": sum(e for e, _ in errors) / len(errors),
            "worst": {"label": worst[1], "abs_relative_error": worst[0]}}


def goodput_slo(given: Sequence[str] | None, scenario_slo: Mapping[str, Any] | None
                ) -> tuple[dict[str, float] | None, str | None]:
    """The goodput SLOs in seconds and where they come from: ``--goodput KEY:MS`` (vLLM's own
    flag and format; vllm/benchmarks/serve.py ``parse_goodput``), else the scenario's ``slo:``
    p99 bounds applied to each request, else none."""
    if given:
        out: dict[str, float] = {}
        seen: dict[str, str] = {}
        for item in given:
            name, sep, value = item.partition(":")
            if sep and name in seen:
                # vLLM's parse_goodput keeps the last silently; one SLO per metric is meant
                raise KvplanError(f"--goodput: '{name}' is given twice ({seen[name]}, {item}); give each "
                                  "SLO once")
            try:
                ms = float(value)
            except ValueError:
                ms = -1.0
            if not sep or name not in GOODPUT_SLOS or not ms >= 0:
                raise KvplanError(f"--goodput expects KEY:MS with KEY one of {', '.join(GOODPUT_SLOS)} "
                                  f"and MS ≥ 0, got '{item}'")
            out[name] = ms / 1000.0
            seen[name] = item
        return out, "--goodput"
    if scenario_slo:
        pairs = (("ttft", "ttft_p99_s"), ("tpot", "tpot_p99_s"), ("e2el", "e2e_p99_s"))
        out = {name: float(scenario_slo[key]) for name, key in pairs if scenario_slo.get(key)}
        if out:
            return out, "the scenario's slo: bounds, per request (the result does not record --goodput)"
    return None, None


@dataclass
class Comparison:
    """Everything compare.json holds, and the simulation to write beside it (against a scenario)."""

    result: MeasuredResult
    against: dict[str, Any]
    inferred: list[str]
    slo_s: dict[str, float] | None
    rows: list[MetricRow]
    simulated: Any = None  # (scenario, deployment, AllocatorRun) of a scenario's simulation

    def payload(self) -> dict[str, Any]:
        r = self.result
        return {
            "kind": "measured-vs-predicted",
            "result": {"path": r.path, "format": r.format, "model": r.model, "load": r.load.__dict__,
                       "load_text": r.load.describe(), "notes": list(r.notes)},
            "against": self.against,
            "inferred": self.inferred,
            "goodput_slo_ms": None if self.slo_s is None else {k: v * 1000 for k, v in self.slo_s.items()},
            "metrics": [row.as_dict() for row in self.rows],
            "summary": summarize(self.rows),
        }


def against_scenario(result: MeasuredResult, path: str, *, allocator: str | None,
                     goodput: Sequence[str] | None, max_requests: int = DEFAULT_MAX_REQUESTS) -> Comparison:
    """Simulate the scenario at ``path`` at the result's load and compare (module docstring). A
    result asking for more than ``max_requests`` requests is refused before any is built."""
    from simulator.config.deployment import build_deployment
    from simulator.engine.metrics import throughput_window_s
    from simulator.engine.runs import client_policy, load_workload, run_allocator
    from simulator.config.scenario import parse_scenario

    data, inferred = scenario_at_load(read_scenario_mapping(path), result.load, path)
    check_request_cap(result, data, path, max_requests, flag="--max-requests")
    goodput_slo(goodput, None)  # a bad --goodput fails before the simulation, not after it
    scenario = parse_scenario(data, path)
    if scenario.disaggregation is not None:
        raise KvplanError(f"{path}: compare simulates one pool of replicas; this scenario is disaggregated")
    engine = scenario.engines[0]
    if len(scenario.engines) > 1:
        inferred.append(f"engine: {engine}, the scenario's first")
    scenario = scenario.for_engine(engine)
    name = _allocator(scenario.allocators, allocator, path)
    base_dir = Path(path).parent
    dep = build_deployment(scenario, base_dir, where=path)
    check_model(result, dep.model.name)
    fit = load_workload(scenario, base_dir, dep.scheduler_config.max_model_len)
    clients = client_policy(scenario, len(fit.requests))
    run = run_allocator(dep, name, fit.requests, clients=clients)
    run.summary["max_model_len_policy"] = fit.as_dict()
    slo_s, slo_from = goodput_slo(goodput, scenario.slo.model_dump() if scenario.slo else None)
    if slo_from and ("request_goodput", "value") in result.metrics:
        inferred.append(f"goodput SLOs: {slo_from}")
    convention = CONVENTIONS[result.format]
    predicted = predicted_metrics(run.request_columns, warmup=clients.warmup_requests,
                                  window_s=throughput_window_s(run.result), convention=convention,
                                  goodput_slo_s=slo_s)
    against = {"kind": "scenario", "path": path, "run": name, "engine": engine, "model": dep.model.name,
               "gpu": dep.gpu.name, "tensor_parallel": scenario.tensor_parallel,
               "latency_model": dep.describe()["latency_model"], "workload": data["workload"]}
    return Comparison(result, against, inferred, slo_s, metric_rows(result.metrics, predicted),
                      simulated=(scenario, dep, run))


def against_run(result: MeasuredResult, folder: RunFolder, *, allocator: str | None,
                goodput: Sequence[str] | None) -> Comparison:
    """Compare with a run ``simulate`` wrote (its requests.csv, the chosen allocator's rows)."""
    import pandas as pd

    key = folder.pick(allocator)
    check_model(result, folder.model)
    requests = pd.read_csv(folder.path / "requests.csv", keep_default_na=False,
                           na_values={c: [""] for c in ("ttft_s", "tpot_s", "e2e_s", "queue_delay_s")})
    requests = requests[requests["allocator"] == key]
    columns = {c: requests[c].to_numpy() for c in requests.columns}
    summary = folder.summary[key]
    scenario = folder.run.get("scenario", {})
    slo_s, slo_from = goodput_slo(goodput, scenario.get("slo"))
    inferred = []
    if slo_from and ("request_goodput", "value") in result.metrics:
        inferred.append(f"goodput SLOs: {slo_from}")
    inferred.extend(_load_mismatch(result, scenario.get("workload") or {}))
    predicted = predicted_metrics(columns, warmup=int(summary.get("warmup_requests", 0)),
                                  window_s=float(summary["throughput_window_s"]),
                                  convention=CONVENTIONS[result.format], goodput_slo_s=slo_s)
    dep = folder.run.get("deployment", {})
    against = {"kind": "run", "path": str(folder.path), "run": key, "model": folder.model,
               "gpu": dep.get("gpu"), "tensor_parallel": dep.get("tensor_parallel"),
               "latency_model": dep.get("latency_model"), "workload": scenario.get("workload")}
    return Comparison(result, against, inferred, slo_s, metric_rows(result.metrics, predicted))


def _load_mismatch(result: MeasuredResult, workload: Mapping[str, Any]) -> list[str]:
    """Where the run's workload was sent differently from the measured load (a warning each)."""
    from simulator.errors import warn_user

    load, said = result.load, []
    checks = (("concurrency", load.concurrency), ("max_concurrency", load.max_concurrency),
              ("num_requests", load.num_requests))
    for key, measured in checks:
        if measured is not None and workload.get(key) != measured:
            said.append(f"{key}: the run has {workload.get(key)}, the result {measured}")
    rate = workload.get("rate")
    if load.rate is not None and (rate is None or not math.isclose(float(rate), load.rate, rel_tol=0.01)):
        said.append(f"rate: the run has {rate}, the result {load.rate:g}")
    for line in said:
        warn_user(f"{result.path}: not the run's load — {line} (compare against the scenario to simulate "
                  "at the result's load)")
    return [f"load differs from the run's: {line}" for line in said]


def _allocator(allocators: Sequence[str], wanted: str | None, where: str) -> str:
    if wanted is not None:
        from simulator.config.scenario import canonical_allocator

        name = canonical_allocator(wanted)
        if name not in allocators:
            raise KvplanError(f"{where}: allocator '{name}' is not in the scenario ({', '.join(allocators)})")
        return name
    return "paged" if "paged" in allocators else allocators[0]


def print_comparison(console: Any, c: Comparison, out_dir: Path) -> None:
    """The measured-vs-predicted table (rich), what was inferred, and where the files are."""
    from rich.table import Table

    a = c.against
    console.print(f"measured: {c.result.path} ({c.result.format}; {c.result.load.describe()})")
    console.print(f"predicted: {a['kind']} {a['path']} [{a['run']}], {a['model']} on {a['gpu']}")
    table = Table()
    for col in ("metric", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for row in c.rows:
        err = row.relative_error
        table.add_row(row.label, _value(row.measured, row.unit), _value(row.predicted, row.unit),
                      "—" if err is None else f"{err:+.1%}")
    console.print(table)
    s = summarize(c.rows)
    if s["mape"] is not None:
        console.print(f"mean |error| {s['mape']:.1%} over {s['num_compared']} metrics; worst "
                      f"{s['worst']['label']} ({s['worst']['abs_relative_error']:.1%})")
    for line in (*c.result.notes, *c.inferred):
        console.print(f"note: {line}")
    console.print(f"results in {out_dir}/")


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{v * 1000:.4g} ms"
    return f"{v:.4g} {unit}"


def plot_errors(path: Path, rows: Sequence[MetricRow], title: str) -> None:
    """compare.png: one horizontal bar per compared metric, its relative error, with ±10% and
    ±20% bands; metrics without a prediction are listed under the axis."""
    from matplotlib.figure import Figure

    compared = [r for r in rows if r.relative_error is not None]
    fig = Figure(figsize=(8.0, 1.2 + 0.32 * max(len(compared), 1)), dpi=120, layout="constrained")
    ax = fig.subplots()
    labels = [r.label for r in compared][::-1]
    errors = [100 * r.relative_error for r in compared][::-1]  # type: ignore[operator]
    limit = max([25.0, *(abs(e) * 1.15 for e in errors)])
    ax.axvspan(-20, 20, color="#F0F0F0", zorder=0, label="±20%")
    ax.axvspan(-10, 10, color="#DDDDDD", zorder=0, label="±10%")
    colours = ["#0072B2" if abs(e) <= 20 else "#D55E00" for e in errors]
    ax.barh(range(len(errors)), errors, color=colours, zorder=2)
    for i, e in enumerate(errors):
        ax.text(e + (0.01 if e >= 0 else -0.01) * limit, i, f"{e:+.1f}%", va="center",
                ha="left" if e >= 0 else "right", fontsize=8.5, zorder=3)
    ax.set_yticks(range(len(labels)), labels)
    ax.axvline(0, color="#444444", linewidth=0.8)
    ax.set_xlim(-limit * 1.2, limit * 1.2)
    ax.set_xlabel("predicted vs measured (relative error, %)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)
    missing = [r.label for r in rows if r.relative_error is None]
    if missing:
        ax.set_title(f"not predicted: {', '.join(missing)}", fontsize=8.5, loc="left", color="#444444")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path)
