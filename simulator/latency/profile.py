"""The calibrated step-latency model: a profile file measured on a real device by ``kvplan calibrate``.

A profile is YAML, versioned by ``kvplan_profile: 1``::

    kvplan_profile: 1
    model: Llama-3.1-8B          # catalog name of the model whose shapes were run
    tensor_parallel: 1
    kv_cache_dtype: bf16
    block_size: 16
    device: NVIDIA H200          # what the device called itself ("cpu" on a CPU)
    gpu: H200-141GB              # catalog name when known, else null
    created: 2026-11-29T14:00:00Z
    versions: {kvplan: 0.1.0, torch: 2.11.0, triton: 3.6.0, python: 3.12.3}
    latency_model:
      form: linear-v1
      coefficients_s: {const: 4.1e-3, prefill_seqs: 1.0e-4, prefill_tokens: 6.0e-5, prefill_attention_pairs: 1.1e-10,
                       decode_seqs: 2.0e-5, decode_context_tokens: 2.3e-8, copy_tokens: 1.0e-8,
                       swap_tokens: 0.0}
    fit: {num_samples: 120, mape_train: 0.021, mape_heldout: 0.034}
    sweep: [{kind: decode, batch: 8, context: 1024, measured_s: 0.0071, predicted_s: 0.0069, ...}]

Form ``linear-v1``: a step takes ``Σ coefficient × feature`` seconds, with the features of
:func:`features` — a constant (launch and framework overhead, the weight read of decode), prefill
tokens (the GEMMs), prefill attention pairs (causal attention work), decoding sequences, decode
context tokens (the KV read, which is what makes decode memory-bound), and KV tokens copied
on device (copy-on-write) or over PCIe (swap); prefill chunks count too (each is its own
attention call). A profile that lacks a term reads it as 0. The fit minimises the *relative* squared error
with non-negative coefficients, so short and long steps count alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import KvplanError
from simulator.kv.models import canonical_dtype
from simulator.scheduler.plan import StepPlan
from simulator.yamlfile import read_yaml

PROFILE_VERSION = 1
FORM = "linear-v1"
FEATURES: tuple[str, ...] = (
    "const", "prefill_seqs", "prefill_tokens", "prefill_attention_pairs", "decode_seqs",
    "decode_context_tokens", "copy_tokens", "swap_tokens",
)


def features(plan: StepPlan, block_size: int) -> tuple[float, ...]:
    """The feature vector of a step, in :data:`FEATURES` order."""
    swap_tokens = (plan.num_swap_in_blocks + plan.num_swap_out_blocks) * block_size
    return (
        1.0,
        float(len(plan.prefills)),
        float(plan.num_prefill_tokens),
        float(plan.prefill_attention_pairs),
        float(plan.num_decode_seqs),
        float(plan.decode_context_tokens),
        float(plan.num_copy_tokens),
        float(swap_tokens),
    )


def fit_linear(x: np.ndarray, y: np.ndarray, *, relative: bool = True) -> np.ndarray:
    """Non-negative coefficients minimising Σ ((x·c − y) / y)² (or Σ (x·c − y)² with
    ``relative=False``).

    Relative errors suit a sweep whose shapes span orders of magnitude. Absolute errors suit the
    steps of a served trace: their residuals sum to ~0, so the total busy time — and with it
    throughput and end-to-end latency — is not biased (relative least squares under-predicts
    noisy steps on average).

    Columns that are all zero get 0. A negative least-squares coefficient is pinned to 0 and the
    rest refitted (an active-set loop; a handful of columns, so it converges in a few rounds).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != y.shape[0] or np.any(y <= 0):
        raise ValueError("fit_linear needs a 2-D x with one positive y per row")
    w = 1.0 / y if relative else np.ones_like(y)
    xw, yw = x * w[:, None], y * w
    scale = np.where(np.abs(xw).max(axis=0) > 0, np.abs(xw).max(axis=0), 1.0)
    active = [j for j in range(x.shape[1]) if np.any(x[:, j] != 0)]
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(xw[:, active] / scale[active], yw, rcond=None)
        sol = sol / scale[active]
        if np.all(sol >= 0):
            coef[active] = sol
            break
        active = [j for j, c in zip(active, sol) if c >= 0] if np.any(sol > 0) else []
    return coef


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    return float(np.mean(np.abs(p - m) / m)) if len(m) else math.nan


@dataclass(frozen=True)
class Profile:
    path: str
    model: str
    tensor_parallel: int
    kv_cache_dtype: str
    block_size: int
    device: str
    gpu: str | None
    coefficients_s: Mapping[str, float]
    raw: Mapping[str, Any]


