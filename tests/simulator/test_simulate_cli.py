"""``kvplan simulate`` in-process: the files it writes, their determinism, and its one-line errors.

Bad input must give exit code 2 and exactly one line on stderr, ``kvplan: error: <what and
where>``, never a traceback.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from tests.simulator.test_metrics import KV_FIELDS, STATS, SUMMARY_FIELDS

ALLOCATORS = ["paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle"]
REQUEST_COLUMNS = [
    "allocator", "request_id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "n",
    "beam_width", "status", "reject_reason", "queue_delay_s", "ttft_s", "tpot_s", "e2e_s",
    "num_preemptions", "num_swaps", "prefix_hit_tokens", "readmission_hit_tokens",
]
STEP_COLUMNS = [
    "allocator", "replica", "step", "time_s", "duration_s", "num_prefill_seqs", "num_prefill_tokens",
    "num_decode_seqs", "num_running_seqs", "num_waiting", "num_preempted", "kv_token_state",
    "kv_reserved", "kv_internal_fragmentation", "kv_external_fragmentation", "kv_free",
    "kv_shared_saved", "num_steps",
]
KV_PARTS = ["kv_token_state", "kv_reserved", "kv_internal_fragmentation",
            "kv_external_fragmentation", "kv_free"]
PLOTS = ["kv_memory.png", "batch_size.png", "latency_cdf.png", "allocators.png"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REJECT_REASONS = ("max_model_len", "kv_capacity", "max_num_seqs")

# A small pool (64 usable blocks = 1,024 slots, one max_model_len request) and prompts up to
# 2,000 tokens: some requests exceed max_model_len and are rejected, and KV is tight enough that
# paged allocation preempts. The override is 65 blocks: vLLM V1 keeps one as its null block.
NUM_BLOCKS = 65
USABLE_BLOCKS = NUM_BLOCKS - 1  # vLLM's null block
SMALL = """\
name: small
seed: 3
model: llama-3.1-8b
gpu: h100-80gb
allocators: [paged, contiguous-max, contiguous-pow2, contiguous-oracle]
block_size: 16
max_model_len: 1024
max_num_seqs: 32
max_num_batched_tokens: 1024
num_gpu_blocks_override: 65
workload:
  num_requests: 1000
  arrival: {process: poisson, rate: 40}
  prompt_tokens: {dist: lognormal, mean: 150, p99: 1500, max: 2000}
  output_tokens: {dist: lognormal, mean: 40, p99: 300, max: 300}
