"""``kvplan size``: KV bytes per token, the KV cache of a batch, and (with --gpu) the capacity.

Examples::

    kvplan size --model llama-2-13b --seq-len 2048
    kvplan size --layers 32 --kv-heads 8 --head-dim 128 --seq-len 6000
    kvplan size --model meta-llama/Llama-3.1-8B --gpu h100 --json
    kvplan size --model llama-3.1-70b --gpu a100 --tp 2 --quantization awq
    kvplan size --model deepseek-v3 --gpu h200 --dp 8 --enable-expert-parallel --max-model-len 8192
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import ModelConfig, load_model
from simulator.kv.sizing import (
    GIB,
    MIB,
    KVCapacity,
    KVLayout,
    format_vllm_log,
    kv_capacity,
    kv_layout,
    model_kv_layout,
    sequence_kv_bytes,
)

_DEFAULT_ROPE_DIM = 64  # DeepSeek-V2/V3's qk_rope_head_dim, the usual MLA companion width


def add_parser(subparsers: Any) -> None:
    """Add the ``size`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "size", help="KV-cache bytes per token, batch size in GiB, and GPU KV capacity",
        description="Size the KV cache of a model (catalog name, HF id or config.json), or of"
                    " explicit dimensions; with --gpu, compute the KV capacity as vLLM does.")
    src = p.add_argument_group("model (either --model, or explicit dimensions)")
    src.add_argument("--model", help="catalog name, Hugging Face id, or path to a config.json")
    src.add_argument("--layers", type=int, help="number of layers L")
    src.add_argument("--kv-heads", type=int, help="number of KV heads H_kv")
    src.add_argument("--head-dim", type=int, help="head dimension d_h")
    src.add_argument("--kv-lora-rank", type=int,
                     help="MLA latent rank (replaces 2·H_kv·d_h with rank + rope dim)")
    src.add_argument("--qk-rope-head-dim", type=int,
                     help=f"MLA decoupled rope key width (default {_DEFAULT_ROPE_DIM})")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="fp32, fp16, bf16, fp8 (fp8_e4m3, fp8_e5m2), int8, or auto = the model's"
                        " torch_dtype (fp16 with explicit dimensions)")
    p.add_argument("--quantization", default="auto",
                   help="vLLM's --quantization for --gpu: auto (the checkpoint's"
                        " quantization_config), none, fp8, int8 (W8A8), awq, gptq, mxfp4,"
                        " compressed-tensors")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--dp", type=int, default=1,
                   help="data-parallel ranks, each with its own requests and KV (default 1)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="MoE layers expert parallel over dp × tp ranks (vLLM's flag)")
    p.add_argument("--gpu", help="GPU name (h100, a100-80gb, l4, mi300x...) for the capacity")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of HBM vLLM may use (default 0.9)")
    p.add_argument("--max-model-len", type=int,
                   help="longest request in tokens (default: the model's max_position_embeddings)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="tokens per forward pass, sizes the activations (default 8192)")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="sequences per step, sizes the sampler's logits (default 256)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``kvplan size``; print a table (or JSON) and return 0. Bad input -> KvplanError."""
    for flag in ("seq_len", "batch", "tp", "dp", "block_size"):
        _positive(flag, getattr(args, flag))
    model, layout = _resolve(args)
    per_seq = (sequence_kv_bytes(model, layout, args.seq_len) if model is not None
               else layout.bytes_per_token * args.seq_len)
    total_bytes = per_seq * args.batch
    capacity = None
    if args.gpu is not None:
        if model is None:
            raise KvplanError("--gpu needs --model: the weights and activations that share the"
                              " GPU with the KV cache come from the model's config")
        try:
            capacity = kv_capacity(
                model, get_gpu(args.gpu), tp=args.tp, kv_cache_dtype=args.kv_cache_dtype,
                block_size=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization,
                max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len, quantization=args.quantization, dp=args.dp,
                enable_expert_parallel=args.enable_expert_parallel)
        except KvplanError as err:
            if not _is_config_path(args.model):
                raise
            raise KvplanError(f"{args.model}: {err}") from None  # the model came from this file
    elif args.dp > 1 or args.enable_expert_parallel:
        raise KvplanError("--dp and --enable-expert-parallel size weights per rank: give --gpu")
    result = _result(args, model, layout, total_bytes, capacity)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(args, result, capacity))
    return 0


def _is_config_path(model: str | None) -> bool:
    """Whether ``--model`` names a config.json file rather than a catalog model."""
    return model is not None and (model.endswith(".json") or "/" in model or Path(model).is_file())


def _resolve(args: argparse.Namespace) -> tuple[ModelConfig | None, KVLayout]:
    explicit = {"--layers": args.layers, "--kv-heads": args.kv_heads,
                "--head-dim": args.head_dim, "--kv-lora-rank": args.kv_lora_rank,
                "--qk-rope-head-dim": args.qk_rope_head_dim}
    given = [flag for flag, value in explicit.items() if value is not None]
    if args.model is not None:
        if given:
            raise KvplanError(f"give either --model or explicit dimensions, not both"
                              f" (got --model and {', '.join(given)})")
        model = load_model(args.model)
        return model, model_kv_layout(model, args.kv_cache_dtype, args.tp)
    if not given:
        raise KvplanError("give --model NAME|config.json, or --layers, --kv-heads and --head-dim")
    dtype = "fp16" if args.kv_cache_dtype.strip().lower() == "auto" else args.kv_cache_dtype
    if args.layers is None:
        raise KvplanError("explicit dimensions need --layers")
    for flag in ("layers", "kv_heads", "head_dim"):
        if getattr(args, flag) is not None:
            _positive(flag, getattr(args, flag))
    if args.kv_lora_rank is None and args.qk_rope_head_dim is not None:
        raise KvplanError("--qk-rope-head-dim needs --kv-lora-rank (it is an MLA width)")
    if args.kv_lora_rank is not None:
        _positive("kv_lora_rank", args.kv_lora_rank)
        rope = _DEFAULT_ROPE_DIM if args.qk_rope_head_dim is None else args.qk_rope_head_dim
        if rope < 0:
            raise KvplanError(f"--qk-rope-head-dim must be >= 0, got {rope}")
        return None, kv_layout(args.layers, 1, 1, dtype=dtype, tp=args.tp,
                               latent_width=args.kv_lora_rank + rope)
    missing = [flag for flag in ("--kv-heads", "--head-dim") if explicit[flag] is None]
    if missing:
        raise KvplanError(f"explicit dimensions need {' and '.join(missing)}"
                          " (or --kv-lora-rank for MLA)")
    return None, kv_layout(args.layers, args.kv_heads, args.head_dim, dtype=dtype, tp=args.tp)


def _result(args: argparse.Namespace, model: ModelConfig | None, layout: KVLayout,
            total_bytes: int, cap: KVCapacity | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "model": model.name if model else "custom",
        "kv_cache_dtype": layout.dtype, "tp": layout.tp,
        "num_layers": layout.num_layers, "kv_width_per_layer": layout.kv_width,
        "bytes_per_token": layout.bytes_per_token,
        "seq_len": args.seq_len, "batch": args.batch, "total_bytes": total_bytes,
        "kv_replicated": layout.replicated, "notes": list(layout.notes),
    }
    if cap is not None:
        blocks_per_seq = math.ceil(args.seq_len / cap.block_size)
        if cap.kv_groups is not None:  # every group's blocks, window groups' at their fullest
            blocks_per_seq = sum(g.blocks_held(args.seq_len, cap.block_size) + (
                g.window is not None and args.seq_len > g.window) for g in cap.kv_groups.groups)
        result.update({
            "gpu": cap.gpu_name, "block_size": cap.block_size, "block_bytes": cap.block_bytes,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "budget_bytes": cap.budget_bytes, "weight_bytes": cap.weight_bytes,
            "activation_bytes": cap.activation_bytes, "non_torch_bytes": cap.non_torch_bytes,
            "available_kv_bytes": cap.available_kv_bytes, "num_blocks": cap.num_blocks,
            "capacity_tokens": cap.capacity_tokens, "max_model_len": cap.max_model_len,
            "max_concurrency": cap.max_concurrency,
            "max_seqs_at_seq_len": cap.num_blocks // blocks_per_seq,
            "data_parallel_size": cap.dp, "expert_parallel_size": cap.ep,
            "expert_weight_bytes": cap.expert_weight_bytes,
            "experts_per_rank": cap.experts_per_rank,
            "total_max_concurrency": cap.total_concurrency,
            "total_max_seqs_at_seq_len": cap.num_blocks // blocks_per_seq * cap.dp,
            "weights": cap.weight_format.describe(),
            "notes": list(cap.notes),
        })
    return result


def _table(args: argparse.Namespace, result: dict[str, Any], cap: KVCapacity | None) -> str:
    beta = result["bytes_per_token"]
    rows = [
        ("model", result["model"]),
        ("KV cache dtype", result["kv_cache_dtype"]),
        ("tensor parallel", f"{result['tp']} rank(s); figures are per rank"),
        ("KV per token (β)", f"{beta:,} B = {beta / 1024:,.1f} KiB = {beta / MIB:.3f} MiB"),
        (f"KV for {args.batch:,} × {args.seq_len:,} tokens", f"{result['total_bytes'] / GIB:.3f} GiB"),
    ]
    if cap is not None:
        fit = f"{result['max_seqs_at_seq_len']:,} (blocks of {cap.block_size})"
        if cap.dp > 1:
            fit = (f"{result['max_seqs_at_seq_len']:,} per DP rank, "
                   f"{result['total_max_seqs_at_seq_len']:,} in all (blocks of {cap.block_size})")
        rows.append((f"sequences of {args.seq_len:,} that fit", fit))
        if cap.dp > 1 or cap.ep > 1:
            rows.append(("parallelism", f"{cap.dp} DP rank(s) × TP {cap.tp}; experts: "
                         + (f"EP {cap.ep}, {cap.experts_per_rank} routed experts per layer on"
                            " the fullest rank" if cap.ep > 1 else "TP-sharded")))
            rows.append(("weights per rank", f"{cap.weight_bytes / GIB:.2f} GiB, of which routed"
                         f" experts {cap.expert_weight_bytes / GIB:.2f} GiB"))
            rows.append(("KV per rank", f"{cap.available_kv_bytes / GIB:.2f} GiB available,"
                         f" {cap.num_blocks * cap.block_bytes / GIB:.2f} GiB in"
                         f" {cap.num_blocks:,} blocks; each DP rank holds only its own requests"))
            rows.append(("max concurrency", f"{cap.max_concurrency:.2f}x per DP rank,"
                         f" {cap.total_concurrency:.2f}x in all, at {cap.max_model_len:,} tokens"))
        fmt = cap.weight_format
        rows.append(("weights", f"{fmt.weight_dtype} (quantization {fmt.quantization},"
                                f" {fmt.origin}), GEMMs in {fmt.gemm_dtype}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    if cap is not None:
        lines += ["", f"on {cap.gpu_name} at gpu_memory_utilization {args.gpu_memory_utilization:.2f}:",
                  format_vllm_log(cap)]
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def _positive(flag: str, value: int) -> None:
    if value is None or value <= 0:
        raise KvplanError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
