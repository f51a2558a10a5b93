"""Quantized weights: what vLLM's ``--quantization`` stores, streams and computes in.

:func:`resolve_quantization` turns a model, a quantization name and a GPU into a
:class:`WeightFormat`: storage bits per parameter class, the weight bytes the KV budget loses,
the bytes a step streams, and the dtype the GEMMs run in. Sizing, the roofline and the
deployment all read this one object, so they cannot disagree.

Parameter classes and what each format does to them:

=================  ====================================================  ==================
class              parameters                                            stored in
=================  ====================================================  ==================
linear             attention projections, dense MLPs, shared experts     the quantized width
expert             routed MoE experts' matrices                          the quantized width
other              embedding, lm_head, norms, biases, routers            the model dtype
=================  ====================================================  ==================

Why "other" stays in the model dtype: vLLM quantizes ``LinearBase`` layers only — the
embedding and ``ParallelLMHead`` are ``VocabParallelEmbedding`` layers its FP8/AWQ/GPTQ methods
do not touch (vllm/model_executor/layers/quantization/fp8.py ``Fp8Config.get_quant_method``),
and llm-compressor's FP8 recipes skip the lm_head (``ignore=["lm_head"]``, e.g.
huggingface.co/neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8 config.json ``"ignore": ["lm_head"]``).
MoE routers are built unquantized too (DeepSeek-V3's ``gate`` is a ``ReplicatedLinear`` with
``quant_config=None`` in vllm/model_executor/models/deepseek_v2.py), and gpt-oss's MXFP4
checkpoint keeps attention, routers, embedding and lm_head in bf16 (its
``modules_to_not_convert``). Norms are vectors, never quantized.

Bits per quantized weight (scales included, see :class:`CheckpointQuant`): fp8 / int8 8 (one
scale per tensor, channel or 128×128 block: < 0.01 bit, not counted); AWQ int4 group 128
4 + (16 + 4) / 128 = 4.156 (fp16 scale and 4-bit zero per group); GPTQ int4 group 128 the same
(GPTQ stores ``qzeros`` always); MXFP4 4 + 8 / 32 = 4.25 (an E8M0 scale per 32); NVFP4
4 + 8 / 16 = 4.5 (an FP8 E4M3 scale per 16, and a per-tensor FP32 scale, not counted).

Which tensor cores the GEMMs use (``gemm_dtype``):

* ``fp8``: W8A8 on FP8 tensor cores where the GPU has them (Hopper, Ada, MI300X); elsewhere
  vLLM runs FP8 checkpoints weight-only through the FP8 Marlin kernel (W8A16), so the GEMMs
  run in the 16-bit activation dtype — ``use_marlin = not has_device_capability(89)`` in
  vllm/model_executor/layers/quantization/fp8.py (``Fp8LinearMethod.__init__``). Weight-only
  FP8 checkpoints (compressed-tensors W8A16) compute in 16 bits everywhere.
* ``int8``: W8A8 on int8 tensor cores (:attr:`GPUSpec.dense_int8_ops`); a GPU without them is
  an error.
* ``awq``, ``gptq``: weight-only; weights are dequantized in the kernel and the GEMMs run in
  the activation dtype (Marlin W4A16 / W8A16).
* ``fp4``: W4A4 on FP4 tensor cores (:attr:`GPUSpec.dense_fp4_flops`) that take the
  checkpoint's block format (:attr:`GPUSpec.fp4_formats`). NVFP4 W4A4 (ModelOpt ``NVFP4``,
  compressed-tensors NVFP4): vLLM quantizes the activations to NVFP4 and runs CUTLASS /
  FlashInfer FP4 GEMMs where the GPU is Blackwell (``cutlass_fp4_supported``: SM100+), and
  otherwise the FP4 Marlin kernel, weight-only W4A16 (``is_fp4_marlin_supported``: SM75+) —
  ``select_nvfp4_linear_backend`` in vllm/model_executor/layers/quantization/utils/nvfp4_utils.py,
  ``select_nvfp4_moe_backend`` for the experts likewise. MXFP4 W4A4 (Quark, compressed-tensors
  MXFP4): native where the GPU takes MXFP4 — AMD Quark's ``QuarkOCP_MX`` on MI350/MI355X
  (``supports_mx``) through AITER's ``gemm_afp4wfp4``
  (vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py), and on SM100+
  FlashInfer's ``FlashInferMxFp4LinearKernel``, the first pick of ``init_mxfp4_linear_kernel``
  (vllm/model_executor/kernels/linear/mxfp4/flashinfer.py, kernels/linear/__init__.py) —
  elsewhere the weights are dequantized in the kernel (Marlin W4A16, the next pick) or
  emulated (``QuarkOCP_MX.emulate``), GEMMs in 16 bits. Weight-only FP4 (``W4A16_NVFP4``,
  NVFP4A16) runs in 16 bits everywhere.
* ``mxfp4`` of gpt-oss (``"quant_method": "mxfp4"``): weight-only on every GPU, Blackwell
  included — vLLM's MXFP4 MoE backends all take bf16 activations by default
  (``get_mxfp4_backend`` in vllm/model_executor/layers/quantization/mxfp4.py: SM100
  ``SM100_FI_MXFP4_BF16``, Hopper Triton or Marlin, ROCm Triton, all ``mxfp4_w4a16``;
  ``Mxfp4Config.get_min_capability`` 80). ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8`` (MXFP8
  activations, FP8-rate tensor cores) is opt-in and not modelled.
* ``none``: the model dtype (fp32 runs on TF32 tensor cores, see the roofline).

Names are matched by format, not by spelling: ``fp8`` on a compressed-tensors FP8 checkpoint is
accepted (the bytes are the same), where vLLM compares the method names and refuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import KvplanError, did_you_mean
from simulator.kv.gpus import GPUSpec
from simulator.kv.models import ModelConfig, canonical_dtype, dtype_bits
from simulator.kv.quant_config import CheckpointQuant

# Accepted names -> kvplan method. vLLM's --quantization names (QuantizationMethods in
# vllm/model_executor/layers/quantization/__init__.py: awq, fp8, gptq, compressed-tensors,
# mxfp4, modelopt_fp4, quark, and their Marlin/fbgemm/modelopt variants), plus "int8" / "w8a8"
# for int8 W8A8, which vLLM has no flag for (it loads such checkpoints as compressed-tensors;
# SGLang's name is w8a8_int8), and "nvfp4" for ModelOpt's NVFP4 (vLLM: modelopt_fp4). "auto" =
# the checkpoint's quantization_config; "none" = the model dtype.
QUANTIZATIONS: dict[str, str] = {
    "auto": "auto", "none": "none",
    "fp8": "fp8", "fbgemm_fp8": "fp8", "modelopt": "fp8",
    "int8": "int8", "w8a8": "int8", "w8a8_int8": "int8",
    "awq": "awq", "awq_marlin": "awq",
    "gptq": "gptq", "gptq_marlin": "gptq",
    "mxfp4": "mxfp4",
    "nvfp4": "nvfp4", "modelopt_fp4": "nvfp4",
    "compressed-tensors": "compressed-tensors", "quark": "quark",
}

# What a what-if quantization of an unquantized checkpoint is sized as: the usual published
# checkpoints of that kind. fp8 is vLLM's online quantization (per-tensor scales, dynamic
# activation scales: Fp8Config with is_checkpoint_fp8_serialized False); int8 llm-compressor's
# W8A8 recipe (per-channel weight scales); awq / gptq 4-bit with groups of 128, the AutoAWQ and
# GPTQ defaults; nvfp4 ModelOpt's NVFP4 W4A4 (every Linear but the lm_head; vLLM refuses to
# quantize to NVFP4 at load: "dynamic quantization is not supported"); mxfp4 AMD Quark's OCP
# MXFP4 W4A4 recipe (weights and activations fp4 in groups of 32, lm_head excluded).
_WHAT_IF: dict[str, CheckpointQuant] = {
    "fp8": CheckpointQuant("fp8", "fp8", 8),
    "int8": CheckpointQuant("int8", "compressed-tensors", 8),
    "awq": CheckpointQuant("awq", "awq", 4, 128, 16, zero_point=True, weight_only=True),
    "gptq": CheckpointQuant("gptq", "gptq", 4, 128, 16, zero_point=True, weight_only=True),
    "nvfp4": CheckpointQuant("nvfp4", "modelopt", 4, 16, 8),
    "mxfp4": CheckpointQuant("mxfp4", "quark", 4, 32, 8),
}
# Names that select a checkpoint container rather than a format: they match any checkpoint of
# that quant_method and cannot be applied to an unquantized one.
_CONTAINERS = ("compressed-tensors", "quark")

_STORAGE_DTYPE = {"fp8": "fp8_e4m3", "int8": "int8", "mxfp4": "mxfp4", "nvfp4": "nvfp4"}
_GEMM_DTYPES = frozenset({"bf16", "fp16", "fp32", "fp8", "int8", "fp4"})


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How one model's weights are stored and computed on one GPU (module docstring).

    Byte counts are for the whole model (divide by TP for a rank). ``dense_weight_bytes`` is
    what every step streams: all weights except the embedding lookup and the routed experts
    (the lm_head is read in full). ``expert_bytes`` is one routed expert.
    """

    quantization: str  # kvplan method: none | fp8 | int8 | awq | gptq | mxfp4 | nvfp4
    origin: str  # checkpoint | online (vLLM quantizes at load) | what-if | unquantized
    model_dtype: str  # canonical torch_dtype: the "other" class, and activations
    weight_dtype: str  # storage of the quantized linears: fp8_e4m3, int8, int4, mxfp4, nvfp4 (or model_dtype)
    linear_bits: float  # per attention / dense-MLP / shared-expert weight, scales included
    expert_bits: float  # per routed-expert weight, scales included
    other_bits: int  # per embedding / lm_head / norm / bias / router parameter
    gemm_dtype: str  # bf16 | fp16 | fp32 | fp8 | int8 | fp4: the tensor cores the GEMMs run on
    weight_bytes: int
    dense_weight_bytes: int
    expert_bytes: int
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.gemm_dtype in _GEMM_DTYPES, self.gemm_dtype
        assert 0 < self.linear_bits <= 32 and 0 < self.expert_bits <= 32
        assert 0 <= self.dense_weight_bytes <= self.weight_bytes
        assert 0 <= self.expert_bytes <= self.weight_bytes

    def describe(self) -> dict[str, object]:
        """JSON-serialisable summary for run.json and ``kvplan size --json``."""
        return {"quantization": self.quantization, "origin": self.origin,
                "weight_dtype": self.weight_dtype, "gemm_dtype": self.gemm_dtype,
                "linear_bits": self.linear_bits, "expert_bits": self.expert_bits,
                "other_bits": self.other_bits, "weight_bytes": self.weight_bytes}


