"""Paged allocator throughput on a realistic operation trace, against a plain baseline in the same run.

    python benchmarks/allocator.py [--requests 4000] [--repeats 3]

The operation trace comes from real traces: Azure 2023 conversation requests (admit, one grow per
generated token, free) and Mooncake requests (their hash ids give real prefix-cache hits), with
every 8th request sampled n=4 (fork). A driver keeps a realistic number of sequences live and
decodes them round-robin, one token each, as an engine does. The same recorded trace is replayed
on:

* ``kvplan``: :class:`simulator.kv.paged.PagedAllocator` (refcounts, COW, prefix cache with O(1)
  LRU eviction, O(1) accounting), called per token (``append``) as a real engine would;
* ``kvplan lazy``: the same allocator called only when ``tokens_until_append`` says so (what the
  simulator does);
* ``baseline``: a minimal list + dict block manager in the style of nano-vllm's (free deque,
  hash -> block dict, ``deque.remove`` when a cached free block is reused), no accounting.

It prints operations per second and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.kv.paged import PagedAllocator  # noqa: E402
from simulator.kv.prefix import block_hashes  # noqa: E402
from workloads.loaders import bundled_trace_path, load_trace  # noqa: E402

BLOCK = 16
NUM_BLOCKS = 60_000


class BaselineBlockManager:
    """A plain block manager: what most from-scratch engines write first."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cache: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _take(self) -> int:
        b = self.free.popleft()
        h = self.hash_of[b]
        if h is not None:
            self.cache.pop(h, None)
            self.hash_of[b] = None
        self.ref[b] = 1
        return b

    def allocate(self, seq: int, n: int, final: int, hashes=()) -> bool:
        table = []
        for i in range(-(-n // self.block_size)):
            b = self.cache.get(hashes[i]) if i < len(hashes) else None
            if b is not None:
                if self.ref[b] == 0:
                    self.free.remove(b)  # O(n): the cost an intrusive list avoids
                self.ref[b] += 1
            else:
                b = self._take()
                if i < len(hashes):
                    self.cache[hashes[i]] = b
                    self.hash_of[b] = hashes[i]
            table.append(b)
        self.tables[seq] = table
        self.lens[seq] = n
        return True

    def append(self, seq: int, n: int) -> bool:
        table = self.tables[seq]
        while len(table) * self.block_size < n:
            table.append(self._take())
        last = table[-1]
        if self.ref[last] > 1:  # copy on write
            self.ref[last] -= 1
            table[-1] = self._take()
        self.lens[seq] = n
        return True

    def fork(self, parent: int, child: int, n: int) -> bool:
        table = self.tables[parent][: -(-n // self.block_size)]
        for b in table:
            self.ref[b] += 1
        self.tables[child] = list(table)
        self.lens[child] = n
        return True

    def free_seq(self, seq: int) -> None:
        for b in reversed(self.tables.pop(seq)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        del self.lens[seq]


def build_trace(num_requests: int) -> list[tuple]:
    """Record an operation trace by driving a PagedAllocator like an engine would."""
    conv = load_trace(bundled_trace_path("azure-conv"))[: num_requests // 2]
    moon = load_trace(bundled_trace_path("mooncake"))[: num_requests // 2]
    reqs = []
    for i in range(max(len(conv), len(moon))):
        if i < len(conv):
            r = conv[i]
            reqs.append((min(r.prompt_tokens, 4096), min(r.output_tokens, 512), ()))
        if i < len(moon):
            r = moon[i]
            p = min(r.prompt_tokens, 8192)
            reqs.append((p, min(r.output_tokens, 256), block_hashes(r.prefix_ids, 512, BLOCK, p)))
    alloc = PagedAllocator(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
    ops: list[tuple] = []
    live: dict[int, list[int]] = {}  # seq -> [length, final]
    next_seq = 0
    pending = deque(enumerate(reqs))
    while pending or live:
        while pending and len(live) < 192:
            i, (p, o, hashes) = pending[0]
            final = p + o - 1
            if alloc.allocate(next_seq, p, final, hashes) is None:
                break
            pending.popleft()
            ops.append(("alloc", next_seq, p, final, hashes))
            live[next_seq] = [p, final]
            parent = next_seq
            next_seq += 1
            if i % 8 == 0 and o > 1:
                for _ in range(3):
                    alloc.fork(parent, next_seq, p)
                    ops.append(("fork", parent, next_seq, p))
                    live[next_seq] = [p, final]
                    next_seq += 1
        for seq in list(live):
            length, final = live[seq]
            if length >= final:
                alloc.free(seq)
                ops.append(("free", seq))
                del live[seq]
                continue
            if alloc.append(seq, length + 1) is None:
                alloc.free(seq)  # out of blocks: preempt it (dropped from the trace)
                ops.append(("free", seq))
                del live[seq]
                continue
            ops.append(("append", seq, length + 1))
            live[seq][0] = length + 1
    return ops


def replay(ops: list[tuple], allocate, append, fork, free, until=None) -> float:  # type: ignore[no-untyped-def]
    """Seconds to apply ``ops``; with ``until`` (lazy), appends inside the allocation are skipped."""
    t = time.perf_counter()
    for op in ops:
        kind = op[0]
        if kind == "append":
            if until is not None and until(op[1], op[2] - 1) > 0:
                continue
            append(op[1], op[2])
        elif kind == "alloc":
            allocate(op[1], op[2], op[3], op[4])
        elif kind == "fork":
            fork(op[1], op[2], op[3])
        else:
            free(op[1])
    return time.perf_counter() - t


def replay_kvplan(ops: list[tuple], lazy: bool) -> float:
    a = PagedAllocator(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
    return replay(ops, a.allocate, a.append, a.fork, a.free, a.tokens_until_append if lazy else None)


def replay_baseline(ops: list[tuple]) -> float:
    m = BaselineBlockManager(NUM_BLOCKS, BLOCK)
    return replay(ops, m.allocate, m.append, m.fork, m.free_seq)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ops = build_trace(args.requests)
    counts = {k: sum(1 for o in ops if o[0] == k) for k in ("alloc", "append", "fork", "free")}
    print(f"operation trace: {len(ops):,} ops ({', '.join(f'{k} {v:,}' for k, v in counts.items())})")
    runs = {
        "baseline (list+dict)": lambda: replay_baseline(ops),
        "kvplan, per token": lambda: replay_kvplan(ops, lazy=False),
        "kvplan, lazy (simulator)": lambda: replay_kvplan(ops, lazy=True),
    }
    best = {name: min(fn() for _ in range(args.repeats)) for name, fn in runs.items()}
    base = best["baseline (list+dict)"]
    print(f"{'allocator':<26} {'seconds':>9} {'M ops/s':>9} {'vs baseline':>12}")
    for name, secs in best.items():
        print(f"{name:<26} {secs:>9.3f} {len(ops) / secs / 1e6:>9.2f} {base / secs:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
