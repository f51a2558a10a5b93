"""The published truth table: the shipped data's own promises, and clear errors for bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import KvplanError
from simulator.commands.validate.table import COLUMNS, read_table, select_sources

GOOD = {
    "row_id": "x-1", "source": "x", "source_title": "t", "source_url": "https://example.org",
    "source_date": "2025-01", "engine": "vllm", "engine_version": "0.10.0",
    "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "H100-80GB", "tensor_parallel": "1",
    "num_gpus": "1", "weight_dtype": "bf16", "kv_cache_dtype": "auto", "input_tokens": "1000",
    "output_tokens": "100", "dataset": "random", "load": "concurrency", "load_value": "8",
    "num_prompts": "80", "metric": "ttft", "statistic": "mean", "unit": "ms", "value": "120",
    "notes": "n",
}


def write(tmp_path: Path, *rows: dict[str, str], columns: tuple[str, ...] = COLUMNS) -> Path:
    path = tmp_path / "t.csv"
    lines = [",".join(columns)] + [",".join(r.get(c, "") for c in columns) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_shipped_table_keeps_its_promises() -> None:
    rows = read_table()
    sources = {r.source for r in rows}
    assert len(rows) >= 40 and len(sources) >= 4
    assert all(r.source_url.startswith("https://") for r in rows)
    assert all(r.notes for r in rows), "every row says where in its source the number is"
    vllm_sources = {r.source for r in rows if r.engine == "vllm"}
    assert len(vllm_sources) >= 2
    assert {r.metric for r in rows} >= {"ttft", "itl", "output_throughput"}


def test_a_good_row_is_read_in_si_units(tmp_path: Path) -> None:
    (row,) = read_table(write(tmp_path, GOOD))
    assert row.value_si == pytest.approx(0.120)
    assert row.metric_label == "ttft mean" and row.num_replicas == 1


@pytest.mark.parametrize(("change", "message"), [
    ({"unit": "tok/s"}, "measured in ms or s"),
    ({"metric": "tfft"}, "did you mean 'ttft'"),
    ({"load": "closed"}, "load 'closed'"),
    ({"value": "-3"}, "value must be a positive number"),
    ({"value": "fast"}, "is not a number"),
    ({"tensor_parallel": "1.5"}, "positive integer"),
    ({"num_gpus": "3", "tensor_parallel": "2"}, "not a multiple"),
    ({"row_id": ""}, "row_id is empty"),
])
def test_bad_rows_are_one_line_errors_with_the_line(tmp_path: Path, change: dict[str, str],
                                                    message: str) -> None:
    with pytest.raises(KvplanError, match=message) as err:
        read_table(write(tmp_path, {**GOOD, **change}))
    assert "t.csv:2" in str(err.value) and "\n" not in str(err.value)


def test_duplicate_ids_and_missing_columns(tmp_path: Path) -> None:
    with pytest.raises(KvplanError, match="duplicate row_id 'x-1'"):
        read_table(write(tmp_path, GOOD, GOOD))
    with pytest.raises(KvplanError, match="missing columns value"):
        read_table(write(tmp_path, GOOD, columns=tuple(c for c in COLUMNS if c != "value")))
    with pytest.raises(KvplanError, match="not found"):
        read_table(tmp_path / "nope.csv")


def test_select_sources(tmp_path: Path) -> None:
    rows = read_table(write(tmp_path, GOOD, {**GOOD, "row_id": "y-1", "source": "y"}))
    assert [r.row_id for r in select_sources(rows, ["y"])] == ["y-1"]
    assert len(select_sources(rows, None)) == 2
    with pytest.raises(KvplanError, match="unknown source 'z'"):
        select_sources(rows, ["z"])
