"""The capacity table as printed: one line per (point, allocator), fitted to the terminal.

A sweep's whole table has ten or twelve metric columns plus one per knob, some 200 characters;
rich, given less room, shrinks columns to nothing. So the columns are chosen here: knobs that
take one value in every row go to the title, then the metric columns least worth their width
(highest :attr:`Column.drop_order` first) are left out until the table's natural width fits the
console, and the line under the table names them. ``capacity.csv`` always has every column.

Under the table: which window the rates are measured over, every row that is not a plain
answer (failed, SLO unmet, unbounded) or whose window deserves a caveat, and the notes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from simulator.commands.capacity.sweep import CapacityRow, csv_cell

UNBOUNDED_WIDTH = 100_000  # measuring against this gives a table's natural width
RATE_TITLE = "max sustainable rate under the SLO"
CONCURRENCY_TITLE = "max closed-loop concurrency under the SLO"
WINDOW_LINE = {  # what the rates are over (simulator/commands/capacity/search.py, "steady window")
    "rate": "rates count the requests arriving in each probe's steady window, from the first arrival "
            "after the warm-up to the last arrival: warm-up and drain left out",
    "concurrency": "rates count the requests sent in each probe's steady window, from the first send "
                   "after the warm-up to the last send: warm-up and drain left out",
}


# Knob headers worth shortening: the values are a few characters wide, the names are not.
KNOB_HEADERS = {"tensor_parallel": "TP", "kv_cache_dtype": "KV dtype", "num_replicas": "replicas",
                "gpu_memory_utilization": "GPU mem"}


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


@dataclass(frozen=True, slots=True)
class Column:
    """A metric column: its header, how a row fills it, and when it is left out for width
    (``drop_order`` 0: never; otherwise the highest goes first)."""

    header: str
    drop_order: int
    cell: Callable[[Any], str]  # the row (a CapacityRow, or another search's row) -> its text


def _rate_range(r: CapacityRow) -> str:
    high = "∞" if r.rate_ci_high_req_s is None else _num(r.rate_ci_high_req_s, ".4g")
    return f"[{_num(r.rate_ci_low_req_s, '.4g')}, {high}]"


def _clients_range(r: CapacityRow) -> str:
    high = "∞" if r.clients_ci_high is None else str(r.clients_ci_high)
    return f"[{r.clients_ci_low}, {high}]"


_TOK_S = Column("out tok/s", 6, lambda r: _num(r.throughput_tok_s, ",.0f"))
_GOODPUT = Column("goodput", 1, lambda r: _num(r.goodput_req_s, ".4g"))  # as req/s: never rounded above it
_TTFT = Column("TTFT p99", 3, lambda r: _num(r.ttft_p99_s))
_TPOT = Column("TPOT p99", 4, lambda r: _num(r.tpot_p99_s))
_KV = Column("KV tokens", 11, lambda r: _num(r.kv_capacity_tokens, ",d"))
_LIMIT = Column("max conc. (limit)", 5, lambda r: f"{r.max_concurrency} ({r.limited_by})")
_USD = Column("$/M tok", 2, lambda r: _num(r.usd_per_m_output_tokens, ".3f"))

# In display order. The answer never goes; then what a buyer reads first: goodput, cost, latency.
RATE_COLUMNS: tuple[Column, ...] = (
    Column("req/s", 0, lambda r: _num(r.max_rate_req_s, ".4g")),
    Column("range", 7, _rate_range), _TOK_S, _GOODPUT, _TTFT, _TPOT, _KV, _LIMIT,
    Column("req/s/GPU", 8, lambda r: _num(r.rate_per_gpu_req_s)), _USD,
)
CONCURRENCY_COLUMNS: tuple[Column, ...] = (
    Column("concurrency", 0, lambda r: _num(r.max_clients, ".4g")),
    Column("range", 9, _clients_range),
    Column("req/s", 1, lambda r: _num(r.max_rate_req_s, ".4g")),
    Column("out tok/s", 10, _TOK_S.cell),
    Column("tok/s/user", 2, lambda r: _num(r.tok_s_per_user, ".4g")),
    Column("goodput", 7, _GOODPUT.cell), Column("TTFT p99", 5, _TTFT.cell), Column("TPOT p99", 6, _TPOT.cell),
    _KV, Column("max conc. (limit)", 8, _LIMIT.cell),
    Column("tok/s/GPU", 3, lambda r: _num(r.tok_s_per_gpu, ",.0f")), Column("$/M tok", 4, _USD.cell),
)


def print_table(console: Console, rows: Sequence[CapacityRow], notes: dict[int, str], out_dir: Path | None,
                elapsed_s: float, search: str = "rate", *, title: str | None = None) -> list[str]:
    """Print the capacity table fitted to ``console.width``, the lines under it, and (with
    ``out_dir``) where the files went. Returns the headers left out for width."""
    by_clients = search == "concurrency"
    columns = CONCURRENCY_COLUMNS if by_clients else RATE_COLUMNS
    dropped = print_fitted(console, title or (CONCURRENCY_TITLE if by_clients else RATE_TITLE), columns, rows)
    console.print(WINDOW_LINE[search], markup=False)
    for r in rows:
        who = f"point {r.point_index}" + (f" {r.allocator}" if r.allocator else "")
        if r.status != "ok":  # failed, slo-unmet, unbounded: say why
            console.print(f"{who} {r.status}: {r.message}", markup=False)
        if r.window_note:
            console.print(f"{who}: {r.window_note}", markup=False)
    for note in sorted(set(notes.values())):
        console.print(f"note: {note}", markup=False)
    if out_dir is not None:
        extra = ", pareto.csv" if by_clients else ""
        console.print(f"wrote {out_dir / 'capacity.csv'}{extra} and capacity.json ({elapsed_s:.1f} s)",
                      markup=False)
    return dropped


class TableRow(Protocol):
    """What a table line needs of a row (:class:`CapacityRow`, the replica search's rows)."""

    @property
    def knobs(self) -> dict[str, Any]: ...
    @property
    def allocator(self) -> str: ...
    @property
    def status(self) -> str: ...


def print_fitted(console: Console, heading: str, columns: Sequence[Column], rows: Sequence[TableRow],
                 blank: Collection[str] = ("failed", "slo-unmet")) -> list[str]:
    """Print ``rows`` under ``heading`` fitted to ``console.width`` (module docstring): knobs
    that take one value go to the title, then columns are left out by ``drop_order`` and named
    under the table. Rows whose status is in ``blank`` show it instead of numbers. Returns the
    headers left out."""
    knobs = list(dict.fromkeys(k for r in rows for k in r.knobs if k != "allocators"))
    fixed = {k: csv_cell(rows[0].knobs.get(k)) for k in knobs
             if rows and all(k in r.knobs and csv_cell(r.knobs[k]) == csv_cell(rows[0].knobs[k]) for r in rows)}
    varying = [k for k in knobs if k not in fixed]
    if fixed:
        heading += " — " + ", ".join(f"{k}={v}" for k, v in fixed.items())
    shown, dropped = list(columns), []
    table = _table(heading, varying, shown, rows, blank)
    unbounded = console.options.update_width(UNBOUNDED_WIDTH)  # the natural width, not the console's
    while Measurement.get(console, unbounded, table).maximum > console.width:
        optional = [c for c in shown if c.drop_order > 0]
        if not optional:
            break  # only the answer is left: the knob columns fold
        worst = max(optional, key=lambda c: c.drop_order)
        shown.remove(worst)
        dropped.append(worst.header)
        table = _table(heading, varying, shown, rows, blank)
    console.print(table)
    if dropped:
        console.print(f"not shown at {console.width} columns: {', '.join(dropped)} "
                      "(capacity.csv has every column)", markup=False)
    return dropped


def _table(title: str, knobs: list[str], columns: Sequence[Column], rows: Sequence[TableRow],
           blank: Collection[str]) -> Table:
    # No vertical rules and collapsed padding: one space between columns, not three.
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True,
                  pad_edge=False)
    for knob in knobs:
        table.add_column(KNOB_HEADERS.get(knob, knob), justify="left", overflow="fold")
    table.add_column("allocator", justify="left", no_wrap=True)
    for column in columns:
        table.add_column(column.header, justify="right", no_wrap=True)
    for r in rows:
        cells = [csv_cell(r.knobs.get(k)) for k in knobs] + [r.allocator]
        if r.status in blank:  # no numbers: the line under the table says why
            table.add_row(*cells, f"[red]{r.status}[/]", *[""] * (len(columns) - 1))
        else:
            table.add_row(*cells, *(column.cell(r) for column in columns))
    return table
