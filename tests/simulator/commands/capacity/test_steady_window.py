"""The steady window: capacity's req/s, goodput, tok/s and $ describe the same requests, with the
warm-up and the drain left out (simulator/commands/capacity/search.py)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.commands.capacity.cmd import run_capacity
from simulator.commands.capacity.search import Probe, RateWorkload, simulate_probe, window_rates
from simulator.commands.capacity.sweep import window_caveats
from simulator.config.deployment import build_deployment
from simulator.config.scenario import SLOSpec, parse_scenario
from simulator.scheduler import Status

STEP_S = 0.02


def scenario(workload: dict[str, Any], slo: dict[str, float], **extra: Any) -> dict[str, Any]:
    return {"name": "window", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 64,
            "latency": {"model": "constant", "step_s": STEP_S}, "workload": workload, "slo": slo, **extra}


def probe_at(data: dict[str, Any], rate: float | None = None, concurrency: int | None = None) -> Probe:
    sc = parse_scenario(data, "window.yaml")
    assert sc.slo is not None
    dep = build_deployment(sc, Path("."))
    workload = RateWorkload(sc.workload, seed=sc.seed, base_dir=Path("."))
    if concurrency is not None:
        requests, clients = workload.at_concurrency(concurrency)
        return simulate_probe(dep, "paged", None, 0, sc.slo, requests, record_steps=False, clients=clients)
    assert rate is not None
    requests = workload.at_rate(rate)
    return simulate_probe(dep, "paged", rate, 0, sc.slo, requests, record_steps=False,
                          clients=sc.workload.client_policy(len(requests)))


TRACE = {"trace": "bundled:azure-conv", "num_requests": 150}
LOOSE = {"ttft_p99_s": 60.0, "tpot_p99_s": 1.0}


def test_goodput_is_the_rate_when_every_request_meets_the_slo() -> None:
    """A trace at a light load: every request finishes within the SLO, so goodput = throughput =
    the rate searched (the selection is rescaled to exactly that rate), and output tokens/s is
    that rate × the tokens per request — the drain after the last arrival no longer dilutes them."""
    rate = 3.0
    probe = probe_at(scenario(TRACE, LOOSE), rate)
    assert probe.ok and probe.completed == 150 and probe.steady
    assert probe.goodput_req_s == pytest.approx(rate, rel=1e-9)
    assert probe.throughput_req_s == pytest.approx(rate, rel=1e-9)
    requests = RateWorkload(parse_scenario(scenario(TRACE, LOOSE), "x").workload, seed=0,
                            base_dir=Path(".")).at_rate(rate)
    assert probe.window_s == pytest.approx(requests[-1].arrival_s)  # first arrival at 0
    counted = requests[:-1]  # [first, last): the last arrival closes the window
    assert probe.throughput_tok_s == pytest.approx(sum(r.output_tokens for r in counted) / probe.window_s)


def test_goodput_counts_only_requests_within_every_bound() -> None:
    """A TTFT bound that one-token-step requests meet only when alone: goodput falls below the
    throughput, which stays the rate (everything finishes)."""
    data = scenario({"arrival": {"process": "constant", "rate": 1.0}, "num_requests": 40,
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 4}},
                    {"ttft_p99_s": 1.5 * STEP_S}, max_num_seqs=1)
    probe = probe_at(data, 1 / (3 * STEP_S))  # a request every 3 steps, each taking 4: a queue builds
    assert probe.throughput_req_s == pytest.approx(1 / (3 * STEP_S))
    assert 0 < probe.goodput_req_s < probe.throughput_req_s


def test_served_tokens_saturate_where_the_offered_ones_do_not() -> None:
    """One request at a time, o tokens in o steps of S: the server emits 1/S tokens per second
    whatever the rate. At half that load it keeps up (served ≈ offered tokens/s); at twice it,
    requests counted at arrival still say 2/S, the tokens served during the window say 1/S."""
    out = 5

    def at(load: float) -> Probe:
        data = scenario({"arrival": {"process": "constant", "rate": 1.0}, "num_requests": 200,
                         "prompt_tokens": {"dist": "fixed", "value": 16},
                         "output_tokens": {"dist": "fixed", "value": out}}, LOOSE, max_num_seqs=1)
        return probe_at(data, load / (out * STEP_S))

    light, heavy = at(0.5), at(2.0)
    assert light.served_tok_s == pytest.approx(light.throughput_tok_s, rel=0.02)
    assert heavy.throughput_tok_s == pytest.approx(2 / STEP_S)
    assert heavy.served_tok_s == pytest.approx(1 / STEP_S, rel=0.02)


def test_warm_up_is_left_out_of_the_window() -> None:
    """Constant arrivals every 1/r s, the first K warm-up: the window runs from request K's
    arrival to the last, (N − 1 − K) / r seconds, and the rate is still r."""
    rate, n, k = 5.0, 50, 10
    data = scenario({"arrival": {"process": "constant", "rate": rate}, "num_requests": n,
                     "warmup_requests": k, "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 3}}, LOOSE)
    probe = probe_at(data, rate)
    assert probe.window_s == pytest.approx((n - 1 - k) / rate)
    assert probe.throughput_req_s == pytest.approx(rate) and probe.goodput_req_s == pytest.approx(rate)
    assert probe.throughput_tok_s == pytest.approx(3 * rate)


def test_clients_sent_at_once_have_no_steady_window() -> None:
    """As many closed-loop clients as requests: all sent at t = 0, no arrival gap to measure over;
    the rates fall back to the run window and the row says so."""
    data = scenario({"prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 4}, "concurrency": 1,
                     "requests_per_client": 1}, LOOSE)
    data["workload"]["num_requests"] = 8
    probe = probe_at(data, concurrency=8)
    assert not probe.steady
    assert probe.window_s == pytest.approx(4 * STEP_S)  # one batch: 4 steps, the run window
    assert probe.throughput_req_s == pytest.approx(8 / (4 * STEP_S))
    (caveat,) = window_caveats([probe])
    assert caveat.startswith("no steady window")


def test_a_window_shorter_than_two_request_lifetimes_is_flagged() -> None:
    base = probe_at(scenario(TRACE, LOOSE), 3.0)
    assert window_caveats([base]) == []  # 50 s of arrivals, E2E of a few seconds
    assert base.e2e_p99_s is not None
    short = Probe(**{**base.to_json(), "failures": (), "window_s": 1.9 * base.e2e_p99_s})
    (caveat,) = window_caveats([short])
    assert "shorter than 2 × the p99 E2E" in caveat and "raise workload.num_requests" in caveat


def test_capacity_goodput_matches_req_s(tmp_path: Path) -> None:
    """End to end: at the capacity found, goodput is the rate up to the 1% of requests the p99
    bounds may leave out, and $/M tok follows from tok/s; the CSV says the window's length."""
    path = tmp_path / "window.yaml"
    path.write_text(yaml.safe_dump(scenario(TRACE, {"ttft_p99_s": 0.5, "tpot_p99_s": 0.05},
                                            allocators=["paged"])))
    run_capacity(str(path), num_seeds=1, jobs=1, out=str(tmp_path / "out"), plots_on=False, quiet=True,
                 use_cache=False, tolerance=0.1)
    with (tmp_path / "out" / "capacity.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    rate, goodput = float(row["max_rate_req_s"]), float(row["goodput_req_s"])
    assert row["status"] == "ok" and 0.98 * rate <= goodput <= rate * (1 + 1e-5)
    assert float(row["window_s"]) == pytest.approx(149 / rate, rel=1e-5)


# --- window_rates on its own --------------------------------------------------------------------


def frame(arrivals: list[float], finished: list[bool], ttft: list[float], output: list[int],
          n: list[int]) -> pd.DataFrame:
    status = [Status.FINISHED.value if f else Status.REJECTED.value for f in finished]
    nan = float("nan")
    return pd.DataFrame({
        "arrival_s": arrivals, "status": status, "output_tokens": output, "n": n, "beam_width": 1,
        "ttft_s": [t if f else nan for t, f in zip(ttft, finished)],
        "tpot_s": nan, "e2e_s": [t + 1 if f else nan for t, f in zip(ttft, finished)],
    })


@st.composite
def requests(draw: st.DrawFn) -> pd.DataFrame:
    num = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=num, max_size=num))
    return frame(list(np.cumsum(gaps)), draw(st.lists(st.booleans(), min_size=num, max_size=num)),
                 draw(st.lists(st.floats(0.0, 2.0), min_size=num, max_size=num)),
                 draw(st.lists(st.integers(1, 50), min_size=num, max_size=num)),
                 draw(st.lists(st.integers(1, 3), min_size=num, max_size=num)))


