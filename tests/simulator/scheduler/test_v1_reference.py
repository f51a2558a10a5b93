"""V1Scheduler decides what a literal transcription of vLLM V1's scheduling loop decides.

:class:`Reference` below is vLLM's ``Scheduler.schedule`` (running list, then waiting queue),
``_preempt_request`` and the token bookkeeping of ``update_from_output``
(vllm/v1/core/sched/scheduler.py), written the plain way: every running request visited every
step, ``num_computed_tokens`` catching up with ``num_tokens``, ``allocate_slots`` as an append
(grow before write) with ``full_sequence_must_fit`` as ``can_allocate`` of the whole sequence.
It visits the whole batch each step; V1Scheduler visits only what changed (decode counter,
growth events, the budget of a chunk computed from the number of decodes). On random workloads
both must give, step by step, the same chunks, decodes, victims, first tokens and finishes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.kv.paged import PagedAllocator
from simulator.kv.prefix import block_hashes
from simulator.scheduler import SchedulerConfig
from simulator.scheduler.v1 import V1Scheduler, own_block_hashes
from workloads.request import Request


@dataclass(eq=False)
class Req:
    rid: int  # the request id V1Scheduler gives it (samples: -1, -2, ... in arrival order)
    parent: int  # the request id the caller knows
    prompt: int
    output: int
    hashes: tuple[int, ...]
    num_tokens: int = 0  # prompt + generated
    num_computed: int = 0
    generated: int = 0
    admitted_with: int = 0  # num_tokens at its last admission: below it, it is prefilling
    seq: int = -1
    family: list[Req] = field(default_factory=list)


class Reference:
    def __init__(self, config: SchedulerConfig, alloc: PagedAllocator, threshold: int):
        self.cfg, self.alloc, self.threshold = config, alloc, threshold
        self.caching = config.enable_prefix_caching
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.next_sample, self.next_seq = -1, 0

    def add(self, r: Request) -> None:
        bs = self.cfg.block_size
        hashes = (block_hashes(r.prefix_ids, r.prefix_block_tokens, bs, r.prompt_tokens)
                  if self.caching and r.prefix_ids else ())
        if r.n == 1:
            self.waiting.append(Req(r.request_id, r.request_id, r.prompt_tokens, r.output_tokens,
                                    hashes, r.prompt_tokens))
            return
        if self.caching:
            hashes = own_block_hashes(hashes, r.request_id, r.prompt_tokens // bs)
        family: list[Req] = []
        for _ in range(r.n):
            family.append(Req(self.next_sample, r.request_id, r.prompt_tokens, r.output_tokens,
                              hashes, r.prompt_tokens, family=family))
            self.next_sample -= 1
        self.waiting.extend(family)

    def _preempt(self, r: Req) -> None:
        """_preempt_request; with prefix caching its full blocks stay cached under its ids."""
        written = r.num_computed
        if self.caching:
            r.hashes = own_block_hashes(r.hashes, r.rid, written // self.cfg.block_size)
            self.alloc.cache_blocks(r.seq, r.hashes, written)
        self.alloc.free(r.seq)
        r.num_computed = 0
        self.waiting.appendleft(r)

    def step(self) -> tuple[dict[int, tuple[int, int]], set[int], list[int], set[int], set[int]]:
        cfg, alloc, thr = self.cfg, self.alloc, self.threshold
        budget = cfg.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        preempted: list[Req] = []
        chunks: dict[int, tuple[int, int]] = {}
        decodes: set[int] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = r.num_tokens - r.num_computed
            if 0 < thr < n:
                n = thr
            n = min(n, budget)
            while alloc.append(r.seq, r.num_computed + n) is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
            if preempted and preempted[-1] is r:
                break
            scheduled[r.rid] = n
            budget -= n
            i += 1
        for r in self.running:
            if r.rid in scheduled:
                if r.num_computed < r.admitted_with:
                    chunks[r.rid] = (scheduled[r.rid], r.num_computed)
                else:
                    decodes.add(r.rid)
        if not preempted:
            while self.waiting and budget > 0:
                if len(self.running) == cfg.max_num_seqs:
                    break
                r = self.waiting[0]
                final = r.prompt + r.output - 1
                cached = alloc.lookup(r.hashes, r.num_tokens) if r.hashes else 0
                n = r.num_tokens - cached
                if 0 < thr < n:
                    n = thr
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                if cfg.scheduler_reserve_full_isl and not alloc.can_allocate(r.num_tokens, final, r.hashes):
                    break
                if alloc.allocate(self.next_seq, cached + n, final, r.hashes) is None:
                    break
                r.seq, self.next_seq = self.next_seq, self.next_seq + 1
                self.waiting.popleft()
                self.running.append(r)
                r.num_computed, r.admitted_with = cached, r.num_tokens
                scheduled[r.rid] = n
                chunks[r.rid] = (n, cached)
                budget -= n
        # update_from_output: computed tokens advance; a request caught up samples a token
        first: set[int] = set()
        finished: set[int] = set()
        by_rid = {r.rid: r for r in self.running}
        for rid, n in scheduled.items():
            r = by_rid[rid]
            r.num_computed += n
            if r.num_computed < r.num_tokens:
                continue
            r.generated += 1
            r.num_tokens += 1
            family = r.family or [r]
            if r.generated == 1 and sum(s.generated > 0 for s in family) == 1:
                first.add(r.parent)
            if r.generated == r.output:
                self.running.remove(r)
                alloc.free(r.seq)
                r.seq = -1
                if all(s.generated == s.output for s in family):
                    finished.add(r.parent)
        victims = [r.parent for r in preempted]
        return chunks, decodes, victims, first, finished


@st.composite
def cases(draw):  # type: ignore[no-untyped-def]
    bs = draw(st.sampled_from([1, 2, 4]))
    caching = draw(st.booleans())
    chunked = draw(st.booleans())
    seqs = draw(st.integers(1, 5))
    budget = max(seqs + draw(st.integers(0, 30)), 0 if chunked else 48)
    cfg = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, max_model_len=48,
                          block_size=bs, enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                          engine="vllm-v1", long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3, 7])),
                          scheduler_reserve_full_isl=draw(st.booleans()))
    blocks = draw(st.integers(48 // bs, 96 // bs))
    requests = []
    for i in range(draw(st.integers(1, 12))):
        prefix = draw(st.sampled_from([(), (1, 2, 3), (1, 2, 5)]))
        requests.append((draw(st.integers(0, 12)), Request(
            i, 0.0, draw(st.integers(1, 24)), draw(st.integers(1, 20)), n=draw(st.sampled_from([1, 1, 2, 3])),
            prefix_ids=prefix, prefix_block_tokens=4 if prefix else 0)))
    return cfg, blocks, requests


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_v1_scheduler_decides_as_vllms_loop(case):
    cfg, blocks, requests = case
    alloc = PagedAllocator(blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
    ref_alloc = PagedAllocator(blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
    sched = V1Scheduler(alloc, cfg)
    ref = Reference(cfg, ref_alloc, sched.long_prefill_token_threshold)
    arrivals: dict[int, list[Request]] = {}
    for at, r in requests:
        arrivals.setdefault(at, []).append(r)
    for i in range(2000):
        for r in arrivals.pop(i, ()):
            assert sched.add_request(r).reject_reason == ""  # every request fits the pool alone
            ref.add(r)
        if not sched.has_work:
            assert not ref.running and not ref.waiting
            if not arrivals:
                return
            continue
        plan = sched.schedule()
        owner = {g.seq_ids[0]: g.request_id for g in sched.running.values()}
        got_chunks = {owner[c.seq_id]: (c.num_tokens, c.num_computed_tokens) for c in plan.prefills}
        got_decodes = set(sched.decoding)
        outcome = sched.complete(plan)
        chunks, decodes, victims, first, finished = ref.step()
        assert (got_chunks, got_decodes, list(plan.preempted)) == (chunks, decodes, victims), i
        assert {g.request_id for g in outcome.first_token} == first, i
        assert {g.request_id for g in outcome.finished} == finished, i
        alloc.check_invariants()
    raise AssertionError("no end after 2000 steps")
