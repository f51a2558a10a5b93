"""Attention and KV-store kernels over the paged KV pool, with one entry point per operation.

``decode_attention`` and ``write_kv`` run the Triton kernels on CUDA tensors and the torch
reference otherwise; ``prefill_attention`` is the torch reference (the engine's prefill path).
``backend="triton"`` on CPU tensors runs the kernels in Triton's interpreter, which needs
TRITON_INTERPRET=1 set before the first kernel import.

Triton is imported lazily, on the first Triton call: importing this package must work on a
machine without Triton, and triton.jit reads TRITON_INTERPRET when the kernels are defined.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Literal

import torch

from backend.kernels.reference import (
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    store_kv_ref,
)

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")

prefill_attention = paged_prefill_attention_ref


def triton_available() -> bool:
    """True when the triton package can be imported."""
    return importlib.util.find_spec("triton") is not None


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend '{backend}' (known: {', '.join(BACKENDS)})")
    if backend == "torch":
        return False
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' but the triton package is not installed")
        return True
    return device.type == "cuda" and triton_available()


def _kernel_module(name: str) -> ModuleType:
    return importlib.import_module(f"backend.kernels.{name}")


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, *,
                     scale: float | None = None, num_splits: int | None = None,
                     out: torch.Tensor | None = None, block_size: int | None = None,
                     k_scale: float = 1.0, v_scale: float = 1.0,
                     max_context_len: int | None = None, backend: Backend = "auto") -> torch.Tensor:
    """Paged decode attention ``query [B, H_q, d_h]`` -> ``[B, H_q, d_h]`` (see
    :func:`backend.kernels.reference.paged_decode_attention_ref` for the contract).

    ``backend``: "auto" (Triton on CUDA when installed, torch otherwise), "triton" or "torch".
    ``num_splits`` and ``max_context_len`` only steer the Triton kernel. Raises ValueError on
    inconsistent inputs or an unusable backend.
    """
    if _use_triton(backend, query.device):
        return _kernel_module("paged_attention").paged_decode_attention(
            query, k_cache, v_cache, block_tables, context_lens, scale=scale, num_splits=num_splits,
            out=out, block_size=block_size, k_scale=k_scale, v_scale=v_scale, max_context_len=max_context_len)
    return paged_decode_attention_ref(query, k_cache, v_cache, block_tables, context_lens, scale=scale,
                                      out=out, block_size=block_size, k_scale=k_scale, v_scale=v_scale)


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0,
             backend: Backend = "auto") -> None:
    """Scatter new ``key``/``value`` ``[T, H_kv, d_h]`` into pool slots ``slot_mapping``
    (negative = skip); see :func:`backend.kernels.reference.store_kv_ref`. ``backend`` as in
    :func:`decode_attention`."""
    if _use_triton(backend, key.device):
        _kernel_module("store").store_kv(key, value, k_cache, v_cache, slot_mapping,
                                         k_scale=k_scale, v_scale=v_scale)
        return
    store_kv_ref(key, value, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)


__all__ = [
    "BACKENDS",
    "Backend",
    "decode_attention",
    "paged_decode_attention_ref",
    "paged_prefill_attention_ref",
    "prefill_attention",
    "store_kv_ref",
    "triton_available",
    "write_kv",
]
