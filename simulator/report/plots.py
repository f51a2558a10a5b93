"""The PNG plots of ``kvplan simulate``: one trace, several KV allocators, side by side.

:func:`write_plots` takes plain data — the per-step and per-request tables and the summary dict
of each allocator — and writes four figures:

* ``kv_memory.png``  where the KV pool goes over time (token state / reserved / internal
  fragmentation / external fragmentation / free), one stacked panel per allocator;
* ``batch_size.png`` running sequences and the waiting queue over time;
* ``latency_cdf.png`` TTFT and TPOT distributions of the finished requests, with the SLO bounds;
* ``allocators.png`` what decides between allocators: p99 TTFT (against the SLO; a saturated run,
  whose queue grows through the trace, hatched), peak concurrency and KV fragmentation.

Legends sit beside or below the data, never on it: a curve of interest hidden under a legend box
is a wrong reading waiting to happen.

Step tables can hold millions of rows, so time series are reduced to ~800 bins first; a bin holds
the *time-weighted* mean over its span (:func:`binned_integrals`), exact however long the steps
are. The figures are built on :class:`matplotlib.figure.Figure` objects rendered by Agg, never
through pyplot: nothing is registered globally (no figure to close, no leak), the caller's
backend stays as it is, and the same data gives byte-identical PNGs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, PercentFormatter

from simulator.errors import KvplanError

NUM_TIME_BINS = 800
DPI = 120
MAX_CDF_POINTS = 2000  # points drawn per CDF curve; a million requests plot as fast as a hundred

# (column of steps_df, legend label, colour). Okabe-Ito colours (colour-blind safe): blues for
# memory that holds or will hold tokens, orange/vermillion for waste, light grey for free.
KV_LAYERS: tuple[tuple[str, str, str], ...] = (
    ("kv_token_state", "token state", "#0072B2"),
    ("kv_reserved", "reserved (future tokens)", "#56B4E9"),
    ("kv_internal_fragmentation", "internal frag.", "#E69F00"),
    ("kv_external_fragmentation", "external frag.", "#D55E00"),
    ("kv_free", "free", "#DDDDDD"),
)
KV_COLUMNS = tuple(layer[0] for layer in KV_LAYERS)

# The same allocator keeps its colour in every figure and every scenario.
_KNOWN_COLOURS = {
    "paged": "#0072B2",
    "contiguous-max": "#D55E00",
    "contiguous-pow2": "#E69F00",
    "contiguous-oracle": "#009E73",
}
_OTHER_COLOURS = ("#CC79A7", "#56B4E9", "#000000", "#F0E442", "#999999")
_LINESTYLES = ("-", "--", "-.", ":")  # also tells curves apart in greyscale

STEP_COLUMNS_NEEDED = ("allocator", "replica", "step", "time_s", "duration_s",
                       "num_running_seqs", "num_waiting", *KV_COLUMNS)
REQUEST_COLUMNS_NEEDED = ("allocator", "status", "ttft_s", "tpot_s")
SUMMARY_FIELDS_NEEDED = (("kv", "token_state"), ("kv", "internal_fragmentation"),
                         ("kv", "external_fragmentation"), ("kv", "kv_capacity_tokens"),
                         ("max_batch_size",), ("ttft_s", "p99"))
SLO_COLOUR = "#CC0000"
SLO_STYLE = (0, (5, 3))  # dashed: reads as a bound, not as data

_RC: dict[str, Any] = {
    "font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 13,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.color": "#E6E6E6", "grid.linewidth": 0.8, "axes.axisbelow": True,
    "svg.hashsalt": "kvplan", "path.simplify": True,
}


@dataclass(frozen=True, slots=True)
class TimeAxis:
    """The common time axis of the time-series figures: bin edges in seconds, and the unit
    (s, min or h) that suits the span for display."""

    edges_s: np.ndarray
    unit: str
    seconds_per_unit: float

    def display(self, times_s: np.ndarray) -> np.ndarray:
        """Times in the display unit."""
        return times_s / self.seconds_per_unit


FIGURES = ("kv_memory", "batch_size", "latency_cdf", "allocators")  # simulate's PNGs, in order


def write_plots(out_dir: Path, steps_df: pd.DataFrame, requests_df: pd.DataFrame,
                summary: Mapping[str, Mapping[str, Any]], *, title: str = "",
                slo_ttft_p99_s: float | None = None, slo_tpot_p99_s: float | None = None,
                step_groups: Sequence[str] | None = None) -> list[Path]:
    """Write the four figures of a simulation into ``out_dir`` (created if missing).

    ``steps_df`` has one row per engine step (columns in :data:`STEP_COLUMNS_NEEDED`; the KV
    columns are token slots and sum to the pool capacity), ``requests_df`` one row per request,
    ``summary`` one entry per allocator (``kv.token_state`` …, ``max_batch_size``,
    ``ttft_s.p99``; optionally ``saturated``). ``slo_ttft_p99_s`` / ``slo_tpot_p99_s``, when
    given, are drawn as bounds. Allocators appear in the summary's order, then any others sorted.
    Empty tables, one allocator, all requests rejected and NaNs give figures that say so.
    ``step_groups``: the ``allocator`` values of ``steps_df`` that the step figures (KV memory,
    batch size) draw, when they are not the allocators (the pools of a disaggregated run).
    Returns the written paths: kv_memory, batch_size, latency_cdf, allocators (PNG).
    Raises :class:`KvplanError` if a column or summary field is missing or ``out_dir`` is a file.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise KvplanError(f"plot output folder '{out_dir}' exists and is not a folder")
    builders = _figure_builders(steps_df, requests_df, summary, title=title, slo_ttft_p99_s=slo_ttft_p99_s,
                                slo_tpot_p99_s=slo_tpot_p99_s, step_groups=step_groups)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with mpl.rc_context(_RC):  # the look must not depend on the user's matplotlibrc
        for name in FIGURES:
            path = out_dir / f"{name}.png"
            # No "Software" key: the PNG then holds no version string and no timestamp.
            builders[name]().savefig(path, dpi=DPI, format="png", metadata={"Software": None})
            paths.append(path)
    return paths