def read_profile(path: str | Path) -> Profile:
    """Parse and validate a profile file; any problem is a one-line KvplanError naming the file."""
    where = str(path)
    raw = read_yaml(path, "profile")
    if not isinstance(raw, dict) or "kvplan_profile" not in raw:
        raise KvplanError(f"{where}: not a kvplan profile (no 'kvplan_profile' version key)")
    if raw["kvplan_profile"] != PROFILE_VERSION:
        raise KvplanError(
            f"{where}: profile version {raw['kvplan_profile']!r}, this kvplan reads version {PROFILE_VERSION}"
        )
    for key in ("model", "tensor_parallel", "kv_cache_dtype", "block_size", "device", "latency_model"):
        if key not in raw:
            raise KvplanError(f"{where}: missing key '{key}'")
    for key in ("tensor_parallel", "block_size"):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KvplanError(f"{where}: {key} must be a positive integer, got {value!r}")
    for key in ("model", "kv_cache_dtype", "device"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise KvplanError(f"{where}: {key} must be a name, got {raw[key]!r}")
    if raw.get("gpu") is not None and not isinstance(raw["gpu"], str):
        raise KvplanError(f"{where}: gpu must be a catalog name or null, got {raw['gpu']!r}")
    lm = raw["latency_model"]
    if not isinstance(lm, dict) or lm.get("form") != FORM:
        raise KvplanError(f"{where}: latency_model.form must be '{FORM}'")
    coefs = lm.get("coefficients_s")
    if not isinstance(coefs, dict):
        raise KvplanError(f"{where}: latency_model.coefficients_s must be a mapping")
    unknown = set(coefs) - set(FEATURES)
    if unknown:
        raise KvplanError(f"{where}: latency_model.coefficients_s: unknown term '{sorted(unknown)[0]}'")
    clean: dict[str, float] = {}
    for name in FEATURES:
        value = coefs.get(name, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise KvplanError(f"{where}: latency_model.coefficients_s.{name} must be a number >= 0, got {value!r}")
        clean[name] = float(value)
    if clean["const"] <= 0 and all(v == 0 for v in clean.values()):
        raise KvplanError(f"{where}: every latency coefficient is zero")
    return Profile(
        path=where, model=raw["model"], tensor_parallel=raw["tensor_parallel"],
        kv_cache_dtype=raw["kv_cache_dtype"], block_size=raw["block_size"],
        device=raw["device"], gpu=raw.get("gpu"), coefficients_s=clean, raw=raw,
    )


def check_profile_matches(
    profile: Profile, *, model: str, tensor_parallel: int, kv_cache_dtype: str, gpu: str | None
) -> None:
    """A profile measured for another model, TP degree, KV dtype or GPU is refused (use --force)."""
    wanted = {"model": model, "tensor_parallel": tensor_parallel, "kv_cache_dtype": kv_cache_dtype}
    got = {"model": profile.model, "tensor_parallel": profile.tensor_parallel,
           "kv_cache_dtype": profile.kv_cache_dtype}
    if gpu is not None and profile.gpu is not None:
        wanted["gpu"], got["gpu"] = gpu, profile.gpu
    same_dtype = _same_dtype(str(got["kv_cache_dtype"]), str(wanted["kv_cache_dtype"]))
    for key, value in wanted.items():
        if key == "kv_cache_dtype" and same_dtype:
            continue
        if str(got[key]).lower() != str(value).lower():
            raise KvplanError(
                f"{profile.path}: profile measured for {key} {got[key]}, but the scenario asks for "
                f"{value}; use a matching profile (kvplan calibrate) or pass --force"
            )


def _same_dtype(a: str, b: str) -> bool:
    """bf16 and bfloat16 are one dtype; names that are no dtype compare as written."""
    try:
        return canonical_dtype(a) == canonical_dtype(b)
    except KvplanError:
        return a.lower() == b.lower()


class ProfileLatency:
    """Step latency from a calibrated profile (form ``linear-v1``)."""

    def __init__(self, profile: Profile, *, block_size: int):
        """``block_size`` is the simulated deployment's (plans count swapped KV in its blocks)."""
        self.profile = profile
        self._coef = tuple(profile.coefficients_s[name] for name in FEATURES)
        self._block_size = block_size

    def step_latency_s(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        return sum(c * f for c, f in zip(self._coef, features(plan, self._block_size)) if c)

    def describe(self) -> dict[str, Any]:
        return {"model": "profile", "path": self.profile.path, "device": self.profile.device,
                "form": FORM, "coefficients_s": dict(self.profile.coefficients_s)}
