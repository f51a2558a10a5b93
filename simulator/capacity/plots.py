"""The PNG plots of ``kvplan capacity``.

* ``points/NNN.png`` per sweep point: throughput, p99 TTFT, p99 TPOT and KV utilization against
  the request rate, from the search's probes, one curve per allocator (its first seed; other
  seeds as dots), the SLO bounds as horizontal lines and each allocator's answer as a vertical one;
* ``capacity_vs_block_size.png`` (when ``block_size`` is swept) and ``capacity_per_dollar.png``
  (when ``gpu`` is swept): one panel per combination of the other knobs.

Figures are :class:`matplotlib.figure.Figure` objects rendered by Agg, never pyplot (nothing
global, no leak), and saved without the "Software" PNG key, so the same data gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simulator.capacity.search import Probe, SearchResult
from simulator.capacity.sweep import CapacityRow
from simulator.scenario import SLOSpec

DPI = 110
MAX_PANELS = 24  # beyond this a faceted figure is unreadable; the CSV holds every point
_RC: dict[str, Any] = {
    "font.size": 9, "axes.titlesize": 9, "legend.fontsize": 8, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.color": "#E6E6E6", "axes.axisbelow": True,
}
# Okabe-Ito (colour-blind safe); the same allocator keeps its colour as in `simulate`'s plots.
_COLOURS = {"paged": "#0072B2", "contiguous-max": "#D55E00", "contiguous-pow2": "#E69F00",
            "contiguous-oracle": "#009E73"}
_OTHER = ("#CC79A7", "#56B4E9", "#000000", "#999999")
_STYLES = ("-", "--", "-.", ":")


def _colour(allocator: str, i: int) -> str:
    return _COLOURS.get(allocator, _OTHER[i % len(_OTHER)])


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    return path


# --- per point: metrics vs rate -------------------------------------------------------------

_PANELS: tuple[tuple[str, str, Callable[[Probe], float | None]], ...] = (
    ("throughput (output tok/s)", "throughput", lambda p: p.throughput_tok_s),
    ("p99 TTFT (s)", "ttft", lambda p: p.ttft_p99_s),
    ("p99 TPOT (s)", "tpot", lambda p: p.tpot_p99_s),
    ("KV pool allocated (time-avg share)", "kv", lambda p: p.kv_used_mean),
)


def plot_point(path: Path, title: str, searches: Mapping[str, Sequence[SearchResult]], slo: SLOSpec) -> Path:
    """Metrics against the request rate for one point; ``searches`` maps allocator -> its seeds."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(10, 6.5))  # fixed margins: a constrained layout doubles the render time
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.08, top=0.92, wspace=0.22, hspace=0.12)
        axes = fig.subplots(2, 2, sharex=True).ravel()
        bounds = {"ttft": slo.ttft_p99_s, "tpot": slo.tpot_p99_s}
        for ax, (label, key, value) in zip(axes, _PANELS):
            for i, (allocator, results) in enumerate(searches.items()):
                _probe_curve(ax, allocator, i, results, value)
            if bounds.get(key) is not None:
                ax.axhline(bounds[key], color="#CC0000", linewidth=1, linestyle=":", label="SLO")
            if key in ("ttft", "tpot"):
                ax.set_yscale("log")
            ax.set_ylabel(label)
            if not ax.has_data():
                ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center", color="#777777")
        for ax in axes[2:]:
            ax.set_xlabel("request rate (req/s)")
        axes[0].legend(loc="best")
        fig.suptitle(title)
        return _save(fig, path)


def _probe_curve(ax: Axes, allocator: str, i: int, results: Sequence[SearchResult],
                 value: Callable[[Probe], float | None]) -> None:
    colour = _colour(allocator, i)
    for k, result in enumerate(results):
        points = sorted((p.rate_req_s, v) for p in result.probes
                        if (v := value(p)) is not None and math.isfinite(v))
        if not points:
            continue
        xs, ys = zip(*points)
        if k == 0:
            ax.plot(xs, ys, marker="o", markersize=3, color=colour, linestyle=_STYLES[i % len(_STYLES)],
                    label=allocator)
        else:
            ax.plot(xs, ys, marker=".", linestyle="none", color=colour, alpha=0.5)
    if results and results[0].lo_rate_req_s > 0 and ax.has_data():
        ax.axvline(results[0].lo_rate_req_s, color=colour, linewidth=0.8, linestyle="--", alpha=0.7)


