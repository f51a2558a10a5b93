#!/usr/bin/env python3
"""kvplan's vLLM V1 scheduler against vLLM's own, step by step, on the same requests.

    python -m venv /tmp/vv && /tmp/vv/bin/pip install torch==2.13.0     # the CPU build
    /tmp/vv/bin/pip install --no-deps vllm==0.33.0                        # no CUDA torch pulled
    /tmp/vv/bin/pip install regex cachetools psutil numpy requests tqdm blake3 py-cpuinfo \\
        'transformers>=5.16.1,<5.21' huggingface_hub tokenizers safetensors pydantic msgspec pyzmq \\
        cloudpickle pyyaml einops openai prometheus_client pybase64 cbor2 setproctitle aiohttp \\
        pillow oss-harmony uvloop xgrammar fastapi partial_json_parser llguidance
    python benchmarks/parity_vllm.py --vllm-python /tmp/vv/bin/python [--case NAME]

vLLM's ``vllm.v1.core.sched.scheduler.Scheduler`` and ``KVCacheManager`` are pure Python: this
script builds them on the CPU (``VllmConfig`` over a two-layer Llama config.json written to a
temporary folder, ``skip_tokenizer_init``, a ``KVCacheConfig`` of ``num_blocks`` blocks, the
synchronous scheduler: ``async_scheduling`` off, as kvplan schedules), drives them with a fake
model step (every request whose computed tokens reach its tokens samples one token, the others —
partial prefill chunks — none, as the GPU model runner discards their samples; outputs run to
``max_tokens`` with ``ignore_eos``), and records per step the tokens scheduled per request, the
requests preempted and finished, and the block ids of every scheduled request. kvplan's
``V1Scheduler`` runs the same requests with the same knobs in detail mode over the blocks vLLM
can use — ``num_blocks − 1``: vLLM's ``BlockPool`` keeps block 0 as its null block, so kvplan's
block b is vLLM's b + 1 — and the two step lists are diffed. The ``null-block`` case instead gives
kvplan all ``num_blocks`` blocks, as kvplan's deployments do today, to show what the null block
changes (no block ids compared there).

Each case is a few requests by hand: chunked prefill under the token budget, the long-prefill
threshold, the ``max_num_seqs`` cap, preemption when blocks run out, prefix caching, and which
cached block is evicted (``eviction``: a request's generated full blocks, which vLLM hashes,
wait in the same least-recently-freed order as an earlier request's prompt). The first step where
the two disagree is printed with both sides; the table says per case how many steps agree. A
benchmark, not a test: it needs the vLLM venv and ~20 s of vLLM start-up per case.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (knobs, requests [(prompt tokens, output tokens, prefix group or None)])
CASES: dict[str, tuple[dict[str, int | bool], list[tuple[int, int, int | None]]]] = {
    "budget": ({"max_num_seqs": 8, "max_num_batched_tokens": 64, "num_blocks": 200, "block_size": 16,
                "prefix": False, "long_prefill_token_threshold": 0},
               [(100, 5, None), (30, 8, None), (50, 3, None), (20, 10, None), (70, 4, None)]),
    "threshold": ({"max_num_seqs": 8, "max_num_batched_tokens": 96, "num_blocks": 200, "block_size": 16,
                   "prefix": False, "long_prefill_token_threshold": 24},
                  [(100, 5, None), (60, 8, None), (10, 6, None)]),
    "max-seqs": ({"max_num_seqs": 2, "max_num_batched_tokens": 256, "num_blocks": 200, "block_size": 16,
                  "prefix": False, "long_prefill_token_threshold": 0},
                 [(20, 6, None), (20, 3, None), (20, 5, None), (20, 2, None)]),
    "preempt": ({"max_num_seqs": 8, "max_num_batched_tokens": 128, "num_blocks": 13, "block_size": 16,
                 "prefix": False, "long_prefill_token_threshold": 0},
                [(40, 60, None), (40, 60, None), (40, 60, None), (40, 60, None)]),
    "null-block": ({"max_num_seqs": 8, "max_num_batched_tokens": 128, "num_blocks": 6, "block_size": 16,
                    "prefix": False, "long_prefill_token_threshold": 0, "all_blocks": True},
                   [(32, 17, None), (32, 17, None)]),
    "prefix": ({"max_num_seqs": 8, "max_num_batched_tokens": 128, "num_blocks": 60, "block_size": 16,
                "prefix": True, "long_prefill_token_threshold": 0},
               [(64, 4, 0), (80, 4, 0), (48, 4, 1), (64, 4, 0)]),
    # one request at a time, 13 usable blocks: r0's prompt (prefix 0) is freed, then r1's three
    # generated full blocks; r2 (8 blocks) takes the 5 never used or partial and evicts 3 full
    # ones, least recently freed first: r0's, so r3 (prefix 0) hits 1 block, not 2 (reusing
    # unnamed blocks before named ones would take r1's generated blocks instead)
    "eviction": ({"max_num_seqs": 1, "max_num_batched_tokens": 256, "num_blocks": 14, "block_size": 16,
                  "prefix": True, "long_prefill_token_threshold": 0},
                 [(64, 4, 0), (16, 60, None), (112, 4, None), (64, 4, 0)]),
}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
         "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
         "bos_token_id": 1, "eos_token_id": 2}
MAX_STEPS = 2000


def prompt_ids(requests: list[tuple[int, int, int | None]]) -> list[list[int]]:
    """Token ids: a request of prefix group g shares its leading tokens with the group's others
    (ids 100 + g), the rest is its own (ids 1000 + its index); no group: all its own."""
    out = []
    for i, (n, _, group) in enumerate(requests):
        shared = n // 2 if group is not None else 0
        out.append([100 + (group or 0)] * shared + [1000 + i] * (n - shared))
    return out


# ----------------------------------------------------------------------------- vLLM's side
def run_vllm(case: str) -> list[dict[str, object]]:
    """vLLM's steps (this runs under the vLLM venv's python: ``--emit-vllm``)."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.utils.hashing import sha256

    knobs, requests = CASES[case]
    bs, blocks = int(knobs["block_size"]), int(knobs["num_blocks"])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(LLAMA))
        sc = SchedulerConfig(max_num_seqs=int(knobs["max_num_seqs"]),
                             max_num_batched_tokens=int(knobs["max_num_batched_tokens"]), max_model_len=2048,
                             enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False,
                             long_prefill_token_threshold=int(knobs["long_prefill_token_threshold"]))
        mc = ModelConfig(model=tmp, dtype="float16", seed=0, skip_tokenizer_init=True)
        cc = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, cache_dtype="auto",
                         enable_prefix_caching=bool(knobs["prefix"]))
        vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
        cc.num_gpu_blocks = blocks
        sched = Scheduler(vllm_config=vc, kv_cache_config=kv, log_stats=True,
                          structured_output_manager=StructuredOutputManager(vc), block_size=bs)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)
    for i, ((_, out, _), ids) in enumerate(zip(requests, prompt_ids(requests))):
        sched.add_request(Request(str(i), ids, SamplingParams(max_tokens=out, ignore_eos=True), None,
                                  block_hasher=hasher if knobs["prefix"] else None))
    steps: list[dict[str, object]] = []
    while sched.has_unfinished_requests() and len(steps) < MAX_STEPS:
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        # the block tables the step runs with (a request that finishes frees them in its update)
        tables = {r: list(sched.kv_cache_manager.get_block_ids(r)[0]) for r in ids}
        sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else []
                   for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        finished = sorted(int(r) for r in ids if sched.requests[r].num_output_tokens + len(sampled[ids.index(r)])
                          >= sched.requests[r].max_tokens)
        sched.update_from_output(so, mro)
        step = {"tokens": {r: n for r, n in sorted(so.num_scheduled_tokens.items(), key=lambda x: int(x[0]))},
                "preempted": sorted(int(r) for r in (so.preempted_req_ids or ())),
                "finished": finished}
        if not knobs.get("all_blocks"):
            step["blocks"] = {r: tables[r] for r in step["tokens"]}
        steps.append(step)
    return steps


