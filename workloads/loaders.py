"""Loaders for real request traces: Azure LLM inference, Mooncake, BurstGPT, generic CSV/JSONL.

Every loader returns ``list[Request]`` in file order, with ``request_id`` = row order
(0..N-1) and ``arrival_s`` relative to the first request (the first is 0.0).

Every row is validated and a bad one raises :class:`KvplanError` naming the file and line
(``trace.csv:17: ContextTokens 'abc' is not an integer``): prompts need at least one token,
outputs too (every request generates at least one token), and no length may exceed
:data:`MAX_TOKENS`. Timestamps must not go backwards: an unsorted trace is an error, never
silently sorted, because a sort would hide a broken export (a merged or shuffled file).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Literal, TextIO, get_args

from simulator.errors import KvplanError, did_you_mean, unknown_name
from workloads.request import Request

log = logging.getLogger(__name__)

MAX_TOKENS = 10_000_000  # longer than any context window: such a length is a corrupt row
MOONCAKE_BLOCK_TOKENS = 512  # tokens named by one Mooncake hash id

TraceFormat = Literal["auto", "azure", "mooncake", "burstgpt", "csv", "jsonl"]
TRACE_FORMATS: tuple[str, ...] = get_args(TraceFormat)
TimeUnit = Literal["s", "ms", "us"]
_SECONDS_PER_UNIT: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6}

DATA_DIR = Path(__file__).resolve().parent / "data"
_BUNDLED: dict[str, str] = {
    "azure-conv": "azure-2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure-2023/AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake-fast25/synthetic_trace.jsonl",
}
BUNDLED_TRACES: tuple[str, ...] = tuple(_BUNDLED)


def bundled_trace_path(name: str) -> Path:
    """Path of a trace shipped with kvplan ("azure-conv", "azure-code", "mooncake").

    Unknown name -> KvplanError with a did-you-mean hint. See data/ATTRIBUTION.md.
    """
    if name not in _BUNDLED:
        raise unknown_name("bundled trace", name, _BUNDLED)
    return DATA_DIR / _BUNDLED[name]


# --- field parsing ------------------------------------------------------------------------


def _integer(value: object, name: str, where: str) -> int:
    """An integer field; integral floats ("12.0", as pandas writes them) are accepted."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number: float | None = None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                number = None
    elif isinstance(value, float):
        number = value
    if number is None or not number.is_integer():
        raise KvplanError(f"{where}: {name} {value!r} is not an integer")
    return int(number)


def _prompt_tokens(value: object, name: str, where: str) -> int:
    tokens = _integer(value, name, where)
    if tokens < 1:
        raise KvplanError(f"{where}: {name} must be at least 1 (got {tokens})")
    if tokens > MAX_TOKENS:
        raise KvplanError(f"{where}: {name} {tokens:,} exceeds the limit of {MAX_TOKENS:,} tokens")
    return tokens


def _output_tokens(value: object, name: str, where: str) -> int:
    tokens = _integer(value, name, where)
    if tokens < 1:
        raise KvplanError(
            f"{where}: {name} must be at least 1 (got {tokens}): every request generates a token"
        )
    if tokens > MAX_TOKENS:
        raise KvplanError(f"{where}: {name} {tokens:,} exceeds the limit of {MAX_TOKENS:,} tokens")
    return tokens


def _number(value: object, name: str, where: str) -> float:
    """A finite real number (a timestamp)."""
    if isinstance(value, bool):
        raise KvplanError(f"{where}: {name} {value!r} is not a number")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise KvplanError(f"{where}: {name} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise KvplanError(f"{where}: {name} {value!r} is not a finite number")
    return number


_DATETIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:Z|([+-])(\d{2}):?(\d{2}))?"
)


