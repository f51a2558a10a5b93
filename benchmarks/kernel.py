"""Paged decode attention kernel: achieved KV bandwidth on a GPU.

    python benchmarks/kernel.py [--dtype bf16] [--quick] [--out kernel.csv]

For each batch x context it times the Triton kernel (CUDA events, warm-up, L2 flushed before
every repeat, median) over one layer's pool with scattered blocks (a random permutation) and
with physically contiguous blocks (identity block table), and reports the bandwidth achieved
on the K/V bytes actually read, against a measured device-to-device copy bandwidth (counting
its read and write traffic). On a machine without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from backend.kernels.reference import paged_decode_attention_ref  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
BATCHES = (1, 8, 32, 128, 256)
CONTEXTS = (512, 2048, 8192, 32768)
QUICK_BATCHES = (1, 32, 256)
QUICK_CONTEXTS = (512, 8192)
L2_FLUSH_BYTES = 256 * 2**20  # well above the L2 of current GPUs (H100/H200: 50 MiB)
MEMORY_HEADROOM = 0.8  # use at most this share of free device memory for one pool


@dataclass(frozen=True, slots=True)
class Row:
    batch: int
    context_tokens: int
    num_splits: int
    kv_read_bytes: int
    paged_us: float
    contiguous_us: float
    paged_gbps: float
    contiguous_gbps: float
    paged_over_copy: float
    paged_over_contiguous_time: float
    max_rel_err: float


def time_us(fn: Callable[[], object], *, warmup: int, repeats: int, flush: torch.Tensor) -> float:
    """Median microseconds of ``fn`` on the current stream, with L2 flushed before each repeat."""
    for _ in range(warmup):
        fn()
    times_ms = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    return statistics.median(times_ms) * 1e3


def copy_bandwidth_gbps(device: torch.device, *, num_bytes: int, repeats: int, flush: torch.Tensor) -> float:
    """Device-to-device copy of a large buffer: (read + written bytes) / time."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    elapsed_us = time_us(lambda: dst.copy_(src), warmup=3, repeats=repeats, flush=flush)
    return 2 * num_bytes / elapsed_us / 1e3


def _rel_err_vs_reference(out: torch.Tensor, query: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, block_tables: torch.Tensor, lens: torch.Tensor,
                          num_seqs: int = 2) -> float:
    """Relative error of the first ``num_seqs`` outputs against the torch reference in fp32,
    run on a compact copy of just their blocks (an fp32 copy of the whole pool may not fit)."""
    tables = block_tables[:num_seqs]
    blocks = tables.flatten().long()
    compact = torch.arange(blocks.numel(), device=blocks.device, dtype=torch.int32).view(tables.shape)
    expected = paged_decode_attention_ref(query[:num_seqs].float(), k_cache[blocks].float(),
                                          v_cache[blocks].float(), compact, lens[:num_seqs])
    return float((out[:num_seqs].float() - expected).norm() / expected.norm())


def measure(batch: int, context_tokens: int, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
            block_size: int, dtype: torch.dtype, device: torch.device, repeats: int, flush: torch.Tensor,
            copy_gbps: float) -> Row:
    """Time one batch x context point on scattered and contiguous blocks of the same pool."""
    # Imported here, not at the top: on a machine without a GPU (or Triton) the script only says so.
    from backend.kernels.paged_attention import choose_num_splits, paged_decode_attention

    blocks_per_seq = -(-context_tokens // block_size)
    num_blocks = batch * blocks_per_seq
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    query = torch.randn((batch, num_q_heads, head_dim), generator=gen, device=device, dtype=dtype)
    lens = torch.full((batch,), context_tokens, dtype=torch.int32, device=device)
    contiguous = torch.arange(num_blocks, device=device, dtype=torch.int32).view(batch, blocks_per_seq)
    scattered = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    scattered = scattered.view(batch, blocks_per_seq)
    out = torch.empty_like(query)

    def run(table: torch.Tensor) -> Callable[[], object]:
        return lambda: paged_decode_attention(query, k_cache, v_cache, table, lens, out=out,
                                              max_context_len=context_tokens)

    paged_us = time_us(run(scattered), warmup=5, repeats=repeats, flush=flush)
    contiguous_us = time_us(run(contiguous), warmup=5, repeats=repeats, flush=flush)
    run(scattered)()
    rel_err = _rel_err_vs_reference(out, query, k_cache, v_cache, scattered, lens)
    kv_bytes = 2 * batch * context_tokens * num_kv_heads * head_dim * k_cache.element_size()
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    paged_gbps = kv_bytes / paged_us / 1e3
    return Row(batch=batch, context_tokens=context_tokens,
               num_splits=choose_num_splits(batch, num_kv_heads, context_tokens, num_sms),
               kv_read_bytes=kv_bytes, paged_us=paged_us, contiguous_us=contiguous_us, paged_gbps=paged_gbps,
               contiguous_gbps=kv_bytes / contiguous_us / 1e3, paged_over_copy=paged_gbps / copy_gbps,
               paged_over_contiguous_time=paged_us / contiguous_us, max_rel_err=rel_err)


def print_table(rows: list[Row], copy_gbps: float, title: str) -> None:
    print(title)
    print(f"device-to-device copy: {copy_gbps:,.0f} GB/s (read + write)")
    header = (f"{'batch':>5} {'context':>7} {'splits':>6} {'KV MiB':>9} {'paged us':>9} {'contig us':>9} "
              f"{'paged GB/s':>10} {'contig GB/s':>11} {'vs copy':>7} {'paged/contig':>12} {'rel err':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.batch:>5} {r.context_tokens:>7} {r.num_splits:>6} {r.kv_read_bytes / 2**20:>9.1f} "
              f"{r.paged_us:>9.1f} {r.contiguous_us:>9.1f} {r.paged_gbps:>10.0f} {r.contiguous_gbps:>11.0f} "
              f"{r.paged_over_copy:>7.2f} {r.paged_over_contiguous_time:>12.3f} {r.max_rel_err:>8.1e}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="KV pool and query dtype")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument("--out", type=Path, help="also write the table as CSV here")
    parser.add_argument("--num-q-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: kernel benchmark needs one")
        return 0
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    repeats = 10 if args.quick else 30
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    copy_gbps = copy_bandwidth_gbps(device, num_bytes=2**30, repeats=repeats, flush=flush)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    rows: list[Row] = []
    batches, contexts = (QUICK_BATCHES, QUICK_CONTEXTS) if args.quick else (BATCHES, CONTEXTS)
    for batch in batches:
        for context_tokens in contexts:
            pool_bytes = 2 * batch * context_tokens * args.num_kv_heads * args.head_dim * element_bytes
            free_bytes, _ = torch.cuda.mem_get_info(device)
            if pool_bytes > MEMORY_HEADROOM * free_bytes:
                print(f"skip batch {batch} x context {context_tokens}: "
                      f"pool needs {pool_bytes / 2**30:.1f} GiB")
                continue
            rows.append(measure(batch, context_tokens, num_q_heads=args.num_q_heads,
                                num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
                                block_size=args.block_size, dtype=dtype, device=device, repeats=repeats,
                                flush=flush, copy_gbps=copy_gbps))
            torch.cuda.empty_cache()
    title = (f"paged decode attention, {torch.cuda.get_device_name(device)}, {args.dtype}, "
             f"H_q={args.num_q_heads} H_kv={args.num_kv_heads} d_h={args.head_dim} "
             f"block_size={args.block_size}")
    print_table(rows, copy_gbps, title)
    if args.out is not None:
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[f.name for f in fields(Row)])
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
