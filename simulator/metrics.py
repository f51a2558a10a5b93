"""From a simulation's raw records to tables (pandas) and the summary of one allocator.

Definitions (README documents them for users):

* Arrival: when the clients sent the request (``SimResult.requests[i].arrival_s``): the
  workload's arrival time, or later when it waited for a client slot (closed loop,
  max_concurrency).
* TTFT: arrival -> end of the step that emits the first token. TPOT: (E2E - TTFT) / (output - 1),
  undefined for one-token outputs. E2E: arrival -> end of the step that emits the last token.
  Queueing delay: arrival -> first admission.
* Warm-up: with ``warmup_requests`` K (``SimResult.clients``), requests 0..K-1 — the first K
  sent, as requests are sent in list order — are *measured* by nothing below but the counts
  ``completed``/``rejected`` (every request stays accounted for).
* Throughput: measured finished requests (and their generated tokens, all samples/beams counted)
  divided by the throughput window: from the send of request K (time 0 when K = 0, the first
  arrival) to the last step's end.
* Batch size: sequences in a step (prefill chunks + decodes); its mean is weighted by step
  duration. KV fractions are time-averaged over busy time (the steps), weighted by duration.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine import STEP_COLUMNS, SimResult
from simulator.scheduler import Status

REQUEST_COLUMNS = (
    "request_id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "n", "beam_width",
    "status", "reject_reason", "queue_delay_s", "ttft_s", "tpot_s", "e2e_s", "num_preemptions",
    "num_swaps", "prefix_hit_tokens", "readmission_hit_tokens",
)
KV_PARTS = ("token_state", "reserved", "internal_fragmentation", "external_fragmentation", "free")


def requests_frame(result: SimResult) -> pd.DataFrame:
    """One row per request (REQUEST_COLUMNS). TTFT and E2E are what the client sees: the engine's
    times plus the latency model's per-request front-end overhead (``result.request_overhead_s``;
    TPOT, a difference of the two, is unchanged)."""
    rows = []
    nan = math.nan
    front = result.request_overhead_s
    for r, g, t in zip(result.requests, result.groups, result.times):
        done = g.status is Status.FINISHED
        ttft = t.first_token_s - r.arrival_s + front if done else nan
        e2e = t.finished_s - r.arrival_s + front if done else nan
        tpot = (e2e - ttft) / (r.output_tokens - 1) if done and r.output_tokens > 1 else nan
        queue = t.admitted_s - r.arrival_s if t.admitted_s >= 0 else nan
        rows.append((
            r.request_id, t.replica, r.arrival_s, r.prompt_tokens, r.output_tokens, r.n, r.beam_width,
            g.status.value, g.reject_reason, queue, ttft, tpot, e2e, g.num_preemptions, g.num_swaps,
            g.prefix_hit_tokens, g.readmission_hit_tokens,
        ))
    return pd.DataFrame.from_records(rows, columns=REQUEST_COLUMNS)


def steps_frame(result: SimResult) -> pd.DataFrame:
    return pd.DataFrame.from_records(result.steps, columns=STEP_COLUMNS)


def _stats(values: pd.Series) -> dict[str, float | None]:
    v = values.dropna().to_numpy(dtype=np.float64)
    if not len(v):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def measured_requests(result: SimResult, requests: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``requests`` (a :func:`requests_frame`) after the warm-up requests."""
    warmup = result.clients.warmup_requests
    return requests.iloc[warmup:] if warmup else requests


def throughput_window_s(result: SimResult) -> float:
    """Seconds over which throughput is measured: from the send of request K (K =
    ``warmup_requests``; time 0 when K = 0) to the end of the last step."""
    warmup = result.clients.warmup_requests
    start_s = result.requests[warmup].arrival_s if warmup else 0.0
    return result.end_s - start_s


def summarize(result: SimResult, requests: pd.DataFrame, steps: pd.DataFrame,
              capacity_tokens: int) -> dict[str, Any]:
    """The summary.json entry of one allocator (field meanings in README)."""
    warmup = result.clients.warmup_requests
    measured = measured_requests(result, requests)
    finished = measured[measured.status == Status.FINISHED.value]
    num_finished = int((requests.status == Status.FINISHED.value).sum())
    rejected = requests[requests.status == Status.REJECTED.value]
    makespan = result.end_s
    window = throughput_window_s(result)
    gen_tokens = float((finished.output_tokens * finished[["n", "beam_width"]].max(axis=1)).sum())
    prompt_tokens = float(finished.prompt_tokens.sum())
    duration = steps.duration_s.to_numpy(dtype=np.float64) if len(steps) else np.zeros(0)
    busy = float(duration.sum())
    batch = (steps.num_prefill_seqs + steps.num_decode_seqs).to_numpy() if len(steps) else np.zeros(0)
    kv: dict[str, Any] = {}
    for part in KV_PARTS:
        col = steps[f"kv_{part}"].to_numpy(dtype=np.float64) if len(steps) else np.zeros(0)
        kv[part] = float((col * duration).sum() / busy / capacity_tokens) if busy > 0 else (1.0 if part == "free" else 0.0)
    kv["shared_saved"] = (
        float((steps.kv_shared_saved.to_numpy(dtype=np.float64) * duration).sum() / busy / capacity_tokens)
        if busy > 0 else 0.0
    )
    kv["peak_token_state"] = float(steps.kv_token_state.max() / capacity_tokens) if len(steps) else 0.0
    kv["kv_capacity_tokens"] = int(capacity_tokens)
    schedulers = [rep.scheduler for rep in result.replicas]
    # first admissions only: a preempted request re-finding its own blocks is not prefix sharing
    hits = sum(s.prefix_hit_tokens for s in schedulers)
    queried = sum(s.prefix_query_tokens for s in schedulers)
    reasons = Counter(str(x).split(":", 1)[0] for x in rejected.reject_reason)
    ext_blocked = sum(1 for g in result.groups if g.blocked_by_external_fragmentation)
    return {
        "completed": num_finished,
        "rejected": int(len(rejected)),
        "rejected_by_reason": dict(sorted(reasons.items())),
        "makespan_s": makespan,
        "warmup_requests": warmup,
        "throughput_window_s": window,
        "throughput_req_s": len(finished) / window if window > 0 else 0.0,
        "throughput_tok_s": gen_tokens / window if window > 0 else 0.0,
        "throughput_total_tok_s": (gen_tokens + prompt_tokens) / window if window > 0 else 0.0,
        "queue_delay_s": _stats(finished.queue_delay_s),
        "ttft_s": _stats(finished.ttft_s),
        "tpot_s": _stats(finished.tpot_s),
        "e2e_s": _stats(finished.e2e_s),
        "mean_batch_size": float((batch * duration).sum() / busy) if busy > 0 else 0.0,
        "max_batch_size": int(batch.max()) if len(batch) else 0,
        "num_steps": int(len(steps)),
        "busy_fraction": min(1.0, busy / (makespan * len(schedulers))) if makespan > 0 else 0.0,
        "num_preemptions": int(sum(s.num_preemptions for s in schedulers)),
        "num_swaps": int(sum(s.num_swaps for s in schedulers)),
        "requests_blocked_by_external_fragmentation": int(ext_blocked),
        "prefix_hit_rate": hits / queried if queried else 0.0,
        "readmission_hit_tokens": int(sum(s.readmission_hit_tokens for s in schedulers)),
        "kv": kv,
    }
