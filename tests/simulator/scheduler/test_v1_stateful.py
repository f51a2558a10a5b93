"""Random small workloads through vLLM V1's policy, checked after every step (hypothesis).

As tests/simulator/scheduler/test_scheduler_stateful.py does for the core scheduler: requests
(random lengths, parallel samples, beams, shared prefixes) arrive between steps of a
V1Scheduler on a small paged pool (with and without prefix caching) or a contiguous one, with
random V1 knobs (threshold, full-ISL reservation, partial prefills). A second scheduler in detail
mode on an identical allocator must decide the same. After every rule: the allocators'
invariants, the snapshot's conservation law, the budget and ``max_num_seqs``. At the end every
request is finished, or rejected with a reason (beams: ``beam_search``), and the pool is empty.
"""

from __future__ import annotations

from hypothesis import Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from simulator.kv.allocator import KVAllocator
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler import SchedulerConfig, Status
from simulator.scheduler.v1 import V1Scheduler
from tests.simulator.scheduler.test_scheduler import check_details, check_snapshot
from workloads.request import Request

MAX_MODEL_LEN = 64
PREFIXES = [(), (1, 2, 3, 4), (1, 2, 9), (7, 7, 7, 7, 7, 7)]  # leading runs that overlap
PREFIX_BLOCK_TOKENS = 8


class V1Machine(RuleBasedStateMachine):
    @initialize(
        kind=st.sampled_from(["paged", "paged-prefix", "paged-prefix", "max", "pow2", "oracle"]),
        block_size=st.sampled_from([1, 2, 4, 8]),
        capacity_tokens=st.integers(16, 128),
        max_num_seqs=st.integers(1, 6),
        extra_budget=st.integers(0, 40),
        chunked=st.booleans(),
        threshold=st.sampled_from([0, 0, 3, 8]),
        reserve=st.booleans(),
        partial=st.sampled_from([1, 1, 2]),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.3]),
    )
    def setup(self, kind, block_size, capacity_tokens, max_num_seqs, extra_budget, chunked,
              threshold, reserve, partial, watermark):
        budget = max_num_seqs + extra_budget
        if not chunked:
            budget = max(budget, MAX_MODEL_LEN)
            partial = 1  # vllm/config/scheduler.py: partial prefills need chunked prefill
        self.config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN,
            block_size=block_size, enable_chunked_prefill=chunked,
            enable_prefix_caching=kind == "paged-prefix", engine="vllm-v1",
            long_prefill_token_threshold=threshold, scheduler_reserve_full_isl=reserve,
            max_num_partial_prefills=partial, watermark=watermark,
        )

        def make() -> KVAllocator:
            if kind.startswith("paged"):
                return PagedAllocator(max(2, capacity_tokens // block_size), block_size,
                                      enable_prefix_caching=kind == "paged-prefix")
            return ContiguousAllocator(capacity_tokens, policy=kind, max_model_len=MAX_MODEL_LEN)

        self.alloc, self.shadow_alloc = make(), make()
        self.sched = V1Scheduler(self.alloc, self.config)
        self.shadow = V1Scheduler(self.shadow_alloc, self.config, detail=True)
        self.tables: dict[int, tuple[int, ...]] = {}
        self.next_id = 0
        self.work_tokens = 0  # Σ (prompt + output) × samples of the accepted requests
        self.num_steps = 0

    @rule(prompt=st.integers(1, 32), output=st.integers(1, 24), shape=st.sampled_from(
        ["single", "single", "single", "n2", "n3", "beam2"]), prefix=st.sampled_from(PREFIXES))
    def add_request(self, prompt, output, shape, prefix):
        n = int(shape[1]) if shape.startswith("n") else 1
        beam = 2 if shape == "beam2" else 1
        r = Request(self.next_id, 0.0, prompt, output, n=n, beam_width=beam, prefix_ids=prefix,
                    prefix_block_tokens=PREFIX_BLOCK_TOKENS if prefix else 0)
        self.next_id += 1
        g = self.sched.add_request(r)
        h = self.shadow.add_request(r)
        assert (g.status, g.reject_reason) == (h.status, h.reject_reason)
        if g.status is Status.REJECTED:
            event("rejected")
            assert g.reject_reason.split(":")[0] in ("max_model_len", "kv_capacity", "beam_search")
            assert beam == 1 or g.reject_reason.startswith("beam_search: ")
        else:
            assert beam == 1
            self.work_tokens += (prompt + output) * n

    @rule()
    def step(self):
        if not self.sched.has_work:
            assert not self.shadow.has_work
            return
        plan = self.sched.schedule()
        detailed = self.shadow.schedule()
        assert not plan.is_empty, "empty plan while work remains"
        assert detailed._replace(details=None) == plan
        check_details(detailed, self.shadow_alloc, self.tables)
        assert plan.num_batched_tokens <= self.config.max_num_batched_tokens
        assert self.sched.num_running_seqs <= self.config.max_num_seqs
        assert not self.sched.swapped and not plan.num_swap_out_blocks and not plan.cow_copies
        threshold = self.sched.long_prefill_token_threshold
        assert not threshold or all(c.num_tokens <= threshold for c in plan.prefills)
        if plan.preempted:
            assert not self.sched.newly_admitted, "admitted in a step that preempted"
        for label, happened in (("preemption", plan.preempted), ("chunk", plan.prefills),
                                ("readmission hit", self.sched.readmission_hit_tokens)):
            if happened:
                event(label)
        outcome = self.sched.complete(plan)
        shadow_outcome = self.shadow.complete(detailed)
        for a, b in zip(outcome, shadow_outcome):
            assert [g.request_id for g in a] == [g.request_id for g in b]
            assert all(g.request_id >= 0 for g in a), "a sample reported instead of its request"
        self.num_steps += 1

    @invariant()
    def consistent(self):
        if not hasattr(self, "sched"):
            return
        for sched, alloc in ((self.sched, self.alloc), (self.shadow, self.shadow_alloc)):
            alloc.check_invariants()
            check_snapshot(sched, alloc)
            running = sum(g.num_seqs for g in sched.running.values())
            assert running == sched.num_running_seqs == len(sched.running) <= self.config.max_num_seqs

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        # the oldest running request is never preempted (the newest is), so it progresses: the
        # run ends within a generous multiple of the total work
        bound = self.num_steps + 50 + 20 * self.work_tokens
        while self.sched.has_work:
            self.step()
            self.consistent()
            assert self.num_steps <= bound, f"no end after {self.num_steps} steps (livelock?)"
        assert not self.shadow.has_work
        for sched, alloc in ((self.sched, self.alloc), (self.shadow, self.shadow_alloc)):
            statuses = [g.status for g in sched.groups.values()]
            assert all(s in (Status.FINISHED, Status.REJECTED) for s in statuses), statuses
            assert sched.num_finished + sched.num_rejected == self.next_id
            assert alloc.num_seqs == 0 and alloc.num_free_tokens() == alloc.capacity_tokens


TestV1Scheduler = V1Machine.TestCase
# No shrink phase (as test_scheduler_stateful.py): a failure prints its whole rule sequence.
TestV1Scheduler.settings = settings(max_examples=400, stateful_step_count=40, deadline=None,
                                    phases=[Phase.explicit, Phase.reuse, Phase.generate])
