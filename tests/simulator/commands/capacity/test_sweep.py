"""Sweeps: parsing, expansion, resolved points (failures kept), rows and prices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.commands.capacity.search import Probe, SearchResult
from simulator.commands.capacity.sweep import (
    CapacityFile,
    expand_sweep,
    gpu_price,
    parse_price_arg,
    parse_sweep_arg,
    read_capacity_scenario,
    resolve_points,
    seeds_for,
    summarize_searches,
)
from simulator.errors import KvplanError
from simulator.config.scenario import parse_scenario

BASE: dict[str, Any] = {
    "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 4,
    "latency": {"model": "constant", "step_s": 0.01},
    "workload": {"arrival": {"process": "poisson", "rate": 2.0},
                 "prompt_tokens": {"dist": "fixed", "value": 32},
                 "output_tokens": {"dist": "fixed", "value": 4}, "num_requests": 20},
    "slo": {"ttft_p99_s": 0.5},
}


def write(tmp_path: Path, data: dict[str, Any], name: str = "cap.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


# --- --sweep and the sweep: section ---------------------------------------------------------------


def test_parse_sweep_arg_reads_yaml_scalars() -> None:
    assert parse_sweep_arg("block_size=8,16,32") == ("block_size", [8, 16, 32])
    assert parse_sweep_arg("enable_prefix_caching=true,false") == ("enable_prefix_caching", [True, False])
    assert parse_sweep_arg("gpu_memory_utilization=0.8, 0.9") == ("gpu_memory_utilization", [0.8, 0.9])
    assert parse_sweep_arg("allocators=paged,max") == ("allocators", ["paged", "max"])
    assert parse_sweep_arg("latency.mem_efficiency=0.7") == ("latency.mem_efficiency", [0.7])


@pytest.mark.parametrize("text", ["x", "=1,2", "block_size=", "block_size=8,,16", "block_size"])
def test_parse_sweep_arg_syntax_errors(text: str) -> None:
    with pytest.raises(KvplanError) as err:
        parse_sweep_arg(text)
    assert str(err.value) == f"--sweep expects KEY=V1,V2,..., got '{text}'"


def test_unknown_and_forbidden_knobs() -> None:
    hint = r"^--sweep: unknown sweep knob 'blok_size' — did you mean 'block_size'\?$"
    with pytest.raises(KvplanError, match=hint):
        parse_sweep_arg("blok_size=8,16")
    with pytest.raises(KvplanError, match=r"'workload.rate' cannot be swept \(the search varies the rate\)"):
        parse_sweep_arg("workload.rate=1,2")
    with pytest.raises(KvplanError, match=r"'seed' cannot be swept \(use --seeds\)"):
        parse_sweep_arg("seed=1,2")
    with pytest.raises(KvplanError, match="zipped knobs"):
        parse_sweep_arg("model+tensor_parallel=a,b")


def test_expand_sweep_is_the_ordered_product_with_zipped_knobs() -> None:
    points = expand_sweep({"model+tensor_parallel": [["a", 1], ["b", 4]], "block_size": [8, 16]}, "f")
    assert points == [{"model": "a", "tensor_parallel": 1, "block_size": 8},
                      {"model": "a", "tensor_parallel": 1, "block_size": 16},
                      {"model": "b", "tensor_parallel": 4, "block_size": 8},
                      {"model": "b", "tensor_parallel": 4, "block_size": 16}]
    assert expand_sweep({}, "f") == [{}]
    with pytest.raises(KvplanError, match=r"^f: sweep.model\+tensor_parallel: each value is a list of 2"):
        expand_sweep({"model+tensor_parallel": [["a", 1, 2]]}, "f")
    with pytest.raises(KvplanError, match=r"^f: sweep: 'model' is swept twice$"):
        expand_sweep({"model+tensor_parallel": [["a", 1]], "model": ["b"]}, "f")


def test_read_capacity_scenario_splits_the_sweep(tmp_path: Path) -> None:
    path = write(tmp_path, {**BASE, "sweep": {"block_size": [8, 16]}})
    file = read_capacity_scenario(path, {"max_num_seqs": 8})
    assert file.sweep == {"block_size": [8, 16]} and "sweep" not in file.data
    assert file.data["max_num_seqs"] == 8 and file.data["name"] == "cap" and file.base_dir == tmp_path


@pytest.mark.parametrize(("change", "message"), [
    ({"slo": None}, r"capacity needs an 'slo:' section"),
    ({"slo": {"max_rejected_fraction": 0.1}}, r"slo: give at least one of ttft_p99_s, tpot_p99_s, e2e_p99_s"),
    ({"sweep": [1, 2]}, r"sweep: a mapping of knob -> list of values"),
    ({"sweep": {"block_size": []}}, r"sweep.block_size: a non-empty list of values"),
    ({"sweep": {"gpus": ["h100"]}}, r"unknown sweep knob 'gpus' — did you mean 'gpu'\?"),
    ({"max_num_seq": 3}, r"unknown key 'max_num_seq' — did you mean 'max_num_seqs'\?"),
])
def test_read_capacity_scenario_errors(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    data = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    path = write(tmp_path, data)
    with pytest.raises(KvplanError, match=rf"^{path}: .*{message}"):
        read_capacity_scenario(path)


# --- resolved points ------------------------------------------------------------------------------------


def test_an_impossible_point_fails_alone(tmp_path: Path) -> None:
    file = CapacityFile(dict(BASE), {"model": ["llama-3.1-8b", "llama-3.1-70b"], "block_size": [16, 32]},
                        tmp_path, "cap.yaml")
    points = resolve_points(file)
    assert [p.knobs for p in points][1] == {"model": "llama-3.1-8b", "block_size": 32}
    ok, failed = points[:2], points[2:]
    assert all(p.error is None and p.deployment is not None for p in ok)
    assert ok[1].deployment is not None and ok[1].deployment.scheduler_config.block_size == 32
    for p in failed:  # 70B in bf16 is ~131 GiB of weights: no room on one 80 GB GPU
        assert p.deployment is None and p.error is not None and "weights" in p.error
        assert p.where == f"cap.yaml [model=llama-3.1-70b, block_size={p.knobs['block_size']}]"


def test_seeds_for_traces_and_synthetic() -> None:
    synthetic = parse_scenario(dict(BASE, seed=7), "x")
    assert seeds_for(synthetic, 3) == ([7, 8, 9], None)
    trace = parse_scenario({**BASE, "workload": {"trace": "bundled:azure-conv", "num_requests": 10}}, "x")
    seeds, note = seeds_for(trace, 3)
    assert seeds == [0] and note is not None and "1 seed" in note
    beams = parse_scenario({**BASE, "workload": {"trace": "bundled:azure-conv", "beam_width": 2}}, "x")
    assert seeds_for(beams, 2)[0] == [0, 1]  # beam search draws from the seed
    with pytest.raises(KvplanError, match="--seeds must be at least 1"):
        seeds_for(synthetic, 0)


# --- rows -------------------------------------------------------------------------------------------------


def probe(rate: float, seed: int, tok_s: float, batch: int, ok: bool = True, ttft: float = 0.2) -> Probe:
    return Probe(rate, seed, ok, () if ok else ("TTFT p99 9 s > 0.5 s",), 20, 20, 0, rate, tok_s, rate * 0.9,
                 ttft, 0.01, 1.0, 0.1, 0.0, batch, 0, 0, 0.3, 0.5, 0.2)


def test_row_from_seeds_exact_numbers(tmp_path: Path) -> None:
    file = CapacityFile({**BASE, "tensor_parallel": 2}, {}, tmp_path, "cap.yaml")
    (point,) = resolve_points(file)
    seed0, seed1 = probe(8.0, 0, 900.0, 3), probe(10.0, 1, 1100.0, 4)
    results = [SearchResult(0, "paged", 0, 8.0, 8.4, (seed0,), seed0),
               SearchResult(0, "paged", 1, 10.0, 10.5, (seed1,), seed1)]
    row = summarize_searches(point, "paged", results, price_usd_per_gpu_hour=2.0)
    assert row.status == "ok" and row.num_seeds == 2
    assert row.max_rate_req_s == 9.0 and row.rate_ci_low_req_s == 8.0 and row.rate_ci_high_req_s == 10.5
    assert row.throughput_tok_s == 1000.0 and row.goodput_req_s == pytest.approx(8.1)
    # the seeds disagree: only seed 1 reached max_num_seqs (4)
    assert row.max_concurrency == 4 and row.limited_by == "latency/max_num_seqs"
    assert row.num_gpus == 2 and row.rate_per_gpu_req_s == 4.5
    # 2 GPUs × $2/h = $4/h for 1000 tok/s = 3.6 M tok/h -> $1.111 per million output tokens
    assert row.usd_per_m_output_tokens == pytest.approx(4.0 / 3.6)
    assert row.kv_capacity_tokens == point.deployment.capacity_tokens  # type: ignore[union-attr]


def test_row_when_the_slo_never_holds_or_always_holds(tmp_path: Path) -> None:
    (point,) = resolve_points(CapacityFile(dict(BASE), {}, tmp_path, "cap.yaml"))
    failing = (probe(1.0, 0, 1, 1, ok=False), probe(0.5, 0, 1, 1, ok=False))
    never = [SearchResult(0, "paged", 0, 0.0, 0.25, failing, None)]
    row = summarize_searches(point, "paged", never, 2.0)
    assert row.status == "slo-unmet" and row.max_rate_req_s == 0.0 and row.rate_ci_high_req_s == 0.25
    assert row.message == "SLO fails even at 0.5 req/s: TTFT p99 9 s > 0.5 s"
    always = [SearchResult(0, "paged", 0, 64.0, None, (probe(64.0, 0, 5.0, 1),), probe(64.0, 0, 5.0, 1))]
    row = summarize_searches(point, "paged", always, None)
    assert row.status == "unbounded" and row.rate_ci_high_req_s is None and "num_requests" in row.message
    assert row.usd_per_m_output_tokens is None


def test_prices(tmp_path: Path) -> None:
    assert parse_price_arg("h100=2.5") == ("H100-80GB", 2.5)
    for bad in ("h100", "h100=", "h100=-1", "h100=abc", "=3"):
        with pytest.raises(KvplanError, match="--price expects GPU=USD_PER_HOUR"):
            parse_price_arg(bad)
    with pytest.raises(KvplanError, match="unknown GPU 'h1000'"):
        parse_price_arg("h1000=2")
    (point,) = resolve_points(CapacityFile(dict(BASE), {}, tmp_path, "cap.yaml"))
    assert point.deployment is not None
    assert gpu_price(point.deployment, {}) == point.deployment.gpu.price_usd_per_hour
    assert gpu_price(point.deployment, {"H100-80GB": 9.0}) == 9.0
