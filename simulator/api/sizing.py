"""``size`` from Python: KV bytes per token, the KV cache of a batch, and (with a GPU) the KV
capacity the way vLLM's start-up log reports it. ``kvplan size`` prints :meth:`SizeResult.table`
(or, with ``--json``, :meth:`SizeResult.as_dict`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
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

DEFAULT_ROPE_DIM = 64  # DeepSeek-V2/V3's qk_rope_head_dim, the usual MLA companion width


@dataclass(frozen=True)
class SizeQuery:
    """What is sized: the arguments of :func:`size`, as ``kvplan size`` takes them."""

    model: str | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    kv_cache_dtype: str = "auto"
    quantization: str = "auto"
    seq_len: int = 2048
    batch: int = 1
    tp: int = 1
    dp: int = 1
    enable_expert_parallel: bool = False
    moe_tp: int | None = None
    moe_ep: int | None = None
    moe_dispatch: str | None = None
    gpu: str | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256


@dataclass(frozen=True)
class SizeResult:
    """The sizing of one query: the KV layout, the model (None for explicit dimensions), the
    capacity on the GPU (None without one) and every figure ``kvplan size --json`` prints."""

    query: SizeQuery
    model: ModelConfig | None
    layout: KVLayout
    capacity: KVCapacity | None
    figures: dict[str, Any]

    @property
    def bytes_per_token(self) -> int:
        """β: KV bytes per token per rank."""
        return self.layout.bytes_per_token

    @property
    def total_bytes(self) -> int:
        """KV bytes of ``batch`` sequences of ``seq_len`` tokens per rank."""
        return int(self.figures["total_bytes"])

    @property
    def capacity_tokens(self) -> int | None:
        """Tokens the KV pool holds per rank (None without a GPU)."""
        return None if self.capacity is None else self.capacity.capacity_tokens

    def as_dict(self) -> dict[str, Any]:
        """The JSON ``kvplan size --json`` prints."""
        return dict(self.figures)

    def table(self) -> str:
        """The text ``kvplan size`` prints."""
        return _table(self.query, self.figures, self.capacity)


def size(model: str | None = None, **query: Any) -> SizeResult:
    """Size a model (catalog name, Hugging Face id or config.json path) or explicit dimensions
    (``layers``, ``kv_heads``, ``head_dim``; ``kv_lora_rank`` for MLA). With ``gpu``, the KV
    capacity as vLLM computes it. The keywords are :class:`SizeQuery`'s fields, ``kvplan size``'s
    flags with underscores. Bad input raises :class:`~simulator.errors.KvplanError`."""
    known = set(SizeQuery.__dataclass_fields__)
    unknown = sorted(set(query) - known)
    if unknown:
        from simulator.errors import did_you_mean

        raise KvplanError(f"size: unknown argument '{unknown[0]}'{did_you_mean(unknown[0], known)}")
    q = SizeQuery(model=model, **query)
    for name in ("seq_len", "batch", "tp", "dp", "block_size"):
        _positive(name, getattr(q, name))
    model_config, layout = _resolve(q)
    per_seq = (sequence_kv_bytes(model_config, layout, q.seq_len) if model_config is not None
               else layout.bytes_per_token * q.seq_len)
    total_bytes = per_seq * q.batch
    capacity = None
    if q.gpu is not None:
        if model_config is None:
            raise KvplanError("--gpu needs --model: the weights and activations that share the"
                              " GPU with the KV cache come from the model's config")
        try:
            capacity = kv_capacity(
                model_config, get_gpu(q.gpu), tp=q.tp, kv_cache_dtype=q.kv_cache_dtype,
                block_size=q.block_size, gpu_memory_utilization=q.gpu_memory_utilization,
                max_num_batched_tokens=q.max_num_batched_tokens, max_num_seqs=q.max_num_seqs,
                max_model_len=q.max_model_len, quantization=q.quantization, dp=q.dp,
                enable_expert_parallel=q.enable_expert_parallel, moe_tp=q.moe_tp, moe_ep=q.moe_ep,
                moe_dispatch=q.moe_dispatch)
        except KvplanError as err:
            if not _is_config_path(q.model):
                raise
            raise KvplanError(f"{q.model}: {err}") from None  # the model came from this file
    elif q.dp > 1 or q.enable_expert_parallel or q.moe_tp or q.moe_ep or q.moe_dispatch:
        raise KvplanError("--dp, --enable-expert-parallel, --moe-tp, --moe-ep and --moe-dispatch"
                          " size weights per rank: give --gpu")
    return SizeResult(q, model_config, layout, capacity, _result(q, model_config, layout, total_bytes, capacity))


def _is_config_path(model: str | None) -> bool:
    """Whether ``--model`` names a config.json file rather than a catalog model."""
    return model is not None and (model.endswith(".json") or "/" in model or Path(model).is_file())


def _resolve(q: SizeQuery) -> tuple[ModelConfig | None, KVLayout]:
    explicit = {"--layers": q.layers, "--kv-heads": q.kv_heads,
                "--head-dim": q.head_dim, "--kv-lora-rank": q.kv_lora_rank,
                "--qk-rope-head-dim": q.qk_rope_head_dim}
    given = [flag for flag, value in explicit.items() if value is not None]
    if q.model is not None:
        if given:
            raise KvplanError(f"give either --model or explicit dimensions, not both"
                              f" (got --model and {', '.join(given)})")
        model = load_model(q.model)
        return model, model_kv_layout(model, q.kv_cache_dtype, q.tp)
    if not given:
        raise KvplanError("give --model NAME|config.json, or --layers, --kv-heads and --head-dim")
    dtype = "fp16" if q.kv_cache_dtype.strip().lower() == "auto" else q.kv_cache_dtype
    if q.layers is None:
        raise KvplanError("explicit dimensions need --layers")
    for flag in ("layers", "kv_heads", "head_dim"):
        if getattr(q, flag) is not None:
            _positive(flag, getattr(q, flag))
    if q.kv_lora_rank is None and q.qk_rope_head_dim is not None:
        raise KvplanError("--qk-rope-head-dim needs --kv-lora-rank (it is an MLA width)")
    if q.kv_lora_rank is not None:
        _positive("kv_lora_rank", q.kv_lora_rank)
        rope = DEFAULT_ROPE_DIM if q.qk_rope_head_dim is None else q.qk_rope_head_dim
        if rope < 0:
            raise KvplanError(f"--qk-rope-head-dim must be >= 0, got {rope}")
        return None, kv_layout(q.layers, 1, 1, dtype=dtype, tp=q.tp,
                               latent_width=q.kv_lora_rank + rope)
    missing = [flag for flag in ("--kv-heads", "--head-dim") if explicit[flag] is None]
    if missing:
        raise KvplanError(f"explicit dimensions need {' and '.join(missing)}"
                          " (or --kv-lora-rank for MLA)")
    return None, kv_layout(q.layers, q.kv_heads, q.head_dim, dtype=dtype, tp=q.tp)


def _result(q: SizeQuery, model: ModelConfig | None, layout: KVLayout,
            total_bytes: int, cap: KVCapacity | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "model": model.name if model else "custom",
        "kv_cache_dtype": layout.dtype, "tp": layout.tp,
        "num_layers": layout.num_layers, "kv_width_per_layer": layout.kv_width,
        "bytes_per_token": layout.bytes_per_token,
        "seq_len": q.seq_len, "batch": q.batch, "total_bytes": total_bytes,
        "kv_replicated": layout.replicated, "notes": list(layout.notes),
    }
    if cap is not None:
        blocks_per_seq = math.ceil(q.seq_len / cap.block_size)
        if cap.kv_groups is not None:  # every group's blocks, window groups' at their fullest
            blocks_per_seq = sum(g.blocks_held(q.seq_len, cap.block_size) + (
                g.window is not None and q.seq_len > g.window) for g in cap.kv_groups.groups)
        result.update({
            "gpu": cap.gpu_name, "block_size": cap.block_size, "block_bytes": cap.block_bytes,
            "gpu_memory_utilization": q.gpu_memory_utilization,
            "budget_bytes": cap.budget_bytes, "weight_bytes": cap.weight_bytes,
            "activation_bytes": cap.activation_bytes, "non_torch_bytes": cap.non_torch_bytes,
            "available_kv_bytes": cap.available_kv_bytes, "num_blocks": cap.num_blocks,
            "capacity_tokens": cap.capacity_tokens, "max_model_len": cap.max_model_len,
            "max_concurrency": cap.max_concurrency,
            "max_seqs_at_seq_len": cap.num_blocks // blocks_per_seq,
            "data_parallel_size": cap.dp, "expert_parallel_size": cap.ep,
            "moe_tensor_parallel_size": cap.moe_tp, "moe_dispatch": cap.moe_dispatch,
            "expert_weight_bytes": cap.expert_weight_bytes,
            "experts_per_rank": cap.experts_per_rank,
            "total_max_concurrency": cap.total_concurrency,
            "total_max_seqs_at_seq_len": cap.num_blocks // blocks_per_seq * cap.dp,
            "weights": cap.weight_format.describe(),
            "notes": list(cap.notes),
        })
    return result


def _table(q: SizeQuery, result: dict[str, Any], cap: KVCapacity | None) -> str:
    beta = result["bytes_per_token"]
    rows = [
        ("model", result["model"]),
        ("KV cache dtype", result["kv_cache_dtype"]),
        ("tensor parallel", f"{result['tp']} rank(s); figures are per rank"),
        ("KV per token (β)", f"{beta:,} B = {beta / 1024:,.1f} KiB = {beta / MIB:.3f} MiB"),
        (f"KV for {q.batch:,} × {q.seq_len:,} tokens", f"{result['total_bytes'] / GIB:.3f} GiB"),
    ]
    if cap is not None:
        fit = f"{result['max_seqs_at_seq_len']:,} (blocks of {cap.block_size})"
        if cap.dp > 1:
            fit = (f"{result['max_seqs_at_seq_len']:,} per DP rank, "
                   f"{result['total_max_seqs_at_seq_len']:,} in all (blocks of {cap.block_size})")
        rows.append((f"sequences of {q.seq_len:,} that fit", fit))
        if cap.dp > 1 or cap.ep > 1 or cap.moe_tp not in (1, cap.tp):
            experts = (f"EP {cap.ep}, {cap.experts_per_rank} routed experts per layer on the"
                       " fullest rank" if cap.ep > 1 else "every one on every rank")
            if cap.moe_tp > 1:
                experts += f", each TP-sharded over {cap.moe_tp} ranks"
            if cap.moe_dispatch != "none":
                experts += f"; tokens of other DP ranks by {cap.moe_dispatch}"
            rows.append(("parallelism", f"{cap.dp} DP rank(s) × TP {cap.tp}; experts: {experts}"))
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
        lines += ["", f"on {cap.gpu_name} at gpu_memory_utilization {q.gpu_memory_utilization:.2f}:",
                  format_vllm_log(cap)]
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def _positive(flag: str, value: int) -> None:
    if value is None or value <= 0:
        raise KvplanError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")


__all__ = ["SizeQuery", "SizeResult", "size"]