# ----------------------------------------------------------------------------- kvplan's side
def run_kvplan(case: str) -> list[dict[str, object]]:
    sys.path.insert(0, str(ROOT))
    from simulator.kv.paged import PagedAllocator
    from simulator.scheduler import SchedulerConfig, make_scheduler
    from workloads.request import Request

    knobs, requests = CASES[case]
    bs = int(knobs["block_size"])
    cfg = SchedulerConfig(max_num_seqs=int(knobs["max_num_seqs"]),
                          max_num_batched_tokens=int(knobs["max_num_batched_tokens"]), max_model_len=2048,
                          block_size=bs, engine="vllm-v1", enable_prefix_caching=bool(knobs["prefix"]),
                          long_prefill_token_threshold=int(knobs["long_prefill_token_threshold"]))
    # the blocks vLLM can use (its BlockPool keeps block 0 as the null block); all_blocks: the
    # pool kvplan's deployment gives V1 today (Deployment.make_allocator), every block usable
    shift = 0 if knobs.get("all_blocks") else 1
    alloc = PagedAllocator(int(knobs["num_blocks"]) - shift, bs, enable_prefix_caching=bool(knobs["prefix"]))
    sched = make_scheduler(alloc, cfg, detail=True)
    for i, ((n, out, group), ids) in enumerate(zip(requests, prompt_ids(requests))):
        hashes = _block_hashes(ids, bs) if knobs["prefix"] else ()
        sched.add_request(Request(i, 0.0, n, out, prefix_ids=hashes, prefix_block_tokens=bs if hashes else 0))
    owner = {}
    steps: list[dict[str, object]] = []
    while sched.has_work and len(steps) < MAX_STEPS:
        plan = sched.schedule()
        for g in sched.groups.values():
            for s in g.seq_ids:
                owner[s] = g.request_id
        tokens: dict[str, int] = {}
        tables: dict[str, list[int]] = {}
        for d in plan.details or ():
            tokens[str(owner[d.seq_id])] = tokens.get(str(owner[d.seq_id]), 0) + d.num_tokens
            tables[str(owner[d.seq_id])] = [b + 1 for b in alloc.block_table(d.seq_id)]
        outcome = sched.complete(plan)
        step = {"tokens": dict(sorted(tokens.items(), key=lambda x: int(x[0]))),
                "preempted": sorted(plan.preempted),
                "finished": sorted(g.request_id for g in outcome.finished)}
        if shift:
            step["blocks"] = {r: tables[r] for r in step["tokens"]}
        steps.append(step)
    return steps


