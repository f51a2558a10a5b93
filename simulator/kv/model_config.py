"""A model's shape in the Hugging Face ``config.json`` vocabulary, and its parameter counts.

A :class:`ModelConfig` holds the shape fields of a model's ``config.json`` under their Hugging
Face names (``num_hidden_layers``, ``num_key_value_heads``, ``kv_lora_rank``...), so a reader
can check every number against the model card.

Parameter counts are derived from the tensor shapes, not copied from model cards:

* embeddings ``vocab × hidden`` (+ OPT's learned positions), an ``lm_head`` of the same shape
  unless ``tie_word_embeddings``;
* attention: q, k, v, o projections; biases on q/k/v for Qwen2, on q/k/v/o for OPT and for
  ``attention_bias`` models (gpt-oss, which also has one learned sink logit per head); MLA
  (DeepSeek) has the low-rank q_a/q_b, kv_a (latent + rope key) and kv_b projections;
* MLP: SwiGLU (GeGLU for Gemma) has three ``hidden × intermediate`` matrices (gate, up, down),
  OPT two (fc1, fc2) with biases; an MoE layer has ``n_routed_experts`` routed +
  ``n_shared_experts`` shared SwiGLU experts of ``moe_intermediate_size`` and a router
  (gpt-oss: with biases on the router and the experts). Which layers are MoE follows DeepSeek's
  ``first_k_dense_replace`` and Qwen-MoE's ``decoder_sparse_step`` / ``mlp_only_layers``;
* norms: RMSNorm weights (LayerNorm weight + bias for OPT), two per layer (four for Gemma 2/3)
  plus a final one; Qwen3, Qwen3-Next, Qwen3.5 and Gemma 3 add a q-norm and a k-norm of
  ``head_dim`` per layer; MiniMax-M2 normalises the whole q and k projections instead (its
  ``qk_norm_type`` "per_layer": ``q_norm`` of ``heads × head_dim``, ``k_norm`` of ``kv_heads ×
  head_dim``, vllm/model_executor/models/minimax_m2.py ``MiniMaxM2Attention``). Routers are
  ``hidden × E`` matrices; the ``e_score_correction_bias`` (E values per MoE layer) of
  DeepSeek-V3-style and MiniMax-M2 routers is not counted (under 20,000 parameters a model).
* DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5: ``index_n_heads``, ``index_head_dim``,
  ``index_topk``): each MLA layer also has a lightning indexer (vllm/model_executor/models/
  deepseek_v2.py, ``Indexer``): ``wq_b`` ``q_lora_rank × index_n_heads · index_head_dim`` (built
  with the checkpoint's quantization), ``wk`` ``hidden × index_head_dim`` and ``weights_proj``
  ``hidden × index_n_heads`` (fused into one GEMM built with ``quant_config=None``, so stored in
  the model dtype) and a LayerNorm ``k_norm`` of ``index_head_dim`` (weight and bias). Its KV
  cache is in :attr:`ModelConfig.indexer_cache_bytes`.

Attention kinds: ``layer_types`` (HF's per-layer list) says what each layer keeps per request:

* ``full_attention``: the KV of every token;
* ``sliding_attention``: the KV of the last ``sliding_window`` tokens (gpt-oss, Gemma 2/3, Mistral);
* ``chunked_attention``: the KV of the tokens of the current ``attention_chunk_size`` chunk
  (Llama 4's local layers: the layers with RoPE, ``no_rope_layers[i] == 1``);
* ``linear_attention``: a fixed recurrent state (Qwen3-Next's Gated DeltaNet): a causal-conv
  state of ``(kernel − 1) × conv_dim`` and a ``num_v_heads × k_dim × v_dim`` temporal state, in
  the model's dtype (vllm/model_executor/layers/mamba/mamba_utils.py,
  ``MambaStateShapeCalculator.gated_delta_net_state_shape`` and
  ``MambaStateDtypeCalculator.gated_delta_net_state_dtype``: ``mamba_cache_dtype`` "auto").
  Nemotron-H's Mamba-2 layers are ``linear_attention`` too: a causal-conv state of
  ``(conv_kernel − 1) × conv_dim`` (``conv_dim = mamba_num_heads · mamba_head_dim + 2 · n_groups
  · ssm_state_size``, n_groups extended to the TP size when TP does not divide it) in the model's
  dtype, and a ``mamba_num_heads × mamba_head_dim × ssm_state_size`` SSM state in
  ``mamba_ssm_cache_dtype`` (vllm/model_executor/layers/mamba/mamba_utils.py,
  ``MambaStateShapeCalculator.mamba2_state_shape`` / ``extra_groups_for_head_shards`` and
  ``MambaStateDtypeCalculator.mamba2_state_dtype``);
* ``mlp_only``: no token mixer at all, nothing kept per request (Nemotron-H's ``-`` layers).

A Gated DeltaNet layer's weights (vllm/model_executor/models/qwen3_next.py,
``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz`` hidden × (2·key_dim + 2·value_dim), ``in_proj_ba``
hidden × 2·num_v_heads, a depthwise conv of conv_dim × kernel, ``dt_bias`` and ``A_log`` per value
head, a gated RMSNorm of ``linear_value_head_dim`` and ``out_proj`` value_dim × hidden. Qwen3-Next's
full-attention layers gate their output (``attn_output_gate``: q_proj is twice as wide).

Nemotron-H (vllm/model_executor/models/nemotron_h.py): every layer is one RMSNorm and one mixer,
``hybrid_override_pattern[i]`` says which (:func:`nemotron_h_layer_types`): attention (q, k, v, o,
no biases), a non-gated relu² MLP (``up_proj`` hidden × intermediate, ``down_proj`` back:
``NemotronHMLP``) or a Mamba-2 mixer (vllm/model_executor/layers/mamba/mamba_mixer2.py,
``MambaMixer2.__init__``, with I = mamba_num_heads · mamba_head_dim): ``in_proj`` hidden × (2·I +
2·n_groups·ssm_state_size + mamba_num_heads) (gate, x, B, C, dt), a depthwise ``conv1d`` of
conv_dim × conv_kernel (+ conv_dim biases with ``use_conv_bias``), ``A``, ``D`` and ``dt_bias`` per
head, a gated RMSNorm of I (``Mixer2RMSNormGated``) and ``out_proj`` I × hidden; a final ``norm_f``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import KvplanError, did_you_mean
from simulator.kv.quant_config import CheckpointQuant

# Bits per element of the dtypes weights and KV caches are stored in, by every accepted
# spelling (HF's torch_dtype names, vLLM's --dtype / --kv-cache-dtype names).
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
    "int8": "int8", "int4": "int4",
}
_DTYPE_BITS: dict[str, int] = {
    "float32": 32, "float16": 16, "bfloat16": 16,
    "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4,
}

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
CHUNKED_ATTENTION = "chunked_attention"
LINEAR_ATTENTION = "linear_attention"
MLP_ONLY = "mlp_only"
# Layer kinds whose per-request KV grows with the sequence (a KV cache of tokens).
TOKEN_KV_KINDS = frozenset({FULL_ATTENTION, SLIDING_ATTENTION, CHUNKED_ATTENTION})

# Recipes keyed by model_type (see the module docstring).
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})
# Qwen3.5 (vllm/model_executor/models/qwen3_5.py): Qwen3-Next's layers (Qwen3NextAttention,
# GatedDeltaNetAttention, Qwen3NextSparseMoeBlock or a dense Qwen2-MoE MLP); HF's text model types.
_QWEN3_5_TYPES = frozenset({"qwen3_5_text", "qwen3_5_moe_text"})
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "gemma3_text", "qwen3_next"}) | _QWEN3_5_TYPES
_WHOLE_QK_NORM_TYPES = frozenset({"minimax_m2"})  # q_norm / k_norm over all heads at once
_FOUR_NORM_TYPES = frozenset({"gemma2", "gemma3_text"})  # pre/post attention and MLP norms
_GPT_OSS = "gpt_oss"
# attn_output_gate: q_proj emits q and a gate
_GATED_ATTENTION_TYPES = frozenset({"qwen3_next"}) | _QWEN3_5_TYPES
_INDEXER_QUANT_BLOCK = 128  # vLLM's Indexer.quant_block_size: one fp32 scale per 128 fp8 keys
_NEMOTRON_H = "nemotron_h"
_UNGATED_MLP_TYPES = frozenset({"opt", _NEMOTRON_H})  # fc1/up -> activation -> fc2/down
# hybrid_override_pattern's characters (vllm/model_executor/models/nemotron_h.py,
# ALL_DECODER_LAYER_TYPES: "M" Mamba-2, "*" attention, "-" MLP; "E", MoE, is not modelled).
_NEMOTRON_H_KINDS = {"M": LINEAR_ATTENTION, "*": FULL_ATTENTION, "-": MLP_ONLY}


def nemotron_h_layer_types(pattern: str) -> tuple[str, ...]:
    """Each layer's kind from Nemotron-H's ``hybrid_override_pattern`` (module docstring).
    A character other than ``M``, ``*`` or ``-`` -> KvplanError."""
    unknown = sorted(set(pattern) - set(_NEMOTRON_H_KINDS))
    if unknown:
        raise KvplanError(f"hybrid_override_pattern has layer kinds kvplan does not model:"
                          f" {', '.join(map(repr, unknown))} (known: M Mamba-2, * attention,"
                          " - MLP)")
    return tuple(_NEMOTRON_H_KINDS[c] for c in pattern)


def canonical_dtype(name: str, what: str = "dtype") -> str:
    """The canonical spelling of a dtype name (``"bf16"`` -> ``"bfloat16"``).

    Raises KvplanError naming ``what`` (e.g. ``"--kv-cache-dtype"``) for an unknown name.
    """
    key = name.strip().lower()
    key = key.removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise KvplanError(f"unknown {what} '{name}'{did_you_mean(key, _DTYPE_ALIASES)}"
                          f" (known: {', '.join(sorted(_DTYPE_ALIASES))})")
    return _DTYPE_ALIASES[key]


def dtype_bits(name: str, what: str = "dtype") -> int:
    """Bits per element of dtype ``name`` (any accepted spelling)."""
    return _DTYPE_BITS[canonical_dtype(name, what)]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only transformer's shape, in the Hugging Face ``config.json`` vocabulary.

    ``model_type`` selects the layer recipe (module docstring): ``"opt"`` (2-matrix GELU MLP,
    biases, learned positions), ``"qwen2"`` (q/k/v biases), ``"gpt_oss"`` (biased experts and
    router, attention sinks), anything else Llama-like (SwiGLU, no biases). The MLA fields are
    set for DeepSeek-style latent attention, the MoE fields for mixture-of-experts models; both
    are ``None`` otherwise. ``layer_types`` is empty when every layer is full attention.
    """

    name: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    torch_dtype: str
    tie_word_embeddings: bool
    max_position_embeddings: int
    model_type: str = "llama"
    hf_id: str = ""
    attention_bias: bool = False  # q/k/v/o biases (Llama's and gpt-oss's config flag)
    # What config.json's quantization_config says (DeepSeek-V3 ships fp8 weights with
    # torch_dtype bfloat16); None = the weights are stored in torch_dtype.
    quantization: CheckpointQuant | None = None
    # Attention kind of each layer (module docstring); () = all full. sliding_window: tokens a
    # sliding layer attends to; attention_chunk_size: a chunked-local layer's chunk.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    # Gated DeltaNet (linear_attention layers): HF's linear_* fields, 0 when absent
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # Mamba-2 (linear_attention layers of Nemotron-H): HF's fields, 0 when absent. The SSM
    # state's dtype: None = torch_dtype (vLLM's mamba_ssm_cache_dtype "auto").
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    n_groups: int = 0
    conv_kernel: int = 0
    use_conv_bias: bool = False
    mamba_ssm_cache_dtype: str | None = None
    # MLA (multi-head latent attention)
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    # MoE
    n_routed_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int = 0
    n_shared_experts: int = 0
    decoder_sparse_step: int = 1  # Qwen-MoE: every k-th layer is MoE
    mlp_only_layers: tuple[int, ...] = ()  # Qwen-MoE: layer indices kept dense
    # DeepSeek Sparse Attention's lightning indexer (module docstring): HF's index_* fields, 0
    # without one. index_topk: the tokens each query's MLA attends to, chosen by the indexer.
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # The KV cache dtype the checkpoint asks vLLM for under --kv-cache-dtype auto (a ModelOpt
    # checkpoint's kv_cache_quant_algo "FP8" is "fp8_e4m3": simulator/kv/hf_config.py says
    # where vLLM reads it); None = the model dtype.
    checkpoint_kv_cache_dtype: str | None = None
    # the config.json the model was read from ("" for a catalog model): named by the errors its
    # shape meets after it is read (a tensor parallelism that does not divide its heads)
    config_path: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "hidden_size", "intermediate_size", "vocab_size",
                     "max_position_embeddings", "decoder_sparse_step"):
            _check_positive(self.name, name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise KvplanError(
                f"model '{self.name}': num_attention_heads ({self.num_attention_heads}) is not a"
                f" multiple of num_key_value_heads ({self.num_key_value_heads})")
        canonical_dtype(self.torch_dtype, f"torch_dtype of model '{self.name}'")
        if self.kv_lora_rank is not None:
            for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                _check_positive(self.name, name, getattr(self, name))
        if self.n_routed_experts is not None:
            for name in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"):
                _check_positive(self.name, name, getattr(self, name))
            if self.experts_per_token > self.num_experts:
                raise KvplanError(f"model '{self.name}': num_experts_per_tok exceeds n_routed_experts")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise KvplanError(f"model '{self.name}': first_k_dense_replace must be in"
                              f" [0, num_hidden_layers], got {self.first_k_dense_replace}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise KvplanError(f"model '{self.name}': layer_types lists {len(self.layer_types)}"
                              f" layers, num_hidden_layers is {self.num_hidden_layers}")
        if SLIDING_ATTENTION in self.layer_types:
            _check_positive(self.name, "sliding_window", self.sliding_window)
        if CHUNKED_ATTENTION in self.layer_types:
            _check_positive(self.name, "attention_chunk_size", self.attention_chunk_size)
        if LINEAR_ATTENTION in self.layer_types:
            fields = (("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                       "conv_kernel") if self.is_mamba2 else
                      ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                       "linear_value_head_dim", "linear_conv_kernel_dim"))
            for name in fields:
                _check_positive(self.name, name, getattr(self, name))
        if self.mamba_ssm_cache_dtype is not None:
            canonical_dtype(self.mamba_ssm_cache_dtype, f"mamba_ssm_cache_dtype of model '{self.name}'")
        if self.index_n_heads or self.index_head_dim or self.index_topk:
            if not self.is_mla or not self.q_lora_rank:
                raise KvplanError(f"model '{self.name}': a sparse-attention indexer (index_*)"
                                  " needs multi-head latent attention with a q_lora_rank")
            for name in ("index_n_heads", "index_head_dim", "index_topk"):
                _check_positive(self.name, name, getattr(self, name))
        if self.checkpoint_kv_cache_dtype is not None:
            canonical_dtype(self.checkpoint_kv_cache_dtype,
                            f"checkpoint KV cache dtype of model '{self.name}'")
        unknown = set(self.layer_types) - TOKEN_KV_KINDS - {LINEAR_ATTENTION, MLP_ONLY}
        if unknown:
            raise KvplanError(f"model '{self.name}': layer_types has kinds kvplan does not model:"
                              f" {', '.join(sorted(unknown))}")

    # -- shape facts ---------------------------------------------------------------------------

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one latent vector cached per token per layer)."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts is not None

    @property
    def q_per_kv(self) -> int:
        """Query heads per KV head (the GQA group; 1 = MHA, num_attention_heads = MQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model)."""
        return self.n_routed_experts or 0

    @property
    def experts_per_token(self) -> int:
        """Routed experts each token uses (0 for a dense model)."""
        return self.num_experts_per_tok or 0

    @property
    def kv_latent_width(self) -> int:
        """MLA: values cached per token per layer (kv_lora_rank + qk_rope_head_dim); 0 otherwise."""
        return (self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0) if self.is_mla else 0

    @property
    def has_sparse_indexer(self) -> bool:
        """True for DeepSeek Sparse Attention (a lightning indexer on every MLA layer)."""
        return self.index_head_dim > 0

    @property
    def indexer_cache_bytes(self) -> int:
        """DSA: bytes of one token's indexer key in one layer as vLLM caches it, whatever the KV
        dtype: ``index_head_dim`` fp8 values and one fp32 scale per 128 of them, in a uint8
        tensor of its own, one head (vllm/model_executor/models/deepseek_v2.py,
        ``Indexer.__init__``: ``head_dim + head_dim // quant_block_size * 4``, quant_block_size
        128; ``DeepseekV32IndexerCache.get_kv_cache_spec``: ``MLAAttentionSpec(num_kv_heads=1,
        dtype=torch.uint8)``); 0 without an indexer."""
        if not self.index_head_dim:
            return 0
        return self.index_head_dim + self.index_head_dim // _INDEXER_QUANT_BLOCK * 4

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
        if self.is_mla:
            return (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
        return self.head_dim

    @property
    def value_head_dim(self) -> int:
        """Per-head value width (MLA: v_head_dim)."""
        return (self.v_head_dim or 0) if self.is_mla else self.head_dim

    @property
    def num_moe_layers(self) -> int:
        """Layers with an MoE block: from ``first_k_dense_replace`` on, every
        ``decoder_sparse_step``-th layer (1-based), except ``mlp_only_layers``."""
        if not self.is_moe:
            return 0
        skipped = set(self.mlp_only_layers)
        return sum(1 for i in range(self.first_k_dense_replace, self.num_hidden_layers)
                   if (i + 1) % self.decoder_sparse_step == 0 and i not in skipped)

    @property
    def num_sliding_window_layers(self) -> int:
        return self.layer_types.count(SLIDING_ATTENTION)

    def num_layers_of(self, kind: str) -> int:
        """Layers of attention kind ``kind`` (module docstring)."""
        if not self.layer_types:
            return self.num_hidden_layers if kind == FULL_ATTENTION else 0
        return self.layer_types.count(kind)

    @property
    def num_kv_layers(self) -> int:
        """Layers that cache per-token KV (every layer but the linear-attention and MLP-only ones)."""
        return (self.num_hidden_layers - self.num_layers_of(LINEAR_ATTENTION)
                - self.num_layers_of(MLP_ONLY))

    @property
    def is_mamba2(self) -> bool:
        """True when the linear-attention layers are Mamba-2 mixers (Nemotron-H), not Gated DeltaNet."""
        return self.model_type == _NEMOTRON_H or self.mamba_num_heads > 0

    @property
    def _named(self) -> str:
        """``model 'NAME'``, after the config.json it was read from if any (for errors)."""
        return f"{self.config_path}: model '{self.name}'" if self.config_path else f"model '{self.name}'"

    @property
    def gated_mlp(self) -> bool:
        """True for a SwiGLU/GeGLU MLP (gate, up, down); False for OPT's fc1/fc2 and Nemotron-H's
        relu² up/down."""
        return self.model_type not in _UNGATED_MLP_TYPES

    @property
    def is_hybrid(self) -> bool:
        """True when some layer is not full attention (sliding, chunked-local or linear)."""
        return any(kind != FULL_ATTENTION for kind in self.layer_types)

    def attention_window(self, kind: str) -> int | None:
        """Tokens a layer of ``kind`` attends to at most: the sliding window or the chunk size
        (None for full attention and for linear attention, which keeps a state instead)."""
        if kind == SLIDING_ATTENTION:
            return self.sliding_window
        if kind == CHUNKED_ATTENTION:
            return self.attention_chunk_size
        return None

    def linear_state_elements(self, tp: int = 1) -> tuple[int, int]:
        """Gated DeltaNet or Mamba-2 state of one linear-attention layer on one of ``tp`` ranks,
        in elements: (conv state, temporal state) as vLLM shapes them (module docstring); (0, 0)
        for a model without linear-attention layers."""
        if LINEAR_ATTENTION not in self.layer_types:
            return (0, 0)
        if self.is_mamba2:
            return self._mamba2_state_elements(tp)
        k_dim, v_dim = self.linear_key_head_dim, self.linear_value_head_dim
        conv_dim = 2 * k_dim * self.linear_num_key_heads + v_dim * self.linear_num_value_heads
        if conv_dim % tp or self.linear_num_value_heads % tp:
            raise KvplanError(f"{self._named}: tensor parallel {tp} does not divide the"
                              f" {self.linear_num_value_heads} linear-attention value heads")
        conv = conv_dim // tp * (self.linear_conv_kernel_dim - 1)
        return conv, self.linear_num_value_heads // tp * k_dim * v_dim

    def _mamba2_state_elements(self, tp: int) -> tuple[int, int]:
        """``mamba2_state_shape``: n_groups extended to ``tp`` when ``tp`` does not divide it
        (``extra_groups_for_head_shards``: + tp − n_groups; MambaMixer2 allows that only for
        n_groups 1), conv state ``conv_dim / tp × (kernel − 1)``, SSM state
        ``heads / tp × head_dim × state``."""
        heads, groups = self.mamba_num_heads, self.n_groups
        if heads % tp or (groups % tp and groups != 1):
            raise KvplanError(f"{self._named}: tensor parallel {tp} does not divide the"
                              f" {heads} Mamba heads and {groups} groups (vLLM's MambaMixer2"
                              " requires both, or n_groups 1)")
        if groups % tp:
            groups = tp
        conv_dim = heads * self.mamba_head_dim + 2 * groups * self.ssm_state_size
        return (conv_dim // tp * (self.conv_kernel - 1),
                heads // tp * self.mamba_head_dim * self.ssm_state_size)

    def linear_state_bytes(self, tp: int = 1) -> int:
        """Bytes of one linear-attention layer's state on one of ``tp`` ranks: the conv state
        in the model's dtype, the temporal (SSM) state in ``mamba_ssm_cache_dtype`` (module
        docstring; vLLM's ``mamba_cache_dtype`` "auto"); 0 without linear-attention layers."""
        conv, temporal = self.linear_state_elements(tp)
        ssm_dtype = self.mamba_ssm_cache_dtype or self.torch_dtype
        return conv * dtype_bits(self.torch_dtype) // 8 + temporal * dtype_bits(ssm_dtype) // 8

    @property
    def attention_note(self) -> str | None:
        """The model's layer mix when not every layer is full attention (None otherwise): how
        many layers of each kind, with their window, chunk or state."""
        other = Counter(kind for kind in self.layer_types if kind != FULL_ATTENTION)
        if not other:
            return None
        total = self.num_hidden_layers
        parts = []
        for kind, count in sorted(other.items()):
            if kind == SLIDING_ATTENTION:
                parts.append(f"{count} of {total} layers are sliding-window {self.sliding_window}")
            elif kind == CHUNKED_ATTENTION:
                parts.append(f"{count} of {total} layers are chunked-local"
                             f" {self.attention_chunk_size}")
            elif kind == MLP_ONLY:
                parts.append(f"{count} of {total} layers are MLP only (no KV)")
            elif self.is_mamba2:
                parts.append(f"{count} of {total} layers are Mamba-2 (a fixed state per request)")
            else:
                parts.append(f"{count} of {total} layers are linear attention (a fixed state"
                             " per request)")
        return "; ".join(parts)

    # -- parameter counts ----------------------------------------------------------------------

    @property
    def embedding_lookup_params(self) -> int:
        """Parameters only gathered by token id (never read in full): the input embedding when
        it is not shared with the lm_head, plus OPT's learned positions (offset 2)."""
        positions = (self.max_position_embeddings + 2) * self.hidden_size if self._is_opt else 0
        untied = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return untied + positions

    @property
    def lm_head_params(self) -> int:
        """The output projection ``vocab × hidden`` (the embedding matrix itself when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def routed_expert_params(self) -> int:
        """Parameters of one routed expert (0 for a dense model), biases included."""
        return 3 * self.hidden_size * (self.moe_intermediate_size or 0) + self.routed_expert_bias_params

    @property
    def routed_expert_bias_params(self) -> int:
        """The biases in :attr:`routed_expert_params`: gpt-oss's gate/up and down biases."""
        inter = self.moe_intermediate_size or 0
        return 2 * inter + self.hidden_size if self.model_type == _GPT_OSS and inter else 0

    @property
    def dense_body_params(self) -> int:
        """Every parameter each token runs through except the embedding lookup, the lm_head and
        the routed experts: attention, dense MLPs, shared experts, routers and norms."""
        h = self.hidden_size
        if self.model_type == _NEMOTRON_H:
            return self._nemotron_h_body_params()
        norm = 2 * h if self._is_opt else h  # LayerNorm has a bias, RMSNorm does not
        norms = 4 if self.model_type in _FOUR_NORM_TYPES else 2
        qk_norms = self._qk_norm_params()
        per_layer = self._attention_params() + norms * norm + qk_norms
        dense_layers = self.num_hidden_layers - self.num_moe_layers
        linear = self.num_layers_of(LINEAR_ATTENTION)
        body = self.num_hidden_layers * per_layer + dense_layers * self._dense_mlp_params()
        if linear:  # Gated DeltaNet instead of attention (and its q/k norms) on those layers
            body += linear * (self._linear_attention_params() - self._attention_params() - qk_norms)
        if self.is_moe:
            moe_fixed = self.n_shared_experts * self.routed_expert_params
            moe_fixed += self.num_experts * h  # router
            if self.model_type == _GPT_OSS:
                moe_fixed += self.num_experts  # router bias
            if self.model_type in _GATED_ATTENTION_TYPES and self.n_shared_experts:
                moe_fixed += h  # Qwen3-Next's shared_expert_gate (hidden -> 1)
            body += self.num_moe_layers * moe_fixed
        return body + norm  # final norm

    @property
    def num_params(self) -> int:
        """Total parameters (all experts; a tied embedding counted once)."""
        routed = self.num_moe_layers * self.num_experts * self.routed_expert_params
        return self.embedding_lookup_params + self.lm_head_params + self.dense_body_params + routed

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses (MoE: ``num_experts_per_tok`` routed experts per layer)."""
        if not self.is_moe:
            return self.num_params
        idle = self.num_experts - self.experts_per_token
        return self.num_params - self.num_moe_layers * idle * self.routed_expert_params

    @property
    def linear_body_params(self) -> int:
        """The weight matrices of :attr:`dense_body_params` — attention projections, dense MLPs,
        shared experts — without their biases, the norms or the routers: what a quantized
        checkpoint stores at its quantized width (the routed experts come on top)."""
        if self.model_type == _NEMOTRON_H:
            return (self.num_layers_of(FULL_ATTENTION) * self._attention_matrix_params()
                    + self.num_layers_of(LINEAR_ATTENTION) * self._mamba2_matrix_params()
                    + self.num_layers_of(MLP_ONLY) * self._dense_mlp_params())
        dense_layers = self.num_hidden_layers - self.num_moe_layers
        mlp = 2 if self._is_opt else 3
        gdn = self.num_layers_of(LINEAR_ATTENTION)
        linear = (self.num_hidden_layers - gdn) * self._attention_matrix_params()
        linear += gdn * self._linear_attention_matrix_params()
        linear += dense_layers * mlp * self.hidden_size * self.intermediate_size
        return linear + self.num_moe_layers * self.n_shared_experts * self.routed_expert_params

    @property
    def _is_opt(self) -> bool:
        return self.model_type == "opt"

    def _qk_norm_params(self) -> int:
        """One attention layer's q/k norms (module docstring)."""
        if self.model_type in _QK_NORM_TYPES:
            return 2 * self.head_dim
        if self.model_type in _WHOLE_QK_NORM_TYPES:
            return (self.num_attention_heads + self.num_key_value_heads) * self.head_dim
        return 0

    def _attention_params(self) -> int:
        """One layer's attention: projection weights, biases, MLA latent norms, sinks, and a
        sparse-attention indexer's unquantized wk / weights_proj and its k_norm."""
        params = self._attention_matrix_params()
        if self.is_mla:
            params += (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)  # latent norms
            if self.has_sparse_indexer:  # wk, weights_proj; LayerNorm weight and bias
                params += (self.hidden_size * (self.index_head_dim + self.index_n_heads)
                           + 2 * self.index_head_dim)
            return params
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        if self.model_type in _QKV_BIAS_TYPES or self._is_opt or self.attention_bias:
            params += q_width + 2 * kv_width  # q/k/v biases
        if self._is_opt or self.attention_bias:
            params += self.hidden_size  # o_proj bias
        if self.model_type == _GPT_OSS:
            params += self.num_attention_heads  # one learned sink logit per head
        return params

    def _attention_matrix_params(self) -> int:
        """Attention projection weights of one layer, without biases or MLA's latent norms."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk_dim, v_dim = self.qk_head_dim, self.value_head_dim
            rank, rope = self.kv_lora_rank or 0, self.qk_rope_head_dim or 0
            q_lora = self.q_lora_rank
            q = h * q_lora + q_lora * heads * qk_dim if q_lora else h * heads * qk_dim
            kv_a = h * (rank + rope)  # latent + rope key
            kv_b = rank * heads * (qk_dim - rope + v_dim)  # latent -> per-head k_nope and v
            # a sparse-attention indexer's wq_b (its other projections stay unquantized)
            wq_b = (q_lora or 0) * self.index_n_heads * self.index_head_dim
            return q + kv_a + kv_b + heads * v_dim * h + wq_b
        q_width = heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        if self.model_type in _GATED_ATTENTION_TYPES:  # q_proj also emits the output gate
            return 3 * h * q_width + 2 * h * kv_width
        return 2 * h * q_width + 2 * h * kv_width  # q, o and k, v

    def _linear_attention_matrix_params(self) -> int:
        """A Gated DeltaNet layer's projection weights (module docstring)."""
        h = self.hidden_size
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = h * (2 * key_dim + 2 * value_dim) + h * 2 * self.linear_num_value_heads
        return in_proj + value_dim * h

    def _linear_attention_params(self) -> int:
        """A Gated DeltaNet layer: projections, depthwise conv, dt_bias, A_log, gated norm."""
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        conv = (2 * key_dim + value_dim) * self.linear_conv_kernel_dim
        return (self._linear_attention_matrix_params() + conv
                + 2 * self.linear_num_value_heads + self.linear_value_head_dim)

    def _nemotron_h_body_params(self) -> int:
        """Nemotron-H's layers (module docstring): one RMSNorm and one mixer each, a final norm."""
        h = self.hidden_size
        return (self.num_layers_of(FULL_ATTENTION) * self._attention_params()
                + self.num_layers_of(LINEAR_ATTENTION) * self._mamba2_params()
                + self.num_layers_of(MLP_ONLY) * self._dense_mlp_params()
                + self.num_hidden_layers * h + h)

    def _mamba2_matrix_params(self) -> int:
        """A Mamba-2 mixer's ``in_proj`` and ``out_proj`` (module docstring)."""
        h, inner = self.hidden_size, self.mamba_num_heads * self.mamba_head_dim
        in_proj = h * (2 * inner + 2 * self.n_groups * self.ssm_state_size + self.mamba_num_heads)
        return in_proj + inner * h

    def _mamba2_params(self) -> int:
        """A Mamba-2 mixer: projections, depthwise conv (and its bias), A, D, dt_bias, gated norm."""
        inner = self.mamba_num_heads * self.mamba_head_dim
        conv_dim = inner + 2 * self.n_groups * self.ssm_state_size
        conv = conv_dim * self.conv_kernel + (conv_dim if self.use_conv_bias else 0)
        return self._mamba2_matrix_params() + conv + 3 * self.mamba_num_heads + inner

    def _dense_mlp_params(self) -> int:
        h, inter = self.hidden_size, self.intermediate_size
        if self._is_opt:
            return 2 * h * inter + inter + h  # fc1, fc2 with biases
        if not self.gated_mlp:
            return 2 * h * inter  # Nemotron-H: up, down
        return 3 * h * inter  # SwiGLU: gate, up, down


def _check_positive(model: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KvplanError(f"model '{model}': {field} must be a positive integer, got {value!r}")


__all__ = ["CHUNKED_ATTENTION", "FULL_ATTENTION", "LINEAR_ATTENTION", "MLP_ONLY",
           "SLIDING_ATTENTION", "TOKEN_KV_KINDS", "ModelConfig", "canonical_dtype", "dtype_bits",
           "nemotron_h_layer_types"]
