"""What the simulator predicts for a measured result: the same metrics, by the tool's own rules.

Predictions are computed from the simulated requests (one row each, as requests.csv holds them:
``status``, ``ttft_s``, ``tpot_s``, ``e2e_s``, lengths), after the run's warm-up requests, over
its throughput window — and with the measuring tool's definitions, so that a difference is the
model's, not a statistic's:

* vLLM (vllm/benchmarks/serve.py ``calculate_metrics``): TPOT per request (E2E − TTFT) /
  (output − 1) over requests with more than one output token; means by ``np.mean``, medians and
  percentiles by ``np.percentile`` (linear interpolation); ITL's mean is the mean gap between
  two tokens, Σ(E2E − TTFT) / Σ(output − 1); goodput counts a request good when every SLO given
  to ``--goodput`` holds (``ttft``, ``tpot``, ``e2el``, ms; a one-token request's TPOT is 0),
  over the benchmark's duration.
* GuideLLM (src/guidellm/schemas/statistics.py ``DistributionSummary.from_values`` and
  ``Percentiles.from_pdf``): a percentile is the first value whose cumulative probability
  reaches q (inverted CDF, no interpolation); inter-token latency is weighted by each request's
  output − 1 gaps (src/guidellm/benchmark/schemas/generative/metrics.py
  ``GenerativeMetrics.compile``).
* kvplan's fidelity.json: the summary's own statistics (``np.percentile``, linear).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.commands.compare.results import LATENCY_STATS, MetricKey

GOODPUT_SLOS = ("ttft", "tpot", "e2el")  # vllm/benchmarks/serve.py check_goodput_args VALID_NAMES


@dataclass(frozen=True)
class Convention:
    """How a tool turns per-request values into its statistics (module docstring)."""

    percentile_method: str  # numpy's name: "linear" (vLLM, kvplan) | "inverted_cdf" (GuideLLM)
    tpot_weighted: bool  # GuideLLM weighs each request's inter-token latency by its output − 1


CONVENTIONS = {
    "vllm-bench": Convention("linear", False),
    "guidellm": Convention("inverted_cdf", True),
    "kvplan-fidelity": Convention("linear", False),
}


def predicted_metrics(columns: Mapping[str, Any], *, warmup: int, window_s: float,
                      convention: Convention, goodput_slo_s: Mapping[str, float] | None = None
                      ) -> dict[MetricKey, float]:
    """The simulated run's metrics, keyed as :class:`~simulator.commands.compare.results.MeasuredResult`
    keys them. ``columns``: the requests (send order) of one allocator; ``warmup``: how many of
    the first are left out; ``window_s``: the throughput window; ``goodput_slo_s``: the SLOs
    (``ttft``, ``tpot``, ``e2el``, in seconds) a good request meets, or None (no goodput)."""
    status = np.asarray(columns["status"], dtype=object)
    done = np.zeros(len(status), dtype=bool)
    done[warmup:] = True
    done &= status == "finished"
    ttft = np.asarray(columns["ttft_s"], dtype=np.float64)[done]
    e2e = np.asarray(columns["e2e_s"], dtype=np.float64)[done]
    output = np.asarray(columns["output_tokens"], dtype=np.float64)[done]
    samples = np.maximum(np.asarray(columns["n"])[done], np.asarray(columns["beam_width"])[done])
    prompt = np.asarray(columns["prompt_tokens"], dtype=np.float64)[done]
    multi = output > 1
    tpot = (e2e[multi] - ttft[multi]) / (output[multi] - 1)
    out: dict[MetricKey, float] = {}
    method = convention.percentile_method
    for metric, values, weights in (("ttft", ttft, None), ("e2e", e2e, None),
                                    ("tpot", tpot, output[multi] - 1 if convention.tpot_weighted else None)):
        out.update(_stats(metric, values, weights, method))
    gaps = float((output[multi] - 1).sum())
    if gaps > 0:
        out[("itl", "mean")] = float((e2e[multi] - ttft[multi]).sum()) / gaps
    if window_s > 0 and len(ttft):
        out[("request_throughput", "value")] = len(ttft) / window_s
        generated = float((output * samples).sum())
        out[("output_throughput", "value")] = generated / window_s
        out[("total_throughput", "value")] = (generated + float(prompt.sum())) / window_s
        if goodput_slo_s:
            all_tpot = np.where(output > 1, (e2e - ttft) / np.maximum(output - 1, 1), 0.0)
            good = np.ones(len(ttft), dtype=bool)
            for name, values in (("ttft", ttft), ("tpot", all_tpot), ("e2el", e2e)):
                if name in goodput_slo_s:
                    good &= values <= goodput_slo_s[name]
            out[("request_goodput", "value")] = float(good.sum()) / window_s
    return out


def _stats(metric: str, values: np.ndarray, weights: np.ndarray | None, method: str) -> dict[MetricKey, float]:
    if not len(values):
        return {}
    if weights is None:
        mean = float(values.mean())
        median, p99 = (float(x) for x in np.percentile(values, [50, 99], method=method))
    else:
        mean = float(np.average(values, weights=weights))
        median, p99 = (float(x) for x in np.percentile(values, [50, 99], method=method, weights=weights))
    stats = dict(zip(LATENCY_STATS, (mean, median, p99)))
    return {(metric, stat): value for stat, value in stats.items()}


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted − measured) / measured; None when either is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    return predicted / measured - 1.0