def _block_hashes(ids: list[int], bs: int) -> tuple[int, ...]:
    """A chained id per full block of the prompt (what a trace's hash_ids give kvplan)."""
    out, h = [], 0
    for start in range(0, len(ids) - len(ids) % bs, bs):
        h = hash((h, tuple(ids[start:start + bs]))) & 0x7FFFFFFF
        out.append(h)
    return tuple(out)


def diff(ours: list[dict[str, object]], theirs: list[dict[str, object]]) -> tuple[int, str]:
    """Steps that agree before the first that does not, and that step side by side."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i, f"step {i}: kvplan {json.dumps(a)}\n{' ' * (6 + len(str(i)))}vLLM   {json.dumps(b)}"
    if len(ours) != len(theirs):
        i = min(len(ours), len(theirs))
        return i, f"kvplan ran {len(ours)} steps, vLLM {len(theirs)}"
    return len(ours), ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", help="the python of a venv with vllm (see above)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="only this case (repeatable)")
    ap.add_argument("--emit-vllm", metavar="CASE", help=argparse.SUPPRESS)  # the vLLM side, as JSON
    args = ap.parse_args(argv)
    if args.emit_vllm:
        print(json.dumps(run_vllm(args.emit_vllm)))
        return 0
    if not args.vllm_python:
        ap.error("--vllm-python is required (the vLLM venv's python)")
    rows = []
    for case in args.case or list(CASES):
        proc = subprocess.run([args.vllm_python, __file__, "--emit-vllm", case], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{case}: vLLM side failed: {proc.stderr.strip().splitlines()[-1:]}")
            rows.append((case, None, None, "vLLM side failed"))
            continue
        theirs = json.loads(proc.stdout.strip().splitlines()[-1])
        ours = run_kvplan(case)
        agree, where = diff(ours, theirs)
        rows.append((case, agree, len(theirs), where))
    print(f"\n{'case':12s} {'steps agree':>12s} {'vLLM steps':>11s}")
    for case, agree, total, _ in rows:
        print(f"{case:12s} {('—' if agree is None else agree):>12} {('—' if total is None else total):>11}")
    for case, _, _, where in rows:
        if where:
            print(f"\n{case}: first difference\n  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
