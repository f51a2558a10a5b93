"""The short paths of request building give what the general ones give: ``quick_seconds`` is
``seconds``, and the Azure loader's one-loop reading equals the reading every format shares (``_csv_columns`` and the field checks), row for row and error for
error."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulator.errors import KvplanError
from workloads.loaders import (
    _csv_columns,
    _DatetimeParser,
    _numbered,
    _open_text,
    _output_tokens,
    _prompt_tokens,
    _Row,
    _TimeOrder,
    bundled_trace_path,
    load_azure,
)
from workloads.request import Request, cyclic_gc_paused

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
FIRST = "2023-11-16 18:15:46.6805900,374,44\n"


# --- cyclic_gc_paused ---------------------------------------------------------------------


def test_gc_paused_then_resumed_even_after_an_error() -> None:
    assert gc.isenabled()
    with pytest.raises(KvplanError), cyclic_gc_paused():
        assert not gc.isenabled()
        raise KvplanError("bad row")
    assert gc.isenabled()


def test_gc_left_off_when_it_was_off() -> None:
    gc.disable()
    try:
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


# --- quick_seconds ------------------------------------------------------------------------


def azure_stamps(name: str) -> list[str]:
    with bundled_trace_path(name).open(encoding="utf-8-sig") as f:
        next(f)
        return [line.split(",")[0] for line in f if line.strip()]


@pytest.mark.parametrize("name", ["azure-conv", "azure-code"])
def test_quick_seconds_is_seconds_on_every_bundled_timestamp(name: str) -> None:
    general, fast = _DatetimeParser("T"), _DatetimeParser("T")
    fast.seconds(azure_stamps(name)[0], "x")  # the first row always takes the general path
    num_quick = 0
    for stamp in azure_stamps(name):
        quick = fast.quick_seconds(stamp)
        expected = general.seconds(stamp, "x")
        if quick is None:
            quick = fast.seconds(stamp, "x")  # a new minute
        else:
            num_quick += 1
        assert quick.hex() == expected.hex(), stamp
    assert num_quick > 0.9 * len(azure_stamps(name))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2023-11-16 18:15:46.6805900", 46.68059),
        ("2023-11-16 18:15:07", 7.0),  # no fraction
        ("2023-11-16 18:15:59.123456789", 59.123456789),  # 9 digits: nanoseconds
        ("2023-11-16 18:15:60.5", 60.5),  # a leap second
        ("2023-11-16 18:15:\u0664\u0662.\u0665", 42.5),  # Arabic-Indic digits: \d matches them
    ],
)
def test_quick_seconds_reads_a_known_minute(text: str, seconds: float) -> None:
    parser = _DatetimeParser("T")
    parser.seconds("2023-11-16 18:15:00", "x")  # the first day; the minute is remembered
    quick = parser.quick_seconds(text)
    # seconds since the first day's midnight
    assert quick is not None and quick == pytest.approx(18 * 3600 + 15 * 60 + seconds, abs=1e-9)
    assert quick.hex() == parser.seconds(text, "x").hex()


@pytest.mark.parametrize(
    "text",
    [
        "2023-11-16 18:16:46.5",  # a minute not seen yet
        " 2023-11-16 18:15:46.5",  # spaces: seconds() strips them
        "2023-11-16 18:15:46.5 ",
        "2023-11-16 18:15:46.5Z",  # time zones: seconds() converts them
        "2023-11-16 18:15:46.5+01:00",
        "2023-11-16 18:15:46.",  # no digit after the dot: not a datetime
        "2023-11-16 18:15:46.1234567890",  # 10 digits: not a datetime
        "2023-11-16 18:15:61.0",  # not a second
        "2023-11-16 18:15:4",
        "2023-11-16 18:15:4x.5",
    ],
)
def test_quick_seconds_leaves_the_rest_to_seconds(text: str) -> None:
    parser = _DatetimeParser("T")
    parser.seconds("2023-11-16 18:15:00", "x")
    assert parser.quick_seconds(text) is None


# --- the Azure loader against the general reading -----------------------------------------


def reference_azure_rows(path: Path) -> Iterator[_Row]:
    """An Azure trace read the way every other CSV format is: a ``file:line`` and the wanted
    columns per row from :func:`_csv_columns`, then each field's check, then the time order."""
    times, order = _DatetimeParser("TIMESTAMP"), _TimeOrder()
    columns = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    with _open_text(path) as f:
        for line_where, (stamp, context, generated) in _csv_columns(f, str(path), columns):
            time_s = times.seconds(stamp, line_where)
            prompt = _prompt_tokens(context, "ContextTokens", line_where)
            output = _output_tokens(generated, "GeneratedTokens", line_where)
            order.check(line_where, time_s, stamp)
            yield time_s, prompt, output, ()


