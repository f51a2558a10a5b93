"""AIConfigurator's silicon sample as a validation table (``validation/silicon.csv``).

``aiconfigurator-core`` 0.12.0 (Apache-2.0) ships ``aiconfigurator_core/systems/silicon_sample.csv``:
5,221 measured TTFT / TPOT pairs (H100, H200, B200, B300, GB200, GB300 × vLLM, SGLang,
TensorRT-LLM × aggregated and disaggregated serving). :func:`convert` turns each of its rows
into two rows of kvplan's truth-table format (:mod:`simulator.commands.validate.table`): the
TTFT and the TPOT, ``row_id`` ``<aic id>:ttft`` / ``<aic id>:tpot``, with the sample's
provenance kept per row (its ``id`` and ``silicon_data_source``) and what is known of the way
each was measured. ``validation/silicon_convert.py`` regenerates the table from the wheel's
CSV; ``validation/SOURCES.md`` ("silicon") says what each kind of row measured and why.

Kinds of rows (``source``), read off ``silicon_data_source``:

* ``inferencex-db``: ``db-dump/2026-04-27; config_id=…; workflow_run_id=…; <image>`` — a dump
  of the InferenceX results database (SemiAnalysisAI/InferenceX; its ``benchmark_results`` /
  ``configs`` / ``workflow_runs`` tables, docs/results-and-ingestion.md).
* ``inferencex-export``: ``source_file=2026-04-06.csv`` / ``2026-03-25.csv`` — exports of the same
  database: 663 of their rows carry TTFT and TPOT bit-identical to a db-dump row of the same
  setup and date (:func:`mark_duplicates` finds them), and they have InferenceX's models, its
  three sequence lengths (1k/1k, 1k/8k, 8k/1k) and its images.
* ``aic-gap-csv``: ``source_file=kimi-k2.5-gap-analysis.csv`` / ``qwen3.5-397b-gap-analysis.csv``
  — the same InferenceX numbers rounded to 0.01 ms where they match one (then ``duplicate_of``
  names it); the rest of unknown origin.
* ``aic-gap-runs``: ``source_file=/Users/…/aic-auto-gap-analysis/data/<system>/<backend>/<ver>/…``
  — AIConfigurator's own runs (internal cluster job ids, Dynamo runtime images); no public
  script says how they were measured.

``method`` is ``inferencex`` where the measuring script is InferenceX's single-node benchmark
(``benchmarks/benchmark_lib.sh`` ``run_benchmark_serving``: closed loop of ``--max-concurrency``
clients, 10 × concurrency prompts, random lengths uniform on [0.8 L, L], ``--ignore-eos``;
the mean TTFT and mean TPOT), ``inferencex-multinode`` for InferenceX's disaggregated runs (their
client lives in srt-slurm, not read), ``unknown`` otherwise. ``ambiguous`` says why a row whose
method is known may still not be what it seems (a speculative-decoding variant of its config
ran at the time; another measurement of the same setup the same day differs).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.commands.validate.table import COLUMNS, PublishedRow, read_table

WHEEL = "aiconfigurator-core==0.12.0"
SAMPLE_PATH = "aiconfigurator_core/systems/silicon_sample.csv"
SOURCE_TITLE = "AIConfigurator silicon sample (aiconfigurator-core 0.12.0, systems/silicon_sample.csv)"
SOURCE_URL = "https://pypi.org/project/aiconfigurator-core/0.12.0/"
# What validate needs beyond the truth-table columns; the converter writes them after COLUMNS.
EXTRA_COLUMNS: tuple[str, ...] = (
    "aic_id", "aic_source", "method", "ambiguous", "duplicate_of", "mode", "aic_model_path",
    "served_model", "image", "measured", "attention_dp", "moe_tp", "moe_ep", "pipeline_parallel",
    "aic_batch_size", "disagg_layout", "lengths", "engine_flags", "recipe",
)
SILICON_COLUMNS: tuple[str, ...] = COLUMNS + EXTRA_COLUMNS
KINDS = ("inferencex-db", "inferencex-export", "aic-gap-csv", "aic-gap-runs")
METHODS = ("inferencex", "inferencex-multinode", "unknown")

# InferenceX names (.github/configs/nvidia-master.yaml ``model-prefix`` and runners) of the
# sample's models and systems. AIConfigurator's own adapter (aiconfigurator/sdk/config_adapter/
# inferencex.py MODEL_PATHS) maps InferenceX's dsr1 to deepseek-ai/DeepSeek-V3 and llama70b to
# Llama-3.1-70B: architecture stand-ins, not the checkpoints served (:data:`SERVED`).
PREFIX_BY_MODEL = {
    "deepseek-ai/DeepSeek-R1": "dsr1", "deepseek-ai/DeepSeek-V3": "dsr1",
    "openai/gpt-oss-120b": "gptoss", "meta-llama/Llama-3.1-70B": "70b",
    "MiniMaxAI/MiniMax-M2.5": "minimaxm2.5", "Qwen/Qwen3.5-397B-A17B": "qwen3.5",
    "moonshotai/Kimi-K2.5": "kimik2.5", "zhipuai/GLM-5": "glm5",
}
HARDWARE_BY_SYSTEM = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300",
                      "gb200": "gb200", "gb300": "gb300"}
# The checkpoint InferenceX served for (prefix, precision), when its config file at the row's
# date is not at hand (validation/inferencex_recipes.csv has the one read per row): the
# ``model:`` of nvidia-master.yaml (2025-11 … 2026-04) and, for Llama 70B (removed 2025-10-29),
# .github/workflows/70b-tmpl.yml at b13bcafe (2025-10-14).
SERVED = {
    ("dsr1", "fp8"): "deepseek-ai/DeepSeek-R1-0528", ("dsr1", "fp4"): "nvidia/DeepSeek-R1-0528-FP4-V2",
    ("gptoss", "fp4"): "openai/gpt-oss-120b",
    ("70b", "fp8"): "nvidia/Llama-3.3-70B-Instruct-FP8", ("70b", "fp4"): "nvidia/Llama-3.3-70B-Instruct-FP4",
    ("minimaxm2.5", "fp8"): "MiniMaxAI/MiniMax-M2.5", ("minimaxm2.5", "fp4"): "nvidia/MiniMax-M2.5-NVFP4",
    ("qwen3.5", "bf16"): "Qwen/Qwen3.5-397B-A17B", ("qwen3.5", "fp8"): "Qwen/Qwen3.5-397B-A17B-FP8",
    ("qwen3.5", "fp4"): "nvidia/Qwen3.5-397B-A17B-NVFP4",
    ("kimik2.5", "int4"): "moonshotai/Kimi-K2.5", ("kimik2.5", "fp4"): "nvidia/Kimi-K2.5-NVFP4",
    ("glm5", "fp8"): "zai-org/GLM-5-FP8", ("glm5", "fp4"): "nvidia/GLM-5-NVFP4",
}
INFERENCEX_NUM_PROMPTS_PER_CLIENT = 10  # run_benchmark_serving --num-prompts $((CONC * 10))
INFERENCEX_RANGE_RATIO = 0.8  # benchmark-tmpl.yml RANDOM_RANGE_RATIO: 0.8
INFERENCEX_WARMUP_FROM = "2026-01-21"  # InferenceX #480 (d053ae24): --num-warmups $((2 * CONC))
_ROUNDED_TOLERANCE_MS = 0.0051  # the gap CSVs round to 0.01 ms


def parse_provenance(text: str) -> dict[str, str]:
    """``silicon_data_source`` as a mapping: ``key=value`` parts by key, the first part under
    ``origin``, a bare image reference (``vllm/vllm-openai:v0.19.0``) under ``image``."""
    parts = [p.strip() for p in (text or "").split(";") if p.strip()]
    out: dict[str, str] = {}
    for i, part in enumerate(parts):
        key, eq, value = part.partition("=")
        if i == 0:
            out["origin"] = part
            if eq:
                out[key.strip()] = value.strip()
        elif eq and re.fullmatch(r"[a-z_]+", key.strip()):
            out[key.strip()] = value.strip()
        else:
            out.setdefault("image", part)
    return out


def kind_of(provenance: Mapping[str, str]) -> str:
    origin = provenance.get("origin", "")
    if origin.startswith("db-dump/"):
        return "inferencex-db"
    source_file = provenance.get("source_file", "")
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}\.csv", source_file):
        return "inferencex-export"
    if "/" not in source_file and source_file.endswith("gap-analysis.csv"):
        return "aic-gap-csv"
    return "aic-gap-runs"


def _num(raw: Mapping[str, str], key: str) -> float | None:
    text = (raw.get(key) or "").strip()
    if not text:
        return None
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _int(raw: Mapping[str, str], key: str) -> int | None:
    x = _num(raw, key)
    return None if x is None else int(x)


def setup_fields(raw: Mapping[str, str]) -> tuple[object, ...]:
    """What one measurement is of: backend, system, precision, mode, lengths, concurrency and
    the parallel layout (agg and disagg columns) — rows equal in it measured the same thing."""
    prov = parse_provenance(raw.get("silicon_data_source", ""))
    if raw.get("backend") == "vllm" and raw.get("mode") == "agg":
        # TP and whether EP is on: AIConfigurator's attention_dp_size / moe_ep_size for vLLM
        # depend on how its adapter counted GPUs (inferencex_env), not on the run
        layout: tuple[object, ...] = (_int(raw, "tp_size"), _int(raw, "pp_size") or 1,
                                      (_int(raw, "moe_ep_size") or 1) > 1)
        return (raw.get("backend"), raw.get("system"), raw.get("precision"), raw.get("mode"),
                raw.get("isl"), raw.get("osl"), prov.get("silicon_concurrency"), *layout)
    layout = tuple(_int(raw, k) for k in (
        "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
        "prefill_num_workers", "prefill_tp_size", "prefill_attention_dp_size", "prefill_moe_ep_size",
        "decode_num_workers", "decode_tp_size", "decode_attention_dp_size", "decode_moe_ep_size"))
    return (raw.get("backend"), raw.get("system"), raw.get("precision"), raw.get("mode"),
            raw.get("isl"), raw.get("osl"), prov.get("silicon_concurrency"), *layout)


def mark_duplicates(raws: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """``{aic id: id of the row it repeats}``: rows of the same backend, system, precision, mode,
    lengths and concurrency whose TTFT and TPOT are the same floats (the exports repeat the
    database's numbers bit for bit, whatever layout columns AIConfigurator's adapter wrote for
    them), or the same to 0.01 ms with the same layout (:func:`inferencex_layout` for agg rows:
    the gap CSVs round the database's numbers).
    The one kept is the first of its kind in the order db-dump, export, gap CSV, gap runs, then
    sample order; its copies are reported, not counted twice."""
    order = {k: i for i, k in enumerate(KINDS)}
    ranked = sorted(range(len(raws)), key=lambda i: (order[kind_of(parse_provenance(
        raws[i].get("silicon_data_source", "")))], i))
    kept: dict[tuple[object, ...], list[tuple[str, float, float, tuple[object, ...]]]] = defaultdict(list)
    out: dict[str, str] = {}
    for i in ranked:
        raw = raws[i]
        ttft, tpot = _num(raw, "silicon_ttft_ms"), _num(raw, "silicon_tpot_ms")
        if ttft is None or tpot is None:
            continue
        fields = setup_fields(raw)
        key, layout = fields[:7], fields[7:]
        if raw.get("mode") == "agg":  # as the run was laid out, whichever way the adapter wrote it
            lay = inferencex_layout(raw)
            layout = (lay["tp"], lay["dp"], lay["moe_ep"])
        rounded = _is_rounded(ttft) and _is_rounded(tpot)
        for other, a, b, other_layout in kept[key]:
            if a == ttft and b == tpot:
                out[raw["id"]] = other
                break
            if ((rounded or (_is_rounded(a) and _is_rounded(b))) and layout == other_layout
                    and abs(a - ttft) <= _ROUNDED_TOLERANCE_MS and abs(b - tpot) <= _ROUNDED_TOLERANCE_MS):
                out[raw["id"]] = other
                break
        else:
            kept[key].append((raw["id"], ttft, tpot, layout))
    return out


def _is_rounded(x: float) -> bool:
    return abs(x * 100 - round(x * 100)) < 1e-6


def same_day_conflicts(raws: Sequence[Mapping[str, str]], duplicates: Mapping[str, str]) -> set[str]:
    """Ids of rows whose setup was measured again on the same day (same image) with a TPOT or
    TTFT more than 10% apart: the sample does not record what told the runs apart (speculative
    decoding, a flag), so neither is what its columns say for sure."""
    groups: dict[tuple[object, ...], list[Mapping[str, str]]] = defaultdict(list)
    for raw in raws:
        if raw["id"] in duplicates:
            continue
        prov = parse_provenance(raw.get("silicon_data_source", ""))
        day = (prov.get("measured") or "")[:10]
        if not day:
            continue
        groups[(*setup_fields(raw), day, prov.get("image", ""))].append(raw)
    out: set[str] = set()
    for rows in groups.values():
        if len(rows) < 2:
            continue
        ttfts = [_num(r, "silicon_ttft_ms") or 0.0 for r in rows]
        tpots = [_num(r, "silicon_tpot_ms") or 0.0 for r in rows]
        if max(tpots) > 1.1 * min(tpots) or max(ttfts) > 1.1 * min(ttfts):
            out.update(r["id"] for r in rows)
    return out


SINGLE_NODE_GPUS = 8  # InferenceX's single-node runners: one 8-GPU HGX/DGX node


def method_of(kind: str, mode: str, duplicate_of: str | None, kinds_by_id: Mapping[str, str],
              single_node: bool = True) -> str:
    """How the row was measured, as far as it can be established (module docstring). An agg
    row that cannot have run on one node (``single_node`` False: a GB200/GB300 system, whose
    InferenceX runs are all multi-node, or more GPUs than a node has) is a multi-node run."""
    inferencex = kind in ("inferencex-db", "inferencex-export") or (
        kind == "aic-gap-csv" and bool(duplicate_of) and kinds_by_id.get(duplicate_of or "", "").startswith("inferencex"))
    if not inferencex:
        return "unknown"
    return "inferencex" if mode == "agg" and single_node else "inferencex-multinode"


def is_single_node(raw: Mapping[str, str]) -> bool:
    if raw.get("system") in ("gb200", "gb300"):
        return False
    return inferencex_layout(raw)["gpus"] <= SINGLE_NODE_GPUS


def weight_dtype_of(raw: Mapping[str, str]) -> str:
    """The row's weights as the truth table names them: fp8, nvfp4, mxfp4 (gpt-oss's own
    checkpoint, which AIConfigurator calls fp4/nvfp4), bf16, int4, or auto when not stated."""
    precision = (raw.get("precision") or "").strip().lower()
    if precision == "fp4":
        return "mxfp4" if "gpt-oss" in raw.get("model_path", "") else "nvfp4"
    return {"fp8": "fp8", "bf16": "bf16", "int4": "int4"}.get(precision, "auto")


def inferencex_names(raw: Mapping[str, str]) -> tuple[str | None, str | None, str]:
    """(model prefix, hardware, framework) of the row in InferenceX's vocabulary."""
    framework = {"trtllm": "trt"}.get(raw.get("backend", ""), raw.get("backend", ""))
    return PREFIX_BY_MODEL.get(raw.get("model_path", "")), HARDWARE_BY_SYSTEM.get(raw.get("system", "")), framework


