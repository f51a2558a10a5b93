"""``report.html``: one self-contained page per results folder, the file a person opens.

``simulate``, ``capacity``, ``validate`` and ``compare`` each end with
:func:`write_report`, which reads back what the command wrote into its folder (summary.json,
run.json, capacity.json, validate.json, compare.json, the PNGs) and writes ``report.html`` beside
it. The page names no path (the folder is written in a staging place and moved: the same run
gives the same bytes) and needs nothing else: CSS inline, every image a base64 ``data:`` URI, no script, no
font or URL to fetch, so it opens from a mail attachment or a shared drive as it does locally.

Layout, the same for every kind: the title; the **headline** (the answer the command exists for,
e.g. "paged holds 23.6 req/s at p99 TTFT ≤ 2 s; contiguous-max 12.4"); a table of contents; the
scenario; the command's tables; every plot with its caption; the caveats — the latency model and
its validated error, rejected requests and why, the notes the command recorded. A file the page
needs but the folder lacks gives a section saying what is missing, never a failure: the report is
written last and must not lose the run it describes.

Every string from the folder goes through :func:`html.escape`; numbers are right-aligned.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from simulator.report.outputs import replace_file
from simulator.report.summary import slo_headline

Kind = Literal["simulate", "capacity", "validate", "compare"]
REPORT_NAME = "report.html"
SKIPPED_DIRS = ("cache",)  # capacity's probe cache: JSON only, never part of the report
LARGEST_ERRORS = 10  # validate: rows shown in the largest-errors table

# Captions of the plots the commands write (path relative to the folder); any other PNG in the
# folder is shown too, captioned with its name.
CAPTIONS = {
    "kv_memory.png": "Where the KV pool goes over time, stacked by kind: token state, reserved, "
                     "internal and external fragmentation, free.",
    "batch_size.png": "Running sequences and the waiting queue over time.",
    "latency_cdf.png": "TTFT and TPOT distributions of the finished requests, with the SLO bounds.",
    "allocators.png": "What decides between allocators: p99 TTFT against the SLO (saturated runs "
                      "hatched), peak concurrency, internal and external fragmentation.",
    "replicas.png": "Requests sent to each replica, and its running sequences and waiting queue over time.",
    "validate.png": "Predicted against published, log–log, with y = x and ±20% bands.",
    "plots/capacity_vs_block_size.png": "Highest rate under the SLO against block size, a line per "
                                        "allocator (whiskers: the range over seeds).",
    "plots/capacity_per_dollar.png": "Requests served per USD of GPU time at the highest rate, per GPU "
                                     "and allocator.",
    "plots/pareto.png": "Output tok/s per GPU against output tok/s per user, one line per point and "
                        "allocator through its client counts (hollow: SLO failed), and the Pareto frontier.",
    "plots/gpus_vs_target.png": "GPUs needed against the target rate, per layout.",
    "plots/cost_per_hour.png": "Cost per hour of each layout that holds the target, cheapest first.",
}
METRIC_LABELS = {"ttft": "TTFT", "itl/tpot": "ITL / TPOT", "e2e": "E2E", "throughput": "throughput"}
POINT_CAPTION = ("Sweep point {index}: throughput and p99 latency against the rate tried, with the "
                 "SLO bounds; the probes of every allocator's search.")


# --- the page ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Section:
    """One titled part of the page; ``body`` is HTML already escaped."""

    anchor: str
    title: str
    body: str


@dataclass(frozen=True, slots=True)
class Page:
    """What one report shows, in order: title, subtitle, headline, then the sections (each
    listed in the table of contents)."""

    title: str
    subtitle: str
    headline: str  # HTML, escaped
    sections: tuple[Section, ...]


def write_report(out_dir: Path, kind: Kind) -> Path:
    """Write ``out_dir/report.html`` from the files ``kind``'s command wrote there and return its
    path. Missing or unreadable files become sections that say so; the write is atomic."""
    builders = {"simulate": _simulate_page, "capacity": _capacity_page,
                "validate": _validate_page, "compare": _compare_page}
    if kind not in builders:
        raise ValueError(f"unknown report kind {kind!r} (known: {', '.join(builders)})")
    out_dir = Path(out_dir)
    page = builders[kind](Folder(out_dir))
    path = out_dir / REPORT_NAME
    with replace_file(path) as tmp:
        tmp.write_text(render(page), encoding="utf-8")
    return path


def render(page: Page) -> str:
    """The whole HTML document of ``page``."""
    toc = "".join(f'<li><a href="#{s.anchor}">{_esc(s.title)}</a></li>' for s in page.sections)
    sections = "".join(f'<section id="{s.anchor}"><h2>{_esc(s.title)}</h2>{s.body}</section>'
                       for s in page.sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(page.title)}</title><style>{CSS}</style></head><body><main>"
        f"<header><h1>{_esc(page.title)}</h1><p class=\"sub\">{_esc(page.subtitle)}</p></header>"
        f'<div class="headline" id="headline">{page.headline}</div>'
        f'<nav><h2>Contents</h2><ol>{toc}</ol></nav>{sections}'
        "</main></body></html>\n"
    )


CSS = """
:root{--fg:#1b1f24;--muted:#59636e;--rule:#d8dee4;--band:#f6f8fa;--accent:#0b5cad;--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;color:var(--fg);background:#fff;font:15px/1.5 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1120px;margin:0 auto;padding:28px 32px 64px}
h1{font-size:26px;margin:0 0 2px}
h2{font-size:19px;margin:36px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--rule)}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:var(--muted);margin:0 0 18px}
.headline{border-left:4px solid var(--accent);background:#eef5fc;padding:12px 18px;margin:0 0 18px;
font-size:16px}
.headline p{margin:4px 0}.headline ul{margin:6px 0;padding-left:20px}
nav{background:var(--band);border:1px solid var(--rule);border-radius:6px;padding:6px 18px 8px}
nav h2{border:0;margin:6px 0 2px;font-size:14px;text-transform:uppercase;letter-spacing:.04em;
color:var(--muted)}
nav ol{margin:4px 0;columns:2}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
table{border-collapse:collapse;margin:8px 0 14px;font-size:13.5px;max-width:100%;width:max-content;
display:block;overflow-x:auto}
th,td{padding:4px 9px;border-bottom:1px solid var(--rule);vertical-align:top;text-align:left}
thead th{background:var(--band);border-bottom:2px solid var(--rule);white-space:nowrap}
tbody tr:hover{background:#fafbfc}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th.key{font-weight:600;white-space:nowrap;background:none}
figure{margin:18px 0 26px}
figure img{max-width:100%;height:auto;border:1px solid var(--rule)}
figcaption{color:var(--muted);font-size:13.5px;margin-top:4px}
.missing{color:var(--warn);background:#fff8e5;border:1px solid #f0d68a;padding:8px 12px;border-radius:4px}
.nowrap td{white-space:nowrap}.caveats li{margin:4px 0}.note{color:var(--muted);font-size:13.5px;margin:2px 0}
.headline table{background:#fff}
code{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--band);padding:0 3px}
@media print{nav{display:none}main{max-width:none}}
"""


# --- reading the folder -------------------------------------------------------------------------


class Folder:
    """A results folder read for its report: JSON files loaded once, and what was missing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._json: dict[str, Any] = {}
        self.missing: list[str] = []  # "name: why"

    def json(self, name: str) -> Any:
        """The parsed file, or None (recorded in :attr:`missing`) when absent or unreadable."""
        if name not in self._json:
            try:
                self._json[name] = json.loads((self.path / name).read_text(encoding="utf-8"))
            except FileNotFoundError:
                self._json[name] = None
                self.missing.append(f"{name}: not in the folder")
            except (OSError, ValueError) as err:
                self._json[name] = None
                self.missing.append(f"{name}: unreadable ({err})")
        return self._json[name]

    def optional_json(self, name: str) -> Any:
        """The parsed file, or None without recording it as missing."""
        return self.json(name) if (self.path / name).is_file() else None

    def images(self) -> list[Path]:
        """Every PNG under the folder (capacity's cache and hidden entries left out): the known
        plots in :data:`CAPTIONS` order first, then the rest by path."""
        found = [p for p in self.path.rglob("*.png")
                 if not any(part.startswith(".") or part in SKIPPED_DIRS
                            for part in p.relative_to(self.path).parts[:-1])]
        order = {name: i for i, name in enumerate(CAPTIONS)}
        return sorted(found, key=lambda p: (order.get(self.rel(p), len(order)), self.rel(p)))

    def rel(self, path: Path) -> str:
        return path.relative_to(self.path).as_posix()


def _missing_section(folder: Folder) -> list[Section]:
    if not folder.missing:
        return []
    items = "".join(f"<li>{_esc(m)}</li>" for m in folder.missing)
    return [Section("missing", "Missing files",
                    f'<div class="missing"><p>This report is incomplete: the folder lacks files it '
                    f"is built from.</p><ul>{items}</ul></div>")]


def _plots_section(folder: Folder, none_text: str) -> Section:
    figures = []
    for path in folder.images():
        name = folder.rel(path)
        caption = CAPTIONS.get(name)
        if caption is None and name.startswith("plots/points/") and path.stem.isdigit():
            caption = POINT_CAPTION.format(index=int(path.stem))
        figures.append(_figure(path, name, caption or name))
    body = "".join(figures) if figures else f'<p class="missing">{_esc(none_text)}</p>'
    return Section("plots", "Plots", body)


def _figure(path: Path, name: str, caption: str) -> str:
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError as err:
        return f'<p class="missing">{_esc(name)}: unreadable ({_esc(err)})</p>'
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(name)}">'
            f"<figcaption><b>{_esc(name)}</b> — {_esc(caption)}</figcaption></figure>")


