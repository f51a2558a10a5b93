"""Speculative decoding on vLLM V1's policy (``speculative:`` in a scenario, ``engine: vllm-v1``).

Read from vLLM's source (vllm-project/vllm main). Each step, every decoding request verifies its
next token and up to k draft tokens proposed after the previous step, and keeps the drafts the
target model agrees with:

* Query tokens: a decoding request schedules ``num_tokens_with_spec - num_computed_tokens`` =
  1 + k tokens (``Scheduler.schedule``, running loop), cut so that no position reaches
  ``max_model_len`` (``min(num_new_tokens, max_model_len - 1 - num_computed_tokens)``) and by
  the token budget; the drafts that do not fit are dropped (``del
  request.spec_token_ids[num_scheduled_spec_tokens:]``). The budget counts all of them.
* KV slots: ``KVCacheManager.allocate_slots(request, num_new_tokens, num_lookahead_tokens=...)``
  makes room for ``num_computed_tokens + num_new_tokens + num_lookahead_tokens`` tokens (capped
  at ``max_model_len``); ``num_lookahead_tokens`` is k when the proposer keeps KV of its own
  (``Scheduler.__init__``: ``speculative_config.use_eagle()`` — eagle, eagle3, mtp — or
  ``uses_draft_model()``), 0 for n-gram. Here the cap is the sequence's final length instead
  (a trace replay knows it; the slots past it would never be written), so a contiguous region
  reserved for that length always holds the lookahead.
* Acceptance: ``Scheduler.update_from_output``: ``num_accepted = len(generated_token_ids) - 1``,
  ``num_rejected = num_draft_tokens - num_accepted``, ``request.num_computed_tokens -=
  num_rejected``: the rejected drafts' KV slots are rewritten by later tokens (the blocks stay
  the request's, as vLLM keeps them; the step's written tokens count only what was kept).
  ``_update_request_with_output`` stops at the request's last output token, so a request never
  emits more than it has left. The accepted count is drawn per request and step: draft i is
  accepted with probability ``spec_acceptance[i]`` given that drafts 1..i-1 were (rejection
  sampling stops at the first rejection), from one uniform number per draw, seeded by the
  scenario's seed.
* Metrics, as ``SpecDecodingStats.observe_draft`` and ``SpecDecodingLogging.log``
  (vllm/v1/spec_decode/metrics.py) count them: a draft per request and step, its accepted
  tokens, and per position the drafts that had that position accepted; mean acceptance length
  ``1 + accepted / drafts``, per-position rate ``accepted_per_pos[i] / drafts`` (unconditional:
  Π_{j≤i} a_j in expectation).

Every decoding request's length changes by a random amount each step, so this scheduler visits
every running request every step (the work is proportional to what changed: all of them) and
quiet runs are off: :meth:`is_quiet` is always False and the engine runs single steps. A
group's KV length stays ``anchor_len + decode_counter - anchor_counter``: the counter counts the
one token every step writes, ``anchor_len`` absorbs the accepted drafts. No growth or finish
event is filed by counter; growth is checked at each visit and a finish is filed for the step
that writes the last token.

* Draft slots: a draft model's request takes one input slot beside its tokens
  (``SpeculativeConfig.max_num_new_slots_for_drafting``, vllm/config/speculative.py: 1 for
  ``draft_model``, 0 for EAGLE, MTP and n-gram); each scheduled request is charged
  ``num_new_tokens + draft_slots`` against ``max_num_batched_tokens`` and gets at most
  ``input_budget - draft_slots`` (``Scheduler.schedule``, vLLM 0.33.0: before it, 0.20's
  ``VllmConfig._set_max_num_scheduled_tokens`` took ``max_num_seqs × draft_slots`` off the
  budget once).

Where this differs from vLLM: decodes are charged against the budget ahead of prefill chunks
(the core's accounting; vLLM interleaves them in running order) and when the budget cannot
hold every decode's drafts, the later decodes lose drafts rather than their turn.
"""

