"""``kvplan compare RUN_A RUN_B``: two ``simulate`` folders side by side — the planner's what-if
("fp8 KV vs fp16", "H200 vs H100").

Runs are paired by name (allocator, or engine/allocator): for each name both folders hold, every
headline figure of the two summaries and their ratio B / A; a name only one folder holds is
shown alone. The output folder holds:

* ``compare.json`` — ``{"kind": "runs", "runs": [{label, path, model, gpu, tensor_parallel,
  kv_cache_dtype, kv_capacity_tokens, engine}], "rows": [{run, metric, label, a, b, ratio}]}``;
* ``compare.csv`` — the rows;
* ``compare_latency_cdf.png`` — TTFT and TPOT CDFs of both folders' finished requests overlaid
  (A solid, B dashed), from requests.csv;
* ``compare_kv.png`` — KV slots in use over time (token state, reserved and internal
  fragmentation: what the allocator holds), summed over replicas, with each pool's capacity
  dotted, from steps.csv.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.commands.compare.against import RunFolder
from simulator.errors import KvplanError

# (label, path into a summary entry; "×cap" multiplies a fraction by the pool's token capacity)
HEADLINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("throughput (req/s)", ("throughput_req_s",)),
    ("output throughput (tok/s)", ("throughput_tok_s",)),
    ("TTFT p50 (s)", ("ttft_s", "p50")), ("TTFT p99 (s)", ("ttft_s", "p99")),
    ("TPOT p50 (s)", ("tpot_s", "p50")), ("TPOT p99 (s)", ("tpot_s", "p99")),
    ("E2E p50 (s)", ("e2e_s", "p50")), ("E2E p99 (s)", ("e2e_s", "p99")),
    ("KV pool (tokens)", ("kv", "kv_capacity_tokens")),
    ("KV peak (tokens)", ("kv", "peak_token_state", "×cap")),
    ("KV peak (share of pool)", ("kv", "peak_token_state")),
    ("preemptions", ("num_preemptions",)),
    ("mean concurrency", ("mean_batch_size",)),
    ("max concurrency", ("max_batch_size",)),
    ("rejected", ("rejected",)),
)
_HELD = ("kv_token_state", "kv_reserved", "kv_internal_fragmentation")


@dataclass(frozen=True)
class RunsRow:
    run: str
    label: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a


def headline(entry: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """One headline figure of a summary entry (None when the run has none)."""
    node: Any = entry
    keys = [k for k in path if k != "×cap"]
    for key in keys:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    value = float(node)
    if "×cap" in path:
        value *= float(entry["kv"]["kv_capacity_tokens"])
    return value


def pair_rows(a: RunFolder, b: RunFolder) -> list[RunsRow]:
    """Every headline figure of every run name in A or B (A's order first)."""
    names = list(a.summary) + [n for n in b.summary if n not in a.summary]
    return [RunsRow(name, label, headline(a.summary[name], path) if name in a.summary else None,
                    headline(b.summary[name], path) if name in b.summary else None)
            for name in names for label, path in HEADLINE]


def describe_run(folder: RunFolder, label: str) -> dict[str, Any]:
    dep = folder.run.get("deployment", {})
    return {"label": label, "path": str(folder.path), "model": dep.get("model"), "gpu": dep.get("gpu"),
            "tensor_parallel": dep.get("tensor_parallel"), "kv_cache_dtype": dep.get("kv_cache_dtype"),
            "kv_capacity_tokens": dep.get("kv_capacity_tokens"), "engine": dep.get("engine")}


def labels(a: RunFolder, b: RunFolder) -> tuple[str, str]:
    """Names for the two folders: their own names, or their paths when the names agree."""
    if a.name != b.name:
        return a.name, b.name
    return str(a.path), str(b.path)


def payload(a: RunFolder, b: RunFolder, rows: Sequence[RunsRow]) -> dict[str, Any]:
    la, lb = labels(a, b)
    return {"kind": "runs", "runs": [describe_run(a, la), describe_run(b, lb)],
            "rows": [{"run": r.run, "metric": r.label, "a": r.a, "b": r.b, "ratio": r.ratio} for r in rows]}


def print_runs(console: Any, a: RunFolder, b: RunFolder, rows: Sequence[RunsRow], out_dir: Path) -> None:
    from rich.table import Table

    la, lb = labels(a, b)
    console.print(f"A = {la}: {_setup(a)}")
    console.print(f"B = {lb}: {_setup(b)}")
    for name in dict.fromkeys(r.run for r in rows):
        table = Table(title=name, title_justify="left")
        for col in ("metric", "A", "B", "B / A"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for r in (r for r in rows if r.run == name):
            table.add_row(r.label, _num(r.a), _num(r.b), "—" if r.ratio is None else f"{r.ratio:.3g}×")
        console.print(table)
    console.print(f"results in {out_dir}/")


def _setup(folder: RunFolder) -> str:
    dep = folder.run.get("deployment", {})
    return f"{dep.get('model', '?')}, {dep.get('gpu', '?')}, TP {dep.get('tensor_parallel', '?')}, " \
           f"KV {dep.get('kv_cache_dtype', '?')}"


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:.4g}"


def write_plots(out_dir: Path, a: RunFolder, b: RunFolder) -> None:
    """compare_latency_cdf.png and compare_kv.png (module docstring)."""
    import pandas as pd

    la, lb = labels(a, b)
    frames = {}
    for folder in (a, b):
        requests = pd.read_csv(folder.path / "requests.csv", usecols=["allocator", "status", "ttft_s", "tpot_s"])
        steps = pd.read_csv(folder.path / "steps.csv", usecols=["allocator", "time_s", "duration_s", *_HELD])
        frames[folder.path] = (requests, steps)
    _latency_figure(la, lb, frames[a.path][0], frames[b.path][0]).savefig(out_dir / "compare_latency_cdf.png")
    caps = {la: _capacities(a), lb: _capacities(b)}
    _kv_figure(la, lb, frames[a.path][1], frames[b.path][1], caps).savefig(out_dir / "compare_kv.png")


def _capacities(folder: RunFolder) -> dict[str, float]:
    """KV pool (tokens, all replicas) per run name."""
    replicas = int(folder.run.get("deployment", {}).get("num_replicas", 1) or 1)
    return {name: float(s["kv"]["kv_capacity_tokens"]) * replicas for name, s in folder.summary.items()}


_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#000000")


def _latency_figure(la: str, lb: str, ra: Any, rb: Any) -> Any:
    from matplotlib.figure import Figure

    names = list(dict.fromkeys([*ra["allocator"].unique(), *rb["allocator"].unique()]))
    fig = Figure(figsize=(12, 5.2), dpi=120, layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (column, title) in zip(axes, (("ttft_s", "TTFT (time to first token)"),
                                          ("tpot_s", "TPOT (time per output token)"))):
        pooled = [_finished(r, n, column) for r in (ra, rb) for n in names]
        values = np.concatenate([p for p in pooled if len(p)] or [np.zeros(0)])
        if not len(values):
            ax.text(0.5, 0.5, "no finished requests", ha="center", transform=ax.transAxes)
            continue
        scale, unit = (1e3, "ms") if np.percentile(values, 99) < 1.0 else (1.0, "s")
        for i, name in enumerate(names):
            for frame, label, style in ((ra, la, "-"), (rb, lb, "--")):
                v = np.sort(_finished(frame, name, column)) * scale
                if len(v):
                    p99 = np.percentile(v, 99)
                    ax.plot(v, np.arange(1, len(v) + 1) / len(v), drawstyle="steps-post", linestyle=style,
                            color=_COLOURS[i % len(_COLOURS)], linewidth=1.6,
                            label=f"{label} · {name}: p99 {p99:.4g} {unit}")
        ax.axhline(0.99, color="#888888", linewidth=0.7, linestyle=":")
        ax.set_title(title, loc="left")
        ax.set_xlabel(f"latency ({unit})")
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.02)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False, fontsize=8.5)
    fig.suptitle(f"Latency CDFs: {la} (solid) vs {lb} (dashed)")
    return fig


