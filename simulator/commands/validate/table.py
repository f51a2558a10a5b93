"""The published truth table: ``validation/published.csv``, one published GPU measurement a row.

Columns (``validation/SOURCES.md`` describes each source)::

    row_id, source, source_title, source_url, source_date, engine, engine_version, model, gpu,
    tensor_parallel, num_gpus, weight_dtype, kv_cache_dtype, input_tokens, output_tokens,
    dataset, load, load_value, num_prompts, metric, statistic, unit, value, notes

* ``load`` is how the benchmark offered its requests: ``concurrency`` (N closed-loop clients,
  ``vllm bench serve --max-concurrency N``), ``rate`` (req/s), ``burst`` (every request at t = 0:
  offline maximum throughput) or ``batch`` (a static batch of N run to completion).
* ``metric`` × ``statistic`` × ``unit``: ttft / itl / tpot / e2e in ms or s (mean, median, p90,
  p99), output_throughput / total_throughput in tok/s, request_throughput in req/s (``value``).
  Throughput is for the whole ``num_gpus``; with data parallelism (num_gpus > tensor_parallel)
  the replicas share the load evenly.

Rows are read once and checked: unknown loads, metrics or units, non-positive numbers and
duplicate ids are one-line errors naming the file and the row.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import KvplanError, did_you_mean

COLUMNS: tuple[str, ...] = (
    "row_id", "source", "source_title", "source_url", "source_date", "engine", "engine_version",
    "model", "gpu", "tensor_parallel", "num_gpus", "weight_dtype", "kv_cache_dtype",
    "input_tokens", "output_tokens", "dataset", "load", "load_value", "num_prompts", "metric",
    "statistic", "unit", "value", "notes",
)
LOADS = ("concurrency", "rate", "burst", "batch")
LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e")
THROUGHPUT_METRICS = ("output_throughput", "total_throughput", "request_throughput")
METRICS = LATENCY_METRICS + THROUGHPUT_METRICS
STATISTICS = ("mean", "median", "p90", "p99", "value")
UNITS = {"ms": 1e-3, "s": 1.0, "tok/s": 1.0, "req/s": 1.0}  # -> seconds, tok/s, req/s


def default_table_path() -> Path:
    """The table shipped with kvplan: ``validation/published.csv`` next to the packages."""
    return Path(__file__).resolve().parents[3] / "validation" / "published.csv"


@dataclass(frozen=True, slots=True)
class PublishedRow:
    """One published measurement, in SI units (``value_si``: seconds, tok/s or req/s)."""

    row_id: str
    source: str
    source_title: str
    source_url: str
    engine: str
    engine_version: str
    model: str
    gpu: str
    tensor_parallel: int
    num_gpus: int
    weight_dtype: str
    kv_cache_dtype: str
    input_tokens: int | None
    output_tokens: int | None
    dataset: str
    load: str
    load_value: float | None
    num_prompts: int | None
    metric: str
    statistic: str
    unit: str
    value: float
    notes: str

    @property
    def value_si(self) -> float:
        return self.value * UNITS[self.unit]

    @property
    def num_replicas(self) -> int:
        return max(1, self.num_gpus // self.tensor_parallel)

    @property
    def metric_label(self) -> str:
        """``"ttft mean"``, ``"output_throughput"``: what a table column calls the row's metric."""
        return self.metric if self.statistic == "value" else f"{self.metric} {self.statistic}"

    @property
    def setup_key(self) -> tuple[object, ...]:
        """Rows with the same key are one benchmark run: one simulation predicts them all."""
        return (self.source, self.engine, self.model, self.gpu, self.tensor_parallel,
                self.num_gpus, self.weight_dtype, self.kv_cache_dtype, self.input_tokens,
                self.output_tokens, self.dataset, self.load, self.load_value, self.num_prompts)


