"""KV-cache sizing: bytes per token (β) and the KV capacity of a GPU, the way vLLM computes it.

β, the bytes one token's KV state takes on one tensor-parallel rank::

    β = L · W · b        W = 2 · (H_kv / TP) · d_h     (K and V of this rank's KV heads)
                         W = kv_lora_rank + qk_rope_head_dim   (MLA: one latent per layer,
                                                                replicated on every rank)

When TP > H_kv vLLM replicates KV heads so each rank holds exactly one (TP must then be a
multiple of H_kv); the KV state is then duplicated across ranks and the layout says so.

``b`` is the KV cache dtype's width: ``--kv-cache-dtype``, or under ``auto`` the checkpoint's
own KV quantization where it declares one (a ModelOpt ``kv_cache_quant_algo``:
:func:`simulator.kv.hf_config.checkpoint_kv_cache_dtype`), else the model dtype.

**DeepSeek Sparse Attention** (DeepSeek-V3.2, GLM-5: MLA with a lightning indexer) keeps two
caches per layer, both replicated on every rank: the MLA latent, and the indexer's key of
``index_head_dim`` fp8 values plus an fp32 scale per 128 (132 bytes for 128-wide keys,
:attr:`ModelConfig.indexer_cache_bytes`, whatever the KV dtype). Every layer's two specs are
full-attention ``MLAAttentionSpec`` pages of one block size, so vLLM puts them in one KV cache
group whose page is the sum of the layers' pages (vllm/v1/kv_cache_interface.py,
``UniformTypeKVCacheSpecs.page_size_bytes``)::

    β = L · (latent bytes + indexer bytes)

With an fp8 KV cache the latent is FlashMLA-sparse's ``fp8_ds_mla`` record, 656 bytes (512 fp8
latent values, 4 fp32 scales, 64 bf16 rope values): ``MLAAttention`` turns a quantized KV dtype
into ``fp8_ds_mla`` on the FLASHMLA_SPARSE backend
(vllm/model_executor/layers/attention/mla_attention.py) and ``MLAAttentionSpec.real_page_size_bytes``
counts ``block_size × 656`` for it (vllm/v1/kv_cache_interface.py); ``auto`` keeps the model
dtype (vLLM main's ``DeepseekV32ForCausalLM.verify_and_update_config`` maps only "bfloat16" to
"auto"; releases before it forced ``fp8_ds_mla`` under "auto" too).

The roofline (:mod:`simulator.latency.roofline`) does not model DSA's selection: it reads every
context token's whole β and attends to every context token, where DSA's MLA reads and attends to
the ``index_topk`` tokens the indexer picks, and the indexer scores every cached key (``index_n_heads
× index_head_dim`` fp8 products per query-key pair). Beyond 2,048 tokens of context it overstates a
DSA model's attention reads and FLOPs, and it leaves the indexer's scoring out.

Capacity (vLLM's profile run, done here analytically)::

    available = gpu_memory_utilization × total memory − weights/TP − peak activations − non-torch overhead
    num_blocks = floor(available / (block_size × β))

(total memory: the GPU's as the driver reports it, ``GPUSpec.total_memory_bytes`` — vLLM takes
``gpu_memory_utilization`` of ``torch.cuda.mem_get_info``'s total, 79.20 GiB on an H100-80GB.)

(weights: :class:`~simulator.kv.quantization.WeightFormat`, the checkpoint's or ``--quantization``'s
format. weights/TP ignores the few tensors vLLM replicates on every rank — norms, and k/v projections
once TP > H_kv — well under 1% of a rank's weights for the catalog models.)

Peak activations, for a forward pass over ``max_num_batched_tokens`` = T tokens on one rank
(activations in the model's dtype ``a``; logits in fp32)::

    2·T·hidden·a                                  hidden states + residual, live across a layer
    + max( T·3·intermediate/TP·a                  SwiGLU gate_up output (2×) + activated (1×)
           T·k·(3·moe_intermediate/TP + hidden)·a fused-MoE intermediate caches (k experts/token)
           T·(q + k + v + out widths per rank)·a  attention buffers
           2·max_num_seqs·vocab·4 )               sampler logits + probabilities, fp32

**Hybrid models** (sliding-window, chunked-local or linear-attention layers) are sized as vLLM's
hybrid KV cache manager sizes them (:func:`kv_cache_groups`), unless
``hybrid_kv_cache_manager=False`` (vLLM's ``--disable-hybrid-kv-cache-manager``), which sizes
sliding and chunked layers as full attention (vllm/v1/core/kv_cache_utils.py,
``unify_hybrid_kv_cache_specs``) and is refused for linear-attention models, whose state cannot
be converted.

* Layers are grouped by kind into KV cache groups of ``group_size`` layers: the fewest layers
  of any kind, or the most when that is under 1.5 × the fewest; each kind gets
  ``ceil(layers / group_size)`` groups, the last one padded (``_get_kv_cache_groups_uniform_page_size``).
* One pool of ``num_blocks`` block ids serves every group; a block id stands for one page in
  each of ``group_size`` tensors, so ``num_blocks = available // page // group_size``
  (``get_kv_cache_config_from_groups``, ``get_num_blocks``).
* Per request and group, at most: full ``ceil(max_model_len / B)`` blocks; sliding
  ``ceil(min(W − 1 + max_num_batched_tokens, max_model_len) / B) + 1``; chunked
  ``ceil(min(chunk + max_num_batched_tokens, max_model_len) / B)``; linear one block
  (vllm/v1/kv_cache_interface.py, ``max_memory_usage_bytes`` of ``FullAttentionSpec``,
  ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MambaSpec``). The maximum concurrency is
  ``num_blocks`` over their sum (``get_max_concurrency_for_kv_cache_config``), and the "GPU KV
  cache size" vLLM logs is ``int(max_concurrency × max_model_len)`` tokens: the context the pool
  holds at peak, window-capped groups included (vllm/v1/core/kv_cache_utils.py,
  ``get_kv_cache_capacity`` / ``_report_kv_cache_config`` on vLLM main; releases before it
  logged ``num_blocks // num_groups × B``, which understates a sliding-window model's pool).
* A linear-attention (Gated DeltaNet, Mamba-2) layer's state is one page: vLLM raises the attention block
  size to ``16 · ceil(state / (16 · page_per_token))`` so that an attention page holds it, and
  pads the state to that page (vllm/platforms/interface.py, ``_align_hybrid_block_size``;
  16 = FlashAttention's kernel block multiple).

**Data-parallel attention and the MoE layers' own layout** (``dp`` attention DP ranks of ``tp``
ranks; the MoE layers as ``moe_tp × moe_ep`` over the same ``dp × tp`` GPUs:
:mod:`simulator.kv.expert_parallel`). Per rank::

    weights = (weights − routed experts) / TP  +  MoE layers × ceil(E / moe_ep) × one expert / moe_tp

(the dense part, shared experts included, is replicated on every DP rank and TP-sharded within
it; the routed experts are split over the ``moe_ep`` groups, each TP-sharded over ``moe_tp``; the
rank holding the most experts sets the figure). KV is per DP rank: β at the DP rank's TP (KV heads
split over the attention TP, an MLA latent on each of its ranks), the pool holding only that DP
rank's requests, so the deployment holds ``dp`` times the concurrency of one. The fused-MoE
activation caches are at the experts' per-rank width (``moe_intermediate_size / moe_tp``), over
the tokens a rank's MoE runs: its own ``T``; when the MoE gathers every DP rank's tokens
(``moe_dispatch`` all-gather: vLLM's profile run steps every DP rank with
``max_num_batched_tokens``) the gathered ``dp × T`` tokens' buffer (``dp·T·hidden·a``) plus the
caches of one fused-MoE chunk, ``min(dp·T, 16,384)`` tokens (``VLLM_FUSED_MOE_CHUNK_SIZE``), at
least ``T``. With ``dp = 1`` and the MoE TP-sharded over the TP ranks (vLLM's default) this is the
formula above, byte for byte.

What is not modelled: under DP attention SGLang shards the dense MLP layers over all its
``--tp-size`` ranks (unless ``moe_dense_tp_size`` or ``enable_dense_mlp_attn_tp``;
python/sglang/srt/layers/dp_attention.py ``compute_dp_attention_local_info``), and the shared
experts too without an a2a backend (whole on each rank under DeepEP unless
``enable_shared_experts_attn_tp``), where kvplan keeps both with the attention DP rank's TP, as
vLLM does: it overstates such an SGLang rank's weights by up to the dense MLPs' and shared
experts' (tp − 1)/tp (DeepSeek-V3/R1 at --tp 8 --dp 8: about 3.3 GB of 19 GB).

The non-torch overhead (:data:`NON_TORCH_OVERHEAD_BYTES`, 0.5 GiB) stands for what vLLM reports
as ``non_torch_memory``: cuBLAS workspaces, NCCL buffers, the allocator's slack; it measures
~0.5 GiB for Llama-3.1-8B on an H100. CUDA-graph memory comes out of the 1 − utilization margin.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from simulator.errors import KvplanError, did_you_mean
from simulator.kv.expert_parallel import ParallelLayout
from simulator.kv.gpus import GPUSpec
from simulator.kv.model_config import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
)
from simulator.kv.models import ModelConfig, canonical_dtype, dtype_bits
from simulator.kv.quantization import WeightFormat, resolve_quantization

GIB = 2**30
MIB = 2**20
NON_TORCH_OVERHEAD_BYTES = GIB // 2
# vLLM's fused MoE runs its tokens in chunks of VLLM_FUSED_MOE_CHUNK_SIZE (16 * 1024 by default,
# vllm/envs.py; fused_experts_impl in vllm/model_executor/layers/fused_moe/fused_moe.py:
# M = min(num_tokens, CHUNK_SIZE)): its intermediate caches hold one chunk's tokens.
FUSED_MOE_CHUNK_TOKENS = 16 * 1024
# FlashAttention's kernel block multiple: the granularity vLLM raises a hybrid linear-attention
# model's block size by (vllm/v1/attention/backends/flash_attn.py,
# get_supported_kernel_block_sizes: [MultipleOf(16)]).
KERNEL_BLOCK_ALIGNMENT = 16

# KV cache dtypes (vLLM's --kv-cache-dtype plus the HF torch_dtype spellings) -> bytes/element.
KV_DTYPE_BYTES: dict[str, int] = {
    "fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}


@dataclass(frozen=True, slots=True)
class KnobNames:
    """How the user spells each knob an error may ask them to change: ``kvplan size``'s flags or
    a scenario's YAML keys, so the advice names what the user can actually edit."""

    tp: str
    gpu_memory_utilization: str
    max_num_batched_tokens: str
    max_model_len: str
    dp: str = "data_parallel_size"
    ep: str = "enable_expert_parallel"
    moe_tp: str = "moe_tensor_parallel_size"
    moe_ep: str = "moe_expert_parallel_size"
    moe_dispatch: str = "moe_dispatch"


