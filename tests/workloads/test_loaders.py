"""Trace loaders: bundled traces' known statistics, exact parsing, and every bad-input message."""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path

import pytest

from simulator.errors import KvplanError
from workloads.loaders import (
    BUNDLED_TRACES,
    bundled_trace_path,
    detect_format,
    load_azure,
    load_burstgpt,
    load_generic,
    load_mooncake,
    load_trace,
    read_burstgpt,
)
from workloads.synthetic import mean_rate_per_s

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- bundled traces -----------------------------------------------------------------------

# name: (format, rows, mean req/s, mean prompt tokens, mean output tokens) from traces/README.md
BUNDLED = {
    "azure-conv": ("azure", 19_366, 5.53, 1155, 211),
    "azure-code": ("azure", 8_819, 2.57, 2048, 28),
    "mooncake": ("mooncake", 3_993, 3.91, 15326, 149),
}


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_trace_statistics(name: str) -> None:
    fmt, rows, rate, prompt_mean, output_mean = BUNDLED[name]
    path = bundled_trace_path(name)
    assert detect_format(path) == fmt
    requests = load_trace(path)
    assert len(requests) == rows
    assert [r.request_id for r in requests] == list(range(rows))
    assert requests[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))
    assert mean_rate_per_s(requests) == pytest.approx(rate, abs=0.005)
    assert statistics.fmean(r.prompt_tokens for r in requests) == pytest.approx(prompt_mean, abs=1)
    assert statistics.fmean(r.output_tokens for r in requests) == pytest.approx(output_mean, abs=1)


def test_bundled_names_and_licenses() -> None:
    assert set(BUNDLED_TRACES) == set(BUNDLED)
    data = bundled_trace_path("azure-conv").parent.parent
    assert (data / "ATTRIBUTION.md").is_file()
    assert (data / "azure-2023" / "LICENSE").is_file()
    assert (data / "mooncake-fast25" / "LICENSE-APACHE").is_file()
    message = r"^unknown bundled trace 'azure-cov' — did you mean 'azure-conv'\?$"
    with pytest.raises(KvplanError, match=message):
        bundled_trace_path("azure-cov")


def test_mooncake_prefix_ids_cover_the_prompt() -> None:
    requests = load_mooncake(bundled_trace_path("mooncake"))
    assert all(r.prefix_block_tokens == 512 for r in requests)
    assert all(len(r.prefix_ids) == math.ceil(r.prompt_tokens / 512) for r in requests)
    assert requests[0].prefix_ids == tuple(range(79))


# --- Azure --------------------------------------------------------------------------------


def test_azure_parses_seven_fractional_digits_and_midnight(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER
                 + "2023-11-16 23:59:59.6805900,374,44\n"
                 + "2023-11-16 23:59:59.6805901,10,1\n"
                 + "2023-11-17 00:00:01.0000000,396,109\n")
    requests = load_azure(path)
    assert [r.request_id for r in requests] == [0, 1, 2]
    assert requests[1].arrival_s == pytest.approx(1e-7, abs=1e-9)
    assert requests[2].arrival_s == pytest.approx(1.31941, abs=1e-9)
    assert (requests[2].prompt_tokens, requests[2].output_tokens) == (396, 109)
    assert requests[0].prefix_ids == () and requests[0].prefix_block_tokens == 0