@settings(max_examples=40, deadline=None)
@given(requests())
def test_window_rates_count_each_arrival_gap_once(measured: pd.DataFrame) -> None:
    slo = SLOSpec(ttft_p99_s=1.0)
    arrivals = measured.arrival_s.to_numpy(dtype=np.float64)
    rates = window_rates(measured, arrivals, slo, run_window_s=7.0)
    span = float(arrivals.max() - arrivals.min())
    assert rates.goodput_req_s <= rates.throughput_req_s <= rates.rate_req_s
    if span == 0:
        assert not rates.steady and rates.window_s == 7.0
        assert rates.rate_req_s == pytest.approx(len(measured) / 7.0)
        return
    counted = arrivals < arrivals.max()
    done = counted & (measured.status == Status.FINISHED.value).to_numpy()
    assert rates.steady and rates.window_s == pytest.approx(span)
    assert rates.rate_req_s == pytest.approx(counted.sum() / span)
    assert rates.throughput_req_s == pytest.approx(done.sum() / span)
    tokens = (measured.output_tokens * measured.n).to_numpy()[done].sum()
    assert rates.throughput_tok_s == pytest.approx(tokens / span)
    good = done & (measured.ttft_s.to_numpy() <= 1.0)
    assert rates.goodput_req_s == pytest.approx(good.sum() / span)
