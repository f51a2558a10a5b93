"""Continuous batching: queues, admission, preemption -> StepPlan. Knows nothing of time.

Three engines' policies share the StepPlan seam (``schedule()`` -> executor -> ``complete()``)
and the engine's quiet-run protocol, so the simulator and the real backend run any of them:

* ``vllm-v1`` (:mod:`simulator.scheduler.v1`): vLLM's V1 engine, the default since vLLM 0.8.0
  ("We have now enabled V1 engine by default", vllm-project/vllm#13726, v0.8.0 release notes),
  with speculative decoding in :mod:`simulator.scheduler.spec`;
* ``vllm-v0`` (:mod:`simulator.scheduler.v0`): vLLM's V0 engine as its last release (0.10.2) ran
  it, on the machinery of :mod:`simulator.scheduler.core`;
* ``sglang`` (:mod:`simulator.scheduler.sglang`): SGLang's scheduler over a token pool with a
  radix prefix cache;
* ``trtllm`` (:mod:`simulator.scheduler.trtllm`): TensorRT-LLM's PyTorch backend, a capacity
  scheduler (GUARANTEED_NO_EVICT or MAX_UTILIZATION) then a micro-batch scheduler.
"""

from __future__ import annotations

from simulator.kv.allocator import KVAllocator
from simulator.scheduler.config import ENGINES, EngineName, SchedulerConfig
from simulator.scheduler.core import Scheduler
from simulator.scheduler.state import Group, Status, StepOutcome


def make_scheduler(allocator: KVAllocator, config: SchedulerConfig, *, detail: bool = False,
                   keep_groups: bool = True) -> Scheduler:
    """The scheduler of ``config.engine`` over ``allocator``."""
    if config.engine == "vllm-v0":
        from simulator.scheduler.v0 import V0Scheduler
        return V0Scheduler(allocator, config, detail=detail, keep_groups=keep_groups)
    if config.engine == "vllm-v1" and config.num_speculative_tokens:
        from simulator.scheduler.spec import SpecDecodeScheduler
        return SpecDecodeScheduler(allocator, config, detail=detail, keep_groups=keep_groups)
    if config.engine == "vllm-v1":
        from simulator.scheduler.v1 import V1Scheduler
        return V1Scheduler(allocator, config, detail=detail, keep_groups=keep_groups)
    if config.engine == "sglang":
        from simulator.scheduler.sglang import SGLangScheduler
        return SGLangScheduler(allocator, config, detail=detail, keep_groups=keep_groups)  # type: ignore[return-value]
    if config.engine == "trtllm":
        from simulator.scheduler.trtllm import TRTLLMScheduler
        return TRTLLMScheduler(allocator, config, detail=detail, keep_groups=keep_groups)
    raise ValueError(f"unknown engine {config.engine!r} (known: {', '.join(ENGINES)})")


__all__ = ["ENGINES", "EngineName", "Group", "Scheduler", "SchedulerConfig", "Status", "StepOutcome",
           "make_scheduler"]