def canonical_quantization(name: str) -> str:
    """The kvplan method for a quantization name (``"awq_marlin"`` -> ``"awq"``).

    Unknown -> KvplanError with a did-you-mean and the accepted names.
    """
    key = str(name).strip().lower()
    if key not in QUANTIZATIONS:
        raise KvplanError(f"unknown quantization '{name}'{did_you_mean(key, QUANTIZATIONS)}"
                          f" (known: {', '.join(QUANTIZATIONS)})")
    return QUANTIZATIONS[key]


def resolve_quantization(model: ModelConfig, quantization: str, gpu: GPUSpec) -> WeightFormat:
    """The weight format vLLM would use for ``model`` with ``--quantization quantization`` on
    ``gpu``.

    ``auto`` takes the checkpoint's ``quantization_config`` (none = the model dtype). A method
    on an unquantized checkpoint is sized as the usual checkpoint of that kind (fp8: vLLM's
    online quantization) and says so in the notes; a method that contradicts the checkpoint's
    is an error, as in vLLM. Raises KvplanError for unknown names, mismatches and a format
    ``gpu`` cannot run (int8 without int8 tensor cores).
    """
    method = canonical_quantization(quantization)
    ckpt = model.quantization
    notes: list[str] = []
    if method == "none" or (method == "auto" and ckpt is None):
        if ckpt is not None:
            notes.append(f"weights sized in {canonical_dtype(model.torch_dtype)} (quantization:"
                         f" none) although the checkpoint is {ckpt.describe()}")
        return _unquantized(model, tuple(notes))
    if method != "auto" and ckpt is not None and not _matches(method, ckpt):
        # vLLM refuses this too: "Quantization method specified in the model config (...) does
        # not match the quantization method specified in the `quantization` argument (...)"
        # (vllm/config ModelConfig._verify_quantization).
        raise KvplanError(f"quantization '{quantization}' does not match {model.name}'s"
                          f" checkpoint ({ckpt.describe()}); use quantization: auto")
    origin = "checkpoint"
    if ckpt is None:
        if method in _CONTAINERS:
            raise KvplanError(f"quantization '{quantization}' needs a checkpoint quantized that"
                              f" way; {model.name} has no quantization_config")
        ckpt = _WHAT_IF[method]
        origin = "online" if method == "fp8" else "what-if"
        notes.append(f"{model.name}: vLLM quantizes the weights to FP8 at load time"
                     " (--quantization fp8)" if origin == "online" else
                     f"{model.name} sized as a checkpoint quantized {ckpt.describe()}"
                     " (vLLM needs such a checkpoint)")
    gemm = _gemm_dtype(ckpt, model, gpu, notes)
    return _quantized(model, ckpt, origin, gemm, tuple(notes))


