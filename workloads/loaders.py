"""Loaders for real request traces: Azure LLM inference, Mooncake, BurstGPT, generic CSV/JSONL.

Every loader returns ``list[Request]`` in file order, with ``request_id`` = row order
(0..N-1) and ``arrival_s`` relative to the first request (the first is 0.0).
:func:`iter_trace` yields the same requests one at a time, reading the file only as far as
it is iterated, so that a slice of a multi-gigabyte trace costs what its own rows cost.

Every row is validated and a bad one raises :class:`KvplanError` naming the file and line
(``trace.csv:17: ContextTokens 'abc' is not an integer``): prompts need at least one token,
outputs too (every request generates at least one token), and no length may exceed
:data:`MAX_TOKENS`. Timestamps must not go backwards: an unsorted trace is an error, never
silently sorted, because a sort would hide a broken export (a merged or shuffled file). No
request may arrive more than :data:`MAX_ARRIVAL_S` after the first: such a timestamp is a
corrupt row too, and a span of 1e300 s would overflow the statistics of the run. A JSON-lines
row nested deeper than :data:`simulator.yamlfile.MAX_NESTING` levels is refused before it is
parsed (Python's parser would end in a RecursionError).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any, Literal, TextIO, get_args

from simulator.errors import KvplanError, did_you_mean, unknown_name
from simulator.yamlfile import MAX_NESTING, check_json_nesting
from workloads.request import Request, cyclic_gc_paused

log = logging.getLogger(__name__)

MAX_TOKENS = 10_000_000  # longer than any context window: such a length is a corrupt row
# Seconds from the first arrival to the last that a workload may span: 10^8 s, about 3.2 years.
# BurstGPT, the longest public trace kvplan reads, spans 121 days (timestamps up to 1.05e7 s).
MAX_ARRIVAL_S = 1e8
MAX_ARRIVAL_TEXT = "10^8 s (about 3 years)"
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


_MINUTE_CHARS = len("2023-11-16 18:15:")  # the part of a datetime _DatetimeParser remembers
MINUTES_LIMIT = 1 << 12  # minutes one _DatetimeParser remembers before it starts afresh
_POWERS_OF_TEN = tuple(10**digits for digits in range(10))  # 10 ** len(fraction digits)


class _DatetimeParser:
    """Wall-clock datetimes -> seconds since the first one parsed.

    Azure writes 7 fractional digits (100 ns), which ``datetime`` cannot hold, so the fields
    are parsed by hand. Seconds count from the first row's day, not the epoch, to keep the
    float's resolution far below a microsecond.

    :meth:`seconds` parses any datetime :data:`_DATETIME` accepts and remembers its minute
    (``2023-11-16 18:15:``, as seconds since the first day); :meth:`quick_seconds` reads a
    datetime of a remembered minute, without time zone or surrounding spaces, at a third of
    the cost (a trace has hundreds of rows per minute), and gives None for any other text.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._first_day: int | None = None
        self._day_cache: dict[str, int] = {}
        self._minute_s: dict[str, int] = {}

    def quick_seconds(self, text: str) -> float | None:
        """:meth:`seconds` of ``text`` if its minute is remembered and the rest is two digits
        of seconds, then nothing or ``.`` and 1 to 9 digits; otherwise None (the text may
        still be a datetime, with a time zone, spaces, or in a new minute).

        Such a text is one :data:`_DATETIME` matches without a time zone (``\\d`` matches
        exactly what ``str.isdecimal`` accepts: Unicode category Nd), and the sum is the one
        :meth:`seconds` computes, in the same order, so the result is the same float."""
        minute_s = self._minute_s.get(text[:_MINUTE_CHARS])
        if minute_s is None:
            return None
        secs_text = text[_MINUTE_CHARS:_MINUTE_CHARS + 2]
        if not (secs_text.isdecimal() and len(secs_text) == 2):
            return None
        secs = int(secs_text)  # up to 60: a leap second
        frac = text[_MINUTE_CHARS + 3:]  # after the dot
        if 0 < len(frac) <= 9 and text[_MINUTE_CHARS + 2] == "." and frac.isdecimal() and secs <= 60:
            return minute_s + secs + int(frac) / _POWERS_OF_TEN[len(frac)]
        if len(text) == _MINUTE_CHARS + 2 and secs <= 60:
            return minute_s + secs + 0.0
        return None

    def seconds(self, text: str, where: str) -> float:
        """Seconds of ``text`` since the first day parsed; not a datetime -> KvplanError."""
        stripped = text.strip()
        match = _DATETIME.fullmatch(stripped)
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
        minute_s = (day - self._first_day) * 86400 + int(hours) * 3600 + int(minutes) * 60
        if len(self._minute_s) >= MINUTES_LIMIT:
            self._minute_s.clear()
        self._minute_s[stripped[:_MINUTE_CHARS]] = minute_s
        total = minute_s + int(secs)
        if sign:  # convert to UTC so rows with different offsets compare correctly
            offset = int(tz_hours) * 3600 + int(tz_minutes) * 60
            total -= offset if sign == "+" else -offset
        return total + (int(frac) / 10 ** len(frac) if frac else 0.0)