# --- across points --------------------------------------------------------------------------


def _facets(rows: Sequence[CapacityRow], knob: str) -> dict[str, list[CapacityRow]]:
    """Rows that found a rate, grouped by the other knobs that vary (one panel per group);
    empty unless ``knob`` takes at least two values."""
    found = [r for r in rows if r.status in ("ok", "unbounded") and knob in r.knobs]
    if len({_text(r.knobs[knob]) for r in found}) < 2:
        return {}
    others = dict.fromkeys(k for r in found for k in r.knobs if k not in (knob, "allocators"))
    varying = [k for k in others if len({_text(r.knobs.get(k)) for r in found}) > 1]
    groups: dict[str, list[CapacityRow]] = {}
    for row in found:
        parts = [f"{k}={_text(row.knobs.get(k))}" for k in varying]
        label = "\n".join(", ".join(parts[i:i + 2]) for i in range(0, len(parts), 2))
        groups.setdefault(label, []).append(row)
    return dict(list(groups.items())[:MAX_PANELS])


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _grid(num: int, title: str) -> tuple[Figure, list[Axes]]:
    cols = min(4, num)
    nrows = math.ceil(num / cols)
    fig = Figure(figsize=(3.6 * cols, 2.9 * nrows + 0.6), layout="constrained")
    axes = list(fig.subplots(nrows, cols, squeeze=False).ravel())
    for ax in axes[num:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes


def plot_capacity_vs_block_size(path: Path, rows: Sequence[CapacityRow]) -> Path | None:
    """Max rate (with the seeds' range) against block size, a line per allocator."""
    facets = _facets(rows, "block_size")
    if not facets:
        return None
    with mpl.rc_context(_RC):
        fig, axes = _grid(len(facets), "capacity vs block size (max req/s under the SLO)")
        for ax, (label, group) in zip(axes, facets.items()):
            for i, allocator in enumerate(dict.fromkeys(r.allocator for r in group)):
                pts = sorted((int(r.knobs["block_size"]), r) for r in group if r.allocator == allocator)
                xs = [x for x, _ in pts]
                ys = [r.max_rate_req_s or 0.0 for _, r in pts]
                low = [y - (r.rate_ci_low_req_s or y) for y, (_, r) in zip(ys, pts)]
                high = [(r.rate_ci_high_req_s or y) - y for y, (_, r) in zip(ys, pts)]
                ax.errorbar(xs, ys, yerr=[low, high], marker="o", markersize=3, capsize=2,
                            color=_colour(allocator, i), linestyle=_STYLES[i % len(_STYLES)], label=allocator)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({int(r.knobs["block_size"]) for r in group}),
                          [str(b) for b in sorted({int(r.knobs["block_size"]) for r in group})])
            ax.set_title(label or "all points")
            ax.set_xlabel("block size (tokens)")
            ax.set_ylabel("max rate (req/s)")
        axes[0].legend(loc="best")
        return _save(fig, path)


def plot_capacity_per_dollar(path: Path, rows: Sequence[CapacityRow]) -> Path | None:
    """Requests served per USD of GPU time at the max rate, bars per GPU and allocator."""
    facets = _facets([r for r in rows if r.price_usd_per_gpu_hour and r.num_gpus], "gpu")
    if not facets:
        return None
    with mpl.rc_context(_RC):
        fig, axes = _grid(len(facets), "capacity per dollar (requests per USD of GPU time at the max rate)")
        for ax, (label, group) in zip(axes, facets.items()):
            gpus = list(dict.fromkeys(str(r.knobs["gpu"]) for r in group))
            allocators = list(dict.fromkeys(r.allocator for r in group))
            width = 0.8 / len(allocators)
            for i, allocator in enumerate(allocators):
                mine = [r for r in group if r.allocator == allocator]
                xs = [gpus.index(str(r.knobs["gpu"])) + (i - (len(allocators) - 1) / 2) * width for r in mine]
                ys = [(r.max_rate_req_s or 0.0) * 3600
                      / ((r.price_usd_per_gpu_hour or 1.0) * (r.num_gpus or 1)) for r in mine]
                ax.bar(xs, ys, width, color=_colour(allocator, i), label=allocator)
            ax.set_xticks(range(len(gpus)), gpus)
            ax.set_title(label or "all points")
            ax.set_ylabel("requests per USD")
        axes[0].legend(loc="best")
        return _save(fig, path)
