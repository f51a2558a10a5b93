"""Synthetic generators: statistics against their definitions, exact fits, determinism,
prefix groups, and the list transformations (rate scaling, slicing, context window)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from simulator.errors import KvplanError
from workloads.request import Request
from workloads.synthetic import (
    SharedPrefix,
    arrival_times_s,
    clip_lengths,
    empirical_lengths,
    fit_to_max_model_len,
    fixed_lengths,
    interarrival_s,
    lognormal_lengths,
    lognormal_params,
    make_requests,
    mean_rate_per_s,
    rescale_to_rate,
    scale_rate,
    slice_requests,
    uniform_lengths,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def cv_of(gaps: np.ndarray) -> float:
    return float(gaps.std() / gaps.mean())


# --- arrivals -----------------------------------------------------------------------------


@pytest.mark.parametrize(("process", "cv"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0),
                                             ("constant", 0.0)])
def test_arrival_rate_and_burstiness(process: str, cv: float) -> None:
    arrivals = arrival_times_s(
        process, 8.0, rng(), cv=cv or 1.0, num_requests=20_000  # type: ignore[arg-type]
    )
    assert len(arrivals) == 20_000 and arrivals[0] == 0.0
    assert np.all(np.diff(arrivals) >= 0)
    rate = (len(arrivals) - 1) / arrivals[-1]
    assert rate == pytest.approx(8.0, rel=0.03 * max(cv, 1.0))
    assert cv_of(np.diff(arrivals)) == pytest.approx(cv, abs=0.06 * max(cv, 1.0))


def test_constant_arrivals_are_exact() -> None:
    np.testing.assert_allclose(arrival_times_s("constant", 4.0, rng(), num_requests=5),
                               [0.0, 0.25, 0.5, 0.75, 1.0])


def test_arrivals_by_duration() -> None:
    arrivals = arrival_times_s("poisson", 50.0, rng(), duration_s=400.0)
    assert arrivals[-1] < 400.0
    assert len(arrivals) == pytest.approx(20_000, rel=0.03)
    capped = arrival_times_s("poisson", 50.0, rng(), duration_s=400.0, num_requests=100)
    np.testing.assert_array_equal(capped, arrivals[:100])  # same stream, cut earlier


def test_arrival_errors() -> None:
    with pytest.raises(KvplanError, match="need num_requests or duration_s"):
        arrival_times_s("poisson", 1.0, rng())
    with pytest.raises(KvplanError, match=r"positive number of requests/s \(got 0.0\)"):
        interarrival_s("poisson", 0.0, 3, rng())


# --- lengths ------------------------------------------------------------------------------


def test_lognormal_fit_is_exact() -> None:
    mu, sigma = lognormal_params(161.0, 1024.0, 99.0)
    z = NormalDist().inv_cdf(0.99)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(161.0, rel=1e-12)
    assert math.exp(mu + z * sigma) == pytest.approx(1024.0, rel=1e-12)
    # median 100, mean 100·e^0.5 -> sigma 1, mu ln 100 (a worked example)
    mu, sigma = lognormal_params(100 * math.exp(0.5), 100.0, 50.0)
    assert (mu, sigma) == (pytest.approx(math.log(100)), pytest.approx(1.0))


def test_lognormal_samples_match_mean_and_percentile() -> None:
    lengths = lognormal_lengths(200_000, 161.0, 1024.0, 99.0, rng())
    assert lengths.mean() == pytest.approx(161.0, rel=0.02)
    assert np.percentile(lengths, 99) == pytest.approx(1024.0, rel=0.03)


@pytest.mark.parametrize(
    ("mean", "value", "pct", "message"),
    [
        (100.0, 1500.0, 99.0, r"lognormal p99 1500 must lie in \(100, 1496\.\d+\] for mean 100"),
        (100.0, 90.0, 99.0, r"lognormal p99 90 must lie in \(100, "),
        (100.0, 120.0, 50.0, r"lognormal p50 120 must be below the mean 100"),
    ],
)
def test_lognormal_infeasible(mean: float, value: float, pct: float, message: str) -> None:
    with pytest.raises(KvplanError, match=message):
        lognormal_params(mean, value, pct)


def test_other_length_distributions() -> None:
    assert fixed_lengths(3, 128).tolist() == [128, 128, 128]
    uniform = uniform_lengths(10_000, 5, 8, rng())
    assert set(uniform.tolist()) == {5, 6, 7, 8}
    observed = [3, 50, 900]
    assert set(empirical_lengths(1000, observed, rng()).tolist()) == set(observed)
    assert clip_lengths(np.array([0, 5, 99]), 1, 50).tolist() == [1, 5, 50]
    with pytest.raises(KvplanError, match="low <= high"):
        uniform_lengths(1, 9, 8, rng())


# --- requests, prefixes, determinism ------------------------------------------------------


def build(seed: int, num: int = 2000) -> list[Request]:
    generator = rng(seed)
    prefix = SharedPrefix(num_groups=4, prefix_tokens=520, popularity="zipf")
    arrivals = arrival_times_s("gamma", 5.0, generator, cv=2.0, num_requests=num)
    prompts = clip_lengths(lognormal_lengths(num, 161, 1024, 99, generator), 1, 2048)
    groups = prefix.sample_groups(num, generator)
    return make_requests(arrivals, prompts, fixed_lengths(num, 64), n=2, groups=groups,
                         shared_prefix=prefix)


def test_same_seed_same_requests() -> None:
    assert build(7) == build(7)
    assert build(7) != build(8)


def test_prefix_groups() -> None:
    requests = build(1, num=20_000)
    prefix = SharedPrefix(num_groups=4, prefix_tokens=520, popularity="zipf")
    assert prefix.num_prefix_blocks == 32  # 520 // 16: the partial block is not shareable
    by_group: dict[tuple[int, ...], int] = {}
    for r in requests:
        assert r.prompt_tokens >= 520 + 1 and r.prefix_block_tokens == 16 and r.n == 2
        by_group[r.prefix_ids] = by_group.get(r.prefix_ids, 0) + 1
    assert sorted(by_group) == [tuple(range(g * 32, g * 32 + 32)) for g in range(4)]
    shares = [by_group[prefix.group_prefix_ids(g)] / len(requests) for g in range(4)]
    np.testing.assert_allclose(shares, prefix.group_probabilities(), atol=0.015)
    np.testing.assert_allclose(prefix.group_probabilities(), np.array([12, 6, 4, 3]) / 25)


def test_prefix_needs_a_full_block() -> None:
    with pytest.raises(KvplanError, match="prefix_tokens >= block_tokens"):
        SharedPrefix(num_groups=2, prefix_tokens=8).sample_groups(3, rng())


# --- transformations ----------------------------------------------------------------------


def trace(times: list[float]) -> list[Request]:
    return [Request(i, t, 10 + i, 5) for i, t in enumerate(times)]


def test_scale_and_rescale_rate() -> None:
    requests = trace([0.0, 1.0, 3.0, 4.0])
    assert mean_rate_per_s(requests) == 0.75
    assert [r.arrival_s for r in scale_rate(requests, 2.0)] == [0.0, 0.5, 1.5, 2.0]
    rescaled = rescale_to_rate(requests, 3.0)
    assert mean_rate_per_s(rescaled) == pytest.approx(3.0)
    assert [r.prompt_tokens for r in rescaled] == [10, 11, 12, 13]
    with pytest.raises(KvplanError, match="arrive at one instant"):
        rescale_to_rate(trace([2.0, 2.0]), 1.0)


def test_slice_renumbers_and_rebases() -> None:
    requests = trace([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    sliced = slice_requests(requests, start_s=1.5, duration_s=3.0)
    assert [(r.request_id, r.arrival_s, r.prompt_tokens) for r in sliced] == [
        (0, 0.0, 12), (1, 1.0, 13), (2, 2.0, 14)]
    assert [r.prompt_tokens for r in slice_requests(requests, num_requests=2)] == [10, 11]
    with pytest.raises(KvplanError, match=r"no requests in the slice start_s=9.*spans 0-5 s"):
        slice_requests(requests, start_s=9.0)


def test_fit_to_max_model_len() -> None:
    requests = [Request(0, 0.0, 100, 50), Request(1, 1.0, 200, 5), Request(2, 2.0, 150, 80)]
    fit = fit_to_max_model_len(requests, 200)
    assert (fit.num_dropped, fit.num_truncated) == (1, 1)
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in fit.requests] == [
        (0, 0.0, 100, 50), (1, 2.0, 150, 50)]
    with pytest.raises(KvplanError, match="every prompt of the workload is longer"):
        fit_to_max_model_len(requests, 50)


def test_request_transformations_keep_every_field() -> None:
    """Rescaling, slicing, untiming and the max_model_len policy rebuild requests: every field
    they do not change is carried over, ``kv_ready_tokens`` (KV computed elsewhere) included."""
    from workloads.synthetic import fit_to_max_model_len, scale_rate, slice_requests, untimed

    requests = [Request(i, 0.5 * i, 100 + i, 50, 2, 1, (7, 8), 16, 64) for i in range(4)]

    def kept(rs: list[Request]) -> None:
        assert [(r.n, r.beam_width, r.prefix_ids, r.prefix_block_tokens, r.kv_ready_tokens)
                for r in rs] == [(2, 1, (7, 8), 16, 64)] * len(rs)

    kept(scale_rate(requests, 2.0))
    kept(slice_requests(requests, start_s=0.5))
    kept(untimed(requests))
    fit = fit_to_max_model_len(requests, 151, "truncate")  # the longest two lose output tokens
    assert [r.output_tokens for r in fit.requests] == [50, 50, 49, 48]
    kept(fit.requests)
    # prompts of 102 and 103 tokens leave no room in 102: dropped, the survivors renumbered
    survivors = fit_to_max_model_len(requests, 102, "truncate").requests
    assert [(r.request_id, r.output_tokens) for r in survivors] == [(0, 2), (1, 1)]
    kept(survivors)
