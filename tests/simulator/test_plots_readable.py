"""The simulate plots read right: legends never sit on the data, allocators.png shows what decides
(p99 TTFT against the SLO, saturation, concurrency, fragmentation), SLO bounds are drawn.

Geometry is checked on the rendered figures (window extents after a draw), not on pixels.
"""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from simulator.errors import KvplanError
from simulator.report.plots import (
    _allocators_figure,
    _batch_size_figure,
    _by_allocator,
    _latency_figure,
    time_axis,
)
from tests.simulator.test_plots import PROFILES, make_requests, make_steps, make_summary, write

ALLOCATORS = list(PROFILES)


def legend_boxes(fig: Figure) -> list[Bbox]:
    """Window extents of every legend of the figure, its own and its axes'."""
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [legend.get_window_extent(renderer) for legend in legends]


def data_boxes(fig: Figure) -> list[Bbox]:
    """Window extents of the axes that hold data (legend-only axes are switched off)."""
    return [ax.get_window_extent() for ax in fig.axes if ax.axison and ax.has_data()]


def assert_no_legend_on_data(fig: Figure) -> None:
    legends, panels = legend_boxes(fig), data_boxes(fig)
    assert legends and panels
    for legend in legends:
        for panel in panels:
            assert not legend.overlaps(panel), (legend, panel)


def test_latency_cdf_legends_sit_under_the_curves() -> None:
    requests = _by_allocator(make_requests(ALLOCATORS))
    fig = _latency_figure(requests, ALLOCATORS, "t", {"ttft_s": 2.0, "tpot_s": 0.1})
    assert_no_legend_on_data(fig)
    labels = [t.get_text() for box in fig.axes if box.get_legend() for t in box.get_legend().get_texts()]
    assert sum(label.startswith("SLO: p99 ≤") for label in labels) == 2  # one bound per panel
    assert all(any(label.startswith(f"{name}: p50") for label in labels) for name in ALLOCATORS)


def test_allocators_figure_shows_what_decides() -> None:
    summary = make_summary(make_steps(ALLOCATORS), ALLOCATORS)
    for name in ALLOCATORS:
        summary[name]["saturated"] = name == "contiguous-max"
    fig = _allocators_figure(summary, "t", slo_ttft_p99_s=0.3)
    assert_no_legend_on_data(fig)
    ttft_ax, conc_ax, frag_ax = fig.axes
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "p99 TTFT (lower is better)", "Max concurrency", "KV fragmentation (time-averaged)"]
    # the SLO is a line at its bound, in the panel's unit (ms here: every value is below 1 s)
    (slo,) = [line for line in ttft_ax.get_lines() if line.get_label().startswith("SLO")]
    assert ttft_ax.get_ylabel().endswith("(ms)") and slo.get_ydata()[0] == pytest.approx(300)
    bars = ttft_ax.patches
    assert [bar.get_height() for bar in bars] == pytest.approx([1e3 * summary[n]["ttft_s"]["p99"]
                                                              for n in ALLOCATORS])
    assert [bar.get_hatch() or "" for bar in bars] == ["", "///", "", ""]  # the saturated one
    assert [bar.get_height() for bar in conc_ax.patches] == [summary[n]["max_batch_size"] for n in ALLOCATORS]
    # fragmentation: internal below external, stacked to their sum
    internal, external = frag_ax.patches[:4], frag_ax.patches[4:]
    for name, low, high in zip(ALLOCATORS, internal, external):
        kv = summary[name]["kv"]
        assert low.get_height() == pytest.approx(100 * kv["internal_fragmentation"])
        assert high.get_y() == pytest.approx(low.get_height())
        assert high.get_height() == pytest.approx(100 * kv["external_fragmentation"])
    legend_labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "saturated: the queue grows through the run" in legend_labels
    assert any(label.startswith("SLO: p99 TTFT ≤ 300 ms") for label in legend_labels)


def test_a_log_scale_when_allocators_differ_by_orders_of_magnitude() -> None:
    summary = make_summary(make_steps(ALLOCATORS), ALLOCATORS)
    summary["contiguous-max"]["ttft_s"]["p99"] = 95.0  # the rest at 0.4 s: a saturated queue
    fig = _allocators_figure(summary, "t", slo_ttft_p99_s=None)
    ttft_ax = fig.axes[0]
    assert ttft_ax.get_yscale() == "log" and ttft_ax.get_ylabel().endswith("(s)")
    assert not any(isinstance(a, Line2D) and a.get_label().startswith("SLO") for a in ttft_ax.get_lines())
    labels = [t.get_text() for t in ttft_ax.texts]
    assert labels == ["400 ms", "95 s", "400 ms", "400 ms"]


def test_without_saturation_fields_nothing_is_hatched() -> None:
    summary = make_summary(make_steps(ALLOCATORS), ALLOCATORS)  # an older summary: no "saturated"
    fig = _allocators_figure(summary, "t", slo_ttft_p99_s=None)
    assert all(not bar.get_hatch() for bar in fig.axes[0].patches)
    assert all(not t.get_text().startswith("saturated") for t in fig.legends[0].get_texts())


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan"), float("inf")])
def test_slo_bound_must_be_a_positive_number(tmp_path, bound: float) -> None:
    with pytest.raises(KvplanError, match="SLO p99 TTFT bound must be a positive number"):
        write(tmp_path / "out", ["paged"], slo_ttft_p99_s=bound)
    assert not (tmp_path / "out").exists()


def test_batch_size_legend_names_the_saturated() -> None:
    names = ["paged", "contiguous-max"]
    steps = make_steps(names)
    summary = make_summary(steps, names)
    summary["contiguous-max"]["saturated"] = True
    fig = _batch_size_figure(_by_allocator(steps), summary, names, time_axis(steps), "t")
    assert_no_legend_on_data(fig)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "paged", "contiguous-max (saturated: the queue grows)"]


def test_the_check_sees_a_legend_on_the_data() -> None:
    """The geometry helper itself: a legend inside a full panel is caught."""
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="x")
    ax.legend(loc="center")
    with pytest.raises(AssertionError):
        assert_no_legend_on_data(fig)
