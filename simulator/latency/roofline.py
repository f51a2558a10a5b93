"""Roofline step latency: how long one engine step takes, from the model and GPU catalogs.

Per tensor-parallel rank, for a step with T = prefill tokens + decode sequences::

    time = max(bytes_moved / (HBM_BW × mem_efficiency), flops / (peak × flops_efficiency))
         + all_reduce + swap + copy-on-write + step_overhead_s

    bytes_moved = weights read                        (dense part + lm_head) × w / TP
                                                      + MoE: experts touched × expert × w / TP
                + KV read     Σ context tokens × β    (prefill chunks' contexts + decode contexts)
                + KV written  T × β
    flops       = 2 × (active params − embedding − lm_head) / TP × T
                + 2 × lm_head / TP × sequences sampled this step
                + 2 × pairs × H_q/TP × (d_qk + d_v) × L      prefill (causal (query, key) pairs)
                + 2 × Σ decode context × H_q/TP × (d_qk + d_v) × L                      decode
    all_reduce  = 2 per layer × (2(TP−1)/TP × T × hidden × a / interconnect_BW + latency)
    swap        = swapped blocks × block_size × β / PCIe_BW
    copy        = copied blocks × 2 × block_size × β / (HBM_BW × mem_efficiency)

β is the per-rank KV bytes per token, w the weight bytes per parameter, a the activation bytes
(16-bit, or 4 for fp32 models). With d_qk = d_v = d_h the attention terms are the familiar
4 × pairs × H × d_h × L. MLA prefill uses d_qk = qk_nope + qk_rope, d_v = v_head_dim; MLA decode
runs in the latent space (weights absorbed), so d_qk = kv_lora_rank + qk_rope, d_v = kv_lora_rank.

Choices the formula makes, and why:

* The embedding table is gathered, not streamed (T rows), so it is not counted as weight
  traffic; the lm_head is (it reads all ``vocab × hidden`` weights) but computes logits only
  for the sequences that sample a token this step, as vLLM does.
* An MoE layer reads only the experts its tokens route to; with uniform routing of k of E
  experts per token, T tokens touch E·(1 − (1 − k/E)^T) distinct experts on average.
* Peak FLOP/s follows the weight dtype: fp8 weights use the fp8 tensor cores where the GPU has
  them; fp32 runs TF32 at half the bf16 rate; int8/int4 weight-only formats compute in bf16.
* What is not modelled: kernel launch gaps beyond ``step_overhead_s``, activation traffic,
  split-K effects of one very long sequence, and compute/communication overlap. The calibrated
  ``profile`` model captures those from measurements.

An empty plan (nothing to compute and nothing to copy) costs 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import KvplanError
from simulator.kv.gpus import GPUSpec
from simulator.kv.models import ModelConfig, canonical_dtype, dtype_bits
from simulator.kv.sizing import model_kv_layout
from simulator.plan import StepPlan


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step's roofline terms on one rank (bytes, FLOPs, and the seconds they cost)."""

    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    allreduce_s: float
    transfer_s: float  # swap (PCIe) and copy-on-write (HBM) block copies
    overhead_s: float

    @property
    def bytes_moved(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def total_s(self) -> float:
        return (max(self.memory_s, self.compute_s) + self.allreduce_s + self.transfer_s
                + self.overhead_s)

    @property
    def compute_bound(self) -> bool:
        return self.compute_s > self.memory_s


_ZERO = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class RooflineLatency:
    """Step latency from bytes moved and FLOPs per rank (formula in the module docstring)."""

    def __init__(self, model: ModelConfig, gpu: GPUSpec, *, tp: int = 1,
                 kv_cache_dtype: str = "auto", weight_dtype: str = "auto", block_size: int = 16,
                 mem_efficiency: float = 0.8, flops_efficiency: float = 0.6,
                 step_overhead_s: float = 0.003, allreduce_latency_s: float = 0.0) -> None:
        """Raises KvplanError for efficiencies outside (0, 1], negative times, block_size < 1
        or a tp that does not divide the model's heads."""
        for name, value in (("mem_efficiency", mem_efficiency),
                            ("flops_efficiency", flops_efficiency)):
            if not 0 < value <= 1:
                raise KvplanError(f"roofline {name} must be in (0, 1], got {value}")
        for name, value in (("step_overhead_s", step_overhead_s),
                            ("allreduce_latency_s", allreduce_latency_s)):
            if value < 0:
                raise KvplanError(f"roofline {name} must be >= 0, got {value}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise KvplanError(f"block size must be a positive integer, got {block_size!r}")
        self.model, self.gpu, self.tp, self.block_size = model, gpu, tp, block_size
        self.mem_efficiency, self.flops_efficiency = mem_efficiency, flops_efficiency
        self.step_overhead_s, self.allreduce_latency_s = step_overhead_s, allreduce_latency_s
        layout = model_kv_layout(model, kv_cache_dtype, tp)  # validates tp against the heads
        self.kv_cache_dtype = layout.dtype
        self.bytes_per_token = layout.bytes_per_token
        self.block_bytes = block_size * self.bytes_per_token
        self.weight_dtype = model.weight_dtype if weight_dtype == "auto" else canonical_dtype(
            weight_dtype, "weight dtype")
        weight_b = dtype_bits(self.weight_dtype) / 8
        self._act_bytes = 4 if dtype_bits(model.torch_dtype) == 32 else 2
        self.peak_flops = _peak_flops(gpu, self.weight_dtype)

        self._dense_weight_bytes = (model.dense_body_params + model.lm_head_params) * weight_b / tp
        self._expert_bytes = model.routed_expert_params * weight_b / tp
        self._num_experts = model.num_experts
        self._experts_per_tok = model.experts_per_token
        active_body = (model.dense_body_params
                       + model.num_moe_layers * self._experts_per_tok * model.routed_expert_params)
        self._flops_per_token = 2 * active_body / tp
        self._flops_per_sample = 2 * model.lm_head_params / tp
        heads = model.num_attention_heads / tp
        layers = model.num_hidden_layers
        self._prefill_flops_per_pair = 2 * heads * (model.qk_head_dim + model.value_head_dim) * layers
        self._decode_flops_per_ctx = self._prefill_flops_per_pair
        if model.is_mla:  # decode attends in the latent space: d_qk = latent, d_v = kv_lora_rank
            decode_dims = model.kv_latent_width + (model.kv_lora_rank or 0)
            self._decode_flops_per_ctx = 2 * heads * decode_dims * layers

    def step_latency_s(self, plan: StepPlan) -> float:
        """Seconds the step takes (0 for a plan with no work); equals ``step_cost(plan).total_s``.

        This is the simulator's hot path (one call per step), so the common case — a decode
        step without copies on a dense model at TP 1 — is computed inline.
        """
        if (plan.prefills or plan.cow_copies or plan.num_swap_out_blocks or plan.num_swap_in_blocks
                or self.tp > 1 or self._num_experts or not plan.num_decode_seqs):
            return self.step_cost(plan).total_s
        n = plan.num_decode_seqs
        ctx = plan.decode_context_tokens
        bpt = self.bytes_per_token
        memory_s = (self._dense_weight_bytes + ctx * bpt + n * bpt) / self._hbm_bytes_s
        compute_s = (self._flops_per_token * n + self._flops_per_sample * n
                     + self._decode_flops_per_ctx * ctx) / (self.peak_flops * self.flops_efficiency)
        return (memory_s if memory_s >= compute_s else compute_s) + 0.0 + 0.0 + self.step_overhead_s

    def step_cost(self, plan: StepPlan) -> StepCost:
        """The step's terms, for reports and tests."""
        num_copies = len(plan.cow_copies)
        num_swapped = plan.num_swap_out_blocks + plan.num_swap_in_blocks
        transfer_s = (num_swapped * self.block_bytes / self.gpu.pcie_bandwidth_bytes_s
                      + num_copies * 2 * self.block_bytes / self._hbm_bytes_s)
        if plan.is_empty:
            # Nothing runs on the device but the copies (a step that only swaps).
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, transfer_s, 0.0) if transfer_s \
                else _ZERO
        tokens = plan.num_batched_tokens
        num_sampled = plan.num_decode_seqs + sum(1 for c in plan.prefills if c.samples_token)
        weight_bytes = self._dense_weight_bytes + (
            self.model.num_moe_layers * self._experts_touched(tokens) * self._expert_bytes)
        kv_read = (plan.prefill_context_tokens + plan.decode_context_tokens) * self.bytes_per_token
        kv_write = tokens * self.bytes_per_token
        flops = (self._flops_per_token * tokens + self._flops_per_sample * num_sampled
                 + self._prefill_flops_per_pair * plan.prefill_attention_pairs
                 + self._decode_flops_per_ctx * plan.decode_context_tokens)
        allreduce_s = 0.0
        if self.tp > 1:
            ring_bytes = 2 * (self.tp - 1) / self.tp * tokens * self.model.hidden_size * self._act_bytes
            per_call = ring_bytes / self.gpu.interconnect_bandwidth_bytes_s + self.allreduce_latency_s
            allreduce_s = 2 * self.model.num_hidden_layers * per_call
        return StepCost(
            weight_bytes=weight_bytes, kv_read_bytes=kv_read, kv_write_bytes=kv_write, flops=flops,
            memory_s=(weight_bytes + kv_read + kv_write) / self._hbm_bytes_s,
            compute_s=flops / (self.peak_flops * self.flops_efficiency),
            allreduce_s=allreduce_s, transfer_s=transfer_s, overhead_s=self.step_overhead_s)

    def describe(self) -> dict[str, object]:
        """The model's constants, for reports (JSON-serialisable)."""
        return {
            "latency_model": "roofline",
            "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
            "kv_cache_dtype": self.kv_cache_dtype, "weight_dtype": self.weight_dtype,
            "block_size": self.block_size, "bytes_per_token": self.bytes_per_token,
            "dense_weight_bytes_per_step": self._dense_weight_bytes,
            "hbm_bandwidth_bytes_s": self.gpu.hbm_bandwidth_bytes_s,
            "mem_efficiency": self.mem_efficiency,
            "peak_flops": self.peak_flops, "flops_efficiency": self.flops_efficiency,
            "interconnect_bandwidth_bytes_s": self.gpu.interconnect_bandwidth_bytes_s,
            "pcie_bandwidth_bytes_s": self.gpu.pcie_bandwidth_bytes_s,
            "allreduce_latency_s": self.allreduce_latency_s,
            "step_overhead_s": self.step_overhead_s,
            "formula": "max(bytes/(BW*mem_eff), flops/(peak*flops_eff)) + allreduce + swap + cow"
                       " + overhead",
        }

    @property
    def _hbm_bytes_s(self) -> float:
        return self.gpu.hbm_bandwidth_bytes_s * self.mem_efficiency

    def _experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts per MoE layer for ``tokens`` uniformly routed tokens."""
        if not self._num_experts:
            return 0.0
        miss = 1 - self._experts_per_tok / self._num_experts
        return self._num_experts * (1 - miss**tokens)


def _peak_flops(gpu: GPUSpec, weight_dtype: str) -> float:
    """Dense FLOP/s the step's GEMMs run at, given the weight dtype (module docstring)."""
    if weight_dtype.startswith("fp8") and gpu.dense_fp8_flops > 0:
        return gpu.dense_fp8_flops
    if dtype_bits(weight_dtype) == 32:
        return gpu.dense_bf16_flops / 2  # TF32
    return gpu.dense_bf16_flops