class _DatetimeParser:
    """Wall-clock datetimes -> seconds since the first one parsed.

    Azure writes 7 fractional digits (100 ns), which ``datetime`` cannot hold, so the fields
    are parsed by hand. Seconds count from the first row's day, not the epoch, to keep the
    float's resolution far below a microsecond.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._first_day: int | None = None
        self._day_cache: dict[str, int] = {}

    def seconds(self, text: str, where: str) -> float:
        match = _DATETIME.fullmatch(text.strip())
        day = self._day_cache.get(match[1]) if match else None
        if match and day is None:
            try:
                day = self._day_cache[match[1]] = date.fromisoformat(match[1]).toordinal()
            except ValueError:
                day = None
        if match is None or day is None or not (
            int(match[2]) < 24 and int(match[3]) < 60 and int(match[4]) <= 60  # 60: leap second
        ):
            raise KvplanError(
                f"{where}: {self._name} {text!r} is not a datetime like 2023-11-16 18:15:46.6805900"
            )
        if self._first_day is None:
            self._first_day = day
        _, hours, minutes, secs, frac, sign, tz_hours, tz_minutes = match.groups()
        total = (day - self._first_day) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(secs)
        if sign:  # convert to UTC so rows with different offsets compare correctly
            offset = int(tz_hours) * 3600 + int(tz_minutes) * 60
            total -= offset if sign == "+" else -offset
        return total + (int(frac) / 10 ** len(frac) if frac else 0.0)


# --- assembling requests ------------------------------------------------------------------


class _TraceBuilder:
    """Collects validated rows, enforces time order, and numbers the requests."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._rows: list[tuple[float, int, int, tuple[int, ...]]] = []
        self._last_s = -math.inf
        self._last_raw = ""

    def add(
        self, line_where: str, time_s: float, time_raw: str, prompt_tokens: int, output_tokens: int,
        prefix_ids: tuple[int, ...] = (),
    ) -> None:
        if time_s < self._last_s:
            raise KvplanError(
                f"{line_where}: timestamp goes backwards ({time_raw} < {self._last_raw}); "
                "sort the trace first"
            )
        self._last_s, self._last_raw = time_s, time_raw
        self._rows.append((time_s, prompt_tokens, output_tokens, prefix_ids))

    def build(self, prefix_block_tokens: int = 0) -> list[Request]:
        if not self._rows:
            raise KvplanError(f"{self.where}: no requests in the trace")
        first_s = self._rows[0][0]
        return [
            Request(
                request_id=i, arrival_s=time_s - first_s, prompt_tokens=prompt, output_tokens=output,
                prefix_ids=prefix, prefix_block_tokens=prefix_block_tokens if prefix else 0,
            )
            for i, (time_s, prompt, output, prefix) in enumerate(self._rows)
        ]


@contextmanager
def _open_text(path: Path) -> Iterator[TextIO]:
    """Open a trace as text; I/O and decoding problems become KvplanError naming the file."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            yield f
    except FileNotFoundError:
        raise KvplanError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KvplanError(f"{path}: is a directory, not a trace file") from None
    except UnicodeDecodeError as err:
        raise KvplanError(f"{path}: not UTF-8 text (bad byte at offset {err.start})") from None
    except OSError as err:
        raise KvplanError(f"{path}: cannot read ({err.strerror})") from None


def _csv_columns(f: TextIO, where: str, columns: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """Yield ``("file:line", [value of each wanted column])`` for each non-blank CSV row.

    The header names the columns (surrounding spaces ignored); a missing one is an error.
    """
    reader = csv.reader(f)
    try:
        header = next(reader, None)
        if header is None:
            raise KvplanError(f"{where}: empty file")
        names = [name.strip() for name in header]
        for column in columns:
            if column not in names:
                # Suggest only columns the format does not use: those are likely typos.
                spare = [name for name in names if name not in columns]
                raise KvplanError(f"{where}: missing column '{column}'" + did_you_mean(column, spare))
        indices = [names.index(column) for column in columns]
        for row in reader:
            if not row:
                continue
            line_where = f"{where}:{reader.line_num}"
            if len(row) != len(names):
                raise KvplanError(f"{line_where}: expected {len(names)} fields, got {len(row)}")
            yield line_where, [row[i] for i in indices]
    except csv.Error as err:
        raise KvplanError(f"{where}:{reader.line_num}: {err}") from None


def _json_lines(f: TextIO, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``("file:line", object)`` for each non-blank line of a JSON-lines file."""
    empty = True
    for line_no, line in enumerate(f, start=1):
        if not line.strip():
            continue
        empty = False
        line_where = f"{where}:{line_no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise KvplanError(f"{line_where}: not valid JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise KvplanError(f"{line_where}: expected a JSON object, got {type(obj).__name__}")
        yield line_where, obj
    if empty:
        raise KvplanError(f"{where}: empty file")


def _key(obj: dict[str, Any], key: str, line_where: str, used: Sequence[str]) -> Any:
    """``obj[key]``; if missing, an error suggesting a key the format does not ``use``."""
    if key not in obj:
        spare = [name for name in obj if name not in used]
        raise KvplanError(f"{line_where}: missing key '{key}'" + did_you_mean(key, spare))
    return obj[key]


# --- the formats --------------------------------------------------------------------------


