"""Roofline step latency: how long one engine step takes, from the model and GPU catalogs.

Per tensor-parallel rank, for a step with T = prefill tokens + decode sequences::

    time = max(bytes_moved / (HBM_BW × mem_efficiency),
               gemm_flops / (gemm_peak × gemm_efficiency) + expert_flops / (gemm_peak × moe_flops_efficiency)
               + attention_flops / (peak16 × flops_efficiency))
         + all_reduce + swap + copy-on-write + step_overhead_s (+ prefill_overhead_s if a prefill runs)
         (+ the MoE's all-to-all or all-gather under data-parallel attention: below)

    bytes_moved     = weights read                    (dense part + lm_head) / TP, in their stored width
                                                      + MoE: experts touched × expert bytes / TP
                    + KV read     Σ context tokens × β (prefill chunks' contexts + decode contexts)
                    + KV written  T × β
    gemm_flops      = 2 × (dense body params: attention projections, dense MLPs, shared experts) / TP × T
                    + 2 × lm_head / TP × sequences sampled this step
    expert_flops    = 2 × k routed experts × expert params × MoE layers / TP × T
    attention_flops = 2 × pairs × H_q/TP × (d_qk + d_v) × L      prefill (causal (query, key) pairs)
                    + 2 × Σ decode context × H_q/TP × (d_qk + d_v) × L                      decode
    all_reduce      = 2 per layer × (2(TP−1)/TP × T × hidden × a / interconnect_BW + allreduce_latency_s)
    swap            = swapped blocks × block_size × β / PCIe_BW
    copy            = copied blocks × 2 × block_size × β / (HBM_BW × mem_efficiency)

β is the per-rank KV bytes per token, a the activation bytes (16-bit, or 4 for fp32 models). The
expert terms' TP is the experts' own (``moe_tp``: the TP with one DP rank and the MoE TP-sharded,
vLLM's default), and with data-parallel attention their T is every DP rank's tokens (below).
With d_qk = d_v = d_h the attention terms are the familiar 4 × pairs × H × d_h × L. MLA prefill
uses d_qk = qk_nope + qk_rope, d_v = v_head_dim; MLA decode runs in the latent space (weights
absorbed), so d_qk = kv_lora_rank + qk_rope, d_v = kv_lora_rank.

The constants (:class:`~simulator.latency.constants.RooflineConstants`: ``mem_efficiency``,
``flops_efficiency``, ``fp8_flops_efficiency``, ``moe_flops_efficiency``, ``step_overhead_s``,
``prefill_overhead_s``,
``allreduce_latency_s``) default to the values fitted to published GPU measurements
(``kvplan validate``; :mod:`simulator.latency.constants` says how); a scenario may override each.

Choices the formula makes, and why:

* The embedding table is gathered, not streamed (T rows), so it is not counted as weight
  traffic; the lm_head is (it reads all ``vocab × hidden`` weights) but computes logits only
  for the sequences that sample a token this step, as vLLM does.
* An MoE layer reads only the experts its tokens route to; with uniform routing of k of E
  experts per token, T tokens touch E·(1 − (1 − k/E)^T) distinct experts on average.
* The GEMMs run on the tensor cores of the weight format's compute dtype
  (:mod:`simulator.kv.quantization`): FP8/INT8 W8A8 on the 8-bit peak with their own, lower,
  achieved share (``fp8_flops_efficiency``; published FP8 serving reaches ~0.45–0.5 of the FP8
  peak where bf16 reaches ~0.65 of its own); NVFP4/MXFP4 W4A4 on the FP4 peak
  (``GPUSpec.dense_fp4_flops``) at the same ``fp8_flops_efficiency`` — the fit has no FP4
  measurement, so no FP4 constant of its own; weight-only formats and attention on the 16-bit
  peak; fp32 runs TF32 at half the bf16 rate.
* Routed-expert GEMMs run at their own achieved share (``moe_flops_efficiency``): grouped GEMMs
  over a few rows per expert reach much less than a dense GEMM of the same FLOPs.
* GEMMs and attention are separate kernels, so their compute times add; the step is bound by
  memory or by compute, whichever is slower.
* An all-reduce costs its bytes over the link plus a fixed latency per call (launch, the
  synchronisation of the ranks); at decode the latency dominates: 2 × L calls per step.
* A request also waits outside the steps (``request_overhead_s``: the serving front end's
  HTTP, tokenisation, detokenisation and streaming); it is added to the TTFT and E2E a client
  sees, not to any step. Closed-loop clients still send at the engine's finish, so a loop's load
  is overstated by that delay per request (about 1% at the fitted value).
* What is not modelled: activation traffic, split-K effects of one very long sequence, and
  compute/communication overlap. The calibrated ``profile`` model captures those from
  measurements.

**Hybrid models** (sliding-window, chunked-local or linear-attention layers): the KV read and
the attention FLOPs above are per layer, and a layer reads only what it attends to. A full layer
reads the whole context; a sliding layer at most ``W`` tokens per query (``min(position + 1,
W)`` keys), a chunked layer at most its chunk (``position mod chunk + 1`` keys); a linear
(Gated DeltaNet) layer reads and writes its state once per sequence per step, and its
recurrence, ``2 · 2 · k_dim · v_dim`` FLOPs per value head per token, joins the attention term.
Prefill chunks are counted exactly from their positions. A decode batch is known by its sum and
longest context only, so a window layer's decode read is ``Σ min(c, W)`` bounded by
``min(Σc, n·W)``: exact when every context is at least ``W`` or none exceeds it (the longest
context tells), an upper bound in between. Every KV layer still writes each new token.
A model with only full-attention layers takes the formula above unchanged.

**Data-parallel attention and the MoE layers' layout** (``dp`` DP ranks of ``tp``; the MoE over
the same ``dp × tp`` GPUs as ``moe_tp × moe_ep``: :mod:`simulator.kv.expert_parallel` says who
holds what and why). The rank holds ``ceil(E / moe_ep)`` experts, each ``1 / moe_tp`` of one:
expert bytes and FLOPs per (expert, token) pair are divided by ``moe_tp``, not by ``tp``. The
step is one DP rank's, of T tokens of which n decode; the other DP ranks, stepping with it (vLLM
steps them together), are taken to decode n sequences each — a prefill chunk is one rank's at a
time in the steady state — so with ``dp > 1`` each MoE layer routes ``G = T + (dp − 1) × n``
tokens::

    MoE weights read  = MoE layers × experts touched on the busiest rank (G tokens) × one expert / moe_tp
    expert_flops      = 2 × expert params / moe_tp × MoE layers × busiest rank's (expert, token) pairs (G)
    all_to_all        = 2 per MoE layer (dispatch, combine), dispatch all-to-all, each
                        T × hidden × a × max(remote ranks on the node / interconnect_BW,
                                             remote ranks off the node / scale-out BW)
                        + alltoall_latency_s
    all_gather        = 2 per MoE layer (all-gather before, reduce-scatter after), dispatch
                        all-gather, each (dp − 1)/dp × G × hidden × a / link_BW + alltoall_latency_s

The busiest rank's pairs and experts come from ``expert_routing`` (uniform, or zipf with a
skew): a skewed routing loads one rank more, and every rank waits for it. With ``moe_ep = 1``
and uniform routing every rank holds a share of every expert: experts touched
``E·(1 − (1 − k/E)^G)``, ``k × G`` pairs. A token is sent once to each remote rank holding one
of its experts (``remote_ranks_per_token``); with ``k = 1`` that is ``(ep − 1)/ep`` of the tokens
each way. The gather runs over the DP group (vLLM's ``AgRsAll2AllManager`` all_gatherv /
reduce_scatterv over ``get_dp_group()``; SGLang's ``_dp_gather`` over its TP group, which an
all-reduce of a zero-padded buffer doubles: not modelled), in a ring: every rank receives the
other DP ranks' ``(dp − 1)/dp`` of the ``G`` tokens; its link is NVLink (``interconnect_BW``)
while the replica's ``dp × tp`` GPUs fit in one NVLink domain (``gpus_per_node``: 8 on HGX, 72
on GB200/GB300 NVL72), else the scale-out network. The layer's TP all-reduces stay (attention's
and the MLP's, within the ``tp`` ranks). ``alltoall_latency_s`` (per call) defaults to the fitted
all-reduce latency of the GPU's fabric (:mod:`simulator.latency.constants`): both are one
collective's launch and synchronisation, and no all-to-all measurement has been fitted. With
``dp = 1`` the TP ranks hold every token already: no dispatch, the layer's all-reduce (over all
``tp`` ranks, experts' shares included) stays. With one DP rank, ``moe_tp = tp`` and uniform
routing the MoE terms are those above, unchanged.

An empty plan (nothing to compute and nothing to copy) costs 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from simulator.errors import KvplanError
from simulator.kv.expert_parallel import (
    ExpertRouting,
    ParallelLayout,
    busiest_rank_load,
    remote_ranks_per_token,
)
from simulator.kv.gpus import GPUSpec
from simulator.kv.model_config import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
)
from simulator.kv.models import ModelConfig, dtype_bits
from simulator.kv.quantization import WeightFormat, resolve_quantization
from simulator.kv.sizing import model_kv_layout
from simulator.latency import quiet_plans
from simulator.latency.constants import RooflineConstants, default_constants, fit_provenance
from simulator.scheduler.plan import StepPlan


class StepTerms(NamedTuple):
    """What one step moves and computes on one rank, before any constant turns it into time.

    Independent of the :class:`RooflineConstants`, so a fit can time the same steps under many
    constants (:func:`combine` accepts numpy arrays of terms).
    """

    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    gemm_flops: float
    expert_flops: float  # routed-expert GEMMs (MoE)
    attention_flops: float
    allreduce_calls: float  # all-reduce calls this step (2 per layer at TP > 1, else 0)
    allreduce_bytes: float  # bytes each call moves over the link (ring)
    prefill: float  # 1.0 if a prefill chunk runs this step, else 0.0
    copy_bytes: float  # on-device block copies (copy-on-write), read + write
    swap_bytes: float  # host-link block copies (swap in and out)
    # expert-parallel dispatch and combine by all-to-all, seconds: links (datasheet rates) plus
    # the fixed per-call latency, which is not one of the fitted constants
    alltoall_s: float = 0.0
    # the MoE's all-gather of every DP rank's tokens and its reduce-scatter back, seconds (as
    # alltoall_s: links plus the per-call latency)
    gather_s: float = 0.0


class Rates(NamedTuple):
    """The hardware peaks a step's terms are divided by (datasheet numbers, per rank)."""

    hbm_bytes_s: float
    gemm_flops_s: float  # peak of the GEMMs' tensor cores (the weight format's compute dtype)
    attention_flops_s: float  # 16-bit peak (attention runs in the activation dtype)
    interconnect_bytes_s: float
    pcie_bytes_s: float
    # the GEMMs run on 8- or 4-bit tensor cores (fp8, int8, fp4): fp8_flops_efficiency applies
    # (fp4 reuses it: roofline_fit.json has no fp4 constant)
    gemm_8bit: bool