# --- simulate -------------------------------------------------------------------------------------


def _simulate_page(folder: Folder) -> Page:
    summary = folder.json("summary.json") or {}
    run = folder.json("run.json") or {}
    scenario = run.get("scenario") or {}
    dep = run.get("deployment") or {}
    name = scenario.get("name") or "unnamed scenario"
    sections = [
        _scenario_section(scenario, dep, run),
        Section("results", "Results per allocator", _simulate_tables(summary) if summary
                else '<p class="missing">summary.json is missing: no results to show.</p>'),
        _plots_section(folder, "No plots in the folder (the run was made with --no-plots)."),
        Section("caveats", "Caveats", _simulate_caveats(summary, dep, run)),
        *_missing_section(folder),
    ]
    where = f"{dep.get('model', '?')} on {dep.get('gpu', '?')}" if dep else "deployment unknown"
    return Page(f"kvplan simulate — {name}", scenario.get("description") or where,
                _simulate_headline(summary, dep, _workload_text(scenario.get("workload") or {}),
                                   scenario.get("slo"), _pools(scenario, run)),
                tuple(sections))


def _simulate_headline(summary: Mapping[str, Any], dep: Mapping[str, Any], workload: str,
                       slo: Mapping[str, Any] | None,
                       deployments: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """One row per allocator: throughput, p99 TTFT/TPOT, KV peak, rejections, and whether the
    queue stayed stable; above it, which allocators meet the SLO and what the others miss (the
    lowest p99 TTFT named only among those that meet it: :func:`simulator.report.summary.slo_headline`)."""
    if not summary:
        return "<p>No headline: summary.json is missing.</p>"
    head = ["", "req/s", "tok/s", "p99 TTFT", "p99 TPOT", "KV peak", "rejected", "queue"]
    rows = []
    for alloc, s in summary.items():
        kv = s.get("kv") or {}
        queue = None if "saturated" not in s else "saturated" if s["saturated"] else "stable"
        rows.append([alloc, s.get("throughput_req_s"), s.get("throughput_tok_s"),
                     _dur(_stat(s, "ttft_s", "p99")), _dur(_stat(s, "tpot_s", "p99")),
                     _pct(kv.get("peak_token_state")), s.get("rejected"), queue])
    where = _where(dep, deployments or {}) if dep else "Deployment unknown"
    verdict = slo_headline(summary, slo, name=lambda a: f"<b>{_esc(a)}</b>", text=_esc)
    best = f" {verdict}" if verdict else ""
    cap = next((s.get("kv", {}).get("kv_capacity_tokens") for s in summary.values()), None)
    kv_pool = next((s.get("kv_pool") for s in summary.values() if s.get("kv_pool")), None)
    pool = ("" if not cap else f" KV peak: share of the {_esc(kv_pool)} pool ({_ef(cap)} tokens per replica)."
            if kv_pool else f" KV peak: share of the {_ef(cap)}-token pool.")
    return (f"<p>{where}, {_esc(workload)}.{best}</p>" + _table(head, rows, key_column=True)
            + f'<p class="note">Rates over the measured window; p99 over finished requests.{pool}</p>')


def _pools(scenario: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The deployments of a disaggregated run by pool name ({} for any other run)."""
    return dict(run.get("deployments") or {}) if scenario.get("disaggregation") else {}


def _where(dep: Mapping[str, Any], pools: Mapping[str, Mapping[str, Any]]) -> str:
    """``Llama-3.1-8B on H100-80GB × TP 1``; a disaggregated run names each pool's GPUs."""
    if not pools:
        return f"{_esc(dep.get('model'))} on {_esc(dep.get('gpu'))} × TP {_ef(dep.get('tensor_parallel'))}"
    return _esc(dep.get("model")) + ", " + ", ".join(
        f"{_esc(name)} on {_ef(d.get('num_replicas'))} × {_esc(d.get('gpu'))} TP {_ef(d.get('tensor_parallel'))}"
        for name, d in pools.items())


# The scenario table's rows drawn from the deployment (run.json's ``deployment``; per engine or
# pool when it has ``deployments``): (label, key); for capacity, which has no deployment, the
# scenario's own key of the same name.
DEPLOYMENT_ROWS = (("model", "model"), ("GPU", "gpu"), ("tensor parallel", "tensor_parallel"),
                   ("replicas", "num_replicas"))
SETUP_ROWS = (("KV cache dtype", "kv_cache_dtype"), ("block size", "block_size"),
              ("KV capacity (tokens per replica)", "kv_capacity_tokens"),
              ("KV pool (GiB per rank)", "kv_pool_gib"), ("max_model_len", "max_model_len"),
              ("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
              ("prefix caching", "enable_prefix_caching"))
# A capacity sweep's knob -> the scenario row it replaces (other knobs get a row of their own).
KNOB_ROWS = {"model": "model", "gpu": "GPU", "tensor_parallel": "tensor parallel",
             "num_replicas": "replicas", "engine": "engine", "kv_cache_dtype": "KV cache dtype",
             "block_size": "block size", "max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs",
             "max_num_batched_tokens": "max_num_batched_tokens", "enable_prefix_caching": "prefix caching",
             "allocators": "allocators", "router.policy": "router"}


def _deployed(key: str, dep: Mapping[str, Any], deployments: Mapping[str, Mapping[str, Any]],
              fallback: Any = None, *, each: bool = False) -> Any:
    """``dep[key]``; with several deployments (engines, or a disaggregated run's pools) their
    value when they agree (and not ``each``), else each one's (``prefill: H100-80GB; decode:
    H200-141GB``)."""
    if not deployments:
        value = dep.get(key)
        return fallback if value is None else value
    values = {name: d.get(key) for name, d in deployments.items() if d.get(key) is not None}
    if not values:
        return fallback
    if not each and len({_fmt(v) for v in values.values()}) == 1 and len(values) == len(deployments):
        return next(iter(values.values()))
    return "; ".join(f"{name}: {_fmt(v)}" for name, v in values.items())


def _scenario_section(scenario: Mapping[str, Any], dep: Mapping[str, Any], run: Mapping[str, Any],
                      swept: Mapping[str, Sequence[Any]] | None = None,
                      searched: Sequence[str] = ()) -> Section:
    """The scenario as it ran. ``swept``: a capacity sweep's knobs with the values its points
    took (each shown instead of the base scenario's value); ``searched``: rows whose value the
    search finds (capacity --target-rate: replicas), said so instead of the base value."""
    if not scenario and not dep:
        return Section("scenario", "Scenario", '<p class="missing">run.json is missing: the scenario '
                                                "and deployment are unknown.</p>")
    deployments = run.get("deployments") or {}
    engines = list(dict.fromkeys(d.get("engine") for d in deployments.values() if d.get("engine")))
    engine = ", ".join(engines) if engines else dep.get("engine") or scenario.get("engine")
    if isinstance(engine, list):
        engine = ", ".join(map(str, engine))
    rows: list[tuple[str, Any]] = [("name", scenario.get("name"))]
    each = ("num_replicas", "kv_capacity_tokens", "kv_pool_gib") if _pools(scenario, run) else ()
    rows += [(label, _deployed(key, dep, deployments, scenario.get(key), each=key in each))
             for label, key in DEPLOYMENT_ROWS]
    pools = _pools(scenario, run)
    if pools:
        link = (scenario.get("disaggregation") or {}).get("link") or {}
        text = f"{' and '.join(pools)} pools (a value per pool where they differ)"
        if link.get("bandwidth_gb_s") is not None:
            text += (f"; KV link {float(link['bandwidth_gb_s']):g} GB/s per prefill replica, "
                     f"{1e3 * float(link.get('latency_s') or 0.0):g} ms per transfer")
        rows.append(("disaggregation", text))
    replicated = any(isinstance(v, int) and v > 1 for v in [scenario.get("num_replicas"), dep.get(
        "num_replicas"), *(d.get("num_replicas") for d in deployments.values())]) or "replicas" in searched
    rows += [
        ("router", (scenario.get("router") or {}).get("policy") if replicated else None),
        ("engine", engine),
        ("allocators", ", ".join(scenario.get("allocators") or [])),
        ("workload", _workload_text(scenario.get("workload") or {})),
        ("requests", run.get("num_requests")),
        ("seed", scenario.get("seed")),
    ]
    weights = _deployed("weight_dtype", dep, deployments)
    quantization = _deployed("quantization", dep, deployments)
    rows.append(("weights", _join(weights, quantization not in (None, "none")
                                  and f"quantization {quantization}")))
    rows += [(label, _deployed(key, dep, deployments, None if dep else scenario.get(key), each=key in each))
             for label, key in SETUP_ROWS]
    rows += [("latency model", (scenario.get("latency") or {}).get("model")),
             ("SLO", _slo_text(scenario.get("slo")))]
    rows = [(label, "found by the search, per layout (the table below)" if label in searched else value)
            for label, value in rows]
    for knob, values in (swept or {}).items():
        text = _swept_text(values)
        label = KNOB_ROWS.get(knob)
        if label is not None and any(row == label for row, _ in rows):
            rows = [(row, text if row == label else value) for row, value in rows]
        else:
            rows.append((label or knob, text))
    return Section("scenario", "Scenario", _kv_table(rows))


def _swept_text(values: Sequence[Any]) -> Any:
    """A swept knob's values: the one value every point took, or each, said to be swept."""
    shown = list(dict.fromkeys(", ".join(map(str, v)) if isinstance(v, list) else _fmt(v) for v in values))
    if len(shown) == 1:
        return values[0] if not isinstance(values[0], list) else shown[0]
    return f"{', '.join(shown)} (swept: one per sweep point, the table says which)"


def _workload_text(w: Mapping[str, Any]) -> str:
    source = w.get("trace") or "synthetic"
    parts = [f"{k} {w[k]}" for k in ("rate", "rate_scale", "num_requests", "start_s", "duration_s",
                                      "concurrency", "max_concurrency") if w.get(k) is not None]
    parts += [f"{k} {w[k]}" for k in ("n", "beam_width") if w.get(k) not in (None, 1)]
    return f"{source} ({', '.join(parts)})" if parts else str(source)


SIMULATE_ROWS: tuple[tuple[str, Any], ...] = (
    ("completed", lambda s: s.get("completed")),
    ("rejected", lambda s: s.get("rejected")),
    ("throughput (req/s)", lambda s: s.get("throughput_req_s")),
    ("generated (tok/s)", lambda s: s.get("throughput_tok_s")),
    ("TTFT p50", lambda s: _dur(_stat(s, "ttft_s", "p50"))),
    ("TTFT p99", lambda s: _dur(_stat(s, "ttft_s", "p99"))),
    ("TPOT p50", lambda s: _dur(_stat(s, "tpot_s", "p50"))),
    ("TPOT p99", lambda s: _dur(_stat(s, "tpot_s", "p99"))),
    ("E2E p50", lambda s: _dur(_stat(s, "e2e_s", "p50"))),
    ("E2E p99", lambda s: _dur(_stat(s, "e2e_s", "p99"))),
    ("queueing delay p99", lambda s: _dur(_stat(s, "queue_delay_s", "p99"))),
    ("queue over the run", lambda s: None if "saturated" not in s else Num(  # + 0.0: no "-0.00"
        f"{'SATURATED' if s['saturated'] else 'stable'} "
        f"{round(s.get('queue_growth_s_per_s') or 0.0, 2) + 0.0:+.2f} s/s")),
    ("batch mean", lambda s: s.get("mean_batch_size")),
    ("batch max (peak concurrency)", lambda s: s.get("max_batch_size")),
    ("preemptions", lambda s: s.get("num_preemptions")),
    ("blocked by external fragmentation", lambda s: s.get("requests_blocked_by_external_fragmentation")),
    ("prefix hit rate", lambda s: _pct(s.get("prefix_hit_rate"))),
)
KV_ROWS = (("token state", "token_state"), ("reserved", "reserved"),
           ("internal fragmentation", "internal_fragmentation"),
           ("external fragmentation", "external_fragmentation"), ("free", "free"),
           ("saved by sharing", "shared_saved"), ("peak token state", "peak_token_state"))


def _simulate_tables(summary: Mapping[str, Any]) -> str:
    allocs = list(summary)
    head = ["", *allocs]
    main = [[label, *(get(summary[a]) for a in allocs)] for label, get in SIMULATE_ROWS]
    kv = [[label, *(_pct((summary[a].get("kv") or {}).get(key)) for a in allocs)] for label, key in KV_ROWS]
    kv.append(["KV capacity (tokens)",
               *((summary[a].get("kv") or {}).get("kv_capacity_tokens") for a in allocs)])
    return ("<h3>Throughput and latency</h3>" + _table(head, main, key_column=True)
            + "<h3>KV pool, time-averaged over busy time</h3>" + _table(head, kv, key_column=True))


def _simulate_caveats(summary: Mapping[str, Any], dep: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    items = [_latency_caveat(dep.get("latency_model") or {})]
    for alloc, s in summary.items():
        reasons = s.get("rejected_by_reason") or {}
        if s.get("rejected"):
            why = ", ".join(f"{_ef(n)} {_esc(r)}" for r, n in reasons.items())
            items.append(f"<li><b>{_esc(alloc)}</b>: {_ef(s['rejected'])} requests rejected at "
                         f"arrival ({why}); <code>reject_reason</code> in requests.csv says which.</li>")
    policy = next(iter(summary.values()), {}).get("max_model_len_policy") if summary else None
    if policy:
        items.append(f"<li>{_esc(_policy_text(policy))}</li>")
    saturated = [a for a, s in summary.items() if s.get("saturated")]
    if saturated:
        items.append(f"<li>Saturated ({_esc(', '.join(saturated))}): the queue grows through the run "
                     "and latencies with it — they depend on the trace's length, not a steady state.</li>")
    deployments = list((run.get("deployments") or {}).values()) or [dep]
    notes = dict.fromkeys(n for d in deployments for n in (d.get("notes") or []))
    items += [f"<li>{_esc(n)}</li>" for n in notes]
    items.append("<li>Modelled, not measured: each engine's published scheduling and KV rules "
                 "replayed on kvplan's latency model.</li>")
    return f'<ul class="caveats">{"".join(items)}</ul>'


def _policy_text(policy: Mapping[str, Any]) -> str:
    head = f"max_model_len {_ef(policy.get('max_model_len'))}, policy {policy.get('policy')}: "
    if policy.get("policy") == "reject":
        return head + (f"{_ef(policy.get('num_rejected'))} requests longer than the window refused "
                       "(a vLLM server answers 400).")
    return head + (f"{_ef(policy.get('num_truncated'))} outputs cut at the window, "
                   f"{_ef(policy.get('num_dropped'))} requests dropped (the prompt alone fills it).")


def _latency_caveat(latency: Mapping[str, Any]) -> str:
    """What the latency model is and how far its predictions were from published measurements."""
    kind = latency.get("latency_model") or latency.get("model")
    if kind == "roofline":
        text = ("Latency model: <b>roofline</b> (weights and KV bytes over HBM bandwidth against GEMM "
                "and attention FLOPs over the tensor cores' peak), constants: "
                f"{_esc(latency.get('constants_from'))}.")
        return f"<li>{text} {_fit_error_text(latency.get('fit') or {})}</li>"
    if kind == "profile":
        return (f"<li>Latency model: <b>profile</b> {_esc(latency.get('path'))} measured on "
                f"{_esc(latency.get('device'))}; its held-out error is in the profile file "
                "(<code>kvplan calibrate</code>).</li>")
    if kind == "constant":
        return ("<li>Latency model: <b>constant</b> step times, not validated against any "
                "measurement: use latencies only relative to each other.</li>")
    return '<li><span class="missing">Latency model: not recorded in run.json.</span></li>'


def _fit_error_text(fit: Mapping[str, Any]) -> str:
    """The validated error of the fitted constants (roofline_fit.json's ``fit.error``): MAPE per
    metric in sample and on held-out sources, as a table."""
    error = fit.get("error") or {}
    held = (error.get("held_out_mape") or {}).get("by_metric") or {}
    inside = (error.get("in_sample_mape") or {}).get("by_metric") or {}
    if not held and not inside:
        return ("No validated error is recorded for these constants "
                "(<code>kvplan validate</code> measures it).")
    rows = [[label, _pct(inside.get(m)), _pct(held.get(m))] for m, label in METRIC_LABELS.items()]
    return (f"Validated against {_ef(error.get('num_rows_simulated'))} published GPU measurements "
            f"(<code>kvplan validate</code>, fitted {_esc(fit.get('date'))}); mean absolute percentage "
            "error, in sample and predicting each source from a fit without it:"
            + _table(["metric", "in sample", "held-out source"], rows, key_column=True))


# --- capacity -----------------------------------------------------------------------------------


# (label, field); a "lo..hi" field is the range [lo, hi] in one cell. The KV pool's size
# (kv_capacity_tokens) is left to capacity.csv: a column of one number per point.
RATE_COLUMNS = (("allocator", "allocator"), ("status", "status"), ("req/s", "max_rate_req_s"),
                ("range", "rate_ci_low_req_s..rate_ci_high_req_s"),
                ("goodput req/s", "goodput_req_s"), ("out tok/s", "throughput_tok_s"),
                ("TTFT p99", "ttft_p99_s"), ("TPOT p99", "tpot_p99_s"),
                ("max conc.", "max_concurrency"), ("limit", "limited_by"),
                ("req/s/GPU", "rate_per_gpu_req_s"), ("$/M tok", "usd_per_m_output_tokens"),
                ("KV peak", "kv_used_peak"))
CONCURRENCY_COLUMNS = (("allocator", "allocator"), ("status", "status"), ("clients", "max_clients"),
                       ("range", "clients_ci_low..clients_ci_high"), ("req/s", "max_rate_req_s"),
                       ("tok/s/user", "tok_s_per_user"),
                       ("tok/s/GPU", "tok_s_per_gpu"), ("TTFT p99", "ttft_p99_s"),
                       ("TPOT p99", "tpot_p99_s"), ("limit", "limited_by"),
                       ("$/M tok", "usd_per_m_output_tokens"), ("KV peak", "kv_used_peak"))
REPLICA_COLUMNS = (("allocator", "allocator"), ("status", "status"), ("target req/s", "target_rate_req_s"),
                   ("replicas", "num_replicas"), ("GPUs", "num_gpus"), ("$/h", "usd_per_hour"),
                   ("$/M tok", "usd_per_m_output_tokens"), ("TTFT p99", "ttft_p99_s"),
                   ("TPOT p99", "tpot_p99_s"), ("req/s/GPU", "rate_per_gpu_req_s"),
                   ("bound", "bound_replicas"), ("limit", "limited_by"))
TIME_FIELDS = ("ttft_p99_s", "tpot_p99_s")
SHARE_FIELDS = ("kv_used_peak",)


def _capacity_page(folder: Folder) -> Page:
    body = folder.json("capacity.json") or {}
    rows = body.get("rows") or []
    run = folder.optional_json("run.json") or {}
    scenario = run.get("scenario") or body.get("scenario") or {}
    dep = run.get("deployment") or {}
    search = _capacity_search(rows)
    sections = [
        _scenario_section(scenario, dep, run, swept=_swept(rows),
                          searched=("replicas",) if search == "replicas" else ()) if scenario else Section(
            "scenario", "Scenario", '<p class="missing">The folder records no scenario (neither '
            "run.json nor a <code>scenario</code> in capacity.json): the knobs below are those the "
            "sweep varied.</p>"),
        Section("table", "Capacity table", _capacity_table(rows, search) if rows
                else '<p class="missing">capacity.json has no rows.</p>'),
        _plots_section(folder, "No plots in the folder (the run was made with --no-plots)."),
        Section("caveats", "Caveats", _capacity_caveats(rows, body, scenario, dep)),
        *_missing_section(folder),
    ]
    title = f"kvplan capacity — {scenario['name']}" if scenario.get("name") else "kvplan capacity"
    return Page(title, _capacity_what(search),
                _capacity_headline(rows, search, scenario.get("slo")), tuple(sections))


def _swept(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Each knob of the sweep (``--sweep`` included) with the values its points ran, in order:
    the scenario section shows these, not the base scenario's."""
    swept: dict[str, list[Any]] = {}
    for r in rows:
        for knob, value in (r.get("knobs") or {}).items():
            if knob != "allocators" and value not in swept.setdefault(knob, []):
                swept[knob].append(value)
    return swept


def _capacity_search(rows: Sequence[Mapping[str, Any]]) -> str:
    if any("target_rate_req_s" in r for r in rows):
        return "replicas"
    return next((r["search"] for r in rows if r.get("search")), "rate")


def _capacity_what(search: str) -> str:
    return {"rate": "highest request rate under the SLO",
            "concurrency": "most closed-loop clients under the SLO",
            "replicas": "fewest GPUs that hold a target rate under the SLO"}[search]


def _capacity_headline(rows: Sequence[Mapping[str, Any]], search: str, slo: Mapping[str, Any] | None) -> str:
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return "<p>No headline: no sweep point was searched successfully (the table says why).</p>"
    under = f"at {_slo_text(slo)}" if slo else "under the scenario's SLO"
    several = len({r.get("point_index") for r in ok}) > 1
    if search == "replicas":
        lines = []
        for target in dict.fromkeys(r.get("target_rate_req_s") for r in ok):
            best = min((r for r in ok if r.get("target_rate_req_s") == target),
                       key=lambda r: (_sortable(r.get("usd_per_hour")), _sortable(r.get("num_gpus"))))
            cost = f", {_money(best.get('usd_per_hour'))}/h" if best.get("usd_per_hour") is not None else ""
            lines.append(f"<li>{_ef(target)} req/s: <b>{_ef(best.get('num_gpus'))} GPUs</b> "
                         f"({_ef(best.get('num_replicas'))} replicas{cost}) — {_esc(best.get('allocator'))}"
                         f"{_knob_suffix(best)}</li>")
        return f"<p>Cheapest layout that holds each target {_esc(under)}:</p><ul>{''.join(lines)}</ul>"
    field, unit = ("max_clients", "clients") if search == "concurrency" else ("max_rate_req_s", "req/s")
    best: dict[str, Mapping[str, Any]] = {}
    for r in ok:
        if r.get(field) is not None and (r["allocator"] not in best
                                         or r[field] > best[r["allocator"]][field]):
            best[r["allocator"]] = r
    ranked = sorted(best.values(), key=lambda r: -r[field])
    if not ranked:
        return "<p>No headline: no row has an answer.</p>"
    first, rest = ranked[0], ranked[1:]
    verb = "holds up to" if several else "holds"
    where = _knob_suffix if several else (lambda row: "")
    text = f"<b>{_esc(first['allocator'])} {verb} {_ef(first[field])} {unit}</b>{where(first)} {_esc(under)}"
    text += "".join(f"; {_esc(r['allocator'])} {_ef(r[field])}{where(r)}" for r in rest)
    return f"<p>{text}.</p>"


def _knob_suffix(row: Mapping[str, Any]) -> str:
    knobs = {k: v for k, v in (row.get("knobs") or {}).items() if k != "allocators"}
    return f" ({_esc(', '.join(f'{k} {v}' for k, v in knobs.items()))})" if knobs else ""


def _capacity_table(rows: Sequence[Mapping[str, Any]], search: str) -> str:
    columns = {"rate": RATE_COLUMNS, "concurrency": CONCURRENCY_COLUMNS, "replicas": REPLICA_COLUMNS}[search]
    # columns that would say nothing: status when every row is ok, req/s/GPU on one GPU (= req/s)
    idle = {"status"} if all(r.get("status") == "ok" for r in rows) else set()
    if all(r.get("num_gpus") in (None, 1) for r in rows):
        idle.add("rate_per_gpu_req_s")
    columns = tuple(c for c in columns
                    if c[1] not in idle and any(_field(r, c[1]) is not None for r in rows))
    knobs = list(dict.fromkeys(k for r in rows for k in (r.get("knobs") or {}) if k != "allocators"))
    head = ["point", *knobs, *(label for label, _ in columns)]
    body = []
    for r in rows:
        cells = [r.get("point_index"), *((r.get("knobs") or {}).get(k) for k in knobs)]
        for _, key in columns:
            value = _field(r, key)
            cells.append(_dur(value) if key in TIME_FIELDS else _pct(value) if key in SHARE_FIELDS
                         else _money(value) if key.startswith("usd_") else value)
        body.append(cells)
    messages = [(r.get("point_index"), r.get("allocator"), r.get("message")) for r in rows
                if r.get("status") != "ok" and r.get("message")]
    failed = _table(["point", "allocator", "why"], messages) if messages else ""
    return _table(head, body, nowrap=True) + (f"<h3>Rows without an answer</h3>{failed}" if failed else "")


def _field(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``; for ``lo..hi``, the text "[lo, hi]" (None when either is missing)."""
    lo, sep, hi = key.partition("..")
    if not sep:
        return row.get(key)
    if row.get(lo) is None or row.get(hi) is None:
        return None
    return Num(f"[{_ef(row[lo])}, {_ef(row[hi])}]")


def _capacity_caveats(rows: Sequence[Mapping[str, Any]], body: Mapping[str, Any],
                      scenario: Mapping[str, Any], dep: Mapping[str, Any]) -> str:
    items = []
    latency = dep.get("latency_model")
    chosen = scenario.get("latency") or {}
    given = any(v is not None for k, v in chosen.items() if k not in ("model", "profile", "step_s"))
    if latency:
        items.append(_latency_caveat(latency))
    elif scenario and chosen.get("model", "roofline") == "roofline":
        items.append(_latency_caveat({"latency_model": "roofline", "constants_from": "given"} if given
                                     else _default_roofline()))
    else:
        items.append('<li><span class="missing">Latency model: not recorded in the folder; the default '
                     "is the roofline, whose validated error <code>kvplan validate</code> reports."
                     "</span></li>")
    notes = dict.fromkeys([*(body.get("notes") or {}).values(),
                           *(r.get("window_note") for r in rows if r.get("window_note"))])
    items += [f"<li>{_esc(n)}</li>" for n in notes]
    rejected = [r for r in rows if r.get("status") not in (None, "ok")]
    if rejected:
        items.append(f"<li>{len(rejected)} row(s) have no answer: see “Rows without an answer”.</li>")
    items.append("<li>Rates and tokens are counted over each probe's steady window (warm-up and drain "
                 "left out); <b>req/s</b> is the highest rate at which the SLO held and the queue stayed "
                 "stable.</li>")
    return f'<ul class="caveats">{"".join(items)}</ul>'


def _default_roofline() -> dict[str, Any]:
    """The roofline's fitted defaults as a run.json would describe them."""
    from simulator.latency.constants import fit_provenance

    return {"latency_model": "roofline", "constants_from": "fitted defaults", "fit": fit_provenance()}


# --- validate -----------------------------------------------------------------------------------


def _validate_page(folder: Folder) -> Page:
    body = folder.json("validate.json") or {}
    summary = body.get("summary") or {}
    inside, held = summary.get("in_sample") or {}, summary.get("held_out") or {}
    sections = [
        Section("scenario", "What was compared", _validate_setup(body, summary)),
        Section("by-metric", "Error per metric", _error_table(inside.get("by_metric") or {},
                                                               held.get("by_metric") or {}, METRIC_LABELS)),
        Section("by-source", "Error per source", _error_table(inside.get("by_source") or {},
                                                               held.get("by_source") or {}, {})),
        Section("largest", "Largest errors", _largest_errors(folder)),
        *([Section("buckets", "Rows reported apart", _validate_buckets(summary["buckets"]))]
          if summary.get("buckets") else []),
        *([Section("coverage", "Coverage", _validate_coverage(summary["coverage"]))]
          if summary.get("coverage") else []),
        _plots_section(folder, "No plot in the folder (the run was made with --no-plots)."),
        Section("caveats", "Caveats", _validate_caveats(summary)),
        *_missing_section(folder),
    ]
    what = ("AIConfigurator's silicon sample" if summary.get("buckets") else "published GPU serving measurements")
    return Page("kvplan validate", f"{what} against kvplan's predictions",
                _validate_headline(summary), tuple(sections))


def _validate_headline(summary: Mapping[str, Any]) -> str:
    if not summary:
        return "<p>No headline: validate.json is missing.</p>"
    inside = (summary.get("in_sample") or {}).get("by_metric") or {}
    held = (summary.get("held_out") or {}).get("by_metric") or {}
    parts = "; ".join(f"{label} {_pct((inside.get(m) or {}).get('mape'))} / "
                      f"{_pct((held.get(m) or {}).get('mape'))}"
                      for m, label in METRIC_LABELS.items() if m in inside or m in held)
    overall = (summary.get("in_sample") or {}).get("overall") or {}
    errors = f"mean absolute error {_pct(overall.get('mape'))}, {_pct(overall.get('within_20pct'))} within ±20%"
    established = (summary.get("buckets") or {}).get("established")
    if isinstance(established, Mapping):  # the silicon table: the errors are the established rows'
        return (f"<p><b>{_ef(established.get('num_simulated'))} of {_ef(established.get('num_rows'))} rows whose "
                f"method is established</b> simulated: {errors}. {_ef(summary.get('num_simulated'))} of "
                f"{_ef(summary.get('num_rows'))} rows in all; the others are reported apart "
                "(<a href=\"#buckets\">Rows reported apart</a>).</p>"
                "<p>The shipped constants never saw these rows: " + "; ".join(
                    f"{label} {_pct((inside.get(m) or {}).get('mape'))}" for m, label in METRIC_LABELS.items()
                    if m in inside) + ".</p>")
    return (f"<p><b>{_ef(summary.get('num_simulated'))} of {_ef(summary.get('num_rows'))} published "
            f"measurements</b> ({_ef(summary.get('num_sources'))} sources) simulated: {errors}.</p>"
            f"<p>In sample / held-out source: {parts}.</p>")


def _validate_setup(body: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    rows: list[tuple[str, Any]] = [("table", body.get("table")),
                                   ("rows", summary.get("num_rows")),
                                   ("simulated", summary.get("num_simulated")),
                                   ("sources", summary.get("num_sources"))]
    rows += [(f"not simulated: {why}", n) for why, n in (summary.get("not_simulated") or {}).items()]
    constants = body.get("constants") or {}
    out = _kv_table(rows)
    if constants:
        out += "<h3>Roofline constants used</h3>" + _kv_table(list(constants.items()))
    return out


def _error_table(inside: Mapping[str, Any], held: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    if not inside and not held:
        return '<p class="missing">No errors recorded.</p>'
    head = ["", "rows", "MAPE in sample", "MAPE held out", "bias", "within ±20%"]
    body = []
    for key in dict.fromkeys([*(k for k in labels if k in inside or k in held), *inside, *held]):
        i, h = inside.get(key) or {}, held.get(key) or {}
        body.append([labels.get(key, key), i.get("num_rows"), _pct(i.get("mape")), _pct(h.get("mape")),
                     _pct(i.get("bias"), signed=True), _pct(i.get("within_20pct"))])
    return _table(head, body, key_column=True)


def _largest_errors(folder: Folder) -> str:
    """The rows of validate.csv furthest from their published value."""
    try:
        with (folder.path / "validate.csv").open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("error")]
    except FileNotFoundError:
        folder.missing.append("validate.csv: not in the folder")
        return '<p class="missing">validate.csv is missing.</p>'
    except (OSError, csv.Error) as err:
        folder.missing.append(f"validate.csv: unreadable ({err})")
        return '<p class="missing">validate.csv is unreadable.</p>'
    which = "rows"
    if rows and "bucket" in rows[0]:  # the silicon table: the rows the errors above are of
        rows, which = [r for r in rows if r.get("bucket") == "established"], "established rows"
    rows.sort(key=lambda r: -abs(float(r["error"])))
    head = ["row", "model", "GPU", "TP", "load", "metric", "published", "predicted", "unit", "error"]
    body = [[r.get("row_id"), r.get("model"), r.get("gpu"), _int(r.get("tensor_parallel")),
             _join(r.get("load"), r.get("load_value")),
             _join(r.get("metric"), r.get("statistic") if r.get("statistic") != "value" else None),
             _float(r.get("published")), _float(r.get("predicted")), r.get("unit"),
             _pct(_float(r.get("error")), signed=True)] for r in rows[:LARGEST_ERRORS]]
    return (f"<p>The {min(LARGEST_ERRORS, len(rows))} {which} furthest from the published value "
            "(error = predicted / published − 1); validate.csv has them all.</p>" + _table(head, body))


def _validate_coverage(cells: Any) -> str:
    """validate.json ``summary.coverage``: per GPU × engine × model family, the measurements
    simulated, refused, not expressible or without result, and the reasons."""
    if not isinstance(cells, list) or not cells:
        return '<p class="missing">No coverage recorded.</p>'
    head = ["GPU", "engine", "family", "measurements", "simulated", "refused", "not expressible",
            "no result", "why not"]
    body = []
    for c in cells:
        if not isinstance(c, Mapping):
            continue
        reasons = c.get("reasons") or {}
        why = "; ".join(f"{n} {r}" for r, n in reasons.items()) if isinstance(reasons, Mapping) else ""
        body.append([c.get("gpu"), c.get("engine"), c.get("family"), c.get("measurements"), c.get("simulated"),
                     c.get("refused"), c.get("not_expressible"), c.get("no_result"), why])
    return ("<p>What kvplan could answer: <i>refused</i> rows are deployments its start-up checks say "
            "the engine would not start; <i>not expressible</i> rows name what kvplan lacks.</p>"
            + _table(head, body))


def _validate_buckets(buckets: Any) -> str:
    """validate.json ``summary.buckets`` (the silicon table): rows by how far their method is
    established; the headline errors are the established rows'."""
    if not isinstance(buckets, Mapping):
        return '<p class="missing">No buckets recorded.</p>'
    head = ["bucket", "rows", "simulated", "MAPE", "TTFT MAPE", "TPOT MAPE"]
    body = []
    for name, b in buckets.items():
        if not isinstance(b, Mapping):
            continue
        m = b.get("by_metric") or {}
        body.append([name, b.get("num_rows"), b.get("num_simulated"), _pct(b.get("mape")),
                     _pct((m.get("ttft") or {}).get("mape")), _pct((m.get("itl/tpot") or {}).get("mape"))])
    return ("<p>Errors above are the <b>established</b> rows'; the others are kept and reported here: "
            "<i>ambiguous</i> (InferenceX's method, but a detail the sample does not record may differ), "
            "<i>method unknown</i>, <i>implausible</i> (a TTFT faster than the GPUs' dense peak allows: "
            "flagged, not fitted), <i>duplicate</i> (the same measurement as another row).</p>"
            + _table(head, body, key_column=True))


def _validate_caveats(summary: Mapping[str, Any]) -> str:
    items = []
    for metric, t in (summary.get("targets") or {}).items():
        verdict = "met" if t.get("met") else "not met"
        items.append(f"<li>Target for {_esc(METRIC_LABELS.get(metric, metric))}: held-out MAPE ≤ "
                     f"{_pct(t.get('bound'))}; measured {_pct(t.get('held_out_mape'))} — "
                     f"<b>{verdict}</b>.</li>")
    items += [f"<li>{_esc(n)}</li>" for n in summary.get("notes") or []]
    items.append("<li>Held out: each source predicted by constants fitted without it — the error to "
                 "expect on a kind of benchmark the fit never saw.</li>")
    return f'<ul class="caveats">{"".join(items)}</ul>'


# --- compare ------------------------------------------------------------------------------------


def _compare_page(folder: Folder) -> Page:
    """compare.json: measured against predicted (``kind: measured-vs-predicted``) or two runs side
    by side (``kind: runs``), each with its answer first; any other entry, and any other kind,
    rendered generically (a list of records as a table, a mapping as key/value rows)."""
    body = folder.json("compare.json")
    sections: list[Section] = []
    headline = "<p>No headline: compare.json is missing.</p>"
    shown: set[str] = set()
    if isinstance(body, Mapping):
        kind = body.get("kind")
        if kind == "measured-vs-predicted":
            headline, sections, shown = _measured_page(body)
        elif kind == "runs":
            headline, sections, shown = _runs_page(body)
        elif isinstance(body.get("headline"), str):
            headline, shown = f"<p>{_esc(body['headline'])}</p>", {"headline"}
        else:
            headline = "<p>Comparison: tables below.</p>"
        rest = [(k, v) for k, v in body.items() if k not in shown and k != "kind"]
        sections += [Section(f"c{i}", str(k), _generic(v)) for i, (k, v) in enumerate(rest)]
    elif body is not None:
        sections.append(Section("comparison", "Comparison", _generic(body)))
    plots = _plots_section(folder, "No plots in the folder.")
    sections = [*sections[:1], plots, *sections[1:], *_missing_section(folder)]
    return Page("kvplan compare", "measured or simulated against simulated", headline, tuple(sections))


def _measured_page(body: Mapping[str, Any]) -> tuple[str, list[Section], set[str]]:
    """A benchmark's measurements against kvplan's prediction: the error summary first, then
    the per-metric table, then what was measured, what it was compared with, what was inferred."""
    result, against = body.get("result") or {}, body.get("against") or {}
    summary, metrics = body.get("summary") or {}, body.get("metrics") or []
    worst = summary.get("worst") or {}
    what = _join(_esc(result.get("path", "the result")),
                 f"({_esc(result['load_text'])})" if result.get("load_text") else "")
    where = _join(_esc(against.get("path", "?")), f"[{_esc(against.get('run', '?'))}]")
    headline = (f"<p>Measured {what} against kvplan's prediction from {where}: mean |error| "
                f"<b>{_pct(summary.get('mape'))}</b> over {_ef(summary.get('num_compared'))} metrics")
    if worst:
        headline += f"; the worst, {_esc(worst.get('label'))}, {_pct(worst.get('abs_relative_error'))}"
    headline += ".</p>"
    rows = [[m.get("label"), m.get("unit"), m.get("measured"), m.get("predicted"),
             _pct(m.get("relative_error"), signed=True)] for m in metrics if isinstance(m, Mapping)]
    table = _table(["metric", "unit", "measured", "predicted", "error (predicted / measured − 1)"], rows)
    sections = [Section("metrics", "Measured vs predicted", table)]
    sections.append(Section("result", "What was measured", _generic(result)))
    sections.append(Section("against", "What it was compared with", _generic(against)))
    if body.get("inferred"):
        sections.append(Section("inferred", "Inferred from the result", _generic(body["inferred"])))
    return headline, sections, {"result", "against", "summary", "metrics", "inferred"}


def _runs_page(body: Mapping[str, Any]) -> tuple[str, list[Section], set[str]]:
    """Two simulations side by side: what differs between their setups, then B / A per metric."""
    runs = [r for r in body.get("runs") or [] if isinstance(r, Mapping)]
    rows = [r for r in body.get("rows") or [] if isinstance(r, Mapping)]
    a, b = (runs + [{}, {}])[:2]
    keys = [k for k in dict.fromkeys([*a, *b]) if k != "path"]
    differs = [k for k in keys if a.get(k) != b.get(k) and k != "label"]
    headline = (f"<p>B = <b>{_esc(b.get('label', '?'))}</b> against A = <b>{_esc(a.get('label', '?'))}</b>"
                + (f", which differ in {_esc(', '.join(differs))}" if differs else "") + ".</p>")
    key_metrics = ("throughput (req/s)", "TTFT p99 (s)", "TPOT p99 (s)")
    by_run: dict[str, list[str]] = {}
    for r in rows:
        if r.get("metric") in key_metrics and _is_number(r.get("ratio")):
            by_run.setdefault(str(r.get("run")), []).append(f"{_esc(r['metric'])} ×{_ef(r['ratio'])}")
    if by_run:
        headline += "<ul>" + "".join(f"<li>{_esc(run)}: {', '.join(parts)}</li>"
                                     for run, parts in by_run.items()) + "</ul>"
    setup = _table(["", "A", "B"], [[k, _cell(a.get(k)), _cell(b.get(k))] for k in keys], key_column=True)
    table = _table(["run", "metric", "A", "B", "B / A"],
                   [[r.get("run"), r.get("metric"), r.get("a"), r.get("b"), r.get("ratio")] for r in rows])
    return headline, [Section("pairs", "B against A", table), Section("setups", "The two runs", setup)], {"runs", "rows"}


def _generic(value: Any, depth: int = 0) -> str:
    """Any JSON value as HTML: records as tables, nested mappings as sub-headings (two levels)."""
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        keys = list(dict.fromkeys(k for v in value for k in v))
        return _table(keys, [[_cell(v.get(k)) for k in keys] for v in value])
    if isinstance(value, Mapping) and value:
        if all(isinstance(v, Mapping) for v in value.values()) and not any(
                isinstance(x, (Mapping, list)) for v in value.values() for x in v.values()):
            keys = list(dict.fromkeys(k for v in value.values() for k in v))
            rows = [[name, *(_cell(v.get(k)) for k in keys)] for name, v in value.items()]
            return _table(["", *keys], rows, key_column=True)
        if depth < 2 and any(isinstance(v, (Mapping, list)) for v in value.values()):
            scalars = [(k, _cell(v)) for k, v in value.items() if not isinstance(v, (Mapping, list))]
            nested = "".join(f"<h3>{_esc(k)}</h3>{_generic(v, depth + 1)}" for k, v in value.items()
                             if isinstance(v, (Mapping, list)))
            return (_kv_table(scalars) if scalars else "") + nested
        return _kv_table([(k, _cell(v)) for k, v in value.items()])
    if isinstance(value, list):
        return _kv_table([(str(i), _cell(v)) for i, v in enumerate(value)]) if value else "<p>(empty)</p>"
    return f"<p>{_esc(_fmt(value) if isinstance(value, (int, float)) else value)}</p>"


def _cell(value: Any) -> Any:
    """A table cell: scalars as they are, anything nested as compact JSON."""
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


# --- HTML pieces and number formats ---------------------------------------------------------------


NUM_CLASS = ' class="num"'


class Raw(str):
    """Text that is already HTML (escaped): :func:`_table` inserts it as is."""


def _table(head: Sequence[Any], rows: Iterable[Sequence[Any]], *, key_column: bool = False,
           nowrap: bool = False) -> str:
    """An HTML table; numbers formatted by :func:`_fmt`, and a column whose cells are all numbers
    (or :class:`Num` text from :func:`_dur`, :func:`_pct`, :func:`_money`; blanks aside) is
    right-aligned. ``key_column``: the first column is a row header; ``nowrap``: cells never
    wrap (short values: a name broken at its hyphen reads badly)."""
    rows = [list(r) for r in rows]
    numeric = [all(_is_number(r[j]) for r in rows if j < len(r) and r[j] not in (None, "", "—"))
               and any(j < len(r) and r[j] not in (None, "", "—") for r in rows) for j in range(len(head))]
    ths = "".join(f'<th{NUM_CLASS if numeric[j] and j else ""}>{_esc(h)}</th>' for j, h in enumerate(head))
    trs = []
    for r in rows:
        cells = []
        for j, v in enumerate(r):
            text = v if isinstance(v, Raw) else _esc(_fmt(v))
            if j == 0 and key_column:
                cells.append(f'<th class="key" scope="row">{text}</th>')
            else:
                cells.append(f"<td{NUM_CLASS if numeric[j] else ''}>{text}</td>")
        trs.append(f"<tr>{''.join(cells)}</tr>")
    attrs = ' class="nowrap"' if nowrap else ""
    return f"<table{attrs}><thead><tr>{ths}</tr></thead><tbody>{''.join(trs)}</tbody></table>"


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    """A two-column key/value table (a record: left-aligned), rows whose value is None or
    empty left out."""
    kept = [(k, v) for k, v in rows if v not in (None, "", [])]
    trs = "".join(f'<tr><th class="key" scope="row">{_esc(k)}</th>'
                  f"<td>{v if isinstance(v, Raw) else _esc(_fmt(v))}</td></tr>" for k, v in kept)
    return f"<table><tbody>{trs}</tbody></table>"


class Num(Raw):
    """Formatted number text (right-aligned like a number)."""


def _is_number(v: Any) -> bool:
    return isinstance(v, Num) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ef(value: Any) -> str:
    """:func:`_fmt`, escaped: for values put straight into HTML."""
    return _esc(_fmt(value))


def _fmt(value: Any) -> str:
    """A value for a reader: None/NaN as —, booleans yes/no, thousands separators, three
    significant digits for fractional numbers (no more than one decimal from 10 on)."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "∞" if isinstance(value, float) and value == math.inf else "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:,.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def _dur(seconds: Any) -> Num | str:
    """A duration in s: ms below one second."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
        return "—"
    if abs(seconds) < 1:
        return Num(f"{seconds * 1000:.1f} ms" if abs(seconds) < 0.1 else f"{seconds * 1000:.0f} ms")
    return Num(f"{seconds:.3g} s" if abs(seconds) < 100 else f"{seconds:,.0f} s")


def _pct(share: Any, *, signed: bool = False) -> Num | str:
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not math.isfinite(share):
        return "—"
    return Num(f"{share:+.1%}" if signed else f"{share:.1%}")


def _money(usd: Any) -> Num | str:
    if not isinstance(usd, (int, float)) or isinstance(usd, bool) or not math.isfinite(usd):
        return "—"
    return Num(f"${usd:,.2f}" if usd >= 1 else f"${usd:.3f}")


def _stat(summary: Mapping[str, Any], metric: str, stat: str) -> Any:
    return (summary.get(metric) or {}).get(stat)


def _sortable(value: Any) -> float:
    return value if isinstance(value, (int, float)) else math.inf


def _slo_text(slo: Mapping[str, Any] | None) -> str:
    """``p99 TTFT ≤ 2 s, p99 TPOT ≤ 100 ms`` from a scenario's ``slo:``."""
    if not slo:
        return ""
    bounds = [f"p99 {label} ≤ {_dur(slo[key])}" for key, label in
              (("ttft_p99_s", "TTFT"), ("tpot_p99_s", "TPOT"), ("e2e_p99_s", "E2E"))
              if slo.get(key) is not None]
    return ", ".join(bounds)


def _join(*parts: Any) -> str:
    return " ".join(str(p) for p in parts if p not in (None, "", False))


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _int(text: Any) -> int | None:
    value = _float(text)
    return int(value) if value is not None and value.is_integer() else None


__all__ = ["REPORT_NAME", "Kind", "render", "write_report"]
