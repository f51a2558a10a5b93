"""A Llama-shaped decoder with random weights at a catalog model's real shapes, over the paged KV pool.

Timing does not depend on weight values, so nothing is downloaded: weights are seeded random
normals. One forward pass runs one engine step over a flat batch of tokens::

    rows   | chunk A (n_A tokens) | chunk B (n_B) | decode 0 | decode 1 | ... |
           '---- prefill rows (num_prefill_tokens) ----'---- one row per decode --'

    embeddings -> per layer: RMSNorm, qkv, RoPE at each row's position,
                  write ALL rows' K/V into the pool (slot_mapping), then attention:
                    prefill chunks: causal against the chunk's cached context (its block table)
                    decode rows:    paged decode attention (block_tables, context_lens)
                  o proj + residual, RMSNorm, SwiGLU MLP + residual
               -> final RMSNorm and lm_head only for the rows that sample -> greedy argmax

Writing every row's K/V before any attention matters: two prompts of one step may share a
prefix-cache block that the first writes in this very step.

Shapes are those of ONE tensor-parallel rank (``tp``): query heads / TP, KV heads / TP (at least
one: vLLM replicates KV heads when TP exceeds them), intermediate / TP, vocab / TP. The
all-reduces between ranks are not run. ``num_layers`` runs only the first k of the L layers
(every layer has the same shapes, so per-layer time is the same; calibrate scales by L / k).

Models whose layers are not Llama-shaped are refused (MLA, MoE). OPT runs approximately: its
2-matrix GELU MLP is kept, but it gets RMSNorm instead of LayerNorm, RoPE instead of learned
positions and no biases — element-wise work that is a small part of a layer's time; Qwen2's
q/k/v biases are left out for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.kernels import decode_attention, prefill_attention, write_kv
from simulator.errors import KvplanError
from simulator.kv.models import ModelConfig
from simulator.kv.sizing import model_kv_layout

ROPE_THETA = 10_000.0  # the value does not change the cost; Llama-2's
NORM_EPS = 1e-5
INIT_STD = 0.02

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}
COMPUTE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})


@dataclass(frozen=True, slots=True)
class RankShape:
    """The tensor shapes one tensor-parallel rank runs."""

    num_layers: int  # layers actually run (k)
    num_total_layers: int  # the model's L
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool  # SwiGLU (gate, up, down); False = OPT's fc1/fc2
    tie_word_embeddings: bool

    @property
    def qkv_width(self) -> int:
        return (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim


def rank_shape(model: ModelConfig, *, tp: int = 1, num_layers: int | None = None) -> RankShape:
    """The shapes of one TP rank of ``model`` running ``num_layers`` (default: all) layers.

    Raises KvplanError for a model that is not Llama-shaped (MLA, MoE), a TP degree that does
    not divide the heads, or a layer count outside ``1..L``.
    """
    if model.is_mla:
        raise KvplanError(f"the real backend runs Llama-shaped (GQA) models; {model.name} uses MLA")
    if model.is_moe:
        raise KvplanError(f"the real backend runs dense Llama-shaped models; {model.name} is "
                          "mixture-of-experts")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise KvplanError(f"--tp must be a positive integer, got {tp!r}")
    layout = model_kv_layout(model, "auto", tp)  # checks that TP divides the heads
    total = model.num_hidden_layers
    k = total if num_layers is None else num_layers
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= total:
        raise KvplanError(f"--layers must be in 1..{total} for {model.name}, got {num_layers!r}")
    return RankShape(
        num_layers=k, num_total_layers=total, hidden_size=model.hidden_size,
        num_q_heads=model.num_attention_heads // tp, num_kv_heads=layout.num_kv_heads_per_rank,
        head_dim=model.head_dim, intermediate_size=-(-model.intermediate_size // tp),
        vocab_size=-(-model.vocab_size // tp), gated_mlp=model.model_type != "opt",
        tie_word_embeddings=model.tie_word_embeddings,
    )


def torch_dtype(name: str, what: str = "--dtype") -> torch.dtype:
    """The torch dtype called ``name`` (fp32/fp16/bf16 and their long names, fp8 variants)."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in TORCH_DTYPES:
        raise KvplanError(f"unknown {what} '{name}' (known: {', '.join(TORCH_DTYPES)})")
    return TORCH_DTYPES[key]


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    """One prefill chunk of a step: rows ``start_row .. start_row + num_tokens - 1`` of the batch
    hold positions ``position ..``; after the write its sequence has ``context_len`` KV tokens,
    reached through ``block_table`` (1-D, on the model's device)."""

    start_row: int
    num_tokens: int
    position: int
    context_len: int
    block_table: torch.Tensor