def build_figure(name: str, steps_df: pd.DataFrame, requests_df: pd.DataFrame,
                 summary: Mapping[str, Mapping[str, Any]], *, title: str = "",
                 slo_ttft_p99_s: float | None = None, slo_tpot_p99_s: float | None = None,
                 step_groups: Sequence[str] | None = None) -> Figure:
    """One of :data:`FIGURES` as a matplotlib Figure (the one ``write_plots`` saves as
    ``<name>.png``), for a notebook; the arguments are :func:`write_plots`'s."""
    if name not in FIGURES:
        raise KvplanError(f"unknown figure '{name}' (known: {', '.join(FIGURES)})")
    builders = _figure_builders(steps_df, requests_df, summary, title=title, slo_ttft_p99_s=slo_ttft_p99_s,
                                slo_tpot_p99_s=slo_tpot_p99_s, step_groups=step_groups)
    with mpl.rc_context(_RC):
        return builders[name]()


def _figure_builders(steps_df: pd.DataFrame, requests_df: pd.DataFrame,
                     summary: Mapping[str, Mapping[str, Any]], *, title: str,
                     slo_ttft_p99_s: float | None, slo_tpot_p99_s: float | None,
                     step_groups: Sequence[str] | None) -> dict[str, Callable[[], Figure]]:
    """Check the inputs (before any figure is drawn) and return each figure's builder."""
    _require_columns(steps_df, STEP_COLUMNS_NEEDED, "steps table")
    _require_columns(requests_df, REQUEST_COLUMNS_NEEDED, "requests table")
    for name in summary:  # fail before any file is written
        for path in SUMMARY_FIELDS_NEEDED:
            _summary_number(summary, name, *path)
    for label, bound in (("TTFT", slo_ttft_p99_s), ("TPOT", slo_tpot_p99_s)):
        if bound is not None and not (math.isfinite(bound) and bound > 0):
            raise KvplanError(f"SLO p99 {label} bound must be a positive number of seconds, got {bound}")
    axis = time_axis(steps_df)
    steps_by, requests_by = _by_allocator(steps_df), _by_allocator(requests_df)
    allocators = [str(n) for n in summary]
    # the step groups (a disaggregated run's pools) are no allocators: they have no requests
    runs = set(requests_by) | (set(steps_by) if step_groups is None else set())
    allocators += sorted(runs - set(allocators))
    num_replicas = int(steps_df["replica"].nunique()) if len(steps_df) else 0
    groups = list(step_groups) if step_groups is not None else allocators
    if step_groups is not None:  # each group's replicas, not all of the run's
        num_replicas = max((int(steps_by[g]["replica"].nunique()) for g in groups if g in steps_by),
                           default=0)
    return {
        "kv_memory": lambda: _kv_memory_figure(steps_by, summary, groups, axis, num_replicas, title),
        "batch_size": lambda: _batch_size_figure(steps_by, summary, groups, axis, title),
        "latency_cdf": lambda: _latency_figure(requests_by, allocators, title,
                                               {"ttft_s": slo_ttft_p99_s, "tpot_s": slo_tpot_p99_s}),
        "allocators": lambda: _allocators_figure(summary, title, slo_ttft_p99_s),
    }


# ----------------------------------------------------------------------------- binning
def binned_integrals(starts_s: np.ndarray, ends_s: np.ndarray, values: np.ndarray,
                     edges_s: np.ndarray) -> np.ndarray:
    """Integral over each bin of a piecewise-constant function of time.

    The function is ``values[i]`` (a row of k values) on ``[starts_s[i], ends_s[i])`` and 0
    outside every interval. Intervals must be sorted and disjoint (``ends_s[i] <= starts_s[i+1]``).
    Returns an array of shape ``(len(edges_s) - 1, k)``: value × seconds in each bin.
    """
    values = np.asarray(values, dtype=np.float64).reshape(len(starts_s), -1)
    out = np.zeros((len(edges_s) - 1, values.shape[1]))
    if len(starts_s) == 0:
        return out
    # The running integral F(t) is continuous and piecewise linear with knots at every interval
    # start and end; a bin's integral is F(right edge) - F(left edge).
    knots_s = np.column_stack([starts_s, ends_s]).ravel()
    cum = np.cumsum(values * (ends_s - starts_s)[:, None], axis=0)
    before = np.vstack([np.zeros((1, values.shape[1])), cum[:-1]])
    for j in range(values.shape[1]):
        knots_f = np.column_stack([before[:, j], cum[:, j]]).ravel()
        out[:, j] = np.diff(np.interp(edges_s, knots_s, knots_f))
    return out