def load_azure(path: str | Path) -> list[Request]:
    """Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    TIMESTAMP is a wall-clock datetime (``2023-11-16 18:15:46.6805900``, up to 9 fractional
    digits, optional ``T`` separator and UTC offset); context = prompt, generated = output.
    """
    path = Path(path)
    builder = _TraceBuilder(str(path))
    times = _DatetimeParser("TIMESTAMP")
    columns = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    with _open_text(path) as f:
        for line_where, (stamp, context, generated) in _csv_columns(f, str(path), columns):
            builder.add(
                line_where, times.seconds(stamp, line_where), stamp.strip(),
                _prompt_tokens(context, "ContextTokens", line_where),
                _output_tokens(generated, "GeneratedTokens", line_where),
            )
    return builder.build()


_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def load_mooncake(path: str | Path) -> list[Request]:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    ``hash_ids`` names the prompt's 512-token blocks (the last may be partial), so it becomes
    ``prefix_ids`` with ``prefix_block_tokens=512``; it may not name more blocks than the
    prompt has. A missing ``hash_ids`` means no prefix information.
    """
    path = Path(path)
    builder = _TraceBuilder(str(path))
    with _open_text(path) as f:
        for line_where, obj in _json_lines(f, str(path)):
            raw_time = _key(obj, "timestamp", line_where, _MOONCAKE_KEYS)
            time_s = _number(raw_time, "timestamp", line_where) / 1000.0
            prompt = _prompt_tokens(
                _key(obj, "input_length", line_where, _MOONCAKE_KEYS), "input_length", line_where
            )
            output = _output_tokens(
                _key(obj, "output_length", line_where, _MOONCAKE_KEYS), "output_length", line_where
            )
            hash_ids = obj.get("hash_ids", [])
            if not isinstance(hash_ids, list) or not all(
                type(h) is int and h >= 0 for h in hash_ids
            ):
                raise KvplanError(f"{line_where}: hash_ids must be a list of non-negative integers")
            num_blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
            if len(hash_ids) > num_blocks:
                raise KvplanError(
                    f"{line_where}: hash_ids names {len(hash_ids)} blocks of "
                    f"{MOONCAKE_BLOCK_TOKENS} tokens but input_length {prompt} fills only {num_blocks}"
                )
            builder.add(line_where, time_s, str(raw_time), prompt, output, tuple(hash_ids))
    return builder.build(prefix_block_tokens=MOONCAKE_BLOCK_TOKENS)


@dataclass(frozen=True, slots=True)
class BurstGptTrace:
    """A loaded BurstGPT trace and the rows left out of it."""

    requests: list[Request]
    num_failed_skipped: int  # rows with 0 response tokens: failed requests
    num_other_models_skipped: int  # rows of other models when filtering by model


def read_burstgpt(path: str | Path, *, model: str | None = None) -> BurstGptTrace:
    """BurstGPT CSV (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``).

    ``Timestamp`` is in seconds. Rows with 0 response tokens are failed requests: skipped and
    counted. ``model`` (case-insensitive) keeps only that model's rows; no row of it -> error.
    """
    path = Path(path)
    where = str(path)
    builder = _TraceBuilder(where)
    columns = ["Timestamp", "Request tokens", "Response tokens"]
    if model is not None:
        columns.append("Model")
    num_failed = num_other = 0
    models_seen: set[str] = set()
    with _open_text(path) as f:
        for line_where, values in _csv_columns(f, where, columns):
            if model is not None:
                models_seen.add(values[3].strip())
                if values[3].strip().lower() != model.lower():
                    num_other += 1
                    continue
            response = _integer(values[2], "Response tokens", line_where)
            if response == 0:
                num_failed += 1
                continue
            builder.add(
                line_where, _number(values[0], "Timestamp", line_where), values[0].strip(),
                _prompt_tokens(values[1], "Request tokens", line_where),
                _output_tokens(response, "Response tokens", line_where),
            )
    if model is not None and not any(m.lower() == model.lower() for m in models_seen):
        hint = did_you_mean(model, models_seen) or f" (models: {', '.join(sorted(models_seen))})"
        raise KvplanError(f"{where}: no rows for model '{model}'{hint}")
    return BurstGptTrace(builder.build(), num_failed, num_other)


def load_burstgpt(path: str | Path, *, model: str | None = None) -> list[Request]:
    """The requests of :func:`read_burstgpt`; the skipped counts are logged at INFO."""
    trace = read_burstgpt(path, model=model)
    log.info(
        "%s: skipped %d failed requests (0 response tokens) and %d rows of other models",
        path, trace.num_failed_skipped, trace.num_other_models_skipped,
    )
    return trace.requests


def _time_scale(time_unit: str) -> float:
    if time_unit not in _SECONDS_PER_UNIT:
        raise unknown_name("time unit", time_unit, _SECONDS_PER_UNIT)
    return _SECONDS_PER_UNIT[time_unit]


def _load_generic_csv(
    path: Path, *, arrival: str = "arrival_s", prompt: str = "prompt_tokens",
    output: str = "output_tokens", time_unit: str = "s",
) -> list[Request]:
    scale = _time_scale(time_unit)
    builder = _TraceBuilder(str(path))
    with _open_text(path) as f:
        for line_where, (stamp, prompt_raw, output_raw) in _csv_columns(
            f, str(path), (arrival, prompt, output)
        ):
            builder.add(
                line_where, _number(stamp, arrival, line_where) * scale, stamp.strip(),
                _prompt_tokens(prompt_raw, prompt, line_where),
                _output_tokens(output_raw, output, line_where),
            )
    return builder.build()


def _load_generic_jsonl(
    path: Path, *, arrival: str = "arrival_s", prompt: str = "prompt_tokens",
    output: str = "output_tokens", time_unit: str = "s",
) -> list[Request]:
    scale = _time_scale(time_unit)
    builder = _TraceBuilder(str(path))
    with _open_text(path) as f:
        for line_where, obj in _json_lines(f, str(path)):
            used = (arrival, prompt, output)
            stamp = _key(obj, arrival, line_where, used)
            builder.add(
                line_where, _number(stamp, arrival, line_where) * scale, str(stamp),
                _prompt_tokens(_key(obj, prompt, line_where, used), prompt, line_where),
                _output_tokens(_key(obj, output, line_where, used), output, line_where),
            )
    return builder.build()


def load_generic(
    path: str | Path, *, arrival: str = "arrival_s", prompt: str = "prompt_tokens",
    output: str = "output_tokens", time_unit: TimeUnit = "s",
) -> list[Request]:
    """A CSV (header row) or JSON-lines trace whose column names are given.

    ``arrival`` is a number in ``time_unit`` ("s", "ms" or "us"); JSON lines are recognised by
    the extension (.jsonl, .ndjson, .json) or a leading ``{``, anything else is read as CSV.
    """
    path = Path(path)
    loader = _load_generic_jsonl if _looks_like_json(path) else _load_generic_csv
    return loader(path, arrival=arrival, prompt=prompt, output=output, time_unit=time_unit)


# --- dispatch -----------------------------------------------------------------------------


def _first_line(path: Path) -> str:
    with _open_text(path) as f:
        for line in f:
            if line.strip():
                return line.strip()
    raise KvplanError(f"{path}: empty file")


def _looks_like_json(path: Path) -> bool:
    """JSON lines by extension, else by a leading ``{`` (reads the file only if needed)."""
    return path.suffix.lower() in {".jsonl", ".ndjson", ".json"} or _first_line(path).startswith("{")


def detect_format(path: str | Path) -> str:
    """The concrete format of a trace file, from its header or first JSON object."""
    path = Path(path)
    first = _first_line(path)
    if _looks_like_json(path):  # after _first_line: a missing or empty file fails there
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            raise KvplanError(f"{path}:1: not valid JSON") from None
        return "mooncake" if {"timestamp", "input_length", "output_length"} <= keys else "jsonl"
    header = {name.strip() for name in next(csv.reader([first]))}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    return "csv"


_GENERIC_OPTIONS = frozenset({"arrival", "prompt", "output", "time_unit"})
_LOADERS: dict[str, tuple[Callable[..., list[Request]], frozenset[str]]] = {
    "azure": (load_azure, frozenset()),
    "mooncake": (load_mooncake, frozenset()),
    "burstgpt": (load_burstgpt, frozenset({"model"})),
    "csv": (_load_generic_csv, _GENERIC_OPTIONS),
    "jsonl": (_load_generic_jsonl, _GENERIC_OPTIONS),
}


def load_trace(path: str | Path, format: str = "auto", **options: Any) -> list[Request]:
    """Load a trace in ``format`` ("auto" detects it; see :func:`detect_format`).

    ``options`` go to the format's loader: ``model`` for burstgpt; ``arrival``, ``prompt``,
    ``output``, ``time_unit`` for csv/jsonl. Unknown format or option -> KvplanError.
    """
    path = Path(path)
    if format not in TRACE_FORMATS:
        raise KvplanError(f"{path}: {unknown_name('trace format', format, TRACE_FORMATS)}")
    concrete = detect_format(path) if format == "auto" else format
    loader, accepted = _LOADERS[concrete]
    for name in options:
        if name not in accepted:
            raise KvplanError(
                f"{path}: trace format '{concrete}' takes no option '{name}'"
                + did_you_mean(name, accepted)
            )
    return loader(path, **options)
