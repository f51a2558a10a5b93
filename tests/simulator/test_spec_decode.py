"""Speculative decoding (simulator/scheduler/spec.py, simulator/latency/speculative.py).

Hand-derived cases: request 0 (prompt 5, output 10) and request 1 (prompt 3, output 7) on a
pool of 4-token blocks, k = 3 drafts. Both prefill in step 0, which emits each one's first token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import load_model
from simulator.kv.paged import PagedAllocator
from simulator.latency.roofline import RooflineLatency
from simulator.latency.speculative import SpeculativeLatency
from simulator.scheduler.plan import StepPlan
from simulator.commands.simulate import run_simulate
from simulator.scheduler import SchedulerConfig, make_scheduler
from simulator.scheduler.spec import SpecDecodeScheduler
from tests.simulator.scheduler.test_scheduler import drive
from workloads.request import Request

ROOT = Path(__file__).resolve().parents[2]


def spec(rates: tuple[float, ...], *, lookahead: int = 3, blocks: int = 40, seed: int = 0,
         max_model_len: int = 64):
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=max_model_len, block_size=4,
                          engine="vllm-v1", num_speculative_tokens=len(rates), spec_acceptance=rates,
                          num_lookahead_tokens=lookahead, seed=seed)
    alloc = PagedAllocator(blocks, 4)
    sched = make_scheduler(alloc, cfg)
    assert isinstance(sched, SpecDecodeScheduler)
    return sched, alloc


def two_requests():
    return {0: [Request(0, 0.0, 5, 10), Request(1, 0.0, 3, 7)]}


def finish_steps(history) -> dict[int, int]:
    return {g.request_id: i for i, (_, o) in enumerate(history) for g in o.finished}


def test_acceptance_one_emits_k_plus_one_per_step():
    """Every draft accepted: 4 tokens per step. Request 1 needs 6 after its first: 4 (step 1)
    + 2 (step 2, cut at its end). Request 0 needs 9: 4 + 4 + 1, finishing at step 3. Each step
    verifies 3 drafts per decode; the invariants and the snapshot (token state = written KV) are
    checked at every step by ``drive``, and nothing is left allocated at the end."""
    sched, alloc = spec((1.0, 1.0, 1.0))
    history = drive(sched, alloc, two_requests())
    assert finish_steps(history) == {1: 2, 0: 3}
    assert [(p.num_decode_seqs, p.num_spec_tokens) for p, _ in history] == [(0, 0), (2, 6), (2, 6), (1, 3)]
    # KV read per decode before its write: step 1 lengths 5, 3 -> (5+1)+(3+1); step 2: 9, 7
    assert [p.decode_context_tokens for p, _ in history] == [0, 10, 18, 14]
    assert sched.spec_emitted_tokens == 4 + 4 + 4 + 2 + 1
    assert alloc.num_seqs == 0


def test_acceptance_zero_emits_one_per_step():
    """No draft accepted: one token per step, as without speculation; the lookahead slots
    allocated ahead are rewritten, never leaked (the pool is empty at the end)."""
    sched, alloc = spec((0.0, 0.0, 0.0))
    history = drive(sched, alloc, two_requests())
    assert finish_steps(history) == {1: 6, 0: 9}
    stats = sched.spec_stats()
    assert stats["mean_acceptance_length"] == 1.0 and stats["num_accepted_tokens"] == 0
    assert stats["num_draft_tokens"] == 3 * stats["num_drafts"]
    assert alloc.num_seqs == 0


def test_a_draft_models_slot_is_charged_per_scheduled_request():
    """vLLM 0.33.0 ``Scheduler.schedule``: each scheduled request is charged ``num_new_tokens +
    draft_slots`` against ``max_num_batched_tokens`` and gets at most ``input_budget -
    draft_slots`` (draft_model: 1 slot). Budget 8, prompts 5 and 3, k = 3, by hand:

    * step 0 (waiting loop): request 0 gets min(5, 8 - 1) = 5, input budget 8 - 6 = 2; request 1
      gets min(3, token budget 3, 2 - 1) = 1 (a chunk), input budget 0. Without the slot: 5 + 3.
    * step 1 (running loop): request 0 decodes 1 + 3 drafts = 4, input budget 8 - 5 = 3; request 1's
      remaining 2 tokens fit 3 - 1 = 2 exactly.
    * step 2: both decode. Request 0: 4 tokens, input budget 8 - 5 = 3; request 1: min(4, 3 - 1) =
      2 tokens, its token and 1 draft (the other drafts dropped): 4 drafts in all, not 6."""
    def run(slots: int):
        cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, block_size=4,
                              engine="vllm-v1", num_speculative_tokens=3, spec_acceptance=(0.0, 0.0, 0.0),
                              num_lookahead_tokens=3, num_draft_slots=slots, seed=0)
        alloc = PagedAllocator(40, 4)
        return drive(make_scheduler(alloc, cfg), alloc, two_requests())

    steps = [([c.num_tokens for c in p.prefills], p.num_decode_seqs, p.num_spec_tokens) for p, _ in run(1)[:3]]
    assert steps == [([5, 1], 0, 0), ([2], 1, 3), ([], 2, 4)]
    assert [c.num_tokens for c in run(0)[0][0].prefills] == [5, 3]


def test_lookahead_slots_as_allocate_slots():
    """allocate_slots: comp + new + lookahead = L + (1 + k) + k slots, capped at the final length.
    Request 0 after prefill has L = 5 written: 5 + 4 + 3 = 12 slots = 3 blocks of 4; request 1
    (L = 3, final 9): min(3 + 4 + 3, 9) = 9 -> 3 blocks. Written tokens stay 5 + 3."""
    sched, alloc = spec((0.0, 0.0, 0.0))
    for r in two_requests()[0]:
        sched.add_request(r)
    sched.complete(sched.schedule())
    plan = sched.schedule()
    assert plan.num_spec_tokens == 6 and plan.num_batched_tokens == 2 + 6
    assert alloc.num_free_blocks() == 40 - 3 - 3
    assert sched.written_tokens() == 5 + 3
    sched.complete(plan)
    assert sched.written_tokens() == 6 + 4  # one token each kept; the rejected slots reusable
    alloc.check_invariants()


def test_per_position_mean_matches_closed_form():
    """P(draft i accepted | 1..i-1 accepted) = a_i: accepted count's mean Σ_i Π_{j<=i} a_j and
    vLLM's per-position rate Π_{j<=i} a_j. 40 requests of 300 tokens give ~4,700 draws: each
    figure within 4 standard errors of its closed form."""
    rates = (0.8, 0.6, 0.5)
    sched, alloc = spec(rates, blocks=400, seed=7, max_model_len=512)
    drive(sched, alloc, {0: [Request(i, 0.0, 4, 300) for i in range(40)]})
    assert sched.spec_num_drafts > 4000
    stats = sched.spec_stats()
    closed = [0.8, 0.8 * 0.6, 0.8 * 0.6 * 0.5]
    n = sched.spec_num_drafts
    mean = sum(closed)
    # Var(accepted) = Σ_i (2i - 1) P(accepted >= i) - mean², i = 1..k
    var = sum((2 * i + 1) * p for i, p in enumerate(closed)) - mean * mean
    assert abs(stats["mean_acceptance_length"] - (1 + mean)) < 4 * (var / n) ** 0.5
    for got, want in zip(stats["acceptance_per_position"], closed):
        assert abs(got - want) < 4 * (want * (1 - want) / n) ** 0.5


def test_same_seed_same_run():
    a, aa = spec((0.7, 0.7), seed=3)
    b, bb = spec((0.7, 0.7), seed=3)
    ha, hb = drive(a, aa, two_requests()), drive(b, bb, two_requests())
    assert [p.num_spec_tokens for p, _ in ha] == [p.num_spec_tokens for p, _ in hb]
    assert a.spec_stats() == b.spec_stats()


def test_verify_latency_by_hand():
    """Llama-3.1-8B on an H100, 2 decodes of KV 100 and 200 (contexts after the first write:
    101, 201), 3 drafts each. By hand: 8 query tokens; attention reads Σ queries' contexts =
    (101+102+103+104) + (201+..+204) = 1220; KV read once per sequence: 302 + 6 = 308 tokens;
    ngram drafts cost nothing."""
    model, gpu = load_model("llama-3.1-8b"), get_gpu("h100-80gb")
    base = RooflineLatency(model, gpu)
    lat = SpeculativeLatency(base, 3, None)
    plan = StepPlan(0, (), 2, 302, 101.0**2 + 201.0**2, 201, num_spec_tokens=6)
    c = base.constants
    tokens, bpt = 8, base.bytes_per_token
    memory = (base.weight_format.dense_weight_bytes + 308 * bpt + tokens * bpt) / (
        gpu.hbm_bandwidth_bytes_s * c.mem_efficiency)
    compute = ((2 * model.dense_body_params + 2 * model.lm_head_params) * tokens
               / (base.peak_flops * c.flops_efficiency)
               + 2 * model.num_attention_heads * 2 * model.head_dim * model.num_hidden_layers * 1220
               / (base.rates.attention_flops_s * c.flops_efficiency))
    assert lat.step_latency_s(plan) == pytest.approx(max(memory, compute) + c.step_overhead_s, rel=1e-9)
    # no drafts: the target's own latency, unchanged
    plain = plan._replace(num_spec_tokens=0)
    assert lat.step_latency_s(plain) == base.step_latency_s(plain)


def _scenario(tmp_path: Path, speculative: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(
        "name: s\nmodel: llama-3.1-8b\ngpu: h100-80gb\nallocators: [paged]\nmax_model_len: 4096\n"
        f"{speculative}"
        "workload:\n  prompt_tokens: {dist: fixed, value: 200}\n"
        "  output_tokens: {dist: fixed, value: 100}\n  num_requests: 30\n"
        "  arrival: {process: poisson, rate: 4}\n")
    return p


@pytest.mark.parametrize("value, message", [
    ("{method: eagle, num_speculative_tokens: 0, acceptance_rate: 0.5}", "num_speculative_tokens must be >= 1"),
    ("{method: eagle, num_speculative_tokens: 2, acceptance_rate: 1.5}", r"in \[0, 1\]"),
    ("{method: eagle, num_speculative_tokens: 2, per_position: [0.5, -0.1]}", r"in \[0, 1\]"),
    ("{method: eagel, num_speculative_tokens: 2, acceptance_rate: 0.5}", "did you mean 'eagle'"),
    ("{method: draft_model, num_speculative_tokens: 2, acceptance_rate: 0.5}", "needs draft_model"),
])
def test_bad_values_are_one_line_errors(tmp_path, value, message):
    path = _scenario(tmp_path, f"speculative: {value}\n")
    with pytest.raises(KvplanError, match=message) as err:
        run_simulate(str(path), out=str(tmp_path / "o"), overrides={}, quiet=True, plots=False)
    assert "\n" not in str(err.value)


def test_sglang_refused(tmp_path):
    path = _scenario(tmp_path, "engine: sglang\nspeculative: {method: ngram, num_speculative_tokens: 2, "
                               "acceptance_rate: 0.5}\n")
    with pytest.raises(KvplanError, match="vllm-v1 only"):
        run_simulate(str(path), out=str(tmp_path / "o"), overrides={}, quiet=True, plots=False)


def test_draft_weights_leave_less_kv_and_summary_reports(tmp_path):
    """A draft model's weights come out of the KV pool; the summary carries vLLM's metrics."""
    plain = _scenario(tmp_path, "")
    _, s0 = run_simulate(str(plain), out=str(tmp_path / "a"), overrides={}, quiet=True, plots=False)
    path = _scenario(tmp_path, "speculative: {method: draft_model, draft_model: llama-3.1-8b, "
                               "num_speculative_tokens: 2, acceptance_rate: 1.0}\n")
    _, s1 = run_simulate(str(path), out=str(tmp_path / "b"), overrides={}, quiet=True, plots=False)
    assert s1["paged"]["kv"]["kv_capacity_tokens"] < s0["paged"]["kv"]["kv_capacity_tokens"]
    got = json.loads((tmp_path / "b" / "summary.json").read_text())["paged"]["speculative"]
    assert got["mean_acceptance_length"] == 3.0 and got["acceptance_per_position"] == [1.0, 1.0]
    assert "speculative" not in s0["paged"]
