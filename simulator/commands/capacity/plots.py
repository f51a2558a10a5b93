"""The PNG plots of ``kvplan capacity``.

* ``points/NNN.png`` per sweep point: throughput, p99 TTFT, p99 TPOT and KV utilization against
  the request rate, from the search's probes that ran to the end (one stopped early, its SLO
  certainly broken, measured nothing to plot: an x on the rate axis marks its rate), one curve
  per allocator (its first seed; other
  seeds as dots), the SLO bounds as horizontal lines and each allocator's answer as a vertical one,
  a legend under the panels naming each kind of line;
* ``capacity_vs_block_size.png`` (when ``block_size`` is swept) and ``capacity_per_dollar.png``
  (when ``gpu`` is swept): one panel per combination of the other knobs;
* ``pareto.png`` (``--search concurrency``): output tokens/s per GPU against output tokens/s per
  user over 1, 2, 4, ... closed-loop clients, a line per point and allocator, the Pareto
  frontier across all of them (:mod:`simulator.commands.capacity.pareto`).

Legends sit under or beside the panels, never over the data. Figures are
:class:`matplotlib.figure.Figure` objects rendered by Agg, never pyplot (nothing
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
from matplotlib.lines import Line2D


from simulator.commands.capacity.pareto import ParetoPoint
from simulator.commands.capacity.search import Probe, SearchResult
from simulator.commands.capacity.sweep import CapacityRow
from simulator.report.plots import readable_log_axis
from simulator.config.scenario import SLOSpec

DPI = 110
MAX_PANELS = 24  # beyond this a faceted figure is unreadable; the CSV holds every point
TITLE_CHARS = 100  # a point figure's title longer than this is broken after its setup
_RC: dict[str, Any] = {
    "font.size": 9, "axes.titlesize": 9, "legend.fontsize": 8, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.color": "#E6E6E6", "axes.axisbelow": True,
}
# Okabe-Ito (colour-blind safe); the same allocator keeps its colour as in `simulate`'s plots.
_COLOURS = {"paged": "#0072B2", "contiguous-max": "#D55E00", "contiguous-pow2": "#E69F00",
            "contiguous-oracle": "#009E73"}
_OTHER = ("#CC79A7", "#56B4E9", "#000000", "#999999")
_STYLES = ("-", "--", "-.", ":")
SLO_COLOUR = "#CC0000"


def _colour(allocator: str, i: int) -> str:
    return _COLOURS.get(allocator, _OTHER[i % len(_OTHER)])


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    return path


# --- per point: metrics vs rate -------------------------------------------------------------

_PANELS: tuple[tuple[str, str, Callable[[Probe], float | None]], ...] = (
    # served, not counted at arrival: past capacity the curve flattens (search.py, served_tok_s)
    ("throughput (output tok/s served)", "throughput", lambda p: p.served_tok_s),
    ("p99 TTFT (s)", "ttft", lambda p: p.ttft_p99_s),
    ("p99 TPOT (s)", "tpot", lambda p: p.tpot_p99_s),
    ("KV pool allocated (time-avg share)", "kv", lambda p: p.kv_used_mean),
)


def plot_point(path: Path, title: str, searches: Mapping[str, Sequence[SearchResult]], slo: SLOSpec) -> Path:
    """Write :func:`point_figure` to ``path``."""
    with mpl.rc_context(_RC):
        return _save(point_figure(title, searches, slo), path)


def point_figure(title: str, searches: Mapping[str, Sequence[SearchResult]], slo: SLOSpec) -> Figure:
    """Metrics against the request rate for one point; ``searches`` maps allocator -> its seeds.

    A legend under the panels names every kind of line: the allocators' probe curves, the SLO
    bounds (dotted red, their values written at the line's right end too) and each allocator's
    capacity (dashed vertical line in its colour at the highest rate that met the SLO, the rate
    written at its top)."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(10, 7))  # fixed margins: a constrained layout doubles the render time
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.92, wspace=0.22, hspace=0.12)
        axes = fig.subplots(2, 2, sharex=True).ravel()
        bounds = {"ttft": slo.ttft_p99_s, "tpot": slo.tpot_p99_s}
        for ax, (label, key, value) in zip(axes, _PANELS):
            for i, (allocator, results) in enumerate(searches.items()):
                _probe_curve(ax, allocator, i, results, value, label_capacity=key == "throughput")
            bound = bounds.get(key)
            if bound is not None:
                ax.axhline(bound, color=SLO_COLOUR, linewidth=1.1, linestyle=":")
                # at the left end: latency rises with the rate, so the curves reach the bound on the right
                ax.annotate(f"SLO {bound:g} s", (0.0, bound), xycoords=("axes fraction", "data"),
                            xytext=(3, 3), textcoords="offset points", ha="left", va="bottom",
                            fontsize=8, color=SLO_COLOUR)
            if key in ("ttft", "tpot") and ax.has_data():
                # log: p99 latency climbs by orders of magnitude past capacity; a few labelled
                # ticks whatever the span (linear when it is too narrow for them)
                ax.set_yscale("log")
                if readable_log_axis(ax):
                    label = label.replace(" (s)", " (s, log scale)")
            ax.set_ylabel(label)
            if not ax.has_data():
                ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center", color="#777777")
        for ax in axes[2:]:
            ax.set_xlabel("request rate (req/s)")
        handles = _point_legend(searches, slo)
        ncol = min(3, math.ceil(len(handles) / 2))  # wider rows leave the figure
        fig.subplots_adjust(bottom=0.10 + 0.03 * math.ceil(len(handles) / ncol))
        fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
        if len(title) > TITLE_CHARS and " — " in title:  # one line would run off the figure
            title = title.replace(" — ", "\n", 1)
            fig.subplots_adjust(top=0.89)
        fig.suptitle(title)
        return fig