def _matches(method: str, ckpt: CheckpointQuant) -> bool:
    if method in _CONTAINERS:
        return ckpt.quant_method == method
    return method == ckpt.method


def _activation_dtype(model: ModelConfig) -> str:
    """The dtype activations (and weight-only GEMMs) run in: the model's 16- or 32-bit dtype."""
    return {"float32": "fp32", "float16": "fp16"}.get(canonical_dtype(model.torch_dtype), "bf16")


def _gemm_dtype(ckpt: CheckpointQuant, model: ModelConfig, gpu: GPUSpec,
                notes: list[str]) -> str:
    act = _activation_dtype(model)
    if ckpt.method in ("nvfp4", "mxfp4"):
        return _fp4_gemm_dtype(ckpt, model, gpu, act, notes)
    if ckpt.weight_only:
        return act
    if ckpt.method == "fp8":
        if gpu.dense_fp8_flops > 0:
            return "fp8"
        notes.append(f"{gpu.name} has no FP8 tensor cores: vLLM runs the FP8 weights"
                     f" weight-only (FP8 Marlin, W8A16), GEMMs in {act}")
        return act
    assert ckpt.method == "int8", ckpt.method
    if gpu.dense_int8_ops <= 0:
        raise KvplanError(f"quantization int8 (W8A8) needs int8 tensor cores, which {gpu.name}"
                          " does not have; use fp8, awq or gptq")
    return "int8"