# --- assembling requests ------------------------------------------------------------------

# A validated row: (seconds on the trace's own clock, prompt tokens, output tokens, prefix ids).
_Row = tuple[float, int, int, tuple[int, ...]]

SHARED_VALUES_LIMIT = 1 << 16  # distinct values one _Shared remembers before it starts afresh


class _Shared:
    """One ``int`` object per distinct value read, so that a million requests with a few
    thousand distinct lengths hold a few thousand ``int`` objects rather than two million (28
    bytes each on 64-bit CPython, ``sys.getsizeof(1000)``), and Mooncake rows naming the same
    hash ids share them (the bundled trace names 43,924 distinct ids 121,877 times).

    Only equal values are merged, so every request reads exactly as before. The memory stays
    bounded whatever the trace: after :data:`SHARED_VALUES_LIMIT` distinct values it forgets
    them and starts afresh (a pass over a whole trace that keeps no rows must not grow).
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    def value(self, value: int) -> int:
        seen = self._seen
        if len(seen) >= SHARED_VALUES_LIMIT:
            seen.clear()
        return seen.setdefault(value, value)

    def ids(self, values: list[int]) -> tuple[int, ...]:
        """``tuple(values)`` of shared ints."""
        return tuple(map(self.value, values))


class _TimeOrder:
    """Timestamps must not go backwards, nor more than :data:`MAX_ARRIVAL_S` past the first
    (see the module docstring): each row is checked against the one before it and the first.
    The raw texts are kept only to name them in the error."""

    __slots__ = ("_last_s", "_last_raw", "_limit_s")

    def __init__(self) -> None:
        self._last_s = -math.inf
        self._last_raw: object = ""
        self._limit_s = math.inf  # the first timestamp + MAX_ARRIVAL_S, once it is read

    def check(self, line_where: str, time_s: float, time_raw: object) -> None:
        if time_s < self._last_s:
            raise _backwards(line_where, time_raw, self._last_raw)
        if time_s > self._limit_s:
            raise _too_late(line_where, time_raw, time_s - (self._limit_s - MAX_ARRIVAL_S))
        if self._limit_s == math.inf:
            self._limit_s = time_s + MAX_ARRIVAL_S
        self._last_s, self._last_raw = time_s, time_raw


def _backwards(line_where: str, time_raw: object, last_raw: object) -> KvplanError:
    return KvplanError(f"{line_where}: timestamp goes backwards ({_raw_text(time_raw)} < "
                       f"{_raw_text(last_raw)}); sort the trace first")


def _too_late(line_where: str, time_raw: object, span_s: float) -> KvplanError:
    return KvplanError(f"{line_where}: timestamp {_raw_text(time_raw)} is {span_s:.3g} s after the"
                       f" first request's, past the limit of {MAX_ARRIVAL_TEXT}")


def _raw_text(value: object) -> str:
    """A timestamp as the file wrote it: CSV text stripped, a JSON value as ``str`` shows it."""
    return value.strip() if isinstance(value, str) else str(value)


def _numbered(rows: Iterator[_Row], where: str, prefix_block_tokens: int = 0) -> Iterator[Request]:
    """Requests 0, 1, ... from validated rows, arrivals relative to the first row; a trace
    without a row is an error, raised once the rows are exhausted."""
    first_s: float | None = None
    request_id = 0
    with closing(rows):  # a caller that stops early closes the file now, not at collection
        for time_s, prompt, output, prefix in rows:
            if first_s is None:
                first_s = time_s
            yield Request(request_id, time_s - first_s, prompt, output, 1, 1, prefix,
                          prefix_block_tokens if prefix else 0)
            request_id += 1
    if first_s is None:
        raise KvplanError(f"{where}: no requests in the trace")


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


def _csv_header(reader: Iterator[list[str]], where: str, columns: Sequence[str]) -> tuple[int, list[int]]:
    """Read a CSV header: its number of fields, and the index of each wanted column.

    Surrounding spaces in the names are ignored; no header or a missing column is an error.
    """
    header = next(reader, None)
    if header is None:
        raise KvplanError(f"{where}: empty file")
    names = [name.strip() for name in header]
    for column in columns:
        if column not in names:
            # Suggest only columns the format does not use: those are likely typos.
            spare = [name for name in names if name not in columns]
            raise KvplanError(f"{where}: missing column '{column}'" + did_you_mean(column, spare))
    return len(names), [names.index(column) for column in columns]


def _csv_columns(f: TextIO, where: str, columns: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """Yield ``("file:line", [value of each wanted column])`` for each non-blank CSV row
    (the header as :func:`_csv_header` reads it)."""
    reader = csv.reader(f)
    try:
        num_fields, indices = _csv_header(reader, where, columns)
        for row in reader:
            if not row:
                continue
            line_where = f"{where}:{reader.line_num}"
            if len(row) != num_fields:
                raise KvplanError(f"{line_where}: expected {num_fields} fields, got {len(row)}")
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
        if line.count("[") + line.count("{") > MAX_NESTING:  # (counted inline: a row's common path)
            check_json_nesting(line, where, line_no)
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


# --- the formats: each yields validated rows, reading the file only as far as it is asked ---


def _azure_rows(path: Path) -> Iterator[_Row]:
    """The rows of an Azure trace: :func:`_csv_columns` and the field checks, done in one loop.

    A trace is hundreds of thousands of rows of the same shape, so the common row takes a
    short path: integers that ``int`` reads and that lie in range, a datetime in a minute
    already seen (:meth:`_DatetimeParser.quick_seconds`), and no ``file:line`` text built.
    Any other row goes through the same checks as every format (:func:`_prompt_tokens`,
    :meth:`_DatetimeParser.seconds`, ...), in the same order, so it gives the same values
    or raises the same error.
    """
    where = str(path)
    times = _DatetimeParser("TIMESTAMP")
    quick_seconds = times.quick_seconds
    shared = _Shared().value
    last_s, last_stamp, limit_s = -math.inf, "", math.inf
    with _open_text(path) as f:
        reader = csv.reader(f)
        try:
            num_fields, (at_stamp, at_context, at_generated) = _csv_header(
                reader, where, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
            for row in reader:
                if len(row) != num_fields:
                    if not row:
                        continue
                    raise KvplanError(f"{where}:{reader.line_num}: expected {num_fields} fields, "
                                      f"got {len(row)}")
                stamp, context, generated = row[at_stamp], row[at_context], row[at_generated]
                time_s = quick_seconds(stamp)
                if time_s is None:
                    time_s = times.seconds(stamp, f"{where}:{reader.line_num}")
                try:
                    prompt, output = int(context), int(generated)
                except ValueError:
                    prompt = output = 0  # checked again below, where "12.0" is read too
                if not (0 < prompt <= MAX_TOKENS and 0 < output <= MAX_TOKENS):
                    line_where = f"{where}:{reader.line_num}"
                    prompt = _prompt_tokens(context, "ContextTokens", line_where)
                    output = _output_tokens(generated, "GeneratedTokens", line_where)
                if time_s < last_s:
                    raise _backwards(f"{where}:{reader.line_num}", stamp, last_stamp)
                if time_s > limit_s:
                    raise _too_late(f"{where}:{reader.line_num}", stamp,
                                    time_s - (limit_s - MAX_ARRIVAL_S))
                if limit_s == math.inf:
                    limit_s = time_s + MAX_ARRIVAL_S
                last_s, last_stamp = time_s, stamp
                yield time_s, shared(prompt), shared(output), ()
        except csv.Error as err:
            raise KvplanError(f"{where}:{reader.line_num}: {err}") from None


def _iter_azure(path: Path) -> Iterator[Request]:
    return _numbered(_azure_rows(path), str(path))


def load_azure(path: str | Path) -> list[Request]:
    """Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    TIMESTAMP is a wall-clock datetime (``2023-11-16 18:15:46.6805900``, up to 9 fractional
    digits, optional ``T`` separator and UTC offset); context = prompt, generated = output.
    """
    return list(_iter_azure(Path(path)))


_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _mooncake_rows(path: Path) -> Iterator[_Row]:
    order, shared = _TimeOrder(), _Shared()
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
            order.check(line_where, time_s, raw_time)
            yield time_s, shared.value(prompt), shared.value(output), shared.ids(hash_ids)


def _iter_mooncake(path: Path) -> Iterator[Request]:
    return _numbered(_mooncake_rows(path), str(path), MOONCAKE_BLOCK_TOKENS)


def load_mooncake(path: str | Path) -> list[Request]:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    ``hash_ids`` names the prompt's 512-token blocks (the last may be partial), so it becomes
    ``prefix_ids`` with ``prefix_block_tokens=512``; it may not name more blocks than the
    prompt has. A missing ``hash_ids`` means no prefix information.
    """
    return list(_iter_mooncake(Path(path)))