"""


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["simulate", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """One run with every output, plots included."""
    folder = tmp_path_factory.mktemp("cli")
    scenario = write(folder, "small.yaml", SMALL)
    out = folder / "out"
    args = ["simulate", str(scenario), "--num-requests", "200", "--out", str(out), "--quiet"]
    assert main(args) == 0
    return out


# ----------------------------------------------------------------------------- outputs
def test_summary_has_every_field_for_every_allocator(full_run):
    summary = json.loads((full_run / "summary.json").read_text())
    assert list(summary) == ALLOCATORS
    for name, s in summary.items():
        assert set(s) == SUMMARY_FIELDS | {"max_model_len_policy", "saturated", "queue_growth_s_per_s"}, name
        policy = s["max_model_len_policy"]
        assert (policy["policy"], policy["max_model_len"]) == ("reject", 1024)
        assert policy["num_rejected"] == s["rejected_by_reason"].get("max_model_len", 0) > 0
        assert set(s["kv"]) == KV_FIELDS, name
        for key in ("queue_delay_s", "ttft_s", "tpot_s", "e2e_s"):
            assert set(s[key]) == STATS, (name, key)
        assert s["completed"] + s["rejected"] == 200
        assert s["rejected"] == sum(s["rejected_by_reason"].values())
        assert set(s["rejected_by_reason"]) <= set(REJECT_REASONS)
        parts = sum(s["kv"][p] for p in ("token_state", "reserved", "internal_fragmentation",
                                         "external_fragmentation", "free"))
        assert parts == pytest.approx(1.0, abs=1e-9)
        assert s["kv"]["kv_capacity_tokens"] == USABLE_BLOCKS * 16
        assert 0 < s["busy_fraction"] <= 1 + 1e-9
        assert s["ttft_s"]["p50"] <= s["ttft_s"]["p99"] <= s["e2e_s"]["p99"] + 1e-12
    assert summary["paged"]["rejected"] > 0  # prompts beyond max_model_len
    assert summary["paged"]["num_preemptions"] > 0


def test_requests_csv_accounts_for_every_request(full_run):
    req = pd.read_csv(full_run / "requests.csv", keep_default_na=False, na_values=[""])
    assert list(req.columns) == REQUEST_COLUMNS
    assert len(req) == 200 * len(ALLOCATORS)
    for name, rows in req.groupby("allocator", sort=False):
        assert sorted(rows.request_id) == list(range(200)), name
    assert set(req.status) == {"finished", "rejected"}
    finished, rejected = req[req.status == "finished"], req[req.status == "rejected"]
    assert rejected.reject_reason.map(lambda r: r.split(":")[0] in REJECT_REASONS).all()
    assert finished.reject_reason.isna().all()
    assert (finished.ttft_s > 0).all() and (finished.e2e_s >= finished.ttft_s).all()
    assert (finished.queue_delay_s >= 0).all()
    assert rejected[["queue_delay_s", "ttft_s", "e2e_s"]].isna().all().all()
    # every allocator saw the same requests; they differ only in what they did with them
    first = req[req.allocator == "paged"].reset_index(drop=True)
    for name in ALLOCATORS[1:]:
        other = req[req.allocator == name].reset_index(drop=True)
        cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "status"]
        assert first[cols].equals(other[cols]), name


def test_steps_csv_bins_conserve_the_pool_and_the_totals(full_run):
    """The default steps.csv: one row per second of simulated time (simulator/engine/steps.py)."""
    steps = pd.read_csv(full_run / "steps.csv")
    assert list(steps.columns) == STEP_COLUMNS
    assert np.allclose(steps[KV_PARTS].sum(axis=1), USABLE_BLOCKS * 16, rtol=1e-12)  # time-weighted means
    assert (steps[KV_PARTS] >= 0).all().all()
    assert list(steps.allocator.unique()) == ALLOCATORS
    summary = json.loads((full_run / "summary.json").read_text())
    for name, rows in steps.groupby("allocator"):
        s = summary[name]
        assert rows.num_steps.sum() == s["num_steps"]
        assert (rows.time_s.diff().dropna() > 0).all()  # one replica: one row per busy second
        assert (rows.time_s == np.floor(rows.time_s)).all()
        assert (rows.duration_s <= 1.0 + s["ttft_s"]["p99"]).all()  # busy seconds, one step may overhang
        busy = rows.duration_s.sum()
        # the summary's time-weighted means are the bins' means weighted by their busy seconds
        for part in KV_PARTS:
            share = (rows[part] * rows.duration_s).sum() / busy / (USABLE_BLOCKS * 16)
            assert share == pytest.approx(s["kv"][part.removeprefix("kv_")], rel=1e-9, abs=1e-12)


def test_steps_full_has_one_row_per_step(full_run, tmp_path):
    out = tmp_path / "full"
    args = [full_run.parent / "small.yaml", "--num-requests", "200", "--out", out, "--quiet",
            "--no-plots", "--steps", "full", "--allocator", "paged"]
    assert main(["simulate", *map(str, args)]) == 0
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps.columns) == STEP_COLUMNS
    assert (steps[KV_PARTS].sum(axis=1) == USABLE_BLOCKS * 16).all()
    assert (steps.num_steps == 1).all()
    summary = json.loads((out / "summary.json").read_text())["paged"]
    assert len(steps) == summary["num_steps"]
    assert steps.step.tolist() == list(range(len(steps)))
    assert (steps.time_s.diff().dropna() > 0).all()
    # the same run's summary as with the default bins: the totals do not depend on the rows
    binned = json.loads((full_run / "summary.json").read_text())["paged"]
    assert summary["num_steps"] == binned["num_steps"]
    assert summary["kv"] == pytest.approx(binned["kv"], rel=1e-9)


def test_run_json_records_the_inputs(full_run):
    run = json.loads((full_run / "run.json").read_text())
    assert run["num_requests"] == 200
    assert run["scenario"]["workload"]["num_requests"] == 200
    assert run["scenario"]["seed"] == 3
    assert run["deployment"]["kv_capacity_tokens"] == USABLE_BLOCKS * 16
    assert run["deployment"]["num_blocks"] == NUM_BLOCKS
    assert run["deployment"]["usable_blocks"] == USABLE_BLOCKS


def test_plots_are_written(full_run):
    for name in PLOTS:
        assert (full_run / name).read_bytes()[:8] == PNG_MAGIC, name


def test_same_scenario_and_seed_give_identical_files(full_run, tmp_path):
    again = tmp_path / "again"
    args = [full_run.parent / "small.yaml", "--num-requests", "200", "--out", again, "--quiet"]
    assert main(["simulate", *map(str, args)]) == 0
    names = sorted(p.name for p in full_run.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"summary.json", "requests.csv", "steps.csv", "run.json"} <= set(names)
    for name in names:
        assert (full_run / name).read_bytes() == (again / name).read_bytes(), name


def test_seed_changes_the_synthetic_workload(tmp_path, capsys):
    scenario = write(tmp_path, "small.yaml", SMALL)
    outs = []
    for seed in (1, 2):
        out = tmp_path / f"seed{seed}"
        rc, _, err = simulate(capsys, scenario, "--num-requests", 30, "--seed", seed, "--out", out,
                              "--quiet", "--no-plots", "--allocator", "paged")
        assert rc == 0, err
        outs.append((out / "requests.csv").read_bytes())
    assert outs[0] != outs[1]


def test_table_on_stdout_without_quiet(tmp_path, capsys):
    scenario = write(tmp_path, "small.yaml", SMALL)
    out = tmp_path / "out"
    rc, stdout, err = simulate(capsys, scenario, "--num-requests", 20, "--out", out, "--no-plots",
                               "--allocator", "paged", "--allocator", "max")
    assert rc == 0 and err == ""
    assert "paged" in stdout and f"results in {out}" in stdout.replace("\n", "")
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["paged", "contiguous-max"]


# ----------------------------------------------------------------------------- bad input
def check_error(capsys, expected: str, *args) -> None:
    rc, out, err = simulate(capsys, *args)
    assert rc == 2, err
    assert "Traceback" not in err
    assert err == f"kvplan: error: {expected}\n"
    assert out == ""


def scenario_with(tmp_path: Path, old: str, new: str, name: str = "s.yaml") -> Path:
    assert old in SMALL
    return write(tmp_path, name, SMALL.replace(old, new, 1))


def test_unknown_key_suggests_the_near_name(tmp_path, capsys):
    path = scenario_with(tmp_path, "block_size: 16", "blok_size: 16")
    check_error(capsys, f"{path}: unknown key 'blok_size' — did you mean 'block_size'?", path)


def test_unknown_nested_key(tmp_path, capsys):
    path = scenario_with(tmp_path, "  num_requests: 1000", "  num_request: 1000")
    check_error(capsys, f"{path}: unknown key 'workload.num_request' — did you mean 'num_requests'?", path)


def test_wrong_type(tmp_path, capsys):
    path = scenario_with(tmp_path, "max_num_seqs: 32", "max_num_seqs: lots")
    check_error(capsys, f"{path}: max_num_seqs: Input should be a valid integer, unable to parse "
                        "string as an integer", path)


def test_out_of_range_value(tmp_path, capsys):
    path = scenario_with(tmp_path, "block_size: 16", "block_size: 0")
    check_error(capsys, f"{path}: block_size: Input should be greater than or equal to 1", path)


@pytest.mark.parametrize("flag,value,shown", [("--rate", "-1", "-1.0"), ("--rate", "0", "0.0"),
                                              ("--rate", "nan", "nan"), ("--num-requests", "0", "0"),
                                              ("--step-bin-s", "0", "0.0"),
                                              ("--step-bin-s", "nan", "nan")])
def test_non_positive_flags(tmp_path, capsys, flag, value, shown):
    path = write(tmp_path, "s.yaml", SMALL)
    check_error(capsys, f"{flag} must be positive, got {shown}", path, flag, value)


def test_infinite_step_bins(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", SMALL)
    check_error(capsys, "--step-bin-s must be a finite number of seconds, got inf", path,
                "--step-bin-s", "inf")


def test_set_without_value(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", SMALL)
    check_error(capsys, "--set expects KEY=VALUE, got 'block_size'", path, "--set", "block_size")


def test_unknown_allocator_flag(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", SMALL)
    check_error(capsys, "unknown allocator 'pagd' — did you mean 'paged'?", path, "--allocator", "pagd")


def test_unknown_allocator_in_the_scenario(tmp_path, capsys):
    path = scenario_with(tmp_path, "contiguous-oracle]", "contiguous-oracel]")
    check_error(capsys, f"{path}: allocators: unknown allocator 'contiguous-oracel' — did you mean "
                        "'contiguous-oracle'?", path)


@pytest.mark.parametrize("key,old,new,message", [
    ("model", "model: llama-3.1-8b", "model: llama-3.1-9b",
     "unknown model 'llama-3.1-9b' — did you mean 'llama-3.1-8b'?"),
    ("gpu", "gpu: h100-80gb", "gpu: h100-90gb", "unknown GPU 'h100-90gb' — did you mean 'H100-80GB'?"),
], ids=["model", "gpu"])
def test_unknown_catalog_names_say_where(tmp_path, capsys, key, old, new, message):
    """Like every other scenario error, the line names the file and the key."""
    path = scenario_with(tmp_path, old, new)
    rc, out, err = simulate(capsys, path)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1
    assert err.startswith(f"kvplan: error: {path}: {key}: {message}"), err


def test_missing_scenario_file(tmp_path, capsys):
    path = tmp_path / "nope.yaml"
    check_error(capsys, f"{path}: no such scenario file", path)


def test_yaml_syntax_error_names_the_line(tmp_path, capsys):
    path = scenario_with(tmp_path, "max_num_seqs: 32", "max_num_seqs: 32: 4")
    line = SMALL.splitlines().index("max_num_seqs: 32") + 1
    check_error(capsys, f"{path}:{line}: not valid YAML (mapping values are not allowed here)", path)


TRACE_SCENARIO = """\
model: llama-3.1-8b
gpu: h100-80gb
num_gpu_blocks_override: 64
workload:
  trace: {trace}
