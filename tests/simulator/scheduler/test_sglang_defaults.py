"""SGLang's GPU-dependent server defaults and its max_running_requests, worked out by hand from
``ServerArgs._handle_gpu_memory_settings`` and ``ModelRunner._resolve_max_num_reqs``."""

from __future__ import annotations

import pytest

from simulator.scheduler.sglang import sglang_defaults, sglang_max_running_requests


@pytest.mark.parametrize(("gib", "tp", "chunk", "fraction"), [
    # reserved MiB = 512 + 1.5 × max(chunk, 2048) + 2 × cuda_graph_max_bs + 1024 × TP / 8,
    # at least 10 GiB above 60 GB of memory; fraction = (MiB − reserved) / MiB
    (24, 1, 2048, round((24576 - (512 + 3072 + 48 + 128)) / 24576, 3)),  # L4: graph bs 24
    (40, 1, 4096, round((40960 - (512 + 6144 + 64 + 128)) / 40960, 3)),  # A100 40GB: 32
    (80, 1, 8192, round((81920 - (512 + 12288 + 512 + 128)) / 81920, 3)),  # H100: 256
    (80, 4, 8192, round((81920 - (512 + 12288 + 1024 + 512)) / 81920, 3)),  # H100, TP 4: 512
    (141, 1, 8192, round((144384 - 13440) / 144384, 3)),  # H200
    (192, 8, 16384, round((196608 - (512 + 24576 + 1024 + 1024)) / 196608, 3)),  # B200: 512
])
def test_chunked_prefill_size_and_mem_fraction_static_follow_gpu_memory(gib, tp, chunk, fraction):
    assert sglang_defaults(gib, tensor_parallel=tp) == {"chunked_prefill_size": chunk,
                                                        "mem_fraction_static": fraction}


def test_small_gpus_keep_the_10_gib_floor_off():
    # 24 GiB: 3,760 MiB reserved, far below 10 GiB, and the floor applies only above 60 GB
    assert sglang_defaults(24)["mem_fraction_static"] == 0.847


@pytest.mark.parametrize(("capacity", "context", "requested", "expected"), [
    (400_000, 8192, None, 4096),  # 400000 / 8192 × 512 = 25000, clamped to 4096
    (400_000, 131072, None, 2048),  # 1562, clamped up to 2048
    (3_000, 8192, None, 1500),  # capacity // 2 is smaller
    (400_000, 8192, 256, 256),  # --max-running-requests 256
    (300, 8192, 256, 150),  # ... but never above capacity // 2
])
def test_max_running_requests_follows_the_pool(capacity, context, requested, expected):
    assert sglang_max_running_requests(capacity, context, requested) == expected
