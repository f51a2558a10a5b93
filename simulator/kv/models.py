"""Model catalog in the Hugging Face ``config.json`` vocabulary, and parameter counting.

A :class:`ModelConfig` holds the shape fields of a model's ``config.json`` under their Hugging
Face names (``num_hidden_layers``, ``num_key_value_heads``, ``kv_lora_rank``...), so a reader
can check every number against the model card. :func:`load_model` takes a catalog name (case
insensitive, Hugging Face ids accepted) or a path to a ``config.json``.

Parameter counts are derived from the tensor shapes, not copied from model cards:

* embeddings ``vocab × hidden`` (+ OPT's learned positions), an ``lm_head`` of the same shape
  unless ``tie_word_embeddings``;
* attention: q, k, v, o projections (Qwen2 adds q/k/v biases, OPT biases everywhere); MLA
  (DeepSeek) has the low-rank q_a/q_b, kv_a (latent + rope key) and kv_b projections;
* MLP: SwiGLU has three ``hidden × intermediate`` matrices (gate, up, down), OPT two (fc1, fc2)
  with biases; MoE layers have ``n_routed_experts`` + ``n_shared_experts`` SwiGLU experts of
  ``moe_intermediate_size`` and a router, and the first ``first_k_dense_replace`` layers are dense;
* norms: RMSNorm weights (LayerNorm weight + bias for OPT), two per layer plus a final one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError, did_you_mean

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

    ``model_type`` selects the layer recipe: ``"opt"`` (2-matrix GELU MLP, biases, learned
    positions), ``"qwen2"`` (q/k/v biases), anything else Llama-like (SwiGLU, no biases).
    The MLA fields are set for DeepSeek-style latent attention, the MoE fields for
    mixture-of-experts models; both are ``None`` otherwise.
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
    # Storage dtype of the weights when config.json has a quantization_config (DeepSeek-V3
    # ships fp8 weights with torch_dtype bfloat16); None = weights are in torch_dtype.
    quant_dtype: str | None = None
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

    def __post_init__(self) -> None:
        for name in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "hidden_size", "intermediate_size", "vocab_size",
                     "max_position_embeddings"):
            _check_positive(self.name, name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise KvplanError(
                f"model '{self.name}': num_attention_heads ({self.num_attention_heads}) is not a"
                f" multiple of num_key_value_heads ({self.num_key_value_heads})")
        canonical_dtype(self.torch_dtype, f"torch_dtype of model '{self.name}'")
        if self.quant_dtype is not None:
            canonical_dtype(self.quant_dtype, f"quantization dtype of model '{self.name}'")
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
        return self.num_hidden_layers - self.first_k_dense_replace if self.is_moe else 0

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
        """Parameters of one routed expert (0 for a dense model)."""
        return 3 * self.hidden_size * (self.moe_intermediate_size or 0)

    @property
    def dense_body_params(self) -> int:
        """Every parameter each token runs through except the embedding lookup, the lm_head and
        the routed experts: attention, dense MLPs, shared experts, routers and norms."""
        h = self.hidden_size
        norm = 2 * h if self._is_opt else h  # LayerNorm has a bias, RMSNorm does not
        per_layer = self._attention_params() + 2 * norm
        dense_layers = self.num_hidden_layers - self.num_moe_layers
        body = self.num_hidden_layers * per_layer + dense_layers * self._dense_mlp_params()
        if self.is_moe:
            moe_fixed = self.n_shared_experts * self.routed_expert_params
            moe_fixed += self.num_experts * h  # router
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
    def weight_dtype(self) -> str:
        """The dtype the weights are stored in: ``quant_dtype`` if quantized, else ``torch_dtype``."""
        return canonical_dtype(self.quant_dtype or self.torch_dtype)

    def weight_bytes(self, dtype: str = "auto") -> int:
        """Bytes of all weights stored in ``dtype`` (``"auto"`` = :attr:`weight_dtype`), rounded
        up (quantization scales are not counted)."""
        bits = dtype_bits(self.weight_dtype if dtype == "auto" else dtype, "weight dtype")
        return math.ceil(self.num_params * bits / 8)

    @property
    def _is_opt(self) -> bool:
        return self.model_type == "opt"

    def _attention_params(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            heads = self.num_attention_heads
            qk_dim, v_dim = self.qk_head_dim, self.value_head_dim
            rank, rope = self.kv_lora_rank or 0, self.qk_rope_head_dim or 0
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk_dim
            else:
                q = h * heads * qk_dim
            kv_a = h * (rank + rope) + rank  # latent + rope key, then the latent's norm
            kv_b = rank * heads * (qk_dim - rope + v_dim)  # latent -> per-head k_nope and v
            return q + kv_a + kv_b + heads * v_dim * h
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        params = 2 * h * q_width + 2 * h * kv_width  # q, o and k, v
        if self.model_type == "qwen2" or self._is_opt:
            params += q_width + 2 * kv_width  # q/k/v biases
        if self._is_opt:
            params += h  # out_proj bias
        return params

    def _dense_mlp_params(self) -> int:
        h, inter = self.hidden_size, self.intermediate_size
        if self._is_opt:
            return 2 * h * inter + inter + h  # fc1, fc2 with biases
        return 3 * h * inter  # SwiGLU: gate, up, down


def _check_positive(model: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KvplanError(f"model '{model}': {field} must be a positive integer, got {value!r}")

# -- catalog ------------------------------------------------------------------------------------
# Values are the public config.json of each model on the Hugging Face Hub (the first id listed).

_CATALOG: dict[str, ModelConfig] = {}
_ALIASES: dict[str, str] = {}  # lower-case name or HF id -> catalog key


def _register(model: ModelConfig, *hf_ids: str) -> None:
    key = model.name.lower()
    _CATALOG[key] = model
    _ALIASES[key] = key
    for hf_id in hf_ids:
        _ALIASES[hf_id.lower()] = key
        _ALIASES[hf_id.lower().rsplit("/", 1)[-1]] = key


def _dense(name: str, hf_ids: tuple[str, ...], layers: int, heads: int, kv_heads: int,
           hidden: int, inter: int, vocab: int, dtype: str, max_pos: int, *,
           model_type: str = "llama", tie: bool = False, head_dim: int | None = None) -> None:
    _register(ModelConfig(
        name=name, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads, hidden_size=hidden,
        intermediate_size=inter, vocab_size=vocab, torch_dtype=dtype, tie_word_embeddings=tie,
        max_position_embeddings=max_pos, model_type=model_type, hf_id=hf_ids[0] if hf_ids else "",
    ), *hf_ids)


_dense("OPT-13B", ("facebook/opt-13b",), 40, 40, 40, 5120, 20480, 50272, "float16", 2048,
       model_type="opt", tie=True)
_dense("Llama-2-7B", ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
       32, 32, 32, 4096, 11008, 32000, "float16", 4096)
_dense("Llama-2-13B", ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"),
       40, 40, 40, 5120, 13824, 32000, "float16", 4096)
_dense("Llama-2-70B", ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
       80, 64, 8, 8192, 28672, 32000, "float16", 4096)
_dense("Llama-3.1-8B", ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                        "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
       32, 32, 8, 4096, 14336, 128256, "bfloat16", 131072)
_dense("Llama-3.1-70B", ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                         "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
       80, 64, 8, 8192, 28672, 128256, "bfloat16", 131072)
_dense("Mistral-7B", ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"),
       32, 32, 8, 4096, 14336, 32000, "bfloat16", 32768, model_type="mistral")
# The -Instruct configs of Qwen2.5 say max_position_embeddings 32768 (131072 with YaRN); the
# shapes that size the KV cache and the weights are identical.
_dense("Qwen2.5-7B", ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
       28, 28, 4, 3584, 18944, 152064, "bfloat16", 131072, model_type="qwen2")
_dense("Qwen2.5-72B", ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
       80, 64, 8, 8192, 29568, 152064, "bfloat16", 131072, model_type="qwen2")
# Stack-100M: the seed chapter's capstone model (L=30, H_kv=2, d_h=64, bf16). Its other widths
# are chosen here to give ~101M parameters: hidden 512 = 8 heads × 64, SwiGLU 1408 = 2.75 × hidden.
_dense("Stack-100M", (), 30, 8, 2, 512, 1408, 32000, "bfloat16", 2048, tie=True)
# tiny: the model the real backend's CPU tests run end to end (fp32 so CPU torch is exact).
_dense("tiny", (), 2, 4, 2, 128, 256, 512, "float32", 2048)
_register(ModelConfig(
    name="DeepSeek-V3", num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
    # config.json has no head_dim; the HF default hidden/heads = 56 is unused by MLA, whose
    # widths are qk_nope/qk_rope/v_head_dim and kv_lora_rank.
    head_dim=56, hidden_size=7168, intermediate_size=18432, vocab_size=129280,
    torch_dtype="bfloat16", tie_word_embeddings=False, max_position_embeddings=163840,
    model_type="deepseek_v3", hf_id="deepseek-ai/DeepSeek-V3", quant_dtype="fp8_e4m3",
    kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128,
    n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
    first_k_dense_replace=3, n_shared_experts=1,
), "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base")


def list_models() -> tuple[str, ...]:
    """Display names of the catalog's models."""
    return tuple(model.name for model in _CATALOG.values())


