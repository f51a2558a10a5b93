"""The PNG plots of ``kvplan capacity --target-rate``, in :mod:`simulator.commands.capacity.plots`' style.

* ``gpus_vs_target.png`` (with two targets or more): GPUs needed against the target rate, one
  line per layout (the sweep knobs that vary) and allocator; a target that a layout cannot hold
  with ``--max-replicas`` is a hollow triangle at its ``max_replicas × TP``;
* ``cost_per_hour.png``: USD per hour of the GPUs each layout needs, a horizontal bar per layout
  and allocator (bars grouped by target), cheapest at the highest target first;
* ``agg_vs_disagg.png`` (with both kinds of layout): one panel per model × GPU, GPUs needed
  against the target rate, aggregated layouts solid, disaggregated ones (one line per P:D
  ratio and pool TPs) dashed, the same colour for the same layout in every panel;
* ``pareto_layouts.png``: each layout found (a row with an answer) as a point of output
  tokens/s per GPU (output tok/s ÷ GPUs) against tokens/s per user (1 / mean TPOT), one panel
  per target rate, the Pareto frontier over the non-dominated ones
  (:func:`simulator.commands.capacity.pareto.frontier`) drawn and its points labelled with their layout.

Figures are Agg :class:`matplotlib.figure.Figure` objects saved without the "Software" PNG key:
the same rows give the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import math

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from simulator.commands.capacity.pareto import frontier
from simulator.commands.capacity.plots import _LINE_COLOURS, _RC, _STYLES, _save, _text, _varying_knobs
from simulator.commands.capacity.replica_table import ReplicaRow
from simulator.commands.capacity.table import KNOB_HEADERS

MAX_LAYOUTS = 24  # lines or bars beyond this are unreadable; capacity.csv holds every row


def _layouts(rows: Sequence[ReplicaRow]) -> dict[tuple[int, str], list[ReplicaRow]]:
    """Rows of built points grouped by (point, allocator), in row order."""
    groups: dict[tuple[int, str], list[ReplicaRow]] = {}
    for r in rows:
        if r.status != "failed":
            groups.setdefault((r.point_index, r.allocator), []).append(r)
    return dict(list(groups.items())[:MAX_LAYOUTS])


def _label(row: ReplicaRow, varying: list[str], allocators: int) -> str:
    parts = [f"{KNOB_HEADERS.get(k, k)}={_text(row.knobs.get(k))}" for k in varying]
    if allocators > 1 or not parts:
        parts.append(row.allocator)
    return ", ".join(parts)


def plot_gpus_vs_target(path: Path, rows: Sequence[ReplicaRow]) -> Path | None:
    """GPUs needed against the target rate (module docstring); None with fewer than two targets."""
    if len({r.target_rate_req_s for r in rows}) < 2:
        return None
    layouts = _layouts(rows)
    if not layouts:
        return None
    varying = _varying_knobs([r.knobs for r in rows])
    allocators = list(dict.fromkeys(a for _, a in layouts))
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(11, 6), layout="constrained")
        ax = fig.subplots()
        for i, mine in enumerate(layouts.values()):
            # past the palette, the colours come back with the next line style
            colour = _LINE_COLOURS[i % len(_LINE_COLOURS)]
            style = _STYLES[(allocators.index(mine[0].allocator) + i // len(_LINE_COLOURS)) % len(_STYLES)]
            held = sorted((r.target_rate_req_s or 0.0, r.num_gpus or 0) for r in mine if r.status == "ok")
            over = sorted((r.target_rate_req_s or 0.0, r.max_gpus or 0) for r in mine if r.status == "over-max")
            label = _label(mine[0], varying, len(allocators))
            if held:
                xs, ys = zip(*held)
                # lines drawn first are wider: a layout needing the same GPUs as a later one still
                # shows at its edges (as simulator.commands.capacity.plots.plot_pareto draws its lines)
                grow = (len(layouts) - 1 - i) / max(1, len(layouts) - 1)
                ax.plot(xs, ys, color=colour, linestyle=style, marker="o", linewidth=1.2 + 2.4 * grow,
                        markersize=4 + 5 * grow, label=label)
            if over:
                xs, ys = zip(*over)
                ax.plot(xs, ys, color=colour, marker="^", markersize=6, markerfacecolor="white",
                        linestyle="none", label=None if held else label)
        if any(r.status == "over-max" for r in rows):
            ax.plot([], [], marker="^", linestyle="none", color="#555555", markerfacecolor="white",
                    label="not held with --max-replicas (at max × TP)")
        ax.set_xlabel("target rate (req/s)")
        ax.set_ylabel("GPUs needed (replicas × TP)")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title("GPUs needed to hold the target rate under the SLO")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        return _save(fig, path)


def plot_cost_per_hour(path: Path, rows: Sequence[ReplicaRow]) -> Path | None:
    """USD per hour per layout (module docstring); None when no row has a price and an answer."""
    priced = [r for r in rows if r.status == "ok" and r.usd_per_hour is not None]
    if not priced:
        return None
    layouts = _layouts(priced)
    targets = sorted({r.target_rate_req_s or 0.0 for r in priced})
    varying = _varying_knobs([r.knobs for r in rows])
    allocators = list(dict.fromkeys(a for _, a in layouts))
    top = targets[-1]

    def cost_at_top(key: tuple[int, str]) -> tuple[bool, float]:
        row = next((r for r in layouts[key] if r.target_rate_req_s == top), None)
        return row is None, row.usd_per_hour or 0.0 if row is not None else 0.0

    # cheapest at the highest target first (top); those that cannot hold it after; then row order
    keys = sorted(layouts, key=cost_at_top)
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(10, 1.2 + 0.32 * len(keys) * len(targets)), layout="constrained")
        ax = fig.subplots()
        height = 0.8 / len(targets)
        for j, target in enumerate(targets):
            ys, widths = [], []
            for y, key in enumerate(keys):
                row = next((r for r in layouts[key] if r.target_rate_req_s == target), None)
                if row is not None:
                    ys.append(y + (j - (len(targets) - 1) / 2) * height)
                    widths.append(row.usd_per_hour or 0.0)
            bars = ax.barh(ys, widths, height, color=_LINE_COLOURS[j % len(_LINE_COLOURS)],
                           label=f"{target:.4g} req/s")
            ax.bar_label(bars, labels=[f"${w:,.0f}" for w in widths], padding=2, fontsize=7)
        ax.set_yticks(range(len(keys)), [_label(layouts[k][0], varying, len(allocators)) for k in keys])
        ax.invert_yaxis()
        ax.set_xlabel("USD per hour (price per GPU-hour × GPUs)")
        ax.set_title("cost per hour of the GPUs that hold the target rate under the SLO")
        ax.grid(axis="y", visible=False)
        if len(targets) > 1:
            ax.legend(handles=[Line2D([], [], color=_LINE_COLOURS[j % len(_LINE_COLOURS)], linewidth=6,
                                      label=f"target {t:.4g} req/s") for j, t in enumerate(targets)],
                      loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        return _save(fig, path)


MAX_PANELS = 8  # model × GPU panels (agg vs disagg) or target panels (Pareto) drawn


def plot_agg_vs_disagg(path: Path, rows: Sequence[ReplicaRow]) -> Path | None:
    """GPUs needed against the target rate, aggregated and disaggregated layouts side by side
    (module docstring); None without both kinds of layout."""
    built = [r for r in rows if r.status != "failed"]
    if not any(r.pool_ratio for r in built) or all(r.pool_ratio for r in built):
        return None
    setups = list(dict.fromkeys(r.setup for r in built))[:MAX_PANELS]
    kinds = list(dict.fromkeys(r.layout_kind for r in built))
    with mpl.rc_context(_RC):
        cols = min(len(setups), 2)
        nrows = math.ceil(len(setups) / cols)
        fig = Figure(figsize=(5.2 * cols + 2.6, 3.6 * nrows + 0.5), layout="constrained")
        axes = list(fig.subplots(nrows, cols, squeeze=False).ravel())
        for ax, setup in zip(axes, setups):
            mine = [r for r in built if r.setup == setup]
            for kind in dict.fromkeys(r.layout_kind for r in mine):
                i = kinds.index(kind)
                line = [r for r in mine if r.layout_kind == kind]
                disagg = line[0].pool_ratio is not None
                colour = _LINE_COLOURS[i % len(_LINE_COLOURS)]
                held = sorted((r.target_rate_req_s or 0.0, r.num_gpus or 0) for r in line if r.status == "ok")
                if held:
                    xs, ys = zip(*held)
                    # layouts listed first are drawn wider: one that needs the same GPUs as a later
                    # one still shows around it
                    grow = (len(kinds) - 1 - i) / max(1, len(kinds) - 1)
                    ax.plot(xs, ys, color=colour, linestyle="--" if disagg else "-", linewidth=1.4 + 1.6 * grow,
                            marker="s" if disagg else "o", markersize=4 + 5 * grow)
                over = sorted((r.target_rate_req_s or 0.0, r.max_gpus or 0) for r in line if r.status == "over-max")
                if over:
                    xs, ys = zip(*over)
                    ax.plot(xs, ys, color=colour, marker="^", markersize=6, markerfacecolor="white",
                            linestyle="none")
            ax.set_title(setup)
            ax.set_xlabel("target rate (req/s)")
            ax.set_ylabel("GPUs needed")
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        for ax in axes[len(setups):]:
            ax.set_visible(False)
        handles = [Line2D([], [], color=_LINE_COLOURS[i % len(_LINE_COLOURS)],
                          linestyle="--" if k.startswith("disagg") else "-",
                          marker="s" if k.startswith("disagg") else "o", markersize=6, label=k)
                   for i, k in enumerate(kinds)]
        if any(r.status == "over-max" for r in built):
            handles.append(Line2D([], [], marker="^", linestyle="none", color="#555555",
                                  markerfacecolor="white", label="not held with --max-replicas"))
        fig.legend(handles=handles, loc="outside right upper", title="layout (pool TPs)")
        fig.suptitle("GPUs needed under the SLO, aggregated (solid) vs prefill/decode disaggregated "
                     "(dashed)\nthe lowest line is the layout with the fewest GPUs at that rate")
        return _save(fig, path)


def plot_layout_pareto(path: Path, rows: Sequence[ReplicaRow]) -> Path | None:
    """Tokens/s per GPU against tokens/s per user of every layout found, per target rate, with
    the Pareto frontier (module docstring); None when no row has both."""
    found = [r for r in rows if r.status == "ok" and r.tok_s_per_gpu and r.tok_s_per_user]
    if not found:
        return None
    targets = sorted({r.target_rate_req_s or 0.0 for r in found})[:MAX_PANELS]
    setups = list(dict.fromkeys(r.setup for r in found))
    markers = ("o", "s", "D", "^", "v", "P", "X", "*")
    with mpl.rc_context(_RC):
        cols = min(len(targets), 2)
        nrows = math.ceil(len(targets) / cols)
        fig = Figure(figsize=(6.0 * cols + 2.8, 4.4 * nrows + 0.5), layout="constrained")
        axes = list(fig.subplots(nrows, cols, squeeze=False).ravel())
        for ax, target in zip(axes, targets):
            mine = [r for r in found if r.target_rate_req_s == target]
            xs = [r.tok_s_per_user or 0.0 for r in mine]
            ys = [r.tok_s_per_gpu or 0.0 for r in mine]
            on = frontier(xs, ys, strict=True)
            front = sorted((x, y) for x, y, f in zip(xs, ys, on) if f)
            fx, fy = zip(*front)
            ax.plot(fx, fy, color="#999999", linewidth=7, alpha=0.35, solid_capstyle="round", zorder=2)
            for r, x, y, f in zip(mine, xs, ys, on):
                colour = _LINE_COLOURS[1] if r.pool_ratio else _LINE_COLOURS[0]
                ax.plot([x], [y], linestyle="none", marker=markers[setups.index(r.setup) % len(markers)],
                        markersize=7, color=colour, markerfacecolor=colour if f else "white", zorder=4)
                if f:  # only the frontier's points are named: the others are dominated
                    gpu = f" ({r.setup.split(' on ')[-1]})" if len(setups) > 1 else ""
                    right_half = x > 0.55 * max(xs)  # named leftwards there: the text stays inside
                    ax.annotate(r.layout + gpu, (x, y), textcoords="offset points",
                                xytext=(-6, 5) if right_half else (6, 3), ha="right" if right_half else "left",
                                fontsize=7, color="#333333")
            ax.set_title(f"target {target:.4g} req/s")
            ax.set_xlabel("output tokens/s per user (1 / mean TPOT)")
            ax.set_ylabel("output tokens/s per GPU")
            ax.set_xlim(0, max(xs) * 1.25)
            ax.set_ylim(0, max(ys) * 1.15)
        for ax in axes[len(targets):]:
            ax.set_visible(False)
        handles = [Line2D([], [], color=c, marker="o", linestyle="none", label=k)
                   for c, k in ((_LINE_COLOURS[0], "aggregated"), (_LINE_COLOURS[1], "disaggregated"))]
        handles += [Line2D([], [], color="#555555", marker=markers[i % len(markers)], linestyle="none",
                           label=s) for i, s in enumerate(setups)]
        handles.append(Line2D([], [], color="#999999", linewidth=7, alpha=0.35, label="Pareto frontier"))
        handles.append(Line2D([], [], color="#555555", marker="o", linestyle="none", markerfacecolor="white",
                              label="hollow: dominated (off the frontier)"))
        fig.legend(handles=handles, loc="outside right center")
        fig.suptitle("Layouts worth choosing at each target:\ntokens/s per GPU vs per user, each layout "
                     "at its fewest GPUs\n(up and right is better; the frontier's points are the "
                     "non-dominated ones)")
        return _save(fig, path)