@dataclass(frozen=True, slots=True)
class BurstGptTrace:
    """A loaded BurstGPT trace and the rows left out of it."""

    requests: list[Request]
    num_failed_skipped: int  # rows with 0 response tokens: failed requests
    num_other_models_skipped: int  # rows of other models when filtering by model


@dataclass(slots=True)
class _Skipped:
    """BurstGPT rows left out so far."""

    failed: int = 0
    other_models: int = 0


def _burstgpt_rows(path: Path, model: str | None, skipped: _Skipped) -> Iterator[_Row]:
    where = str(path)
    columns = ["Timestamp", "Request tokens", "Response tokens"]
    if model is not None:
        columns.append("Model")
    order, shared = _TimeOrder(), _Shared()
    models_seen: set[str] = set()
    with _open_text(path) as f:
        for line_where, values in _csv_columns(f, where, columns):
            if model is not None:
                models_seen.add(values[3].strip())
                if values[3].strip().lower() != model.lower():
                    skipped.other_models += 1
                    continue
            response = _integer(values[2], "Response tokens", line_where)
            if response == 0:
                skipped.failed += 1
                continue
            time_s = _number(values[0], "Timestamp", line_where)
            prompt = _prompt_tokens(values[1], "Request tokens", line_where)
            output = _output_tokens(response, "Response tokens", line_where)
            order.check(line_where, time_s, values[0])
            yield time_s, shared.value(prompt), shared.value(output), ()
    if model is not None and not any(m.lower() == model.lower() for m in models_seen):
        hint = did_you_mean(model, models_seen) or f" (models: {', '.join(sorted(models_seen))})"
        raise KvplanError(f"{where}: no rows for model '{model}'{hint}")