"""


@pytest.mark.parametrize("rows,message", [
    ("0.0,10,5\n0.5,abc,10\n", "{trace}:3: prompt_tokens 'abc' is not an integer"),
    ("0.0,10,5\n0.5,10\n", "{trace}:3: expected 3 fields, got 2"),
    ("0.0,10,5\n1.0,10,10\n0.5,3,3\n",
     "{trace}:4: timestamp goes backwards (0.5 < 1.0); sort the trace first"),
    ("0.0,10,0\n", "{trace}:2: output_tokens must be at least 1 (got 0): every request generates a token"),
], ids=["not-an-integer", "short-row", "unsorted", "zero-output"])
def test_bad_trace_rows(tmp_path, capsys, rows, message):
    trace = write(tmp_path, "trace.csv", "arrival_s,prompt_tokens,output_tokens\n" + rows)
    path = write(tmp_path, "s.yaml", TRACE_SCENARIO.format(trace="trace.csv"))
    check_error(capsys, "workload: " + message.format(trace=trace), path)


def test_missing_trace_file(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", TRACE_SCENARIO.format(trace="nope.csv"))
    looked = tmp_path / "nope.csv"
    check_error(capsys, f"workload: trace file 'nope.csv' not found (looked for {looked})", path)


def test_a_good_trace_runs(tmp_path, capsys):
    write(tmp_path, "trace.csv", "arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,3\n0.5,7,1\n")
    path = write(tmp_path, "s.yaml", TRACE_SCENARIO.format(trace="trace.csv"))
    rc, _, err = simulate(capsys, path, "--out", tmp_path / "out", "--quiet", "--no-plots")
    assert rc == 0, err
    req = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert req.status.tolist() == ["finished"] * 3
    assert req.arrival_s.tolist() == [0.0, 0.5, 0.5]


PROFILE = """\
kvplan_profile: 1
model: llama-2-7b
tensor_parallel: 1
kv_cache_dtype: bfloat16
block_size: 16
device: NVIDIA H100
gpu: H100-80GB
latency_model:
  form: linear-v1
  coefficients_s: {const: 4.0e-3, prefill_tokens: 6.0e-5, decode_seqs: 2.0e-5,
                   decode_context_tokens: 2.0e-8}
