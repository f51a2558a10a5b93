"""Prefill/decode disaggregation (simulator/engine/disagg.py): the two passes, the link and the merge.

Llama-3.1-8B in bf16 holds 32 layers × 2 × 8 KV heads × 128 × 2 bytes = 131,072 bytes of KV per
token (TP 1; TP 2 halves it per rank, and the link moves both ranks' shares): a 1,000-token
prompt is 131,072,000 bytes, 1 ms on a link of 131.072 GB/s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.cli import main
from simulator.engine.disagg import build_pools, kv_bytes_per_token, simulate_disaggregated
from simulator.engine.core import simulate
from simulator.engine.runs import load_workload
from simulator.config.scenario import LinkSpec, parse_scenario

BETA = 131_072  # Llama-3.1-8B, bf16: bytes of KV per token, all ranks together
STEP_S = 0.01


def scenario(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "d", "model": "llama-3.1-8b", "gpu": "h100-80gb",
        "latency": {"model": "constant", "step_s": STEP_S},
        "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                           "link": {"bandwidth_gb_s": 131.072, "latency_s": 0.0005}},
        "workload": {"arrival": {"process": "constant", "rate": 1.0}, "num_requests": 20,
                     "prompt_tokens": {"dist": "fixed", "value": 1000},
                     "output_tokens": {"dist": "fixed", "value": 10}},
    }
    for key, value in over.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    return data


def run(data: dict[str, Any]):  # type: ignore[no-untyped-def]
    s = parse_scenario(data, "test")
    prefill, decode = build_pools(s, Path("."))
    requests = load_workload(s, Path("."), decode.scheduler_config.max_model_len).requests
    assert s.disaggregation is not None
    merged, run_p, run_d = simulate_disaggregated(prefill, decode, s.disaggregation.link, requests)
    return s, prefill, decode, requests, merged, run_p, run_d


def test_bytes_per_token_is_the_decode_side_layout_over_all_its_ranks():
    _, prefill, decode, *_ = run(scenario(**{"disaggregation.decode": {"replicas": 1, "tensor_parallel": 2}}))
    assert decode.capacity.bytes_per_token == BETA // 2 and decode.capacity.tp == 2
    assert kv_bytes_per_token(decode) == BETA
    _, _, fp8, *_ = run(scenario(kv_cache_dtype="fp8"))
    assert kv_bytes_per_token(fp8) == BETA // 2


def test_unloaded_two_replicas_match_the_hand_computed_times():
    """One request a second, nothing queues: TTFT = one prefill step; transfer = 0.5 ms latency
    + 1 ms of bytes; the decode side's steps: one recomputing the last prompt token, then 9
    decodes (10 output tokens); E2E = TTFT + transfer + 10 steps."""
    *_, requests, merged, run_p, run_d = run(scenario())
    cols = merged.request_columns
    transfer = 0.0005 + 1000 * BETA / 131.072e9
    assert transfer == pytest.approx(0.0015, abs=1e-15)
    assert list(cols["status"]) == ["finished"] * 20
    np.testing.assert_allclose(cols["ttft_s"], STEP_S, rtol=0, atol=1e-9)
    np.testing.assert_allclose(cols["e2e_s"], STEP_S + transfer + 10 * STEP_S, rtol=0, atol=1e-9)
    np.testing.assert_allclose(cols["tpot_s"], STEP_S, rtol=0, atol=1e-9)
    np.testing.assert_allclose(cols["queue_delay_s"], 0.0, atol=1e-12)
    section = merged.summary["disaggregation"]
    assert section["transfer_s"]["max"] == pytest.approx(transfer, abs=1e-9)
    assert section["link_wait_s"]["max"] == 0.0
    assert section["bytes_moved"] == 20 * 1000 * BETA
    # the decode side computed one token per request, and decoded 9
    assert run_d.result.totals().num_steps == 20 * 10
    d_rows = [r for r in merged.result.steps if r[0] == 1]
    assert sum(r[5] for r in d_rows) == 20  # num_prefill_tokens: one recomputed token each
    assert sum(r[5] for r in merged.result.steps if r[0] == 0) == 20 * 1000


def test_a_slow_link_queues_as_a_d_d_1_queue():
    """Arrivals every Δ = 0.1 s, prefill S = 10 ms, a link taking T = 0.15 s per prompt: request
    k's first token is out at kΔ + S and the link frees at S + kT, so it waits k(T - Δ) and its
    transfer takes T + k(T - Δ); the decode side gets one request every T > 10 S: no queueing
    there, E2E = S + T + k(T - Δ) + 10 S."""
    delta, t = 0.1, 0.15
    bandwidth = 1000 * BETA / t / 1e9
    data = scenario(**{"workload.arrival": {"process": "constant", "rate": 1 / delta},
                       "disaggregation.link": {"bandwidth_gb_s": bandwidth, "latency_s": 0.0}})
    *_, merged, _, _ = run(data)
    cols = merged.request_columns
    k = np.arange(20)
    np.testing.assert_allclose(cols["ttft_s"], STEP_S, atol=1e-9)
    np.testing.assert_allclose(cols["e2e_s"], STEP_S + t + k * (t - delta) + 10 * STEP_S, atol=1e-9)
    section = merged.summary["disaggregation"]
    assert section["link_wait_s"]["max"] == pytest.approx(19 * (t - delta), abs=1e-9)
    assert section["transfer_s"]["max"] == pytest.approx(t + 19 * (t - delta), abs=1e-9)
    assert section["transfer_s"]["p50"] == pytest.approx(t + 9.5 * (t - delta), abs=1e-9)


def test_conservation_every_request_prefills_transfers_and_decodes_once_or_is_rejected():
    """A bursty trace on a small decode pool (preemptions) and a max_model_len that rejects some
    requests on the decode side only (prefill sends prompt + 1 token)."""
    data = scenario(**{
        "max_model_len": 1200, "num_gpu_blocks_override": 100,
        "latency": {"model": "roofline"},
        "disaggregation.prefill": {"replicas": 2},
        "disaggregation.decode": {"replicas": 2, "gpu": "h200-141gb"},
        "workload": {"trace": "bundled:azure-conv", "rate": 40, "num_requests": 300},
    })
    _, prefill, decode, requests, merged, run_p, run_d = run(data)
    cols = merged.request_columns
    n = len(requests)
    p_status = run_p.request_columns["status"]
    assert all(s in ("finished", "rejected") for s in p_status)
    reached = [s == "finished" for s in p_status]
    # each prefilled request transfers once and is sent to the decode pool once
    assert len(run_d.result.requests) == sum(reached)
    assert sorted(r.request_id for r in run_d.result.requests) == \
        sorted(r.request_id for r, ok in zip(requests, reached) if ok)
    assert all(r.kv_ready_tokens == r.prompt_tokens for r in run_d.result.requests)
    section = merged.summary["disaggregation"]
    assert section["num_transfers"] == sum(reached)
    assert section["bytes_moved"] == sum(r.prompt_tokens for r, ok in zip(requests, reached) if ok) * BETA
    status = cols["status"]
    assert all(s in ("finished", "rejected") for s in status)
    reasons = [why for s, why in zip(status, cols["reject_reason"]) if s == "rejected"]
    assert all(reasons) and any(why.startswith("max_model_len") for why in reasons)
    assert merged.summary["completed"] + merged.summary["rejected"] == n
    # both pools' rows, decode replicas numbered after the prefill ones
    assert {r[0] for r in merged.result.steps} == {0, 1, 2, 3}
    assert merged.summary["num_preemptions"] == (run_p.summary["num_preemptions"]
                                                 + run_d.summary["num_preemptions"])
    assert run_d.summary["num_preemptions"] > 0
    assert section["decode"]["gpus"] == 2 and section["decode"]["gpu"] == decode.gpu.name
    assert section["decode"]["kv_peak_token_state"] == run_d.summary["kv"]["peak_token_state"]
    assert merged.summary["kv"] == run_d.summary["kv"] and merged.summary["kv_pool"] == "decode"


def test_requests_the_prefill_side_rejects_never_transfer():
    """Prompts of 1,000 tokens under max_model_len 500: the prefill pool refuses every one."""
    *_, merged, _, run_d = run(scenario(max_model_len=500))
    assert merged.summary["rejected_by_reason"] == {"max_model_len": 20}
    assert merged.summary["disaggregation"]["num_transfers"] == 0
    assert merged.summary["disaggregation"]["bytes_moved"] == 0
    assert len(run_d.result.requests) == 0


def test_an_infinite_link_merges_exactly():
    """With an instant link the decode pool sees each request at its prefill first token: its
    own run of those arrivals gives the merged E2E and TPOT, bit for bit."""
    data = scenario(**{
        "latency": {"model": "roofline"},
        "disaggregation.decode": {"replicas": 2},
        "disaggregation.link": {"bandwidth_gb_s": 1e30, "latency_s": 0.0},
        "workload": {"trace": "bundled:azure-conv", "rate": 4, "num_requests": 150},
    })
    _, prefill, decode, requests, merged, run_p, _ = run(data)
    first = run_p.result.times
    arrivals = [(first[i].first_token_s, i) for i in range(len(requests))]
    alone = [dataclasses.replace(requests[i], arrival_s=t, kv_ready_tokens=requests[i].prompt_tokens)
             for t, i in sorted(arrivals)]
    res = simulate(alone, decode.replica_factory("paged"), decode.latency, num_replicas=2,
                   router=decode.scenario.router.config())
    finished = {r.request_id: t.finished_s for r, t in zip(res.requests, res.times)}
    cols = merged.request_columns
    front = res.request_overhead_s
    for r, e2e in zip(requests, cols["e2e_s"]):
        assert e2e == finished[r.request_id] - r.arrival_s + front
    assert merged.summary["disaggregation"]["transfer_s"]["max"] == 0.0


def test_two_runs_are_byte_identical(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(json.dumps(scenario(**{
        "latency": {"model": "roofline"},
        "workload": {"trace": "bundled:azure-conv", "rate": 6, "num_requests": 100}})))
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["simulate", str(path), "--out", str(out), "--quiet", "--no-plots"]) == 0
        outs.append(out)
    for f in ("summary.json", "requests.csv", "steps.csv", "run.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    summary = json.loads((outs[0] / "summary.json").read_text())["paged"]
    assert summary["disaggregation"]["num_transfers"] == 100
    assert set(json.loads((outs[0] / "run.json").read_text())["deployments"]) == {"prefill", "decode"}


@pytest.mark.parametrize(("over", "says"), [
    ({"engine": "vllm-v0"}, "disaggregation: engine vllm-v1 only"),
    ({"num_replicas": 2}, "not num_replicas (2)"),
    ({"allocators": ["paged", "max"]}, "allocators must be [paged]"),
    ({"disaggregation.link": {"bandwidth_gb_s": 0}}, "bandwidth_gb_s"),
    ({"disaggregation.link": {"bandwidth_gb_s": 10, "latncy_s": 0}}, "latncy_s"),
    ({"disaggregation.decode": {"replicas": 0}}, "replicas"),
])
def test_bad_disaggregation_is_one_line_and_exit_2(tmp_path, capsys, over, says):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(scenario(**over)))
    capsys.readouterr()
    assert main(["simulate", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_capacity_refuses_disaggregation_in_one_line(tmp_path, capsys):
    path = tmp_path / "d.yaml"
    path.write_text(json.dumps(scenario(slo={"ttft_p99_s": 1.0})))
    capsys.readouterr()
    assert main(["capacity", str(path), "--no-sweep", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not yet supported" in err, err


def test_closed_loop_clients_are_refused(tmp_path, capsys):
    """The decode side's arrivals come from the prefill side's run: open loop only."""
    path = tmp_path / "d.yaml"
    path.write_text(json.dumps(scenario(**{"workload": {
        "concurrency": 2, "num_requests": 5, "prompt_tokens": {"dist": "fixed", "value": 100},
        "output_tokens": {"dist": "fixed", "value": 5}}})))
    capsys.readouterr()
    assert main(["simulate", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "open-loop workloads only" in err, err


def test_the_link_serves_each_prefill_replica_in_first_token_order():
    from simulator.engine.disagg import link_schedule

    first = np.array([0.3, 0.1, 0.2, 0.1])
    replica = np.array([0, 0, 1, 0])
    prompts = np.array([1, 2, 3, 4])
    sent = np.array([True, True, True, True])
    t = link_schedule(first, replica, prompts, sent, 10, LinkSpec(bandwidth_gb_s=1e-8, latency_s=1.0))
    # 10 bytes a token at 10 B/s: a token a second, plus 1 s. Replica 0: #1 (0.1) then #3 (0.1,
    # later in the workload) then #0 (0.3)
    assert t.start_s.tolist() == [0.1 + 3 + 5, 0.1, 0.2, 0.1 + 3]
    assert t.done_s.tolist() == [0.1 + 3 + 5 + 2, 0.1 + 3, 0.2 + 4, 0.1 + 3 + 5]
    assert t.bytes_moved == 100
    assert math.isnan(link_schedule(first, replica, prompts, ~sent, 10,
                                    LinkSpec(bandwidth_gb_s=1.0)).done_s[0])


def test_the_plots_draw_each_pool_apart(tmp_path, monkeypatch):
    """The step figures get one panel per pool (their KV pools differ), and the replica figure
    counts a request at its prefill replica and at its decode replica."""
    import simulator.report.plots as plots

    seen: dict[str, Any] = {}
    write_plots, write_replica_plot = plots.write_plots, plots.write_replica_plot

    def spy_plots(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen["step_groups"] = kwargs.get("step_groups")
        return write_plots(*args, **kwargs)

    def spy_replicas(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen["pools"], seen["sent"] = kwargs.get("pools"), kwargs.get("sent")
        return write_replica_plot(*args, **kwargs)

    monkeypatch.setattr(plots, "write_plots", spy_plots)
    monkeypatch.setattr(plots, "write_replica_plot", spy_replicas)
    path = tmp_path / "d.yaml"
    path.write_text(json.dumps(scenario(**{"disaggregation.prefill.replicas": 2})))
    out = tmp_path / "o"
    assert main(["simulate", str(path), "--out", str(out), "--quiet"]) == 0
    assert seen["step_groups"] == ["paged · prefill pool", "paged · decode pool"]
    assert seen["pools"] == (("prefill", 2), ("decode", 1))
    # 1 req/s, each prefilled before the next arrives: least-outstanding finds both prefill
    # replicas idle every time and takes the first; every request then decodes on the one decoder
    assert seen["sent"]["paged"].tolist() == [20, 0, 20]
    for png in ("kv_memory.png", "batch_size.png", "replicas.png"):
        assert (out / png).stat().st_size > 0


def test_the_pages_label_the_pools_as_they_ran(tmp_path, monkeypatch):
    """The latency figure draws the one merged run, with no "no requests" note for the pools
    (they are step groups, not allocators), and report.html names the engine that ran and each
    pool's GPUs, not the pools as engines."""
    import simulator.report.plots as plots

    figures = []
    latency_figure = plots._latency_figure

    def keep(*args, **kwargs):  # type: ignore[no-untyped-def]
        figures.append(latency_figure(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(plots, "_latency_figure", keep)
    path = tmp_path / "d.yaml"
    path.write_text(json.dumps(scenario(**{"disaggregation.prefill": {"replicas": 2, "gpu": "h200"}})))
    out = tmp_path / "o"
    assert main(["simulate", str(path), "--out", str(out), "--quiet"]) == 0
    (fig,) = figures
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert notes == []  # every run drawn has requests: nothing to say over the curves
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert [label.split(":")[0] for label in labels] == ["paged", "paged"]  # TTFT, TPOT panels
    assert "prefill on H200-141GB, decode on H100-80GB" in fig._suptitle.get_text()
    page = (out / "report.html").read_text()
    rows = dict(re.findall(r'<th class="key" scope="row">([^<]+)</th><td[^>]*>([^<]*)</td>', page))
    assert rows["engine"] == "vllm-v1"
    assert rows["GPU"] == "prefill: H200-141GB; decode: H100-80GB"
    assert rows["replicas"] == "prefill: 2; decode: 1"
