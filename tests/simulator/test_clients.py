"""The engine's clients: closed loop, a cap on requests in flight, burst, warm-up exclusion.

* Closed loop in closed form: N clients, fixed prompt P (one prefill step for all N) and output
  O, a constant step D, no think time: every request takes exactly O steps, so E2E = O·D, TTFT
  = D, client c's k-th request is sent at k·O·D, throughput is N / (O·D) requests per second and
  N / D tokens per second, and Little's law reads N = throughput × E2E. A think time T adds T
  to every cycle.
* With think time 0 and one replica, the batches of a closed loop do not depend on how long
  steps take: a client's next send happens at the end of the step that finished its previous
  request, before the next schedule (`kvplan validate` relies on it).
* With a cap on requests in flight a request is measured from its send, not its arrival.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine import metrics
from simulator.config.deployment import build_deployment
from simulator.engine.core import simulate
from simulator.kv.gpus import get_gpu
from simulator.kv.models import load_model
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatency
from simulator.latency.roofline import RooflineLatency
from simulator.commands.simulate import run_simulate
from simulator.config.scenario import parse_scenario
from simulator.scheduler import SchedulerConfig, Status
from tests.simulator.test_engine import check_littles_law, factory
from workloads.clients import Clients
from workloads.request import Request
from workloads.spec import build_requests, parse_workload

D_S = 0.02  # constant step time
TIMES = ("time_s", "duration_s")


def roomy(max_num_seqs: int = 8):
    """A scheduler that never runs short: budget for 8 prompts of 16 at once, a large pool."""
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=128, max_model_len=256,
                          block_size=4)
    return factory(cfg, lambda: PagedAllocator(512, 4))


def fixed(num: int, prompt: int, output: int) -> list[Request]:
    return [Request(i, 0.0, prompt, output) for i in range(num)]


def run(requests, make, latency, clients, **kw):
    result = simulate(requests, make, latency, clients=clients, **kw)
    req, steps = metrics.requests_frame(result), metrics.steps_frame(result)
    return result, req, steps, metrics.summarize(result, req, steps, 2048)


# ----------------------------------------------------------------------------- closed form
@pytest.mark.parametrize("think_s", [0.0, 0.05])
def test_closed_loop_in_closed_form(think_s: float) -> None:
    clients, output, rounds = 4, 8, 3
    result, req, _, s = run(fixed(clients * rounds, 16, output), roomy(), ConstantLatency(D_S),
                            Clients(clients, think_s))
    cycle_s = output * D_S + think_s
    sent = np.repeat(np.arange(rounds) * cycle_s, clients)
    assert req.arrival_s.to_numpy() == pytest.approx(sent, abs=1e-12)
    assert [r.arrival_s for r in result.offered or ()] == [0.0] * clients * rounds
    assert req.e2e_s.to_numpy() == pytest.approx(np.full(clients * rounds, output * D_S))
    assert req.ttft_s.to_numpy() == pytest.approx(np.full(clients * rounds, D_S))
    assert (req.queue_delay_s == 0).all()
    makespan = rounds * output * D_S + (rounds - 1) * think_s
    assert s["makespan_s"] == pytest.approx(makespan)
    assert s["throughput_req_s"] == pytest.approx(clients * rounds / makespan)
    assert s["max_batch_size"] == clients and s["completed"] == clients * rounds
    if think_s == 0:
        assert s["throughput_tok_s"] == pytest.approx(clients / D_S)
        # Little's law: N clients in the system at every instant
        assert s["throughput_req_s"] * s["e2e_s"]["mean"] == pytest.approx(clients)
    check_littles_law(result, 2048)


def test_warmup_requests_leave_the_statistics_and_the_window() -> None:
    """Warm-up = the first round: the window runs from the second round's send (O·D + T) to the
    end, and throughput is the steady N / cycle."""
    clients, output, rounds, think_s = 4, 8, 3, 0.05
    result, req, _, s = run(fixed(clients * rounds, 16, output), roomy(), ConstantLatency(D_S),
                            Clients(clients, think_s, warmup_requests=clients))
    cycle_s = output * D_S + think_s
    assert s["warmup_requests"] == clients
    assert s["throughput_window_s"] == pytest.approx(s["makespan_s"] - cycle_s)
    assert s["throughput_req_s"] == pytest.approx(clients * (rounds - 1) / (2 * output * D_S + think_s))
    assert s["completed"] == clients * rounds  # counts keep every request
    measured = metrics.measured_requests(result, req)
    assert measured.request_id.tolist() == list(range(clients, clients * rounds))
    assert s["ttft_s"]["mean"] == pytest.approx(measured.ttft_s.mean())


def test_warmup_shapes_the_latency_statistics() -> None:
    """Staggered prefill (a budget of 2 prompts per step) makes the first round's TTFTs differ;
    the warm-up statistics are those of the other rows exactly."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=256, block_size=4)
    make = factory(cfg, lambda: PagedAllocator(512, 4))
    result, req, _, s = run(fixed(16, 16, 6), make, ConstantLatency(D_S), Clients(4, 0.0, 5))
    rest = req.iloc[5:]
    assert s["ttft_s"]["p99"] == pytest.approx(float(np.percentile(rest.ttft_s, 99)))
    assert s["e2e_s"]["mean"] == pytest.approx(rest.e2e_s.mean())
    assert s["throughput_window_s"] == pytest.approx(result.end_s - req.arrival_s[5])
    with pytest.raises(ValueError, match="warmup_requests 16 leaves none of the 16"):
        simulate(fixed(16, 16, 6), make, ConstantLatency(D_S), clients=Clients(4, 0.0, 16))