def _point_legend(searches: Mapping[str, Sequence[SearchResult]], slo: SLOSpec) -> list[Line2D]:
    """Legend entries of :func:`plot_point`: one per allocator, then the kinds of lines."""
    handles = [Line2D([], [], color=_colour(a, i), linestyle=_STYLES[i % len(_STYLES)], marker="o",
                      markersize=3, label=f"{a}: probes (first seed)") for i, a in enumerate(searches)]
    if any(len(results) > 1 for results in searches.values()):
        handles.append(Line2D([], [], color="#555555", marker=".", linestyle="none", alpha=0.6,
                              label="probes of the other seeds"))
    parts = [f"p99 {name} ≤ {bound:g} s" for name, bound in (("TTFT", slo.ttft_p99_s),
                                                              ("TPOT", slo.tpot_p99_s)) if bound is not None]
    if parts:
        handles.append(Line2D([], [], color=SLO_COLOUR, linestyle=":", linewidth=1.1,
                              label="SLO: " + ", ".join(parts)))
    handles.append(Line2D([], [], color="#555555", linestyle="--", linewidth=0.8,
                          label="capacity: highest rate meeting the SLO (allocator's colour)"))
    if any(p.stopped_at_s is not None for results in searches.values() for p in results[0].probes):
        handles.append(Line2D([], [], color="#555555", marker="x", markersize=5, linestyle="none",
                              label="probe stopped early: its SLO certainly broken"))
    return handles


