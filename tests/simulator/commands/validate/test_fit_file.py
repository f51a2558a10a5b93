"""The shipped ``roofline_fit.json`` is what ``kvplan validate --fit --write`` makes of the current
table: it records everything the fit depends on besides the simulator (the table's hash, the rows
fitted, those not fitted and why, the start, the parameters, the budgets), and these match the
code and the table — checked here without fitting, in a second.

That the simulator still gives the recorded errors under the shipped constants is checked by
tests/simulator/commands/validate/test_validate_cmd.py (one ``kvplan validate`` run); that a fresh fit
gives the shipped constants bit for bit takes the whole fit (minutes) and runs with
``KVPLAN_FULL_FIT=1``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.latency.constants import FIELDS, read_fit
from simulator.commands.validate import fit as fitting
from simulator.commands.validate.cmd import FIT_PARAMS, FIT_ROUNDS, HELD_OUT_EVALS, _start_constants
from simulator.commands.validate.setups import group_setups
from simulator.commands.validate.table import default_table_path, read_table


def test_the_fit_file_records_the_inputs_of_the_current_table() -> None:
    shipped = read_fit()
    info, inputs = shipped["fit"], shipped["inputs"]
    table = default_table_path()
    assert info["table_sha256"] == hashlib.sha256(table.read_bytes()).hexdigest(), (
        "validation/published.csv changed since the defaults were fitted: kvplan validate --fit --write")
    rows = read_table(table)
    skipped = {r.row_id: s.skip_reason for s in group_setups(rows) if s.skip_reason for r in s.rows}
    assert inputs["rows_skipped"] == skipped
    fitted, failed = set(inputs["rows"]), set(inputs["rows_not_fitted"])
    assert not (fitted & failed) and not ((fitted | failed) & set(skipped))
    assert fitted | failed | set(skipped) == {r.row_id for r in rows}  # every row, once
    assert inputs["rows"] == sorted(fitted) and len(fitted) == info["num_rows"]
    assert info["sources"] == sorted({r.source for r in rows if r.row_id in fitted})


def test_the_fit_file_was_made_by_the_current_fit_settings() -> None:
    shipped = read_fit()
    info = shipped["fit"]
    assert info["parameters"] == list(FIT_PARAMS)
    assert info["start"] == {k: getattr(_start_constants(), k) for k in FIELDS}
    assert info["budget"] == {"rounds": FIT_ROUNDS, "round_evals": fitting.ROUND_EVALS,
                              "held_out_evals": HELD_OUT_EVALS, "improvement": fitting.IMPROVEMENT,
                              "backtracks": list(fitting.BACKTRACKS)}
    constants = shipped["constants"]
    assert info["fixed"] == {k: constants[k] for k in FIELDS if k not in FIT_PARAMS}
    assert shipped["allreduce_latency_s"] == {"fabric": constants["allreduce_latency_s"],
                                              "pcie": constants["allreduce_latency_s"]}
    # each round's objective is the simulated one of the constants it took, and falls
    objectives = [r["objective"] for r in info["rounds"]]
    assert objectives == sorted(objectives, reverse=True)
    assert objectives[-1] < info["rounds"][0]["start_objective"]
    # the constants are physical: efficiencies in (0, 1], times 0 or at least 10 µs
    for name in fitting.EFFICIENCIES:
        assert 0 < constants[name] <= 1, name
    for name in set(FIELDS) - set(fitting.EFFICIENCIES):
        assert constants[name] == 0 or constants[name] >= fitting.TIME_RESOLUTION_S, name


@pytest.mark.skipif(os.environ.get("KVPLAN_FULL_FIT") != "1",
                    reason="the whole fit takes minutes: KVPLAN_FULL_FIT=1 runs it")
def test_a_fresh_fit_gives_the_shipped_constants_bit_for_bit(tmp_path: Path) -> None:
    assert main(["validate", "--fit", "--out", str(tmp_path), "--no-plots", "-q"]) == 0
    fresh = json.loads((tmp_path / "validate.json").read_text())
    shipped = read_fit()
    assert fresh["constants"] == shipped["constants"]
    assert fresh["fit"]["rounds"] == shipped["fit"]["rounds"]
    assert fresh["fit"]["rows"] == shipped["inputs"]["rows"]
    assert fresh["fit"]["rows_not_fitted"] == shipped["inputs"]["rows_not_fitted"]


def test_the_architecture_fit_records_its_rows_and_settings() -> None:
    """``validate --silicon --fit --write``'s part of the file: the sets written are the adopted
    ones, each fitted on established rows of the current silicon table with today's settings."""
    from simulator.commands.validate import silicon_fit
    from simulator.commands.validate.silicon import default_silicon_path, read_silicon
    from simulator.commands.validate.silicon_run import find_gpu
    from simulator.kv.gpus import architecture

    shipped = read_fit()
    info = shipped["fit"].get("per_architecture")
    if info is None:
        assert not shipped.get("per_architecture")
        return
    table = default_silicon_path()
    assert info["table_sha256"] == hashlib.sha256(table.read_bytes()).hexdigest(), (
        "validation/silicon.csv changed since the architecture sets were fitted: "
        "kvplan validate --silicon --fit --write")
    assert info["parameters"] == list(silicon_fit.FIT_PARAMS)
    assert info["budget"] == {"evals": silicon_fit.FIT_EVALS, "held_out_evals": silicon_fit.HELD_OUT_EVALS,
                              "min_rows": silicon_fit.MIN_ROWS, "train_per_cell": silicon_fit.TRAIN_PER_CELL}
    archs = info["architectures"]
    assert set(shipped.get("per_architecture", {})) == {a for a, f in archs.items() if f["adopted"]}
    for arch, f in archs.items():  # adopted: held out it beats the global set
        m = f["mape"]
        held = (m["held_out"]["ttft"] + m["held_out"]["tpot"]) / 2
        if f["adopted"]:
            assert held < (m["global"]["ttft"] + m["global"]["tpot"]) / 2, arch
    rows, extras = read_silicon(table)
    by_id = {r.row_id: r for r in rows}
    for arch, ids in shipped["inputs"]["per_architecture_rows"].items():
        assert len(ids) == archs[arch]["num_rows"] == sum(archs[arch]["cells"].values())
        for i in ids:  # an established row (InferenceX's method, not ambiguous, not a copy) of the architecture
            x = extras[i]
            assert x["method"] == "inferencex" and not x["ambiguous"] and not x["duplicate_of"], i
            gpu = find_gpu(by_id[i].gpu)
            assert gpu is not None and architecture(gpu) == arch, i