CLI_FLAGS = KnobNames("--tp", "--gpu-memory-utilization", "--max-num-batched-tokens",
                      "--max-model-len", "--dp", "--enable-expert-parallel", "--moe-tp", "--moe-ep",
                      "--moe-dispatch")
SCENARIO_KEYS = KnobNames("tensor_parallel", "gpu_memory_utilization", "max_num_batched_tokens",
                          "max_model_len")


def kv_dtype_bytes(name: str) -> int:
    """Bytes per element of KV cache dtype ``name``. Unknown -> KvplanError (did you mean)."""
    key = name.strip().lower()
    if key not in KV_DTYPE_BYTES:
        raise KvplanError(f"unknown KV cache dtype '{name}'{did_you_mean(key, KV_DTYPE_BYTES)}"
                          f" (known: auto, {', '.join(KV_DTYPE_BYTES)})")
    return KV_DTYPE_BYTES[key]


def resolve_kv_dtype(model: ModelConfig, kv_cache_dtype: str = "auto") -> str:
    """The KV dtype actually stored: ``"auto"`` means the checkpoint's declared KV dtype if any
    (module docstring), else the model's ``torch_dtype``."""
    if kv_cache_dtype.strip().lower() == "auto":
        if model.checkpoint_kv_cache_dtype is not None:
            return canonical_dtype(model.checkpoint_kv_cache_dtype)
        return canonical_dtype(model.torch_dtype)
    kv_dtype_bytes(kv_cache_dtype)
    return kv_cache_dtype.strip().lower()


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The KV state of one token on one tensor-parallel rank."""

    num_layers: int
    kv_width: int  # elements per token per layer on this rank: 2·H_kv_rank·d_h, or MLA latent
    dtype: str
    dtype_bytes: int
    tp: int
    num_kv_heads_per_rank: int  # 0 for MLA
    replicated: bool  # the same KV state is stored on more than one rank
    notes: tuple[str, ...] = ()
    # bytes per token per layer beyond kv_width × dtype_bytes: a sparse-attention indexer's key,
    # and fp8_ds_mla's scales and 16-bit rope values (module docstring)
    extra_bytes_per_layer: int = 0

    @property
    def layer_bytes(self) -> int:
        """One token's KV in one layer on this rank, bytes (a page of one token)."""
        return self.kv_width * self.dtype_bytes + self.extra_bytes_per_layer

    @property
    def bytes_per_token(self) -> int:
        """β on this rank, bytes."""
        return self.num_layers * self.layer_bytes


