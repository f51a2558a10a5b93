#!/usr/bin/env python3
"""kvplan's vLLM V0 scheduler against vLLM's own (0.10.2, the last release with V0), step by step.

    python3 -m venv /tmp/v0v && /tmp/v0v/bin/pip install torch==2.13.0      # the CPU build
    /tmp/v0v/bin/pip install --no-deps vllm==0.10.2     # or its wheel file; no CUDA torch pulled
    /tmp/v0v/bin/pip install regex cachetools psutil numpy requests tqdm blake3 py-cpuinfo \\
        'transformers>=4.55,<4.57' huggingface_hub tokenizers safetensors pydantic msgspec pyzmq \\
        cloudpickle pyyaml einops openai prometheus_client pybase64 cbor2 setproctitle aiohttp pillow
    python benchmarks/parity_vllm_v0.py --vllm-python /tmp/v0v/bin/python [--case NAME] [--show N]

vLLM V0's ``vllm.core.scheduler.Scheduler`` and its ``SelfAttnBlockSpaceManager`` are pure
Python: the compiled ``vllm._C`` (built for torch 2.8) is never imported on this path, so nothing
is stubbed; ``VLLM_TARGET_DEVICE=cpu`` is set as in parity_vllm.py. This script builds the
scheduler directly from a ``SchedulerConfig`` and a ``CacheConfig`` whose ``num_gpu_blocks`` /
``num_cpu_blocks`` it sets (no model, no ``LLMEngine``), adds one ``SequenceGroup`` per request
(a ``Sequence`` over token ids, ``SamplingParams(max_tokens, ignore_eos=True)``) and steps it the
way ``LLMEngine.step`` does with the synchronous output processor (vllm/engine/llm_engine.py
``_process_model_outputs``, vllm/engine/output_processor/single_step.py and stop_checker.py):
every scheduled group's ``update_num_computed_tokens(token_chunk_size)``; a group whose metadata
has ``do_sample`` (its prefill completes, or it decodes) appends one token (id 7) and stops when
its output reaches ``max_tokens`` (``free_seq`` then); ``free_finished_seq_groups()`` if any
finished. A request with ``n > 1`` is what ``LLMEngine._add_processed_request`` makes of it in
0.10.2: ``ParallelSampleSequenceGroup.add_request`` adds ``n`` independent single-sequence groups
(``<id>_parallel_sample_<j>``, ``n=1`` each) — V0 no longer forks samples inside one group, so
``fork_seq`` is never called and, with ``preemption_mode`` unset, every group is preempted by
recompute (``Scheduler._preempt``: swap only for ``get_max_num_running_seqs() > 1``).

kvplan's ``V0Scheduler`` runs the same requests with the same knobs in detail mode over a
``PagedAllocator`` of the same ``num_blocks`` (V0's block manager has no null block: every block
is usable). Per step both sides record the tokens computed per request (prefill chunk without its
prefix-cache hits, or one per decoding sequence; a request's samples summed), the prefix-cache
hit tokens of the requests admitted (``hit``), the requests preempted by recompute
(``preempted``) and swapped out (``swapped``), the requests whose every sequence finished, the
requests refused (vLLM: ``ignored_seq_groups``; kvplan: rejected at ``add_request``), and the free
GPU blocks once the step is scheduled (vLLM: ``block_manager.get_num_free_gpu_blocks()``, which
counts evictable cached blocks; kvplan: ``num_free_blocks()``). The first step where the two
disagree is printed with both sides; the table says per case how many steps agree (in all: after a
first difference the two runs are usually out of step) and which step differs first. A benchmark,
not a test: it needs the vLLM venv, ~5 s of vLLM import per case.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class R(NamedTuple):
    """One request: prompt and output tokens, prefix group (None: a prompt of its own), parallel
    samples, and the step before whose scheduling it arrives."""

    prompt: int
    out: int
    group: int | None = None
    n: int = 1
    at: int = 0


# knobs: max_num_seqs, max_num_batched_tokens, max_model_len, num_blocks, block_size, chunked,
# prefix, preemption_mode (None: vLLM's default, kvplan's "recompute"), cpu_blocks
BASE: dict[str, Any] = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 512,
                        "num_blocks": 200, "block_size": 16, "chunked": False, "prefix": False,
                        "preemption_mode": None, "cpu_blocks": 0}
FOUR = [R(40, 60), R(40, 60), R(40, 60), R(40, 60), R(20, 10, at=30)]
CASES: dict[str, tuple[dict[str, Any], list[R]]] = {
    # (1) whole prompts within the budget; a step that admits runs no decodes (r2, r3 wait for
    # r0, r1's prefill; r4 arrives while the others decode)
    "prefill-only": ({"max_num_batched_tokens": 128, "max_model_len": 128},
                     [R(60, 5), R(50, 6), R(40, 4), R(30, 8), R(20, 3, at=6)]),
    # (2) 19 blocks, four prompts of 3 blocks growing to 7: at the second boundary three growths
    # take the last 3 blocks and the fourth preempts the newest (itself); r4 arrives later
    "recompute": ({"num_blocks": 19}, FOUR),
    # (2b) the same with 20 blocks: the second boundary leaves exactly 0 free, and the decodes
    # after it need no new block (V0's can_append_slots counts one touched block per decode)
    "recompute-20": ({"num_blocks": 20}, FOUR),
    # (2c) 7 blocks, both prompts admitted leaving 0 free; neither decode needs a block for a while
    "free-zero": ({"num_blocks": 7}, [R(40, 6), R(56, 6)]),
    # (3) chunked prefill, budget 64: every admission takes its whole prompt's blocks (r2's 7 do
    # not fit beside r0's 13 and r1's 10 in 28 blocks although its first chunk would), later
    # chunks never preempt
    "chunked-reserve": ({"chunked": True, "max_num_batched_tokens": 64, "num_blocks": 28},
                        [R(200, 6), R(150, 6), R(100, 6), R(30, 4)]),
    # (3b) chunked prefill, 66 blocks: r2's 60-block prompt is still prefilling when r0 and r1
    # both cross a block boundary (step 9) with 1 block free; the victim is the last of V0's
    # running queue, the prefilling r2, and r3, arriving in that step, is admitted in it
    "chunked-victim": ({"chunked": True, "max_num_batched_tokens": 64, "max_model_len": 2048,
                        "num_blocks": 66},
                       [R(40, 30), R(24, 30), R(960, 4), R(16, 4, at=9)]),
    # (3c) chunked prefill under block pressure, where the pool runs down to exactly 0 free blocks
    "chunked-preempt": ({"chunked": True, "max_num_batched_tokens": 64, "num_blocks": 17},
                        [R(40, 50), R(40, 50), R(100, 20), R(30, 40), R(20, 5, at=20)]),
    # (3d) chunked prefill, 14 blocks: r1's prompt (11 blocks, the last partial) is prefilling
    # when r0's first decode takes the last free block; r1's own check then finds none
    "prefill-touched": ({"chunked": True, "max_num_batched_tokens": 64, "num_blocks": 14},
                        [R(32, 20), R(168, 3)]),
    # (3e) the same with r1's last block full (176 tokens): its own check touches no block, so it
    # keeps prefilling in step 1; in step 2 r0's decode finds no free block and preempts it
    "prefill-touched-full": ({"chunked": True, "max_num_batched_tokens": 64, "num_blocks": 14},
                             [R(32, 20), R(176, 3)]),
    # (4) 150 blocks, watermark int(0.01 * 150) = 1: r1's 50 blocks fit the 50 left by r0's 100
    # only without the watermark; r1 waits for r0 to finish
    "watermark": ({"max_num_batched_tokens": 4096, "max_model_len": 4096, "num_blocks": 150},
                  [R(1600, 4), R(800, 4), R(16, 2)]),
    # (4b) a prompt of all 150 blocks could never leave the watermark free (AllocStatus.NEVER)
    "watermark-never": ({"max_num_batched_tokens": 4096, "max_model_len": 4096, "num_blocks": 150},
                        [R(2400, 2), R(100, 3)]),
    # (4c) chunked prefill and the watermark: 100 blocks (watermark 1), a 98-block prompt, then a
    # 1-block one admitted with 1 left, whose first decode finds none
    "watermark-chunked": ({"chunked": True, "max_num_batched_tokens": 256, "max_model_len": 2048,
                           "num_blocks": 100}, [R(16 * 98, 3), R(16, 3)]),
    # (5) prefix caching with chunked prefill: an unfinished prompt's chunk is cut to whole blocks
    # (budget 56 less the decodes: 48, 32 ...)
    "prefix-chunked": ({"chunked": True, "prefix": True, "max_num_batched_tokens": 56,
                        "max_model_len": 1024},
                       [R(100, 4, 0), R(120, 4, 0), R(64, 4, 1), R(64, 3, 1, at=12)]),
    # (5b) prefix caching without chunking: hits on a prompt prefilled in an earlier step
    "prefix": ({"prefix": True}, [R(64, 4, 0), R(80, 4, 0, at=2), R(48, 4, 1, at=2), R(64, 4, 0, at=3)]),
    # (5c) prefix caching and recompute (case 2's requests): the victim's full blocks, prompt and
    # generated (V0 hashes both), are still cached when it is re-admitted
    "prefix-recompute": ({"num_blocks": 19, "prefix": True}, FOUR),
    # (6) parallel sampling n=2 with few blocks (vLLM 0.10.2: n independent groups, recompute)
    "parallel-n2": ({"num_blocks": 24, "cpu_blocks": 64}, [R(40, 40, n=2), R(40, 40, n=2), R(20, 8)]),
    # (6b) the same with prefix caching: vLLM's samples share their prompt's full blocks by hash
    "parallel-n2-prefix": ({"num_blocks": 24, "cpu_blocks": 64, "prefix": True},
                           [R(40, 40, 0, n=2), R(40, 40, 1, n=2), R(20, 8)]),
    # (6c) preemption_mode="swap" (single sequences, 19 blocks as case 2): victims go to the CPU
    # pool and come back, first out first in, before waiting requests
    "swap": ({"num_blocks": 19, "cpu_blocks": 64, "preemption_mode": "swap"},
             [R(40, 60), R(40, 60), R(40, 60), R(40, 60), R(20, 10, at=10)]),
    # max_num_seqs 2: admission stops at the cap
    "max-seqs": ({"max_num_seqs": 2, "max_num_batched_tokens": 256, "max_model_len": 256},
                 [R(20, 6), R(20, 3), R(20, 5), R(20, 2)]),
}
MAX_STEPS = 2000


def knobs_of(case: str) -> dict[str, Any]:
    return {**BASE, **CASES[case][0]}


def prompt_ids(requests: list[R]) -> list[list[int]]:
    """Token ids: a request of prefix group g shares its leading tokens with the group's others
    (ids 100 + g), the rest is its own (ids 1000 + its index); no group: all its own."""
    out = []
    for i, r in enumerate(requests):
        shared = r.prompt // 2 if r.group is not None else 0
        out.append([100 + (r.group or 0)] * shared + [1000 + i] * (r.prompt - shared))
    return out


def _record(tokens: dict[int, int], hit: dict[int, int], preempted: set[int], swapped: set[int],
            finished: set[int], ignored: set[int], free: int) -> dict[str, object]:
    step: dict[str, object] = {"tokens": {str(r): n for r, n in sorted(tokens.items())}}
    for name, value in (("hit", {str(r): n for r, n in sorted(hit.items()) if n}),
                        ("preempted", sorted(preempted)), ("swapped", sorted(swapped)),
                        ("finished", sorted(finished)), ("ignored", sorted(ignored))):
        if value:
            step[name] = value
    step["free"] = free
    return step


# ----------------------------------------------------------------------------- vLLM's side
def run_vllm(case: str) -> list[dict[str, object]]:
    """vLLM V0's steps (this runs under the vLLM venv's python: ``--emit-vllm``)."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.core.scheduler import Scheduler
    from vllm.inputs import token_inputs
    from vllm.logprobs import Logprob
    from vllm.sampling_params import SamplingParams
    from vllm.sequence import Sequence, SequenceGroup, SequenceStatus

    knobs, requests = knobs_of(case), CASES[case][1]
    bs = int(knobs["block_size"])
    sc = SchedulerConfig(max_num_seqs=knobs["max_num_seqs"],
                         max_num_batched_tokens=knobs["max_num_batched_tokens"],
                         max_model_len=knobs["max_model_len"], enable_chunked_prefill=knobs["chunked"],
                         preemption_mode=knobs["preemption_mode"])
    cc = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto",
                     enable_prefix_caching=bool(knobs["prefix"]))
    cc.num_gpu_blocks = int(knobs["num_blocks"])
    cc.num_cpu_blocks = int(knobs["cpu_blocks"])
    sched = Scheduler(sc, cc, None)
    max_model_len = int(knobs["max_model_len"])

    owner: dict[str, int] = {}  # seq group request id -> request index
    samples: dict[int, list[SequenceGroup]] = {}
    ids = prompt_ids(requests)
    next_seq = 0

    def add(i: int) -> None:
        nonlocal next_seq
        r = requests[i]
        for j in range(r.n):  # LLMEngine: ParallelSampleSequenceGroup.add_request for n > 1
            rid = str(i) if r.n == 1 else f"{i}_parallel_sample_{j}"
            seq = Sequence(next_seq, token_inputs(list(ids[i])), bs, eos_token_id=2)
            next_seq += 1
            g = SequenceGroup(request_id=rid, seqs=[seq], arrival_time=float(i),
                              sampling_params=SamplingParams(max_tokens=r.out, ignore_eos=True, n=1))
            owner[rid] = i
            samples.setdefault(i, []).append(g)
            sched.add_seq_group(g)

    steps: list[dict[str, object]] = []
    pending = sorted(range(len(requests)), key=lambda i: (requests[i].at, i))
    while (pending or sched.has_unfinished_seqs()) and len(steps) < MAX_STEPS:
        t = len(steps)
        while pending and requests[pending[0]].at <= t:
            add(pending.pop(0))
        before = {g.request_id for g in sched.running}
        metas, out, _ = sched.schedule()
        free = sched.block_manager.get_num_free_gpu_blocks()
        preempted = {owner[g.request_id] for g in sched.waiting if g.request_id in before}
        swapped = {owner[g.request_id] for g in sched.swapped if g.request_id in before}
        tokens: dict[int, int] = {}
        hit: dict[int, int] = {}
        finished_now = False
        for meta, ssg in zip(metas, out.scheduled_seq_groups):
            g = ssg.seq_group
            i = owner[g.request_id]
            chunk = meta.token_chunk_size
            if meta.is_prompt:
                seq = g.first_seq
                done = seq.data.get_num_computed_tokens()
                # the prefix-cache hit of a first chunk: its computed blocks beyond what is
                # computed already; a fully cached prompt still computes its last token
                cached = max(0, len(meta.computed_block_nums or ()) * bs - done)
                cached = min(cached, chunk - 1)
                if cached:
                    hit[i] = hit.get(i, 0) + cached
                tokens[i] = tokens.get(i, 0) + chunk - cached
            else:
                tokens[i] = tokens.get(i, 0) + len(g.get_seqs(status=SequenceStatus.RUNNING))
            if g.is_finished():
                continue
            g.update_num_computed_tokens(chunk)
            if meta.do_sample:
                for seq in g.get_seqs(status=SequenceStatus.RUNNING):
                    seq.append_token_id(7, {7: Logprob(0.0)})
                    # StopChecker.maybe_stop_sequence with ignore_eos: max_model_len, max_tokens
                    if seq.get_len() >= max_model_len or seq.get_output_len() == g.sampling_params.max_tokens:
                        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
                        sched.free_seq(seq)
                if g.is_finished():
                    finished_now = True
        if finished_now:
            sched.free_finished_seq_groups()
        finished = {i for i in {owner[ssg.seq_group.request_id] for ssg in out.scheduled_seq_groups}
                    if all(g.is_finished() for g in samples[i])}
        ignored = {owner[g.request_id] for g in out.ignored_seq_groups}
        steps.append(_record(tokens, hit, preempted, swapped, finished, ignored, free))
    return steps


