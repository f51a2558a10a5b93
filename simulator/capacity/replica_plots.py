"""The PNG plots of ``kvplan capacity --target-rate``, in :mod:`simulator.capacity.plots`' style.

* ``gpus_vs_target.png`` (with two targets or more): GPUs needed against the target rate, one
  line per layout (the sweep knobs that vary) and allocator; a target that a layout cannot hold
  with ``--max-replicas`` is a hollow triangle at its ``max_replicas × TP``;
* ``cost_per_hour.png``: USD per hour of the GPUs each layout needs, a horizontal bar per layout
  and allocator (bars grouped by target), cheapest at the highest target first.

Figures are Agg :class:`matplotlib.figure.Figure` objects saved without the "Software" PNG key:
the same rows give the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from simulator.capacity.plots import _LINE_COLOURS, _RC, _STYLES, _save, _text, _varying_knobs
from simulator.capacity.replica_table import ReplicaRow
from simulator.capacity.table import KNOB_HEADERS

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
            over = sorted((r.target_rate_req_s or 0.0, (r.max_replicas or 0) * (r.gpus_per_replica or 1))
                          for r in mine if r.status == "over-max")
            label = _label(mine[0], varying, len(allocators))
            if held:
                xs, ys = zip(*held)
                ax.plot(xs, ys, color=colour, linestyle=style, marker="o", markersize=4, label=label)
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