class StepCost(NamedTuple):
    """One step's terms on one rank, and the seconds they cost under given constants."""

    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    gemm_flops: float
    expert_flops: float
    attention_flops: float
    memory_s: float
    compute_s: float
    allreduce_s: float
    transfer_s: float  # swap (PCIe) and copy-on-write (HBM) block copies
    overhead_s: float  # per-step overhead, plus the prefill overhead when a prefill runs
    alltoall_s: float = 0.0  # expert-parallel dispatch and combine (all-to-all)
    gather_s: float = 0.0  # the MoE's all-gather and reduce-scatter over the DP ranks

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.expert_flops + self.attention_flops

    @property
    def bytes_moved(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def total_s(self) -> float:
        return (max(self.memory_s, self.compute_s) + self.allreduce_s + self.transfer_s
                + self.overhead_s + self.alltoall_s + self.gather_s)

    @property
    def compute_bound(self) -> bool:
        return self.compute_s > self.memory_s


def combine(t: Any, rates: Rates, c: RooflineConstants,
            maximum: Callable[[Any, Any], Any] = max) -> Any:
    """Seconds of steps with terms ``t`` (a :class:`StepTerms` of floats, or of numpy arrays
    with ``maximum=np.maximum``): the module docstring's formula, the one place it is written."""
    gemm_eff = c.fp8_flops_efficiency if rates.gemm_8bit else c.flops_efficiency
    hbm = rates.hbm_bytes_s * c.mem_efficiency
    memory_s = (t.weight_bytes + t.kv_read_bytes + t.kv_write_bytes) / hbm
    compute_s = (t.gemm_flops / (rates.gemm_flops_s * gemm_eff)
                 + t.expert_flops / (rates.gemm_flops_s * c.moe_flops_efficiency)
                 + t.attention_flops / (rates.attention_flops_s * c.flops_efficiency))
    allreduce_s = t.allreduce_calls * (t.allreduce_bytes / rates.interconnect_bytes_s
                                       + c.allreduce_latency_s)
    transfer_s = t.swap_bytes / rates.pcie_bytes_s + t.copy_bytes / hbm
    return (maximum(memory_s, compute_s) + allreduce_s + transfer_s
            + c.step_overhead_s + t.prefill * c.prefill_overhead_s + t.alltoall_s + t.gather_s)


_NO_TERMS = StepTerms(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # (and 0.0 MoE comms)
_ZERO = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class RooflineLatency:
    """Step latency from bytes moved and FLOPs per rank (formula in the module docstring)."""

    def __init__(self, model: ModelConfig, gpu: GPUSpec, *, tp: int = 1,
                 kv_cache_dtype: str = "auto", quantization: str | WeightFormat = "auto",
                 block_size: int = 16, constants: RooflineConstants | None = None,
                 mem_efficiency: float | None = None, flops_efficiency: float | None = None,
                 fp8_flops_efficiency: float | None = None,
                 moe_flops_efficiency: float | None = None, step_overhead_s: float | None = None,
                 prefill_overhead_s: float | None = None,
                 allreduce_latency_s: float | None = None,
                 request_overhead_s: float | None = None,
                 host_bandwidth_bytes_s: float | None = None, dp: int = 1,
                 enable_expert_parallel: bool = False,
                 expert_routing: ExpertRouting | None = None,
                 alltoall_latency_s: float | None = None, moe_tp: int | None = None,
                 moe_ep: int | None = None, moe_dispatch: str | None = None) -> None:
        """``constants`` default to the fitted ones for ``gpu``; each keyword overrides one.
        ``host_bandwidth_bytes_s``: the host link's rate for KV block copies (swap, and loads
        from a ``kv_offload`` tier, which share ``num_swap_in_blocks``); default: the GPU's PCIe.
        ``dp``, ``enable_expert_parallel``, ``moe_tp``, ``moe_ep``, ``moe_dispatch``,
        ``expert_routing``, ``alltoall_latency_s``: data-parallel attention and the MoE layers'
        layout (module docstring); the step is one DP rank's, costed on its busiest rank.
        Raises KvplanError for efficiencies outside (0, 1], negative times, block_size < 1
        or a tp that does not divide the model's heads."""
        base = constants if constants is not None else default_constants(gpu)
        self.constants = base.replace(
            mem_efficiency=mem_efficiency, flops_efficiency=flops_efficiency,
            fp8_flops_efficiency=fp8_flops_efficiency, moe_flops_efficiency=moe_flops_efficiency,
            step_overhead_s=step_overhead_s,
            prefill_overhead_s=prefill_overhead_s, allreduce_latency_s=allreduce_latency_s,
            request_overhead_s=request_overhead_s)
        self.fitted = constants is None
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise KvplanError(f"block size must be a positive integer, got {block_size!r}")
        self.model, self.gpu, self.tp, self.block_size = model, gpu, tp, block_size
        self._num_moe_layers = model.num_moe_layers  # a walk over the layers: once, not per step
        layout = model_kv_layout(model, kv_cache_dtype, tp)  # validates tp against the heads
        self.kv_cache_dtype = layout.dtype
        self.bytes_per_token = layout.bytes_per_token
        self.block_bytes = block_size * self.bytes_per_token
        # Quantized weights: fewer bytes streamed, and the GEMMs on the tensor cores of the
        # format's compute dtype (simulator/kv/quantization.py says which and why).
        self.weight_format = quantization if isinstance(quantization, WeightFormat) else (
            resolve_quantization(model, quantization, gpu))
        self.weight_dtype = self.weight_format.weight_dtype
        self.gemm_dtype = self.weight_format.gemm_dtype  # bf16 | fp16 | fp32 | fp8 | int8 | fp4
        self._act_bytes = 4 if dtype_bits(model.torch_dtype) == 32 else 2
        self.peak_flops = _peak_flops(gpu, self.gemm_dtype)
        self.rates = Rates(
            hbm_bytes_s=gpu.hbm_bandwidth_bytes_s, gemm_flops_s=self.peak_flops,
            attention_flops_s=_peak_flops(gpu, "fp32" if self._act_bytes == 4 else "bf16"),
            interconnect_bytes_s=gpu.interconnect_bandwidth_bytes_s,
            pcie_bytes_s=host_bandwidth_bytes_s or gpu.pcie_bandwidth_bytes_s,
            gemm_8bit=self.gemm_dtype in ("fp8", "int8", "fp4"))

        self._dense_weight_bytes = self.weight_format.dense_weight_bytes / tp
        self.parallel = ParallelLayout(tp, dp, enable_expert_parallel, moe_tp, moe_ep, moe_dispatch)
        self.parallel.check(model)
        # an expert's share on this rank: 1/moe_tp of it (moe_tp = tp with one DP rank and no EP)
        split = self.parallel.moe_tp if model.is_moe else tp
        self._expert_bytes = self.weight_format.expert_bytes / split
        self.expert_routing = expert_routing or ExpertRouting()
        self.alltoall_latency_s = (self.constants.allreduce_latency_s if alltoall_latency_s is None
                                   else alltoall_latency_s)
        # Expert parallelism, or a skewed routing: the busiest ranks' shares (module docstring);
        # None keeps the uniform single-rank formula of _experts_touched.
        self._rank_load = None
        self._touched: dict[int, float] = {}  # routed tokens -> experts touched (_moe_terms)
        self._alltoall_s_per_token = 0.0
        self._gather_s_per_token = 0.0
        self._alltoall_calls = self._gather_calls = 0.0
        self._dp = dp if model.is_moe else 1  # DP ranks whose tokens an MoE layer routes
        if model.is_moe and (self.parallel.moe_ep > 1 or self.expert_routing.distribution != "uniform"):
            self._rank_load = busiest_rank_load(model, self.parallel, self.expert_routing)
            self._expert_flops_per_pair = 2.0 * model.num_moe_layers * model.routed_expert_params / split
        token_bytes = model.hidden_size * (4 if dtype_bits(model.torch_dtype) == 32 else 2)
        if model.is_moe and self.parallel.uses_all_to_all:
            on_node, off_node = remote_ranks_per_token(model, self.parallel, self.expert_routing,
                                                       gpu.gpus_per_node)
            self._alltoall_calls = 2.0 * model.num_moe_layers
            self._alltoall_s_per_token = token_bytes * max(
                on_node / gpu.interconnect_bandwidth_bytes_s,
                off_node / gpu.scaleout_bandwidth_bytes_s)
        elif model.is_moe and self.parallel.uses_all_gather:
            link = (gpu.interconnect_bandwidth_bytes_s if self.parallel.world_size <= gpu.gpus_per_node
                    else gpu.scaleout_bandwidth_bytes_s)
            self._gather_calls = 2.0 * model.num_moe_layers
            self._gather_s_per_token = (dp - 1) / dp * token_bytes / link
        self._num_experts = model.num_experts
        self._experts_per_tok = model.experts_per_token
        self._flops_per_token = 2 * model.dense_body_params / tp
        self._expert_flops_per_token = (
            2 * model.num_moe_layers * self._experts_per_tok * model.routed_expert_params / split)
        self._flops_per_sample = 2 * model.lm_head_params / tp
        heads = model.num_attention_heads / tp
        layers = model.num_hidden_layers
        self._prefill_flops_per_pair = 2 * heads * (model.qk_head_dim + model.value_head_dim) * layers
        self._decode_flops_per_ctx = self._prefill_flops_per_pair
        if model.is_mla:  # decode attends in the latent space: d_qk = latent, d_v = kv_lora_rank
            decode_dims = model.kv_latent_width + (model.kv_lora_rank or 0)
            self._decode_flops_per_ctx = 2 * heads * decode_dims * layers
        self._hybrid = model.is_hybrid
        if self._hybrid:  # per-layer-kind terms (module docstring)
            kv_layers = model.num_kv_layers
            self._layer_kv_bytes = self.bytes_per_token / kv_layers  # one layer, one token
            self._pair_flops_per_layer = self._prefill_flops_per_pair / layers
            self._decode_flops_per_layer = self._decode_flops_per_ctx / layers
            self._full_layers = model.num_layers_of(FULL_ATTENTION)
            self._window_layers = tuple(
                (kind, model.num_layers_of(kind), model.attention_window(kind))
                for kind in (SLIDING_ATTENTION, CHUNKED_ATTENTION) if model.num_layers_of(kind))
            linear = model.num_layers_of(LINEAR_ATTENTION)
            _, temporal = model.linear_state_elements(tp)
            # conv state in the model's dtype, SSM state in its cache dtype (float32 for Nemotron-H)
            self._state_rw_bytes_per_seq = 2.0 * linear * model.linear_state_bytes(tp)  # read + write back
            self._linear_flops_per_token = 4.0 * linear * temporal
        # one all-reduce per row-parallel output: attention's o_proj and the MLP's down_proj in a
        # transformer layer; a Nemotron-H layer is one block only — a Mamba-2 mixer, attention or
        # an MLP (vllm/model_executor/models/nemotron_h.py, NemotronHDecoderLayer)
        blocks = 1 if model.model_type == "nemotron_h" else 2
        self._allreduce_calls = float(blocks * layers) if tp > 1 else 0.0
        self._ring_bytes_per_token = 2 * (tp - 1) / tp * model.hidden_size * self._act_bytes
        # The decode fast path's divisors, fixed for the model's life.
        c = self.constants
        gemm_eff = c.fp8_flops_efficiency if self.rates.gemm_8bit else c.flops_efficiency
        self._hbm_eff_bytes_s = gpu.hbm_bandwidth_bytes_s * c.mem_efficiency
        self._gemm_eff_flops_s = self.peak_flops * gemm_eff
        self._attn_eff_flops_s = self.rates.attention_flops_s * c.flops_efficiency
        self._moe_eff_flops_s = self.peak_flops * c.moe_flops_efficiency

    @property
    def mem_efficiency(self) -> float:
        return self.constants.mem_efficiency

    @property
    def flops_efficiency(self) -> float:
        return self.constants.flops_efficiency

    @property
    def step_overhead_s(self) -> float:
        return self.constants.step_overhead_s

    @property
    def allreduce_latency_s(self) -> float:
        return self.constants.allreduce_latency_s

    @property
    def request_overhead_s(self) -> float:
        """Per request, outside the steps (the serving front end): the engine adds it to the
        TTFT and E2E the client sees."""
        return self.constants.request_overhead_s

    def step_latency_s(self, plan: StepPlan) -> float:
        """Seconds the step takes (0 for a plan with no work); equals ``step_cost(plan).total_s``.

        This is the simulator's hot path (one call per step), so the common cases — a decode
        step, or a step with prefill chunks, without copies or swaps on a dense model at TP 1 —
        are computed inline, term for term as :meth:`step_cost` and :func:`combine` compute them
        (the terms that are 0.0 there are added as 0.0 here: the same floats, bit for bit).
        """
        if (plan.cow_copies or plan.num_swap_out_blocks or plan.num_swap_in_blocks or self.tp > 1
                or self._num_experts or self._hybrid or plan.num_spec_tokens):
            return self.step_cost(plan).total_s
        n = plan.num_decode_seqs
        ctx = plan.decode_context_tokens
        bpt = self.bytes_per_token
        prefills = plan.prefills
        if not prefills:
            if not n:
                return self.step_cost(plan).total_s
            memory_s = (self._dense_weight_bytes + ctx * bpt + n * bpt) / self._hbm_eff_bytes_s
            # (a dense model's expert term is 0.0, and x + 0.0 == x: it is left out here)
            compute_s = ((self._flops_per_token * n + self._flops_per_sample * n) / self._gemm_eff_flops_s
                         + self._decode_flops_per_ctx * ctx / self._attn_eff_flops_s)
            return ((memory_s if memory_s >= compute_s else compute_s) + 0.0 + 0.0
                    + self.constants.step_overhead_s + 0.0)
        # step_terms' plan properties in one pass over the chunks (integers: exact in any order)
        chunk_tokens = read = pairs = sampled = 0
        for c in prefills:
            t, done = c.num_tokens, c.num_computed_tokens
            chunk_tokens += t
            read += done + t
            pairs += t * done + t * (t + 1) // 2
            if c.samples_token:
                sampled += 1
        tokens = chunk_tokens + n
        memory_s = ((self._dense_weight_bytes + 0.0) + (read + ctx) * bpt + tokens * bpt) / self._hbm_eff_bytes_s
        compute_s = ((self._flops_per_token * tokens + self._flops_per_sample * (n + sampled))
                     / self._gemm_eff_flops_s
                     + (self._prefill_flops_per_pair * pairs + self._decode_flops_per_ctx * ctx)
                     / self._attn_eff_flops_s)
        c = self.constants
        return ((memory_s if memory_s >= compute_s else compute_s) + 0.0 + 0.0
                + (c.step_overhead_s + 1.0 * c.prefill_overhead_s) + 0.0)

    def quiet_latencies(self, plan: StepPlan, k: int) -> Iterator[float]:
        """Durations of steps 1 .. k-1 of the quiet run ``plan`` starts (the same decode batch,
        each context one token longer per step), bit for bit what :meth:`step_latency_s` gives
        for each step's plan (:func:`simulator.latency.quiet_latencies`), without building them."""
        if (plan.prefills or plan.cow_copies or plan.num_swap_out_blocks or plan.num_swap_in_blocks
                or self.tp > 1 or self._num_experts or not plan.num_decode_seqs or self._hybrid):
            yield from (self.step_latency_s(p) for p in quiet_plans(plan, k))
            return
        n = plan.num_decode_seqs
        ctx = plan.decode_context_tokens
        bpt = self.bytes_per_token
        weights, hbm = self._dense_weight_bytes, self._hbm_eff_bytes_s
        gemm_s = (self._flops_per_token * n + self._flops_per_sample * n) / self._gemm_eff_flops_s
        per_ctx, attn = self._decode_flops_per_ctx, self._attn_eff_flops_s
        overhead = self.constants.step_overhead_s
        write = n * bpt
        for _ in range(1, k):
            ctx += n
            # term for term as step_latency_s's fast path
            memory_s = (weights + ctx * bpt + write) / hbm
            compute_s = gemm_s + per_ctx * ctx / attn
            yield (memory_s if memory_s >= compute_s else compute_s) + 0.0 + 0.0 + overhead + 0.0

    def step_terms(self, plan: StepPlan) -> StepTerms:
        """What the step moves and computes (no constants involved)."""
        copy_bytes = len(plan.cow_copies) * 2.0 * self.block_bytes
        swap_bytes = (plan.num_swap_out_blocks + plan.num_swap_in_blocks) * float(self.block_bytes)
        if plan.is_empty:  # nothing runs on the device but the copies (a step that only swaps)
            return _NO_TERMS._replace(copy_bytes=copy_bytes, swap_bytes=swap_bytes)
        tokens = plan.num_batched_tokens
        num_sampled = plan.num_decode_seqs + sum(1 for c in plan.prefills if c.samples_token)
        weight_bytes, expert_flops, alltoall_s, gather_s = self._moe_terms(tokens,
                                                                           plan.num_decode_seqs)
        if self._hybrid:
            kv_read, attention = self._hybrid_attention(plan)
            return StepTerms(
                weight_bytes=weight_bytes, kv_read_bytes=kv_read,
                kv_write_bytes=tokens * self.bytes_per_token,
                gemm_flops=self._flops_per_token * tokens + self._flops_per_sample * num_sampled,
                expert_flops=expert_flops, attention_flops=attention,
                allreduce_calls=self._allreduce_calls,
                allreduce_bytes=self._ring_bytes_per_token * tokens,
                prefill=1.0 if plan.prefills else 0.0, copy_bytes=copy_bytes,
                swap_bytes=swap_bytes, alltoall_s=alltoall_s, gather_s=gather_s)
        return StepTerms(
            weight_bytes=weight_bytes,
            kv_read_bytes=(plan.prefill_context_tokens + plan.decode_context_tokens) * self.bytes_per_token,
            kv_write_bytes=tokens * self.bytes_per_token,
            gemm_flops=self._flops_per_token * tokens + self._flops_per_sample * num_sampled,
            expert_flops=expert_flops,
            attention_flops=(self._prefill_flops_per_pair * plan.prefill_attention_pairs
                             + self._decode_flops_per_ctx * plan.decode_context_tokens),
            allreduce_calls=self._allreduce_calls,
            allreduce_bytes=self._ring_bytes_per_token * tokens,
            prefill=1.0 if plan.prefills else 0.0, copy_bytes=copy_bytes, swap_bytes=swap_bytes,
            alltoall_s=alltoall_s, gather_s=gather_s)

    def step_cost(self, plan: StepPlan) -> StepCost:
        """The step's terms and their seconds, for reports and tests."""
        t = self.step_terms(plan)
        c, r = self.constants, self.rates
        transfer_s = t.swap_bytes / r.pcie_bytes_s + t.copy_bytes / self._hbm_eff_bytes_s
        if plan.is_empty:
            return _ZERO._replace(transfer_s=transfer_s) if transfer_s else _ZERO
        return StepCost(
            weight_bytes=t.weight_bytes, kv_read_bytes=t.kv_read_bytes,
            kv_write_bytes=t.kv_write_bytes, gemm_flops=t.gemm_flops,
            expert_flops=t.expert_flops, attention_flops=t.attention_flops,
            memory_s=(t.weight_bytes + t.kv_read_bytes + t.kv_write_bytes) / self._hbm_eff_bytes_s,
            compute_s=(t.gemm_flops / self._gemm_eff_flops_s
                       + t.expert_flops / self._moe_eff_flops_s
                       + t.attention_flops / self._attn_eff_flops_s),
            allreduce_s=t.allreduce_calls * (t.allreduce_bytes / r.interconnect_bytes_s
                                             + c.allreduce_latency_s),
            transfer_s=transfer_s,
            overhead_s=c.step_overhead_s + t.prefill * c.prefill_overhead_s,
            alltoall_s=t.alltoall_s, gather_s=t.gather_s)

    def describe(self) -> dict[str, object]:
        """The model's constants, for reports (JSON-serialisable)."""
        c = self.constants
        return {
            "latency_model": "roofline",
            "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
            "data_parallel_size": self.parallel.dp, "expert_parallel_size": self.parallel.ep_size,
            "moe_tensor_parallel_size": self.parallel.moe_tp if self._num_experts else 1,
            "moe_dispatch": self.parallel.dispatch if self._num_experts else "none",
            "expert_routing": {"distribution": self.expert_routing.distribution,
                               "skew": self.expert_routing.skew},
            "alltoall_latency_s": self.alltoall_latency_s,
            "kv_cache_dtype": self.kv_cache_dtype, "weight_dtype": self.weight_dtype,
            "gemm_dtype": self.gemm_dtype,
            "block_size": self.block_size, "bytes_per_token": self.bytes_per_token,
            "dense_weight_bytes_per_step": self._dense_weight_bytes,
            "hbm_bandwidth_bytes_s": self.gpu.hbm_bandwidth_bytes_s,
            "mem_efficiency": c.mem_efficiency,
            "peak_flops": self.peak_flops, "flops_efficiency": c.flops_efficiency,
            "fp8_flops_efficiency": c.fp8_flops_efficiency,
            "moe_flops_efficiency": c.moe_flops_efficiency,
            "interconnect_bandwidth_bytes_s": self.gpu.interconnect_bandwidth_bytes_s,
            "pcie_bandwidth_bytes_s": self.rates.pcie_bytes_s,
            "allreduce_latency_s": c.allreduce_latency_s,
            "step_overhead_s": c.step_overhead_s,
            "prefill_overhead_s": c.prefill_overhead_s,
            "request_overhead_s": c.request_overhead_s,
            "constants_from": "fitted defaults" if self.fitted else "given",
            "fit": fit_provenance() if self.fitted else {},
            "formula": "max(bytes/(BW*mem_eff), gemm/(peak*eff) + experts/(peak*moe_eff)"
                       " + attn/(peak16*flops_eff))"
                       " + allreduce + swap + cow + overhead (+ prefill overhead)",
        }

    def _hybrid_attention(self, plan: StepPlan) -> tuple[float, float]:
        """(KV bytes read, attention FLOPs) of a hybrid model's step, per layer kind (module
        docstring)."""
        n, ctx = plan.num_decode_seqs, plan.decode_context_tokens
        full = self._full_layers
        keys_read = full * (plan.prefill_context_tokens + ctx)  # layer-tokens of KV read
        pairs = full * plan.prefill_attention_pairs  # layer-(query, key) pairs, prefill
        decode_keys = full * ctx  # layer-keys attended, decode
        for kind, count, window in self._window_layers:
            assert window is not None
            for c in plan.prefills:
                first, last = c.num_computed_tokens, c.context_tokens  # positions first..last-1
                keys_read += count * (last - _window_start(kind, window, first))
                pairs += count * _window_pairs(kind, window, first, last)
            seen = ctx if plan.decode_max_context <= window else min(ctx, n * window)
            keys_read += count * seen
            decode_keys += count * seen
        kv_read = keys_read * self._layer_kv_bytes
        sequences = len(plan.prefills) + n
        kv_read += sequences * self._state_rw_bytes_per_seq
        attention = (self._pair_flops_per_layer * pairs + self._decode_flops_per_layer * decode_keys
                     + self._linear_flops_per_token * plan.num_batched_tokens)
        return kv_read, attention

    def _moe_terms(self, tokens: int, decode_seqs: int) -> tuple[float, float, float, float]:
        """(weights read, expert FLOPs, all-to-all seconds, all-gather seconds) of a step of
        ``tokens``, of which ``decode_seqs`` decode, on this rank: the dense weights plus the
        experts the routed tokens touch, and how the tokens got there (module docstring)."""
        load = self._rank_load
        # every DP rank's tokens pass the MoE layers (module docstring): G = T + (dp - 1) n
        routed = tokens if self._dp == 1 else tokens + (self._dp - 1) * decode_seqs
        alltoall_s = gather_s = 0.0
        if self._alltoall_calls:  # this rank's tokens to the ranks of their experts, and back
            alltoall_s = self._alltoall_calls * (tokens * self._alltoall_s_per_token
                                                 + self.alltoall_latency_s)
        elif self._gather_calls:  # every DP rank's tokens gathered, the outputs reduce-scattered
            gather_s = self._gather_calls * (routed * self._gather_s_per_token
                                             + self.alltoall_latency_s)
        if load is None:
            return (self._dense_weight_bytes
                    + self._num_moe_layers * self._experts_touched(routed) * self._expert_bytes,
                    self._expert_flops_per_token * routed, alltoall_s, gather_s)
        touched = self._touched.get(routed)
        if touched is None:  # a zipf rank's sum is O(E): once per token count
            touched = self._touched[routed] = load.experts_touched(routed)
        return (self._dense_weight_bytes + self._num_moe_layers * touched * self._expert_bytes,
                self._expert_flops_per_pair * load.busiest_pairs(routed), alltoall_s, gather_s)

    def _experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts per MoE layer for ``tokens`` uniformly routed tokens."""
        if not self._num_experts:
            return 0.0
        miss = 1 - self._experts_per_tok / self._num_experts
        return self._num_experts * (1 - miss**tokens)


def _window_start(kind: str, window: int, position: int) -> int:
    """First key position the query at ``position`` attends to in a window layer."""
    if kind == SLIDING_ATTENTION:
        return max(0, position - window + 1)
    return position // window * window  # chunked: the start of its chunk


def _window_pairs(kind: str, window: int, first: int, last: int) -> int:
    """(query, key) pairs of queries ``first .. last − 1`` in a window layer: Σ keys per query,
    ``min(p + 1, W)`` (sliding) or ``p mod chunk + 1`` (chunked)."""
    if kind == SLIDING_ATTENTION:
        ramp_end = min(last, window)  # queries below W see p + 1 keys, the rest W
        ramp = _sum_range(first + 1, ramp_end + 1) if first < ramp_end else 0
        return ramp + window * max(0, last - max(first, window))
    total = 0
    p = first
    while p < last:  # chunk by chunk: keys p mod chunk + 1 for each query
        end = min(last, (p // window + 1) * window)
        total += _sum_range(p % window + 1, end - p + p % window + 1)
        p = end
    return total


def _sum_range(lo: int, hi: int) -> int:
    """lo + (lo + 1) + ... + (hi − 1)."""
    return (lo + hi - 1) * (hi - lo) // 2


def _peak_flops(gpu: GPUSpec, gemm_dtype: str) -> float:
    """Dense FLOP/s (or int8 ops/s) of the tensor cores the GEMMs run on (module docstring)."""
    if gemm_dtype == "fp8":
        return gpu.dense_fp8_flops
    if gemm_dtype == "fp4":
        return gpu.dense_fp4_flops
    if gemm_dtype == "int8":
        return gpu.dense_int8_ops
    if gemm_dtype == "fp32":
        return gpu.dense_bf16_flops / 2  # TF32
    return gpu.dense_bf16_flops