def time_axis(steps_df: pd.DataFrame, num_bins: int = NUM_TIME_BINS) -> TimeAxis:
    """Bins spanning time 0 (or the earliest step) to the end of the last step, all allocators."""
    t0 = t1 = 0.0
    if len(steps_df):
        start = steps_df["time_s"].to_numpy(dtype=np.float64)
        end = start + _durations(steps_df)
        if np.isfinite(start).any():
            t0 = min(0.0, float(np.nanmin(start)))
            t1 = float(np.nanmax(end))
    if not t1 > t0:  # no steps, or only zero-length ones: any span will do, take 1 s
        t1 = t0 + 1.0
    span_s = t1 - t0
    unit, seconds = ("s", 1.0) if span_s <= 300 else ("min", 60.0) if span_s <= 3 * 3600 else ("h", 3600.0)
    return TimeAxis(np.linspace(t0, t1, num_bins + 1), unit, seconds)


def binned_kv_fractions(steps: pd.DataFrame, edges_s: np.ndarray) -> np.ndarray:
    """Time-weighted share of the KV pool in each of the five :data:`KV_LAYERS`, per bin.

    ``steps`` are one allocator's rows (any number of replicas; their pools add up). A step's
    KV breakdown is taken at its end, so it describes memory from its start until the next
    step starts (the engine is idle in between and memory stays put); before a replica's first
    step its pool is all free. Returns shape ``(num_bins, 5)``; each row sums to 1.
    """
    total = np.zeros((len(edges_s) - 1, len(KV_COLUMNS)))
    for rep in _replica_steps(steps, KV_COLUMNS):
        t = rep["time_s"].to_numpy(dtype=np.float64)
        kv = rep[list(KV_COLUMNS)].to_numpy(dtype=np.float64)
        empty_pool = np.zeros((1, len(KV_COLUMNS)))
        empty_pool[0, -1] = kv[0].sum()
        starts = np.concatenate([[min(edges_s[0], t[0])], t])
        ends = np.concatenate([t, [max(edges_s[-1], t[-1])]])
        total += binned_integrals(starts, ends, np.vstack([empty_pool, kv]), edges_s)
    capacity = total.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(capacity > 0, total / capacity, 0.0)
    shares[capacity[:, 0] <= 0, -1] = 1.0  # no pool recorded in the bin: draw it as free
    return shares


def binned_step_means(steps: pd.DataFrame, columns: Sequence[str], edges_s: np.ndarray) -> np.ndarray:
    """Time-weighted mean of per-step counts in each bin, summed over replicas.

    A step's value holds for its duration; idle time between steps counts as 0 (an idle engine
    runs nothing and has nobody waiting it could admit). Returns shape ``(num_bins, len(columns))``.
    """
    total = np.zeros((len(edges_s) - 1, len(columns)))
    for rep in _replica_steps(steps, columns):
        t = rep["time_s"].to_numpy(dtype=np.float64)
        ends = t + _durations(rep)
        ends[:-1] = np.minimum(ends[:-1], t[1:])  # overlapping rows would count twice
        total += binned_integrals(t, ends, rep[list(columns)].to_numpy(dtype=np.float64), edges_s)
    return total / np.diff(edges_s)[:, None]


def _replica_steps(steps: pd.DataFrame, columns: Sequence[str]) -> Iterator[pd.DataFrame]:
    """Each replica's usable rows (time and ``columns`` not NaN), sorted by time then step id."""
    usable = steps.dropna(subset=["time_s", *columns])
    for _, rep in usable.groupby("replica", sort=True):
        order = np.lexsort((rep["step"].to_numpy(), rep["time_s"].to_numpy()))
        yield rep.iloc[order]


def _durations(steps: pd.DataFrame) -> np.ndarray:
    durations = steps["duration_s"].to_numpy(dtype=np.float64)
    if (durations < 0).any():
        raise KvplanError(f"steps table: negative duration_s in {int((durations < 0).sum())} row(s)")
    return np.nan_to_num(durations, nan=0.0, posinf=0.0)