# ----------------------------------------------------------------------------- kvplan's side
def run_kvplan(case: str) -> list[dict[str, object]]:
    sys.path.insert(0, str(ROOT))
    from simulator.kv.paged import PagedAllocator
    from simulator.scheduler.config import SchedulerConfig
    from simulator.scheduler.state import Status
    from simulator.scheduler.v0 import V0Scheduler
    from workloads.request import Request

    knobs, requests = knobs_of(case), CASES[case][1]
    bs = int(knobs["block_size"])
    prefix = bool(knobs["prefix"])
    cfg = SchedulerConfig(engine="vllm-v0", max_num_seqs=knobs["max_num_seqs"],
                          max_num_batched_tokens=knobs["max_num_batched_tokens"],
                          max_model_len=knobs["max_model_len"], block_size=bs,
                          enable_chunked_prefill=knobs["chunked"], enable_prefix_caching=prefix,
                          # vLLM's None: recompute for a single-sequence group (Scheduler._preempt)
                          preemption_mode=knobs["preemption_mode"] or "recompute",
                          swap_space_tokens=knobs["cpu_blocks"] * bs)
    alloc = PagedAllocator(int(knobs["num_blocks"]), bs, enable_prefix_caching=prefix)
    sched = V0Scheduler(alloc, cfg, detail=True)
    ids = prompt_ids(requests)
    owner: dict[int, int] = {}
    steps: list[dict[str, object]] = []
    pending = sorted(range(len(requests)), key=lambda i: (requests[i].at, i))
    while (pending or sched.has_work) and len(steps) < MAX_STEPS:
        t = len(steps)
        ignored: set[int] = set()
        while pending and requests[pending[0]].at <= t:
            i = pending.pop(0)
            r = requests[i]
            hashes = _block_hashes(ids[i], bs) if prefix else ()
            g = sched.add_request(Request(i, 0.0, r.prompt, r.out, n=r.n, prefix_ids=hashes,
                                          prefix_block_tokens=bs if hashes else 0))
            if g.status is Status.REJECTED:
                ignored.add(i)
        plan = sched.schedule()
        free = alloc.num_free_blocks()
        for g in sched.groups.values():
            for s in g.seq_ids:
                owner[s] = g.request_id
        tokens: dict[int, int] = {}
        for d in plan.details or ():
            tokens[owner[d.seq_id]] = tokens.get(owner[d.seq_id], 0) + d.num_tokens
        hit = {g.request_id: _admission_hit(g, plan) for g in sched.newly_admitted}
        preempted = {r for r in plan.preempted if sched.groups[r].status is not Status.SWAPPED}
        swapped = {r for r in plan.preempted if sched.groups[r].status is Status.SWAPPED}
        outcome = sched.complete(plan)
        steps.append(_record(tokens, hit, preempted, swapped, {g.request_id for g in outcome.finished},
                             ignored, free))
    return steps