# ----------------------------------------------------------------------------- step durations
def step_decisions(steps: pd.DataFrame) -> pd.DataFrame:
    return steps.drop(columns=list(TIMES))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), clients=st.integers(1, 9))
def test_closed_loop_batches_do_not_depend_on_step_durations(seed: int, clients: int) -> None:
    """Random lengths, fewer sequences allowed than clients and a tight pool (preemptions): the
    batches, KV and per-request outcomes are the same under three very different latency models."""
    rng = np.random.default_rng(seed)
    requests = [Request(i, 0.0, int(p), int(o)) for i, (p, o) in
                enumerate(zip(rng.integers(2, 40, 30), rng.integers(1, 25, 30)))]
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=4)
    make = factory(cfg, lambda: PagedAllocator(24, 4))
    models = [ConstantLatency(0.01), ConstantLatency(0.3, prefill_token_s=1e-3, decode_seq_s=0.07),
              RooflineLatency(load_model("llama-3.1-8b"), get_gpu("h100-80gb"), block_size=4)]
    runs = [run(requests, make, m, Clients(clients)) for m in models]
    first = step_decisions(runs[0][2])
    outcome_columns = ["request_id", "status", "num_preemptions", "prefix_hit_tokens"]
    for _, req, steps, _ in runs[1:]:
        pd.testing.assert_frame_equal(step_decisions(steps), first)
        pd.testing.assert_frame_equal(req[outcome_columns], runs[0][1][outcome_columns])
    for result, _, _, s in runs:
        assert s["completed"] + s["rejected"] == len(requests)
        assert s["max_batch_size"] <= min(clients, 4)
        check_littles_law(result, 96)


def test_open_loop_batches_do_depend_on_step_durations() -> None:
    """The control: arrivals on their own clock meet different batches when steps change."""
    requests = [Request(i, 0.013 * i, 16, 8) for i in range(20)]
    a = run(requests, roomy(), ConstantLatency(0.01), Clients())[2]
    b = run(requests, roomy(), ConstantLatency(0.05), Clients())[2]
    assert len(a) != len(b) or not step_decisions(a).equals(step_decisions(b))


# ----------------------------------------------------------------------------- rate + cap, burst
def test_a_capped_request_is_measured_from_its_send() -> None:
    """Arrivals every 10 ms, one-step requests of D = 50 ms, one in flight: request i is sent at
    i·D, when the previous one ends, and its TTFT is D (open loop: it would queue)."""
    requests = [Request(i, 0.01 * i, 8, 1) for i in range(10)]
    result, req, _, s = run(requests, roomy(max_num_seqs=1), ConstantLatency(0.05), Clients(1))
    assert req.arrival_s.to_numpy() == pytest.approx(0.05 * np.arange(10))
    assert req.ttft_s.to_numpy() == pytest.approx(np.full(10, 0.05))
    assert [r.arrival_s for r in result.offered or ()] == [r.arrival_s for r in requests]
    open_loop = run(requests, roomy(max_num_seqs=1), ConstantLatency(0.05), Clients())[1]
    assert open_loop.arrival_s.tolist() == [r.arrival_s for r in requests]
    assert open_loop.ttft_s.iloc[-1] == pytest.approx(10 * 0.05 - 0.09)
    check_littles_law(result, 2048)


def test_a_cap_above_the_load_changes_nothing() -> None:
    requests = [Request(i, 0.2 * i, 16, 5) for i in range(12)]
    capped = run(requests, roomy(), ConstantLatency(D_S), Clients(3))
    free = run(requests, roomy(), ConstantLatency(D_S), Clients())
    pd.testing.assert_frame_equal(capped[1], free[1])
    pd.testing.assert_frame_equal(capped[2], free[2])


def test_a_burst_is_a_closed_loop_with_a_client_per_request() -> None:
    requests = fixed(10, 12, 7)
    burst = run(requests, roomy(max_num_seqs=4), ConstantLatency(D_S), Clients())
    clients = run(requests, roomy(max_num_seqs=4), ConstantLatency(D_S), Clients(10))
    pd.testing.assert_frame_equal(burst[1], clients[1])
    pd.testing.assert_frame_equal(burst[2], clients[2])
    assert burst[3]["queue_delay_s"]["p99"] > 0  # four at a time: the rest queue in the server


