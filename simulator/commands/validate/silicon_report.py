"""The silicon table's outcomes: errors of the rows whose method is established, the others
reported apart, and the coverage table (what kvplan could answer, and why not the rest).

Each row lands in one bucket, the first that applies:

* ``duplicate`` — the same measurement as another row (silicon.py :func:`mark_duplicates`):
  simulated with it, counted once;
* ``implausible`` — its TTFT implies a prefill faster than the dense peak of its GPUs
  (:func:`simulator.commands.validate.silicon_run.plausibility`), or its TPOT a decode step
  shorter than its GPUs' HBM takes to read the KV of the requests decoding
  (:func:`~simulator.commands.validate.silicon_run.decode_plausibility`): flagged, never fitted;
* ``method unknown`` — no public script says how it was measured;
* ``ambiguous`` — InferenceX's method, but something the sample does not record may differ (a
  speculative-decoding variant of its config, a same-day re-measurement that disagrees, a
  work-in-progress branch);
* ``established`` — the rest: the errors ``kvplan validate --silicon`` headlines.

``fit`` in validate.csv is ``yes`` for established rows only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from simulator.commands.validate import report
from simulator.commands.validate.report import RowOutcome
from simulator.commands.validate.silicon_run import SiliconResult, decode_plausibility, plausibility
from simulator.commands.validate.table import PublishedRow

BUCKETS = ("established", "ambiguous", "method unknown", "implausible", "duplicate")
CSV_EXTRA = ("aic_id", "method", "bucket", "plausibility", "fit", "waves_simulated", "ambiguous",
             "duplicate_of", "recipe", "simulation_notes")


def bucket_of(extra: Mapping[str, str], plausible: str, present: frozenset[str] | set[str] | None = None) -> str:
    """The row's bucket (module docstring). A copy counts as a duplicate only when the row it
    repeats is among the rows validated (``present``: their aic ids; None: all are)."""
    dup = extra.get("duplicate_of")
    if dup and (present is None or dup in present):
        return "duplicate"
    if plausible.startswith("implausible"):
        return "implausible"
    if extra.get("method") != "inferencex":
        return "method unknown"
    if extra.get("ambiguous"):
        return "ambiguous"
    return "established"


def outcomes(rows: Sequence[PublishedRow], extras: Mapping[str, Mapping[str, str]],
             results: Sequence[SiliconResult]) -> tuple[list[RowOutcome], dict[str, dict[str, str]]]:
    """Every row in table order with its prediction (the row's unit) or why none, and the
    columns validate.csv adds for it (:data:`CSV_EXTRA`)."""
    by_row: dict[str, tuple[SiliconResult, float | None]] = {}
    for res in results:
        for r in res.setup.rows:
            by_row[r.row_id] = (res, res.predicted(r))
    # plausibility is a property of the measurement: read off its TTFT (prefill) and its TPOT
    # (decode, which needs the TTFT too), given to both rows
    verdict: dict[str, str] = {}
    ttft_of: dict[str, float] = {}
    for r in rows:
        if r.metric == "ttft":
            key = extras[r.row_id].get("aic_id") or r.row_id
            verdict[key] = plausibility(r, extras[r.row_id])
            ttft_of[key] = r.value_si
    for r in rows:
        key = extras[r.row_id].get("aic_id") or r.row_id
        if r.metric == "tpot" and not verdict.get(key, "").startswith("implausible"):
            decode = decode_plausibility(r, extras[r.row_id], ttft_of.get(key))
            if decode.startswith("implausible") or key not in verdict:
                verdict[key] = decode
    present = {extras[r.row_id].get("aic_id") or r.row_id for r in rows}
    items, info = [], {}
    for r in rows:
        x = extras[r.row_id]
        res, p = by_row.get(r.row_id, (None, None))
        status = res.status if res is not None else "not simulated"
        if res is not None and status == "simulated" and p is None:
            status = "metric missing in the simulation"
        scale = r.value / r.value_si
        items.append(RowOutcome(r, None if p is None else p * scale, None, status))
        plaus = verdict.get(x.get("aic_id") or r.row_id, "not checked: no TTFT row")
        b = bucket_of(x, plaus, present)
        info[r.row_id] = {"aic_id": x.get("aic_id", ""), "method": x.get("method", ""), "bucket": b,
                          "plausibility": plaus, "fit": "yes" if b == "established" else "no",
                          "waves_simulated": str(res.setup.waves) if res is not None and res.setup.waves else "",
                          "ambiguous": x.get("ambiguous", ""), "duplicate_of": x.get("duplicate_of", ""),
                          "recipe": x.get("recipe", ""),
                          "simulation_notes": "; ".join(res.setup.notes) if res is not None else ""}
    return items, info


def summarize(items: Sequence[RowOutcome], info: Mapping[str, Mapping[str, str]],
              extras: Mapping[str, Mapping[str, str]], results: Sequence[SiliconResult],
              wall_s: float) -> dict[str, Any]:
    """The summary validate.json carries: errors of established rows (the usual blocks), the
    other buckets apart, counts by method and plausibility, coverage and timing."""
    by_bucket: dict[str, list[RowOutcome]] = defaultdict(list)
    for o in items:
        by_bucket[info[o.row.row_id]["bucket"]].append(o)
    summary = report.summarize(by_bucket.get("established", []))
    summary["num_rows"] = len(items)
    summary["num_measurements"] = len({info[o.row.row_id]["aic_id"] or o.row.row_id for o in items})
    summary["num_simulated"] = sum(1 for o in items if o.predicted is not None)
    summary["num_sources"] = len({o.row.source for o in items})
    summary["not_simulated"] = dict(Counter(report.coverage_reason(o.status) for o in items
                                            if o.predicted is None).most_common())
    summary["buckets"] = {b: _bucket_block(by_bucket.get(b, [])) for b in BUCKETS}
    summary["methods"] = dict(Counter(info[o.row.row_id]["method"] for o in items if o.row.metric == "ttft"))
    summary["plausibility"] = dict(Counter(info[o.row.row_id]["plausibility"].split(":")[0]
                                           for o in items if o.row.metric == "ttft"))
    cells = report.coverage((info[o.row.row_id]["aic_id"] or o.row.row_id, o.row.gpu, o.row.engine,
                             report.family_of(o.row.model), o.status) for o in items)
    summary["coverage"] = cells
    summary["coverage_totals"] = report.coverage_totals(cells)
    ran = [r for r in results if r.cpu_s > 0]
    summary["timing"] = {"simulations": len(ran), "setups": len(results),
                         "cpu_s": round(sum(r.cpu_s for r in ran), 2), "wall_s": round(wall_s, 2),
                         "requests_simulated": sum(r.num_requests for r in ran),
                         "slowest": sorted(({"setup": r.setup.first.row_id.rpartition(":")[0],
                                             "cpu_s": round(r.cpu_s, 2), "requests": r.num_requests}
                                            for r in ran), key=lambda d: -d["cpu_s"])[:5]}
    summary["notes"] = []
    return summary


def _bucket_block(items: Sequence[RowOutcome]) -> dict[str, Any]:
    errs = [o.error for o in items if o.error is not None]
    by_metric: dict[str, list[float]] = defaultdict(list)
    for o in items:
        if o.error is not None:
            by_metric[report.METRIC_GROUP[o.row.metric]].append(o.error)
    return {"num_rows": len(items), "num_simulated": len(errs),
            "mape": sum(abs(e) for e in errs) / len(errs) if errs else None,
            "by_metric": {k: {"num_rows": len(v), "mape": sum(abs(e) for e in v) / len(v),
                              "bias": sum(v) / len(v)} for k, v in sorted(by_metric.items())}}


def print_extras(console: Any, summary: Mapping[str, Any]) -> None:
    """What the silicon table adds to the printed report: the buckets and the coverage."""
    from rich.table import Table

    t = Table(title="rows by bucket (errors headline 'established' only)", title_justify="left")
    for col in ("bucket", "rows", "simulated", "MAPE", "TTFT MAPE", "TPOT MAPE"):
        t.add_column(col, justify="left" if col == "bucket" else "right")
    for b, block in summary["buckets"].items():
        m = block["by_metric"]
        t.add_row(b, str(block["num_rows"]), str(block["num_simulated"]), report._pct(block["mape"]),
                  report._pct((m.get("ttft") or {}).get("mape")), report._pct((m.get("itl/tpot") or {}).get("mape")))
    console.print(t)
    report.print_coverage(console, summary["coverage"])
    p = summary["plausibility"]
    console.print("plausibility of the TTFTs (measurements): " + ", ".join(f"{n} {k}" for k, n in sorted(p.items())))
    tm = summary["timing"]
    console.print(f"{tm['simulations']} simulations of {tm['setups']} setups, {tm['requests_simulated']} requests: "
                  f"{tm['cpu_s']:.1f} CPU s, {tm['wall_s']:.1f} s wall")


__all__ = ["BUCKETS", "CSV_EXTRA", "bucket_of", "outcomes", "print_extras", "summarize"]


def print_architecture_fit(console: Any, fits: Mapping[str, Any]) -> None:
    """``--fit``'s table: per architecture and per GPU × engine, TTFT and TPOT MAPE (bias) under
    the global set, the architecture's set in sample, and held out by model family."""
    from rich.table import Table

    def cell(e: Mapping[str, Any] | None) -> str:
        return "—" if not e else f"{e['mape']:.1%} ({e['bias']:+.0%})"

    for arch, f in fits.items():
        t = Table(title=f"{arch}: constants fitted on {f['num_rows']} established rows "
                        f"({'adopted' if f['adopted'] else 'not adopted: the global set does better held out'})",
                  title_justify="left")
        for col in ("GPU × engine", "rows", "TTFT global", "TTFT fitted", "TTFT held out",
                    "TPOT global", "TPOT fitted", "TPOT held out"):
            t.add_column(col, justify="left" if col == "GPU × engine" else "right")
        for name, e in [("all", f["overall"]), *f["by_gpu_engine"].items()]:
            t.add_row(name, str(e["ttft"]["rows"] + e["tpot"]["rows"]),
                      *(cell(e[m][k]) for m in ("ttft", "tpot") for k in ("global", "fitted", "held_out")))
        console.print(t)
        console.print("  " + ", ".join(f"{k} {v:.4g}" for k, v in f["constants"].items()))
