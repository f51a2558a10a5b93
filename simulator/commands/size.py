"""``kvplan size``: KV bytes per token, the KV cache of a batch, and (with --gpu) the capacity.

Examples::

    kvplan size --model llama-2-13b --seq-len 2048
    kvplan size --layers 32 --kv-heads 8 --head-dim 128 --seq-len 6000
    kvplan size --model meta-llama/Llama-3.1-8B --gpu h100 --json
    kvplan size --model llama-3.1-70b --gpu a100 --tp 2 --quantization awq
    kvplan size --model deepseek-v3 --gpu h200 --dp 8 --enable-expert-parallel --max-model-len 8192
    kvplan size --model deepseek-r1 --gpu h200 --dp 8 --moe-tp 8 --max-model-len 8192
"""

from __future__ import annotations

import argparse
import json
from typing import Any

DEFAULT_ROPE_DIM = 64  # simulator.api.sizing.DEFAULT_ROPE_DIM (this module stays light: the parser imports it)


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
                     help=f"MLA decoupled rope key width (default {DEFAULT_ROPE_DIM})")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="fp32, fp16, bf16, fp8 (fp8_e4m3, fp8_e5m2), int8, or auto = the model's"
                        " torch_dtype (fp16 with explicit dimensions)")
    p.add_argument("--quantization", default="auto",
                   help="vLLM's --quantization for --gpu: auto (the checkpoint's"
                        " quantization_config), none, fp8, int8 (W8A8), awq, gptq, mxfp4, nvfp4,"
                        " compressed-tensors")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--dp", type=int, default=1,
                   help="data-parallel ranks, each with its own requests and KV (default 1)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="MoE layers expert parallel over dp × tp ranks (vLLM's flag)")
    p.add_argument("--moe-tp", type=int, default=None,
                   help="ranks each routed expert is TP-sharded over (TensorRT-LLM's"
                        " moe_tensor_parallel_size); --moe-tp × --moe-ep = dp × tp")
    p.add_argument("--moe-ep", type=int, default=None,
                   help="expert-parallel groups the routed experts are spread over (SGLang's"
                        " --ep-size, TensorRT-LLM's moe_expert_parallel_size); default: from"
                        " --moe-tp, else vLLM's (all EP with --enable-expert-parallel, else all TP)")
    p.add_argument("--moe-dispatch", choices=("all-to-all", "all-gather"), default=None,
                   help="how the MoE gets the other DP ranks' tokens (sizes the activations:"
                        " all-gather runs every DP rank's tokens); default: all-to-all for whole"
                        " experts, else all-gather")
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
    """Run ``kvplan size``: :func:`simulator.api.sizing` with the flags, its table (or JSON) printed."""
    from simulator.api.sizing import SizeQuery, size

    query = {name: getattr(args, name) for name in SizeQuery.__dataclass_fields__ if name != "model"}
    result = size(args.model, **query)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.table())
    return 0