def read_burstgpt(path: str | Path, *, model: str | None = None) -> BurstGptTrace:
    """BurstGPT CSV (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``).

    ``Timestamp`` is in seconds. Rows with 0 response tokens are failed requests: skipped and
    counted. ``model`` (case-insensitive) keeps only that model's rows; no row of it -> error.
    """
    path = Path(path)
    skipped = _Skipped()
    requests = list(_numbered(_burstgpt_rows(path, model, skipped), str(path)))
    return BurstGptTrace(requests, skipped.failed, skipped.other_models)


def _iter_burstgpt(path: Path, *, model: str | None = None) -> Iterator[Request]:
    """The requests of :func:`read_burstgpt`, streamed; the skipped counts are logged at INFO
    when the reading ends (for the rows read, when the caller stopped before the end)."""
    skipped = _Skipped()
    try:
        yield from _numbered(_burstgpt_rows(path, model, skipped), str(path))
    except GeneratorExit:
        _log_skipped(path, skipped, " before the end of the file")
        raise
    _log_skipped(path, skipped, "")


def _log_skipped(path: Path, skipped: _Skipped, where: str) -> None:
    log.info("%s: skipped %d failed requests (0 response tokens) and %d rows of other models%s",
             path, skipped.failed, skipped.other_models, where)


def load_burstgpt(path: str | Path, *, model: str | None = None) -> list[Request]:
    """The requests of :func:`read_burstgpt`; the skipped counts are logged at INFO."""
    return list(_iter_burstgpt(Path(path), model=model))


def _time_scale(time_unit: str) -> float:
    if time_unit not in _SECONDS_PER_UNIT:
        raise unknown_name("time unit", time_unit, _SECONDS_PER_UNIT)
    return _SECONDS_PER_UNIT[time_unit]


def _generic_csv_rows(
    path: Path, arrival: str, prompt: str, output: str, scale: float
) -> Iterator[_Row]:
    order, shared = _TimeOrder(), _Shared()
    with _open_text(path) as f:
        for line_where, (stamp, prompt_raw, output_raw) in _csv_columns(
            f, str(path), (arrival, prompt, output)
        ):
            time_s = _number(stamp, arrival, line_where) * scale
            prompt_tokens = _prompt_tokens(prompt_raw, prompt, line_where)
            output_tokens = _output_tokens(output_raw, output, line_where)
            order.check(line_where, time_s, stamp)
            yield time_s, shared.value(prompt_tokens), shared.value(output_tokens), ()