def _finished(frame: Any, name: str, column: str) -> np.ndarray:
    mine = frame[(frame["allocator"] == name) & (frame["status"] == "finished")]
    v = mine[column].to_numpy(dtype=np.float64)
    return v[np.isfinite(v)]


def _kv_figure(la: str, lb: str, sa: Any, sb: Any, caps: dict[str, dict[str, float]]) -> Any:
    from matplotlib.figure import Figure

    names = list(dict.fromkeys([*sa["allocator"].unique(), *sb["allocator"].unique()]))
    fig = Figure(figsize=(12, 4.8), dpi=120, layout="constrained")
    ax = fig.subplots()
    curves = []
    for i, name in enumerate(names):
        for frame, label, style in ((sa, la, "-"), (sb, lb, "--")):
            mine = frame[frame["allocator"] == name]
            if len(mine):
                held = mine[list(_HELD)].sum(axis=1).groupby(mine["time_s"]).sum()  # all replicas per bin
                curves.append((name, label, style, _COLOURS[i % len(_COLOURS)], held, caps[label].get(name)))
    top = max((float(c[4].max()) for c in curves), default=1.0) or 1.0
    # A pool far above what the runs held would flatten every curve: its line is drawn only when
    # it fits on a scale that still shows the curves; the legend gives every pool's size.
    shown_caps = [c[5] for c in curves if c[5] and c[5] <= 3 * top]
    for name, label, style, colour, held, cap in curves:
        ax.plot(held.index, held.to_numpy(), linestyle=style, color=colour, linewidth=1.4,
                drawstyle="steps-post", label=f"{label} · {name} (pool {cap:,.0f})" if cap else f"{label} · {name}")
        if cap in shown_caps:
            ax.axhline(cap, color=colour, linestyle=":", linewidth=1.0)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV token slots held")
    ax.set_ylim(0, 1.1 * max([top, *shown_caps]))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    key = "solid: A, dashed: B" + ("\ndotted: pool size" if shown_caps else "\n(pools off the scale)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8.5,
              title=key, title_fontsize=8.5, alignment="left")
    fig.suptitle(f"KV held over time (token state + reserved + internal fragmentation): {la} vs {lb}")
    return fig


def check_pairable(a: RunFolder, b: RunFolder) -> None:
    """Two folders that share no run name cannot be paired: say so rather than print halves."""
    if not set(a.summary) & set(b.summary):
        raise KvplanError(f"{a.path} ({', '.join(a.summary)}) and {b.path} ({', '.join(b.summary)}) "
                          "share no allocator to compare")