def read_table(path: str | Path | None = None) -> list[PublishedRow]:
    """The rows of ``path`` (default: the shipped table), checked; bad rows -> KvplanError."""
    p = Path(path) if path is not None else default_table_path()
    if not p.is_file():
        raise KvplanError(f"validation table '{p}' not found")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError(f"{p}: cannot read the validation table ({err})") from None
    reader = csv.DictReader(text.splitlines())
    header = tuple(reader.fieldnames or ())
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise KvplanError(f"{p}: missing columns {', '.join(missing)}")
    rows: list[PublishedRow] = []
    seen: set[str] = set()
    for line, raw in enumerate(reader, start=2):
        row = _parse_row(raw, f"{p}:{line}")
        if row.row_id in seen:
            raise KvplanError(f"{p}:{line}: duplicate row_id '{row.row_id}'")
        seen.add(row.row_id)
        rows.append(row)
    if not rows:
        raise KvplanError(f"{p}: the validation table has no rows")
    return rows


def select_sources(rows: Sequence[PublishedRow], sources: Iterable[str] | None) -> list[PublishedRow]:
    """Only the rows of ``sources`` (all rows when None); an unknown source -> KvplanError."""
    if not sources:
        return list(rows)
    known = sorted({r.source for r in rows})
    wanted = set()
    for s in sources:
        if s not in known:
            raise KvplanError(f"unknown source '{s}'{did_you_mean(s, known) or ' (known: ' + ', '.join(known) + ')'}")
        wanted.add(s)
    return [r for r in rows if r.source in wanted]


def _parse_row(raw: dict[str, str | None], where: str) -> PublishedRow:
    def text(key: str) -> str:
        return (raw.get(key) or "").strip()

    def choice(key: str, choices: Sequence[str]) -> str:
        v = text(key).lower()
        if v not in choices:
            raise KvplanError(f"{where}: {key} '{v}'{did_you_mean(v, choices) or ''} is not one of"
                              f" {', '.join(choices)}")
        return v

    def number(key: str, *, required: bool, integer: bool = False) -> float | None:
        v = text(key)
        if not v:
            if required:
                raise KvplanError(f"{where}: {key} is empty")
            return None
        try:
            x = float(v.replace(",", ""))
        except ValueError:
            raise KvplanError(f"{where}: {key} '{v}' is not a number") from None
        if not math.isfinite(x) or x <= 0 or (integer and x != int(x)):
            kind = "a positive integer" if integer else "a positive number"
            raise KvplanError(f"{where}: {key} must be {kind}, got '{v}'")
        return x

    def integer(key: str, *, required: bool) -> int | None:
        x = number(key, required=required, integer=True)
        return None if x is None else int(x)

    row_id = text("row_id")
    if not row_id:
        raise KvplanError(f"{where}: row_id is empty")
    metric = choice("metric", METRICS)
    unit = text("unit")
    if unit not in UNITS:
        raise KvplanError(f"{where}: unit '{unit}' is not one of {', '.join(UNITS)}")
    expected = ("ms", "s") if metric in LATENCY_METRICS else (
        ("req/s",) if metric == "request_throughput" else ("tok/s",))
    if unit not in expected:
        raise KvplanError(f"{where}: metric {metric} is measured in {' or '.join(expected)}, not {unit}")
    load = choice("load", LOADS)
    tp = integer("tensor_parallel", required=True)
    num_gpus = integer("num_gpus", required=False) or tp
    assert tp is not None
    if num_gpus % tp:
        raise KvplanError(f"{where}: num_gpus {num_gpus} is not a multiple of tensor_parallel {tp}")
    value = number("value", required=True)
    assert value is not None
    return PublishedRow(
        row_id=row_id, source=text("source"), source_title=text("source_title"),
        source_url=text("source_url"), engine=text("engine").lower(),
        engine_version=text("engine_version"), model=text("model"), gpu=text("gpu"),
        tensor_parallel=tp, num_gpus=num_gpus, weight_dtype=text("weight_dtype").lower() or "auto",
        kv_cache_dtype=text("kv_cache_dtype").lower() or "auto",
        input_tokens=integer("input_tokens", required=False),
        output_tokens=integer("output_tokens", required=False), dataset=text("dataset").lower(),
        load=load, load_value=number("load_value", required=False),
        num_prompts=integer("num_prompts", required=False), metric=metric,
        statistic=choice("statistic", STATISTICS), unit=unit, value=value, notes=text("notes"),
    )
