"""Random small workloads through SGLang's scheduler, checked after every step (hypothesis).

A state machine adds requests (random lengths, shared prefixes, parallel samples, beams that must
be refused) and runs steps in any interleaving, on random small pools and page sizes, with both
policies and both eviction orders. Two schedulers run side by side on identical pools, one in
detail mode; their decisions must be identical. After every rule: the pools' invariants, the
snapshot's conservation law, a plan never empty while work remains, and in detail mode block
tables that cover each sequence, slot mappings that agree with them and no slot written twice.
At the end every request is finished or refused with a reason, within a bounded number of steps,
and no sequence holds KV.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from simulator.kv.radix import RadixTokenPool
from simulator.scheduler.plan import StepPlan
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.sglang import SGLangScheduler
from simulator.scheduler.state import Status
from workloads.request import Request

PREFIXES = [(), (1, 2, 3, 4), (1, 2, 9), (7, 7, 7, 7, 7, 7)]
MAX_MODEL_LEN = 72


def check_details(plan: StepPlan, pool: RadixTokenPool) -> None:
    details = plan.details
    assert details is not None and len(details) == len(plan.prefills) + plan.num_decode_seqs
    ps = pool.page_size
    written: list[int] = []
    for chunk, d in zip(plan.prefills, details):
        assert (d.seq_id, d.position, d.num_tokens) == (chunk.seq_id, chunk.num_computed_tokens,
                                                        chunk.num_tokens)
    for d in details:
        assert d.context_len == d.position + d.num_tokens
        assert len(d.block_table) * ps >= d.context_len, "grow before write"
        assert d.block_table == pool.block_table(d.seq_id)
        for i, slot in enumerate(d.slot_mapping):
            pos = d.position + i
            assert slot == d.block_table[pos // ps] * ps + pos % ps
        written.extend(d.slot_mapping)
    assert len(written) == len(set(written)), "two sequences write the same slot"


class SGLangMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 1, 2, 4]), capacity=st.integers(80, 200),
                max_running=st.integers(1, 6), chunk=st.sampled_from([8, 16, 32, None]),
                policy=st.sampled_from(["fcfs", "lpm"]), evict=st.sampled_from(["lru", "lfu"]),
                caching=st.booleans(), ratio=st.sampled_from([0.7, 0.3, 0.05]))
    def setup(self, page_size, capacity, max_running, chunk, policy, evict, caching, ratio):
        cfg = SchedulerConfig(engine="sglang", block_size=page_size, max_num_seqs=max_running,
                              max_num_batched_tokens=chunk or MAX_MODEL_LEN,
                              enable_chunked_prefill=bool(chunk),
                              max_model_len=MAX_MODEL_LEN, enable_prefix_caching=caching,
                              schedule_policy=policy, radix_eviction_policy=evict,
                              init_new_token_ratio=ratio, new_token_ratio_decay_steps=20,
                              retract_decode_steps=4)
        self.pools = [RadixTokenPool(capacity // page_size, page_size, enable_prefix_caching=caching,
                                     eviction_policy=evict) for _ in range(2)]
        self.scheds = [SGLangScheduler(self.pools[0], cfg), SGLangScheduler(self.pools[1], cfg, detail=True)]
        self.next_id = 0
        self.steps = 0

    @rule(prompt=st.integers(1, 50), output=st.integers(1, 40), prefix=st.integers(0, 3),
          shape=st.sampled_from(["one", "one", "one", "samples", "beams"]))
    def add_request(self, prompt, output, prefix, shape):
        ids = PREFIXES[prefix]
        request = Request(self.next_id, 0.0, prompt, output, n=3 if shape == "samples" else 1,
                          beam_width=2 if shape == "beams" else 1, prefix_ids=ids,
                          prefix_block_tokens=8 if ids else 0)
        self.next_id += 1
        groups = [s.add_request(request) for s in self.scheds]
        assert groups[0].status == groups[1].status and groups[0].reject_reason == groups[1].reject_reason
        if shape == "beams":
            assert groups[0].reject_reason.startswith("beam_search: ")

    @rule()
    def step(self):
        plain, detailed = self.scheds
        if not plain.has_work:
            return
        plans = [s.schedule() for s in self.scheds]
        assert not plans[0].is_empty, "an empty plan with work left"
        assert plans[0] == plans[1]._replace(details=None)
        check_details(plans[1], self.pools[1])
        outcomes = [s.complete(p) for s, p in zip(self.scheds, plans)]
        assert [[g.request_id for g in o.finished] for o in outcomes] == \
            [[g.request_id for g in o.finished] for o in outcomes[::-1]]
        self.steps += 1

    @invariant()
    def consistent(self):
        if not hasattr(self, "scheds"):
            return
        for sched, pool in zip(self.scheds, self.pools):
            pool.check_invariants()
            snap = pool.snapshot(sched.written_tokens(), sched.head())
            parts = (snap.token_state, snap.reserved, snap.internal_fragmentation, snap.free)
            assert all(p >= 0 for p in parts) and sum(parts) == pool.capacity_tokens, snap
            assert sched.num_running_seqs <= sched.max_running_requests + 1  # + one being chunked

    def teardown(self):
        if not hasattr(self, "scheds"):
            return
        bound = 50 * (MAX_MODEL_LEN + 10) * (self.next_id + 1)
        while self.scheds[0].has_work and self.steps < bound:
            self.step()
            self.consistent()
        for sched, pool in zip(self.scheds, self.pools):
            assert not sched.has_work, "work left after the bound"
            for g in sched.groups.values():
                assert g.status is Status.FINISHED or (g.status is Status.REJECTED and g.reject_reason)
            assert sched.num_finished + sched.num_rejected == self.next_id
            assert pool.num_seqs == 0 and pool.tree.protected_size == 0
            assert pool.num_free_tokens() == pool.capacity_tokens
        event(f"retractions: {self.scheds[0].num_preemptions > 0}")
        event(f"prefix hits: {self.scheds[0].prefix_hit_tokens + self.scheds[0].readmission_hit_tokens > 0}")


TestSGLangScheduler = SGLangMachine.TestCase
TestSGLangScheduler.settings = settings(max_examples=120, stateful_step_count=60, deadline=None)
