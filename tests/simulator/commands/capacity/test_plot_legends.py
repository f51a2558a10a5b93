"""Capacity plots name every line they draw (the SLO bounds, each allocator's capacity) in a
legend that sits under the panels, never on the data."""

from __future__ import annotations

import pytest
from matplotlib.lines import Line2D

from simulator.commands.capacity import cmd, plots, search
from tests.simulator.commands.capacity.test_capacity_cmd import scenario_file
from tests.simulator.test_plots_readable import assert_no_legend_on_data


@pytest.fixture(scope="module")
def by_allocator(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[search.SearchResult]]:
    folder = tmp_path_factory.mktemp("capacity")
    report = cmd.run_capacity(str(scenario_file(folder)), num_seeds=1, jobs=1, out=str(folder / "o"),
                              quiet=True, use_cache=False, plots_on=False)
    return {r.allocator: [r] for r in report.results}


def test_point_legend_names_the_slo_and_the_capacity_lines(by_allocator) -> None:
    slo = search.SLOSpec(ttft_p99_s=0.3, tpot_p99_s=0.1)
    fig = plots.point_figure("t", by_allocator, slo)
    assert_no_legend_on_data(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:len(by_allocator)] == [f"{a}: probes (first seed)" for a in by_allocator]
    assert "SLO: p99 TTFT ≤ 0.3 s, p99 TPOT ≤ 0.1 s" in labels
    assert "capacity: highest rate meeting the SLO (allocator's colour)" in labels
    # every allocator that passed somewhere has its capacity line and its rate written on top
    throughput_ax = fig.axes[0]
    written = {t.get_text() for t in throughput_ax.texts}
    for results in by_allocator.values():
        if results[0].lo_rate_req_s > 0:
            assert f"{results[0].lo_rate_req_s:.3g}" in written


def test_stopped_probes_are_marked_on_the_rate_axis(by_allocator) -> None:
    """A probe stopped early measured nothing to draw: an x at its rate says it failed there."""
    import dataclasses

    name, results = next(iter(by_allocator.items()))
    first = results[0]
    stopped = dataclasses.replace(first.probes[0], rate_req_s=first.probes[0].rate_req_s * 3,
                                  ok=False, stopped_at_s=1.0)
    searches = {name: [dataclasses.replace(first, probes=(*first.probes, stopped))]}
    fig = plots.point_figure("t", searches, search.SLOSpec(ttft_p99_s=0.3))
    assert_no_legend_on_data(fig)
    assert "probe stopped early: its SLO certainly broken" in [t.get_text() for t in fig.legends[0].get_texts()]
    for ax in fig.axes:
        marks = [line for line in ax.get_lines() if line.get_marker() == "x"]
        expected = sorted(p.rate_req_s for p in searches[name][0].probes if p.stopped_at_s is not None)
        assert len(marks) == 1 and list(marks[0].get_xdata()) == expected
        assert stopped.rate_req_s in expected


def test_point_legend_without_an_slo_bound_on_tpot(by_allocator) -> None:
    fig = plots.point_figure("t", by_allocator, search.SLOSpec(ttft_p99_s=0.3))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "SLO: p99 TTFT ≤ 0.3 s" in labels


def test_sweep_figures_share_one_legend_under_the_panels() -> None:
    """capacity_vs_block_size and capacity_per_dollar draw the same allocators in every panel:
    one entry each, under all panels, plus the figure's own keys."""
    fig, axes = plots._grid(3, "t")
    for ax in axes[:3]:
        for i, allocator in enumerate(("paged", "contiguous-max")):
            ax.plot([8, 16, 32], [3 - i, 4 - i, 5 - i], label=allocator)
    extra = Line2D([], [], color="#555555", marker="|", linestyle="none", label="bars: range")
    plots._legend_below(fig, axes, extra)
    assert_no_legend_on_data(fig)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["paged", "contiguous-max", "bars: range"]


def labelled_ticks(ax) -> list[str]:  # type: ignore[no-untyped-def]
    """The tick labels a reader sees on the y axis: drawn, within the limits, not blank."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(ax.figure).draw()
    lo, hi = sorted(ax.get_ylim())
    return [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks())
            if t.get_text() and lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]


@pytest.mark.parametrize(("low", "high", "scale", "ticks"), [
    (0.02, 0.1, "log", ["0.02", "0.05", "0.1"]),  # within one decade: 1-2-5 steps, not "0.1" alone
    (0.0005, 3.0, "log", ["0.001", "0.01", "0.1", "1"]),  # decades when the span holds three
    (0.7, 1.9, "log", ["0.7", "0.8", "0.9", "1"]),  # a factor of 2.7: every unit step
    (0.0561, 0.0567, "linear", None),  # too narrow for a log scale to label: linear
])
def test_log_axes_carry_a_few_labelled_ticks(low: float, high: float, scale: str, ticks) -> None:  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure

    from simulator.report.plots import MIN_LOG_TICKS, readable_log_axis

    ax = Figure().subplots()
    ax.plot([1, 2], [low, high])
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    readable_log_axis(ax)
    shown = labelled_ticks(ax)
    assert ax.get_yscale() == scale and len(shown) >= MIN_LOG_TICKS, shown
    if ticks is not None:
        assert shown == ticks


def test_point_plots_label_their_latency_axes(by_allocator) -> None:
    """p99 TTFT and TPOT panels (log, or linear where the probes' span is narrow) show at least
    a few labelled ticks and say which scale they use."""
    from simulator.report.plots import MIN_LOG_TICKS

    fig = plots.point_figure("t", by_allocator, search.SLOSpec(ttft_p99_s=0.3, tpot_p99_s=0.1))
    for ax in fig.axes[1:3]:
        assert len(labelled_ticks(ax)) >= MIN_LOG_TICKS, ax.get_ylabel()
        assert ax.get_ylabel().endswith("(s, log scale)") == (ax.get_yscale() == "log")
