"""Backend tests run the Triton kernels in Triton's CPU interpreter.

triton.jit reads TRITON_INTERPRET when a kernel is defined, and pytest imports this file before
any test module, so setting it here (unless the caller chose otherwise) comes first.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
