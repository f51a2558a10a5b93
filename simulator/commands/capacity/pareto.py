"""The throughput-latency trade-off over closed-loop concurrency, and its Pareto frontier.

A concurrency search measures each (point, allocator) at 1, 2, 4, ... clients up to saturation
(:func:`simulator.commands.capacity.search.curve_loads`). Each measurement becomes a point in the plane
serving benchmarks draw (vLLM's ``vllm bench sweep plot_pareto``; NVIDIA's AIConfigurator plots
"tokens/s/user" against "tokens/s/gpu" too: ai-dynamo/aiconfigurator,
src/aiconfigurator/sdk/pareto_analysis.py, ``draw_pareto``/``draw_pareto_to_string``)::

    x = output tokens/s per user = output tok/s / clients    (how fast each stream is served)
    y = output tokens/s per GPU  = output tok/s / GPUs       (what the hardware yields)

The definitions are vLLM's (vllm-project/vllm, vllm/benchmarks/sweep/plot_pareto.py,
``_prepare_records``: ``tokens_per_user = throughput / user_count`` with the user count taken
from ``max_concurrency``, ``tokens_per_gpu = throughput / gpu_count`` with the GPU count TP × PP
× DP); here GPUs = tensor_parallel × num_replicas. More clients raise y and lower x; a point is
on the frontier when no other point is at least as good on both axes and better on one
(vLLM's ``_pareto_frontier``: sweep by x descending, keep a point whose y is not below the best
y so far).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.commands.capacity.search import SearchResult, limited_by
from simulator.commands.capacity.sweep import SweepPoint, csv_cell

FRONTIER_EPS = 1e-9  # ties on y stay on the frontier, as in vLLM's sweep


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One measurement of the curve (the first seed of a (point, allocator))."""

    point_index: int
    knobs: dict[str, Any]
    allocator: str
    concurrency: int
    throughput_tok_s: float
    tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    slo_ok: bool
    limited_by: str
    on_frontier: bool = False


def frontier(xs: Sequence[float], ys: Sequence[float], *, strict: bool = False) -> list[bool]:
    """Which of the points (xs[i], ys[i]) are on the Pareto frontier when both axes are better
    higher (module docstring). Deterministic: ties are broken by the input order.

    ``strict``: only the non-dominated points — a point with another at least as good on both
    axes and better on one is off, and of identical points only the first is on. The GPU-count
    layouts (:mod:`simulator.commands.capacity.replica_plots`) use it: two layouts at the same tokens/s
    per GPU are not both worth choosing when one serves each user faster."""
    order = sorted(range(len(xs)), key=lambda i: (-xs[i], -ys[i], i))
    on = [False] * len(xs)
    best_y = -math.inf
    for i in order:
        if (ys[i] > best_y + FRONTIER_EPS) if strict else (ys[i] >= best_y - FRONTIER_EPS):
            on[i] = True
            best_y = max(best_y, ys[i])
    return on


def pareto_points(points: Sequence[SweepPoint], results: Sequence[SearchResult]) -> list[ParetoPoint]:
    """Every curve probe as a :class:`ParetoPoint`, the frontier marked across all of them."""
    by_key = {p.index: p for p in points}
    raw: list[ParetoPoint] = []
    for result in results:
        point = by_key[result.point_index]
        if not result.curve or point.scenario is None or point.deployment is None:
            continue
        num_gpus = point.deployment.capacity.tp * point.scenario.num_replicas
        max_num_seqs = point.deployment.scheduler_config.max_num_seqs
        for probe in result.curve:
            assert probe.concurrency is not None, "a curve probe has clients"
            raw.append(ParetoPoint(
                result.point_index, point.knobs, result.allocator, probe.concurrency,
                probe.throughput_tok_s, probe.throughput_tok_s / num_gpus,
                probe.throughput_tok_s / probe.concurrency, probe.ttft_p99_s, probe.tpot_p99_s,
                probe.ok, limited_by(probe, max_num_seqs)))
    on = frontier([p.tok_s_per_user for p in raw], [p.tok_s_per_gpu for p in raw])
    return [dataclasses.replace(p, on_frontier=flag) for p, flag in zip(raw, on)]


PARETO_COLUMNS = ("allocator", "concurrency", "throughput_tok_s", "tok_s_per_gpu", "tok_s_per_user",
                  "ttft_p99_s", "tpot_p99_s", "slo_ok", "limited_by", "on_frontier")


def write_pareto_csv(path: Path, rows: Sequence[ParetoPoint]) -> None:
    """``pareto.csv``: ``point``, the sweep knobs, then :data:`PARETO_COLUMNS`."""
    knobs = list(dict.fromkeys(k for r in rows for k in r.knobs if k != "allocators"))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["point", *knobs, *PARETO_COLUMNS])
        for r in rows:
            writer.writerow([r.point_index, *(csv_cell(r.knobs.get(k)) for k in knobs),
                             *(csv_cell(getattr(r, c)) for c in PARETO_COLUMNS)])


