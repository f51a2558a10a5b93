"""The writers every results file goes through: JSON (NaN and infinities as null), CSV from
pandas frames, from rows and from columns, each replacing its file atomically."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.report.outputs import replace_file

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def clean_json(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` (NaN/inf as null) to ``path`` atomically, through a temporary name no other
    writer shares: a reader sees the old file or the new one, never half of one."""
    with replace_file(path) as tmp:
        tmp.write_text(json.dumps(clean_json(data), indent=2) + "\n", encoding="utf-8")


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """Write ``frame`` (no index, ``\\n`` line ends) to ``path`` atomically, as :func:`write_json`."""
    with replace_file(path) as tmp:
        frame.to_csv(tmp, index=False, lineterminator="\n")


def _cell(value: Any) -> Any:
    """A CSV cell as pandas' ``to_csv`` writes it: NaN empty, floats in their shortest repr."""
    if isinstance(value, float):
        return "" if value != value else float.__repr__(value)
    return value


def write_rows_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Write ``rows`` under ``header`` to ``path`` atomically, as :func:`write_csv` would write
    the same table (the same bytes), without building a DataFrame: rows are streamed."""
    with replace_file(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(header)
        out.writerows([_cell(v) for v in row] for row in rows)


def column_cells(column: Sequence[Any]) -> list[Any]:
    """A table column's CSV cells as :func:`write_csv` writes them: a numpy array as Python
    values, its NaNs as empty cells (the csv module writes a Python float as its ``repr``, the
    shortest round trip, as ``_cell`` does); any other column cell by cell (``_cell``)."""
    if not hasattr(column, "dtype"):
        return [_cell(v) for v in column]
    values = column.tolist()  # type: ignore[attr-defined]
    if column.dtype.kind == "f" and (column != column).any():  # type: ignore[attr-defined]
        return ["" if v != v else v for v in values]  # NaN: the one value unequal to itself
    return values


CHUNK_ROWS = 1 << 16  # rows converted at a time by write_columns_csv: bounded memory


def write_columns_csv(path: Path, header: Sequence[str],
                      tables: Iterable[Sequence[Sequence[Any]]]) -> None:
    """Write tables given column by column (numpy arrays or lists of one length, in ``header``
    order), one after another under ``header``, to ``path`` atomically: the bytes
    :func:`write_rows_csv` writes for the same rows, without a Python call per cell. Columns are
    converted :data:`CHUNK_ROWS` rows at a time (:func:`column_cells`)."""
    with replace_file(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(header)
        for columns in tables:
            n = len(columns[0]) if columns else 0
            for start in range(0, n, CHUNK_ROWS):
                end = start + CHUNK_ROWS
                out.writerows(zip(*(column_cells(c[start:end]) for c in columns)))