def kv_layout(num_layers: int, num_kv_heads: int, head_dim: int, *, dtype: str = "fp16",
              tp: int = 1, latent_width: int | None = None,
              knobs: KnobNames = CLI_FLAGS) -> KVLayout:
    """The per-rank KV layout from raw dimensions.

    ``latent_width`` (MLA: kv_lora_rank + qk_rope_head_dim) replaces ``2·H_kv·d_h``; the
    head counts are then ignored. TP must divide H_kv, or be a multiple of it (replication);
    errors name the TP knob as ``knobs`` spells it.
    """
    for flag, value in (("layers", num_layers), (knobs.tp, tp)):
        _require_positive(flag, value)
    dtype_size = kv_dtype_bytes(dtype)
    if latent_width is not None:
        _require_positive("latent width (kv_lora_rank + qk_rope_head_dim)", latent_width)
        note = (f"MLA latent ({latent_width} values/token/layer) is replicated on every one of"
                f" the {tp} ranks")
        notes = (note,) if tp > 1 else ()
        return KVLayout(num_layers, latent_width, dtype.lower(), dtype_size, tp, 0, tp > 1, notes)
    _require_positive("kv heads", num_kv_heads)
    _require_positive("head dim", head_dim)
    if tp <= num_kv_heads:
        if num_kv_heads % tp:
            raise KvplanError(f"{knobs.tp} {tp} does not divide the {num_kv_heads} KV heads")
        heads = num_kv_heads // tp
        return KVLayout(num_layers, 2 * heads * head_dim, dtype.lower(), dtype_size, tp,
                        heads, False)
    if tp % num_kv_heads:
        raise KvplanError(f"{knobs.tp} {tp} exceeds the {num_kv_heads} KV heads and is not a"
                          " multiple of them (vLLM replicates each head on tp / H_kv ranks)")
    note = (f"tp={tp} > {num_kv_heads} KV heads: each KV head is replicated on"
            f" {tp // num_kv_heads} ranks; every rank holds 1 KV head")
    return KVLayout(num_layers, 2 * head_dim, dtype.lower(), dtype_size, tp, 1, True, (note,))