def test_azure_accepts_crlf_bom_reordered_columns_and_offsets(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfContextTokens,GeneratedTokens,TIMESTAMP\r\n"
                     b"5,6,2023-11-16T10:00:00+01:00\r\n7,8,2023-11-16 09:00:02.5Z\r\n")
    requests = load_trace(path)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0.0, 5, 6), (2.5, 7, 8)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:15:47.0,abc,3", "t.csv:3: ContextTokens 'abc' is not an integer"),
        ("2023-11-16 18:15:47.0,12.5,3", "t.csv:3: ContextTokens '12.5' is not an integer"),
        ("2023-11-16 18:15:47.0,0,3", "t.csv:3: ContextTokens must be at least 1 (got 0)"),
        ("2023-11-16 18:15:47.0,-4,3", "t.csv:3: ContextTokens must be at least 1 (got -4)"),
        ("2023-11-16 18:15:47.0,5,-1", "t.csv:3: GeneratedTokens must be at least 1 (got -1): "
                                       "every request generates a token"),
        ("2023-11-16 18:15:47.0,5,0", "t.csv:3: GeneratedTokens must be at least 1 (got 0): "
                                      "every request generates a token"),
        ("2023-11-16 18:15:47.0,20000000,3",
         "t.csv:3: ContextTokens 20,000,000 exceeds the limit of 10,000,000 tokens"),
        ("2023-11-16 18:15:45.5,5,3", "t.csv:3: timestamp goes backwards (2023-11-16 18:15:45.5 < "
                                      "2023-11-16 18:15:46.6805900); sort the trace first"),
        ("16/11/2023 18:15,5,3", "t.csv:3: TIMESTAMP '16/11/2023 18:15' is not a datetime like "
                                 "2023-11-16 18:15:46.6805900"),
        ("2023-02-30 18:15:47.0,5,3", "t.csv:3: TIMESTAMP '2023-02-30 18:15:47.0' is not a "
                                      "datetime like 2023-11-16 18:15:46.6805900"),
        ("2023-11-16 25:15:47.0,5,3", "t.csv:3: TIMESTAMP '2023-11-16 25:15:47.0' is not a "
                                      "datetime like 2023-11-16 18:15:46.6805900"),
        ("2023-11-16 18:15:47.0,5", "t.csv:3: expected 3 fields, got 2"),
    ],
)
def test_azure_bad_rows(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\n" + row + "\n")
    with pytest.raises(KvplanError) as info:
        load_azure(path)
    assert str(info.value) == f"{tmp_path}/{message}"


def test_azure_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER + "2023-11-16 18:15:46.0,1,1\n\n\n"
                 + "2023-11-16 18:15:47.0,x,1\n")
    with pytest.raises(KvplanError, match=r"t\.csv:5: ContextTokens 'x' is not an integer$"):
        load_azure(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,1\n", "missing column 'GeneratedTokens'"),
        ("TIMESTAMP,ContextTokens,GeneratedToken\n", "missing column 'GeneratedTokens' — did you "
                                                     "mean 'GeneratedToken'?"),
        ("", "empty file"),
        (AZURE_HEADER, "no requests in the trace"),
    ],
)
def test_azure_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(KvplanError) as info:
        load_azure(path)
    assert str(info.value) == f"{path}: {message}"


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(KvplanError, match=r"nope\.csv: no such file$"):
        load_trace(tmp_path / "nope.csv", "azure")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe\x00\n")
    with pytest.raises(KvplanError, match=r"b\.csv: not UTF-8 text"):
        load_azure(binary)


# --- Mooncake -----------------------------------------------------------------------------


def test_mooncake_small_file(tmp_path: Path) -> None:
    path = write(tmp_path, "m.jsonl",
                 '{"timestamp": 1000, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}\n'
                 "\n"
                 '{"timestamp": 1250, "input_length": 600, "output_length": 1, "hash_ids": [7]}\n'
                 '{"timestamp": 1250, "input_length": 3, "output_length": 2}\n')
    requests = load_mooncake(path)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_ids) for r in requests] == [
        (0.0, 1000, 5, (7, 8)), (0.25, 600, 1, (7,)), (0.25, 3, 2, ())]
    assert [r.prefix_block_tokens for r in requests] == [512, 512, 0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 5, "input_length": 10}', "m.jsonl:2: missing key 'output_length'"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}',
         "m.jsonl:2: hash_ids names 2 blocks of 512 tokens but input_length 10 fills only 1"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}',
         "m.jsonl:2: hash_ids must be a list of non-negative integers"),
        ('{"timestamp": 5, "input_length": "ten", "output_length": 1}',
         "m.jsonl:2: input_length 'ten' is not an integer"),
        ('{"timestamp": "later", "input_length": 10, "output_length": 1}',
         "m.jsonl:2: timestamp 'later' is not a number"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 1}',
         "m.jsonl:2: timestamp goes backwards (1 < 5); sort the trace first"),
        ('{"timestamp": 5, "input_length": 10,', "m.jsonl:2: not valid JSON (Expecting property "
                                                 "name enclosed in double quotes)"),
        ("[1, 2]", "m.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_mooncake_bad_lines(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "m.jsonl",
                 '{"timestamp": 5, "input_length": 10, "output_length": 1}\n' + line + "\n")
    with pytest.raises(KvplanError) as info:
        load_mooncake(path)
    assert str(info.value) == f"{tmp_path}/{message}"


