"""Writing a run's results: summary.json, run.json, requests.csv, steps.csv and the printed table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2) + "\n")
    tmp.replace(path)


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    frame.to_csv(tmp, index=False, lineterminator="\n")
    tmp.replace(path)


def _ms(stats: dict[str, float | None], key: str) -> str:
    v = stats.get(key)
    return "—" if v is None else f"{v * 1000:,.0f}" if v >= 0.1 else f"{v * 1000:,.1f}"


def summary_table(summary: dict[str, dict[str, Any]], title: str) -> Table:
    """One row per allocator: the numbers a capacity planner reads first."""
    table = Table(title=title, title_justify="left")
    for name, justify in (("allocator", "left"), ("done", "right"), ("rej.", "right"),
                          ("req/s", "right"), ("tok/s", "right"), ("TTFT p50/p99 ms", "right"),
                          ("TPOT p50/p99 ms", "right"), ("E2E p50 s", "right"),
                          ("batch mean/max", "right"), ("preempt", "right"),
                          ("KV used", "right"), ("internal", "right"), ("external", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for alloc, s in summary.items():
        kv = s["kv"]
        e2e = s["e2e_s"]["p50"]
        table.add_row(
            alloc, f"{s['completed']:,}", f"{s['rejected']:,}", f"{s['throughput_req_s']:.2f}",
            f"{s['throughput_tok_s']:,.0f}",
            f"{_ms(s['ttft_s'], 'p50')} / {_ms(s['ttft_s'], 'p99')}",
            f"{_ms(s['tpot_s'], 'p50')} / {_ms(s['tpot_s'], 'p99')}",
            "—" if e2e is None else f"{e2e:.2f}",
            f"{s['mean_batch_size']:.1f} / {s['max_batch_size']}", f"{s['num_preemptions']:,}",
            f"{kv['token_state']:.1%}", f"{kv['internal_fragmentation']:.1%}",
            f"{kv['external_fragmentation']:.1%}",
        )
    return table


def print_summary(console: Console, summary: dict[str, dict[str, Any]], deployment: dict[str, Any],
                  title: str, out_dir: Path) -> None:
    d = deployment
    console.print(
        f"[bold]{title}[/bold]: {d['model']} on {d['gpu']} × TP {d['tensor_parallel']}"
        f" × {d['num_replicas']} replica(s), KV {d['kv_cache_dtype']}, block {d['block_size']}:"
        f" {d['kv_capacity_tokens']:,} KV tokens per replica ({d['available_kv_gib']:.1f} GiB),"
        f" max_model_len {d['max_model_len']:,}"
    )
    console.print(summary_table(summary, "per allocator (KV used = time-averaged token-state share)"))
    console.print(f"results in {out_dir}/")
