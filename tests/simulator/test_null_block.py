"""vLLM V1's null block: its ``BlockPool`` takes block 0 off the free queue as a placeholder
(vllm/v1/core/block_pool.py, ``BlockPool.__init__``: ``self.null_block =
self.free_block_queue.popleft()``), so a pool of N blocks hands out N − 1; the other engines use
every block. The start-up log's count (``num_blocks``) and the concurrency line
(``get_max_concurrency_for_kv_cache_config``) keep all N."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.config.deployment import build_deployment
from simulator.config.scenario import parse_scenario
from simulator.errors import KvplanError
from simulator.scheduler import make_scheduler
from workloads.request import Request

BASE = {"name": "null-block", "model": "tiny", "gpu": "h100", "block_size": 16, "max_model_len": 64,
        "max_num_seqs": 8, "max_num_batched_tokens": 128, "num_gpu_blocks_override": 6,
        "enable_prefix_caching": False, "workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": 1.0}, "prompt_tokens": {"dist": "fixed", "value": 32},
                                                     "output_tokens": {"dist": "fixed", "value": 17}}}


def _deployment(**over):  # type: ignore[no-untyped-def]
    return build_deployment(parse_scenario({**BASE, **over}, "null-block"), Path("."))


@pytest.mark.parametrize(("engine", "usable"), [("vllm-v1", 5), ("vllm-v0", 6)])
def test_v1_hands_out_one_block_fewer_than_its_pool(engine: str, usable: int) -> None:
    dep = _deployment(engine=engine)
    assert (dep.num_blocks, dep.usable_blocks) == (6, usable)
    assert dep.capacity_tokens == usable * 16
    assert dep.max_concurrency == 6 * 16 / 64  # vLLM's start-up line counts every block
    alloc = dep.make_allocator("paged")
    assert alloc.num_blocks == usable
    # the contiguous baselines get the same memory
    assert dep.make_allocator("contiguous-max").capacity_tokens == usable * 16
    assert dep.describe()["usable_blocks"] == usable


def test_the_null_block_makes_v1_preempt_where_vllm_does() -> None:
    """6 blocks of 16, two requests of 32 prompt + 17 output tokens (benchmarks/parity_vllm.py's
    ``null-block`` case, where vLLM 0.33.0 preempts request 1 at step 1). Step 0 prefills both:
    2 blocks each, 4 of the 5 usable. Step 1 decodes token 33 of each, which needs a third block
    apiece (grow before write): request 0 takes the last free block, request 1 finds none and
    is preempted, the newest running request. With all 6 blocks usable both would grow."""
    dep = _deployment()
    alloc = dep.make_allocator("paged")
    sched = make_scheduler(alloc, dep.scheduler_config)
    for i in range(2):
        sched.add_request(Request(i, 0.0, 32, 17))
    plan = sched.schedule()
    assert [c.num_tokens for c in plan.prefills] == [32, 32] and not plan.preempted
    sched.complete(plan)
    assert alloc.num_free_blocks() == 1
    plan = sched.schedule()
    assert plan.preempted == (1,) and plan.num_decode_seqs == 1
    sched.complete(plan)
    alloc.check_invariants()


def test_a_v1_pool_of_one_block_is_refused() -> None:
    with pytest.raises(KvplanError, match="null block"):
        _deployment(num_gpu_blocks_override=1, max_model_len=16, workload={
            "num_requests": 1, "arrival": {"process": "poisson", "rate": 1.0}, "prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 4}})
