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
published table's names (:mod:`simulator.commands.validate.table`): ``ttft``/``tpot``/``itl``/``e2e`` ×
``mean``/``median``/``p99``, and ``request_throughput``, ``output_throughput``,
``total_throughput``, ``request_goodput`` with statistic ``value``.

Every number read goes through one checker (:func:`checked`), so the three formats refuse the
same things with one line naming the file and the field: NaN, Infinity (except vLLM's
``request_rate: "inf"`` and ``burstiness: Infinity``, which its client writes), negative values,
fractions where a count belongs, 0 where a count or a rate must be positive (``completed``,
``num_prompts``, ``max_concurrency``, ``request_rate``, ``burstiness``, GuideLLM's streams, rate
and request totals), and magnitudes beyond any real run (:data:`CEILINGS`). A GuideLLM benchmark
whose ``metrics`` hold no latency and no throughput is refused like a vLLM result without one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError, ResultFileError
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
    # the field of the file each recorded part of ``load`` was read from ({"num_requests":
    # "num_prompts", ...}): what an error about the load names
    load_fields: Mapping[str, str] = field(default_factory=dict, compare=False)

    def field_of(self, attribute: str) -> str:
        """The file's field that ``load.<attribute>`` was read from (the attribute if unknown)."""
        return self.load_fields.get(attribute, attribute)

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
        raise ResultFileError(f"{base}: not a benchmark result (a JSON/YAML mapping of keys)")
    if "benchmarks" in data:
        return _guidellm(data, path, base, index_text if sep else None)
    if sep:
        raise ResultFileError(f"{path}: '#{index_text}' picks one benchmark of a GuideLLM report; "
                          f"{base} is not one")
    if "allocators" in data and "scenario" in data:
        return _fidelity(data, base)
    if "request_throughput" in data or "mean_ttft_ms" in data:
        return _vllm_bench(data, base)
    raise ResultFileError(f"{base}: unknown result format (expected a `vllm bench serve --save-result` "
                      "JSON, a GuideLLM report or kvplan's fidelity.json)")