def model_kv_layout(model: ModelConfig, kv_cache_dtype: str = "auto", tp: int = 1, *,
                    knobs: KnobNames = CLI_FLAGS) -> KVLayout:
    """The per-rank KV layout of ``model`` (``"auto"`` dtype = the model's torch_dtype); its
    notes say when sliding-window layers were sized as full attention. Errors name the TP knob
    as ``knobs`` spells it."""
    dtype = resolve_kv_dtype(model, kv_cache_dtype)
    _require_positive(knobs.tp, tp)
    if model.num_attention_heads % tp:
        raise KvplanError(f"{knobs.tp} {tp} does not divide {model.name}'s"
                          f" {model.num_attention_heads} attention heads")
    latent = model.kv_latent_width if model.is_mla else None
    layout = kv_layout(model.num_kv_layers, model.num_key_value_heads, model.head_dim,
                       dtype=dtype, tp=tp, latent_width=latent, knobs=knobs)
    notes = list(layout.notes)
    if kv_cache_dtype.strip().lower() == "auto" and model.checkpoint_kv_cache_dtype is not None:
        notes.append(f"KV cache in {dtype}: the checkpoint's KV quantization (vLLM resolves"
                     " --kv-cache-dtype auto to it)")
    extra = 0
    if model.has_sparse_indexer:
        if dtype.startswith("fp8"):
            extra += _fp8_ds_mla_bytes(model) - layout.kv_width * layout.dtype_bytes
            notes.append(f"fp8 KV: the MLA latent is vLLM's fp8_ds_mla record,"
                         f" {_fp8_ds_mla_bytes(model)} bytes per token per layer")
        extra += model.indexer_cache_bytes
        notes.append(f"DeepSeek Sparse Attention: + the indexer's key, {model.indexer_cache_bytes}"
                     f" bytes per token per layer (attention reads the top {model.index_topk:,}"
                     " tokens it picks)")
    if model.attention_note:
        notes.append(model.attention_note)
    return replace(layout, notes=tuple(notes), extra_bytes_per_layer=extra)


