"""Reading what was measured: a serving benchmark's result file, as one :class:`MeasuredResult`.

Three formats, told apart by their keys (never by the file name):

* ``vllm-bench`` — ``vllm bench serve --save-result`` JSON (vllm/benchmarks/serve.py,
  ``main_async`` builds ``result_json`` = the run's traffic settings merged with what
  ``benchmark`` returns). Latencies are in ms: ``mean_ttft_ms``, ``median_ttft_ms``,
  ``p99_ttft_ms`` (percentiles as ``--metric-percentiles`` chose, default 99) and the same for
  ``tpot``, ``itl`` and ``e2el`` (each only when ``--percentile-metrics`` named it; the default is
  ``ttft,tpot,itl``); throughputs ``request_throughput``, ``output_throughput``,
  ``total_token_throughput`` and ``request_goodput`` (null unless ``--goodput`` was given) over
  ``duration`` s; the load ``request_rate`` (a number or ``"inf"``), ``burstiness`` (gamma
  shape: 1 is Poisson), ``max_concurrency``, ``num_prompts``; the model ``model_id``;
  ``completed``, ``total_input_tokens``, ``total_output_tokens`` over the completed requests.
* ``guidellm`` — a GuideLLM report, JSON or YAML (src/guidellm/benchmark/schemas/generative/
  report.py ``GenerativeBenchmarksReport``: ``args`` and a list of ``benchmarks``). Each
  benchmark has ``config.strategy`` (src/guidellm/scheduler/strategies.py: ``type_``
  synchronous | concurrent (``streams``) | throughput (``max_concurrency``) | constant | poisson
  (``rate``)) and ``metrics`` (src/guidellm/benchmark/schemas/generative/metrics.py
  ``GenerativeMetrics``): each a ``StatusDistributionSummary`` whose ``successful`` part has
  ``mean``, ``median`` and ``percentiles.p99`` (src/guidellm/schemas/statistics.py).
  ``time_to_first_token_ms``, ``inter_token_latency_ms`` (per request (last − first token) /
  (output − 1): kvplan's TPOT), ``request_latency`` (seconds), ``requests_per_second``,
  ``output_tokens_per_second``, ``tokens_per_second``. GuideLLM's ``time_per_output_token_ms``
  counts the first token's wait in every token, which no kvplan metric does: it is not compared.
  A report with several benchmarks (a sweep) is one result per benchmark: pick one with
  ``#N`` after the path (``report.json#2``), counted from 1.
* ``kvplan-fidelity`` — kvplan's own ``fidelity.json`` (or the folder holding it): the real
  engine's ``measured`` value of each metric.

Every latency is converted to seconds, every metric keyed ``(metric, statistic)`` with the
published table's names (:mod:`simulator.validate.table`): ``ttft``/``tpot``/``itl``/``e2e`` ×
``mean``/``median``/``p99``, and ``request_throughput``, ``output_throughput``,
``total_throughput``, ``request_goodput`` with statistic ``value``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError
from simulator.yamlfile import parse_yaml

LATENCY_STATS = ("mean", "median", "p99")
THROUGHPUTS = ("request_throughput", "output_throughput", "total_throughput", "request_goodput")
LATENCY_METRICS_SET = frozenset({"ttft", "tpot", "itl", "e2e"})
MetricKey = tuple[str, str]  # (metric, statistic), e.g. ("ttft", "p99"), ("output_throughput", "value")


@dataclass(frozen=True)
class Load:
    """How the benchmark offered its requests, as far as the result records it.

    ``rate``: mean req/s (``math.inf``: every request at once); ``burstiness``: vLLM's gamma
    shape (1: Poisson); ``arrival``: ``poisson`` | ``gamma`` | ``constant`` for a rate;
    ``concurrency``: closed-loop clients (GuideLLM's concurrent streams); ``max_concurrency``: a
    cap on requests in flight; ``num_requests``: requests sent; mean lengths over the completed
    requests."""

    rate: float | None = None
    burstiness: float | None = None
    arrival: str | None = None
    concurrency: int | None = None
    max_concurrency: int | None = None
    num_requests: int | None = None
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None

    def describe(self) -> str:
        """``"4 req/s Poisson, 200 requests, 512/128 tokens"``: for tables and titles."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} closed-loop clients")
        elif self.rate is not None:
            how = {"gamma": f"gamma (burstiness {self.burstiness or 1:g})", "poisson": "Poisson",
                   "constant": "constant gaps"}.get(self.arrival or "", "")
            parts.append("burst (rate inf)" if math.isinf(self.rate) else f"{self.rate:g} req/s {how}".strip())
        if self.max_concurrency is not None:
            parts.append(f"max {self.max_concurrency} in flight")
        if self.num_requests is not None:
            parts.append(f"{self.num_requests} requests")
        if self.mean_prompt_tokens is not None and self.mean_output_tokens is not None:
            parts.append(f"{self.mean_prompt_tokens:.0f}/{self.mean_output_tokens:.0f} tokens")
        return ", ".join(parts) or "load not recorded"


