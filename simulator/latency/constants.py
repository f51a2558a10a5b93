"""The roofline's constants, and their defaults fitted to published GPU measurements.

The roofline (:mod:`simulator.latency.roofline`) turns bytes and FLOPs into seconds with six
constants. Their defaults are not chosen by taste: ``kvplan validate --fit --write`` fits them to
``validation/published.csv`` (published vLLM, NIM/TensorRT-LLM and paper measurements, each row
with its source) and writes ``roofline_fit.json`` next to this module, with the fit's provenance —
which rows, the error in sample and leave one source out. A scenario may override any of them
under ``latency:``.

``roofline_fit.json``::

    {"kvplan_roofline_fit": 1,
     "constants": {"mem_efficiency": 0.8, ...},             # every GPU
     "per_architecture": {"hopper": {...every field...}},  # fitted on that architecture's
                                                            # silicon rows (validate --silicon --fit)
     "per_gpu": {"A100-80GB": {"mem_efficiency": 0.85}},    # where the data says a GPU differs
     "allreduce_latency_s": {"fabric": 2e-5, "pcie": 2e-5}, # per call, by interconnect kind
     "fit": {...}}                                          # what it was fitted on, and its error
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError
from simulator.kv.gpus import GPUSpec, architecture

FIT_PATH = Path(__file__).with_name("roofline_fit.json")
FIT_VERSION = 1


@dataclass(frozen=True, slots=True)
class RooflineConstants:
    """What the roofline cannot derive from datasheets: achieved shares of peak, and fixed costs.

    * ``mem_efficiency``: achieved share of HBM bandwidth (weights and KV streamed per step).
    * ``flops_efficiency``: achieved share of dense 16-bit tensor-core peak (16-bit GEMMs and
      all attention).
    * ``fp8_flops_efficiency``: achieved share of the 8-bit peak by FP8/INT8 GEMMs (their
      kernels reach a smaller share of a twice-as-high peak).
    * ``moe_flops_efficiency``: achieved share of the GEMMs' peak by routed-expert GEMMs (many
      small grouped GEMMs, a token's rows scattered over experts: far from a dense GEMM's share).
    * ``step_overhead_s``: per step (scheduling, launches, sampling, detokenisation).
    * ``prefill_overhead_s``: extra per step that runs a prefill chunk.
    * ``allreduce_latency_s``: per all-reduce call (two per layer) at TP > 1, beyond its bytes.
    * ``request_overhead_s``: per request, outside the engine's steps: the serving front end
      (HTTP, chat template and tokenisation on the way in; detokenisation and streaming on the way
      out). Benchmarks measure TTFT and E2E at the client, so it is in what they report; it is
      added to every request's TTFT and E2E and takes no GPU time.
    """

    mem_efficiency: float
    flops_efficiency: float
    fp8_flops_efficiency: float
    moe_flops_efficiency: float
    step_overhead_s: float
    prefill_overhead_s: float
    allreduce_latency_s: float
    request_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("mem_efficiency", "flops_efficiency", "fp8_flops_efficiency",
                     "moe_flops_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise KvplanError(f"roofline {name} must be in (0, 1], got {value}")
        for name in ("step_overhead_s", "prefill_overhead_s", "allreduce_latency_s",
                     "request_overhead_s"):
            value = getattr(self, name)
            if not 0 <= value <= 10:
                raise KvplanError(f"roofline {name} must be in [0, 10] s, got {value}")

    def replace(self, **changes: float | None) -> RooflineConstants:
        """A copy with the non-None ``changes`` applied (a scenario's overrides)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RooflineConstants))


def interconnect_kind(gpu: GPUSpec) -> str:
    """``"fabric"`` for a GPU-to-GPU fabric (NVLink, Infinity Fabric), ``"pcie"`` when GPUs
    talk over the host link only (the catalog then gives them the same bandwidth)."""
    return "pcie" if gpu.interconnect_bandwidth_bytes_s <= gpu.pcie_bandwidth_bytes_s else "fabric"


@lru_cache(maxsize=1)
def read_fit(path: Path | None = None) -> dict[str, Any]:
    """The fit file (default :data:`FIT_PATH`; see the module docstring). A missing or malformed
    file is a broken install."""
    path = path if path is not None else FIT_PATH
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("kvplan_roofline_fit") != FIT_VERSION:
        raise RuntimeError(f"{path}: not a version-{FIT_VERSION} roofline fit")
    return data


def default_constants(gpu: GPUSpec, fit: dict[str, Any] | None = None) -> RooflineConstants:
    """The fitted constants for ``gpu``: the global fit with the all-reduce latency of its
    interconnect kind, then its architecture's set where one was fitted (``per_architecture``:
    fitted on that architecture's silicon measurements, every field), then the GPU's own
    overrides."""
    fit = fit if fit is not None else read_fit()
    values = dict(fit["constants"])
    latency = fit.get("allreduce_latency_s", {})
    values["allreduce_latency_s"] = latency.get(interconnect_kind(gpu), values.get("allreduce_latency_s", 0.0))
    values.update(fit.get("per_architecture", {}).get(architecture(gpu), {}))
    values.update(fit.get("per_gpu", {}).get(gpu.name, {}))
    return RooflineConstants(**{k: float(values[k]) for k in FIELDS})


def global_constants(gpu: GPUSpec, fit: dict[str, Any] | None = None) -> RooflineConstants:
    """The constants ``gpu`` takes from the global set alone (no architecture's set): where an
    architecture's fit starts."""
    fit = fit if fit is not None else read_fit()
    return default_constants(gpu, {**fit, "per_architecture": {}})


def constants_set(gpu: GPUSpec, fit: dict[str, Any] | None = None) -> str:
    """Which fitted set ``gpu`` takes: ``"global"``, or its architecture's name."""
    fit = fit if fit is not None else read_fit()
    arch = architecture(gpu)
    return arch if arch in fit.get("per_architecture", {}) else "global"


def fit_provenance(fit: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the defaults were fitted on, and how well they fit (for run.json and reports)."""
    fit = fit if fit is not None else read_fit()
    return dict(fit.get("fit", {}))