def _fp8_ds_mla_bytes(model: ModelConfig) -> int:
    """FlashMLA-sparse's fp8 record of one token's latent (module docstring): the latent in fp8,
    one fp32 scale per 128 of it, the rope part in 16 bits (512 + 16 + 128 = 656 for DeepSeek)."""
    rank, rope = model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
    return rank + rank // 128 * 4 + 2 * rope


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """One of vLLM's KV cache groups: ``num_layers`` layers of one kind sharing a block table
    (fewer than the layout's ``group_size`` in a padded last group)."""

    kind: str  # full_attention | sliding_attention | chunked_attention | linear_attention
    num_layers: int
    window: int | None  # sliding window or attention chunk, tokens; None for full and linear

    def blocks_held(self, num_tokens: int, block_size: int) -> int:
        """Blocks a sequence of ``num_tokens`` computed tokens holds in this group once the
        blocks its attention skips are freed: all of them (full), those from the first token of
        the window of the next token on (sliding: ``num_tokens − W + 1`` tokens skipped;
        chunked: the whole chunks before the current one), one (linear). vLLM's
        ``remove_skipped_blocks`` / ``get_num_skipped_tokens``
        (vllm/v1/core/single_type_kv_cache_manager.py)."""
        total = -(-num_tokens // block_size)
        if self.kind == LINEAR_ATTENTION:
            return 1
        return total - skipped_tokens(self.kind, self.window, num_tokens) // block_size

    def max_blocks(self, max_model_len: int, max_num_batched_tokens: int, block_size: int) -> int:
        """Most blocks one request holds in this group (module docstring, max_memory_usage_bytes)."""
        if self.kind == SLIDING_ATTENTION:
            assert self.window is not None
            tokens = min(self.window - 1 + max_num_batched_tokens, max_model_len)
            return -(-tokens // block_size) + 1
        if self.kind == CHUNKED_ATTENTION:
            assert self.window is not None
            tokens = min(self.window + max_num_batched_tokens, max_model_len)
            return -(-tokens // block_size)
        if self.kind == LINEAR_ATTENTION:
            return 1
        return -(-max_model_len // block_size)


def skipped_tokens(kind: str, window: int | None, num_computed_tokens: int) -> int:
    """Leading tokens a layer of ``kind`` no longer attends to once ``num_computed_tokens`` are
    computed (vllm/v1/core/single_type_kv_cache_manager.py, ``get_num_skipped_tokens`` of
    ``SlidingWindowManager``: ``max(0, n − W + 1)``; ``ChunkedLocalAttentionManager``:
    ``n // chunk · chunk``; full attention: 0)."""
    if kind == SLIDING_ATTENTION:
        assert window is not None
        return max(0, num_computed_tokens - window + 1)
    if kind == CHUNKED_ATTENTION:
        assert window is not None
        return num_computed_tokens // window * window
    return 0


@dataclass(frozen=True, slots=True)
class HybridKVLayout:
    """A hybrid model's KV cache as vLLM's hybrid manager lays it out on one rank (module
    docstring): its groups, the layers per group, the tokens and bytes of one page."""

    groups: tuple[KVCacheGroup, ...]
    group_size: int  # layers per group: tensors each block id spans
    block_size: int  # tokens per block (raised above the configured one for linear attention)
    page_bytes: int  # one layer's block (a linear layer's state padded to it)
    state_bytes: int  # a linear-attention layer's state, unpadded (0 without linear layers)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block id: one page in each of ``group_size`` tensors."""
        return self.page_bytes * self.group_size

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request may hold across all groups (vLLM's concurrency denominator)."""
        return sum(g.max_blocks(max_model_len, max_num_batched_tokens, self.block_size)
                   for g in self.groups)

    def describe(self) -> str:
        """One line: the groups by kind, layers per group, block size."""
        kinds = Counter(g.kind for g in self.groups)
        parts = [f"{n} {kind.replace('_', ' ')}" for kind, n in kinds.items()]
        return (f"{len(self.groups)} KV cache groups of {self.group_size} layers"
                f" ({', '.join(parts)}), blocks of {self.block_size} tokens")


def sequence_kv_bytes(model: ModelConfig, layout: KVLayout, num_tokens: int) -> int:
    """KV bytes one sequence of ``num_tokens`` tokens keeps on one rank, token-exact (no block
    rounding): every token in full layers, ``min(n, W)`` in sliding layers, the current chunk
    (``n mod chunk``, a whole chunk at a chunk boundary) in chunked layers, a fixed state in
    linear-attention layers. For a model with only full attention this is ``n · β``."""
    if not model.is_hybrid:
        return num_tokens * layout.bytes_per_token
    per_layer = layout.layer_bytes
    held = model.num_layers_of(FULL_ATTENTION) * num_tokens
    if model.sliding_window is not None:
        held += model.num_layers_of(SLIDING_ATTENTION) * min(num_tokens, model.sliding_window)
    chunk = model.attention_chunk_size
    if chunk is not None and num_tokens:
        held += model.num_layers_of(CHUNKED_ATTENTION) * ((num_tokens - 1) % chunk + 1)
    state = model.num_layers_of(LINEAR_ATTENTION) * model.linear_state_bytes(layout.tp)
    return held * per_layer + state


def kv_cache_groups(model: ModelConfig, layout: KVLayout, block_size: int, *,
                    hybrid_kv_cache_manager: bool = True) -> HybridKVLayout | None:
    """vLLM's KV cache groups for ``model`` on one rank (module docstring), or None when every
    layer is full attention or the hybrid manager is disabled (then every layer is sized as
    full). A linear-attention model cannot run without the hybrid manager: KvplanError."""
    if not model.is_hybrid:
        return None
    linear = model.num_layers_of(LINEAR_ATTENTION)
    if not hybrid_kv_cache_manager:
        if linear:
            raise KvplanError(
                f"{model.name} has linear-attention layers, whose state vLLM cannot size as full"
                " attention: it refuses --disable-hybrid-kv-cache-manager (vllm/v1/core/"
                "kv_cache_utils.py, unify_hybrid_kv_cache_specs); drop"
                " disable_hybrid_kv_cache_manager")
        return None
    per_token_page = layout.layer_bytes
    state = 0
    if linear:
        state = model.linear_state_bytes(layout.tp)
        align = max(KERNEL_BLOCK_ALIGNMENT, block_size)
        block_size = max(block_size, align * -(-state // (align * per_token_page)))
    counts = {kind: model.num_layers_of(kind) for kind in
              (FULL_ATTENTION, SLIDING_ATTENTION, CHUNKED_ATTENTION, LINEAR_ATTENTION)}
    counts = {kind: n for kind, n in counts.items() if n}
    fewest, most = min(counts.values()), max(counts.values())
    group_size = most if most < fewest * 1.5 else fewest
    groups: list[KVCacheGroup] = []
    for kind, n in counts.items():
        num_groups = -(-n // group_size)
        for i in range(num_groups):  # layers[i::num_groups]: the first n % ... groups are full
            groups.append(KVCacheGroup(kind, len(range(i, n, num_groups)),
                                       model.attention_window(kind)))
    return HybridKVLayout(tuple(groups), group_size, block_size, block_size * per_token_page, state)


def bytes_per_token(model: ModelConfig, kv_cache_dtype: str = "auto", tp: int = 1) -> int:
    """β: KV-cache bytes per token on one tensor-parallel rank."""
    return model_kv_layout(model, kv_cache_dtype, tp).bytes_per_token


def max_sequences(pool_bytes: int, bytes_per_token: int, seq_len_tokens: int,
                  block_size: int = 1) -> int:
    """Sequences of ``seq_len_tokens`` that a KV pool of ``pool_bytes`` holds at once, each
    rounded up to whole blocks of ``block_size`` tokens (1 = exact token granularity)."""
    for flag, value in (("pool bytes", pool_bytes), ("bytes per token", bytes_per_token),
                        ("seq len", seq_len_tokens), ("block size", block_size)):
        _require_positive(flag, value)
    num_blocks = pool_bytes // (block_size * bytes_per_token)
    return num_blocks // math.ceil(seq_len_tokens / block_size)


def activation_bytes(model: ModelConfig, *, tp: int = 1, max_num_batched_tokens: int = 8192,
                     max_num_seqs: int = 256, moe_tp: int | None = None,
                     moe_tokens: int | None = None, gathered_tokens: int = 0) -> int:
    """Peak activation bytes of one rank's forward pass (formula in the module docstring).
    ``moe_tp``: ranks each expert's matrices are split over (1 under expert parallelism;
    default ``tp``); ``moe_tokens``: the tokens one fused-MoE pass runs (default
    ``max_num_batched_tokens``); ``gathered_tokens``: every DP rank's tokens, gathered into one
    buffer for the MoE (0: none gathered)."""
    act = min(dtype_bits(model.torch_dtype), 32) // 8
    act = max(act, 2)  # fp8/int weights still run 16-bit activations
    tokens = max_num_batched_tokens
    residual = 2 * tokens * model.hidden_size * act
    mlp_width = 3 if model.gated_mlp else 2  # gate_up + silu | fc1/up out + activation
    candidates = [tokens * mlp_width * math.ceil(model.intermediate_size / tp) * act]
    if model.is_moe:
        split = tp if moe_tp is None else moe_tp
        routed = tokens if moe_tokens is None else moe_tokens
        per_token = 3 * math.ceil((model.moe_intermediate_size or 0) / split) + model.hidden_size
        candidates.append(routed * model.experts_per_token * per_token * act
                          + gathered_tokens * model.hidden_size * act)
    heads = model.num_attention_heads // tp
    if model.is_mla:
        attn_width = heads * (2 * model.qk_head_dim + 2 * model.value_head_dim)
    else:
        kv_heads = max(1, model.num_key_value_heads // tp)
        attn_width = (2 * heads + 2 * kv_heads) * model.head_dim
    candidates.append(tokens * attn_width * act)
    candidates.append(2 * max_num_seqs * model.vocab_size * 4)
    return residual + max(candidates)


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """How much KV cache fits on one rank, with every term of the budget."""

    model_name: str
    gpu_name: str
    tp: int
    kv_cache_dtype: str
    block_size: int
    bytes_per_token: int  # β per rank
    block_bytes: int  # block_size × β
    budget_bytes: int  # gpu_memory_utilization × the GPU's total memory (driver-reported)
    weight_bytes: int  # per rank
    activation_bytes: int  # peak, per rank
    non_torch_bytes: int
    available_kv_bytes: int
    num_blocks: int
    capacity_tokens: int  # num_blocks × block_size
    max_model_len: int
    max_concurrency: float  # capacity_tokens / max_model_len
    notes: tuple[str, ...]
    weight_format: WeightFormat  # how the weights are stored and computed (quantization)
    # the hybrid manager's groups (None: one group, every layer sized as full attention)
    kv_groups: HybridKVLayout | None = None
    dp: int = 1  # data-parallel ranks, each with its own KV pool of num_blocks
    ep: int = 1  # expert-parallel groups the routed experts are spread over (moe_ep)
    expert_weight_bytes: int = 0  # routed experts on this rank (in weight_bytes)
    experts_per_rank: int = 0  # routed experts per MoE layer on this rank
    moe_tp: int = 1  # ranks each routed expert is TP-sharded over (dense model: 1)
    moe_dispatch: str = "none"  # how the MoE gets other DP ranks' tokens (ParallelLayout.dispatch)

    @property
    def total_concurrency(self) -> float:
        """Requests of ``max_model_len`` the whole deployment holds: every DP rank's pool."""
        return self.max_concurrency * self.dp


def weights_per_rank(model: ModelConfig, fmt: WeightFormat, layout: ParallelLayout) -> tuple[int, int]:
    """(weight bytes, of which routed experts) on the rank holding the most (module
    docstring); ``ceil(weights / TP)`` with one DP rank and the experts TP-sharded over its
    ranks."""
    routed_total = model.num_moe_layers * model.num_experts * fmt.expert_bytes
    if layout.dp == 1 and layout.moe_ep == 1:  # moe_tp == tp: every tensor split the same way
        return math.ceil(fmt.weight_bytes / layout.tp), math.ceil(routed_total / layout.tp)
    experts = model.num_moe_layers * layout.experts_per_rank(model) * fmt.expert_bytes
    if layout.moe_tp > 1:
        experts = math.ceil(experts / layout.moe_tp)
    return math.ceil((fmt.weight_bytes - routed_total) / layout.tp) + experts, experts


def kv_capacity(model: ModelConfig, gpu: GPUSpec, *, tp: int = 1, kv_cache_dtype: str = "auto",
                block_size: int = 16, gpu_memory_utilization: float = 0.9,
                max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                max_model_len: int | None = None, quantization: str = "auto",
                knobs: KnobNames = CLI_FLAGS, static_fraction: bool = False,
                hybrid_kv_cache_manager: bool = True, dp: int = 1,
                enable_expert_parallel: bool = False, moe_tp: int | None = None,
                moe_ep: int | None = None, moe_dispatch: str | None = None) -> KVCapacity:
    """KV blocks that fit on each rank of ``gpu`` serving ``model`` (module docstring formula).

    ``max_model_len`` defaults to the model's ``max_position_embeddings``; ``quantization`` is
    vLLM's ``--quantization`` (``auto`` = the checkpoint's; see simulator/kv/quantization.py).
    Raises KvplanError when the weights (or weights plus activations) leave no room for even
    one block, or for a quantization the model or GPU cannot take; its advice names the knobs
    as ``knobs`` spells them (``kvplan size``'s flags by default, a scenario's keys with
    :data:`SCENARIO_KEYS`).

    ``static_fraction``: SGLang's budget instead of vLLM's. ``gpu_memory_utilization`` is then
    SGLang's ``mem_fraction_static``, the share of HBM for weights and the KV pool; activations
    and CUDA graphs live in the rest, so none are subtracted: KV = available after loading the
    weights − HBM × (1 − mem_fraction_static)
    (python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py ``profile_max_num_token``).

    ``dp`` / ``enable_expert_parallel``: vLLM's ``--data-parallel-size`` and
    ``--enable-expert-parallel``; ``moe_tp`` / ``moe_ep`` / ``moe_dispatch``: the MoE layers'
    own TP and EP sizes (SGLang's and TensorRT-LLM's; None: derived) and how they get other DP
    ranks' tokens (module docstring, :class:`~simulator.kv.expert_parallel.ParallelLayout`); the
    figures are per rank, the pool per DP rank.
    """
    for flag, value in (("block size", block_size), ("max num batched tokens",
                        max_num_batched_tokens), ("max num seqs", max_num_seqs)):
        _require_positive(flag, value)
    if not 0 < gpu_memory_utilization <= 1:
        raise KvplanError("gpu memory utilization must be in (0, 1],"
                          f" got {gpu_memory_utilization}")
    model_len = model.max_position_embeddings if max_model_len is None else max_model_len
    _require_positive("max model len", model_len)
    layout = model_kv_layout(model, kv_cache_dtype, tp, knobs=knobs)
    parallel = ParallelLayout(tp, dp, enable_expert_parallel, moe_tp, moe_ep, moe_dispatch)
    parallel.check(model, tp_knob=knobs.tp, dp_knob=knobs.dp, ep_knob=knobs.ep,
                   moe_tp_knob=knobs.moe_tp, moe_ep_knob=knobs.moe_ep,
                   dispatch_knob=knobs.moe_dispatch)
    budget = int(gpu_memory_utilization * gpu.total_memory_bytes)  # as the driver reports it
    weight_format = resolve_quantization(model, quantization, gpu)
    weights, expert_weights = weights_per_rank(model, weight_format, parallel)
    if weights >= budget:
        raise KvplanError(f"{model.name} weights ({weights / GIB:.1f} GiB per rank) do not fit in"
                          f" {gpu_memory_utilization:.2f} × {gpu.total_memory_gib:.2f} GiB of {gpu.name};"
                          f" raise {knobs.tp}" + (f" or {knobs.dp}" if model.is_moe else ""))
    activations = 0 if static_fraction else activation_bytes(
        model, tp=tp, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        moe_tp=parallel.moe_tp, **_gathered_moe_tokens(parallel, max_num_batched_tokens))
    available = budget - weights - activations - NON_TORCH_OVERHEAD_BYTES
    groups = kv_cache_groups(model, layout, block_size,
                             hybrid_kv_cache_manager=hybrid_kv_cache_manager)
    if groups is not None:
        block_size = groups.block_size
    block_bytes = block_size * layout.bytes_per_token if groups is None else groups.block_bytes
    if available < block_bytes:
        raise KvplanError(
            f"no room for the KV cache of {model.name} on {gpu.name}:"
            f" {gpu_memory_utilization:.2f} × {gpu.total_memory_gib:.2f} GiB − weights {weights / GIB:.2f} GiB"
            f" − activations {activations / GIB:.2f} GiB − overhead"
            f" {NON_TORCH_OVERHEAD_BYTES / GIB:.2f} GiB = {available / GIB:.2f} GiB; raise {knobs.tp}"
            f" or {knobs.gpu_memory_utilization}, or lower {knobs.max_num_batched_tokens}")
    num_blocks = available // block_bytes
    capacity = num_blocks * block_size
    concurrency = capacity / model_len
    notes = list(layout.notes) + list(weight_format.notes)
    if groups is not None:
        per_request = groups.max_blocks_per_request(model_len, max_num_batched_tokens)
        concurrency = num_blocks / per_request
        capacity = hybrid_capacity_tokens(num_blocks, per_request, model_len)
        notes.append(f"hybrid KV cache manager: {groups.describe()}; a {model_len:,}-token"
                     f" request holds at most {per_request:,} blocks")
        if num_blocks < per_request:
            notes.append(f"max_model_len {model_len:,} needs {per_request:,} blocks, the KV"
                         f" cache has {num_blocks:,}: one full-length request does not fit"
                         f" (vLLM refuses to start); lower {knobs.max_model_len}")
    elif model.is_hybrid:
        notes.append("hybrid KV cache manager disabled: sliding-window and chunked layers keep"
                     " every token, sized as full attention")
    if groups is None and capacity < model_len:
        notes.append(f"max_model_len {model_len:,} exceeds the KV capacity ({capacity:,} tokens):"
                     " one full-length request does not fit (vLLM refuses to start);"
                     f" lower {knobs.max_model_len}")
    return KVCapacity(
        model_name=model.name, gpu_name=gpu.name, tp=tp, kv_cache_dtype=layout.dtype,
        block_size=block_size, bytes_per_token=layout.bytes_per_token, block_bytes=block_bytes,
        budget_bytes=budget, weight_bytes=weights, activation_bytes=activations,
        non_torch_bytes=NON_TORCH_OVERHEAD_BYTES, available_kv_bytes=available,
        num_blocks=num_blocks, capacity_tokens=capacity, max_model_len=model_len,
        max_concurrency=concurrency, notes=tuple(notes), weight_format=weight_format,
        kv_groups=groups, dp=dp, ep=parallel.ep_size, expert_weight_bytes=expert_weights,
        experts_per_rank=parallel.experts_per_rank(model) if model.is_moe else 0,
        moe_tp=parallel.moe_tp if model.is_moe else 1,
        moe_dispatch=parallel.dispatch if model.is_moe else "none")


def _gathered_moe_tokens(parallel: ParallelLayout, tokens: int) -> dict[str, int]:
    """The fused-MoE pass's tokens and the gathered buffer's when the MoE gathers every DP rank's
    ``tokens`` (module docstring): ``dp × tokens`` gathered, run in chunks of at most
    :data:`FUSED_MOE_CHUNK_TOKENS` (never fewer than the rank's own); otherwise the rank's own."""
    if not parallel.uses_all_gather:
        return {"moe_tokens": tokens}
    gathered = parallel.dp * tokens
    return {"moe_tokens": max(tokens, min(gathered, FUSED_MOE_CHUNK_TOKENS)),
            "gathered_tokens": gathered}


def hybrid_capacity_tokens(num_blocks: int, blocks_per_request: int, max_model_len: int) -> int:
    """Tokens of context a hybrid model's pool of ``num_blocks`` holds at peak: the maximum
    concurrency times ``max_model_len``, as vLLM's ``get_kv_cache_capacity`` (module docstring)."""
    return int(num_blocks / blocks_per_request * max_model_len)


def format_vllm_log(cap: KVCapacity) -> str:
    """The capacity as vLLM's startup log prints it (one line each)."""
    memory = (f"Model weights take {cap.weight_bytes / GIB:.2f} GiB per rank; peak activations"
              f" {cap.activation_bytes / GIB:.2f} GiB; non-torch memory"
              f" {cap.non_torch_bytes / GIB:.2f} GiB")
    size = (f"GPU KV cache size: {cap.capacity_tokens:,} tokens ({cap.num_blocks:,} blocks of"
            f" {cap.block_size})")
    concurrency = (f"Maximum concurrency for {cap.max_model_len:,} tokens per request:"
                   f" {cap.max_concurrency:.2f}x")
    available = f"Available KV cache memory: {cap.available_kv_bytes / GIB:.2f} GiB"
    return f"{memory}\n{available}\n{size}\n{concurrency}"


def _require_positive(flag: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KvplanError(f"{flag} must be a positive integer, got {value!r}")
