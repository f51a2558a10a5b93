"""Per-architecture constants fitted on the silicon rows: re-timing a recorded closed loop is the
simulation, the fit improves on its start and holds model families out, the adoption rule, and
how a GPU resolves its constants (global, then its architecture's set, then its own)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from simulator.commands.validate import silicon, silicon_fit, silicon_run
from simulator.commands.validate.silicon import read_silicon
from simulator.kv.gpus import ARCHITECTURE, architecture, get_gpu, list_gpus
from simulator.latency import constants as rc
from tests.simulator.commands.validate.test_silicon import EXTRA, FIXTURE, ROW


def test_every_catalog_gpu_has_an_architecture() -> None:
    assert set(ARCHITECTURE) == set(list_gpus())
    assert architecture(get_gpu("h200")) == "hopper" and architecture("B300-288GB") == "blackwell"
    assert architecture("MI325X") == "cdna3" and architecture("not-a-gpu") == ""


def test_a_gpu_takes_its_architectures_set_over_the_global_one() -> None:
    fit = rc.read_fit()
    base = {**fit, "per_architecture": {}, "per_gpu": {}}
    h100, a100 = get_gpu("h100"), get_gpu("a100")
    glob = rc.default_constants(h100, base)
    arch = {k: getattr(glob, k) for k in rc.FIELDS} | {"mem_efficiency": 0.5, "allreduce_latency_s": 7e-5}
    with_arch = {**base, "per_architecture": {"hopper": arch}}
    c = rc.default_constants(h100, with_arch)
    assert c.mem_efficiency == 0.5 and c.allreduce_latency_s == 7e-5  # every field of the set, the latency too
    assert rc.default_constants(a100, with_arch) == rc.default_constants(a100, base)  # another architecture
    assert rc.global_constants(h100, with_arch) == glob
    assert rc.constants_set(h100, with_arch) == "hopper" and rc.constants_set(a100, with_arch) == "global"
    per_gpu = {**with_arch, "per_gpu": {"H100-80GB": {"mem_efficiency": 0.4}}}
    assert rc.default_constants(h100, per_gpu).mem_efficiency == 0.4  # a GPU's own override last


@pytest.fixture(scope="module")
def recorded() -> tuple[list, dict, list]:
    rows, extras = _converted()
    setups = silicon_run.group(rows, extras)
    return rows, extras, silicon_run.run_all(setups, global_set=True, record=True)


def _converted() -> tuple[list, dict]:
    with tempfile.TemporaryDirectory() as d:
        table = Path(d) / "silicon.csv"
        silicon.write_table(table, silicon.convert(silicon.read_sample(FIXTURE)))
        return read_silicon(table)


def test_re_timing_a_recorded_loop_is_the_simulation(recorded) -> None:
    _, _, results = recorded
    ran = [r for r in results if r.recording is not None]
    assert ran, "the fixture has simulatable rows"
    for res in ran:
        gpu = get_gpu(str(res.setup.scenario["gpu"]))
        again = res.recording.predict(rc.global_constants(gpu))
        for key in ("ttft_s.mean", "tpot_s.mean", "e2e_s.mean"):
            assert again[key] == pytest.approx(res.flat[key], rel=1e-12), key
        # and under other constants it is what a simulation with them gives
        other = dataclasses.replace(rc.global_constants(gpu), mem_efficiency=0.5, request_overhead_s=0.05)
        resim = silicon_run._simulate_once(res.setup, None, other, False)
        moved = res.recording.predict(other)
        for key in ("ttft_s.mean", "tpot_s.mean"):
            assert moved[key] == pytest.approx(resim.flat[key], rel=1e-9), key


def test_the_fit_improves_on_the_global_set_and_holds_families_out(recorded, monkeypatch) -> None:
    _, extras, results = recorded
    usable = {r.row_id for res in results if res.recording is not None for r in res.setup.rows}
    # the fixture's rows as if established (it holds one of each kind, not twenty of one)
    monkeypatch.setattr(silicon_fit, "MIN_ROWS", 2)
    monkeypatch.setattr(silicon_fit, "FIT_EVALS", 150)
    monkeypatch.setattr(silicon_fit, "HELD_OUT_EVALS", 60)
    fits = silicon_fit.fit_architectures(results, usable, extras, lambda g: rc.global_constants(get_gpu(g)))
    assert fits, "an architecture with two rows"
    for f in fits.values():
        assert f.objective <= f.start_objective + 1e-12
        assert {r.row_id for r in f.rows} == set(f.fitted) == set(f.global_)
        families = {silicon_fit.model_family(r, extras) for r in f.rows}
        if len(families) > 1:  # every row predicted by a fit that never saw its family
            assert set(f.held_out) == set(f.fitted)
        assert f.adopted == (f.held_out != {} and f.mape(f.held_out, f.rows) < f.mape(f.global_, f.rows))
    block = silicon_fit.constants_block(fits)
    assert set(block) == {a for a, f in fits.items() if f.adopted}
    summary = silicon_fit.summary(fits, extras)
    for s in summary.values():
        assert s["overall"]["ttft"]["rows"] + s["overall"]["tpot"]["rows"] == s["num_rows"]


def test_a_tpot_below_the_hbm_floor_is_implausible() -> None:
    # By hand: 100 requests × 1,000 tokens × 100 kB = 10 GB a step over 2 × 2.5 TB/s = 2 ms
    assert silicon_run.decode_floor_s(kv_bytes_per_token=1e5, decoding=100, context_tokens=1000, num_gpus=2,
                                      hbm_bandwidth_bytes_s=2.5e12) == pytest.approx(2e-3)
    # Llama-3.1-8B on one H100, 16 clients of 8k/1k, bf16 KV (128 KiB a token, 19 GB for all
    # of them: fits): with a 1 s TTFT and a 1 ms TPOT ~8 of 16 decode at once (1.02 s of 2.02 s),
    # reading ≥ 8 × 6,553 × 128 KiB ≈ 6.8 GB a step: ≥ 2 ms at 3.35 TB/s, above the 1 ms claimed
    tpot = dataclasses.replace(ROW, row_id="r:tpot", metric="tpot", load_value=16, value=1.0)
    assert silicon_run.decode_plausibility(tpot, EXTRA, 1.0).startswith("implausible")
    assert silicon_run.decode_plausibility(dataclasses.replace(tpot, value=30.0), EXTRA, 1.0) == "ok"
    # a long queue in the TTFT: few decode at once, nothing to flag
    assert silicon_run.decode_plausibility(tpot, EXTRA, 200.0) == "ok"
    # more clients than the GPUs' memory holds at once: the batch may be smaller, not checked
    crowded = dataclasses.replace(tpot, load_value=512)
    assert silicon_run.decode_plausibility(crowded, EXTRA, 1.0).startswith("not checked")


def test_validate_silicon_fit_reports_and_writes_the_architecture_sets(tmp_path: Path, monkeypatch, capsys) -> None:
    import json
    import shutil

    from simulator.cli import main
    from simulator.commands.validate import cmd

    table = tmp_path / "silicon.csv"
    silicon.write_table(table, silicon.convert(silicon.read_sample(FIXTURE)))
    monkeypatch.setattr(silicon_fit, "MIN_ROWS", 2)
    monkeypatch.setattr(silicon_fit, "FIT_EVALS", 100)
    monkeypatch.setattr(silicon_fit, "HELD_OUT_EVALS", 40)
    out = tmp_path / "out"
    assert main(["validate", "--table", str(table), "--fit", "--out", str(out), "--no-plots", "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "constants fitted on" in printed
    payload = json.loads((out / "validate.json").read_text())
    fits = payload["summary"]["architecture_fit"]
    assert fits and payload["fit"] == fits
    # --write (the shipped table only: here the fixture stands in for it) into a copy of the fit file
    fit_file = tmp_path / "roofline_fit.json"
    shipped = json.loads(rc.FIT_PATH.read_text())
    shutil.copy(rc.FIT_PATH, fit_file)
    monkeypatch.setattr(rc, "FIT_PATH", fit_file)
    monkeypatch.setattr(cmd, "default_silicon_path", lambda: table)
    monkeypatch.setattr(cmd, "record_defaults_error", lambda: None)  # the published table: its own test
    rc.read_fit.cache_clear()
    try:
        assert main(["validate", "--silicon", "--fit", "--write", "--out", str(tmp_path / "o2"), "--no-plots",
                     "-q", "--jobs", "1"]) == 0
        written = json.loads(fit_file.read_text())
        adopted = {a for a, f in fits.items() if f["adopted"]}
        assert set(written["per_architecture"]) == adopted
        assert set(written["fit"]["per_architecture"]["architectures"]) == set(fits)
        assert written["constants"] == shipped["constants"]  # the global set stays
        for arch, ids in written["inputs"]["per_architecture_rows"].items():
            assert len(ids) == fits[arch]["num_rows"]
    finally:
        monkeypatch.undo()
        rc.read_fit.cache_clear()
