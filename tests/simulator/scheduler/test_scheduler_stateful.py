"""Random small workloads through the scheduler, checked after every step (hypothesis).

A state machine adds requests (random prompt and output lengths, samples, beams, shared prefixes)
and runs steps in any interleaving, on random small pools of both allocator kinds, with both
preemption modes. Two schedulers run side by side on identical allocators: one plain, one in
detail mode; their decisions must be identical. After every rule: both allocators' invariants,
the memory snapshot's conservation law, and never an empty plan while work remains. At the end
every request is finished or rejected, within a bounded number of steps, and the pool is empty.
"""

from __future__ import annotations

from hypothesis import Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from simulator.kv.allocator import KVAllocator
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedAllocator
from simulator.scheduler import Scheduler, SchedulerConfig, Status
from tests.simulator.scheduler.test_scheduler import check_details, check_snapshot
from workloads.request import Request

MAX_MODEL_LEN = 64
PREFIXES = [(), (1, 2, 3, 4), (1, 2, 9), (7, 7, 7, 7, 7, 7)]  # leading runs that overlap
PREFIX_BLOCK_TOKENS = 8


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        kind=st.sampled_from(["paged", "paged-prefix", "max", "pow2", "oracle"]),
        block_size=st.sampled_from([1, 2, 4, 8]),
        capacity_tokens=st.integers(16, 128),
        mode=st.sampled_from(["recompute", "swap"]),
        swap_space_tokens=st.sampled_from([0, 16, 64]),
        max_num_seqs=st.integers(1, 6),
        extra_budget=st.integers(0, 40),
        chunked=st.booleans(),
        seed=st.integers(0, 3),
    )
    def setup(self, kind, block_size, capacity_tokens, mode, swap_space_tokens,
              max_num_seqs, extra_budget, chunked, seed):
        budget = max_num_seqs + extra_budget
        if not chunked:
            budget = max(budget, MAX_MODEL_LEN)
        self.config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN,
            block_size=block_size, enable_chunked_prefill=chunked,
            enable_prefix_caching=kind == "paged-prefix", preemption_mode=mode,
            swap_space_tokens=swap_space_tokens, seed=seed,
        )

        def make() -> KVAllocator:
            if kind.startswith("paged"):
                return PagedAllocator(max(2, capacity_tokens // block_size), block_size,
                                      enable_prefix_caching=kind == "paged-prefix")
            return ContiguousAllocator(capacity_tokens, policy=kind, max_model_len=MAX_MODEL_LEN)

        self.alloc, self.shadow_alloc = make(), make()
        self.sched = Scheduler(self.alloc, self.config)
        self.shadow = Scheduler(self.shadow_alloc, self.config, detail=True)
        self.tables: dict[int, tuple[int, ...]] = {}
        self.next_id = 0
        self.work_tokens = 0  # Σ (prompt + output) × sequences of the accepted requests
        self.num_steps = 0

    @rule(prompt=st.integers(1, 32), output=st.integers(1, 24), shape=st.sampled_from(
        ["single", "single", "single", "n2", "n3", "beam2", "beam3"]), prefix=st.sampled_from(PREFIXES))
    def add_request(self, prompt, output, shape, prefix):
        n = int(shape[1]) if shape.startswith("n") else 1
        beam = int(shape[-1]) if shape.startswith("beam") else 1
        r = Request(self.next_id, 0.0, prompt, output, n=n, beam_width=beam, prefix_ids=prefix,
                    prefix_block_tokens=PREFIX_BLOCK_TOKENS if prefix else 0)
        self.next_id += 1
        g = self.sched.add_request(r)
        h = self.shadow.add_request(r)
        assert (g.status, g.reject_reason) == (h.status, h.reject_reason)
        if g.status is Status.REJECTED:
            event("rejected")
            assert g.reject_reason.split(":")[0] in ("max_model_len", "kv_capacity", "max_num_seqs")
        else:
            self.work_tokens += (prompt + output) * r.num_seqs

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
        for label, happened in (("preemption", plan.preempted), ("cow", plan.cow_copies),
                                ("swap in", plan.num_swap_in_blocks), ("chunk", plan.prefills)):
            if happened:
                event(label)  # --hypothesis-show-statistics: what the runs exercised
        outcome = self.sched.complete(plan)
        shadow_outcome = self.shadow.complete(detailed)
        for a, b in zip(outcome, shadow_outcome):
            assert [g.request_id for g in a] == [g.request_id for g in b]
        self.num_steps += 1

    @invariant()
    def consistent(self):
        if not hasattr(self, "sched"):
            return
        for sched, alloc in ((self.sched, self.alloc), (self.shadow, self.shadow_alloc)):
            alloc.check_invariants()
            check_snapshot(sched, alloc)
            running = sum(g.num_seqs for g in sched.running.values())  # counted from admission
            assert running == sched.num_running_seqs <= self.config.max_num_seqs

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        # every step computes a token unless it preempts, and preemption only repeats work already
        # done: a run without livelock ends well within a generous multiple of the total work
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


TestScheduler = SchedulerMachine.TestCase
# No shrink phase: shrinking a 40-rule run of two schedulers takes minutes on 2 cores. A failure
# prints its whole rule sequence; turn it into a small named test in test_scheduler.py.
TestScheduler.settings = settings(max_examples=600, stateful_step_count=40, deadline=None,
                                  phases=[Phase.explicit, Phase.reuse, Phase.generate])