# ----------------------------------------------------------------------------- figures
def _kv_memory_figure(steps_by: Mapping[str, pd.DataFrame], summary: Mapping[str, Mapping[str, Any]],
                      allocators: list[str], axis: TimeAxis, num_replicas: int, title: str) -> Figure:
    fig, axes = _figure(max(1, len(allocators)), 1, (11, 1.2 + 2.1 * max(1, len(allocators))), sharex=True)
    if not allocators:
        _say(axes[0, 0], "no allocator to show")
    x = axis.display(axis.edges_s)
    for ax, name in zip(axes[:, 0], allocators):
        shares = binned_kv_fractions(steps_by[name], axis.edges_s) if name in steps_by else None
        if shares is None:
            _say(ax, "no engine steps recorded")
        else:
            ys = np.vstack([shares, shares[-1:]]).T  # one more point: bins drawn as stairs
            ax.stackplot(x, ys, colors=[c for _, _, c in KV_LAYERS], step="post", linewidth=0)
        ax.set_title(_kv_panel_title(name, summary, shares, num_replicas), loc="left")
        ax.set_ylim(0, 1)
        ax.set_xlim(x[0], x[-1])
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
        ax.set_ylabel("KV pool")
        ax.grid(False)
    axes[-1, 0].set_xlabel(f"simulated time ({axis.unit})")
    handles = [Patch(color=c, label=label) for _, label, c in KV_LAYERS]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(KV_LAYERS), frameon=False)
    fig.suptitle(_suptitle(title, "KV cache memory over time (share of the pool)"))
    return fig


def _kv_panel_title(name: str, summary: Mapping[str, Any], shares: np.ndarray | None,
                    num_replicas: int) -> str:
    if name in summary:
        token = _summary_number(summary, name, "kv", "token_state")
        waste = (_summary_number(summary, name, "kv", "internal_fragmentation")
                 + _summary_number(summary, name, "kv", "external_fragmentation"))
        capacity_tokens = _summary_number(summary, name, "kv", "kv_capacity_tokens")
        pool = f"; pool {capacity_tokens:,.0f} tokens" if math.isfinite(capacity_tokens) else ""
        pool += f" × {num_replicas} replicas" if pool and num_replicas > 1 else ""
    elif shares is not None:  # not in the summary: average the drawn bins (equal widths)
        token, waste = float(shares[:, 0].mean()), float(shares[:, 2:4].sum(axis=1).mean())
        pool = ""
    else:
        return name
    return f"{name} — token state {_pct(token)} · fragmentation {_pct(waste)} (time-averaged{pool})"


def _batch_size_figure(steps_by: Mapping[str, pd.DataFrame], summary: Mapping[str, Mapping[str, Any]],
                       allocators: list[str], axis: TimeAxis, title: str) -> Figure:
    fig, axes = _figure(2, 1, (11, 6.2), sharex=True)
    running_ax, waiting_ax = axes[0, 0], axes[1, 0]
    x = axis.display(axis.edges_s)
    drawn = 0
    for i, name in enumerate(allocators):
        if name not in steps_by:
            continue
        means = binned_step_means(steps_by[name], ("num_running_seqs", "num_waiting"), axis.edges_s)
        for ax, column in ((running_ax, 0), (waiting_ax, 1)):
            # a step line, not ax.stairs: a patch with 1,600 vertices is slow to autoscale
            ax.plot(x, np.append(means[:, column], means[-1, column]), drawstyle="steps-post",
                    label=f"{name} (saturated: the queue grows)" if _saturated(summary, name) else name,
                    linewidth=1.4, color=_colour(name, allocators),
                    linestyle=_LINESTYLES[i % len(_LINESTYLES)])
        drawn += 1
    if not drawn:
        for ax in (running_ax, waiting_ax):
            _say(ax, "no engine steps recorded")
    else:
        handles, labels = running_ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=min(drawn, 4), frameon=False)
    running_ax.set_title("Running sequences (batch size), all replicas", loc="left")
    running_ax.set_ylabel("sequences")
    waiting_ax.set_title("Waiting queue (waiting + swapped out)", loc="left")
    waiting_ax.set_ylabel("requests")
    bin_s = float(np.diff(axis.edges_s)[0])
    waiting_ax.set_xlabel(f"simulated time ({axis.unit})"
                          + (f"; time-weighted mean per {_seconds(bin_s)} bin" if drawn else ""))
    for ax in (running_ax, waiting_ax):
        ax.set_xlim(x[0], x[-1])
        ax.set_ylim(bottom=0)
    fig.suptitle(_suptitle(title, "Batch size and queue over time"))
    return fig


