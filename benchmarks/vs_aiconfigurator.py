#!/usr/bin/env python3
"""kvplan against NVIDIA AIConfigurator's own estimate, on the same silicon-sample rows.

    python -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator==0.12.0 aiconfigurator-core==0.12.0
    python benchmarks/vs_aiconfigurator.py --aic /tmp/aic/bin/aiconfigurator [--per-cell 3] [--jobs 2]

The rows: validation/silicon.csv's aggregated rows whose method is established (the bucket
``kvplan validate --silicon`` headlines: InferenceX's client, not a duplicate, not ambiguous, not
implausible) that kvplan can express, sampled per GPU × engine × model family: up to
``--per-cell`` measurements each, spread over the cell's concurrencies (lowest, highest, evenly
between; the middle one for 1; deterministic). kvplan simulates them as ``validate --silicon`` does (the InferenceX
client, the script's flags, the shipped roofline constants, which were fitted on
validation/published.csv and never saw these rows). AIConfigurator estimates each with

    aiconfigurator cli estimate --estimate-mode agg --model-path M --system S --backend B
        --isl I --osl O --batch-size BS --tp-size TP --pp-size PP --attention-dp-size DP
        --moe-tp-size MTP --moe-ep-size MEP --gemm-quant-mode G --moe-quant-mode Q

taking every argument from the sample's own columns for that row (the inputs AIConfigurator's
maintainers recorded for it; two model paths are renamed to the configs its wheel bundles,
:data:`AIC_MODEL_ALIASES`), at its default database version per system and backend
(``systems/query_versions.yaml``: vLLM 0.24.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20 in 0.12.0).
AIConfigurator must live in a venv of its own (``--aic`` names its executable); its start-up is
several seconds a row, so ``--jobs`` runs that many at once.

Prints MAPE and bias (mean signed error) per metric for both tools on the rows both answered,
per GPU × engine, and the CPU / wall time each took. ``--csv`` writes every row. A benchmark,
not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.commands.validate import report, silicon_report, silicon_run  # noqa: E402
from simulator.commands.validate.silicon import default_silicon_path, read_silicon  # noqa: E402
from simulator.commands.validate.table import PublishedRow  # noqa: E402

# the sample's columns AIConfigurator's `cli estimate` takes (flag per column)
AIC_ARGS = (("model_path", "--model-path"), ("system", "--system"), ("backend", "--backend"),
            ("isl", "--isl"), ("osl", "--osl"), ("batch_size", "--batch-size"), ("tp_size", "--tp-size"),
            ("pp_size", "--pp-size"), ("attention_dp_size", "--attention-dp-size"),
            ("moe_tp_size", "--moe-tp-size"), ("moe_ep_size", "--moe-ep-size"),
            ("gemm_quant_mode", "--gemm-quant-mode"), ("moe_quant_mode", "--moe-quant-mode"))
# Sample model paths the 0.12.0 wheel's offline bundle (aiconfigurator_core/model_configs/) holds
# under another name; without a network AIConfigurator cannot fetch them from Hugging Face.
AIC_MODEL_ALIASES = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
                     "zhipuai/GLM-5": "zai-org/GLM-5"}
_RESULT = re.compile(r"^\s*(TTFT|TPOT):\s*([0-9.]+)\s*ms\s*$", re.M)


@dataclass
class Measurement:
    aic_id: str
    ttft: PublishedRow
    tpot: PublishedRow
    cell: tuple[str, str, str]  # gpu, engine, family
    kvplan: dict[str, float | None]
    aic: dict[str, float | None]
    aic_note: str = ""


def sample_path(aic: str) -> Path:
    """The silicon sample of the AIConfigurator install that ``aic`` runs."""
    python = Path(aic).resolve().parent / "python"
    out = subprocess.run([str(python), "-c", "import aiconfigurator_core, os; "
                          "print(os.path.dirname(aiconfigurator_core.__file__))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "systems" / "silicon_sample.csv"


def established(rows: Sequence[PublishedRow], extras: Mapping[str, Mapping[str, str]]) -> list[PublishedRow]:
    """The agg rows ``validate --silicon`` counts as established (silicon_report.bucket_of)."""
    present = {extras[r.row_id].get("aic_id") or r.row_id for r in rows}
    verdict = {extras[r.row_id]["aic_id"]: silicon_run.plausibility(r, extras[r.row_id])
               for r in rows if r.metric == "ttft"}
    return [r for r in rows if extras[r.row_id].get("mode") == "agg"
            and silicon_report.bucket_of(extras[r.row_id], verdict.get(extras[r.row_id]["aic_id"], ""),
                                         present) == "established"]


def stratify(setups: Sequence[silicon_run.SiliconSetup], per_cell: int) -> list[silicon_run.SiliconSetup]:
    """Up to ``per_cell`` expressible setups per GPU × engine × family, spread over concurrency."""
    cells: dict[tuple[str, str, str], list[silicon_run.SiliconSetup]] = defaultdict(list)
    for s in setups:
        if s.scenario is not None:
            r = s.first
            cells[(r.gpu, r.engine, report.family_of(r.model))].append(s)
    picked = []
    for key in sorted(cells):
        group = sorted(cells[key], key=lambda s: (s.first.load_value or 0, s.first.input_tokens or 0,
                                                  s.first.output_tokens or 0, s.first.row_id))
        n = min(per_cell, len(group))
        idx = (sorted({round(i * (len(group) - 1) / (n - 1)) for i in range(n)}) if n > 1
               else [len(group) // 2])
        picked += [group[i] for i in idx]
    return picked


def aic_estimate(aic: str, sample_row: Mapping[str, str]) -> tuple[dict[str, float | None], str, float]:
    """AIConfigurator's TTFT and TPOT (seconds) for one sample row, a note when it gave none,
    and the wall seconds it took."""
    cmd = [aic, "cli", "estimate", "--estimate-mode", "agg", "--no-color", "--log-level", "ERROR"]
    for col, flag in AIC_ARGS:
        if sample_row.get(col):
            value = sample_row[col]
            cmd += [flag, AIC_MODEL_ALIASES.get(value, value) if col == "model_path" else value]
    start = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired:
        return {"ttft": None, "tpot": None}, "timed out after 600 s", time.monotonic() - start
    wall = time.monotonic() - start
    found = {k.lower(): float(v) / 1e3 for k, v in _RESULT.findall(out.stdout)}
    if "ttft" not in found or "tpot" not in found:
        last = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or ["no output"])[-1]
        return {"ttft": None, "tpot": None}, f"no estimate (exit {out.returncode}): {last[:160]}", wall
    return {"ttft": found["ttft"], "tpot": found["tpot"]}, "", wall


def errors(ms: Sequence[Measurement], tool: str, metric: str) -> list[float]:
    out = []
    for m in ms:
        pred, row = getattr(m, tool)[metric], getattr(m, metric)
        if pred is not None:
            out.append(pred / row.value_si - 1.0)
    return out


def _block(errs: Sequence[float]) -> str:
    if not errs:
        return "      —        —"
    mape = sum(abs(e) for e in errs) / len(errs)
    bias = sum(errs) / len(errs)
    return f"{mape * 100:6.1f}%  {bias * 100:+6.1f}%"


def print_table(ms: Sequence[Measurement], kv_cpu: float, kv_wall: float, aic_wall: float, aic_sum: float) -> None:
    both = [m for m in ms if all(v is not None for v in (*m.kvplan.values(), *m.aic.values()))]
    print(f"\n{len(ms)} measurements sampled; {len(both)} answered by both tools "
          f"(kvplan {sum(1 for m in ms if None not in m.kvplan.values())}, "
          f"AIConfigurator {sum(1 for m in ms if None not in m.aic.values())})\n")
    head = f"{'':26s} {'n':>4s}   {'kvplan MAPE':>11s} {'bias':>7s}   {'AIC MAPE':>9s} {'bias':>7s}   ratio"
    for metric in ("ttft", "tpot"):
        print(f"{metric.upper()}\n{head}")
        groups: dict[str, list[Measurement]] = {"all": both}
        for m in both:
            groups.setdefault(f"{m.cell[0]} {m.cell[1]}", []).append(m)
        for name, g in groups.items():
            k, a = errors(g, "kvplan", metric), errors(g, "aic", metric)
            km = sum(abs(e) for e in k) / len(k) if k else float("nan")
            am = sum(abs(e) for e in a) / len(a) if a else float("nan")
            ratio = f"{km / am:5.2f}" if a and am > 0 else "   —"
            print(f"{name:26s} {len(g):4d}   {_block(k)}   {_block(a)}   {ratio}")
        print()
    print("ratio: kvplan MAPE / AIConfigurator MAPE on the same rows (below 1: kvplan closer)")
    print(f"time: kvplan {kv_cpu:.1f} CPU s ({kv_wall:.1f} s wall, one process); AIConfigurator "
          f"{aic_sum:.1f} s summed over its runs ({aic_wall:.1f} s wall); load average "
          f"{os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aic", default=os.environ.get("AIC_BIN", "aiconfigurator"),
                    help="the aiconfigurator executable of its own venv (default: $AIC_BIN or on PATH)")
    ap.add_argument("--sample", type=Path, help="silicon_sample.csv (default: the --aic install's)")
    ap.add_argument("--table", type=Path, default=default_silicon_path())
    ap.add_argument("--per-cell", type=int, default=3, help="measurements per GPU × engine × family")
    ap.add_argument("--jobs", type=int, default=2, help="AIConfigurator runs at once")
    ap.add_argument("--csv", type=Path, help="write every sampled row here")
    args = ap.parse_args(argv)

    sample = args.sample or sample_path(args.aic)
    with sample.open(newline="", encoding="utf-8") as f:
        by_id = {r["id"]: r for r in csv.DictReader(f)}
    rows, extras = read_silicon(args.table)
    keep = established(rows, extras)
    setups = stratify(silicon_run.group(keep, extras), args.per_cell)
    print(f"{len(keep) // 2} established agg measurements; {len(setups)} sampled over "
          f"{len({(s.first.gpu, s.first.engine, report.family_of(s.first.model)) for s in setups})} "
          f"GPU × engine × family cells", flush=True)

    cpu0, wall0 = time.process_time(), time.monotonic()
    results = silicon_run.run_all(setups)
    kv_cpu, kv_wall = time.process_time() - cpu0, time.monotonic() - wall0

    ms: list[Measurement] = []
    for res in results:
        s = res.setup
        aic_id = s.extra()["aic_id"]
        pair = {r.metric: r for r in s.rows if extras[r.row_id]["aic_id"] == aic_id}
        if "ttft" not in pair or "tpot" not in pair:
            continue
        ms.append(Measurement(aic_id, pair["ttft"], pair["tpot"],
                              (s.first.gpu, s.first.engine, report.family_of(s.first.model)),
                              {k: res.predicted(pair[k]) for k in ("ttft", "tpot")}, {}))

    wall0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        answers = list(pool.map(lambda m: aic_estimate(args.aic, by_id[m.aic_id]), ms))
    aic_wall = time.monotonic() - wall0
    for m, (est, note, _) in zip(ms, answers):
        m.aic, m.aic_note = est, note
    print_table(ms, kv_cpu, kv_wall, aic_wall, sum(a[2] for a in answers))

    if args.csv:
        with args.csv.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["aic_id", "gpu", "engine", "family", "concurrency", "isl", "osl", "measured_ttft_ms",
                        "measured_tpot_ms", "kvplan_ttft_ms", "kvplan_tpot_ms", "aic_ttft_ms", "aic_tpot_ms",
                        "aic_note"])
            for m in ms:
                ms_ = [None if v is None else round(v * 1e3, 4)
                       for v in (m.kvplan["ttft"], m.kvplan["tpot"], m.aic["ttft"], m.aic["tpot"])]
                w.writerow([m.aic_id, *m.cell, m.ttft.load_value, m.ttft.input_tokens, m.ttft.output_tokens,
                            m.ttft.value, m.tpot.value, *ms_, m.aic_note])
        print(f"rows -> {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