"""
PROFILE_SCENARIO = """\
model: llama-3.1-8b
gpu: h100-80gb
num_gpu_blocks_override: 64
latency: {model: profile, profile: profile.yaml}
workload:
  num_requests: 20
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 50}
  output_tokens: {dist: fixed, value: 10}
"""


def test_profile_for_another_model_is_refused_unless_forced(tmp_path, capsys):
    profile = write(tmp_path, "profile.yaml", PROFILE)
    path = write(tmp_path, "s.yaml", PROFILE_SCENARIO)
    check_error(capsys, f"{profile}: profile measured for model llama-2-7b, but the scenario asks for "
                        "Llama-3.1-8B; use a matching profile (kvplan calibrate) or pass --force", path)
    rc, _, err = simulate(capsys, path, "--force", "--out", tmp_path / "out", "--quiet", "--no-plots")
    assert rc == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    s = summary["paged"]
    assert s["completed"] == 20
    # the profile's linear model: a 10-token output's decode steps cost const + decode terms
    tpot = s["tpot_s"]["p50"]
    assert 4.0e-3 + 2.0e-5 < tpot < 4.0e-3 + 2.0e-5 + 2.0e-8 * 60 + 1e-9
    assert not math.isnan(tpot)


# --- start-up: what building the parser imports ------------------------------------------------

HEAVY_MODULES = ("pandas", "matplotlib", "simpy", "torch", "scipy")
ROOT = Path(__file__).resolve().parents[2]


def test_building_the_parser_imports_no_command_implementation():
    """``kvplan --help`` builds the whole parser (simulator/cli.py's docstring): it must not import a
    command's implementation, nor the libraries that only running one needs. A fresh interpreter
    is the only honest place to look (this one has imported everything already)."""
    code = ("import sys; from simulator.cli import build_parser; build_parser(); "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY_MODULES!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_simulate_without_plots_does_not_import_matplotlib(tmp_path):
    scenario = PROFILE_SCENARIO.replace("latency: {model: profile, profile: profile.yaml}\n", "")
    path = write(tmp_path, "s.yaml", scenario)
    argv = ["simulate", str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]
    code = f"import sys; from simulator.cli import main; rc = main({argv!r}); print(rc, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]