from __future__ import annotations

import random
from itertools import accumulate
from operator import attrgetter, mul

from simulator.kv.allocator import KVAllocator
from simulator.scheduler.plan import PrefillChunk, StepPlan
from simulator.scheduler.config import SchedulerConfig
from simulator.scheduler.state import Group, Status, StepOutcome
from simulator.scheduler.v1 import V1Scheduler

_by_admission = attrgetter("admit_order")


class SpecDecodeScheduler(V1Scheduler):
    """vLLM V1's policy with speculative decoding (module docstring)."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                 keep_groups: bool = True):
        if detail:
            raise ValueError("speculative decoding is simulated only (no per-sequence detail)")
        if not config.num_speculative_tokens:
            raise ValueError("SpecDecodeScheduler needs num_speculative_tokens >= 1")
        super().__init__(allocator, config, detail=detail, keep_groups=keep_groups)
        self.num_spec = config.num_speculative_tokens
        self.lookahead = config.num_lookahead_tokens
        # P(at least i+1 drafts accepted) = Π_{j<=i} a_j, non-increasing in i
        self._survival = list(accumulate(config.spec_acceptance, mul))
        self._spec_rng = random.Random(config.seed)
        self._verify: list[tuple[Group, int]] = []  # this step's decodes and their drafts
        self._num_drafted = 0  # draft tokens verified this step
        self._decode_max = 0  # the longest decoding KV length this step (before its write)
        # vLLM's SpecDecodingStats over the run
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_pos = [0] * self.num_spec
        self.spec_emitted_tokens = 0  # tokens emitted by verify passes (bonus + accepted, cut at the end)

    # ------------------------------------------------------------------ schedule
    def _schedule_running(self, d: int) -> tuple[list[PrefillChunk], int]:
        """Every running request in running (admission) order: a decode gets its drafts and
        the KV slots ``allocate_slots`` asks for; a prefill its next chunk from what is left."""
        cfg, alloc = self.config, self.alloc
        k, lookahead, max_len = self.num_spec, self.lookahead, cfg.max_model_len
        # every scheduled request also takes ``num_draft_slots`` input slots (a draft model's 1:
        # vLLM's running loop charges ``num_new_tokens + draft_slots`` to the input budget)
        slots = cfg.num_draft_slots
        max_tokens = cfg.max_num_batched_tokens - self._n_dec * slots
        draft_room = max_tokens - self._n_dec  # budget left for drafts once every decode has 1
        visits = [*self.decoding.values(), *self.prefilling.values()]
        visits.sort(key=_by_admission)
        verify: list[tuple[Group, int]] = []
        chunks: list[PrefillChunk] = []
        drafted = used = longest = 0
        threshold = self.long_prefill_token_threshold
        decoding, prefilling = Status.DECODING, Status.PREFILLING
        append = alloc.append
        for g in visits:
            status = g.status
            if status is decoding:
                length = g.anchor_len + d - g.anchor_counter
                drafts = min(k, max_len - 2 - length, draft_room - drafted)
                if drafts < 0:
                    drafts = 0
                need = length + 1 + drafts + lookahead
                if need > g.final_tokens:
                    need = g.final_tokens
                s = g.seq_ids[0]
                while (r := append(s, need)) is None:
                    if not self._preempt_newest(g):
                        break
                if g.status is not decoding:  # it was the newest: all after it are preempted
                    break
                if r.copies:
                    self._copies.extend((s, src, dst, r.num_copied_tokens) for src, dst in r.copies)
                verify.append((g, drafts))
                drafted += drafts
                if length > longest:
                    longest = length
            elif status is prefilling:
                n = g.num_prefill_target - g.num_computed
                if 0 < threshold < n:
                    n = threshold
                budget = max_tokens - self._n_dec - drafted - used - slots
                if n > budget:
                    n = budget
                if n <= 0:
                    continue  # no budget left this step (vLLM: num_new_tokens == 0, skipped)
                if not self._grow_prefill(g, g.num_computed + n):
                    break
                chunks.append(self._chunk(g, n))
                used += n + slots
        if self._preempted:  # a later growth may have preempted a decode counted above
            verify = [(g, x) for g, x in verify if g.status is decoding]
            drafted = sum(x for _, x in verify)
            longest = max((g.anchor_len + d - g.anchor_counter for g, _ in verify), default=0)
            chunks = [c for c in chunks if c.seq_id in self._prefill_owner]
        self._verify, self._num_drafted, self._decode_max = verify, drafted, longest
        return chunks, max_tokens - self._n_dec - drafted - used

    def _plan(self, d: int, chunks: list[PrefillChunk]) -> StepPlan:
        return super()._plan(d, chunks)._replace(num_spec_tokens=self._num_drafted)

    def _max_context(self, d: int) -> int:
        return self._decode_max

    # ------------------------------------------------------------------ decode bookkeeping
    def _start_decode(self, g: Group, length: int, d: int) -> None:
        """As the core's, without the counter-keyed growth, finish and max-context entries:
        with speculation a request's length does not follow the counter."""
        g.status = Status.DECODING
        g.anchor_len, g.anchor_counter = length, d
        self.decoding[g.request_id] = g
        self._n_dec += 1
        self._s1 += length
        self._s2 += length * length

    def is_quiet(self, plan: StepPlan) -> bool:
        """Never: every step changes each decoding request's length by a random amount."""
        return False

    # ------------------------------------------------------------------ complete
    def complete(self, plan: StepPlan) -> StepOutcome:
        """Draw each verified request's accepted drafts, keep them (``anchor_len``), file the
        finishes of requests whose last token this step writes, then complete as V1 does."""
        assert plan.step_id == self.step_id, "complete() must follow its own schedule()"
        d = self.decode_counter
        survival, rand = self._survival, self._spec_rng.random
        per_pos = self.spec_accepted_per_pos
        finishing: list[tuple[Group, int]] = []
        accepted_total = emitted = 0
        for g, drafts in self._verify:
            length = g.anchor_len + d - g.anchor_counter  # KV before this step's write
            u = rand()
            accepted = 0
            while accepted < drafts and u < survival[accepted]:
                per_pos[accepted] += 1
                accepted += 1
            accepted_total += accepted
            kept = g.final_tokens - length - 1  # drafts the request can still use
            if accepted < kept:
                kept = accepted
            emitted += 1 + kept
            if kept:
                g.anchor_len += kept
                self._s1 += kept
                self._s2 += kept * (2 * length + kept)
            if length + 1 + kept >= g.final_tokens:
                finishing.append((g, g.epoch))
        self.spec_num_drafts += len(self._verify)
        self.spec_num_draft_tokens += self._num_drafted
        self.spec_num_accepted_tokens += accepted_total
        self.spec_emitted_tokens += emitted
        self._verify = []
        if finishing:
            self._finishes.setdefault(d + 1, []).extend(finishing)
        return super().complete(plan)

    # ------------------------------------------------------------------ report
    def spec_stats(self) -> dict[str, object]:
        """The run's figures as vLLM's SpecDecodingLogging reports them, plus the tokens each
        verify pass emitted per sequence (the accepted drafts cut at each request's end)."""
        n = self.spec_num_drafts
        return {
            "num_drafts": n,
            "num_draft_tokens": self.spec_num_draft_tokens,
            "num_accepted_tokens": self.spec_num_accepted_tokens,
            "mean_acceptance_length": 1 + self.spec_num_accepted_tokens / n if n else 1.0,
            "acceptance_per_position": [c / n if n else 0.0 for c in self.spec_accepted_per_pos],
            "emitted_tokens_per_step": self.spec_emitted_tokens / n if n else 1.0,
        }