def _probe_curve(ax: Axes, allocator: str, i: int, results: Sequence[SearchResult],
                 value: Callable[[Probe], float | None], *, label_capacity: bool = False) -> None:
    colour = _colour(allocator, i)
    for k, result in enumerate(results):
        points = sorted((p.rate_req_s, v) for p in result.probes
                        if p.stopped_at_s is None and (v := value(p)) is not None and math.isfinite(v))
        if not points:
            continue
        xs, ys = zip(*points)
        if k == 0:
            ax.plot(xs, ys, marker="o", markersize=3, color=colour, linestyle=_STYLES[i % len(_STYLES)],
                    label=allocator)
        else:
            ax.plot(xs, ys, marker=".", linestyle="none", color=colour, alpha=0.5)
    stopped = sorted(p.rate_req_s for p in results[0].probes if p.stopped_at_s is not None) if results else []
    if stopped:  # failed probes with no statistics to draw: mark their rates on the axis
        ax.plot(stopped, [0.03] * len(stopped), transform=ax.get_xaxis_transform(), marker="x",
                markersize=5, linestyle="none", color=colour, clip_on=False)
    if results and results[0].lo_rate_req_s > 0 and ax.has_data():
        rate = results[0].lo_rate_req_s
        ax.axvline(rate, color=colour, linewidth=0.8, linestyle="--", alpha=0.7)
        if label_capacity:
            ax.annotate(f"{rate:.3g}", (rate, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                        textcoords="offset points", ha="left", va="top", fontsize=8, color=colour)


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


def _legend_below(fig: Figure, axes: Sequence[Axes], *extra: Any) -> None:
    """One legend for every panel, under them (a legend inside a panel covers its data): each
    allocator once, in first-seen order, then ``extra`` handles."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    handles = [*seen.values(), *extra]
    labels = [*seen, *(h.get_label() for h in extra)]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)


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
        _legend_below(fig, axes, Line2D([], [], color="#555555", marker="|", markersize=8, linestyle="none",
                                        label="bars: range (seeds and bisection)"))
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
        _legend_below(fig, axes)
        return _save(fig, path)


# --- throughput vs per-user speed over concurrency -------------------------------------------

MAX_PARETO_LINES = 24  # beyond this the legend is unreadable; pareto.csv holds every point
_LINE_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999")


def plot_pareto(path: Path, points: Sequence[ParetoPoint], subtitle: str = "") -> Path | None:
    """Output tok/s per GPU against output tok/s per user: one line per (sweep point, allocator)
    through its concurrencies (labelled at each marker; hollow where the SLO failed), and the
    Pareto frontier across every line. Lines drawn first are wider, so a line that another one
    covers exactly still shows at its edges. None when there is nothing to draw."""
    lines: dict[tuple[int, str], list[ParetoPoint]] = {}
    for p in points:
        lines.setdefault((p.point_index, p.allocator), []).append(p)
    if not lines:
        return None
    allocators = list(dict.fromkeys(a for _, a in lines))
    varying = _varying_knobs([p.knobs for p in points])
    with mpl.rc_context(_RC):
        wide = len(lines) > 6  # long labels: a wider figure for the legend beside the axes
        fig = Figure(figsize=(12.5 if wide else 11, 6), layout="constrained")
        ax = fig.subplots()
        shown = list(lines.items())[:MAX_PARETO_LINES]
        labelled: set[tuple[str, float, float]] = set()
        for i, ((index, allocator), mine) in enumerate(shown):
            mine = sorted(mine, key=lambda p: p.concurrency)
            single = len(lines) == len(allocators)  # one sweep point: colour by allocator
            colour = (_colour(allocator, allocators.index(allocator)) if single
                      else _LINE_COLOURS[i % len(_LINE_COLOURS)])
            style = _STYLES[allocators.index(allocator) % len(_STYLES)]
            knobs = ", ".join(f"{k}={_text(mine[0].knobs.get(k))}" for k in varying)
            label = f"{allocator}" + (f" — {knobs}" if knobs else "")
            xs = [p.tok_s_per_user for p in mine]
            ys = [p.tok_s_per_gpu for p in mine]
            width = 1.4 + 2.0 * (len(shown) - 1 - i) / max(1, len(shown) - 1)
            ax.plot(xs, ys, color=colour, linestyle=style, linewidth=width, label=label, zorder=3)
            for p, x, y in zip(mine, xs, ys):
                ax.plot([x], [y], marker="o", markersize=5, color=colour, zorder=4,
                        markerfacecolor=colour if p.slo_ok else "white")
                key = (str(p.concurrency), round(x, 6), round(y, 6))
                if key not in labelled:  # identical points of two lines: one label
                    labelled.add(key)
                    ax.annotate(key[0], (x, y), textcoords="offset points", xytext=(4, 4),
                                fontsize=7, color="#333333")
        front = sorted((p.tok_s_per_user, p.tok_s_per_gpu) for p in points if p.on_frontier)
        if front:
            fx, fy = zip(*front)
            ax.plot(fx, fy, color="#999999", linewidth=7, alpha=0.35, solid_capstyle="round",
                    label="Pareto frontier", zorder=2)
        ax.plot([], [], marker="o", linestyle="none", color="#555555", markerfacecolor="white",
                label="SLO missed (hollow)")
        ax.set_xlabel("output tokens/s per user (output tok/s ÷ clients)")
        ax.set_ylabel("output tokens/s per GPU")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title("throughput vs per-user speed over closed-loop concurrency (marker labels: clients)"
                     + (f"\n{subtitle}" if subtitle else ""))
        # beside the axes, never over them: the frontier and the lines fill the plot's corners
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        return _save(fig, path)


def _varying_knobs(knob_sets: Sequence[dict[str, Any]]) -> list[str]:
    """Knobs (other than allocators) whose value differs between sweep points."""
    names = dict.fromkeys(k for knobs in knob_sets for k in knobs if k != "allocators")
    return [k for k in names if len({_text(knobs.get(k)) for knobs in knob_sets}) > 1]
