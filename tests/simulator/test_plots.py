"""Plots of a simulation: exact binning, valid deterministic PNGs, edge cases, the story visible."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from simulator.errors import KvplanError
from simulator.report.plots import (
    KV_COLUMNS,
    binned_integrals,
    binned_kv_fractions,
    binned_step_means,
    time_axis,
    write_plots,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NAMES = ["kv_memory.png", "batch_size.png", "latency_cdf.png", "allocators.png"]
CAPACITY_TOKENS = 1000
# Share of the pool (token state, reserved, internal, external) at full load, per allocator.
PROFILES = {
    "paged": (0.85, 0.05, 0.02, 0.0),
    "contiguous-max": (0.12, 0.04, 0.72, 0.06),
    "contiguous-pow2": (0.45, 0.08, 0.25, 0.04),
    "contiguous-oracle": (0.60, 0.15, 0.0, 0.05),
}


# ----------------------------------------------------------------------------- synthetic data
def make_steps(allocators: list[str], num_steps: int = 150, num_replicas: int = 1) -> pd.DataFrame:
    rows = []
    for name in allocators:
        shares = np.array(PROFILES[name])
        for replica in range(num_replicas):
            for i in range(num_steps):
                load = 0.6 + 0.4 * math.sin(i / 15)
                kv = np.floor(shares * load * CAPACITY_TOKENS).astype(int)
                running = 4 + i % 9 if name == "paged" else 2 + i % 3
                rows.append({
                    "allocator": name, "replica": replica, "step": i,
                    "time_s": i * 0.05 + replica * 0.01, "duration_s": 0.04,
                    "num_prefill_seqs": 1, "num_prefill_tokens": 100, "num_decode_seqs": running - 1,
                    "num_running_seqs": running, "num_waiting": max(0, 30 - i // 4), "num_preempted": 0,
                    "kv_token_state": kv[0], "kv_reserved": kv[1], "kv_internal_fragmentation": kv[2],
                    "kv_external_fragmentation": kv[3], "kv_free": CAPACITY_TOKENS - kv.sum(),
                    "kv_shared_saved": 0,
                })
    return pd.DataFrame(rows)


def make_requests(allocators: list[str], num_requests: int = 120, rejected: set[str] = frozenset()
                  ) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    rows = []
    for name in allocators:
        slow = 1.0 if name == "paged" else 20.0
        for i in range(num_requests):
            done = name not in rejected and i % 10 != 9
            output_tokens = 1 if i % 17 == 0 else 50
            ttft = float(rng.lognormal(math.log(0.05 * slow), 0.8)) if done else math.nan
            tpot = float(rng.lognormal(math.log(0.012), 0.2)) if done and output_tokens > 1 else math.nan
            rows.append({
                "allocator": name, "request_id": i, "replica": 0, "arrival_s": i * 0.05,
                "prompt_tokens": 200, "output_tokens": output_tokens, "n": 1, "beam_width": 1,
                "status": "finished" if done else "rejected",
                "reject_reason": "" if done else "prompt longer than the KV pool",
                "queue_delay_s": 0.0 if done else math.nan, "ttft_s": ttft, "tpot_s": tpot,
                "e2e_s": ttft + 49 * tpot if done and output_tokens > 1 else ttft,
                "num_preemptions": 0, "num_swaps": 0, "prefix_hit_tokens": 0,
            })
    return pd.DataFrame(rows)


def make_summary(steps: pd.DataFrame, allocators: list[str]) -> dict[str, dict]:
    summary = {}
    for name in allocators:
        mine = steps[steps.allocator == name]
        weight = mine.duration_s.to_numpy()
        kv = {col.removeprefix("kv_"): float((mine[col] * weight).sum() / weight.sum() / CAPACITY_TOKENS)
              for col in KV_COLUMNS}
        kv["free"] = kv.pop("free")
        kv["kv_capacity_tokens"] = CAPACITY_TOKENS
        summary[name] = {
            "completed": 108, "rejected": 12, "throughput_req_s": 10.0,
            "throughput_tok_s": 2400.0 if name == "paged" else 900.0,
            "ttft_s": {"mean": 0.1, "p50": 0.05, "p90": 0.2, "p99": 0.4},
            "tpot_s": {"mean": 0.012, "p50": 0.012, "p90": 0.015, "p99": 0.02},
            "e2e_s": {"mean": 1.0, "p50": 0.9, "p90": 1.5, "p99": 2.0},
            "mean_batch_size": float(mine.num_running_seqs.mean()),
            "max_batch_size": int(mine.num_running_seqs.max()),
            "num_preemptions": 0, "prefix_hit_rate": 0.0, "kv": kv,
        }
    return summary


def write(tmp_path: Path, allocators: list[str], **kwargs) -> list[Path]:
    steps = kwargs.pop("steps", None)
    steps = make_steps(allocators) if steps is None else steps
    requests = kwargs.pop("requests", None)
    requests = make_requests(allocators) if requests is None else requests
    summary = kwargs.pop("summary", None)
    summary = make_summary(make_steps(allocators), allocators) if summary is None else summary
    return write_plots(tmp_path, steps, requests, summary, title="synthetic", **kwargs)


def assert_pngs(paths: list[Path]) -> list[np.ndarray]:
    assert [p.name for p in paths] == NAMES
    images = []
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC
        image = mpimg.imread(path)
        height, width = image.shape[:2]
        assert 600 <= width <= 2000 and 300 <= height <= 2000, (path.name, image.shape)
        assert image[..., :3].std() > 0.05  # not a blank canvas
        images.append(image)
    return images


# ----------------------------------------------------------------------------- binning
def overlap_reference(starts, ends, values, edges):
    """Interval-by-bin overlaps, the slow obvious way."""
    out = np.zeros((len(edges) - 1, values.shape[1]))
    for s, e, v in zip(starts, ends, values):
        for b in range(len(edges) - 1):
            out[b] += v * max(0.0, min(e, edges[b + 1]) - max(s, edges[b]))
    return out


def test_binned_integrals_worked_example():
    # 2 on [0, 1), 1 on [2, 4); bins [0, 1.5), [1.5, 3), [3, 4)
    got = binned_integrals(np.array([0.0, 2.0]), np.array([1.0, 4.0]), np.array([[2.0], [1.0]]),
                           np.array([0.0, 1.5, 3.0, 4.0]))
    assert got[:, 0].tolist() == [2.0, 1.0, 1.0]


@pytest.mark.parametrize("seed", range(5))
def test_binned_integrals_match_the_overlap_reference(seed):
    rng = np.random.default_rng(seed)
    n = 40
    starts = np.cumsum(rng.exponential(1.0, n))
    ends = starts + rng.uniform(0, 1, n) * np.diff(np.append(starts, starts[-1] + 2))
    zero_length = rng.random(n) < 0.1  # zero-duration steps happen (an empty plan)
    ends[zero_length] = starts[zero_length]
    values = rng.integers(0, 50, (n, 3)).astype(float)
    edges = np.linspace(-1.0, ends[-1] + 3.0, 23)
    np.testing.assert_allclose(binned_integrals(starts, ends, values, edges),
                               overlap_reference(starts, ends, values, edges), atol=1e-9)


def test_binned_step_means_worked_example_and_replicas_add_up():
    steps = pd.DataFrame({"replica": [0, 0], "step": [0, 1], "time_s": [0.0, 2.0], "duration_s": [1.0, 1.0],
                          "num_running_seqs": [4, 2]})
    edges = np.array([0.0, 2.0, 4.0])
    # step 0 runs 4 sequences for 1 s of a 2 s bin; the idle second counts as 0
    assert binned_step_means(steps, ["num_running_seqs"], edges)[:, 0].tolist() == [2.0, 1.0]
    two = pd.concat([steps, steps.assign(replica=1)], ignore_index=True)
    assert binned_step_means(two, ["num_running_seqs"], edges)[:, 0].tolist() == [4.0, 2.0]
    # a row that overlaps the next step counts only until that step starts
    overlapping = steps.assign(time_s=[0.0, 0.5])
    means = binned_step_means(overlapping, ["num_running_seqs"], edges)[:, 0]
    assert means.tolist() == [(4 * 0.5 + 2 * 1) / 2, 0.0]


def test_binned_kv_fractions_worked_example():
    # pool of 10; free before the first step, each breakdown holds until the next step starts
    steps = pd.DataFrame({
        "replica": [0, 0], "step": [0, 1], "time_s": [1.0, 3.0], "duration_s": [1.0, 1.0],
        "kv_token_state": [6, 2], "kv_reserved": [0, 0], "kv_internal_fragmentation": [0, 8],
        "kv_external_fragmentation": [0, 0], "kv_free": [4, 0],
    })
    shares = binned_kv_fractions(steps, np.array([0.0, 2.0, 4.0]))
    np.testing.assert_allclose(shares, [[0.3, 0, 0, 0, 0.7], [0.4, 0, 0.4, 0, 0.2]])


def test_binned_kv_fractions_sum_to_one_and_skip_nan_rows():
    steps = make_steps(["paged", "contiguous-max"], num_replicas=2)
    steps.loc[5, "kv_reserved"] = np.nan
    edges = time_axis(steps, num_bins=50).edges_s
    for name in ("paged", "contiguous-max"):
        shares = binned_kv_fractions(steps[steps.allocator == name], edges)
        assert shares.shape == (50, 5)
        np.testing.assert_allclose(shares.sum(axis=1), 1.0)
        assert (shares >= 0).all()


@pytest.mark.parametrize("span_s, unit", [(100.0, "s"), (1000.0, "min"), (5 * 3600.0, "h")])
def test_time_axis_unit_fits_the_span(span_s, unit):
    steps = pd.DataFrame({"time_s": [0.0, span_s - 1], "duration_s": [1.0, 1.0]})
    axis = time_axis(steps, num_bins=10)
    assert axis.unit == unit and len(axis.edges_s) == 11
    assert axis.edges_s[0] == 0.0 and axis.edges_s[-1] == pytest.approx(span_s)


# ----------------------------------------------------------------------------- figures
def test_four_valid_pngs_and_no_pyplot_figures(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    paths = write(tmp_path / "out", list(PROFILES))
    assert_pngs(paths)
    assert plt.get_fignums() == before


def test_same_data_gives_identical_bytes(tmp_path):
    allocators = ["paged", "contiguous-max"]
    first = write(tmp_path / "a", allocators)
    second = write(tmp_path / "b", allocators)
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name


def _share_of_colour(image: np.ndarray, hex_colour: str) -> float:
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
    return float((np.abs(image[..., :3] - rgb).max(axis=-1) < 0.02).mean())


def test_kv_memory_shows_paged_as_token_state_and_contiguous_max_as_internal_waste(tmp_path):
    paths = write(tmp_path, ["paged", "contiguous-max"])
    image = mpimg.imread(paths[0])
    top, bottom = image[: len(image) // 2], image[len(image) // 2:]
    token_blue, internal_orange = "#0072B2", "#E69F00"
    assert _share_of_colour(top, token_blue) > 4 * _share_of_colour(bottom, token_blue)
    assert _share_of_colour(bottom, internal_orange) > 10 * _share_of_colour(top, internal_orange)


def test_single_allocator(tmp_path):
    assert_pngs(write(tmp_path, ["paged"]))


def test_empty_tables_still_give_figures(tmp_path):
    summary = make_summary(make_steps(["paged"]), ["paged"])
    assert_pngs(write(tmp_path / "bare", ["paged"], steps=pd.DataFrame(), requests=pd.DataFrame(),
                      summary=summary))
    no_rows = make_steps(["paged"]).iloc[:0]
    no_requests = make_requests(["paged"]).iloc[:0]
    assert_pngs(write(tmp_path / "typed", ["paged"], steps=no_rows, requests=no_requests, summary={}))


def test_all_requests_rejected(tmp_path):
    allocators = ["paged", "contiguous-max"]
    some = make_requests(allocators, rejected={"contiguous-max"})
    assert_pngs(write(tmp_path / "some", allocators, requests=some))
    everyone = make_requests(allocators, rejected=set(allocators))
    assert_pngs(write(tmp_path / "all", allocators, requests=everyone))


def test_nans_in_steps_requests_and_summary(tmp_path):
    allocators = ["paged", "contiguous-pow2"]
    steps = make_steps(allocators)
    steps.loc[::7, "duration_s"] = np.nan
    steps.loc[3::11, "kv_free"] = np.nan
    steps.loc[4::13, "num_waiting"] = np.nan
    summary = make_summary(make_steps(allocators), allocators)
    summary["contiguous-pow2"]["ttft_s"]["p99"] = math.nan
    summary["contiguous-pow2"]["kv"]["token_state"] = None
    assert_pngs(write(tmp_path, allocators, steps=steps, summary=summary))


def test_allocator_missing_from_summary_is_still_drawn(tmp_path):
    allocators = ["paged", "contiguous-max"]
    summary = make_summary(make_steps(allocators), ["paged"])
    assert_pngs(write(tmp_path, allocators, summary=summary))


def test_missing_column_is_named(tmp_path):
    steps = make_steps(["paged"]).drop(columns=["kv_reserved"])
    with pytest.raises(KvplanError, match="steps table lacks column.*'kv_reserved'"):
        write(tmp_path, ["paged"], steps=steps)


def test_missing_summary_field_is_named(tmp_path):
    summary = make_summary(make_steps(["paged"]), ["paged"])
    del summary["paged"]["max_batch_size"]
    with pytest.raises(KvplanError, match="'paged' has no field 'max_batch_size'"):
        write(tmp_path, ["paged"], summary=summary)
    summary = make_summary(make_steps(["paged"]), ["paged"])
    summary["paged"]["ttft_s"]["p99"] = "fast"
    with pytest.raises(KvplanError, match="'paged.ttft_s.p99' is 'fast', not a number"):
        write(tmp_path / "out", ["paged"], summary=summary)
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_negative_duration_is_an_input_error(tmp_path):
    steps = make_steps(["paged"])
    steps.loc[3, "duration_s"] = -0.5
    with pytest.raises(KvplanError, match="negative duration_s in 1 row"):
        write(tmp_path / "out", ["paged"], steps=steps)
    assert not (tmp_path / "out").exists()


def test_output_folder_that_is_a_file(tmp_path):
    target = tmp_path / "plots"
    target.write_text("not a folder")
    with pytest.raises(KvplanError, match="not a folder"):
        write(target, ["paged"])