# --- BurstGPT -----------------------------------------------------------------------------


def burst_file(tmp_path: Path) -> Path:
    return write(tmp_path, "burst.csv", BURST_HEADER
                 + "5,ChatGPT,472,18,490,Conversation log\n"
                 + "8,GPT-4,100,0,100,Conversation log\n"
                 + "9,GPT-4,1200,300,1500,API log\n"
                 + "12,ChatGPT,30,0,30,API log\n"
                 + "13.5,ChatGPT,40,7,47,API log\n")


def test_burstgpt_skips_and_counts_failures(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = burst_file(tmp_path)
    assert detect_format(path) == "burstgpt"
    trace = read_burstgpt(path)
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (0, 0.0, 472, 18), (1, 4.0, 1200, 300), (2, 8.5, 40, 7)]
    assert (trace.num_failed_skipped, trace.num_other_models_skipped) == (2, 0)
    with caplog.at_level(logging.INFO, logger="workloads.loaders"):
        assert len(load_trace(path)) == 3
    assert "skipped 2 failed requests" in caplog.text


def test_burstgpt_model_filter(tmp_path: Path) -> None:
    path = burst_file(tmp_path)
    trace = read_burstgpt(path, model="gpt-4")
    assert [(r.arrival_s, r.prompt_tokens) for r in trace.requests] == [(0.0, 1200)]
    assert (trace.num_failed_skipped, trace.num_other_models_skipped) == (1, 3)
    assert len(load_burstgpt(path, model="ChatGPT")) == 2
    with pytest.raises(KvplanError) as info:
        load_trace(path, model="GPT4")
    assert str(info.value) == f"{path}: no rows for model 'GPT4' — did you mean 'GPT-4'?"


# --- generic CSV / JSONL and dispatch -----------------------------------------------------


def test_generic_csv_and_jsonl_with_named_columns(tmp_path: Path) -> None:
    csv_path = write(tmp_path, "g.csv", "t_ms,in,out,extra\n1500,10,2,x\n1750,20.0,3,y\n")
    jsonl_path = write(tmp_path, "g.jsonl", '{"t_ms": 1500, "in": 10, "out": 2}\n'
                                            '{"t_ms": 1750, "in": 20, "out": 3}\n')
    expected = [(0, 0.0, 10, 2), (1, 0.25, 20, 3)]
    for path in (csv_path, jsonl_path):
        requests = load_generic(path, arrival="t_ms", prompt="in", output="out", time_unit="ms")
        got = [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests]
        assert got == expected
    assert detect_format(csv_path) == "csv" and detect_format(jsonl_path) == "jsonl"
    default = write(tmp_path, "d.csv", "arrival_s,prompt_tokens,output_tokens\n0.5,4,4\n2,5,5\n")
    assert [r.arrival_s for r in load_trace(default, "csv")] == [0.0, 1.5]


def test_generic_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n1,2,3\nnan,2,3\n")
    with pytest.raises(KvplanError, match=r"g\.csv:3: arrival_s 'nan' is not a finite number$"):
        load_generic(path)
    with pytest.raises(KvplanError, match=r"^unknown time unit 'sec' \(known: ms, s, us\)$"):
        load_generic(path, time_unit="sec")  # type: ignore[arg-type]
    hint = r"g\.csv: missing column 'arrival' — did you mean 'arrival_s'\?$"
    with pytest.raises(KvplanError, match=hint):
        load_trace(path, "csv", arrival="arrival")


def test_load_trace_rejects_unknown_format_and_options(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER + "2023-11-16 18:15:46.0,1,1\n")
    with pytest.raises(KvplanError) as info:
        load_trace(path, "azur")
    assert str(info.value) == f"{path}: unknown trace format 'azur' — did you mean 'azure'?"
    with pytest.raises(KvplanError) as info:
        load_trace(path, model="GPT-4")
    assert str(info.value) == f"{path}: trace format 'azure' takes no option 'model'"
    with pytest.raises(KvplanError, match=r"e\.csv: empty file$"):
        load_trace(write(tmp_path, "e.csv", "\n\n"))