@dataclass(frozen=True, slots=True)
class StepBatch:
    """The tensors of one step (all on the model's device; see the module docstring for rows).

    ``sample_rows`` selects the rows whose logits are computed (None = every row).
    ``decode_max_context`` bounds ``decode_context_lens`` (None = the table width), which steers
    the decode kernel's split-K without a device sync.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, negative = padding (not written)
    prefills: tuple[PrefillSpan, ...]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor  # [B, max_blocks] int32
    decode_context_lens: torch.Tensor  # [B] int32
    sample_rows: torch.Tensor | None = None
    decode_max_context: int | None = None


@dataclass(slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [qkv_width, hidden]
    o_proj: torch.Tensor  # [hidden, H_q * d_h]
    post_norm: torch.Tensor
    up: torch.Tensor  # SwiGLU: [2 * inter, hidden] (gate; up); OPT: fc1 [inter, hidden]
    down: torch.Tensor  # [hidden, inter]


class PagedLlama:
    """A Llama-shaped decoder of one TP rank with its preallocated paged KV pool.

    ``kv_pool`` is ``[num_layers, 2, num_blocks, block_size, H_kv, d_h]``: ``kv_pool[l, 0]`` and
    ``kv_pool[l, 1]`` are layer l's K and V pools, each contiguous, so copying a block in every
    layer is one indexed copy.
    """

    def __init__(self, model: ModelConfig, *, num_blocks: int, block_size: int, max_model_len: int,
                 dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype | None = None,
                 device: str | torch.device = "cpu", tp: int = 1, num_layers: int | None = None,
                 seed: int = 0):
        if dtype not in COMPUTE_DTYPES:
            raise KvplanError(f"the model computes in fp32, fp16 or bf16, not {dtype}")
        kv_dtype = dtype if kv_dtype is None else kv_dtype
        if kv_dtype != dtype and kv_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise KvplanError(f"the KV cache must be stored in the model's dtype ({dtype}) or fp8, "
                              f"not {kv_dtype}")
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.config = model
        self.shape = rank_shape(model, tp=tp, num_layers=num_layers)
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        s = self.shape
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def weight(*size: int) -> torch.Tensor:
            w = torch.empty(size, dtype=dtype, device=self.device)
            return w.normal_(0.0, INIT_STD, generator=gen)

        def ones(size: int) -> torch.Tensor:
            return torch.ones(size, dtype=dtype, device=self.device)

        inter, hidden = s.intermediate_size, s.hidden_size
        up_rows = 2 * inter if s.gated_mlp else inter
        self.embed_tokens = weight(s.vocab_size, hidden)
        self.layers = [
            _Layer(ones(hidden), weight(s.qkv_width, hidden), weight(hidden, s.num_q_heads * s.head_dim),
                   ones(hidden), weight(up_rows, hidden), weight(hidden, inter))
            for _ in range(s.num_layers)
        ]
        self.final_norm = ones(hidden)
        self.lm_head = self.embed_tokens if s.tie_word_embeddings else weight(s.vocab_size, hidden)
        cos, sin = _rope_tables(max_model_len, s.head_dim, self.device)
        self.rope_cos, self.rope_sin = cos.to(dtype), sin.to(dtype)
        # zeros, not empty: padded decode rows read a scratch block, and NaN garbage must not appear
        self.kv_pool = torch.zeros((s.num_layers, 2, num_blocks, block_size, s.num_kv_heads, s.head_dim),
                                   dtype=kv_dtype, device=self.device)

    # ------------------------------------------------------------------ the step's phases
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[T, hidden]``."""
        return F.embedding(input_ids, self.embed_tokens)

    def run_layers(self, hidden: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """Every decoder layer over the step's rows; returns the residual stream ``[T, hidden]``."""
        # [T, 1, d_h], shared by all layers; index_select never syncs, so CUDA graphs can hold it
        cos = self.rope_cos.index_select(0, batch.positions).unsqueeze(1)
        sin = self.rope_sin.index_select(0, batch.positions).unsqueeze(1)
        for index, layer in enumerate(self.layers):
            hidden = self._layer(index, layer, hidden, batch, cos, sin)
        return hidden

    def head(self, hidden: torch.Tensor, sample_rows: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[S, vocab]`` of the sampled rows (final norm and lm_head only for them)."""
        rows = hidden if sample_rows is None else hidden.index_select(0, sample_rows)
        return _rms_norm(rows, self.final_norm) @ self.lm_head.t()

    @torch.no_grad()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """One step: writes the rows' K/V into the pool and returns the sampled rows' logits."""
        return self.head(self.run_layers(self.embed(batch.input_ids), batch), batch.sample_rows)

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy pool blocks ``src[i] -> dst[i]`` in every layer's K and V (copy-on-write)."""
        self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]

    # ------------------------------------------------------------------ one layer
    def _layer(self, index: int, layer: _Layer, hidden: torch.Tensor, batch: StepBatch,
               cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(layer, hidden, cos, sin)
        k_cache, v_cache = self.kv_pool[index, 0], self.kv_pool[index, 1]
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping)  # every row first: see module docstring
        attn = self._attention(q, k_cache, v_cache, batch)
        hidden = hidden + attn.flatten(1) @ layer.o_proj.t()
        return hidden + self._mlp(layer, hidden)

    def _qkv(self, layer: _Layer, hidden: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query ``[T, H_q, d_h]`` and key (both rotated) and value ``[T, H_kv, d_h]``."""
        s = self.shape
        num_rows = hidden.shape[0]
        qkv = _rms_norm(hidden, layer.input_norm) @ layer.qkv.t()
        q_width, kv_width = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        q = qkv[:, :q_width].view(num_rows, s.num_q_heads, s.head_dim)
        k = qkv[:, q_width:q_width + kv_width].view(num_rows, s.num_kv_heads, s.head_dim)
        v = qkv[:, q_width + kv_width:].view(num_rows, s.num_kv_heads, s.head_dim)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _mlp(self, layer: _Layer, hidden: torch.Tensor) -> torch.Tensor:
        x = _rms_norm(hidden, layer.post_norm) @ layer.up.t()
        if self.shape.gated_mlp:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        else:
            x = F.gelu(x)
        return x @ layer.down.t()

    def _attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   batch: StepBatch) -> torch.Tensor:
        num_decode = batch.decode_context_lens.shape[0]
        first = batch.num_prefill_tokens
        if not batch.prefills:  # decode only (the CUDA-graph path): no slicing, no copies
            return decode_attention(q, k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens,
                                    max_context_len=batch.decode_max_context)
        out = torch.empty_like(q)
        for span in batch.prefills:
            rows = slice(span.start_row, span.start_row + span.num_tokens)
            out[rows] = prefill_attention(q[rows], k_cache, v_cache, span.block_table, span.context_len,
                                          span.position)
        if num_decode:
            out[first:first + num_decode] = decode_attention(
                q[first:first + num_decode], k_cache, v_cache, batch.decode_block_tables,
                batch.decode_context_lens, max_context_len=batch.decode_max_context)
        return out

    # ------------------------------------------------------------------ oracle
    @torch.no_grad()
    def reference_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, vocab]`` of a plain dense causal forward over one sequence (positions
        0..N-1), with no KV pool: the oracle the paged forward is checked against."""
        n = token_ids.shape[0]
        hidden = self.embed(token_ids)
        positions = torch.arange(n, device=self.device)
        cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        group = self.shape.num_q_heads // self.shape.num_kv_heads
        for layer in self.layers:
            q, k, v = self._qkv(layer, hidden, cos, sin)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                  is_causal=True)
            hidden = hidden + attn.transpose(0, 1).reshape(n, -1) @ layer.o_proj.t()
            hidden = hidden + self._mlp(layer, hidden)
        return self.head(hidden, None)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS)
    return x32.to(x.dtype) * weight


def _rope_tables(max_positions: int, head_dim: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[max_positions, head_dim]`` in the rotate-half layout (both halves repeat)."""
    dims = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    inv_freq = 1.0 / ROPE_THETA ** (dims / head_dim)
    angles = torch.arange(max_positions, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [T, H, d_h]`` with the rows' ``cos``/``sin [T, 1, d_h]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
