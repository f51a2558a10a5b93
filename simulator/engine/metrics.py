"""From a simulation's raw records to tables (pandas) and the summary of one allocator.

Definitions (docs/reference/outputs.md documents them for users):

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
  Both come from the run's exact step totals (:class:`simulator.engine.steps.StepTotals`), however
  the steps were recorded.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.core import STEP_COLUMNS, SimResult, TimesTable

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
from simulator.scheduler import Status

REQUEST_COLUMNS = (
    "request_id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "n", "beam_width",
    "status", "reject_reason", "queue_delay_s", "ttft_s", "tpot_s", "e2e_s", "num_preemptions",
    "num_swaps", "prefix_hit_tokens", "readmission_hit_tokens",
)
KV_PARTS = ("token_state", "reserved", "internal_fragmentation", "external_fragmentation", "free")


def requests_frame(result: SimResult) -> pd.DataFrame:
    """:func:`request_columns` as a pandas DataFrame."""
    import pandas as pd

    return pd.DataFrame(request_columns(result), columns=list(REQUEST_COLUMNS))


def request_columns(result: SimResult) -> dict[str, Any]:
    """One row per request (REQUEST_COLUMNS), as columns: numpy arrays, and lists of strings for
    ``status`` and ``reject_reason``. TTFT and E2E are what the client sees: the engine's times
    plus the latency model's per-request front-end overhead (``result.request_overhead_s``;
    TPOT, a difference of the two, is unchanged). Built column by column (no row objects): a run
    of 10^6 requests takes ~100 MB here."""
    reqs, groups, times = result.requests, result.groups, result.times
    n = len(reqs)
    nan = math.nan

    def column(values, dtype) -> np.ndarray:  # type: ignore[no-untyped-def]
        return np.fromiter(values, dtype=dtype, count=n)

    flat = isinstance(times, TimesTable)  # the engine's arrays: read them as they are

    def time_column(name: str) -> np.ndarray:
        if flat:
            return np.frombuffer(getattr(times, name), dtype=np.float64)
        return column((getattr(t, name) for t in times), np.float64)

    arrival = column((r.arrival_s for r in reqs), np.float64)
    output = column((r.output_tokens for r in reqs), np.int64)
    done = column((g is not None and g.status is Status.FINISHED for g in groups), bool)
    admitted = time_column("admitted_s")
    front = result.request_overhead_s
    with np.errstate(invalid="ignore", divide="ignore"):
        ttft = np.where(done, time_column("first_token_s") - arrival + front, nan)
        e2e = np.where(done, time_column("finished_s") - arrival + front, nan)
        tpot = np.where(done & (output > 1), (e2e - ttft) / (output - 1), nan)
    queue = np.where(admitted >= 0, admitted - arrival, nan)

    def counts(attr: str) -> np.ndarray:
        return column((getattr(g, attr) if g is not None else 0 for g in groups), np.int64)

    # a run stopped early (SimResult.stopped) may leave requests it never sent: "not sent"
    return {
        "request_id": column((r.request_id for r in reqs), np.int64),
        "replica": (np.frombuffer(times.replica, dtype=np.int32).astype(np.int64) if flat
                    else column((t.replica for t in times), np.int64)),
        "arrival_s": arrival,
        "prompt_tokens": column((r.prompt_tokens for r in reqs), np.int64),
        "output_tokens": output,
        "n": column((r.n for r in reqs), np.int64),
        "beam_width": column((r.beam_width for r in reqs), np.int64),
        "status": [g.status.value if g is not None else "not sent" for g in groups],
        "reject_reason": [g.reject_reason if g is not None else "" for g in groups],
        "queue_delay_s": queue, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
        "num_preemptions": counts("num_preemptions"), "num_swaps": counts("num_swaps"),
        "prefix_hit_tokens": counts("prefix_hit_tokens"),
        "readmission_hit_tokens": counts("readmission_hit_tokens"),
    }


def steps_frame(result: SimResult) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame.from_records(result.steps, columns=STEP_COLUMNS)


def columns_of(requests: Any) -> dict[str, Any]:
    """The columns of a requests table: :func:`request_columns`' dict, or a DataFrame's."""
    if isinstance(requests, dict):
        return requests
    return {name: requests[name].to_numpy() for name in requests.columns}


def _stats(values: Any) -> dict[str, float | None]:
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
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


def summarize(result: SimResult, requests: Any, steps: Any, capacity_tokens: int) -> dict[str, Any]:
    """The summary.json entry of one allocator (field meanings in docs/reference/outputs.md). ``requests`` is
    :func:`request_columns` or :func:`requests_frame`. The step figures come from the result's
    exact totals (``SimResult.totals()``), whatever ``steps`` holds (rows or bins; kept as an
    argument for callers that pass it)."""
    warmup = result.clients.warmup_requests
    cols = columns_of(requests)
    status = np.asarray(cols["status"], dtype=object)
    measured = np.zeros(len(status), dtype=bool)
    measured[warmup:] = True
    finished = measured & (status == Status.FINISHED.value)
    num_finished = int((status == Status.FINISHED.value).sum())
    rejected = status == Status.REJECTED.value
    makespan = result.end_s
    window = throughput_window_s(result)
    samples = np.maximum(np.asarray(cols["n"])[finished], np.asarray(cols["beam_width"])[finished])
    gen_tokens = float((np.asarray(cols["output_tokens"])[finished] * samples).sum())
    prompt_tokens = float(np.asarray(cols["prompt_tokens"])[finished].sum())
    num_measured_finished = int(finished.sum())
    totals = result.totals()
    busy = totals.busy_s
    kv: dict[str, Any] = {}
    for part, integral in zip(KV_PARTS, totals.kv_s):
        kv[part] = integral / busy / capacity_tokens if busy > 0 else (1.0 if part == "free" else 0.0)
    kv["shared_saved"] = totals.kv_s[5] / busy / capacity_tokens if busy > 0 else 0.0
    kv["peak_token_state"] = totals.peak_token_state / capacity_tokens
    kv["kv_capacity_tokens"] = int(capacity_tokens)
    schedulers = [rep.scheduler for rep in result.replicas]
    # first admissions only: a preempted request re-finding its own blocks is not prefix sharing
    hits = sum(s.prefix_hit_tokens for s in schedulers)
    queried = sum(s.prefix_query_tokens for s in schedulers)
    reasons = Counter(str(x).split(":", 1)[0] for x in np.asarray(cols["reject_reason"], dtype=object)[rejected])
    ext_blocked = sum(1 for g in result.groups if g is not None and g.blocked_by_external_fragmentation)
    tiers = [rep.allocator for rep in result.replicas if getattr(rep.allocator, "offload_blocks", 0)]
    summary = {
        "completed": num_finished,
        "rejected": int(rejected.sum()),
        "rejected_by_reason": dict(sorted(reasons.items())),
        "makespan_s": makespan,
        "warmup_requests": warmup,
        "throughput_window_s": window,
        "throughput_req_s": num_measured_finished / window if window > 0 else 0.0,
        "throughput_tok_s": gen_tokens / window if window > 0 else 0.0,
        "throughput_total_tok_s": (gen_tokens + prompt_tokens) / window if window > 0 else 0.0,
        "queue_delay_s": _stats(np.asarray(cols["queue_delay_s"])[finished]),
        "ttft_s": _stats(np.asarray(cols["ttft_s"])[finished]),
        "tpot_s": _stats(np.asarray(cols["tpot_s"])[finished]),
        "e2e_s": _stats(np.asarray(cols["e2e_s"])[finished]),
        "mean_batch_size": totals.batch_s / busy if busy > 0 else 0.0,
        "max_batch_size": int(totals.max_batch),
        "num_steps": int(totals.num_steps),
        "busy_fraction": min(1.0, busy / (makespan * len(schedulers))) if makespan > 0 else 0.0,
        "num_preemptions": int(sum(s.num_preemptions for s in schedulers)),
        "num_swaps": int(sum(s.num_swaps for s in schedulers)),
        "requests_blocked_by_external_fragmentation": int(ext_blocked),
        "prefix_hit_rate": hits / queried if queried else 0.0,
        "readmission_hit_tokens": int(sum(s.readmission_hit_tokens for s in schedulers)),
        "kv": kv,
    }
    if tiers:  # kv_offload: each tier's hit tokens (every admission) over the prompt tokens queried
        bs, asked = tiers[0].block_size, queried or 1
        summary["kv_offload"] = {
            "hbm_hit_rate": sum(a.num_hit_blocks for a in tiers) * bs / asked,
            "cpu_hit_rate": sum(a.num_offload_hit_blocks for a in tiers) * bs / asked,
            "loaded_blocks": sum(a.num_offload_hit_blocks for a in tiers),
            "stored_blocks": sum(a.num_offload_stored_blocks for a in tiers),
            "cpu_evicted_blocks": sum(a.num_offload_evictions for a in tiers)}
    spec = [s.spec_stats() for s in schedulers if hasattr(s, "spec_stats")]
    if spec:  # speculative decoding (simulator/scheduler/spec.py), over every replica
        summary["speculative"] = _spec_summary(spec)
    return summary


def _spec_summary(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Replicas' speculative-decoding counts merged, with vLLM's ratios (SpecDecodingLogging.log,
    vllm/v1/spec_decode/metrics.py): mean acceptance length ``1 + accepted / drafts`` (tokens
    per verify pass per sequence, the bonus token included) and per position the share of drafts
    whose draft at that position was accepted."""
    drafts = sum(s["num_drafts"] for s in stats)
    accepted = sum(s["num_accepted_tokens"] for s in stats)
    per_pos = [sum(s["acceptance_per_position"][i] * s["num_drafts"] for s in stats)
               for i in range(len(stats[0]["acceptance_per_position"]))]
    emitted = sum(s["emitted_tokens_per_step"] * s["num_drafts"] for s in stats)
    return {
        "num_drafts": drafts,
        "num_draft_tokens": sum(s["num_draft_tokens"] for s in stats),
        "num_accepted_tokens": accepted,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "acceptance_per_position": [c / drafts if drafts else 0.0 for c in per_pos],
        "emitted_tokens_per_step": emitted / drafts if drafts else 1.0,
    }