def _latency_figure(requests_by: Mapping[str, pd.DataFrame], allocators: list[str], title: str,
                    slo_s: Mapping[str, float | None]) -> Figure:
    # Each panel's legend (one line per allocator, the SLO, the marker key) gets a row of its own
    # under the curves, sized to its lines, so it can never cover one.
    legend_in = 0.2 * (max(1, len(allocators)) + 2) + 0.15
    fig = Figure(figsize=(12, 4.4 + legend_in), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(4.4, legend_in))
    finished = {name: mine[mine["status"] == "finished"] for name, mine in requests_by.items()}
    for col, (column, label) in enumerate((("ttft_s", "TTFT (time to first token)"),
                                           ("tpot_s", "TPOT (time per output token)"))):
        ax, key_ax = fig.add_subplot(grid[0, col]), fig.add_subplot(grid[1, col])
        samples: dict[str, np.ndarray] = {}
        notes = []
        for name in allocators:
            done = finished.get(name, pd.DataFrame(columns=[column]))
            v = done[column].to_numpy(dtype=np.float64)
            v = v[np.isfinite(v)]
            if len(v):
                samples[name] = v
            elif name not in requests_by:
                notes.append(f"{name}: no requests")
            elif not len(done):
                num_rejected = int((requests_by[name]["status"] == "rejected").sum())
                notes.append(f"{name}: no finished requests ({num_rejected} rejected)")
            else:
                notes.append(f"{name}: no {column[:4].upper()} samples (1-token outputs)")
        handles = _draw_cdfs(ax, samples, allocators, slo_s.get(column))
        ax.set_title(label, loc="left")
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.02)
        if notes:
            _say(ax, "\n".join(notes), centre=not samples)
        key_ax.axis("off")
        if handles:
            key_ax.legend(handles=handles, loc="upper center", frameon=False, borderaxespad=0,
                          title="● p50   ◆ p99", alignment="left")
    fig.suptitle(_suptitle(title, "Latency distributions (CDF, finished requests)"))
    return fig


def _draw_cdfs(ax: Axes, samples: Mapping[str, np.ndarray], allocators: list[str],
               slo_p99_s: float | None) -> list[Any]:
    """One ECDF per allocator, with p50 (circle) and p99 (diamond) marked, and the SLO's p99
    bound as a dashed vertical line. Returns the legend handles (their labels carry the values)."""
    if not samples:
        ax.set_xlabel("seconds")
        return []
    pooled = np.concatenate(list(samples.values()))
    scale, unit = (1e3, "ms") if np.percentile(pooled, 99) < 1.0 else (1.0, "s")
    positive = pooled[pooled > 0]
    log_x = bool(len(positive) == len(pooled) and positive.max() / positive.min() > 100)
    handles = []
    for name, v in samples.items():
        i = allocators.index(name)
        colour, style = _colour(name, allocators), _LINESTYLES[i % len(_LINESTYLES)]
        xs, ys = _ecdf_points(np.sort(v) * scale)
        p50, p99 = np.percentile(v * scale, [50, 99])
        (line,) = ax.plot(xs, ys, drawstyle="steps-post", color=colour, linestyle=style, linewidth=1.7,
                          label=f"{name}: p50 {_seconds(p50 / scale)} · p99 {_seconds(p99 / scale)}")
        handles.append(line)
        ax.plot([p50], [0.5], linestyle="none", color=colour, marker="o", markersize=5)
        ax.plot([p99], [0.99], linestyle="none", color=colour, marker="D", markersize=5)
    for level in (0.5, 0.99):
        ax.axhline(level, color="#888888", linewidth=0.7, linestyle=":", zorder=0)
    if slo_p99_s is not None:
        handles.append(ax.axvline(slo_p99_s * scale, color=SLO_COLOUR, linestyle=SLO_STYLE, linewidth=1.2,
                                  label=f"SLO: p99 ≤ {_seconds(slo_p99_s)}"))
    if log_x:
        ax.set_xscale("log")
        log_x = readable_log_axis(ax, "x")
    ax.set_xlabel(f"latency ({unit}{', log scale' if log_x else ''})")
    return handles


