"""--target-rate on a data-parallel deployment: a replica is data_parallel_size engines of
tensor_parallel GPUs each, so GPUs = replicas × TP × DP and the layout says so."""

from __future__ import annotations

import csv
from pathlib import Path

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[4]


def test_gpus_count_every_data_parallel_engine(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(["capacity", str(ROOT / "scenarios" / "deepseek-ep.yaml"), "--target-rate", "20",
               "--set", "workload.num_requests=300", "--max-replicas", "2", "--out", str(out),
               "--no-plots", "--no-cache", "--quiet", "--jobs", "1"])
    assert rc == 0
    row, = csv.DictReader((out / "capacity.csv").open(encoding="utf-8"))
    replicas = int(row["num_replicas"])
    # deepseek-ep.yaml: tensor_parallel 1, data_parallel_size 8, expert parallel
    assert int(row["gpus_per_replica"]) == 8 and int(row["num_gpus"]) == 8 * replicas
    assert row["layout"] == f"agg DP8×TP1 EP ×{replicas}"
    assert float(row["usd_per_hour"]) == float(row["price_usd_per_gpu_hour"]) * 8 * replicas