def test_a_rejected_request_frees_its_client_at_once() -> None:
    """Two clients; request 1 is longer than max_model_len: refused when sent at 0, its client
    sends request 2 in the same instant."""
    requests = [Request(0, 0.0, 8, 4), Request(1, 0.0, 300, 4), Request(2, 0.0, 8, 4),
                Request(3, 0.0, 8, 4)]
    result, req, _, s = run(requests, roomy(), ConstantLatency(D_S), Clients(2))
    assert req.status.tolist() == ["finished", "rejected", "finished", "finished"]
    assert req.arrival_s.tolist() == pytest.approx([0.0, 0.0, 0.0, 4 * D_S])
    assert s["rejected_by_reason"] == {"max_model_len": 1}
    assert all(g.status in (Status.FINISHED, Status.REJECTED) for g in result.groups)


def test_clients_across_replicas_account_for_everything() -> None:
    rng = np.random.default_rng(3)
    requests = [Request(i, 0.0, int(p), int(o)) for i, (p, o) in
                enumerate(zip(rng.integers(4, 40, 60), rng.integers(1, 30, 60)))]
    result, req, _, s = run(requests, roomy(), ConstantLatency(D_S, decode_seq_s=1e-3),
                            Clients(6, 0.01), num_replicas=2)
    assert s["completed"] == 60 and set(req.replica) == {0, 1}
    check_littles_law(result, 2048)
    again = run(requests, roomy(), ConstantLatency(D_S, decode_seq_s=1e-3), Clients(6, 0.01),
                num_replicas=2)
    assert again[1].to_csv() == req.to_csv()  # deterministic to the byte


def test_clients_invariants() -> None:
    assert not Clients().gated and Clients(1).gated
    for bad in ({"max_in_flight": 0}, {"think_time_s": -1.0},
                {"think_time_s": float("inf"), "max_in_flight": 2}, {"think_time_s": 1.0},
                {"warmup_requests": -1}):
        with pytest.raises(ValueError):
            Clients(**bad)


# ----------------------------------------------------------------------------- whole runs
def test_documented_programmatic_use_obeys_littles_law(tmp_path: Path) -> None:
    """The engine docstring's recipe: a fixed-length workload mapping, 16 clients, roofline
    latency. Rounds stay in step (16 prompts prefill in one step), so after the first round
    throughput × E2E in the engine (the client's E2E less the front end's delay) = 16 clients."""
    workload = {"prompt_tokens": {"dist": "fixed", "value": 200},
                "output_tokens": {"dist": "fixed", "value": 50},
                "num_requests": 128, "concurrency": 16, "warmup_requests": 16}
    spec = parse_workload(workload, "validate")
    scenario = parse_scenario({"model": "llama-3.1-8b", "gpu": "h100", "workload": workload}, "validate")
    dep = build_deployment(scenario, tmp_path)
    requests = build_requests(spec, seed=0, base_dir=tmp_path)
    result, req, _, s = run(requests, dep.replica_factory("paged"), dep.latency,
                            spec.client_policy(len(requests)))
    assert s["completed"] == 128 and s["max_batch_size"] == 16
    engine_e2e = s["e2e_s"]["mean"] - result.request_overhead_s
    assert s["throughput_req_s"] * engine_e2e == pytest.approx(16, rel=1e-9)
    assert s["e2e_s"]["p99"] == pytest.approx(s["e2e_s"]["p50"], rel=1e-9)
    assert req.arrival_s.nunique() == 8  # eight rounds of sends


def test_simulate_command_is_byte_identical_and_records_sends(tmp_path: Path) -> None:
    data = {"name": "loop", "model": "llama-3.1-8b", "gpu": "l4", "max_num_seqs": 8,
            "max_model_len": 4096,  # the default 131,072 does not fit an L4's KV: vLLM refuses it
            "allocators": ["paged", "contiguous-pow2"],
            "workload": {"prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
                         "output_tokens": {"dist": "uniform", "low": 5, "high": 60},
                         "concurrency": 12, "requests_per_client": 4, "think_time_s": 0.25,
                         "warmup_fraction": 0.25}}
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(data))
    outs = [run_simulate(str(path), out=str(tmp_path / k), overrides={}, quiet=True, plots=False)[0]
            for k in ("a", "b")]
    for name in ("summary.json", "requests.csv", "steps.csv", "run.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    req = pd.read_csv(outs[0] / "requests.csv")
    paged = req[req.allocator == "paged"]
    assert len(paged) == 48 and (paged.status == "finished").all()
    assert (paged.arrival_s.iloc[:12] == 0).all() and (paged.arrival_s.iloc[12:] > 0.25).all()
    summary = json.loads((outs[0] / "summary.json").read_text())["paged"]
    assert summary["warmup_requests"] == 12
    assert summary["throughput_window_s"] == pytest.approx(summary["makespan_s"] - paged.arrival_s.iloc[12])