def _admission_hit(g, plan) -> int:  # type: ignore[no-untyped-def]
    """The prefix-cache tokens a group admitted in ``plan`` found: where its first chunk starts."""
    for c in plan.prefills:
        if c.seq_id in g.seq_ids:
            return int(c.num_computed_tokens)
    return 0


def _block_hashes(ids: list[int], bs: int) -> tuple[int, ...]:
    """A chained id per full block of the prompt (what a trace's hash_ids give kvplan)."""
    out, h = [], 0
    for start in range(0, len(ids) - len(ids) % bs, bs):
        h = hash((h, tuple(ids[start:start + bs]))) & 0x7FFFFFFF
        out.append(h)
    return tuple(out)


def diff(ours: list[dict[str, object]], theirs: list[dict[str, object]]) -> tuple[int, int | None, str]:
    """Steps that agree (in all), the first that does not, and that step side by side."""
    agree = sum(a == b for a, b in zip(ours, theirs))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            pad = " " * (8 + len(str(i)))
            return agree, i, f"step {i}: kvplan {json.dumps(a)}\n{pad}vLLM   {json.dumps(b)}"
    if len(ours) != len(theirs):
        i = min(len(ours), len(theirs))
        return agree, i, f"kvplan ran {len(ours)} steps, vLLM {len(theirs)}"
    return agree, None, ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", help="the python of a venv with vllm 0.10.2 (see above)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="only this case (repeatable)")
    ap.add_argument("--show", type=int, default=0, metavar="N",
                    help="also print both sides' first N steps of each case")
    ap.add_argument("--emit-vllm", metavar="CASE", help=argparse.SUPPRESS)  # the vLLM side, as JSON
    args = ap.parse_args(argv)
    if args.emit_vllm:
        print(json.dumps(run_vllm(args.emit_vllm)))
        return 0
    if not args.vllm_python:
        ap.error("--vllm-python is required (the vLLM venv's python)")
    rows = []
    for case in args.case or list(CASES):
        proc = subprocess.run([args.vllm_python, __file__, "--emit-vllm", case],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{case}: vLLM side failed: {proc.stderr.strip().splitlines()[-1:]}")
            rows.append((case, None, None, None, None, "vLLM side failed"))
            continue
        theirs = json.loads(proc.stdout.strip().splitlines()[-1])
        ours = run_kvplan(case)
        agree, first, where = diff(ours, theirs)
        rows.append((case, len(theirs), len(ours), agree, first, where))
        for i in range(min(args.show, max(len(ours), len(theirs)))):
            print(f"{case} {i:3d} kvplan {json.dumps(ours[i]) if i < len(ours) else '—'}")
            print(f"{case} {i:3d} vLLM   {json.dumps(theirs[i]) if i < len(theirs) else '—'}")
    print(f"\n{'case':20s} {'vLLM steps':>10s} {'kvplan steps':>12s} {'steps agree':>11s} "
          f"{'first diff':>10s}")
    for case, total, ours_n, agree, first, _ in rows:
        cells = ["—" if v is None else v for v in (total, ours_n, agree)]
        where_first = "—" if first is None else first
        print(f"{case:20s} {cells[0]:>10} {cells[1]:>12} {cells[2]:>11} {where_first:>10}")
    for case, *_, where in rows:
        if where:
            print(f"\n{case}: first difference\n  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