def _generic_jsonl_rows(
    path: Path, arrival: str, prompt: str, output: str, scale: float
) -> Iterator[_Row]:
    order, shared = _TimeOrder(), _Shared()
    used = (arrival, prompt, output)
    with _open_text(path) as f:
        for line_where, obj in _json_lines(f, str(path)):
            stamp = _key(obj, arrival, line_where, used)
            time_s = _number(stamp, arrival, line_where) * scale
            prompt_tokens = _prompt_tokens(_key(obj, prompt, line_where, used), prompt, line_where)
            output_tokens = _output_tokens(_key(obj, output, line_where, used), output, line_where)
            order.check(line_where, time_s, stamp)
            yield time_s, shared.value(prompt_tokens), shared.value(output_tokens), ()


def _iter_generic(
    path: Path, *, json_lines: bool, arrival: str = "arrival_s", prompt: str = "prompt_tokens",
    output: str = "output_tokens", time_unit: str = "s",
) -> Iterator[Request]:
    scale = _time_scale(time_unit)  # checked now, before any row is asked for
    rows = _generic_jsonl_rows if json_lines else _generic_csv_rows
    return _numbered(rows(path, arrival, prompt, output, scale), str(path))


def load_generic(
    path: str | Path, *, arrival: str = "arrival_s", prompt: str = "prompt_tokens",
    output: str = "output_tokens", time_unit: TimeUnit = "s",
) -> list[Request]:
    """A CSV (header row) or JSON-lines trace whose column names are given.

    ``arrival`` is a number in ``time_unit`` ("s", "ms" or "us"); JSON lines are recognised by
    the extension (.jsonl, .ndjson, .json) or a leading ``{``, anything else is read as CSV.
    """
    path = Path(path)
    return list(_iter_generic(path, json_lines=_looks_like_json(path), arrival=arrival,
                              prompt=prompt, output=output, time_unit=time_unit))


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
        check_json_nesting(first, str(path))
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
_READERS: dict[str, tuple[Callable[..., Iterator[Request]], frozenset[str]]] = {
    "azure": (_iter_azure, frozenset()),
    "mooncake": (_iter_mooncake, frozenset()),
    "burstgpt": (_iter_burstgpt, frozenset({"model"})),
    "csv": (partial(_iter_generic, json_lines=False), _GENERIC_OPTIONS),
    "jsonl": (partial(_iter_generic, json_lines=True), _GENERIC_OPTIONS),
}


def iter_trace(path: str | Path, format: str = "auto", **options: Any) -> Iterator[Request]:
    """The requests of a trace in ``format`` ("auto" detects it; see :func:`detect_format`),
    read and validated one row at a time as they are asked for.

    The file is read only as far as the caller iterates: a caller that stops after the
    requests it needs (:func:`workloads.synthetic.slice_requests`) never parses the rest, so
    a bad row beyond that point is not reported, and neither are a backwards timestamp there
    nor, for BurstGPT, a ``model`` with no rows (the rows read had some). Closing the
    iterator closes the file. The format and the options are checked now; the rows, as they
    are read (``trace.csv:17: ...``); a trace without a row fails when it is exhausted.

    ``options`` go to the format's reader: ``model`` for burstgpt; ``arrival``, ``prompt``,
    ``output``, ``time_unit`` for csv/jsonl. Unknown format or option -> KvplanError.
    """
    path = Path(path)
    if format not in TRACE_FORMATS:
        raise KvplanError(f"{path}: {unknown_name('trace format', format, TRACE_FORMATS)}")
    concrete = detect_format(path) if format == "auto" else format
    reader, accepted = _READERS[concrete]
    for name in options:
        if name not in accepted:
            raise KvplanError(
                f"{path}: trace format '{concrete}' takes no option '{name}'"
                + did_you_mean(name, accepted)
            )
    return reader(path, **options)


def load_trace(path: str | Path, format: str = "auto", **options: Any) -> list[Request]:
    """Every request of a trace in ``format`` (see :func:`iter_trace`, which this reads to the
    end, so every row is validated), built with the cyclic garbage collector paused
    (:func:`workloads.request.cyclic_gc_paused`)."""
    with cyclic_gc_paused():
        return list(iter_trace(path, format, **options))
