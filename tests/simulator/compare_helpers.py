"""Test helper: a simulated run written as a `vllm bench serve --save-result` JSON, so that a
"measurement" with known truth (the simulator's own output under chosen constants) can be fed to
``kvplan compare`` and ``kvplan calibrate --from-results``."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from simulator.commands.compare.predict import CONVENTIONS, predicted_metrics
from simulator.config.deployment import build_deployment
from simulator.latency.constants import RooflineConstants
from simulator.engine.metrics import throughput_window_s
from simulator.engine.runs import client_policy, load_workload, run_allocator
from simulator.config.scenario import parse_scenario

# (our metric, statistic) -> vllm/benchmarks/serve.py result key (latencies in ms)
VLLM_KEYS = {("ttft", "mean"): "mean_ttft_ms", ("ttft", "median"): "median_ttft_ms",
             ("ttft", "p99"): "p99_ttft_ms", ("tpot", "mean"): "mean_tpot_ms",
             ("tpot", "median"): "median_tpot_ms", ("tpot", "p99"): "p99_tpot_ms",
             ("itl", "mean"): "mean_itl_ms", ("e2e", "mean"): "mean_e2el_ms",
             ("e2e", "median"): "median_e2el_ms", ("e2e", "p99"): "p99_e2el_ms"}


def simulate_as_vllm_bench(scenario: dict[str, Any], path: Path, *, base_dir: Path,
                           constants: RooflineConstants | None = None) -> dict[str, Any]:
    """Simulate ``scenario`` (a mapping; its workload sent as vLLM's client sends: ``rate`` with
    Poisson arrivals, or ``rate: inf`` with ``max_concurrency``) under ``constants`` and write
    what vllm bench serve would have saved to ``path``. Returns the JSON written."""
    data = dict(scenario)
    if constants is not None:
        data["latency"] = {"model": "roofline", **dataclasses.asdict(constants)}
    parsed = parse_scenario(data, "test scenario")
    dep = build_deployment(parsed, base_dir)
    fit = load_workload(parsed, base_dir, dep.scheduler_config.max_model_len)
    clients = client_policy(parsed, len(fit.requests))
    run = run_allocator(dep, parsed.allocators[0], fit.requests, clients=clients)
    window = throughput_window_s(run.result)
    metrics = predicted_metrics(run.request_columns, warmup=0, window_s=window,
                                convention=CONVENTIONS["vllm-bench"])
    wl = parsed.workload
    done = [i for i, s in enumerate(run.request_columns["status"]) if s == "finished"]
    out: dict[str, Any] = {
        "backend": "vllm", "model_id": dep.model.name, "num_prompts": len(fit.requests),
        "request_rate": "inf" if wl.rate is None or math.isinf(wl.rate) else wl.rate,
        "burstiness": 1.0, "max_concurrency": wl.max_concurrency, "duration": window,
        "completed": len(done), "failed": len(fit.requests) - len(done),
        "total_input_tokens": int(sum(run.request_columns["prompt_tokens"][i] for i in done)),
        "total_output_tokens": int(sum(run.request_columns["output_tokens"][i] for i in done)),
        "request_throughput": metrics[("request_throughput", "value")],
        "output_throughput": metrics[("output_throughput", "value")],
        "total_token_throughput": metrics[("total_throughput", "value")],
        "request_goodput": None,
    }
    for key, name in VLLM_KEYS.items():
        out[name] = metrics[key] * 1000.0
    path.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return out
