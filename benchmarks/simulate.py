"""Simulator speed: requests simulated per wall-second, against a per-sequence baseline in the same run.

    python benchmarks/simulate.py [--quick] [--synthetic 1000000]

* Azure 2023 conversation trace (19,366 requests, one hour), scenario ``scenarios/chat.yaml``,
  each of the four allocators: kvplan's event-driven scheduler, which touches a sequence only at
  block boundaries and finishes.
* The same run with the scheduler in detail mode — it visits every running sequence every step
  and builds its block table and slot mapping, as an executor needs and as a per-token
  simulator would. Its ratio is what the event-driven design buys.
* A synthetic trace of ``--synthetic`` requests (chat-like lognormal lengths, Poisson arrivals,
  4 replicas), paged allocator: the scale check (10^6 requests in about a minute).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.deployment import build_deployment  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from workloads.spec import build_requests  # noqa: E402


def timed(dep, allocator: str, requests, *, detail: bool = False) -> tuple[float, int]:
    t = time.perf_counter()
    result = simulate(requests, dep.replica_factory(allocator, detail=detail), dep.latency,
                      num_replicas=dep.scenario.num_replicas)
    return time.perf_counter() - t, len(result.steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the synthetic scale run")
    ap.add_argument("--synthetic", type=int, default=1_000_000, help="requests of the scale run")
    args = ap.parse_args()

    scenario, base = load_scenario(ROOT / "scenarios" / "chat.yaml")
    dep = build_deployment(scenario, base)
    requests = build_requests(scenario.workload, seed=0, base_dir=base)
    rows = []
    for allocator in scenario.allocators:
        secs, steps = timed(dep, allocator, requests)
        rows.append((f"azure-conv / {allocator}", len(requests), steps, secs))
    base_secs, steps = timed(dep, "paged", requests, detail=True)
    rows.append(("azure-conv / paged, detail (baseline)", len(requests), steps, base_secs))

    if not args.quick:
        synth, sbase = load_scenario(ROOT / "scenarios" / "chat.yaml", {
            "allocators": ["paged"], "num_replicas": 4,
            "workload": {
                "num_requests": args.synthetic,
                "arrival": {"process": "poisson", "rate": 60.0},
                "prompt_tokens": {"dist": "lognormal", "mean": 1000, "p99": 4000, "max": 6000},
                "output_tokens": {"dist": "lognormal", "mean": 200, "p99": 1000, "max": 2000},
            },
        })
        sdep = build_deployment(synth, sbase)
        t = time.perf_counter()
        sreq = build_requests(synth.workload, seed=0, base_dir=sbase)
        gen = time.perf_counter() - t
        secs, steps = timed(sdep, "paged", sreq)
        rows.append((f"synthetic {args.synthetic:,} / paged, 4 replicas", len(sreq), steps, secs))
        print(f"(generating {len(sreq):,} synthetic requests took {gen:.1f} s)")

    paged = rows[0][3]
    print(f"{'run':<44} {'requests':>10} {'steps':>9} {'seconds':>8} {'req/s':>10} {'vs baseline':>11}")
    for name, n, steps, secs in rows:
        ratio = f"{base_secs / secs:.2f}x" if name.startswith("azure") else ""
        print(f"{name:<44} {n:>10,} {steps:>9,} {secs:>8.2f} {n / secs:>10,.0f} {ratio:>11}")
    print(f"event-driven paged vs detail mode on azure-conv: {base_secs / paged:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