def inferencex_layout(raw: Mapping[str, str]) -> dict[str, Any]:
    """The single-node layout InferenceX ran an agg row with, recovered from AIConfigurator's
    columns by inverting its adapter (aiconfigurator/sdk/config_adapter/inferencex.py
    ``_worker``), which for some rows counted TP × EP GPUs where InferenceX ran TP:

    * vLLM: TP is ``tp_size``, expert parallel on when ``moe_ep_size`` > 1; AIConfigurator's
      attention_dp_size is then GPUs ÷ TP of that over-count, not a data-parallel layout —
      InferenceX's vLLM scripts pass ``--data-parallel-size=1`` or none.
    * SGLang / TensorRT-LLM: ``moe_tp_size`` × ``moe_ep_size`` = ``tp_size`` × ``attention_dp_size``
      with both MoE factors above 1 is the over-count (``tp 64, moe_tp 8, moe_ep 8`` for a TP 8,
      EP 8 run): TP is ``moe_tp_size``, EP ``moe_ep_size``. Otherwise the columns are the run's.

    Returns tp (attention TP), dp (attention DP ranks), moe_tp, moe_ep, gpus, the script's
    environment (TP, EP_SIZE, DP_ATTENTION) and whether the over-count was undone."""
    tp, dp = _int(raw, "tp_size") or 1, _int(raw, "attention_dp_size") or 1
    moe_tp, moe_ep = _int(raw, "moe_tp_size") or 1, _int(raw, "moe_ep_size") or 1
    if raw.get("backend") == "vllm":
        ep_on = moe_ep > 1
        return {"tp": tp, "dp": 1, "moe_tp": 1 if ep_on else tp, "moe_ep": tp if ep_on else 1, "gpus": tp,
                "env": {"TP": str(tp), "EP_SIZE": str(tp if ep_on else 1), "DP_ATTENTION": "false"},
                "overcount": dp > 1}
    overcount = moe_tp > 1 and moe_ep > 1 and moe_tp * moe_ep == tp * dp
    if overcount:
        gpus, ep = moe_tp, moe_ep
        dp_attn = dp > 1
        tp, dp = (1, gpus) if dp_attn else (gpus, 1)
        moe_tp = max(1, gpus // ep)
        return {"tp": tp, "dp": dp, "moe_tp": moe_tp, "moe_ep": ep, "gpus": gpus,
                "env": {"TP": str(gpus), "EP_SIZE": str(ep), "DP_ATTENTION": str(dp_attn).lower()},
                "overcount": True}
    gpus = tp * dp
    return {"tp": tp, "dp": dp, "moe_tp": moe_tp, "moe_ep": moe_ep, "gpus": gpus,
            "env": {"TP": str(gpus), "EP_SIZE": str(moe_ep), "DP_ATTENTION": str(dp > 1).lower()},
            "overcount": False}


def inferencex_env(raw: Mapping[str, str]) -> dict[str, str] | None:
    """The environment InferenceX's single-node script ran the row with (TP, EP_SIZE,
    DP_ATTENTION, CONC, ISL, OSL: :func:`inferencex_layout`). None for disagg rows and rows
    without a concurrency."""
    if raw.get("mode") != "agg":
        return None
    conc = parse_provenance(raw.get("silicon_data_source", "")).get("silicon_concurrency")
    if not conc:
        return None
    return {**inferencex_layout(raw)["env"], "CONC": conc, "ISL": raw["isl"], "OSL": raw["osl"]}


def convert(raws: Sequence[Mapping[str, str]], recipes: Mapping[str, Mapping[str, str]] | None = None
            ) -> list[dict[str, str]]:
    """The silicon table's rows (``SILICON_COLUMNS``) for the sample's rows ``raws`` (dicts of
    its CSV), two per row. ``recipes`` (validation/inferencex_recipes.csv by aic id) adds the
    InferenceX script each row ran, the checkpoint it served and its engine flags."""
    recipes = recipes or {}
    duplicates = mark_duplicates(raws)
    conflicts = same_day_conflicts(raws, duplicates)
    kinds = {r["id"]: kind_of(parse_provenance(r.get("silicon_data_source", ""))) for r in raws}
    out: list[dict[str, str]] = []
    for raw in raws:
        aic_id = raw["id"]
        prov = parse_provenance(raw.get("silicon_data_source", ""))
        kind = kinds[aic_id]
        mode = raw.get("mode", "")
        dup = duplicates.get(aic_id)
        method = method_of(kind, mode, dup, kinds, single_node=mode != "agg" or is_single_node(raw))
        recipe = recipes.get(aic_id, {})
        ambiguous = [a for a in (recipe.get("ambiguous", ""),) if a]
        if aic_id in conflicts:
            ambiguous.append("the same setup measured again the same day differs by more than 10%")
        if prov.get("wip") == "True":
            ambiguous.append("wip run (InferenceX work in progress: a branch's script, not main's)")
        prefix, _, _ = inferencex_names(raw)
        served = recipe.get("served_model") or (
            SERVED.get((prefix, (raw.get("precision") or "").lower())) if method.startswith("inferencex")
            else None) or raw.get("model_path", "")
        conc = prov.get("silicon_concurrency", "")
        tp, dp, pp = _int(raw, "tp_size"), _int(raw, "attention_dp_size"), _int(raw, "pp_size")
        moe_tp, moe_ep = _int(raw, "moe_tp_size"), _int(raw, "moe_ep_size")
        layout = inferencex_layout(raw) if method == "inferencex" else None
        if layout is not None:
            tp, dp, moe_tp, moe_ep = layout["tp"], layout["dp"], layout["moe_tp"], layout["moe_ep"]
        disagg = ""
        if mode == "disagg":
            tp = _int(raw, "decode_tp_size") or 1
            dp = _int(raw, "decode_attention_dp_size") or 1
            disagg = (f"prefill {raw.get('prefill_num_workers') or '?'} × (TP {raw.get('prefill_tp_size') or '?'}"
                      f" DP {raw.get('prefill_attention_dp_size') or '?'} EP {raw.get('prefill_moe_ep_size') or '?'}),"
                      f" decode {raw.get('decode_num_workers') or '?'} × (TP {raw.get('decode_tp_size') or '?'}"
                      f" DP {raw.get('decode_attention_dp_size') or '?'} EP {raw.get('decode_moe_ep_size') or '?'})")
        tp = tp or 1
        gpus = tp * max(dp or 1, 1) * max(pp or 1, 1)
        flags = recipe.get("engine_flags", "")
        kv = _kv_dtype(flags)
        lengths = (f"uniform [{INFERENCEX_RANGE_RATIO} L, L], ignore_eos" if method == "inferencex"
                   else "not stated (fixed assumed)")
        measured = (prov.get("measured") or "")[:10]
        notes = _notes(raw, prov, kind, method, dup, ambiguous, measured, bool(layout and layout["overcount"]))
        base = {
            "source": kind, "source_title": SOURCE_TITLE, "source_url": SOURCE_URL,
            "source_date": measured or "unknown", "engine": raw.get("backend", ""),
            "engine_version": raw.get("backend_version", "") or _image_version(prov.get("image", "")),
            "model": served, "gpu": raw.get("system", ""), "tensor_parallel": str(tp),
            "num_gpus": str(gpus), "weight_dtype": weight_dtype_of(raw), "kv_cache_dtype": kv,
            "input_tokens": raw.get("isl", ""), "output_tokens": raw.get("osl", ""),
            "dataset": "random" if method == "inferencex" else "unknown", "load": "concurrency",
            "load_value": conc,
            "num_prompts": str(INFERENCEX_NUM_PROMPTS_PER_CLIENT * int(conc)) if conc and method == "inferencex" else "",
            "statistic": "mean", "unit": "ms", "notes": notes,
            "aic_id": aic_id, "aic_source": raw.get("silicon_data_source", ""), "method": method,
            "ambiguous": "; ".join(ambiguous), "duplicate_of": dup or "", "mode": mode,
            "aic_model_path": raw.get("model_path", ""), "served_model": served,
            "image": prov.get("image", ""), "measured": measured,
            "attention_dp": str(dp or 1), "moe_tp": str(moe_tp or ""),
            "moe_ep": str(moe_ep or ""), "pipeline_parallel": str(pp or 1),
            "aic_batch_size": str(_int(raw, "batch_size") or ""), "disagg_layout": disagg,
            "lengths": lengths, "engine_flags": flags, "recipe": recipe.get("recipe", ""),
        }
        for metric, key in (("ttft", "silicon_ttft_ms"), ("tpot", "silicon_tpot_ms")):
            out.append({"row_id": f"{aic_id}:{metric}", "metric": metric, "value": raw[key], **base})
    return out


def _kv_dtype(flags_json: str) -> str:
    if not flags_json:
        return "auto"
    try:
        flags = json.loads(flags_json)
    except json.JSONDecodeError:
        return "auto"
    kv = str(flags.get("kv_cache_dtype") or "auto").lower()
    return "fp8" if kv.startswith("fp8") else kv


def _image_version(image: str) -> str:
    return image.rpartition(":")[2] if ":" in image else ""


def _notes(raw: Mapping[str, str], prov: Mapping[str, str], kind: str, method: str, dup: str | None,
           ambiguous: Sequence[str], measured: str, overcount: bool) -> str:
    parts = [f"AIConfigurator silicon sample row {raw['id']}"]
    if kind == "inferencex-db":
        parts.append(f"InferenceX database: config_id {prov.get('config_id')}, workflow_run_id "
                     f"{prov.get('workflow_run_id')}, image {prov.get('image', '?')}")
    elif kind == "inferencex-export":
        parts.append(f"InferenceX export {prov.get('source_file')} (model {prov.get('model')})")
    if method == "inferencex":
        warm = ("warm-up 2 × concurrency drained before the timed phase" if measured >= INFERENCEX_WARMUP_FROM
                else "no warm-up (before InferenceX #480, 2026-01-21)")
        parts.append(f"InferenceX client: closed loop, 10 × concurrency prompts, lengths uniform on "
                     f"[0.8 L, L], ignore_eos, {warm}; mean TTFT / mean TPOT")
    elif method == "inferencex-multinode":
        parts.append("InferenceX multi-node run (srt-slurm's client, not read): method not established")
    else:
        parts.append("method not established (no public script for these runs)")
    if overcount:
        parts.append(f"AIConfigurator's layout (tp {raw.get('tp_size')}, attention_dp {raw.get('attention_dp_size')}, "
                     f"moe_tp {raw.get('moe_tp_size')}, moe_ep {raw.get('moe_ep_size')}, batch_size "
                     f"{raw.get('batch_size')}) comes from its adapter counting TP × EP GPUs; the row's layout is "
                     "InferenceX's (TP GPUs, EP over them)")
    if dup:
        parts.append(f"same measurement as {dup}")
    parts += list(ambiguous)
    return "; ".join(parts)


def read_sample(path: str | Path) -> list[dict[str, str]]:
    with Path(path).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_recipes(path: str | Path) -> dict[str, dict[str, str]]:
    p = Path(path)
    if not p.is_file():
        return {}
    with p.open(newline="", encoding="utf-8") as f:
        return {r["aic_id"]: r for r in csv.DictReader(f)}


def write_table(path: str | Path, rows: Iterable[Mapping[str, str]]) -> None:
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=SILICON_COLUMNS, lineterminator="\n", extrasaction="raise")
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k, "") for k in SILICON_COLUMNS})
    tmp.replace(p)


def is_silicon_table(path: str | Path) -> bool:
    """Whether ``path`` is a table this module wrote (it has the ``aic_id`` column)."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return False
    return "aic_id" in header


def read_silicon(path: str | Path) -> tuple[list[PublishedRow], dict[str, dict[str, str]]]:
    """The table's rows, checked as any truth table is, and each row's extra columns by row_id."""
    rows = read_table(path)
    with Path(path).open(newline="", encoding="utf-8") as f:
        extras = {r["row_id"]: {k: (r.get(k) or "") for k in EXTRA_COLUMNS} for r in csv.DictReader(f)}
    return rows, extras


def default_silicon_path() -> Path:
    return Path(__file__).resolve().parents[3] / "validation" / "silicon.csv"


__all__ = ["EXTRA_COLUMNS", "KINDS", "METHODS", "SILICON_COLUMNS", "convert", "default_silicon_path",
           "inferencex_env", "is_silicon_table", "kind_of", "mark_duplicates", "method_of",
           "parse_provenance", "read_recipes", "read_sample", "read_silicon", "same_day_conflicts",
           "write_table"]
