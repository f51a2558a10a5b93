"""TensorRT-LLM's plans run unchanged on the real engine (backend/: CPU torch, the Triton kernels
in Triton's interpreter), as tests/backend/test_engines_realtime.py runs vLLM V1's and SGLang's.

Its tiny trace under memory pressure (a shared prefix; a request of two samples and one longer
than max_model_len, both refused by engine trtllm) on a 16-block pool: under MAX_UTILIZATION with
chunked context requests are paused and recomputed, under GUARANTEED_NO_EVICT none is. The
SimPy engine fed the measured step durations makes the same decisions, every step's plan
included, and every sampled token is the greedy token of a dense forward of the KV its block
table points at.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/backend/conftest.py)

from collections.abc import Iterator  # noqa: E402
from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

from simulator.engine.core import simulate  # noqa: E402
from simulator.report.fidelity import compare_decisions  # noqa: E402
from simulator.scheduler import Status  # noqa: E402
from tests.backend.test_engines_realtime import (  # noqa: E402
    V1, RecordingReplay, RecordingRunner, check_against_dense, replica_factory, run_realtime, trace)

CONFIGS = {
    # chunked context off: a prompt runs whole (the trace's longest, 40, is refused by max_model_len)
    "no-evict": replace(V1, engine="trtllm", enable_chunked_prefill=False, max_num_batched_tokens=48),
    "max-utilization-chunked": replace(V1, engine="trtllm", capacity_scheduler_policy="MAX_UTILIZATION"),
}


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_trtllm_plans_run_on_the_real_engine_and_replay_the_same(name: str) -> None:
    config = CONFIGS[name]
    runner = RecordingRunner(config)
    real = run_realtime(trace(), replica_factory(config, runner), runner, warmup_steps=3)
    statuses = [g.status for g in real.groups]
    assert statuses.count(Status.FINISHED) == 8
    assert real.groups[7].reject_reason.startswith("trtllm: beam search and parallel sampling")
    assert real.groups[9].reject_reason.startswith("max_model_len")
    preemptions = sum(g.num_preemptions for g in real.groups)
    assert (preemptions > 0) == (config.capacity_scheduler_policy == "MAX_UTILIZATION")
    assert real.groups[3].prefix_hit_tokens == 4  # request 0's stored prefix, found by request 3

    plans = [r.plan for r in runner.measured(len(real.steps))]
    durations = [row[3] for row in real.steps]
    for detail in (True, False):
        replay = RecordingReplay(durations)
        sim = simulate(real.requests, replica_factory(config, detail=detail), replay)
        assert replay.plans == [p if detail else p._replace(details=None) for p in plans]
        decisions = compare_decisions(real, sim)
        assert decisions.identical, decisions.first_divergence

    samples = check_against_dense(runner, runner.measured(len(real.steps)), None)
    own = [r for r in trace() if r.request_id not in (7, 9)]
    assert len(samples) >= sum(r.output_tokens for r in own)