@dataclass(frozen=True)
class MeasuredResult:
    """One measured point: its metrics in SI units, the load it was measured at, the model."""

    path: str  # as the user gave it (with #N for one benchmark of a GuideLLM report)
    format: str  # vllm-bench | guidellm | kvplan-fidelity
    model: str | None
    metrics: dict[MetricKey, float]
    load: Load
    notes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """A short name: the file's stem (and #N)."""
        base, _, index = self.path.partition("#")
        stem = Path(base).name if Path(base).name != "fidelity.json" else Path(base).parent.name
        return f"{Path(stem).stem}#{index}" if index else Path(stem).stem


def read_result(path: str) -> MeasuredResult:
    """The measured result at ``path`` (``report.json#N`` picks one benchmark of a GuideLLM
    sweep). An unreadable file, an unknown format or missing keys is a one-line KvplanError."""
    base, sep, index_text = path.partition("#")
    p = Path(base)
    if p.is_dir():
        p = p / "fidelity.json"
    data = _load(p, base)
    if not isinstance(data, dict):
        raise KvplanError(f"{base}: not a benchmark result (a JSON/YAML mapping of keys)")
    if "benchmarks" in data:
        return _guidellm(data, path, base, index_text if sep else None)
    if sep:
        raise KvplanError(f"{path}: '#{index_text}' picks one benchmark of a GuideLLM report; "
                          f"{base} is not one")
    if "allocators" in data and "scenario" in data:
        return _fidelity(data, base)
    if "request_throughput" in data or "mean_ttft_ms" in data:
        return _vllm_bench(data, base)
    raise KvplanError(f"{base}: unknown result format (expected a `vllm bench serve --save-result` "
                      "JSON, a GuideLLM report or kvplan's fidelity.json)")