def reference_azure(path: Path) -> list[Request]:
    return list(_numbered(reference_azure_rows(path), str(path)))


def exact(requests: list[Request]) -> list[tuple[object, ...]]:
    """Every field, the arrival as its exact bits."""
    return [(r.request_id, r.arrival_s.hex(), r.prompt_tokens, r.output_tokens, r.n,
             r.beam_width, r.prefix_ids, r.prefix_block_tokens, r.kv_ready_tokens)
            for r in requests]


@pytest.mark.parametrize("name", ["azure-conv", "azure-code"])
def test_azure_loader_equals_the_general_reading_on_bundled_traces(name: str) -> None:
    path = bundled_trace_path(name)
    fast = load_azure(path)
    assert all(type(r) is Request for r in fast)
    assert exact(fast) == exact(reference_azure(path))


def outcome(read: object, path: Path) -> object:
    try:
        return exact(read(path))  # type: ignore[operator]
    except KvplanError as err:
        return str(err)


@pytest.mark.parametrize(
    "rows",
    [
        "",  # no row
        "\n\n",
        "2023-11-16 18:15:47.0,12.0,3.0\n",  # integral floats are integers
        "2023-11-16 18:15:47.0, 12 ,+3\n2023-11-16 18:15:47.0,1_000,\u0663\n",  # what int() reads
        "2023-11-16 18:15:47.0,12.5,3\n",
        "2023-11-16 18:15:47.0,5,abc\n",
        "2023-11-16 18:15:47.0,0,0\n",  # both bad: the prompt is named
        "2023-11-16 18:15:47.0,inf,3\n",
        "2023-11-16 18:15:47.0,10000001,3\n",
        "2023-11-16 18:15:47.0,5,10000001\n",
        "2023-11-16 18:15:47.0,5\n",
        "2023-11-16 18:15:47.0,5,6,7\n",
        "\n\n2023-11-16 18:15:46.0,x,1\n",  # line numbers count blank lines
        "2023-11-16 18:15:45.5,5,3\n",  # backwards within the minute
        "2023-11-16 18:14:59.9,5,3\n",  # backwards to another minute
        "2023-11-16 18:15:45.5,x,3\n",  # backwards and a bad length: the length is named
        "bad,x,3\n",  # a bad datetime and a bad length: the datetime is named
        "2023-11-16 18:15:46.6805900Z,5,3\n2023-11-16 18:15:47 ,5,3\n 2023-11-16 18:15:48,1,1\n",
        "2023-11-16 18:15:60.5,5,3\n2023-11-16 18:15:61.0,5,3\n",
        "2023-11-16 23:59:59.9999999,5,3\n2023-11-17 00:00:00.0000001,5,3\n",
        "2023-11-16 18:15:47.1234567890,5,3\n",
        '"2023-11-16 18:15:47",5,3\n"2023-11-16 18:15:48,5,3\n',  # an unclosed quote
    ],
)
def test_azure_loader_equals_the_general_reading_on_odd_rows(tmp_path: Path, rows: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + FIRST + rows)
    assert outcome(load_azure, path) == outcome(reference_azure, path)


@pytest.mark.parametrize(
    "text",
    ["", "TIMESTAMP,ContextToken,GeneratedTokens\n" + FIRST, AZURE_HEADER,
     "\ufeff" + AZURE_HEADER.replace("\n", "\r\n") + FIRST.replace("\n", "\r\n")],
)
def test_azure_loader_equals_the_general_reading_on_odd_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    assert outcome(load_azure, path) == outcome(reference_azure, path)


def test_backwards_timestamp_message_names_both_texts(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + FIRST + "2023-11-16 18:15:47.0,5,3\n"
                    + "2023-11-16 18:15:46.9 ,5,3\n")
    with pytest.raises(KvplanError) as info:
        load_azure(path)
    assert str(info.value) == (f"{path}:4: timestamp goes backwards (2023-11-16 18:15:46.9 < "
                               "2023-11-16 18:15:47.0); sort the trace first")
