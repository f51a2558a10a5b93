"""What a checkpoint's ``quantization_config`` (in its ``config.json``) says about its weights.

:func:`parse_quantization_config` reads the spellings the Hub's checkpoints use and returns a
:class:`CheckpointQuant`: the kvplan method (``fp8``, ``int8``, ``awq``, ``gptq``, ``mxfp4``),
``nvfp4``), the weight bits, the scale layout and whether activations are quantized too. What
each format costs in bytes and on which tensor cores it runs is decided in
:mod:`simulator.kv.quantization`.

Spellings handled (each as the named checkpoints write it):

* ``"quant_method": "fp8"`` — vLLM's own FP8 format: DeepSeek-V3/R1 (``"fmt": "e4m3"``,
  ``"weight_block_size": [128, 128]``, ``"activation_scheme": "dynamic"``,
  huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json); also ``fbgemm_fp8``
  (meta-llama/Llama-3.1-405B-Instruct-FP8) and ModelOpt ``"quant_algo": "FP8"``.
* ``"quant_method": "compressed-tensors"`` — llm-compressor's checkpoints (RedHatAI/neuralmagic):
  ``config_groups.<group>.weights`` gives ``num_bits``, ``type`` (``float`` | ``int``),
  ``strategy`` (``tensor`` | ``channel`` | ``group`` | ``block``), ``group_size``, ``symmetric``;
  ``input_activations`` is null for weight-only schemes (W4A16, W8A16). FP8 = 8-bit ``float``
  (huggingface.co/neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8/blob/main/config.json).
* ``"quant_method": "awq"`` — ``bits``, ``group_size``, ``zero_point`` (AutoAWQ's exports; the
  original quant_config.json spelling ``w_bit`` / ``q_group_size`` is accepted too).
* ``"quant_method": "gptq"`` — ``bits`` (4 or 8), ``group_size`` (``-1`` = one group per
  column), ``sym``, ``desc_act``.
* ``"quant_method": "mxfp4"`` — gpt-oss: MXFP4 experts, and ``modules_to_not_convert`` lists
  ``model.layers.*.self_attn``, the routers, the embedding and the lm_head, which stay bf16
  (huggingface.co/openai/gpt-oss-120b/blob/main/config.json). Its activations stay bf16: vLLM's
  ``Mxfp4Config`` runs only the MoE experts in MXFP4, with bf16 activations
  (``get_supported_act_dtypes``) — weight-only.
* ``"quant_method": "modelopt"`` with ``"quant_algo": "NVFP4"`` (or ``"W4A16_NVFP4"``) —
  NVIDIA ModelOpt's NVFP4 checkpoints: FP4 (E2M1) weights in blocks of ``group_size`` (16)
  with one FP8 E4M3 scale each, plus one FP32 scale per tensor (``weight_scale_2``, and
  ``input_scale`` for the activations of W4A4); ``ignore`` / ``exclude_modules`` lists what
  stays in the model dtype (vllm/model_executor/layers/quantization/modelopt.py
  ``ModelOptNvFp4Config`` and ``QUANT_ALGOS``: "NVFP4 W4A4", "W4A16_NVFP4"). The legacy
  ``hf_quant_config.json`` nesting (``{"quantization": {"quant_algo": ...}}``) is read too.
* ``"quant_method": "compressed-tensors"`` with 4-bit ``float`` weights — llm-compressor's NVFP4
  (``group_size`` 16, ``strategy`` ``tensor_group``; ``input_activations`` the same for W4A4,
  null for NVFP4A16) and MXFP4 (``group_size`` 32) schemes.
* ``"quant_method": "quark"`` with ``"dtype": "fp4"`` weights — AMD Quark's OCP MXFP4
  checkpoints (``global_quant_config.weight``: ``qscheme`` ``per_group``, ``group_size`` 32;
  ``input_tensors`` fp4 for W4A4), which vLLM runs natively on MI350/MI355X
  (vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.errors import KvplanError

# The methods kvplan models, by the name kvplan (and vLLM's --quantization, where it has one)
# gives them. "int8" is W8A8 integer (vLLM reaches it through compressed-tensors checkpoints).
CHECKPOINT_METHODS: tuple[str, ...] = ("fp8", "int8", "awq", "gptq", "mxfp4", "nvfp4")

# Scales of AWQ / GPTQ / compressed-tensors int groups are stored in 16 bits (fp16/bf16), one
# per group per output column (vLLM awq.py / gptq.py create_weights: ``scales`` of shape
# [in / group_size, out] in params_dtype).
_GROUP_SCALE_BITS = 16
# MXFP4 (OCP Microscaling Formats spec v1.0, §5): 32 FP4 (E2M1) elements share one 8-bit E8M0
# scale.
_MX_BLOCK = 32
_MX_SCALE_BITS = 8
# NVFP4: 16 FP4 (E2M1) elements share one FP8 E4M3 scale, and each tensor has one FP32 scale
# on top (``weight_scale`` of shape [out, in / 16] in float8_e4m3fn, ``weight_scale_2`` a
# scalar: vllm modelopt.py ``ModelOptNvFp4LinearMethod.create_weights``). 4 + 8 / 16 = 4.5 bits;
# the per-tensor scales are < 0.01 bit and not counted.
_NV_BLOCK = 16
_NV_SCALE_BITS = 8


@dataclass(frozen=True, slots=True)
class CheckpointQuant:
    """How a checkpoint stores its quantized linear weights.

    ``group_size`` is the number of weights that share one scale; 0 means one scale per tensor,
    per output channel or per 2-D block of ≥ 128×128 (their overhead is under 0.01 bit per
    weight and is not counted). ``zero_point``: an integer zero point of ``bits`` bits is stored
    per group as well (AWQ; GPTQ always stores ``qzeros``). ``weight_only``: activations stay
    16-bit (W4A16, W8A16), so GEMMs run on 16-bit tensor cores. ``experts_only``: only the
    routed MoE experts are quantized (gpt-oss MXFP4); attention stays in the model dtype.
    """

    method: str  # one of CHECKPOINT_METHODS
    quant_method: str  # as config.json spells it
    bits: int
    group_size: int = 0
    scale_bits: int = 0  # bits of one group scale (0 when group_size is 0)
    zero_point: bool = False
    weight_only: bool = False
    experts_only: bool = False

    def __post_init__(self) -> None:
        assert self.method in CHECKPOINT_METHODS, self.method
        assert self.bits in (4, 8), self.bits
        assert self.group_size >= 0 and (self.scale_bits > 0) == (self.group_size > 0)

    @property
    def bits_per_weight(self) -> float:
        """Storage bits of one quantized weight, its share of the group's scale and zero point
        included (AWQ 4-bit, group 128: 4 + (16 + 4) / 128 = 4.156)."""
        if not self.group_size:
            return float(self.bits)
        zero_bits = self.bits if self.zero_point else 0
        return self.bits + (self.scale_bits + zero_bits) / self.group_size

    def describe(self) -> str:
        """``"awq int4, group 128, weight-only"``: one phrase for notes and reports."""
        kind = {"fp8": "fp8", "int8": "int8", "mxfp4": "mxfp4", "nvfp4": "nvfp4"}.get(
            self.method, f"int{self.bits}")
        parts = [kind if kind == self.quant_method else f"{self.quant_method} {kind}"]
        if self.group_size:
            parts.append(f"group {self.group_size}")
        parts.append("weight-only" if self.weight_only else "weights and activations")
        if self.experts_only:
            parts.append("MoE experts only")
        return ", ".join(parts)


def parse_quantization_config(quant: Any) -> CheckpointQuant | None:
    """The :class:`CheckpointQuant` a ``quantization_config`` describes (None when absent).

    A method kvplan does not model (bitsandbytes, GGUF, ModelOpt MIXED_PRECISION...) ->
    KvplanError saying so:
    guessing its bytes would mislead the capacity, and ``quantization: none`` sizes the weights
    in the model's dtype instead (an upper bound).
    """
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise KvplanError(f"quantization_config must be an object, got {quant!r}")
    method = str(quant.get("quant_method", "")).strip().lower()
    if method in ("fp8", "fbgemm_fp8"):
        return CheckpointQuant("fp8", method, 8)
    if method == "modelopt":
        modelopt = _modelopt(quant)
        if modelopt is not None:
            return modelopt
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method in ("awq", "awq_marlin"):
        return _awq(quant, method)
    if method in ("gptq", "gptq_marlin"):
        return _gptq(quant, method)
    if method == "mxfp4":
        return CheckpointQuant("mxfp4", method, 4, _MX_BLOCK, _MX_SCALE_BITS, weight_only=True,
                               experts_only=_skips_attention(quant.get("modules_to_not_convert")))
    if method == "quark":
        return _quark(quant)
    algo = f" (quant_algo {_modelopt_algo(quant)})" if _modelopt_algo(quant) else ""
    raise KvplanError(
        f"quantization_config quant_method '{method or '?'}'{algo} is not modelled"
        f" (known: fp8, fbgemm_fp8, modelopt FP8 / NVFP4 / W4A16_NVFP4, compressed-tensors,"
        " awq, gptq, mxfp4, quark MXFP4); set quantization: none to size the weights in"
        " torch_dtype, an upper bound")


def _skips_attention(names: Any) -> bool:
    """Whether a checkpoint's list of unquantized modules keeps the attention in the model
    dtype (gpt-oss: ``model.layers.*.self_attn``): kvplan then quantizes the routed experts only."""
    return any("self_attn" in str(name) for name in names or ())


def _modelopt_algo(quant: dict[str, Any]) -> str:
    """ModelOpt's ``quant_algo``, upper-cased, from config.json's flat spelling or the legacy
    ``hf_quant_config.json`` nesting under ``quantization`` (vllm modelopt.py
    ``_extract_modelopt_quant_algo``)."""
    nested = quant.get("quantization")
    source = nested if isinstance(nested, dict) else quant
    return str(source.get("quant_algo") or "").strip().upper()


def _modelopt(quant: dict[str, Any]) -> CheckpointQuant | None:
    """A ModelOpt checkpoint kvplan models: FP8, NVFP4 (W4A4) or W4A16_NVFP4; None otherwise."""
    algo = _modelopt_algo(quant)
    if algo == "FP8":
        return CheckpointQuant("fp8", "modelopt", 8)
    if algo not in ("NVFP4", "W4A16_NVFP4"):
        return None
    nested = quant.get("quantization")
    source = nested if isinstance(nested, dict) else quant
    group = _field(source, ("group_size",), _NV_BLOCK)
    if group != _NV_BLOCK:
        raise KvplanError(f"quantization_config: modelopt {algo} with group_size {group} is not"
                          f" modelled (NVFP4 blocks are {_NV_BLOCK} elements)")
    skipped = source.get("exclude_modules", source.get("ignore"))
    return CheckpointQuant("nvfp4", "modelopt", 4, _NV_BLOCK, _NV_SCALE_BITS,
                           weight_only=algo == "W4A16_NVFP4",
                           experts_only=_skips_attention(skipped))


def _quark(quant: dict[str, Any]) -> CheckpointQuant:
    """AMD Quark's OCP MXFP4 checkpoints (weights fp4 in groups of 32, E8M0 scales); other Quark
    schemes are not modelled."""
    glob = quant.get("global_quant_config")
    weight = glob.get("weight") if isinstance(glob, dict) else None
    dtype = str(weight.get("dtype", "")).lower() if isinstance(weight, dict) else ""
    if dtype != "fp4":
        raise KvplanError(f"quantization_config: quark with {dtype or 'no'} weights is not"
                          " modelled (quark fp4, OCP MXFP4, is); set quantization: none to size"
                          " the weights in torch_dtype, an upper bound")
    assert isinstance(weight, dict) and isinstance(glob, dict)
    group = _field(weight, ("group_size",), _MX_BLOCK)
    if group != _MX_BLOCK:
        raise KvplanError(f"quantization_config: quark fp4 with group_size {group} is not"
                          f" modelled (OCP MXFP4 blocks are {_MX_BLOCK} elements)")
    inputs = glob.get("input_tensors")
    w4a4 = isinstance(inputs, dict) and str(inputs.get("dtype", "")).lower() == "fp4"
    return CheckpointQuant("mxfp4", "quark", 4, _MX_BLOCK, _MX_SCALE_BITS, weight_only=not w4a4,
                           experts_only=_skips_attention(quant.get("exclude")))


def _awq(quant: dict[str, Any], method: str) -> CheckpointQuant:
    bits = _field(quant, ("bits", "w_bit"), 4)
    group = _field(quant, ("group_size", "q_group_size"), 128)
    zero = quant.get("zero_point", True) is not False
    if bits != 4:
        raise KvplanError(f"quantization_config: awq with {bits} bits is not modelled (AWQ is"
                          " 4-bit in vLLM)")
    return _grouped("awq", method, bits, group, zero_point=zero)


def _gptq(quant: dict[str, Any], method: str) -> CheckpointQuant:
    bits = _field(quant, ("bits",), 4)
    group = _field(quant, ("group_size",), 128)
    if bits not in (4, 8):
        raise KvplanError(f"quantization_config: gptq with {bits} bits is not modelled"
                          " (4 or 8)")
    # GPTQ checkpoints carry qzeros whether or not sym is set (vLLM gptq.py create_weights).
    return _grouped("gptq", method, bits, group, zero_point=True)


def _compressed_tensors(quant: dict[str, Any]) -> CheckpointQuant:
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise KvplanError("quantization_config: compressed-tensors without config_groups")
    # The scheme that targets Linear layers sizes the weights; checkpoints have one group.
    scheme = next((g for g in groups.values()
                   if isinstance(g, dict) and "Linear" in (g.get("targets") or ())),
                  next(iter(groups.values())))
    weights = scheme.get("weights") if isinstance(scheme, dict) else None
    if not isinstance(weights, dict):
        raise KvplanError("quantization_config: compressed-tensors group without 'weights'")
    bits = _field(weights, ("num_bits",), None)
    kind = str(weights.get("type", "int")).lower()
    weight_only = not scheme.get("input_activations")
    if kind == "float" and bits == 8:
        return CheckpointQuant("fp8", "compressed-tensors", 8, weight_only=weight_only)
    if kind == "float" and bits == 4:
        # NVFP4 (blocks of 16, FP8 E4M3 scales) or MXFP4 (blocks of 32, E8M0 scales): the
        # block size tells them apart; both are 1-byte scales.
        group = _field(weights, ("group_size",), 0)
        method = {_NV_BLOCK: "nvfp4", _MX_BLOCK: "mxfp4"}.get(group)
        if method is None:
            raise KvplanError(f"quantization_config: compressed-tensors float 4-bit weights with"
                              f" group_size {group or 'none'} are not modelled (16: NVFP4,"
                              " 32: MXFP4)")
        return CheckpointQuant(method, "compressed-tensors", 4, group, 8,
                               weight_only=weight_only,
                               experts_only=_skips_attention(quant.get("ignore")))
    if kind != "int" or bits not in (4, 8):
        raise KvplanError(f"quantization_config: compressed-tensors {kind} {bits}-bit weights"
                          " are not modelled (float 8, float 4, int 8, int 4)")
    zero = weights.get("symmetric", True) is False
    strategy = str(weights.get("strategy", "channel")).lower()
    group = _field(weights, ("group_size",), 0) if strategy == "group" else 0
    if not weight_only:
        if bits != 8:
            raise KvplanError("quantization_config: compressed-tensors int4 with quantized"
                              " activations (W4A8) is not modelled")
        return CheckpointQuant("int8", "compressed-tensors", 8, zero_point=False)
    # Integer weight-only (W4A16 / W8A16): llm-compressor makes these with GPTQ, and vLLM runs
    # them with the same Marlin kernels as GPTQ checkpoints.
    return _grouped("gptq", "compressed-tensors", bits, group, zero_point=zero)


def _grouped(method: str, quant_method: str, bits: int, group: int, *,
             zero_point: bool) -> CheckpointQuant:
    if group < 0:  # -1: one group spanning each whole input column
        group = 0
    return CheckpointQuant(method, quant_method, bits, group,
                           _GROUP_SCALE_BITS if group else 0, zero_point=zero_point and group > 0,
                           weight_only=True)


def _field(raw: dict[str, Any], keys: tuple[str, ...], default: int | None) -> int:
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise KvplanError(f"quantization_config: '{key}' must be an integer, got {value!r}")
        return value
    if default is None:
        raise KvplanError(f"quantization_config: missing '{keys[0]}'")
    return default


__all__ = ["CHECKPOINT_METHODS", "CheckpointQuant", "parse_quantization_config"]
