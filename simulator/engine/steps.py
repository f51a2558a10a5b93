"""What a run records about its engine steps: every step, or per-second bins, and exact totals.

A run of an hour takes 10^5–10^6 engine steps per replica, a run of 10^6 requests millions. The
summary needs only totals (busy time, time-weighted KV breakdown and batch size, peaks), which
:class:`StepTotals` keeps exactly whatever is recorded; the rows are for steps.csv and the plots.
Two modes (``record_steps`` of :func:`simulator.engine.core.simulate`):

* ``"full"`` (or ``True``): one row per engine step, :data:`STEP_COLUMNS`, ``num_steps`` = 1.
  What fidelity checks and the validation re-timing compare step by step. Memory grows with the
  number of steps.
* ``"bins"``: one row per replica per ``bin_s`` seconds of simulated time (a step belongs to the
  bin its start falls in), with the same columns: ``step`` is the bin's first step, ``time_s`` the
  bin's start, ``duration_s`` the busy seconds in it and ``num_steps`` its steps. Work done in the
  bin is *summed* (``num_prefill_seqs``, ``num_prefill_tokens``, ``num_decode_seqs`` — decode
  tokens generated — and ``num_preempted``); states are *time-weighted means* over its steps
  (``num_running_seqs``, ``num_waiting`` and the ``kv_*`` columns). Memory grows with simulated
  time, not with requests or steps: the default of ``kvplan simulate``.
* ``False``: no rows (totals only).

Idle bins (no step starts in them) have no row.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from operator import mul
from typing import TYPE_CHECKING, Any

from simulator.scheduler.plan import StepPlan

if TYPE_CHECKING:  # pragma: no cover
    from simulator.kv.allocator import KVAllocator
    from simulator.scheduler import Scheduler

STEP_COLUMNS = (
    "replica", "step", "time_s", "duration_s", "num_prefill_seqs", "num_prefill_tokens",
    "num_decode_seqs", "num_running_seqs", "num_waiting", "num_preempted",
    "kv_token_state", "kv_reserved", "kv_internal_fragmentation", "kv_external_fragmentation",
    "kv_free", "kv_shared_saved", "num_steps",
)  # KV columns are in token slots
RECORD_MODES = ("full", "bins")
DEFAULT_BIN_S = 1.0


def step_row(replica: int, plan: StepPlan, start_s: float, duration_s: float, sched: Scheduler,
             alloc: KVAllocator) -> tuple:
    """One row of STEP_COLUMNS, taken after ``sched.complete(plan)`` (the KV state after the step)."""
    return _row(replica, plan, start_s, duration_s, sched,
                alloc.snapshot_parts(sched.written_tokens(), sched.head()))


def _row(replica: int, plan: StepPlan, start_s: float, duration_s: float, sched: Scheduler,
         parts: tuple) -> tuple:
    prefills = plan.prefills
    return (
        replica, plan.step_id, start_s, duration_s, len(prefills),
        plan.num_prefill_tokens if prefills else 0, plan.num_decode_seqs, sched.num_running_seqs,
        len(sched.waiting) + len(sched.swapped), len(plan.preempted),
    ) + parts + (1,)


@dataclass(slots=True)
class StepTotals:
    """Exact totals over every step of a run (all replicas): what the summary is computed from.

    ``*_s`` fields are integrals over busy time (value × step duration, summed); ``kv_s`` holds
    the six KV columns (token state, reserved, internal, external, free, shared saved) so.
    ``peak_token_state`` is the largest token state any replica's pool held after a step, and
    ``peak_used`` the most slots any replica's pool had allocated (token state + reserved +
    internal fragmentation: the pool's capacity less its free and externally fragmented slots).
    """

    num_steps: int = 0
    busy_s: float = 0.0
    batch_s: float = 0.0
    max_batch: int = 0
    kv_s: list[float] = field(default_factory=lambda: [0.0] * 6)
    peak_token_state: int = 0
    peak_used: int = 0

    def add(self, duration_s: float, batch: int, parts: tuple) -> None:
        self.num_steps += 1
        self.busy_s += duration_s
        self.batch_s += batch * duration_s
        if batch > self.max_batch:
            self.max_batch = batch
        ts, res, internal, ext, free, saved = parts
        kv = self.kv_s  # one step's terms, added one by one (unrolled: once per engine step)
        kv[0] += ts * duration_s
        kv[1] += res * duration_s
        kv[2] += internal * duration_s
        kv[3] += ext * duration_s
        kv[4] += free * duration_s
        kv[5] += saved * duration_s
        if ts > self.peak_token_state:
            self.peak_token_state = ts
        used = ts + res + internal
        if used > self.peak_used:
            self.peak_used = used

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> StepTotals:
        """The totals of full rows (one per step, :data:`STEP_COLUMNS`)."""
        totals = cls()
        for row in rows:
            totals.add(row[3], row[4] + row[6], row[10:16])
        return totals


class StepLog:
    """Records a run's steps in one of the :data:`RECORD_MODES` (or none) and keeps the totals.

    The engine calls :meth:`step` for every step it runs on its own and :meth:`quiet_run` for a
    run of identical decode steps (:meth:`simulator.scheduler.Scheduler.quiet_run`), whose
    per-step plans it never builds.
    """

    def __init__(self, mode: bool | str = "full", *, bin_s: float = DEFAULT_BIN_S) -> None:
        if mode is True:
            mode = "full"
        if mode is not False and mode not in RECORD_MODES:
            raise ValueError(f"record_steps must be one of {RECORD_MODES} or a bool, got {mode!r}")
        if not bin_s > 0:
            raise ValueError(f"bin_s must be positive, got {bin_s}")
        self.mode = mode or None
        self.bin_s = float(bin_s)
        self.totals = StepTotals()
        self._rows: list[tuple] = []
        self._bins: dict[int, list[Any]] = {}  # replica -> the open bin's accumulators

    @property
    def rows(self) -> list[tuple]:
        """The recorded rows (bins: flushed and sorted by replica, then time)."""
        if self.mode == "bins" and self._bins:
            for replica in sorted(self._bins):
                self._rows.append(self._bin_row(replica, self._bins[replica]))
            self._bins.clear()
            self._rows.sort(key=lambda r: (r[0], r[2]))
        return self._rows

    def step(self, replica: int, plan: StepPlan, start_s: float, duration_s: float,
             sched: Scheduler, alloc: KVAllocator) -> None:
        """Record a step the engine ran (after ``sched.complete(plan)``)."""
        parts = alloc.snapshot_parts(sched.written_tokens(), sched.head())
        prefills = plan.prefills
        self.totals.add(duration_s, len(prefills) + plan.num_decode_seqs, parts)
        if self.mode == "bins":  # the row's fields straight into the bin, no row built
            self._bin_add(replica, plan.step_id, start_s, duration_s, len(prefills),
                          plan.num_prefill_tokens if prefills else 0, plan.num_decode_seqs,
                          sched.num_running_seqs, len(sched.waiting) + len(sched.swapped),
                          len(plan.preempted), parts)
        elif self.mode == "full":
            self._rows.append(_row(replica, plan, start_s, duration_s, sched, parts))

    def quiet_run(self, replica: int, step_id: int, starts: list[float], durations: list[float],
                  num_decode: int, segments: list[tuple[int, int, int, tuple]],
                  kv_per_step: int | None = None) -> None:
        """Record the steps of a quiet run (decode-only, the same batch; step ``i`` starts at
        ``starts[i]``, when step ``i - 1`` ends, and lasts ``durations[i]``; ``starts`` may run
        on past the run).

        ``segments`` are ``(first step, running sequences, waiting requests, KV parts after that
        step)`` in step order: over a segment the allocator does not change, so step ``i`` of a
        segment starting at ``a`` leaves the segment's parts with ``num_decode × (i − a)`` more
        tokens written — token state ``kv_per_step × (i − a)`` higher, reserved that much lower
        (never below 0), internal fragmentation what is left of the allocated slots.
        ``kv_per_step``: the token-state slots one step's tokens fill, ``num_decode`` (the
        default) but for a hybrid pool, where each token fills a slot in every token group
        (:attr:`~simulator.kv.allocator.KVAllocator.slots_per_token`).

        Full rows are exactly the per-step snapshots; totals and bins are the same sums, taken
        per segment in closed form from prefix sums (equal to the per-step sums up to rounding).
        """
        m = len(durations)
        g = num_decode if kv_per_step is None else kv_per_step
        ends = [seg[0] for seg in segments[1:]]  # segment i ends where segment i + 1 begins
        ends.append(m)
        full = self.mode == "full"
        if not full:
            for seg, b in zip(segments, ends):
                if seg[3][1] < g * (b - seg[0] - 1):  # reserved runs out: no closed form
                    full = True
                    break
        if full:
            self._quiet_steps(replica, step_id, starts, durations, num_decode, segments, ends, g)
            return
        totals = self.totals
        if totals.max_batch < num_decode:
            totals.max_batch = num_decode
        totals.num_steps += m
        cum = list(accumulate(durations, initial=0.0))  # Σ dt before step i
        cum_i = list(accumulate(map(mul, range(m), durations), initial=0.0))  # Σ i × dt before i
        split = self.mode == "bins"
        if split:
            bin_s = self.bin_s
            index = int(starts[0] // bin_s)
            split = not starts[m - 1] < (index + 1) * bin_s  # the run's steps start in two bins
        peak = used = 0
        if not split:  # one bin (or none): add the segments up, then record them once
            # Σ dt × (six KV parts, running, waiting), in locals: one segment per growth step
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
            for (a, running, waiting, (ts, res, internal, ext, free, saved)), b in zip(segments, ends):
                busy = cum[b] - cum[a]
                grow = g * ((cum_i[b] - cum_i[a]) - a * busy)
                s0 += ts * busy + grow
                s1 += res * busy - grow
                s2 += internal * busy
                s3 += ext * busy
                s4 += free * busy
                s5 += saved * busy
                s6 += running * busy
                s7 += waiting * busy
                top = ts + g * (b - 1 - a)  # token state peaks at a segment's last step
                if top > peak:
                    peak = top
                if ts + res + internal > used:  # allocated: the same all through a segment
                    used = ts + res + internal
            self._add_sums(replica, index if self.mode == "bins" else -1, step_id, m, cum[m],
                           num_decode, [s0, s1, s2, s3, s4, s5, s6, s7])
        else:  # each segment's steps per bin: _add_sums, written out (a segment can be one step)
            kv = totals.kv_s
            acc = self._bins.get(replica)
            for (a0, running, waiting, parts), b in zip(segments, ends):
                ts, res, internal, ext, free, saved = parts
                top = ts + g * (b - 1 - a0)
                if top > peak:
                    peak = top
                if ts + res + internal > used:
                    used = ts + res + internal
                a = a0
                while a < b:  # the steps of the segment that start in step a's bin
                    index = int(starts[a] // bin_s)
                    c = b if starts[b - 1] < (index + 1) * bin_s else \
                        bisect_left(starts, (index + 1) * bin_s, a + 1, b)
                    busy = cum[c] - cum[a]
                    grow = g * ((cum_i[c] - cum_i[a]) - a0 * busy)
                    k0, k1 = ts * busy + grow, res * busy - grow
                    k2, k3, k4, k5 = internal * busy, ext * busy, free * busy, saved * busy
                    totals.busy_s += busy
                    totals.batch_s += num_decode * busy
                    kv[0] += k0
                    kv[1] += k1
                    kv[2] += k2
                    kv[3] += k3
                    kv[4] += k4
                    kv[5] += k5
                    if acc is None or acc[0] != index:
                        acc = self._open_bin(replica, index, step_id + a)
                    acc[2] += c - a
                    acc[3] += busy
                    acc[6] += num_decode * (c - a)
                    acc[8] += running * busy
                    acc[9] += waiting * busy
                    acc[10] += k0
                    acc[11] += k1
                    acc[12] += k2
                    acc[13] += k3
                    acc[14] += k4
                    acc[15] += k5
                    a = c
        if totals.peak_token_state < peak:
            totals.peak_token_state = peak
        if totals.peak_used < used:
            totals.peak_used = used

    def _add_sums(self, replica: int, index: int, step_id: int, num_steps: int, busy: float,
                  num_decode: int, sums: list[float]) -> None:
        """Add decode-only steps' integrals (Σ dt × six KV parts, running, waiting) to the
        totals and, when ``index`` >= 0, to that bin of the replica (step counts are added by
        the caller to the totals)."""
        totals = self.totals
        totals.busy_s += busy
        totals.batch_s += num_decode * busy
        kv = totals.kv_s
        for p in range(6):
            kv[p] += sums[p]
        if index >= 0:
            acc = self._open_bin(replica, index, step_id)
            acc[2] += num_steps
            acc[3] += busy
            acc[6] += num_decode * num_steps
            acc[8] += sums[6]
            acc[9] += sums[7]
            for p in range(6):
                acc[10 + p] += sums[p]

    def _quiet_steps(self, replica: int, step_id: int, starts: list[float], durations: list[float],
                     num_decode: int, segments: list[tuple[int, int, int, tuple]],
                     ends: list[int], g: int) -> None:
        """:meth:`quiet_run` step by step: the full rows, or any run whose reserved slots run out
        within a segment (the snapshot's floor at 0 makes the parts non-linear there)."""
        for (a, running, waiting, parts), b in zip(segments, ends):
            ts, res, internal, ext, free, saved = parts
            allocated = ts + res + internal
            for i in range(a, b):
                dt = durations[i]
                ts_i = ts + g * (i - a)
                res_i = res - g * (i - a)
                if res_i < 0:
                    res_i = 0
                row_parts = (ts_i, res_i, allocated - ts_i - res_i, ext, free, saved)
                self.totals.add(dt, num_decode, row_parts)
                if self.mode == "full":
                    self._rows.append((replica, step_id + i, starts[i], dt, 0, 0, num_decode,
                                       running, waiting, 0) + row_parts + (1,))
                elif self.mode == "bins":
                    self._bin_add(replica, step_id + i, starts[i], dt, 0, 0, num_decode, running,
                                  waiting, 0, row_parts)

    # -- bins ----------------------------------------------------------------------------------
    def _bin_add(self, replica: int, step_id: int, start_s: float, dt: float, prefill_seqs: int,
                 prefill_tokens: int, decode_seqs: int, running: int, waiting: int, preempted: int,
                 parts: tuple) -> None:
        index = int(start_s // self.bin_s)
        acc = self._bins.get(replica)
        if acc is None or acc[0] != index:
            acc = self._open_bin(replica, index, step_id)
        acc[2] += 1
        acc[3] += dt
        acc[4] += prefill_seqs
        acc[5] += prefill_tokens
        acc[6] += decode_seqs
        acc[7] += preempted
        acc[8] += running * dt
        acc[9] += waiting * dt
        ts, res, internal, ext, free, saved = parts  # unrolled: once per engine step
        acc[10] += ts * dt
        acc[11] += res * dt
        acc[12] += internal * dt
        acc[13] += ext * dt
        acc[14] += free * dt
        acc[15] += saved * dt

    def _open_bin(self, replica: int, index: int, step_id: int) -> list[Any]:
        """The replica's accumulators for bin ``index`` (closing its previous bin)."""
        acc = self._bins.get(replica)
        if acc is None or acc[0] != index:
            if acc is not None:
                self._rows.append(self._bin_row(replica, acc))
            # index, first step, steps, busy, prefill seqs, prefill tokens, decode seqs, preempted,
            # then Σ dt × (running, waiting, six KV parts)
            acc = self._bins[replica] = [index, step_id, 0, 0.0, 0, 0, 0, 0] + [0.0] * 8
        return acc

    def _bin_row(self, replica: int, acc: list[Any]) -> tuple:
        busy = acc[3]
        means = [v / busy if busy > 0 else 0.0 for v in acc[8:16]]
        return (replica, acc[1], acc[0] * self.bin_s, busy, acc[4], acc[5], acc[6], means[0],
                means[1], acc[7], *means[2:], acc[2])
