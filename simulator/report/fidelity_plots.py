"""The fidelity figure: per-step predicted vs measured latency, and the error of each headline metric."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def write_fidelity_plot(path: Path, result: Mapping[str, Any], predicted_s: Sequence[float],
                        measured_s: Sequence[float], *, title: str = "") -> Path:
    """Left: one dot per real step (measured x, predicted y, the y = x line, MAPE in the title).
    Right: relative error of each metric, the measurement's own run-to-run spread as a grey band,
    and the targets as dashed lines."""
    # matplotlib only when the figure is drawn: backend.fidelity imports this module at its top
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), dpi=120, layout="constrained")
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
    m = np.asarray(measured_s, dtype=float) * 1e3
    p = np.asarray(predicted_s, dtype=float) * 1e3
    steps = result["steps"]
    if len(m):
        ax.scatter(m, p, s=6, alpha=0.5, color="#0072B2", edgecolors="none")
        lo, hi = float(min(m.min(), p.min())), float(max(m.max(), p.max()))
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, ls="--", label="predicted = measured")
        if hi / max(lo, 1e-9) > 100:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.legend(loc="upper left", frameon=False)
    else:
        ax.text(0.5, 0.5, "no steps", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("measured step latency (ms)")
    ax.set_ylabel("predicted by the profile (ms)")
    mape = steps.get("mape")
    ax.set_title(f"per step: MAPE {mape:.1%}" if mape == mape and mape is not None else "per step", loc="left")

    names = list(result["metrics"])
    errors = [result["metrics"][n]["relative_error"] for n in names]
    spread = [result["measurement_spread"].get(n) for n in names]
    y = np.arange(len(names))
    vals = np.array([e if e is not None else np.nan for e in errors]) * 100
    colors = ["#009E73" if abs(v) <= 5 else "#E69F00" if abs(v) <= 10 else "#D55E00" for v in np.nan_to_num(vals)]
    for i, s in enumerate(spread):
        if s is not None:
            bx.barh(i, 2 * s * 100, left=-s * 100, height=0.8, color="#DDDDDD", zorder=0)
    bx.barh(y, np.nan_to_num(vals), color=colors, height=0.5, zorder=2)
    for i, v in enumerate(vals):
        bx.text(v if v == v else 0, i, f" {v:+.1f}%" if v == v else " n/a", va="center",
                ha="left" if (v != v or v >= 0) else "right", fontsize=8)
    for bound, style in ((5, "--"), (10, ":")):
        for sign in (-1, 1):
            bx.axvline(sign * bound, color="grey", lw=0.8, ls=style)
    bx.axvline(0, color="black", lw=0.8)
    bx.set_yticks(y, names)
    bx.invert_yaxis()
    bx.set_xlabel("simulated vs measured (%)   [grey: run-to-run spread; lines: ±5% and ±10%]")
    bx.set_title("headline metrics", loc="left")
    for a in (ax, bx):
        a.spines[["top", "right"]].set_visible(False)
    if title:
        fig.suptitle(title)
    fig.savefig(path, metadata={"Software": None})
    return path