def _fp4_gemm_dtype(ckpt: CheckpointQuant, model: ModelConfig, gpu: GPUSpec, act: str,
                    notes: list[str]) -> str:
    """fp4 for W4A4 on FP4 tensor cores that take the checkpoint's block format, else the
    activation dtype (module docstring: which vLLM backend runs it, and why)."""
    native = gpu.dense_fp4_flops > 0 and ckpt.method in gpu.fp4_formats
    if ckpt.weight_only:
        if native and ckpt.quant_method == "mxfp4":
            notes.append(f"{model.name}'s MXFP4 experts run weight-only on {gpu.name} too: vLLM's"
                         f" MXFP4 MoE backends take {act} activations by default, GEMMs in {act}"
                         " (MXFP8 activations, VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8, are not"
                         " modelled)")
        return act
    if native:
        return "fp4"
    if ckpt.method == "nvfp4":
        notes.append(f"{gpu.name} has no NVFP4 tensor cores: vLLM runs the NVFP4 weights"
                     f" weight-only (W4A16: FP4 Marlin on CUDA GPUs), GEMMs in {act}")
    else:
        notes.append(f"{gpu.name} has no MXFP4 tensor cores: vLLM dequantizes the MXFP4 weights"
                     f" in the kernel (Marlin W4A16, or emulation), GEMMs in {act}")
    return act


def _unquantized(model: ModelConfig, notes: tuple[str, ...]) -> WeightFormat:
    dtype = canonical_dtype(model.torch_dtype)
    bits = dtype_bits(dtype)
    return _format(model, "none", "unquantized", dtype, float(bits), float(bits),
                   _activation_dtype(model), notes)


def _quantized(model: ModelConfig, ckpt: CheckpointQuant, origin: str, gemm: str,
               notes: tuple[str, ...]) -> WeightFormat:
    model_bits = float(dtype_bits(model.torch_dtype))
    linear_bits = model_bits if ckpt.experts_only else ckpt.bits_per_weight
    storage = _STORAGE_DTYPE.get(ckpt.method, f"int{ckpt.bits}")
    return _format(model, ckpt.method, origin, storage, linear_bits, ckpt.bits_per_weight,
                   gemm, notes)


def _format(model: ModelConfig, method: str, origin: str, weight_dtype: str,
            linear_bits: float, expert_bits: float, gemm: str,
            notes: tuple[str, ...]) -> WeightFormat:
    other_bits = dtype_bits(model.torch_dtype)
    linear = model.linear_body_params
    other_streamed = model.dense_body_params - linear + model.lm_head_params
    dense_bits = linear * linear_bits + other_streamed * other_bits
    # One routed expert: its matrices at the experts' width, its biases (gpt-oss) unquantized.
    bias = model.routed_expert_bias_params
    expert = (model.routed_expert_params - bias) * expert_bits + bias * other_bits
    num_experts = model.num_moe_layers * model.num_experts
    total_bits = dense_bits + model.embedding_lookup_params * other_bits + num_experts * expert
    return WeightFormat(
        quantization=method, origin=origin, model_dtype=canonical_dtype(model.torch_dtype),
        weight_dtype=weight_dtype, linear_bits=linear_bits, expert_bits=expert_bits,
        other_bits=other_bits, gemm_dtype=gemm, weight_bytes=math.ceil(total_bits / 8),
        dense_weight_bytes=math.ceil(dense_bits / 8), expert_bytes=math.ceil(expert / 8),
        notes=notes)


__all__ = ["QUANTIZATIONS", "WeightFormat", "canonical_quantization", "resolve_quantization"]
