"""The real engine runs every serving engine's decisions: vLLM V1 over a paged block pool, SGLang
over its radix token pool at page size 1 (its default) and 4 (vLLM V0: test_realtime.py).

For each, a tiny trace under memory pressure (V1 preempts, SGLang retracts) with a shared
prefix, parallel samples and a request too long to run:

* completes on the real engine, and the SimPy engine fed the measured step durations makes the
  same decisions, down to every step's plan (chunks, sequences, block tables, slots);
* every token sampled for a sequence whose KV is its own is the greedy token of a dense forward
  (no KV cache) of the tokens its block table points at, with decode attention and the KV store
  in the Triton kernels: page-granular tables, and V1's re-admitted requests that find their
  own blocks in the prefix cache, read the right KV;
* ``kvplan fidelity`` runs end to end with ``--set engine=sglang`` (engine vllm-v1, the
  default, is test_fidelity.py's).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import backend.kernels
import backend.model
from backend.realtime import ReplayLatency, max_step_tokens, run_realtime
from backend.runner import ModelRunner, StepTiming, token_ids
from simulator.engine import metrics
from simulator.cli import main
from simulator.engine.core import simulate
from simulator.report.fidelity import compare_decisions
from simulator.kv.allocator import KVAllocator
from simulator.kv.models import get_model
from simulator.kv.paged import PagedAllocator
from simulator.kv.radix import RadixTokenPool
from simulator.scheduler.plan import StepPlan
from simulator.scheduler import Scheduler, SchedulerConfig, Status, make_scheduler
from workloads.request import Request

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = str(ROOT / "scenarios" / "fidelity-cpu.yaml")
TINY = get_model("tiny")
# The greedy token is the dense argmax up to fp32 rounding (the tiny model's top two logits can
# be 1e-4 apart; paged and dense fp32 forwards differ by ~1e-6).
TIE = 1e-5
POOL_TOKENS = 64  # the first six requests alone end with 132 KV tokens: preemption is certain
V1 = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=48, block_size=4,
                     enable_prefix_caching=True, engine="vllm-v1")
# SGLang's admission reserves new_token_ratio (0.7 × schedule_conservativeness) of the running
# requests' future tokens (simulator/scheduler/sglang.py): at 0.3 it admits more than their
# outputs will fit, so decoding must retract.
SGLANG = replace(V1, engine="sglang", schedule_conservativeness=0.3)
CONFIGS = {"vllm-v1": V1, "sglang-page1": replace(SGLANG, block_size=1), "sglang-page4": SGLANG}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def trace() -> list[Request]:
    """Six requests at once (0 and 3 share a 4-token prefix), three later ones (7 of two parallel
    samples), and one longer than max_model_len (48 tokens), rejected by every engine."""
    first = [Request(i, 0.0, 6 + i, 12 + i, prefix_ids=(1,) if i % 3 == 0 else (),
                     prefix_block_tokens=4 if i % 3 == 0 else 0) for i in range(6)]
    later = [Request(6 + i, 0.02 * (i + 1), 12, 4, n=2 if i == 1 else 1) for i in range(3)]
    return first + later + [Request(9, 0.07, 40, 20)]


@dataclass(frozen=True, slots=True)
class Record:
    """One executed step: its plan, the tokens sampled, and the request of each sequence the
    step admitted (a V1 parallel sample's sequences have none: V1 admits the samples as
    requests of their own)."""

    plan: StepPlan
    sampled: list[int]
    admitted: dict[int, int]


class RecordingRunner(ModelRunner):
    """The tiny model's runner, sized for ``config``'s steps, keeping a :class:`Record` of every
    step it executes (warm-up steps included: the measured run's are the last ones)."""

    def __init__(self, config: SchedulerConfig):
        super().__init__(TINY, num_blocks=POOL_TOKENS // config.block_size, block_size=config.block_size,
                         device="cpu", dtype="fp32", max_num_seqs=config.max_num_seqs,
                         max_num_batched_tokens=max_step_tokens(config), max_model_len=config.max_model_len)
        self.scheduler: Scheduler | None = None  # the scheduler whose plans it runs
        self.records: list[Record] = []

    def execute(self, plan: StepPlan) -> StepTiming:
        timing = super().execute(plan)
        assert self.scheduler is not None and self.last_sampled is not None
        admitted = {s: g.request_id for g in self.scheduler.newly_admitted for s in g.seq_ids}
        self.records.append(Record(plan, self.last_sampled.tolist(), admitted))
        return timing

    def measured(self, num_steps: int) -> list[Record]:
        """The records of the last ``num_steps`` steps."""
        return self.records[len(self.records) - num_steps:]


class RecordingReplay(ReplayLatency):
    """:class:`ReplayLatency` that keeps the plans it is asked to time."""

    def __init__(self, durations_s: list[float]):
        super().__init__(durations_s)
        self.plans: list[StepPlan] = []

    def step_latency_s(self, plan: StepPlan) -> float:
        self.plans.append(plan)
        return super().step_latency_s(plan)


def replica_factory(config: SchedulerConfig, runner: RecordingRunner | None = None, *,
                    detail: bool = True) -> Callable[[int], tuple[Scheduler, KVAllocator]]:
    """The engine's scheduler over its allocator (both POOL_TOKENS); ``runner`` is told of it."""
    def make(_: int) -> tuple[Scheduler, KVAllocator]:
        num_blocks = POOL_TOKENS // config.block_size
        alloc: KVAllocator
        if config.engine == "sglang":
            alloc = RadixTokenPool(num_blocks, config.block_size)
        else:
            alloc = PagedAllocator(num_blocks, config.block_size, enable_prefix_caching=True)
        scheduler = make_scheduler(alloc, config, detail=detail)
        if runner is not None:
            runner.scheduler = scheduler
        return scheduler, alloc
    return make


@pytest.fixture
def triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's decode attention and KV store through the Triton kernels (interpreted on CPU),
    the path it takes on a GPU; off CUDA it runs the torch reference by default."""
    monkeypatch.setattr(backend.model, "decode_attention",
                        functools.partial(backend.kernels.decode_attention, backend="triton"))
    monkeypatch.setattr(backend.model, "write_kv",
                        functools.partial(backend.kernels.write_kv, backend="triton"))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_trace_completes_and_the_simulator_replays_the_same_decisions(name: str) -> None:
    config = CONFIGS[name]
    runner = RecordingRunner(config)
    progress: list[int] = []
    real = run_realtime(trace(), replica_factory(config, runner), runner, warmup_steps=3,
                        on_progress=progress.append)

    statuses = [g.status for g in real.groups]
    assert statuses.count(Status.FINISHED) == 9 and statuses[9] is Status.REJECTED
    assert real.groups[9].reject_reason.startswith("max_model_len")
    assert sum(progress) == 10
    frame = metrics.requests_frame(real)
    assert frame.ttft_s.iloc[:9].gt(0).all() and math.isnan(frame.ttft_s.iloc[9])
    summary = metrics.summarize(real, frame, metrics.steps_frame(real), POOL_TOKENS)
    assert summary["completed"] == 9 and summary["num_preemptions"] > 0  # V1 preempts, SGLang retracts
    assert real.groups[3].prefix_hit_tokens == 4  # request 0's prefix, found by request 3
    assert [s.measured_s for s in real.samples] == [row[3] for row in real.steps]
    assert all(0 < s.execute_s <= s.measured_s for s in real.samples)

    plans = [r.plan for r in runner.measured(len(real.steps))]
    durations = [row[3] for row in real.steps]
    for detail in (True, False):  # the scheduler as the real engine drives it, and as `simulate` does
        replay = RecordingReplay(durations)
        sim = simulate(real.requests, replica_factory(config, detail=detail), replay)
        # the same decisions: every step's plan, each request's admissions, preemptions and hits
        assert replay.plans == [p if detail else p._replace(details=None) for p in plans]
        for g_real, g_sim in zip(real.groups, sim.groups):
            assert (g_real.status, g_real.admit_order, g_real.num_admissions, g_real.num_preemptions,
                    g_real.prefix_hit_tokens, g_real.readmission_hit_tokens) == (
                g_sim.status, g_sim.admit_order, g_sim.num_admissions, g_sim.num_preemptions,
                g_sim.prefix_hit_tokens, g_sim.readmission_hit_tokens)
        assert [row[1:2] + row[4:] for row in real.steps] == [row[1:2] + row[4:] for row in sim.steps]
        decisions = compare_decisions(real, sim)
        assert decisions.identical, decisions.first_divergence
        # and the same timeline
        assert [row[2] for row in sim.steps] == pytest.approx([row[2] for row in real.steps], abs=1e-9)
        for t_real, t_sim in zip(real.times, sim.times):
            assert (t_real.admitted_s, t_real.first_token_s, t_real.finished_s) == pytest.approx(
                (t_sim.admitted_s, t_sim.first_token_s, t_sim.finished_s), abs=1e-9)


@dataclass(frozen=True, slots=True)
class Sample:
    """A checked sampled token: its sequence, that sequence's request (None: unknown), and
    whether it read KV an earlier sequence of its request wrote (a re-admission's cache hit)."""

    seq_id: int
    request_id: int | None
    reads_earlier_admission: bool


def check_against_dense(runner: ModelRunner, records: list[Record], checked: set[int] | None) -> list[Sample]:
    """Check every token sampled for a sequence of the ``checked`` requests (None: of every
    request) against a dense forward; return the samples checked.

    The pool's contents are tracked per slot as (token id, writing sequence): a step's rows
    write token_ids(sequence, position) at their slots (the runner's inputs) before any row
    attends. A sampled row at position p read the KV of the slots its block table maps
    positions 0..p to; the dense forward of the tokens written there must give the sampled
    token. Within a sequence those tokens only grow, so one forward of its longest serves all."""
    bs, vocab = runner.block_size, runner.model.shape.vocab_size
    pool: dict[int, tuple[int, int]] = {}  # slot -> (token id, sequence that wrote it)
    owner: dict[int, int] = {}
    by_seq: dict[int, list[tuple[list[int], int, Sample]]] = {}
    for record in records:
        plan, details = record.plan, record.plan.details
        assert details is not None
        owner.update(record.admitted)
        for d in details:
            positions = np.arange(d.position, d.position + d.num_tokens)
            ids = token_ids(np.full_like(positions, d.seq_id), positions, vocab)
            for slot, token in zip(d.slot_mapping, ids.tolist()):
                pool[slot] = (token, d.seq_id)
        sampling = [d for c, d in zip(plan.prefills, details) if c.samples_token]
        sampling += details[len(plan.prefills):]
        assert len(sampling) == len(record.sampled)
        for d, token in zip(sampling, record.sampled):
            request = owner.get(d.seq_id)
            if checked is not None and request not in checked:
                continue
            slots = [d.block_table[p // bs] * bs + p % bs for p in range(d.context_len)]
            unwritten = [s for s in slots if s not in pool]
            assert not unwritten, f"step {plan.step_id}: seq {d.seq_id} reads unwritten slots {unwritten}"
            read = [pool[s] for s in slots]
            earlier = request is not None and any(
                w != d.seq_id and owner.get(w) == request for w in {w for _, w in read})
            sample = Sample(d.seq_id, request, earlier)
            by_seq.setdefault(d.seq_id, []).append(([t for t, _ in read], token, sample))
    samples = []
    for seq, seen in by_seq.items():
        longest = max((ids for ids, _, _ in seen), key=len)
        logits = runner.model.reference_logits(torch.tensor(longest))
        best = logits.max(dim=-1).values
        for ids, token, sample in seen:
            assert ids == longest[:len(ids)], f"seq {seq}: the KV under its earlier tokens changed"
            row = len(ids) - 1
            assert logits[row, token] >= best[row] - TIE, f"seq {seq} at position {row}"
            samples.append(sample)
    return samples


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.usefixtures("triton_kernels")
def test_sampled_tokens_are_the_dense_forwards(name: str) -> None:
    """V1 never moves a sequence's KV, so every sequence is checked, shared prefixes and samples
    included. SGLang frees a sequence's copy of tokens another put in the radix tree first and
    points it at theirs (``cache_unfinished_req``); as the runner's token ids are per sequence,
    that copy held other ids, so only requests that share nothing are checked there."""
    config = CONFIGS[name]
    runner = RecordingRunner(config)
    requests = {r.request_id: r for r in trace()}
    own = set(requests) - {9}  # 9 is rejected
    checked: set[int] | None = None  # every sequence
    if config.engine == "sglang":
        checked = own = {i for i in own if not requests[i].prefix_ids and requests[i].n == 1}
        assert own == {1, 2, 4, 5, 6, 8}
    real = run_realtime(list(requests.values()), replica_factory(config, runner), runner, warmup_steps=3)

    samples = check_against_dense(runner, runner.measured(len(real.steps)), checked)
    # every token of every checked request: each sequence samples its output tokens at least
    assert len(samples) >= sum(requests[i].output_tokens * requests[i].n for i in own)
    assert {s.request_id for s in samples} >= own - {7}  # V1's samples of 7 have no request
    if config.engine == "vllm-v1":
        # a preempted request, re-admitted as a new sequence, read the blocks it wrote before
        assert any(s.reads_earlier_admission for s in samples)


@pytest.mark.parametrize(("config", "tokens"), [
    (V1, 32),  # vLLM: one budget for the whole step
    (SGLANG, 32),  # SGLang: the chunk size, above max_num_seqs
    (replace(SGLANG, max_num_batched_tokens=4), 8),  # a decode step of all 8 running requests
    (replace(SGLANG, enable_chunked_prefill=False, max_prefill_tokens=16), 48),  # a whole prompt
    (replace(SGLANG, enable_chunked_prefill=False, max_prefill_tokens=64), 64),  # a batch of prompts
], ids=["vllm", "sglang-chunk", "sglang-decode", "sglang-prompt", "sglang-prompts"])
def test_max_step_tokens_covers_the_largest_step_an_engine_plans(config: SchedulerConfig,
                                                                  tokens: int) -> None:
    assert max_step_tokens(config) == tokens


def test_sglang_without_chunked_prefill_runs_a_prompt_beyond_every_budget_in_one_step() -> None:
    """Without chunked prefill SGLang admits a batch's first request whole, beyond
    max_prefill_tokens (16) and the chunk size (8), which then bound nothing: a runner sized by
    max_step_tokens runs it, and one sized by the chunk size is refused before the run."""
    config = replace(CONFIGS["sglang-page1"], enable_chunked_prefill=False, max_num_batched_tokens=8,
                     max_prefill_tokens=16)
    requests = [Request(0, 0.0, 30, 4), Request(1, 0.0, 10, 4), Request(2, 0.0, 6, 4)]
    small = ModelRunner(TINY, num_blocks=POOL_TOKENS, block_size=1, device="cpu", dtype="fp32",
                        max_num_seqs=8, max_num_batched_tokens=16, max_model_len=config.max_model_len)
    with pytest.raises(ValueError, match="48 tokens"):
        run_realtime(requests, replica_factory(config), small, warmup_steps=0)

    runner = RecordingRunner(config)
    real = run_realtime(requests, replica_factory(config, runner), runner, warmup_steps=0)
    assert all(g.status is Status.FINISHED for g in real.groups)
    # request 0 alone; then request 1 (10 of the 16), whom request 2 (6 more) cannot join
    prefills = [[c.num_tokens for c in r.plan.prefills] for r in runner.records if r.plan.prefills]
    assert prefills == [[30], [10], [6]]


@pytest.mark.parametrize(("settings", "prefill_budget"), [
    (["engine=sglang"], 512),  # the scenario's max_num_batched_tokens: SGLang's chunked_prefill_size
    # chunking off: max_num_batched_tokens (below max_num_seqs) bounds nothing, SGLang's
    # max_prefill_tokens (16384) a batch; the runner and the calibration are sized for its steps
    (["engine=sglang", "enable_chunked_prefill=false", "max_num_batched_tokens=16"], 16384),
], ids=["sglang", "sglang-unchunked"])
def test_kvplan_fidelity_runs_sglang_end_to_end(settings: list[str], prefill_budget: int,
                                                tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["fidelity", SCENARIO, "--device", "cpu", "--repeats", "1", "--quick-calibrate",
            "--num-requests", "4", "--set", "workload.rate=32", "--out", str(out), "--quiet"]
    main(args + [arg for setting in settings for arg in ("--set", setting)])  # exit status: the targets'

    report = json.loads((out / "fidelity.json").read_text())
    assert report["engine"] == "sglang"
    paged = report["allocators"]["paged"]
    assert paged["decisions"]["identical"], paged["decisions"]["first_divergence"]
    assert paged["decisions"]["num_steps_real"] == paged["steps"]["num_steps"] > 0
    # request 0's 374-token prompt goes in one step
    assert 374 <= pd.read_csv(out / "real_steps.csv").num_prefill_tokens.max() <= prefill_budget
