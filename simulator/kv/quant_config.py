"""What a checkpoint's ``quantization_config`` (in its ``config.json``) says about its weights.

:func:`parse_quantization_config` reads the spellings the Hub's checkpoints use and returns a
:class:`CheckpointQuant`: the kvplan method (``fp8``, ``int8``, ``awq``, ``gptq``, ``mxfp4``),
the weight bits, the scale layout and whether activations are quantized too. What each format
costs in bytes and on which tensor cores it runs is decided in :mod:`simulator.kv.quantization`.

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
  (huggingface.co/openai/gpt-oss-120b/blob/main/config.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.errors import KvplanError

# The methods kvplan models, by the name kvplan (and vLLM's --quantization, where it has one)
# gives them. "int8" is W8A8 integer (vLLM reaches it through compressed-tensors checkpoints).
CHECKPOINT_METHODS: tuple[str, ...] = ("fp8", "int8", "awq", "gptq", "mxfp4")

# Scales of AWQ / GPTQ / compressed-tensors int groups are stored in 16 bits (fp16/bf16), one
# per group per output column (vLLM awq.py / gptq.py create_weights: ``scales`` of shape
# [in / group_size, out] in params_dtype).
_GROUP_SCALE_BITS = 16
# MXFP4 (OCP Microscaling Formats spec v1.0, §5): 32 FP4 (E2M1) elements share one 8-bit E8M0
# scale.
_MX_BLOCK = 32
_MX_SCALE_BITS = 8


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
        kind = {"fp8": "fp8", "int8": "int8", "mxfp4": "mxfp4"}.get(
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

    A method kvplan does not model (bitsandbytes, GGUF, NVFP4...) -> KvplanError saying so:
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
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "FP8":
        return CheckpointQuant("fp8", method, 8)
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method in ("awq", "awq_marlin"):
        return _awq(quant, method)
    if method in ("gptq", "gptq_marlin"):
        return _gptq(quant, method)
    if method == "mxfp4":
        skipped = [str(name) for name in quant.get("modules_to_not_convert") or ()]
        return CheckpointQuant("mxfp4", method, 4, _MX_BLOCK, _MX_SCALE_BITS, weight_only=True,
                               experts_only=any("self_attn" in name for name in skipped))
    algo = f" (quant_algo {quant['quant_algo']})" if "quant_algo" in quant else ""
    raise KvplanError(
        f"quantization_config quant_method '{method or '?'}'{algo} is not modelled"
        f" (known: fp8, fbgemm_fp8, modelopt FP8, compressed-tensors, awq, gptq, mxfp4);"
        " set quantization: none to size the weights in torch_dtype, an upper bound")


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
    if kind != "int" or bits not in (4, 8):
        raise KvplanError(f"quantization_config: compressed-tensors {kind} {bits}-bit weights"
                          " are not modelled (float 8, int 8, int 4)")
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
