"""Streaming trace reading and compact request building.

A slice of a trace is read only as far as it reaches: rows past it are never parsed, so their
errors are not reported. That is intended (a multi-gigabyte trace must not be parsed in full
for its first thousand requests); ``load_trace`` still validates every row, and so does a
workload with ``rate``, which needs the whole trace's mean rate. Inside the slice every row is
validated as before, with the same one-line ``file:line`` errors.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import KvplanError
from workloads.loaders import iter_trace, load_trace
from workloads.request import Request
from workloads.spec import build_requests, parse_workload, shape_trace
from workloads.synthetic import (
    REQUESTS_PER_CHUNK,
    SharedPrefix,
    make_requests,
    mean_rate_per_s,
    rescale_to_rate,
    scale_rate,
    slice_requests,
)

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure_rows(num: int, start_s: int = 0) -> str:
    """``num`` valid Azure rows one second apart, prompt = 100 + row, output = 1 + row."""
    return "".join(f"2023-11-16 10:{(start_s + i) // 60:02d}:{(start_s + i) % 60:02d}.5,{100 + i},{1 + i}\n"
                   for i in range(num))


def build(tmp_path: Path, trace: Path, **workload: Any) -> list[Request]:
    spec = parse_workload({"trace": str(trace), **workload}, "s.yaml")
    return build_requests(spec, seed=0, base_dir=tmp_path)


# --- reading stops once the slice is complete ---------------------------------------------

BAD_TAILS = {
    "not an integer": "2023-11-16 10:00:10.5,abc,3\n",
    "backwards": "2023-11-16 09:00:00.0,5,3\n",
    "too few fields": "2023-11-16 10:00:10.5,5\n",
    "not a datetime": "yesterday,5,3\n",
}


@pytest.mark.parametrize("tail", sorted(BAD_TAILS))
def test_rows_past_the_slice_are_not_read(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + azure_rows(6) + BAD_TAILS[tail] + azure_rows(3, start_s=20))
    first = build(tmp_path, path, num_requests=4)
    assert [(r.request_id, r.arrival_s, r.prompt_tokens) for r in first] == [
        (0, 0.0, 100), (1, 1.0, 101), (2, 2.0, 102), (3, 3.0, 103)]
    window = build(tmp_path, path, start_s=2, duration_s=3)  # ends at the first row past it
    assert [r.prompt_tokens for r in window] == [102, 103, 104]
    assert [r.arrival_s for r in build(tmp_path, path, rate_scale=2.0, num_requests=6)] == [
        0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    with pytest.raises(KvplanError, match=r"t\.csv:8: "):  # reading it all still checks all
        load_trace(path)
    with pytest.raises(KvplanError, match=r"^workload: .*t\.csv:8: "):  # rate: the whole trace's
        build(tmp_path, path, rate=2.0, num_requests=4)


def test_bytes_past_the_slice_are_not_even_decoded(tmp_path: Path) -> None:
    """Far past the slice (beyond any read-ahead buffer) the file is not even UTF-8."""
    path = tmp_path / "t.csv"
    rows = AZURE_HEADER + "".join(f"2023-11-16 10:00:00.{i:07d},{i + 1},1\n" for i in range(20_000))
    path.write_bytes(rows.encode() + b"\xff\xfe garbage\n" * 10)
    assert len(build(tmp_path, path, num_requests=10)) == 10
    assert len(list(itertools.islice(iter_trace(path), 100))) == 100
    with pytest.raises(KvplanError, match=r"t\.csv: not UTF-8 text \(bad byte at offset \d+\)$"):
        load_trace(path)


def test_jsonl_and_mooncake_stream_too(tmp_path: Path) -> None:
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
        '{"timestamp": 500, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 900, "input_length": 10,\n')
    assert [(r.arrival_s, r.prefix_ids) for r in build(tmp_path, mooncake, num_requests=2)] == [
        (0.0, (1, 2)), (0.5, (1,))]
    with pytest.raises(KvplanError, match=r"m\.jsonl:3: not valid JSON"):
        build(tmp_path, mooncake, num_requests=3)
    generic = tmp_path / "g.jsonl"
    generic.write_text('{"t": 1, "p": 5, "o": 6}\n{"t": 3, "p": 7, "o": 8}\n[1]\n')
    requests = build(tmp_path, generic, columns={"arrival": "t", "prompt": "p", "output": "o"},
                     num_requests=2)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0.0, 5, 6), (2.0, 7, 8)]


def test_burstgpt_streams_and_logs_what_it_skipped(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "8,ChatGPT,100,0,100,Conversation log\n"
                    "9,GPT-4,1200,300,1500,API log\n"
                    "12,ChatGPT,40,7,47,API log\n"
                    "oops\n")
    with caplog.at_level(logging.INFO, logger="workloads.loaders"):
        requests = build(tmp_path, path, model="chatgpt", num_requests=2)
    assert [(r.arrival_s, r.prompt_tokens) for r in requests] == [(0.0, 472), (7.0, 40)]
    assert ("skipped 1 failed requests (0 response tokens) and 1 rows of other models before "
            "the end of the file") in caplog.text


# --- inside the slice, every row is still checked -----------------------------------------


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 10:00:03.5,x,1", "t.csv:5: ContextTokens 'x' is not an integer"),
        ("2023-11-16 10:00:03.5,5,0", "t.csv:5: GeneratedTokens must be at least 1 (got 0): "
                                      "every request generates a token"),
        ("2023-11-16 09:00:03.5,5,1", "t.csv:5: timestamp goes backwards (2023-11-16 09:00:03.5 "
                                      "< 2023-11-16 10:00:02.5); sort the trace first"),
        ("2023-11-16 10:00:03.5,5", "t.csv:5: expected 3 fields, got 2"),
    ],
)
def test_bad_rows_inside_the_slice_give_a_one_line_error(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + azure_rows(3) + row + "\n" + azure_rows(3, start_s=10))
    for workload in ({"num_requests": 4}, {"start_s": 1, "duration_s": 10}, {"rate_scale": 3}):
        with pytest.raises(KvplanError) as info:
            build(tmp_path, path, **workload)
        assert str(info.value) == f"workload: {path.parent}/{message}"
        assert "\n" not in str(info.value)


def test_an_empty_slice_still_says_how_long_the_workload_is(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + azure_rows(5) + azure_rows(5, start_s=30))
    with pytest.raises(KvplanError) as info:
        build(tmp_path, path, start_s=10, duration_s=5)
    assert str(info.value) == ("workload: no requests in the slice start_s=10, duration_s=5.0, "
                               "num_requests=None (the workload spans 0-34 s)")


def test_iter_trace_checks_format_and_options_at_once(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + azure_rows(2))
    with pytest.raises(KvplanError, match="takes no option 'model'"):
        iter_trace(path, model="x")
    with pytest.raises(KvplanError, match=r"^unknown time unit 'h'"):
        iter_trace(path, "csv", time_unit="h")
    empty = tmp_path / "e.csv"
    empty.write_text(AZURE_HEADER)
    rows = iter_trace(empty)  # no row read yet
    with pytest.raises(KvplanError, match=r"e\.csv: no requests in the trace$"):
        next(rows)


# --- streamed == the whole trace loaded, then reshaped ------------------------------------


def reference_shape(requests: list[Request], workload: dict[str, Any]) -> list[Request]:
    """What a workload spec did to a whole loaded trace before streaming: rescale it all, keep
    the window, then the first num_requests, renumber, untime, set n and beam_width."""
    untimed = workload.get("concurrency") is not None or workload.get("rate") == math.inf
    if not untimed and "rate" in workload:
        requests = rescale_to_rate(requests, workload["rate"])
    elif not untimed and "rate_scale" in workload:
        requests = scale_rate(requests, workload["rate_scale"])
    start = workload.get("start_s", 0.0)
    end = start + workload.get("duration_s", math.inf)
    kept = [r for r in requests if start <= r.arrival_s < end][:workload.get("num_requests")]
    first = kept[0].arrival_s if kept else 0.0
    return [Request(i, 0.0 if untimed else (r.arrival_s - first) * 1.0, r.prompt_tokens,
                    r.output_tokens, workload.get("n", 1), workload.get("beam_width", 1),
                    r.prefix_ids, r.prefix_block_tokens) for i, r in enumerate(kept)]


@st.composite
def traces_and_workloads(draw: st.DrawFn) -> tuple[list[float], dict[str, Any]]:
    gaps = draw(st.lists(st.floats(0, 5, allow_nan=False), min_size=2, max_size=40))
    times = list(itertools.accumulate(gaps))
    workload: dict[str, Any] = {}
    timing = draw(st.sampled_from(["own", "rate", "rate_scale", "concurrency", "burst"]))
    if timing == "rate":
        workload["rate"] = draw(st.floats(0.01, 100))
    elif timing == "rate_scale":
        workload["rate_scale"] = draw(st.floats(0.01, 100))
    elif timing == "burst":
        workload["rate"] = math.inf
    if draw(st.booleans()):
        workload["start_s"] = draw(st.floats(0, 60))
    if draw(st.booleans()):
        workload["duration_s"] = draw(st.floats(0.01, 200))
    if draw(st.booleans()) or timing == "concurrency":
        workload["num_requests"] = draw(st.integers(1, 50))
    if timing == "concurrency":
        workload["concurrency"] = draw(st.integers(1, 4))
    workload["n"] = draw(st.integers(1, 3))
    return times, workload


@pytest.mark.filterwarnings("ignore::simulator.errors.KvplanWarning")  # fewer than num_requests
@settings(max_examples=150, deadline=None)
@given(traces_and_workloads())
def test_streamed_workload_equals_the_whole_trace_reshaped(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[list[float], dict[str, Any]]
) -> None:
    times, workload = case
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{t!r},{10 + i},{1 + i % 7}\n" for i, t in enumerate(times)))
    whole = load_trace(path)
    spec = parse_workload({"trace": str(path), **workload}, "s.yaml")
    try:
        expected = reference_shape(whole, workload)
    except KvplanError:  # every arrival at one instant: no mean rate to rescale
        expected = []
    if not expected:
        with pytest.raises(KvplanError):
            build_requests(spec, seed=0, base_dir=path.parent)
        return
    assert build_requests(spec, seed=0, base_dir=path.parent) == expected
    assert shape_trace(whole, spec) == expected


# --- slices, rates and requests from iterators --------------------------------------------


def counted(requests: list[Request], fail_after: int) -> Iterator[Request]:
    """``requests`` one at a time; asking for more than ``fail_after`` is a test failure."""
    for i, r in enumerate(requests):
        assert i < fail_after, "read past the slice"
        yield r


def test_slice_requests_reads_only_what_it_keeps() -> None:
    requests = [Request(i, float(i), 10, 1) for i in range(100)]
    assert len(slice_requests(counted(requests, 3), num_requests=3)) == 3
    window = slice_requests(counted(requests, 16), start_s=10, duration_s=5)  # reads 15 too
    assert [r.arrival_s for r in window] == [0.0, 1.0, 2.0, 3.0, 4.0]
    scaled = slice_requests(requests, start_s=10, duration_s=5, time_factor=0.5)
    assert scaled == slice_requests(scale_rate(requests, 2.0), start_s=10, duration_s=5)
    assert mean_rate_per_s(iter(requests)) == mean_rate_per_s(requests) == 1.0


def test_make_requests_in_chunks_equals_one_go_and_shares_equal_values() -> None:
    num = 2 * REQUESTS_PER_CHUNK + 5
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(0.1, num))
    prompts = rng.integers(1, 3000, num)
    outputs = rng.integers(1, 500, num)
    prefix = SharedPrefix(5, 64, block_tokens=16)
    groups = prefix.sample_groups(num, rng)
    requests = make_requests(arrivals, prompts, outputs, n=2, groups=groups, shared_prefix=prefix)
    expected = [Request(i, float(arrivals[i]), int(prompts[i]) + 64, int(outputs[i]), 2, 1,
                        prefix.group_prefix_ids(int(groups[i])), 16) for i in range(num)]
    assert requests == expected
    by_length: dict[int, int] = {}
    for r in requests:  # one int object per distinct length
        assert by_length.setdefault(r.prompt_tokens, id(r.prompt_tokens)) == id(r.prompt_tokens)
    assert len({id(r.prefix_ids) for r in requests}) == 5  # one tuple per group