def _ecdf_points(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points of the empirical CDF, thinned to ~MAX_CDF_POINTS ranks (exact points, not a fit)."""
    n = len(sorted_values)
    ranks = np.unique(np.linspace(0, n - 1, min(n, MAX_CDF_POINTS)).round().astype(np.int64))
    return sorted_values[ranks], (ranks + 1) / n


def _allocators_figure(summary: Mapping[str, Mapping[str, Any]], title: str,
                       slo_ttft_p99_s: float | None) -> Figure:
    """What decides between allocators on one trace: p99 TTFT (the latency a queue shows first),
    the concurrency each reached and the KV memory each wasted. Throughput is left out on
    purpose: below saturation it equals the arrival rate whatever the allocator."""
    fig, axes = _figure(1, 3, (12, 4.8))
    names = list(summary)
    ttft_ax, conc_ax, frag_ax = axes[0]
    for ax, panel_title, ylabel in ((ttft_ax, "p99 TTFT (lower is better)", "time to first token"),
                                    (conc_ax, "Max concurrency", "sequences in one step"),
                                    (frag_ax, "KV fragmentation (time-averaged)", "% of the KV pool")):
        ax.set_title(panel_title, loc="left")
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)
        if not names:
            _say(ax, "no allocator in the summary")
            ax.set_xticks([])
    if not names:
        fig.suptitle(_suptitle(title, "Allocators compared"))
        return fig
    x = np.arange(len(names))
    colours = [_colour(n, names) for n in names]
    saturated = [_saturated(summary, n) for n in names]
    # p99 TTFT: a log scale when allocators differ by orders of magnitude (a saturated one often does)
    ttft_s = np.array([_summary_number(summary, n, "ttft_s", "p99") for n in names])
    shown_s = ttft_s[np.isfinite(ttft_s) & (ttft_s > 0)]
    if slo_ttft_p99_s is not None:
        shown_s = np.append(shown_s, slo_ttft_p99_s)
    per_s, unit = _time_unit(float(shown_s.max()) if len(shown_s) else 1.0)
    ttft_ax.set_ylabel(f"time to first token ({unit})")
    bars = ttft_ax.bar(x, np.nan_to_num(ttft_s * per_s, nan=0.0), width=0.65, color=colours,
                       hatch=["///" if sat else "" for sat in saturated], edgecolor="white", linewidth=0)
    ttft_ax.bar_label(bars, labels=[_seconds(v) if math.isfinite(v) else "n/a" for v in ttft_s],
                      padding=2, fontsize=9)
    if len(shown_s) and shown_s.max() / shown_s.min() > 30:
        ttft_ax.set_yscale("log")
        ttft_ax.set_ylim(shown_s.min() * per_s / 2.5, shown_s.max() * per_s * 4)
        readable_log_axis(ttft_ax)
    else:
        ttft_ax.set_ylim(0, (shown_s.max() * per_s if len(shown_s) else 1.0) * 1.18)
    handles: list[Any] = []
    if slo_ttft_p99_s is not None:
        handles.append(ttft_ax.axhline(slo_ttft_p99_s * per_s, color=SLO_COLOUR, linestyle=SLO_STYLE,
                                       linewidth=1.2, label=f"SLO: p99 TTFT ≤ {_seconds(slo_ttft_p99_s)}"))
    if any(saturated):
        handles.append(Patch(facecolor="#888888", hatch="///", edgecolor="white", linewidth=0,
                             label="saturated: the queue grows through the run"))
    # peak concurrency
    conc = np.array([_summary_number(summary, n, "max_batch_size") for n in names])
    bars = conc_ax.bar(x, np.nan_to_num(conc, nan=0.0), width=0.65, color=colours)
    conc_ax.bar_label(bars, labels=[f"{v:,.0f}" if math.isfinite(v) else "n/a" for v in conc],
                      padding=2, fontsize=9)
    top = float(np.nanmax(conc)) if np.isfinite(conc).any() else 0.0
    conc_ax.set_ylim(0, (top if top > 0 else 1.0) * 1.15)
    # fragmentation: internal (reserved, never written) under external (free, unusable)
    internal = 100 * np.array([_summary_number(summary, n, "kv", "internal_fragmentation") for n in names])
    external = 100 * np.array([_summary_number(summary, n, "kv", "external_fragmentation") for n in names])
    (_, _, internal_colour), (_, _, external_colour) = KV_LAYERS[2], KV_LAYERS[3]
    frag_ax.bar(x, np.nan_to_num(internal, nan=0.0), width=0.65, color=internal_colour,
                label="internal frag. (reserved, never written)")
    bars = frag_ax.bar(x, np.nan_to_num(external, nan=0.0), width=0.65, color=external_colour,
                       bottom=np.nan_to_num(internal, nan=0.0), label="external frag. (free, unusable)")
    total = internal + external
    frag_ax.bar_label(bars, labels=[f"{v:.1f}%" if math.isfinite(v) else "n/a" for v in total],
                      padding=2, fontsize=9)
    frag_ax.set_ylim(0, 100 * 1.12)
    handles += frag_ax.get_legend_handles_labels()[0]
    for ax in (ttft_ax, conc_ax, frag_ax):
        ax.set_xticks(x, [_tick_label(n) for n in names])
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    fig.suptitle(_suptitle(title, "Allocators compared"))
    return fig


# ----------------------------------------------------------------------------- helpers
MIN_LOG_TICKS = 3  # labelled ticks a log axis shows at the least: one label alone gives no scale
# Ticks tried within each decade, coarsest first: the first that puts MIN_LOG_TICKS in the span
LOG_TICK_SUBS: tuple[tuple[int, ...], ...] = ((1,), (1, 2, 5), (1, 2, 3, 5, 7), tuple(range(1, 10)))


def log_ticks(lo: float, hi: float, subs: Sequence[int]) -> list[float]:
    """The values ``sub × 10^e`` (each ``sub`` of ``subs``) within ``[lo, hi]``, ascending; each
    written as its decimal literal (0.3, not 3 × 0.1 = 0.30000000000000004)."""
    if not (0 < lo <= hi and math.isfinite(hi)):
        return []
    first, last = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    ticks = (float(f"{sub}e{e}") for e in range(first, last + 1) for sub in subs)
    return [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]


def readable_log_axis(ax: Axes, which: str = "y") -> bool:
    """Label a log-scaled axis so that it reads: at least :data:`MIN_LOG_TICKS` labelled ticks —
    decades when its span holds that many, else 1-2-5 (then finer) steps within each decade,
    plain numbers (``0.02``, not ``2×10⁻²``), unlabelled minor ticks. An axis too narrow for that
    many (a factor of ~3 or less) turns linear, with its limits kept. Call it once everything is
    drawn: the limits are frozen. Returns whether the axis stayed log."""
    axis, get_lim, set_lim, set_scale = (
        (ax.yaxis, ax.get_ylim, ax.set_ylim, ax.set_yscale) if which == "y"
        else (ax.xaxis, ax.get_xlim, ax.set_xlim, ax.set_xscale))
    limits = get_lim()
    lo, hi = sorted(limits)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if lo > 0:
        for subs in LOG_TICK_SUBS:
            ticks = log_ticks(lo, hi, subs)
            if len(ticks) >= MIN_LOG_TICKS:
                set_lim(*limits)
                axis.set_major_locator(FixedLocator(ticks))
                axis.set_major_formatter(plain)
                axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10)), numticks=100))
                axis.set_minor_formatter(NullFormatter())
                return True
    set_scale("linear")
    set_lim(*limits)
    axis.set_major_formatter(plain)
    return False


def _figure(nrows: int, ncols: int, size: tuple[float, float], sharex: bool = False
            ) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    return fig, fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)


def _say(ax: Axes, text: str, centre: bool = True) -> None:
    """Write a note in a panel: centred when the panel has nothing else, else at the top left."""
    if centre:
        ax.set_yticks([])  # an empty panel's 0..1 scale means nothing (x may be shared: left alone)
    xy, align = ((0.5, 0.5), "center") if centre else ((0.02, 0.97), "left")
    ax.text(*xy, text, transform=ax.transAxes, ha=align, va="center" if centre else "top",
            fontsize=9.5, color="#444444",
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#CCCCCC"})


SUPTITLE_CHARS = 90  # a figure title longer than this runs off the narrowest figure (11 in at 13 pt)


def _suptitle(title: str, what: str) -> str:
    """``title — what`` on one line, or on two when one would run off the figure."""
    if not title:
        return what
    return f"{title} — {what}" if len(title) + len(what) + 3 <= SUPTITLE_CHARS else f"{title}\n{what}"


def _saturated(summary: Mapping[str, Mapping[str, Any]], name: str) -> bool:
    """The run's queue grew through the trace (``saturated`` in its summary; absent: no)."""
    return bool(summary.get(name, {}).get("saturated", False))


def _colour(name: str, names: Sequence[str]) -> str:
    if name in _KNOWN_COLOURS:
        return _KNOWN_COLOURS[name]
    unknown = [n for n in names if n not in _KNOWN_COLOURS]
    return _OTHER_COLOURS[unknown.index(name) % len(_OTHER_COLOURS)]


def _by_allocator(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The table's rows per allocator name (one pass over a table that may hold millions)."""
    if not len(df):
        return {}
    return {str(name): rows for name, rows in df.groupby("allocator", sort=False)}


def _require_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    # A table with no rows may come without columns (a DataFrame built from an empty list).
    missing = [c for c in columns if c not in df.columns]
    if missing and len(df):
        raise KvplanError(f"{what} lacks column(s) {', '.join(repr(c) for c in missing)}")


def _summary_number(summary: Mapping[str, Any], *path: str) -> float:
    """``summary[path[0]][path[1]]...`` as a float; None (no data) reads as NaN.

    A missing key or a non-numeric value is a :class:`KvplanError` naming the dotted path."""
    value: Any = summary
    for depth, key in enumerate(path):
        if not isinstance(value, Mapping) or key not in value:
            raise KvplanError(f"summary: '{'.'.join(path[:depth])}' has no field '{key}'")
        value = value[key]
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise KvplanError(f"summary: '{'.'.join(path)}' is {value!r}, not a number")
    return float(value)


def _pct(fraction: float) -> str:
    return "n/a" if not math.isfinite(fraction) else f"{100 * fraction:.0f}%"


def _time_unit(largest_s: float) -> tuple[float, str]:
    """(display units per second, unit name) for an axis whose largest value is ``largest_s``."""
    if largest_s < 1.0:
        return 1e3, "ms"
    return (1.0, "s") if largest_s < 600 else (1 / 60, "min")


def _tick_label(name: str) -> str:
    """A run's name in lines short enough for its bar: an allocator broken at its first hyphen
    (``contiguous-\nmax``), under its engine when the run names one (``engine/allocator``)."""
    engine, sep, allocator = name.rpartition("/")
    lines = allocator.replace("-", "-\n", 1)
    return f"{engine}\n{lines}" if sep else lines


def _seconds(value_s: float) -> str:
    """A duration with three significant digits in the unit that reads best (ms, s, min)."""
    if value_s < 1.0:
        return f"{value_s * 1e3:.3g} ms"
    return f"{value_s:.3g} s" if value_s < 600 else f"{value_s / 60:,.0f} min"


# Okabe-Ito, in an order that keeps neighbouring replicas apart; past eight, line styles differ too
_REPLICA_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


def write_replica_plot(out_dir: Path, steps_df: pd.DataFrame, requests_df: pd.DataFrame,
                       num_replicas: int, *, title: str = "", policy: str = "",
                       pools: Sequence[tuple[str, int]] = (),
                       sent: Mapping[str, np.ndarray] | None = None) -> Path | None:
    """``replicas.png``: how the router spread the load over ``num_replicas`` replicas — per
    allocator (one row each), the requests each replica was sent, and its running sequences
    and waiting queue over time (time-weighted means per bin). Nothing is written (None) for a
    single replica. Columns as :func:`write_plots` needs, plus ``replica`` in ``requests_df``.

    ``pools``: (name, replicas) of consecutive replica ranges that serve different parts of a
    request (prefill and decode of a disaggregated run): replicas are labelled by pool and the
    spread is given per pool. ``sent``: per allocator, requests sent to each replica when a
    request visits several (otherwise counted from ``requests_df``'s ``replica``).
    """
    if num_replicas <= 1:
        return None
    _require_columns(steps_df, STEP_COLUMNS_NEEDED, "steps table")
    _require_columns(requests_df, ("allocator", "replica"), "requests table")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps_by, requests_by = _by_allocator(steps_df), _by_allocator(requests_df)
    allocators = list(dict.fromkeys([*requests_by, *steps_by]))
    axis = time_axis(steps_df)
    path = out_dir / "replicas.png"
    with mpl.rc_context(_RC):
        _replica_figure(steps_by, requests_by, allocators or [""], num_replicas, axis, title,
                        policy, pools, sent or {}).savefig(path, dpi=DPI, format="png",
                                                          metadata={"Software": None})
    return path


def _replica_figure(steps_by: Mapping[str, pd.DataFrame], requests_by: Mapping[str, pd.DataFrame],
                    allocators: list[str], num_replicas: int, axis: TimeAxis, title: str,
                    policy: str, pools: Sequence[tuple[str, int]],
                    sent: Mapping[str, np.ndarray]) -> Figure:
    rows = len(allocators)
    fig, axes = _figure(rows, 3, (13, 1.4 + 2.4 * rows))
    x = axis.display(axis.edges_s)
    replicas = np.arange(num_replicas)
    colours = [_REPLICA_COLOURS[r % len(_REPLICA_COLOURS)] for r in replicas]
    ranges = [(pool, sum(n for _, n in pools[:i]), n) for i, (pool, n) in enumerate(pools)] or \
        [("", 0, num_replicas)]
    names = [f"{pool} {r - start}" if pool else f"replica {r}"
             for pool, start, n in ranges for r in range(start, start + n)]
    for row, name in enumerate(allocators):
        sent_ax, running_ax, waiting_ax = axes[row]
        requests = requests_by.get(name)
        counts = np.zeros(num_replicas)
        if name in sent:
            counts = np.asarray(sent[name], dtype=float)
        elif requests is not None and len(requests):
            routed = requests["replica"].to_numpy(dtype=np.int64)
            routed = routed[(routed >= 0) & (routed < num_replicas)]
            counts = np.bincount(routed, minlength=num_replicas).astype(float)
        sent_ax.bar(replicas, counts, color=colours)
        ticks = replicas if num_replicas <= 16 else replicas[:: max(1, num_replicas // 8)]
        sent_ax.set_xticks(ticks, [names[r].replace("replica ", "") for r in ticks])
        sent_ax.set_xlabel("replica")
        sent_ax.set_ylabel("requests")
        spreads = []
        for pool, start, n in ranges:  # max/mean within each pool: pools do different work
            part = counts[start:start + n]
            if part.sum():
                spreads.append(f"{pool + ' ' if pool else ''}{part.max() / (part.sum() / n):.2f}")
        # per pool on a line of its own: the panel is narrow
        spread = (f"\nmax/mean {', '.join(spreads)}" if len(ranges) > 1 else f"; max/mean {spreads[0]}") \
            if spreads else ""
        sent_ax.set_title(f"{name + ': ' if name else ''}requests sent{spread}", loc="left")
        steps = steps_by.get(name)
        for ax, column, what in ((running_ax, "num_running_seqs", "running sequences"),
                                 (waiting_ax, "num_waiting", "waiting requests")):
            ax.set_title(f"{what}, per replica", loc="left")
            ax.set_xlim(x[0], x[-1])
            if steps is None or not len(steps):
                _say(ax, "no engine steps recorded")
                continue
            for r in replicas:
                mine = steps[steps["replica"] == r]
                if not len(mine):
                    continue
                means = binned_step_means(mine, (column,), axis.edges_s)[:, 0]
                ax.plot(x, np.append(means, means[-1]), drawstyle="steps-post", linewidth=1.2,
                        color=colours[r], linestyle=_LINESTYLES[(r // len(_REPLICA_COLOURS)) % len(_LINESTYLES)],
                        label=names[r])
            ax.set_ylim(bottom=0)
        waiting_ax.set_xlabel(f"simulated time ({axis.unit})")
        running_ax.set_xlabel(f"simulated time ({axis.unit})")
    handles, labels = axes[0, 1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(handles), 8), frameon=False)
    fig.suptitle(_suptitle(title, f"Load per replica (router: {policy})" if policy else "Load per replica"))
    return fig
