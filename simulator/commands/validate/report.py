"""The truth table's outputs: per-row errors, error summaries, the printed tables and the plot.

Error of a row: ``predicted / published − 1`` (so +20% = the simulator says 20% more). MAPE is the
mean of its absolute value. Summaries group rows by metric (TTFT, ITL/TPOT, E2E, throughput) and by
source; a held-out column gives the same errors for predictions made by constants fitted without
the row's source (leave one source out).
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from simulator.commands.validate.predict import SetupResult
from simulator.commands.validate.table import LATENCY_METRICS, PublishedRow

# What the issue asks of the defaults on held-out sources (targets, not asserts).
TARGETS = {"itl/tpot": 0.10, "throughput": 0.10, "ttft": 0.15}
METRIC_GROUP = {"ttft": "ttft", "itl": "itl/tpot", "tpot": "itl/tpot", "e2e": "e2e",
                "output_throughput": "throughput", "total_throughput": "throughput",
                "request_throughput": "throughput"}
CSV_COLUMNS = ("row_id", "source", "engine", "model", "gpu", "tensor_parallel", "weight_dtype",
               "kv_cache_dtype", "input_tokens", "output_tokens", "load", "load_value", "metric",
               "statistic", "unit", "published", "predicted", "ratio", "error",
               "predicted_held_out", "error_held_out", "status", "source_url")


@dataclass(frozen=True)
class RowOutcome:
    """One published row and what kvplan predicts for it (values in the row's own unit)."""

    row: PublishedRow
    predicted: float | None  # None when the row could not be simulated
    predicted_held_out: float | None
    status: str  # "simulated" or why not

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.row.value - 1.0

    @property
    def error_held_out(self) -> float | None:
        return None if self.predicted_held_out is None else self.predicted_held_out / self.row.value - 1.0


def outcomes(rows: Sequence[PublishedRow], results: Sequence[SetupResult], setups_skipped: dict[str, str],
             held_out_si: dict[str, float] | None = None) -> list[RowOutcome]:
    """Every row of the table, in table order, with its prediction or the reason it has none."""
    predicted: dict[str, tuple[float | None, str]] = {}
    for res in results:
        for r in res.setup.rows:
            if res.status != "simulated":
                predicted[r.row_id] = (None, res.status)
                continue
            p = res.predicted(r)
            predicted[r.row_id] = (None, "metric missing in the simulation") if p is None else (p, "simulated")
    out = []
    for r in rows:
        scale = 1.0 / r.value_si * r.value  # SI -> the row's unit
        if r.row_id in predicted:
            p, status = predicted[r.row_id]
        else:
            p, status = None, setups_skipped.get(r.row_id, "not simulated")
        held = (held_out_si or {}).get(r.row_id)
        out.append(RowOutcome(r, None if p is None else p * scale,
                              None if held is None else held * scale, status))
    return out


def summarize(items: Sequence[RowOutcome]) -> dict[str, Any]:
    """MAPE, mean signed error and counts per metric group, per source and overall, for the
    in-sample predictions and (where present) the held-out ones."""

    def block(select: Iterable[RowOutcome], held: bool) -> dict[str, Any]:
        errs = [(o.error_held_out if held else o.error) for o in select]
        errs = [e for e in errs if e is not None]
        if not errs:
            return {"num_rows": 0, "mape": None, "bias": None, "within_20pct": None}
        return {"num_rows": len(errs), "mape": sum(abs(e) for e in errs) / len(errs),
                "bias": sum(errs) / len(errs),
                "within_20pct": sum(1 for e in errs if abs(e) <= 0.2) / len(errs)}

    by_metric: dict[str, list[RowOutcome]] = defaultdict(list)
    by_source: dict[str, list[RowOutcome]] = defaultdict(list)
    for o in items:
        by_metric[METRIC_GROUP[o.row.metric]].append(o)
        by_source[o.row.source].append(o)
    simulated = [o for o in items if o.predicted is not None]
    summary: dict[str, Any] = {
        "num_rows": len(items), "num_simulated": len(simulated),
        "num_sources": len(by_source),
        "not_simulated": _reasons(o for o in items if o.predicted is None),
    }
    for label, held in (("in_sample", False), ("held_out", True)):
        summary[label] = {
            "overall": block(items, held),
            "by_metric": {k: block(v, held) for k, v in sorted(by_metric.items())},
            "by_source": {k: block(v, held) for k, v in sorted(by_source.items())},
        }
    summary["targets"] = targets(summary["held_out"])
    return summary


def targets(held_out: dict[str, Any]) -> dict[str, Any]:
    """The held-out MAPE per metric group against :data:`TARGETS`."""
    out = {}
    for group, bound in TARGETS.items():
        mape = held_out["by_metric"].get(group, {}).get("mape")
        out[group] = {"bound": bound, "held_out_mape": mape, "met": _met(mape, bound)}
    return out


def held_out_from_fit(digest: dict[str, Any]) -> dict[str, Any]:
    """The fit file's held-out MAPEs (``fit.error.held_out_mape``) as summary blocks."""
    return {"overall": {"mape": digest.get("overall")},
            "by_metric": {k: {"mape": v} for k, v in digest.get("by_metric", {}).items()},
            "by_source": {k: {"mape": v} for k, v in digest.get("by_source", {}).items()}}


def _met(mape: float | None, bound: float) -> bool | None:
    return None if mape is None else mape <= bound


def _reasons(items: Iterable[RowOutcome]) -> dict[str, int]:
    count: dict[str, int] = defaultdict(int)
    for o in items:
        count[o.status.split(" (")[0]] += 1
    return dict(sorted(count.items(), key=lambda kv: -kv[1]))


def write_csv(path: Path, items: Sequence[RowOutcome], extra_columns: Sequence[str] = (),
              extra: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """validate.csv: :data:`CSV_COLUMNS`, then ``extra_columns`` from ``extra`` (by row_id)."""
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow((*CSV_COLUMNS, *extra_columns))
        for o in items:
            r = o.row
            more = (extra or {}).get(r.row_id, {})
            w.writerow([r.row_id, r.source, r.engine, r.model, r.gpu, r.tensor_parallel,
                        r.weight_dtype, r.kv_cache_dtype, r.input_tokens or "", r.output_tokens or "",
                        r.load, _fmt(r.load_value), r.metric, r.statistic, r.unit, _fmt(r.value),
                        _fmt(o.predicted), _fmt(None if o.predicted is None else o.predicted / r.value),
                        _fmt(o.error), _fmt(o.predicted_held_out), _fmt(o.error_held_out), o.status,
                        r.source_url, *(more.get(c, "") for c in extra_columns)])
    tmp.replace(path)


# --- coverage: how many rows kvplan could answer, and why not the others ----------------------

COVERAGE_STATES = ("simulated", "refused", "not expressible", "no result")


def family_of(model: str) -> str:
    """A model's family for the coverage table: the checkpoint's name without organisation,
    size, release date, tuning and quantization (``nvidia/Llama-3.3-70B-Instruct-FP8`` ->
    ``Llama-3.3``, ``deepseek-ai/DeepSeek-R1-0528`` -> ``DeepSeek-R1``, ``Qwen/Qwen3-235B-A22B-FP8``
    -> ``Qwen3``)."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"(?i)^meta-", "", name)
    name = re.sub(r"(?i)-(instruct|chat|base|it)(\b.*)?$", "", name)
    name = re.sub(r"(?i)-(nvfp4|fp4|fp8|mxfp4|int4|int8|awq|gptq|w8a8|w4a16|bf16|modelopt)\b.*$", "", name)
    name = re.sub(r"(?i)-hf$", "", name)
    name = re.sub(r"-\d{4}$", "", name)
    name = re.sub(r"(?i)-\d+(\.\d+)?[bm](-a\d+(\.\d+)?b)?$", "", name)
    return name or model


def coverage_state(status: str) -> str:
    """simulated / refused / not expressible / no result, from a row's status."""
    if status == "simulated":
        return "simulated"
    if status.startswith(("refused", "deployment refused")):
        return "refused"
    if status.startswith(("no request completed", "metric missing")):
        return "no result"
    return "not expressible"


def coverage_reason(status: str) -> str:
    """What the coverage table counts a row under: the status without the row's own detail —
    the parenthesis of a skip reason, the numbers of a refusal or of kvplan's message."""
    if status.startswith("refused (") or status.startswith("deployment refused ("):
        inner = re.sub(r"^(validation|silicon) row \S+:\s*", "", status[status.index("(") + 1:].rstrip(")"))
        return "refused: " + _masked(inner)[:140]
    if status.startswith("not expressible: "):
        status = status[len("not expressible: "):]
    if status.startswith("kvplan: "):
        return _masked(status)[:140]
    return status.split(" (")[0]


def _masked(text: str) -> str:
    """Numbers standing alone (not inside a name such as vllm-v1 or b200_sxm) as ``#``."""
    return re.sub(r"(?<![A-Za-z_\-.\d])\d[\d.,]*", "#", text)


def coverage(entries: Iterable[tuple[str, str, str, str, str]]) -> list[dict[str, Any]]:
    """Per GPU × engine × model family: measurements, how many were simulated, refused by
    kvplan's start-up checks, not expressible or without result, and the reasons with their
    counts. ``entries``: (measurement id, GPU, engine, family, status) — a measurement of
    several rows (a TTFT and a TPOT) is counted once, by its first row's status."""
    seen: set[str] = set()
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for mid, gpu, engine, family, status in entries:
        if mid in seen:
            continue
        seen.add(mid)
        cell = cells.setdefault((gpu, engine, family), {
            "gpu": gpu, "engine": engine, "family": family, "measurements": 0,
            **{s.replace(" ", "_"): 0 for s in COVERAGE_STATES}, "reasons": defaultdict(int)})
        cell["measurements"] += 1
        state = coverage_state(status)
        cell[state.replace(" ", "_")] += 1
        if state != "simulated":
            cell["reasons"][coverage_reason(status)] += 1
    out = []
    for key in sorted(cells):
        cell = cells[key]
        cell["reasons"] = dict(sorted(cell["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(cell)
    return out


def coverage_totals(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"measurements": sum(c["measurements"] for c in cells)}
    for s in COVERAGE_STATES:
        total[s.replace(" ", "_")] = sum(c[s.replace(" ", "_")] for c in cells)
    reasons: dict[str, int] = defaultdict(int)
    for c in cells:
        for why, n in c["reasons"].items():
            reasons[why] += n
    total["reasons"] = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return total


def print_coverage(console: Console, cells: Sequence[Mapping[str, Any]], *, top: int = 2) -> None:
    t = Table(title="coverage (per GPU × engine × model family; measurements)", title_justify="left")
    for col in ("GPU", "engine", "family", "rows", "simulated", "refused", "not expressible",
                "no result", "why not (most rows first)"):
        t.add_column(col, justify="left" if col in ("GPU", "engine", "family", "why not (most rows first)")
                     else "right", overflow="fold")
    for c in cells:
        why = "; ".join(f"{n} {r if len(r) <= 72 else r[:71] + '…'}" for r, n in list(c["reasons"].items())[:top])
        t.add_row(c["gpu"], c["engine"], c["family"], str(c["measurements"]), str(c["simulated"]),
                  str(c["refused"]), str(c["not_expressible"]), str(c["no_result"]), why)
    tot = coverage_totals(cells)
    t.add_row("all", "", "", str(tot["measurements"]), str(tot["simulated"]), str(tot["refused"]),
              str(tot["not_expressible"]), str(tot["no_result"]), "", style="bold")
    console.print(t)
    if tot["reasons"]:
        console.print("why not, all rows: " + "; ".join(f"{n} {r}" for r, n in tot["reasons"].items()))


def _fmt(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x:.6g}"


def _pct(x: float | None, signed: bool = False) -> str:
    return "—" if x is None else (f"{x:+.1%}" if signed else f"{x:.1%}")


def print_report(console: Console, items: Sequence[RowOutcome], summary: dict[str, Any], *,
                 constants: dict[str, float], out_dir: Path | None, rows_table: bool = True) -> None:
    """The per-row table (published vs predicted), then MAPE per metric and per source."""
    if rows_table:
        t = Table(title="published vs predicted", title_justify="left")
        for col in ("row", "setup", "metric", "published", "predicted", "error", "held-out"):
            t.add_column(col, justify="left" if col in ("row", "setup", "metric") else "right")
        for o in items:
            if o.predicted is None:
                continue
            r = o.row
            lengths = f"{r.input_tokens}/{r.output_tokens}"
            load = {"concurrency": f"c={r.load_value:g}" if r.load_value else "c=?",
                    "rate": f"{r.load_value:g}/s" if r.load_value else "rate",
                    "burst": "burst", "batch": f"batch {r.load_value:g}" if r.load_value else "batch"}[r.load]
            setup = f"{r.model.rsplit('/', 1)[-1][:26]} {r.gpu} TP{r.tensor_parallel} {lengths} {load}"
            unit = r.unit
            t.add_row(r.row_id, setup, r.metric_label, f"{r.value:.4g} {unit}", f"{o.predicted:.4g} {unit}",
                      _pct(o.error, True), _pct(o.error_held_out, True))
        console.print(t)
    for label, key in (("by metric", "by_metric"), ("by source", "by_source")):
        t = Table(title=f"error {label}", title_justify="left")
        for col in ("", "rows", "MAPE", "bias", "within ±20%", "held-out MAPE"):
            t.add_column(col, justify="left" if not col else "right")
        for name, b in summary["in_sample"][key].items():
            h = summary["held_out"][key].get(name, {})
            t.add_row(name, str(b["num_rows"]), _pct(b["mape"]), _pct(b["bias"], True),
                      _pct(b["within_20pct"]), _pct(h.get("mape")))
        o = summary["in_sample"]["overall"]
        h = summary["held_out"]["overall"]
        t.add_row("all", str(o["num_rows"]), _pct(o["mape"]), _pct(o["bias"], True),
                  _pct(o["within_20pct"]), _pct(h.get("mape")), style="bold")
        console.print(t)
    skipped = summary["not_simulated"]
    if skipped:
        console.print(f"{summary['num_rows'] - summary['num_simulated']} of {summary['num_rows']} rows not "
                      "simulated: " + "; ".join(f"{n} {why}" for why, n in skipped.items()))
    targets = [f"{g} ≤ {t['bound']:.0%}: {_pct(t['held_out_mape'])} "
               f"({'met' if t['met'] else 'not met' if t['met'] is not None else 'no data'})"
               for g, t in summary["targets"].items()]
    console.print("targets on held-out sources: " + ", ".join(targets))
    console.print("roofline constants: " + ", ".join(f"{k}={v:.4g}" for k, v in constants.items()))
    if out_dir is not None:
        console.print(f"results in {out_dir}/")


def plot(path: Path, items: Sequence[RowOutcome], title: str) -> None:
    """Predicted vs published on log–log axes, y = x and ±20% bands, coloured by metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = ("ttft", "itl/tpot", "e2e", "throughput")
    colors = {"ttft": "#1f77b4", "itl/tpot": "#2ca02c", "e2e": "#9467bd", "throughput": "#d62728"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 6), gridspec_kw={"width_ratios": [1, 1]})
    done = [o for o in items if o.predicted is not None]
    for ax, kind in zip(axes, ("latency", "throughput")):
        sel = [o for o in done if (o.row.metric in LATENCY_METRICS) == (kind == "latency")]
        if not sel:
            ax.set_visible(False)
            continue
        xs = [o.row.value_si for o in sel]  # seconds, tokens or requests per second
        ys = [o.predicted / o.row.value * o.row.value_si for o in sel]  # type: ignore[operator]
        lo, hi = min(xs + ys) / 1.5, max(xs + ys) * 1.5
        ax.fill_between([lo, hi], [lo / 1.2, hi / 1.2], [lo * 1.2, hi * 1.2], color="0.9",
                        label="±20%")
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=1, label="y = x")
        for g in groups:
            pts = [(x, y) for o, x, y in zip(sel, xs, ys) if METRIC_GROUP[o.row.metric] == g]
            if pts:
                ax.scatter(*zip(*pts), s=28, color=colors[g], alpha=0.85, edgecolor="white",
                           linewidth=0.5, label=f"{g} ({len(pts)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        unit = "seconds" if kind == "latency" else "tokens or requests per second"
        ax.set_xlabel(f"published ({unit})")
        ax.set_ylabel(f"kvplan ({unit})")
        ax.set_title(kind)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(loc="upper left", fontsize=9, frameon=True)
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