def _load(p: Path, shown: str) -> Any:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultFileError(f"{shown}: no such result file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultFileError(f"{shown}: cannot read the result file ({err})") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        return parse_yaml(text, shown)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
            # vllm bench serve --append-result writes one JSON object per line
            raise ResultFileError(f"{shown}: holds {len(lines)} results, one per line (--append-result); "
                              "give each its own file") from None
        raise ResultFileError(f"{shown}:{err.lineno}: not valid JSON ({err.msg})") from None


# Every number a reader takes goes through :func:`checked`, so that the three formats refuse the
# same things the same way: NaN, Infinity (where the tool never writes it), negative values, a
# fraction where a count belongs, 0 where a rate or a count must be positive, and magnitudes no
# real run reaches. The ceilings are kvplan's own sanity bounds, each orders of magnitude above
# what a serving benchmark measures; they catch 1e308 and slipped units, not slow servers.
CEILINGS: dict[str, tuple[float, str]] = {
    # a day; vllm bench serve's client gives up on a request after 6 h (AIOHTTP_TIMEOUT,
    # vllm/benchmarks/lib/endpoint_request_func.py), so no latency it reports comes near this
    "latency_ms": (86_400_000.0, "ms"),
    "latency_s": (86_400.0, "s"),
    "request_rate": (1e6, "req/s"),  # a million requests a second from one benchmark client
    "token_rate": (1e9, "tok/s"),  # a billion tokens a second from one deployment
    "tokens": (1e13, "tokens"),  # a run's total: 10^7 requests of 10^6 tokens each
    "count": (1e9, ""),  # requests sent or completed, clients, requests in flight
    "shape": (1e6, ""),  # vLLM's burstiness (a gamma shape); Infinity: constant gaps
}


def checked(value: Any, where: str, field: str, kind: str, *, positive: bool = False, whole: bool = False,
            inf: bool = False) -> float:
    """``value`` (the number at ``field`` of the file ``where``) as a float, or a one-line
    KvplanError naming the file and the field: not a number, NaN, Infinity (unless ``inf``:
    ``"inf"`` and Infinity both mean it), negative, 0 when ``positive``, a fraction when
    ``whole``, or beyond the ceiling of its ``kind`` (:data:`CEILINGS`)."""
    if inf and value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultFileError(f"{where}: '{field}' is {value!r}, not a number")
    x = float(value)
    if math.isnan(x):
        raise ResultFileError(f"{where}: '{field}' is NaN, not a number")
    if math.isinf(x):
        if inf and x > 0:
            return math.inf
        raise ResultFileError(f"{where}: '{field}' is {'' if x > 0 else '-'}Infinity, not a finite number")
    if x < 0:
        raise ResultFileError(f"{where}: '{field}' is {value!r}, not a non-negative number")
    if positive and x == 0:
        raise ResultFileError(f"{where}: '{field}' is 0; it must be positive")
    if whole and x != int(x):
        raise ResultFileError(f"{where}: '{field}' is {value!r}, not a whole number")
    ceiling, unit = CEILINGS[kind]
    if x > ceiling:
        raise ResultFileError(f"{where}: '{field}' is {value!r}, beyond any real benchmark run "
                          f"(kvplan takes at most {ceiling:g}{' ' + unit if unit else ''})")
    return x


def _number(data: Mapping[str, Any], key: str, where: str, kind: str, *, required: bool = False,
            field: str | None = None, **rules: bool) -> float | None:
    """The number at ``data[key]`` through :func:`checked` (None when absent or null)."""
    value = data.get(key)
    if value is None:
        if required:
            raise ResultFileError(f"{where}: missing key '{field or key}'")
        return None
    return checked(value, where, field or key, kind, **rules)


def _vllm_bench(data: Mapping[str, Any], where: str) -> MeasuredResult:
    """vllm/benchmarks/serve.py (``benchmark``'s ``result`` dict and ``process_one_metric``;
    ``main_async``'s ``result_json``)."""
    metrics: dict[MetricKey, float] = {}
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
    for vllm_name, metric in names.items():
        for stat, prefix in (("mean", "mean"), ("median", "median"), ("p99", "p99")):
            value = _number(data, f"{prefix}_{vllm_name}_ms", where, "latency_ms")
            if value is not None:
                metrics[(metric, stat)] = value / 1000.0
    for ours, key in (("request_throughput", "request_throughput"), ("output_throughput", "output_throughput"),
                      ("total_throughput", "total_token_throughput"), ("request_goodput", "request_goodput")):
        kind = "request_rate" if key in ("request_throughput", "request_goodput") else "token_rate"
        value = _number(data, key, where, kind, required=key == "request_throughput")
        if value is not None:
            metrics[(ours, "value")] = value
    if not any(m in LATENCY_METRICS_SET for m, _ in metrics):
        raise ResultFileError(f"{where}: no latency in the result (keys mean_ttft_ms, median_ttft_ms, ... "
                          "are missing)")
    notes = []
    for stat in ("median", "p99"):
        if ("itl", stat) in metrics:
            # vLLM's ITL percentiles are over every gap between two tokens of every request; the
            # simulator's requests have per-request TPOTs, not the gaps: only the mean compares
            # (the mean gap is Σ(E2E − TTFT) / Σ(output − 1), a token-weighted mean TPOT).
            del metrics[("itl", stat)]
    notes.append("ITL: only the mean is compared (vLLM's ITL percentiles are over single token gaps)")
    completed = _number(data, "completed", where, "count", required=True, whole=True)
    if completed == 0:
        # calculate_metrics warns "All requests failed" and reports every latency as 0
        raise ResultFileError(f"{where}: 'completed' is 0: no request of the run completed, nothing to compare")
    # main_async writes request_rate as "inf" for --request-rate inf and burstiness as a float
    # (Infinity for --burstiness inf: constant gaps); get_request asserts a positive rate and a
    # positive burstiness, so 0 is no run vllm bench serve made.
    rate = _number(data, "request_rate", where, "request_rate", positive=True, inf=True)
    burstiness = _number(data, "burstiness", where, "shape", positive=True, inf=True)
    arrival = None
    if rate is not None and not math.isinf(rate):
        arrival = ("poisson" if burstiness in (None, 1.0) else
                   "constant" if burstiness is not None and math.isinf(burstiness) else "gamma")
    # --max-concurrency is an int or null (no cap); 0 is no cap either to vLLM's client (it
    # tests `if max_concurrency`) but caps nothing it could have measured: refused, not guessed
    max_concurrency = _number(data, "max_concurrency", where, "count", positive=True, whole=True)
    num_prompts = _number(data, "num_prompts", where, "count", positive=True, whole=True)
    if num_prompts is not None and completed > num_prompts:
        raise ResultFileError(f"{where}: 'completed' is {completed:g}, more than 'num_prompts' {num_prompts:g}")
    lengths = _mean_lengths(data, completed, where)
    load = Load(rate=rate, burstiness=burstiness, arrival=arrival,
                max_concurrency=int(max_concurrency) if max_concurrency is not None else None,
                num_requests=int(num_prompts) if num_prompts is not None else None,
                mean_prompt_tokens=lengths[0], mean_output_tokens=lengths[1])
    model = data.get("model_id")
    fields = {"rate": "request_rate", "burstiness": "burstiness", "max_concurrency": "max_concurrency",
              "num_requests": "num_prompts"}
    return MeasuredResult(where, "vllm-bench", str(model) if model else None, metrics, load, tuple(notes),
                          load_fields=fields)


def _mean_lengths(data: Mapping[str, Any], completed: float, where: str) -> tuple[float | None, float | None]:
    total_in = _number(data, "total_input_tokens", where, "tokens", whole=True)
    total_out = _number(data, "total_output_tokens", where, "tokens", whole=True)
    if total_in is None or total_out is None:
        return None, None
    return total_in / completed, total_out / completed


def _guidellm(data: Mapping[str, Any], path: str, where: str, index_text: str | None) -> MeasuredResult:
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ResultFileError(f"{where}: the GuideLLM report has no benchmarks")
    if index_text is None:
        if len(benchmarks) > 1:
            raise ResultFileError(f"{where}: the GuideLLM report holds {len(benchmarks)} benchmarks (a sweep): "
                              f"pick one with {where}#N, N = 1..{len(benchmarks)}")
        index = 1
    else:
        try:
            index = int(index_text)
        except ValueError:
            raise ResultFileError(f"{path}: '#{index_text}' is not a benchmark number") from None
        if not 1 <= index <= len(benchmarks):
            raise ResultFileError(f"{path}: the report holds benchmarks 1..{len(benchmarks)}, not {index}")
    bench = benchmarks[index - 1]
    if not isinstance(bench, dict):
        raise ResultFileError(f"{where}: benchmarks[{index - 1}] is not a mapping")
    here = f"{where}: benchmarks[{index - 1}]"
    metrics_in = _mapping(bench, "metrics", here)
    metrics: dict[MetricKey, float] = {}
    for metric, key, scale, kind in (("ttft", "time_to_first_token_ms", 1e-3, "latency_ms"),
                                     ("tpot", "inter_token_latency_ms", 1e-3, "latency_ms"),
                                     ("e2e", "request_latency", 1.0, "latency_s")):
        for stat, value in _stats_of(metrics_in, key, here, kind).items():
            metrics[(metric, stat)] = value * scale
    for ours, key, kind in (("request_throughput", "requests_per_second", "request_rate"),
                            ("output_throughput", "output_tokens_per_second", "token_rate"),
                            ("total_throughput", "tokens_per_second", "token_rate")):
        mean = _stats_of(metrics_in, key, here, kind, ("mean",)).get("mean")
        if mean is not None:
            metrics[(ours, "value")] = mean
    if not metrics:
        raise ResultFileError(f"{here}: metrics holds no latency or throughput (time_to_first_token_ms, "
                          "inter_token_latency_ms, request_latency, requests_per_second, ... are missing)")
    strategy = _mapping(_mapping(bench, "config", here), "strategy", f"{here}.config")
    load, fields = _guidellm_load(strategy, metrics_in, here)
    args = data.get("args") if isinstance(data.get("args"), dict) else {}
    model = args.get("model") if isinstance(args, dict) else None
    notes = ("TPOT: GuideLLM's inter_token_latency_ms ((last − first token) / (output − 1), per "
             "request); its time_per_output_token_ms includes the first token and is not compared",)
    return MeasuredResult(path if index_text is not None else where, "guidellm",
                          str(model) if model else None, metrics, load, notes, load_fields=fields)


def _guidellm_load(strategy: Mapping[str, Any], metrics: Mapping[str, Any], where: str
                   ) -> tuple[Load, dict[str, str]]:
    """src/guidellm/scheduler/strategies.py: ``type_`` and its fields; the load and the field
    each part of it came from."""
    kind = strategy.get("type_")
    prompt = _stats_of(metrics, "prompt_token_count", where, "tokens", ("mean",)).get("mean")
    output = _stats_of(metrics, "output_token_count", where, "tokens", ("mean",)).get("mean")
    totals = metrics.get("request_totals")
    if totals is not None and not isinstance(totals, dict):
        raise ResultFileError(f"{where}: metrics.request_totals is not a mapping of counts")
    totals = totals or {}
    num = _number(totals, "total", where, "count", field="metrics.request_totals.total", positive=True,
                  whole=True)
    # request_totals.successful counts the completed requests (vLLM's `completed`): none is no run
    if _number(totals, "successful", where, "count", field="metrics.request_totals.successful",
               whole=True) == 0:
        raise ResultFileError(f"{where}: 'metrics.request_totals.successful' is 0: no request of the benchmark "
                          "completed, nothing to compare")
    common: dict[str, Any] = {"num_requests": int(num) if num is not None else None,
                              "mean_prompt_tokens": prompt, "mean_output_tokens": output}
    fields = {"num_requests": "metrics.request_totals.total"}
    at = f"{where}.config.strategy"
    if kind == "synchronous":
        return Load(concurrency=1, **common), fields
    if kind == "concurrent":
        streams = _number(strategy, "streams", at, "count", required=True, positive=True, whole=True)
        assert streams is not None
        return Load(concurrency=int(streams), **common), {**fields, "concurrency": "config.strategy.streams"}
    if kind == "throughput":
        cap = _number(strategy, "max_concurrency", at, "count", positive=True, whole=True)
        return (Load(rate=math.inf, max_concurrency=int(cap) if cap is not None else None, **common),
                {**fields, "max_concurrency": "config.strategy.max_concurrency"})
    if kind in ("constant", "poisson"):
        rate = _number(strategy, "rate", at, "request_rate", required=True, positive=True)
        return Load(rate=rate, arrival=kind, **common), {**fields, "rate": "config.strategy.rate"}
    raise ResultFileError(f"{at}: type_ {kind!r} is not one kvplan reproduces "
                      "(synchronous, concurrent, throughput, constant, poisson)")


def _mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ResultFileError(f"{where}: missing key '{key}'")
    return value


def _stats_of(metrics: Mapping[str, Any], key: str, where: str, kind: str,
              which: tuple[str, ...] = LATENCY_STATS) -> dict[str, float]:
    """The ``successful`` part's mean, median and p99 (those of ``which`` present) of the
    StatusDistributionSummary ``metrics[key]``, each through :func:`checked`."""
    dist = metrics.get(key)
    if dist is None:
        return {}
    if not isinstance(dist, dict) or not isinstance(dist.get("successful"), dict):
        raise ResultFileError(f"{where}: metrics.{key} is not a distribution summary (no 'successful')")
    ok = dist["successful"]
    percentiles = ok.get("percentiles")
    if percentiles is not None and not isinstance(percentiles, dict):
        raise ResultFileError(f"{where}: metrics.{key}.successful.percentiles is not a mapping")
    found = {"mean": (ok, "mean"), "median": (ok, "median"), "p99": (percentiles or {}, "p99")}
    out = {}
    for stat in which:
        source, name = found[stat]
        field = f"metrics.{key}.successful.{'percentiles.' if stat == 'p99' else ''}{name}"
        value = _number(source, name, where, kind, field=field)
        if value is not None:
            out[stat] = value
    return out


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
        raise ResultFileError(f"{where}: missing key 'allocators.paged.metrics'")
    metrics: dict[MetricKey, float] = {}
    for name, entry in paged["metrics"].items():
        key = _FIDELITY_KEYS.get(name)
        if key is None or not isinstance(entry, dict):
            continue
        kind = ("request_rate" if key[0] == "request_throughput" else
                "token_rate" if key[0] == "output_throughput" else "latency_s")
        value = _number(entry, "measured", where, kind, field=f"allocators.paged.metrics.{name}.measured")
        if value is not None:
            metrics[key] = value
    if not metrics:
        raise ResultFileError(f"{where}: no measured metric in allocators.paged.metrics")
    notes = ("load: fidelity.json records none; the scenario's own workload is simulated",)
    model = data.get("model")
    return MeasuredResult(where, "kvplan-fidelity", str(model) if model else None, metrics, Load(), notes)