def _load(p: Path, shown: str) -> Any:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KvplanError(f"{shown}: no such result file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError(f"{shown}: cannot read the result file ({err})") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        return parse_yaml(text, shown)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
            # vllm bench serve --append-result writes one JSON object per line
            raise KvplanError(f"{shown}: holds {len(lines)} results, one per line (--append-result); "
                              "give each its own file") from None
        raise KvplanError(f"{shown}:{err.lineno}: not valid JSON ({err.msg})") from None


def _number(data: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> float | None:
    value = data.get(key)
    if value is None:
        if required:
            raise KvplanError(f"{where}: missing key '{key}'")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value == "inf":
            return math.inf
        raise KvplanError(f"{where}: '{key}' is {value!r}, not a number")
    x = float(value)
    if math.isnan(x) or x < 0:
        raise KvplanError(f"{where}: '{key}' is {value!r}, not a non-negative number")
    return x


def _vllm_bench(data: Mapping[str, Any], where: str) -> MeasuredResult:
    """vllm/benchmarks/serve.py (``benchmark``'s ``result`` dict and ``process_one_metric``;
    ``main_async``'s ``result_json``)."""
    metrics: dict[MetricKey, float] = {}
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
    for vllm_name, metric in names.items():
        for stat, prefix in (("mean", "mean"), ("median", "median"), ("p99", "p99")):
            value = _number(data, f"{prefix}_{vllm_name}_ms", where)
            if value is not None:
                metrics[(metric, stat)] = value / 1000.0
    for ours, key in (("request_throughput", "request_throughput"), ("output_throughput", "output_throughput"),
                      ("total_throughput", "total_token_throughput"), ("request_goodput", "request_goodput")):
        value = _number(data, key, where, required=key == "request_throughput")
        if value is not None:
            metrics[(ours, "value")] = value
    if not any(m in LATENCY_METRICS_SET for m, _ in metrics):
        raise KvplanError(f"{where}: no latency in the result (keys mean_ttft_ms, median_ttft_ms, ... "
                          "are missing)")
    notes = []
    for stat in ("median", "p99"):
        if ("itl", stat) in metrics:
            # vLLM's ITL percentiles are over every gap between two tokens of every request; the
            # simulator's requests have per-request TPOTs, not the gaps: only the mean compares
            # (the mean gap is Σ(E2E − TTFT) / Σ(output − 1), a token-weighted mean TPOT).
            del metrics[("itl", stat)]
    notes.append("ITL: only the mean is compared (vLLM's ITL percentiles are over single token gaps)")
    completed = _number(data, "completed", where, required=True)
    rate = _number(data, "request_rate", where)
    burstiness = _number(data, "burstiness", where)
    arrival = None
    if rate is not None and not math.isinf(rate):
        arrival = "poisson" if burstiness in (None, 1.0) else "gamma"
    max_concurrency = _number(data, "max_concurrency", where)
    num_prompts = _number(data, "num_prompts", where)
    lengths = _mean_lengths(data, completed, where)
    load = Load(rate=rate, burstiness=burstiness, arrival=arrival,
                max_concurrency=int(max_concurrency) if max_concurrency else None,
                num_requests=int(num_prompts) if num_prompts else None,
                mean_prompt_tokens=lengths[0], mean_output_tokens=lengths[1])
    model = data.get("model_id")
    return MeasuredResult(where, "vllm-bench", str(model) if model else None, metrics, load, tuple(notes))


def _mean_lengths(data: Mapping[str, Any], completed: float | None, where: str) -> tuple[float | None, float | None]:
    total_in = _number(data, "total_input_tokens", where)
    total_out = _number(data, "total_output_tokens", where)
    if not completed or total_in is None or total_out is None:
        return None, None
    return total_in / completed, total_out / completed



def _guidellm(data: Mapping[str, Any], path: str, where: str, index_text: str | None) -> MeasuredResult:
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise KvplanError(f"{where}: the GuideLLM report has no benchmarks")
    if index_text is None:
        if len(benchmarks) > 1:
            raise KvplanError(f"{where}: the GuideLLM report holds {len(benchmarks)} benchmarks (a sweep): "
                              f"pick one with {where}#N, N = 1..{len(benchmarks)}")
        index = 1
    else:
        try:
            index = int(index_text)
        except ValueError:
            raise KvplanError(f"{path}: '#{index_text}' is not a benchmark number") from None
        if not 1 <= index <= len(benchmarks):
            raise KvplanError(f"{path}: the report holds benchmarks 1..{len(benchmarks)}, not {index}")
    bench = benchmarks[index - 1]
    here = f"{where}: benchmarks[{index - 1}]"
    metrics_in = _mapping(bench, "metrics", here)
    metrics: dict[MetricKey, float] = {}
    for metric, key, scale in (("ttft", "time_to_first_token_ms", 1e-3), ("tpot", "inter_token_latency_ms", 1e-3),
                               ("e2e", "request_latency", 1.0)):
        dist = _successful(metrics_in, key, here)
        for stat, value in (("mean", dist.get("mean")), ("median", dist.get("median")),
                            ("p99", (dist.get("percentiles") or {}).get("p99"))):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[(metric, stat)] = float(value) * scale
    for ours, key in (("request_throughput", "requests_per_second"),
                      ("output_throughput", "output_tokens_per_second"),
                      ("total_throughput", "tokens_per_second")):
        mean = _successful(metrics_in, key, here).get("mean")
        if isinstance(mean, (int, float)) and not isinstance(mean, bool):
            metrics[(ours, "value")] = float(mean)
    strategy = _mapping(_mapping(bench, "config", here), "strategy", f"{here}.config")
    load = _guidellm_load(strategy, metrics_in, bench, here)
    args = data.get("args") if isinstance(data.get("args"), dict) else {}
    model = args.get("model") if isinstance(args, dict) else None
    notes = ("TPOT: GuideLLM's inter_token_latency_ms ((last − first token) / (output − 1), per "
             "request); its time_per_output_token_ms includes the first token and is not compared",)
    return MeasuredResult(path if index_text is not None else where, "guidellm",
                          str(model) if model else None, metrics, load, notes)


def _guidellm_load(strategy: Mapping[str, Any], metrics: Mapping[str, Any], bench: Mapping[str, Any],
                   where: str) -> Load:
    """src/guidellm/scheduler/strategies.py: ``type_`` and its fields."""
    kind = strategy.get("type_")
    prompt = _successful(metrics, "prompt_token_count", where).get("mean")
    output = _successful(metrics, "output_token_count", where).get("mean")
    totals = metrics.get("request_totals") if isinstance(metrics.get("request_totals"), dict) else {}
    num = totals.get("total") if isinstance(totals, dict) else None
    common: dict[str, Any] = {"num_requests": int(num) if isinstance(num, (int, float)) and num else None,
                              "mean_prompt_tokens": float(prompt) if isinstance(prompt, (int, float)) else None,
                              "mean_output_tokens": float(output) if isinstance(output, (int, float)) else None}
    if kind == "synchronous":
        return Load(concurrency=1, **common)
    if kind == "concurrent":
        return Load(concurrency=int(_number(strategy, "streams", f"{where}.config.strategy", required=True) or 1),
                    **common)
    if kind == "throughput":
        cap = _number(strategy, "max_concurrency", f"{where}.config.strategy")
        return Load(rate=math.inf, max_concurrency=int(cap) if cap else None, **common)
    if kind in ("constant", "poisson"):
        rate = _number(strategy, "rate", f"{where}.config.strategy", required=True)
        return Load(rate=rate, arrival=kind, **common)
    raise KvplanError(f"{where}.config.strategy: type_ {kind!r} is not one kvplan reproduces "
                      "(synchronous, concurrent, throughput, constant, poisson)")


def _mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise KvplanError(f"{where}: missing key '{key}'")
    return value


def _successful(metrics: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """The ``successful`` distribution of a StatusDistributionSummary (empty if absent)."""
    dist = metrics.get(key)
    if dist is None:
        return {}
    if not isinstance(dist, dict) or not isinstance(dist.get("successful"), dict):
        raise KvplanError(f"{where}: metrics.{key} is not a distribution summary (no 'successful')")
    return dist["successful"]


_FIDELITY_KEYS: dict[str, MetricKey] = {
    "throughput_req_s": ("request_throughput", "value"), "throughput_tok_s": ("output_throughput", "value"),
    **{f"{ours}_s.{stat}": (metric, theirs) for ours, metric in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e"))
       for stat, theirs in (("mean", "mean"), ("p50", "median"), ("p99", "p99"))},
}


def _fidelity(data: Mapping[str, Any], where: str) -> MeasuredResult:
    """kvplan's fidelity.json (backend/fidelity.py ``run_fidelity``): the real engine's values."""
    allocators = data.get("allocators")
    paged = allocators.get("paged") if isinstance(allocators, dict) else None
    if not isinstance(paged, dict) or not isinstance(paged.get("metrics"), dict):
        raise KvplanError(f"{where}: missing key 'allocators.paged.metrics'")
    metrics: dict[MetricKey, float] = {}
    for name, entry in paged["metrics"].items():
        key = _FIDELITY_KEYS.get(name)
        value = entry.get("measured") if isinstance(entry, dict) else None
        if key is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[key] = float(value)
    if not metrics:
        raise KvplanError(f"{where}: no measured metric in allocators.paged.metrics")
    notes = ("load: fidelity.json records none; the scenario's own workload is simulated",)
    model = data.get("model")
    return MeasuredResult(where, "kvplan-fidelity", str(model) if model else None, metrics, Load(), notes)
