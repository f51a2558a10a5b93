"""The Triton KV kernels against the torch reference, on a device: the correctness half of a GPU check.

    python benchmarks/kernel_check.py [--device cuda] [--out kernels.json]

The unit tests in tests/backend/kernels/ run the kernels in Triton's CPU interpreter; this runs
them compiled, on CUDA, at a real model's head sizes (GQA 32/8, head_dim 128, block 16):

* store: new K/V tokens written by the Triton store into fp16, bf16 and fp8 (e4m3, with scales)
  pools at scattered slots, compared with ``store_kv_ref``: fp16/bf16 bit for bit; fp8 within
  one rounding step (the GPU rounds fp32 -> fp8 to nearest even; how torch rounds is its own
  affair, so a tie may land on the other neighbour);
* decode: paged decode attention over those pools (lengths at and around block boundaries, one
  long context, scattered blocks, a NaN-filled pool so a stray read shows), with the default,
  one and four splits, against the reference in fp64 on the same stored values.

With ``--device cpu`` the same cases run small, in Triton's interpreter (TRITON_INTERPRET=1 is set
before the kernels load): that is how the script itself is tested without a GPU. Writes one JSON
(every case with its error and tolerance) and exits 1 if any case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

# relative error bounds of the decode output against fp64, by query dtype (its rounding)
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}


def _sizes(device: str) -> dict[str, Any]:
    if device == "cpu":  # the interpreter runs every program instance in Python: keep it tiny
        return {"lens": [1, 16, 17, 70], "num_kv_heads": 2, "group": 2, "head_dim": 32, "block_size": 16}
    return {"lens": [1, 15, 16, 17, 300, 4100], "num_kv_heads": 8, "group": 4, "head_dim": 128,
            "block_size": 16}


def run_checks(device_name: str) -> dict[str, Any]:
    """Every case on ``device_name``; returns the JSON-ready result."""
    import torch

    from backend.kernels import decode_attention, write_kv
    from backend.kernels.reference import paged_decode_attention_ref, store_kv_ref

    device = torch.device(device_name)
    size = _sizes(device.type)
    lens, block = size["lens"], size["block_size"]
    heads, dim = size["num_kv_heads"], size["head_dim"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    blocks_per_seq = [-(-n // block) for n in lens]
    num_blocks = sum(blocks_per_seq) + 5
    physical = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lens), max(blocks_per_seq) + 1), 0, dtype=torch.int32)
    slots: list[int] = []
    first = 0
    for row, (n, nb) in enumerate(zip(lens, blocks_per_seq)):
        ids = physical[first:first + nb]
        first += nb
        table[row, :nb] = ids.to(torch.int32)
        slots += [int(ids[t // block]) * block + t % block for t in range(n)]
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    table, context_lens = table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)
    key = torch.randn(len(slots), heads, dim, generator=gen).to(device)
    value = torch.randn(len(slots), heads, dim, generator=gen).to(device)

    cases: list[dict[str, Any]] = []
    kinds = (("float16", "float16", (1.0, 1.0)), ("bfloat16", "bfloat16", (1.0, 1.0)),
             ("float8_e4m3fn", "float16", (0.5, 2.0)))  # (KV pool, query and new tokens, fp8 scales)
    for kv_name, query_name, scales in kinds:
        kv_dtype, q_dtype = getattr(torch, kv_name), getattr(torch, query_name)
        k_scale, v_scale = scales
        new_k, new_v = key.to(q_dtype), value.to(q_dtype)
        if device.type == "cpu" and kv_name.startswith("float8"):
            # Triton's interpreter does not round fp32 -> fp8 as the GPU does (it can land several
            # codes away), so on CPU only values already on the fp8 grid are stored; on CUDA the
            # random values test the rounding itself
            new_k = (new_k / k_scale).to(kv_dtype).to(q_dtype) * k_scale
            new_v = (new_v / v_scale).to(kv_dtype).to(q_dtype) * v_scale
        pools = []
        for store in (write_kv, store_kv_ref):
            k = torch.full((num_blocks, block, heads, dim), float("nan"), device=device).to(kv_dtype)
            v = torch.full_like(k, float("nan"))
            if store is write_kv:
                store(new_k, new_v, k, v, slot_mapping, k_scale=k_scale, v_scale=v_scale, backend="triton")
            else:
                store(new_k, new_v, k, v, slot_mapping, k_scale=k_scale, v_scale=v_scale)
            pools.append((k, v))
        cases.append(_store_case(kv_name, pools, slot_mapping, block))
        # decode reads the reference-stored pool, so each case tests one kernel
        k_pool, v_pool = pools[1]
        fp8 = kv_name.startswith("float8")
        k_ref, v_ref = (k_pool, v_pool) if fp8 else (k_pool.double(), v_pool.double())
        query = torch.randn(len(lens), heads * size["group"], dim, generator=gen).to(device, q_dtype)
        expected = paged_decode_attention_ref(query.double(), k_ref, v_ref, table, context_lens,
                                              k_scale=k_scale, v_scale=v_scale)
        for splits in (None, 1, 4):
            out = decode_attention(query, k_pool, v_pool, table, context_lens, num_splits=splits,
                                   k_scale=k_scale, v_scale=v_scale, backend="triton")
            err = float((out.double() - expected).norm() / expected.norm())
            cases.append({"op": "decode", "kv_dtype": kv_name, "query_dtype": query_name,
                          "num_splits": splits, "rel_err": err, "tolerance": TOLERANCE[query_name],
                          "ok": bool(err <= TOLERANCE[query_name])})
    return {"device": str(device), "sizes": size, "cases": cases, "ok": all(c["ok"] for c in cases)}


def _store_case(kv_name: str, pools: list, slot_mapping: Any, block: int) -> dict[str, Any]:
    import torch

    (k_kernel, v_kernel), (k_ref, v_ref) = pools
    written = slot_mapping.cpu()

    def written_bits(pool: Any) -> Any:
        bits = pool.cpu().flatten(0, 1)[written].flatten()
        return bits.view(torch.uint8 if bits.element_size() == 1 else torch.int16).to(torch.int64)

    got = torch.cat([written_bits(p) for p in (k_kernel, v_kernel)])
    want = torch.cat([written_bits(p) for p in (k_ref, v_ref)])
    equal = float((got == want).double().mean())
    unwritten_untouched = all(
        bool(torch.isnan(p.cpu().flatten(0, 1).float()[_unwritten(p.shape[0] * block, written)]).all())
        for p in (k_kernel, v_kernel))
    max_ulps: int | None = None
    if kv_name.startswith("float8"):
        # fp8 codes are sign-magnitude: as signed integers, neighbours on the fp8 grid differ by 1
        def signed(code: Any) -> Any:
            return torch.where(code >= 128, 128 - code, code)

        max_ulps = int((signed(got) - signed(want)).abs().max())
        ok = max_ulps <= 1 and unwritten_untouched
    else:  # fp16/bf16: the same value written, bit for bit
        ok = equal == 1.0 and unwritten_untouched
    return {"op": "store", "kv_dtype": kv_name, "equal_fraction": equal, "max_ulps": max_ulps,
            "unwritten_slots_untouched": unwritten_untouched, "ok": bool(ok)}


def _unwritten(num_slots: int, written: Any) -> Any:
    import torch

    mask = torch.ones(num_slots, dtype=torch.bool)
    mask[written] = False
    return mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (compiled kernels) or cpu (Triton's interpreter, small shapes)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("kernel_check: no CUDA device (use --device cpu for the interpreter)", file=sys.stderr)
        return 2
    result = run_checks(args.device)
    for c in result["cases"]:
        if c["op"] == "decode":
            detail = f"rel err {c['rel_err']:.1e} (bound {c['tolerance']:.0e}), splits {c['num_splits']}"
        else:
            ulps = "" if c["max_ulps"] is None else f", at most {c['max_ulps']} fp8 step(s) apart"
            detail = f"{c['equal_fraction']:.2%} bit-equal{ulps}"
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['op']:<6} KV {c['kv_dtype']:<14} {detail}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