def get_model(name: str) -> ModelConfig:
    """The catalog model called ``name`` (case-insensitive; HF ids such as
    ``"meta-llama/Llama-3.1-8B"`` accepted). Unknown -> KvplanError with a suggestion."""
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        known = list_models()
        hint = did_you_mean(name.strip().lower(), _ALIASES)
        raise KvplanError(f"unknown model '{name}'{hint} (known: {', '.join(known)};"
                          " or give a path to a config.json)")
    return _CATALOG[key]


def load_model(name_or_path: str | Path) -> ModelConfig:
    """A catalog model, or the model described by a local ``config.json``.

    A name ending in ``.json``, or a folder holding a ``config.json`` (a downloaded checkpoint),
    is read as a config; anything else is looked up in the catalog.
    """
    path = Path(name_or_path)
    if path.suffix == ".json":
        return _load_config_file(path)
    if (path / "config.json").is_file():
        return _load_config_file(path / "config.json")
    return get_model(str(name_or_path))


# -- config.json loading ------------------------------------------------------------------------

_REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
             "max_position_embeddings")


def _load_config_file(path: Path) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise KvplanError(f"cannot read model config {path}: {err.strerror or err}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise KvplanError(f"{path}:{err.lineno}: invalid JSON: {err.msg}") from None
    if not isinstance(raw, dict):
        raise KvplanError(f"{path}: a config.json must hold a JSON object")
    try:
        return model_from_hf_config(raw, name=str(raw.get("_name_or_path") or path.parent.name))
    except KvplanError as err:
        raise KvplanError(f"{path}: {err}") from None


def model_from_hf_config(raw: dict[str, Any], *, name: str) -> ModelConfig:
    """A ModelConfig from a parsed Hugging Face ``config.json`` (Llama, Mistral, Qwen2, OPT,
    DeepSeek-V2/V3 and Mixtral vocabularies). Missing required field -> KvplanError naming it."""
    for key in _REQUIRED:
        if raw.get(key) is None:
            raise KvplanError(f"missing required field '{key}'")
    inter_key = "ffn_dim" if raw.get("intermediate_size") is None else "intermediate_size"
    if raw.get(inter_key) is None:
        raise KvplanError("missing required field 'intermediate_size' (or OPT's 'ffn_dim')")
    model_type = str(raw.get("model_type") or "llama")
    heads = _int(raw, "num_attention_heads")
    hidden = _int(raw, "hidden_size")
    head_dim = _int(raw, "head_dim") if raw.get("head_dim") is not None else None
    if head_dim is None:
        if hidden % heads:
            raise KvplanError(f"no head_dim, and hidden_size ({hidden}) is not a multiple of"
                              f" num_attention_heads ({heads})")
        head_dim = hidden // heads
    moe: dict[str, Any] = {}
    if raw.get("n_routed_experts") is not None:  # DeepSeek
        moe = {key: _int(raw, key) for key in
               ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")}
        moe["first_k_dense_replace"] = _int(raw, "first_k_dense_replace", 0)
        moe["n_shared_experts"] = _int(raw, "n_shared_experts", 0)
    elif raw.get("num_local_experts") is not None:  # Mixtral: every layer MoE, expert = the MLP
        moe = {"n_routed_experts": _int(raw, "num_local_experts"),
               "num_experts_per_tok": _int(raw, "num_experts_per_tok"),
               "moe_intermediate_size": _int(raw, inter_key)}
    mla: dict[str, Any] = {}
    if raw.get("kv_lora_rank") is not None:
        mla = {key: _int(raw, key) for key in
               ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
        mla["q_lora_rank"] = _int(raw, "q_lora_rank") if raw.get("q_lora_rank") else None
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"  # transformers' default
    quant_dtype = _quant_dtype(raw.get("quantization_config"))
    return ModelConfig(
        name=name, num_hidden_layers=_int(raw, "num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=_int(raw, "num_key_value_heads", heads), head_dim=head_dim,
        hidden_size=hidden, intermediate_size=_int(raw, inter_key),
        vocab_size=_int(raw, "vocab_size"), torch_dtype=str(dtype),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", model_type == "opt")),
        max_position_embeddings=_int(raw, "max_position_embeddings"), model_type=model_type,
        hf_id=str(raw.get("_name_or_path") or ""), quant_dtype=quant_dtype, **mla, **moe,
    )


def _quant_dtype(quant: Any) -> str | None:
    """Weight storage dtype from a ``quantization_config``: fp8 methods -> fp8, GPTQ/AWQ-style
    ``bits`` 4 or 8 -> int4/int8; None when absent or not recognised (weights then count in
    torch_dtype, which overestimates and so stays on the safe side for capacity)."""
    if not isinstance(quant, dict):
        return None
    if str(quant.get("quant_method", "")).lower() == "fp8":
        return "fp8_e4m3"
    bits = quant.get("bits") or quant.get("w_bit")
    return {4: "int4", 8: "int8"}.get(bits) if isinstance(bits, int) else None


def _int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key)
    if value is None:
        if default is None:
            raise KvplanError(f"missing required field '{key}'")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KvplanError(f"field '{key}' must be a non-negative integer, got {value!r}")
    return value


__all__ = ["ModelConfig", "canonical_dtype", "dtype_bits", "get_model", "list_models",
           "load_model", "model_from_hf_config"]
