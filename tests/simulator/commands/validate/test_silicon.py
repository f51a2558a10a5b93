"""AIConfigurator's silicon sample as a validation table: the converter, the method
classification, the plausibility flag, coverage counting, and ``kvplan validate --silicon``.

The fixture (tests/data/silicon/, Apache-2.0, copied from aiconfigurator-core 0.12.0) holds one
row of each kind the converter tells apart."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.cli import main
from simulator.commands.validate import report, silicon, silicon_run
from simulator.commands.validate.table import PublishedRow

FIXTURE = Path(__file__).resolve().parents[3] / "data" / "silicon" / "silicon_sample_rows.csv"
DB = "minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c64_cfg691"
EXPORT = "2026_04_06_minimax_m2_5_b200_sxm_vllm_fp8_agg_1024x1024_c64_tp4_ep4_1392"
GAP_CSV = "kimi_k2_5_gap_analysis_kimi_k2_5_gap_analysis_b200_sxm_vllm_fp4_agg_1024x1024_c4_tp4_ep4_3"
GAP_DB = "kimik2_5_b200_vllm_fp4_agg_1024x1024_c4_cfg635"
GAP_RUN = "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h200_sxm_sglang_agg_1000x100_c160_tp1_epnone_1"
DISAGG = "dsr1_gb200_trtllm_fp8_disagg_1024x8192_c2048_cfg375"
OVERCOUNT = "minimaxm2_5_b300_vllm_fp8_agg_1024x1024_c512_cfg734"


@pytest.fixture(scope="module")
def converted() -> dict[str, dict[str, str]]:
    rows = silicon.convert(silicon.read_sample(FIXTURE))
    return {r["row_id"]: r for r in rows}


def test_every_sample_row_gives_a_ttft_and_a_tpot_row_with_its_provenance(converted) -> None:
    raws = silicon.read_sample(FIXTURE)
    assert len(converted) == 2 * len(raws)
    for raw in raws:
        ttft, tpot = converted[f"{raw['id']}:ttft"], converted[f"{raw['id']}:tpot"]
        assert (ttft["metric"], tpot["metric"]) == ("ttft", "tpot")
        assert ttft["value"] == raw["silicon_ttft_ms"] and tpot["value"] == raw["silicon_tpot_ms"]
        assert ttft["aic_id"] == raw["id"] and ttft["aic_source"] == raw["silicon_data_source"]
        assert ttft["unit"] == "ms" and ttft["statistic"] == "mean" and ttft["load"] == "concurrency"


def test_kinds_methods_and_duplicates(converted) -> None:
    row = {k.rpartition(":")[0]: v for k, v in converted.items() if k.endswith(":ttft")}
    assert [row[i]["source"] for i in (DB, EXPORT, GAP_CSV, GAP_RUN)] == list(silicon.KINDS)
    assert row[DB]["method"] == row[EXPORT]["method"] == "inferencex"
    assert row[EXPORT]["duplicate_of"] == DB  # bit-identical TTFT and TPOT, same setup
    assert row[GAP_CSV]["duplicate_of"] == GAP_DB and row[GAP_CSV]["method"] == "inferencex"  # to 0.01 ms
    assert row[GAP_RUN]["method"] == "unknown" and row[GAP_RUN]["dataset"] == "unknown"
    assert row[DISAGG]["method"] == "inferencex-multinode" and row[DISAGG]["disagg_layout"].startswith("prefill")
    db = row[DB]
    assert db["load_value"] == "64" and db["num_prompts"] == "640" and db["dataset"] == "random"
    assert db["lengths"].startswith("uniform") and db["source_date"] == "2026-04-03"
    assert db["model"] == "MiniMaxAI/MiniMax-M2.5" and db["image"] == "vllm/vllm-openai:v0.19.0-cu130"


def test_the_adapters_tp_times_ep_overcount_is_undone(converted) -> None:
    row = converted[f"{OVERCOUNT}:ttft"]  # AIConfigurator: tp 4, attention_dp 4, moe_ep 16
    assert (row["tensor_parallel"], row["attention_dp"], row["moe_ep"]) == ("4", "1", "4")
    assert row["num_gpus"] == "4" and "counting TP × EP" in row["notes"]
    raw = next(r for r in silicon.read_sample(FIXTURE) if r["id"] == OVERCOUNT)
    assert silicon.inferencex_env(raw) == {"TP": "4", "EP_SIZE": "4", "DP_ATTENTION": "false", "CONC": "512",
                                           "ISL": "1024", "OSL": "1024"}
    # SGLang / TensorRT-LLM: tp 64 = TP 8 × EP 8 counted as GPUs; with attention DP, dp 64
    for tp, dp, dp_attn in (("64", "1", "false"), ("1", "64", "true")):
        legacy = {**raw, "backend": "trtllm", "tp_size": tp, "attention_dp_size": dp, "moe_tp_size": "8",
                  "moe_ep_size": "8"}
        layout = silicon.inferencex_layout(legacy)
        assert layout["gpus"] == 8 and layout["overcount"] and layout["env"]["DP_ATTENTION"] == dp_attn
        assert (layout["tp"], layout["dp"]) == ((8, 1) if dp_attn == "false" else (1, 8))
    real = {**raw, "backend": "sglang", "tp_size": "8", "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "8"}
    assert not silicon.inferencex_layout(real)["overcount"] and silicon.inferencex_layout(real)["gpus"] == 8


def test_the_written_table_reads_back_as_a_truth_table(tmp_path: Path) -> None:
    path = tmp_path / "silicon.csv"
    silicon.write_table(path, silicon.convert(silicon.read_sample(FIXTURE)))
    assert silicon.is_silicon_table(path)
    rows, extras = silicon.read_silicon(path)
    assert len(rows) == 18 and set(extras) == {r.row_id for r in rows}
    assert all(r.value > 0 and r.unit == "ms" for r in rows)


@pytest.mark.parametrize(("text", "expected"), [
    ("db-dump/2026-04-27; config_id=733; silicon_concurrency=128; measured=2026-04-17T00:00:00.000Z; "
     "workflow_run_id=758; vllm/vllm-openai:v0.19.0-cu130",
     {"config_id": "733", "silicon_concurrency": "128", "workflow_run_id": "758",
      "image": "vllm/vllm-openai:v0.19.0-cu130"}),
    ("source_file=2026-03-25.csv; model=MiniMax-M2.5; silicon_concurrency=16; wip=True; image=vllm/x:1",
     {"source_file": "2026-03-25.csv", "model": "MiniMax-M2.5", "wip": "True", "image": "vllm/x:1"}),
])
def test_provenance_is_parsed(text: str, expected: dict[str, str]) -> None:
    parsed = silicon.parse_provenance(text)
    assert parsed.items() >= expected.items()


@pytest.mark.parametrize(("kind", "mode", "dup", "method"), [
    ("inferencex-db", "agg", None, "inferencex"),
    ("inferencex-export", "disagg", None, "inferencex-multinode"),
    ("aic-gap-csv", "agg", "x", "inferencex"),  # a rounded copy of an InferenceX row
    ("aic-gap-csv", "agg", None, "unknown"),
    ("aic-gap-runs", "agg", None, "unknown"),
])
def test_method_classification(kind: str, mode: str, dup: str | None, method: str) -> None:
    assert silicon.method_of(kind, mode, dup, {"x": "inferencex-db"}) == method


def test_prefill_faster_than_the_dense_peak_is_implausible() -> None:
    # By hand: 2 × 8e9 active parameters × 1,000 tokens = 1.6e13 FLOP; in 10 ms that is
    # 1.6e15 FLOP/s, above one GPU's 1e15 peak; in 20 ms, 8e14: possible.
    bad, rate = silicon_run.prefill_rate_check(active_params=8e9, mean_prompt_tokens=1000, ttft_s=0.010,
                                               num_gpus=1, peak_flops_per_gpu=1e15)
    assert bad and rate == pytest.approx(1.6e15)
    ok, rate = silicon_run.prefill_rate_check(active_params=8e9, mean_prompt_tokens=1000, ttft_s=0.020,
                                              num_gpus=1, peak_flops_per_gpu=1e15)
    assert not ok and rate == pytest.approx(8e14)
    assert not silicon_run.prefill_rate_check(active_params=8e9, mean_prompt_tokens=1000, ttft_s=0.010,
                                              num_gpus=2, peak_flops_per_gpu=1e15)[0]


ROW = PublishedRow(
    row_id="r:ttft", source="inferencex-db", source_title="t", source_url="u", engine="vllm",
    engine_version="", model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100_sxm", tensor_parallel=1,
    num_gpus=1, weight_dtype="bf16", kv_cache_dtype="auto", input_tokens=8192, output_tokens=1024,
    dataset="random", load="concurrency", load_value=4, num_prompts=40, metric="ttft", statistic="mean",
    unit="ms", value=1.0, notes="")
EXTRA = {c: "" for c in silicon.EXTRA_COLUMNS} | {
    "aic_id": "r", "method": "inferencex", "mode": "agg", "served_model": "meta-llama/Llama-3.1-8B-Instruct",
    "aic_model_path": "meta-llama/Llama-3.1-8B-Instruct", "lengths": "uniform [0.8 L, L], ignore_eos",
    "attention_dp": "1", "moe_ep": "", "pipeline_parallel": "1"}


def test_plausibility_uses_the_catalogs() -> None:
    # 2 × ~8e9 × 0.9 × 8192 tokens in 1 ms ≈ 1.2e17 FLOP/s: far above one H100's ~2e15 dense peak
    assert silicon_run.plausibility(ROW, EXTRA).startswith("implausible")
    assert silicon_run.plausibility(dataclasses.replace(ROW, value=1000.0), EXTRA) == "ok"
    unknown = dataclasses.replace(ROW, gpu="x999_sxm")
    assert silicon_run.plausibility(unknown, EXTRA).startswith("not checked")


def test_coverage_counts_measurements_by_state_and_reason() -> None:
    entries = [
        ("a", "h100_sxm", "vllm", "Llama-3.1", "simulated"),
        ("a", "h100_sxm", "vllm", "Llama-3.1", "simulated"),  # its TPOT row: the same measurement
        ("b", "h100_sxm", "vllm", "Llama-3.1", "refused (silicon row b: max_model_len 9416 exceeds 2048 tokens)"),
        ("c", "h100_sxm", "vllm", "Llama-3.1", "not expressible: unknown GPU h100_sxm"),
        ("d", "b200_sxm", "trtllm", "DeepSeek-R1", "not expressible: engine trtllm not modelled (kvplan: vllm-v1)"),
        ("e", "b200_sxm", "trtllm", "DeepSeek-R1", "not expressible: engine trtllm not modelled (kvplan: vllm-v1)"),
        ("f", "b200_sxm", "trtllm", "DeepSeek-R1", "no request completed (4 too long)"),
    ]
    cells = report.coverage(entries)
    assert [(c["gpu"], c["engine"], c["family"]) for c in cells] == [
        ("b200_sxm", "trtllm", "DeepSeek-R1"), ("h100_sxm", "vllm", "Llama-3.1")]
    b200, h100 = cells
    assert (h100["measurements"], h100["simulated"], h100["refused"], h100["not_expressible"]) == (3, 1, 1, 1)
    assert h100["reasons"] == {"refused: max_model_len # exceeds # tokens": 1, "unknown GPU h100_sxm": 1}
    assert (b200["not_expressible"], b200["no_result"]) == (2, 1)
    assert b200["reasons"] == {"engine trtllm not modelled": 2, "no request completed": 1}
    total = report.coverage_totals(cells)
    assert total["measurements"] == 6 and total["simulated"] == 1


@pytest.mark.parametrize(("model", "family"), [
    ("nvidia/Llama-3.3-70B-Instruct-FP8", "Llama-3.3"), ("deepseek-ai/DeepSeek-R1-0528", "DeepSeek-R1"),
    ("nvidia/DeepSeek-R1-0528-FP4-V2", "DeepSeek-R1"), ("Qwen/Qwen3-235B-A22B-FP8", "Qwen3"),
    ("Qwen/Qwen3.5-397B-A17B-FP8", "Qwen3.5"), ("openai/gpt-oss-120b", "gpt-oss"),
    ("MiniMaxAI/MiniMax-M2.5", "MiniMax-M2.5"), ("nvidia/Kimi-K2.5-NVFP4", "Kimi-K2.5"),
])
def test_model_family(model: str, family: str) -> None:
    assert report.family_of(model) == family


def test_short_runs_are_weighted_as_the_ten_wave_run() -> None:
    assert silicon_run.wave_weights(10) == (1.0,) * 10
    assert silicon_run.wave_weights(4) == (1.0, 4.0, 4.0, 1.0)  # 1 + 8 + 1 waves
    # two clients, four waves: wave means 10, 2, 2, 4 -> (10 + 4·2 + 4·2 + 4) / 10 = 3
    values = np.array([10, 10, 2, 2, 2, 2, 4, 4], dtype=float)
    assert silicon_run.weighted_means(values, 2, (1.0, 4.0, 4.0, 1.0)) == pytest.approx(3.0)
    assert silicon_run.weighted_means(np.array([np.nan, 1.0]), 1, (1.0, 1.0)) == pytest.approx(1.0)


def _setup(**changes: object) -> silicon_run.SiliconSetup:
    row = dataclasses.replace(ROW, **{k: v for k, v in changes.items() if k in PublishedRow.__dataclass_fields__})
    extra = EXTRA | {k: str(v) for k, v in changes.items() if k in EXTRA}
    (setup,) = silicon_run.group([row], {row.row_id: extra})
    return setup


def test_an_inferencex_row_becomes_its_client_and_lengths() -> None:
    s = _setup(input_tokens=1024, output_tokens=1024, load_value=8)
    assert s.reason is None and s.scenario is not None
    w = s.scenario["workload"]
    assert w["prompt_tokens"] == {"dist": "uniform", "low": 819, "high": 1024}
    assert w["output_tokens"] == {"dist": "uniform", "low": 819, "high": 1024}
    # four waves first (weighted to ten; all ten when they are not steady), no warm-up: the
    # engine starts empty, as after InferenceX's drained warm-up
    assert s.waves == silicon_run.SHORT_WAVES and s.weights == (1.0, 4.0, 4.0, 1.0)
    assert w["concurrency"] == 8 and w["num_requests"] == 4 * 8 and "warmup_requests" not in w
    assert s.scenario["engine"] == "vllm-v1" and s.scenario["enable_prefix_caching"] is False
    unknown = _setup(method="unknown", lengths="not stated", load_value=8)
    assert unknown.scenario["workload"]["prompt_tokens"] == {"dist": "fixed", "value": 8192}
    assert unknown.weights[0] == 0.0  # steady state: the first wave left out


@pytest.mark.parametrize(("changes", "reason"), [
    ({"mode": "disagg"}, "disaggregated serving"),
    ({"gpu": "x999_sxm"}, "unknown GPU x999_sxm"),
    ({"engine": "lmdeploy"}, "engine lmdeploy not modelled"),
    ({"served_model": "acme/Nope-9B", "aic_model_path": "acme/Nope-9B", "model": "acme/Nope-9B"},
     "unknown model acme/Nope-9B"),
    ({"pipeline_parallel": "2"}, "pipeline parallel not modelled"),
    ({"load_value": None}, "concurrency of the run not stated"),
])
def test_rows_kvplan_cannot_express_say_why(changes: dict[str, object], reason: str) -> None:
    s = _setup(**changes)
    assert s.scenario is None and reason in (s.reason or "")


def test_engines_and_gpus_are_read_from_the_catalogs_at_run_time(monkeypatch) -> None:
    monkeypatch.setattr(silicon_run, "engines", lambda: ("vllm-v1", "sglang"))
    assert silicon_run.kvplan_engine("trtllm") is None
    monkeypatch.setattr(silicon_run, "engines", lambda: ("vllm-v1", "sglang", "trtllm"))
    assert silicon_run.kvplan_engine("trtllm") == "trtllm"
    assert silicon_run.find_gpu("h100_sxm").name == "H100-80GB"


def test_validate_silicon_writes_coverage_and_buckets(tmp_path: Path, capsys) -> None:
    table = tmp_path / "silicon.csv"
    silicon.write_table(table, silicon.convert(silicon.read_sample(FIXTURE)))
    out = tmp_path / "out"
    assert main(["validate", "--table", str(table), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "coverage" in printed and "rows by bucket" in printed
    summary = json.loads((out / "validate.json").read_text())["summary"]
    assert summary["num_rows"] == 18 and summary["num_measurements"] == 9
    assert summary["coverage_totals"]["measurements"] == 9
    assert summary["coverage_totals"]["reasons"].get(
        "disaggregated serving, multi-node Dynamo: not mapped") == 1
    assert set(summary["buckets"]) == {"established", "ambiguous", "method unknown", "implausible", "duplicate"}
    # the export's copy of a database row and the rounded gap-CSV copy: counted once
    assert summary["buckets"]["duplicate"]["num_rows"] == 4
    assert summary["buckets"]["method unknown"]["num_rows"] == 4  # the internal run, the multi-node one
    with (out / "validate.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"aic_id", "bucket", "plausibility", "fit"} <= set(rows[0])
    assert all(r["fit"] == ("yes" if r["bucket"] == "established" else "no") for r in rows)
    html = (out / "report.html").read_text()
    assert "Coverage" in html and "Rows reported apart" in html
    # the headline's errors are the established rows', and says how many of all rows ran
    est = summary["buckets"]["established"]
    assert f"{est['num_simulated']} of {est['num_rows']} rows whose method is established" in html
    assert "silicon sample against kvplan" in html
    largest = html.split('id="largest"', 1)[1].split("</section>", 1)[0]
    assert f"The {min(10, est['num_simulated'])} established rows furthest" in largest


def test_silicon_flags_are_one_line_errors(tmp_path: Path, capsys) -> None:
    assert main(["validate", "--silicon", "--write", "--out", str(tmp_path / "o")]) == 2
    assert "give --fit too" in capsys.readouterr().err
    assert main(["validate", "--silicon", "--jobs", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert main(["validate", "--silicon", "--table", "x.csv", "--out", str(tmp_path / "o")]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_the_default_run_reports_its_coverage_too(tmp_path: Path) -> None:
    assert main(["validate", "--source", "vllm-ci", "--out", str(tmp_path), "--no-plots", "-q"]) == 0
    summary = json.loads((tmp_path / "validate.json").read_text())["summary"]
    total = summary["coverage_totals"]
    assert total["measurements"] == summary["num_rows"] and total["simulated"] == summary["num_simulated"]
