"""``capacity`` from Python: the highest request rate (or number of closed-loop clients) that
meets a scenario's ``slo:``, per sweep point and allocator; or, with ``target_rate``/``growth``,
the fewest replicas that hold a rate. The same search ``kvplan capacity`` runs
(:func:`simulator.commands.capacity.cmd.run_capacity`,
:func:`simulator.commands.capacity.replica_cmd.run_replica_capacity`), returned as rows and a
pandas table instead of printed."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import KvplanError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


@dataclass(frozen=True)
class CapacityResult:
    """The answer: one row per (sweep point, allocator[, target]) as ``capacity.csv`` has it
    (:class:`~simulator.commands.capacity.sweep.CapacityRow`, or the replica search's rows),
    the notes printed under the table, and the folder the files went to (None: not kept)."""

    rows: list[Any]
    notes: list[str]
    out_dir: Path | None
    search: str

    @property
    def table(self) -> pd.DataFrame:
        """The rows as a DataFrame: the knobs of each point as columns, then the row's fields."""
        import pandas as pd

        records = []
        for row in self.rows:
            record = dataclasses.asdict(row)
            knobs = record.pop("knobs", {}) or {}
            records.append({**{f"knob.{k}": v for k, v in knobs.items()}, **record})
        return pd.DataFrame.from_records(records)


def capacity(scenario: str | Path, /, *, sweep: Mapping[str, Sequence[Any]] | None = None,
             file_sweep: bool = True, allocators: Sequence[str] | None = None, search: str = "rate",
             seeds: int = 3, tolerance: float = 0.05, start_rate: float | None = None,
             target_rate: float | Sequence[float] | None = None, growth: float | Sequence[float] | None = None,
             max_replicas: int | None = None, jobs: int | None = 1, executor: str = "process",
             prices: Mapping[str, float] | None = None, out: str | Path | None = None, plots: bool = False,
             replace: bool = False, overrides: Mapping[str, object] | None = None,
             **keywords: object) -> CapacityResult:
    """Search the scenario file at ``scenario`` as ``kvplan capacity`` does.

    ``sweep``: knobs to vary (``{"block_size": [16, 32]}``), crossed with the file's ``sweep:``
    unless ``file_sweep=False``. ``target_rate`` / ``growth``: the replica search
    (``--target-rate``/``--growth``). ``jobs``: worker processes (default 1 here; None: every
    CPU). ``out``: keep the files (``capacity.csv``, ``capacity.json``, plots with ``plots``,
    the probe cache) in this folder; None writes them to a temporary folder that is removed.
    Keyword arguments and ``overrides`` set scenario keys as :func:`simulator.api.simulation` does."""
    from simulator.api.simulation import dotted_overrides

    sets = [f"{key}={_yaml(value)}" for key, value in dotted_overrides(overrides, keywords).items()
            if value is not None]
    sweeps = [f"{knob}={','.join(_yaml(v) for v in values)}" for knob, values in (sweep or {}).items()]
    price_args = [f"{gpu}={usd}" for gpu, usd in (prices or {}).items()]
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="kvplan-capacity-")) / "out"
    try:
        common = dict(allocators=list(allocators) if allocators else None, sweeps=sweeps, overrides=sets,
                      num_seeds=seeds, executor=executor, jobs=jobs, prices=price_args, out=str(folder),
                      plots_on=plots, use_cache=out is not None, quiet=True, file_sweep=file_sweep,
                      replace=replace)
        if target_rate is not None or growth is not None:
            from simulator.commands.capacity.options import DEFAULT_MAX_REPLICAS
            from simulator.commands.capacity.replica_cmd import run_replica_capacity

            replica = run_replica_capacity(str(scenario), target_rates=_floats(target_rate), growths=_floats(growth),
                                           max_replicas=max_replicas or DEFAULT_MAX_REPLICAS, **common)
            rows, notes, kind = replica.rows, replica.notes, "replicas"
        else:
            if max_replicas is not None:
                raise KvplanError("max_replicas is for the replica search: give target_rate or growth")
            from simulator.commands.capacity.cmd import run_capacity

            report = run_capacity(str(scenario), tolerance=tolerance, start_rate=start_rate, search=search,
                                  **common)
            rows, notes, kind = report.rows, report.notes, search
    finally:
        if out is None:
            shutil.rmtree(folder.parent, ignore_errors=True)
    return CapacityResult(list(rows), list(notes), Path(out) if out is not None else None, kind)


def _floats(value: float | Sequence[float] | None) -> list[float]:
    if value is None:
        return []
    return [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _yaml(value: object) -> str:
    """A value as ``--set``/``--sweep`` read it back (a YAML scalar or flow collection)."""
    return value if isinstance(value, str) else json.dumps(value)


__all__ = ["CapacityResult", "capacity"]
