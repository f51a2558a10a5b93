"""The printed capacity table fits the terminal; the CSV keeps every column."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from simulator.commands.capacity.sweep import CapacityRow
from simulator.commands.capacity.table import CONCURRENCY_COLUMNS, RATE_COLUMNS, print_table


def row(i: int, model: str, allocator: str, **change: object) -> CapacityRow:
    values: dict[str, object] = dict(
        point_index=i, knobs={"model+tensor_parallel": None, "model": model, "tensor_parallel": 1 + i % 2,
                              "gpu": "h100-80gb", "block_size": 16},
        allocator=allocator, status="ok", max_rate_req_s=22.38 + i, rate_ci_low_req_s=22.38 + i,
        rate_ci_high_req_s=22.97 + i, num_seeds=1, throughput_tok_s=5931.2, goodput_req_s=22.2 + i,
        ttft_p99_s=1.99, tpot_p99_s=0.0564, kv_capacity_tokens=1_430_736, max_concurrency=256,
        limited_by="max_num_seqs", num_gpus=1, rate_per_gpu_req_s=22.4, price_usd_per_gpu_hour=3.0,
        usd_per_m_output_tokens=0.14, window_s=89.3)
    values["knobs"] = {k: v for k, v in values["knobs"].items() if v is not None}  # type: ignore[union-attr]
    values.update(change)
    return CapacityRow(**values)  # type: ignore[arg-type]


ROWS = [row(0, "llama-3.1-8b", "paged"), row(1, "llama-3.1-70b", "contiguous-max"),
        row(2, "llama-3.1-70b", "", status="failed", message="scenario: unknown GPU 'h1000'"),
        row(3, "llama-3.1-8b", "paged", status="slo-unmet", message="SLO fails even at 0.1 req/s",
            window_note="the steady window (3 s) is shorter than 2 × the p99 E2E (4 s)")]


def printed(width: int, rows: list[CapacityRow] = ROWS, search: str = "rate") -> tuple[str, list[str]]:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    dropped = print_table(console, rows, {0: "a note"}, Path("runs/x"), 1.0, search)
    return console.file.getvalue(), dropped  # type: ignore[attr-defined]


def flat(text: str) -> str:
    """The text with the console's line wrapping undone."""
    return " ".join(text.split())


@pytest.mark.parametrize("width", [80, 100, 250])
def test_every_line_fits_and_the_answer_stays(width: int) -> None:
    text, dropped = printed(width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    header = next(line for line in lines if "allocator" in line)
    assert "req/s" in header and "model" in header and "TP" in header
    for shown in (c.header for c in RATE_COLUMNS if c.header not in dropped):
        assert shown in header  # shown whole, never shrunk to nothing
    assert "22.38" in text and "23.38" in text and "llama-3.1-70b" in text  # values whole too
    if dropped:
        assert f"not shown at {width} columns: {', '.join(dropped)} (capacity.csv has every column)" in flat(text)
    else:
        assert "not shown" not in text


def test_columns_go_least_important_first() -> None:
    _, at_80 = printed(80)
    _, at_100 = printed(100)
    _, wide = printed(250)
    assert wide == [] and set(at_100) < set(at_80)
    order = sorted((c for c in RATE_COLUMNS if c.drop_order), key=lambda c: -c.drop_order)
    assert at_80 == [c.header for c in order][: len(at_80)]
    assert "goodput" not in at_80  # what a buyer reads first stays longest


def test_one_valued_knobs_go_to_the_title_and_the_lines_under_say_why() -> None:
    text, _ = printed(80)
    text = flat(text)
    assert text.startswith("max sustainable rate under the SLO — gpu=h100-80gb, block_size=16")
    assert "rates count the requests arriving in each probe's steady window" in text
    assert "point 2 failed: scenario: unknown GPU 'h1000'" in text
    assert "point 3 paged slo-unmet: SLO fails even at 0.1 req/s" in text
    assert "point 3 paged: the steady window (3 s) is shorter than" in text
    assert "note: a note" in text and "wrote runs/x/capacity.csv and capacity.json" in text


def test_concurrency_table_keeps_the_clients() -> None:
    rows = [row(i, "llama-3.1-8b", "paged", search="concurrency", max_clients=48.0 + i, clients_ci_low=48,
                clients_ci_high=52, tok_s_per_gpu=5931.2, tok_s_per_user=61.0) for i in range(2)]
    text, dropped = printed(80, rows, "concurrency")
    header = next(line for line in text.splitlines() if "allocator" in line)
    assert "concurrency" in header and "48" in text and "req/s" in header
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "concurrency" not in dropped and "arriving in each probe's steady window" not in flat(text)
    assert "requests sent in each probe's steady window" in flat(text)
    assert {c.header for c in CONCURRENCY_COLUMNS if c.drop_order == 0} == {"concurrency"}
