"""Backend tests run the Triton kernels in Triton's CPU interpreter.

triton.jit reads TRITON_INTERPRET when a kernel is defined, and pytest imports this file before
any test module, so setting it here (unless the caller chose otherwise) comes first.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared CPU, spinning worker threads make timings erratic."""
    import torch  # after TRITON_INTERPRET is set above

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
