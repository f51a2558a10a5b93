"""Data-parallel attention and expert parallelism for MoE models: who holds what, who waits.

A deployment of ``data_parallel_size`` × ``tensor_parallel`` GPUs, as vLLM lays it out:

* **Attention and the dense layers** run data parallel: each DP rank is an engine of its own,
  with its own requests and its own KV cache, its layers TP-sharded over its ``tensor_parallel``
  ranks (vllm/config/parallel.py, ``ParallelConfig.data_parallel_size``: "Number of data
  parallel groups. MoE layers will be sharded according to the product of the tensor parallel
  size and data parallel size"). Nothing of the KV cache is replicated across DP ranks; within
  one, heads are sharded as at plain TP (an MLA latent stays replicated on its TP ranks).
* **The MoE layers** with ``enable_expert_parallel`` run expert parallel over all
  ``dp × tp`` ranks, with no tensor parallelism inside an expert: ``ep_size = dp × tp``
  (vllm/model_executor/layers/fused_moe/config.py, ``FusedMoEParallelConfig.make`` and
  ``flatten_tp_across_dp_and_pcp``). Each rank holds ``E // ep`` whole routed experts, the first
  ``E % ep`` ranks one more, contiguous under the default ``linear`` placement
  (vllm/model_executor/layers/fused_moe/expert_map_manager.py, ``determine_expert_map``);
  shared experts, routers and everything else stay with the DP rank's TP sharding.
* Tokens reach their experts by an all-to-all (dispatch, then combine) only when DP > 1
  (``FusedMoEParallelConfig.use_all2all_kernels``: ``use_ep and dp_size > 1``); with DP 1 the
  TP ranks already hold every token, each runs its own experts on them and the layer's usual
  all-reduce sums the outputs.

kvplan simulates DP for MoE models with expert parallelism only: without it vLLM shards every
expert's matrices over ``dp × tp`` ranks (``flatten_tp_across_dp_and_pcp`` with ``use_ep``
false), a layout whose collectives the roofline does not model.

**Routing and load imbalance** (:class:`ExpertRouting`). A token picks ``k`` of ``E`` experts.
``uniform``: every expert with probability ``k/E``. ``zipf``: expert popularity ∝
``1 / rank^skew``, scaled so the probabilities sum to ``k`` (capped at 1, the excess spread over
the others), popularity ranks given to experts by a seeded shuffle (vLLM's linear placement knows
nothing of popularity). Per EP rank ``r`` holding experts ``e``, one token puts
``X_r = Σ_e 1[e picked]`` (expert, token) pairs on it: mean ``P_r = Σ p_e``, variance at most
``V_r = Σ p_e (1 − p_e)`` (the picks of one token are negatively correlated). Over ``G``
independent tokens the busiest rank's expected load is taken as the Gaussian bound on the
expected maximum of ``ep`` loads::

    E[max_r L_r] ≈ G · max_r P_r + sqrt(2 · ln(ep) · G · max_r V_r)     (≤ G · min(k, experts on r))

— a closed form, not a sample, so a step costs O(1); it is exact in the mean and an upper bound
on the spread for Gaussian loads. The busiest rank sets the MoE layer's time: every rank waits
for it at the combine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from simulator.errors import KvplanError
from simulator.kv.models import ModelConfig

RoutingDistribution = Literal["uniform", "zipf"]


@dataclass(frozen=True, slots=True)
class ExpertRouting:
    """How tokens pick experts (module docstring): ``uniform``, or ``zipf`` with ``skew`` s > 0."""

    distribution: RoutingDistribution = "uniform"
    skew: float = 0.0
    seed: int = 0  # the shuffle that places popular experts on ranks (zipf)

    def __post_init__(self) -> None:
        if self.distribution not in ("uniform", "zipf"):
            raise KvplanError(f"expert_routing: distribution must be uniform or zipf, got"
                              f" {self.distribution!r}")
        if self.distribution == "zipf" and not self.skew > 0:
            raise KvplanError(f"expert_routing: zipf needs skew > 0, got {self.skew}")
        if self.distribution == "uniform" and self.skew:
            raise KvplanError("expert_routing: skew is for distribution zipf")

    def expert_probabilities(self, num_experts: int, k: int) -> tuple[float, ...]:
        """P(a token picks expert e), by expert id; they sum to ``k``."""
        if self.distribution == "uniform":
            return (k / num_experts,) * num_experts
        weights = [1.0 / (i + 1) ** self.skew for i in range(num_experts)]
        probs = _capped_shares(weights, k)
        order = list(range(num_experts))
        random.Random(self.seed).shuffle(order)  # popularity rank i -> expert order[i]
        by_expert = [0.0] * num_experts
        for rank, expert in enumerate(order):
            by_expert[expert] = probs[rank]
        return tuple(by_expert)


def _capped_shares(weights: list[float], total: float) -> list[float]:
    """``weights`` scaled to sum to ``total``, none above 1: capped ones are fixed at 1 and the
    rest rescaled, until none exceeds 1."""
    capped = [False] * len(weights)
    while True:
        free = sum(w for w, c in zip(weights, capped) if not c)
        left = total - sum(capped)
        shares = [1.0 if c else w * left / free for w, c in zip(weights, capped)]
        over = [i for i, s in enumerate(shares) if s > 1.0 and not capped[i]]
        if not over:
            return shares
        for i in over:
            capped[i] = True


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """``dp`` DP ranks of ``tp`` TP ranks, MoE layers expert parallel over all of them or not."""

    tp: int = 1
    dp: int = 1
    enable_expert_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    @property
    def ep_size(self) -> int:
        """Ranks the routed experts are spread over (1 without expert parallelism)."""
        return self.world_size if self.enable_expert_parallel else 1

    @property
    def uses_all_to_all(self) -> bool:
        """Tokens cross DP ranks to reach their experts (module docstring)."""
        return self.enable_expert_parallel and self.dp > 1

    def experts_per_rank(self, model: ModelConfig) -> int:
        """Routed experts on the rank holding the most: ``ceil(E / ep)``."""
        return -(-model.num_experts // self.ep_size)

    def check(self, model: ModelConfig, *, tp_knob: str = "tensor_parallel",
              dp_knob: str = "data_parallel_size",
              ep_knob: str = "enable_expert_parallel") -> None:
        """One-line KvplanError for a layout vLLM refuses or kvplan does not simulate; the
        knobs are named as the user spells them."""
        for knob, value in ((tp_knob, self.tp), (dp_knob, self.dp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvplanError(f"{knob} must be a positive integer, got {value!r}")
        if self.enable_expert_parallel and not model.is_moe:
            raise KvplanError(f"{ep_knob}: {model.name} is a dense model (no routed experts)")
        if self.enable_expert_parallel and self.world_size == 1:
            raise KvplanError(f"{ep_knob} needs more than one GPU: raise {dp_knob} or {tp_knob}")
        if self.ep_size > model.num_experts > 0:
            raise KvplanError(f"{ep_knob}: {self.ep_size} ranks exceed {model.name}'s"
                              f" {model.num_experts} routed experts (some ranks would hold none)")
        if model.is_moe and self.dp > 1 and not self.enable_expert_parallel:
            raise KvplanError(f"{dp_knob} {self.dp} on MoE model {model.name} is simulated with"
                              f" expert parallelism only: set {ep_knob}")


@dataclass(frozen=True, slots=True)
class RankLoad:
    """What routed tokens put on the EP ranks (module docstring): each rank's expert pick
    probabilities, and the largest per-token mean and variance bound of a rank's pairs."""

    ranks: tuple[tuple[float, ...], ...]  # p_e of each rank's experts
    mean: float  # max_r P_r
    variance: float  # max_r V_r
    log_ranks: float  # 2 · ln(ep)
    max_pairs_per_token: int  # min(k, most experts on a rank)
    uniform: bool

    def busiest_pairs(self, tokens: float) -> float:
        """Expected (expert, token) pairs on the busiest rank for ``tokens`` routed tokens."""
        spread = math.sqrt(self.log_ranks * tokens * self.variance)
        return min(tokens * self.mean + spread, tokens * self.max_pairs_per_token)

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct experts ``tokens`` routed tokens use on the rank where that is
        most: the rank reading the most expert weights. O(1) for uniform routing (the rank with
        the most experts), O(E) for zipf (callers cache it by token count)."""
        if self.uniform:
            experts = self.ranks[0]
            return len(experts) * (1 - (1 - experts[0]) ** tokens)
        return max(sum(1 - (1 - p) ** tokens for p in experts) for experts in self.ranks)


def busiest_rank_load(model: ModelConfig, layout: ParallelLayout,
                      routing: ExpertRouting) -> RankLoad:
    """The EP ranks' loads under ``routing`` (module docstring); with EP off, one rank holding
    every expert."""
    ep = layout.ep_size
    probs = routing.expert_probabilities(model.num_experts, model.experts_per_token)
    ranks = tuple(tuple(probs[e] for e in experts)
                  for experts in _linear_placement(model.num_experts, ep))
    return RankLoad(ranks, max(sum(r) for r in ranks),
                    max(sum(p * (1 - p) for p in r) for r in ranks), 2 * math.log(ep),
                    min(model.experts_per_token, len(ranks[0])),
                    routing.distribution == "uniform")


def remote_ranks_per_token(model: ModelConfig, layout: ParallelLayout, routing: ExpertRouting,
                           gpus_per_node: int) -> tuple[float, float]:
    """Expected ranks of other DP ranks that one token of DP rank 0 is sent to, as (on its node,
    on other nodes); ranks are numbered node-major, ``gpus_per_node`` to a node. A token goes
    once to each rank holding one of its experts (DeepEP's dispatch layout,
    deep_ep/buffer.py ``Buffer.get_dispatch_layout``: ``is_token_in_rank``); the TP ranks of its
    own DP rank already hold it. The ``k`` picks are taken as draws with replacement, rank r
    missed by each with probability ``1 − P_r / k``: exact for ``k = 1`` (a remote share
    ``(ep − 1) / ep`` under uniform routing), 1.4% under the exact hypergeometric for DeepSeek-V3
    at EP 8 (0.656 against 0.665 per rank), and one rule for every routing, so a skew that
    concentrates tokens on fewer ranks lowers the traffic continuously."""
    if not layout.uses_all_to_all:
        return 0.0, 0.0
    k = model.experts_per_token
    probs = routing.expert_probabilities(model.num_experts, k)
    on_node = off_node = 0.0
    placement = _linear_placement(model.num_experts, layout.ep_size)
    for rank in range(layout.tp, layout.ep_size):
        hit = 1 - (1 - sum(probs[e] for e in placement[rank]) / k) ** k
        if rank < gpus_per_node:
            on_node += hit
        else:
            off_node += hit
    return on_node, off_node


def _linear_placement(num_experts: int, ep: int) -> list[range]:
    """Experts of each EP rank under vLLM's linear placement (``determine_expert_map``)."""
    base, extra = divmod(num_experts, ep)
    out, start = [], 0
    for rank in range(ep):
        n = base + (1 if rank < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


__all__ = ["ExpertRouting", "ParallelLayout", "RankLoad", "busiest_rank_load",
           "remote_ranks_per_token"]
