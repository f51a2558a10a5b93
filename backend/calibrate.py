"""``calibrate``: time a sweep of step shapes on a device, fit the linear-v1 latency model, write a profile.

The sweep (plans built directly on a PagedAllocator, with the SeqDetails a detail-mode
scheduler would produce)::

    decode    batch 1..256 × contexts: uniform short, uniform long, one very long + many short
    prefill   chunk 16..max_num_batched_tokens × cached context 0..
    mixed     a prefill chunk plus a batch of short decodes
    copy      decodes whose last blocks are copied first (copy-on-write)
    swap      decodes plus blocks swapped out or in over PCIe

Two sizes: the full sweep (the default on a GPU) and a quick one (the default on a CPU, where
the full sweep's 8k-token prefills take minutes per shape at a real model's widths: the quick
sweep of llama-3.1-8b with ``--layers 1`` takes about half a minute on one idle core). Before
the sweep, the lightest and the heaviest shape are timed once and the sweep's wall time is
estimated from them (:func:`estimate_sweep_s`), so a user knows at the start what to expect.

Each shape runs a few warm-up times, then the median of the repeats is kept (CUDA events on a
GPU, perf_counter on a CPU). With ``layers`` k < L the per-layer part of every step (KV copies,
the layer stack) is scaled by L / k. ``fit_linear`` is fitted on the features of every shape but
every 4th, which is held out to report the error on shapes the fit did not see. The profile is
written in the format of :mod:`simulator.latency.profile`.
"""

from __future__ import annotations

import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from backend.machine_load import StageLoad, sample_load
from backend.model import rank_shape, torch_dtype
from backend.runner import ModelRunner
from simulator.errors import KvplanError
from simulator.kv.gpus import list_gpus
from simulator.kv.models import ModelConfig, canonical_dtype, get_model
from simulator.kv.paged import PagedAllocator
from simulator.kv.sizing import resolve_kv_dtype
from simulator.latency.profile import FEATURES, FORM, PROFILE_VERSION, features, fit_linear, mape
from simulator.scheduler.plan import PrefillChunk, SeqDetail, StepPlan
from simulator.scheduler import Scheduler, SchedulerConfig
from workloads.request import Request

HELDOUT_EVERY = 4  # every 4th shape is held out of the fit
POOL_MEMORY_FRACTION = 0.35  # of the device memory left after the weights: the rest is for activations
ATTENTION_MEMORY_FRACTION = 0.25  # the reference prefill attention materialises T × N fp32 scores per head

# catalog GPU of a device name (first match wins: 40 GB A100s before the 80 GB default)
_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"H200", "H200-141GB"), (r"H100(?!.*NVL)", "H100-80GB"), (r"A100.*40\s*GB", "A100-40GB"),
    (r"A100", "A100-80GB"), (r"\bL4\b", "L4"), (r"A10G", "A10G"), (r"4090", "RTX-4090"),
    (r"MI300X", "MI300X"),
)


@dataclass(frozen=True, slots=True)
class Shape:
    """One step shape of the sweep."""

    kind: str  # decode | prefill | mixed | copy | swap
    label: str  # the context distribution or what varies
    decode_contexts: tuple[int, ...] = ()  # KV tokens of each decoding sequence after its write
    chunk_tokens: int = 0
    cached_tokens: int = 0
    num_copies: int = 0  # decoding sequences whose last block is copied first
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0

    def num_blocks(self, block_size: int) -> int:
        """Pool blocks the shape occupies (tables plus copy destinations)."""
        tables = sum(-(-c // block_size) for c in self.decode_contexts)
        return tables + -(-(self.cached_tokens + self.chunk_tokens) // block_size) + self.num_copies

    @property
    def max_len_tokens(self) -> int:
        return max(max(self.decode_contexts, default=0), self.cached_tokens + self.chunk_tokens)

    @property
    def work_tokens(self) -> int:
        """Tokens the step pushes through the layers (prefill chunk + one per decode): the
        proxy of its cost that :func:`estimate_sweep_s` interpolates on."""
        return self.chunk_tokens + len(self.decode_contexts)


@dataclass(frozen=True, slots=True)
class SweepLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


def sweep_shapes(limits: SweepLimits, *, quick: bool, block_size: int, seed: int = 0) -> list[Shape]:
    """The shapes to time, deterministic for a seed; every shape fits ``limits``."""
    rng = np.random.default_rng(seed)
    cap = limits.max_model_len - 1

    def contexts(low: int, high: int, count: int) -> tuple[int, ...]:
        return tuple(int(x) for x in rng.integers(min(low, cap), min(high, cap) + 1, count))

    short, long, very_long = ((8, 64), (128, 512), 1024) if quick else ((16, 512), (1024, 4096), 16384)
    # quick: 26 shapes, 6 of them held out, for 8 coefficients; each size between its neighbours
    # so that the held-out shapes test interpolation
    batches = (1, 4, 8, 16) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256)
    chunks = (16, 64, 128, 256) if quick else (16, 64, 256, 512, 1024, 2048, 4096, 8192)
    cached = (0, 128) if quick else (0, 1024, 4096)
    shapes: list[Shape] = []
    for b in (b for b in batches if b <= limits.max_num_seqs):
        shapes.append(Shape("decode", "uniform-short", contexts(*short, b)))
        shapes.append(Shape("decode", "uniform-long", contexts(*long, b)))
        if b > 1:
            shapes.append(Shape("decode", "one-long", (min(very_long, cap),) + contexts(8, 256, b - 1)))
    for n in (n for n in chunks if n <= limits.max_num_batched_tokens):
        for m in cached:
            if m + n <= limits.max_model_len and (m == 0 or n <= 2048):
                shapes.append(Shape("prefill", f"cached-{m}", chunk_tokens=n, cached_tokens=m))
    mixed = ((32, 4), (128, 8)) if quick else ((256, 8), (256, 64), (2048, 8), (2048, 64))
    for n, b in mixed:
        if n + b <= limits.max_num_batched_tokens and b < limits.max_num_seqs:
            shapes.append(Shape("mixed", f"chunk-{n}", contexts(*short, b), chunk_tokens=n))
    # copies: the copied block holds half a block (the write lands in its middle)
    half = block_size // 2 + 1
    for b in (b for b in ((4,) if quick else (8, 64)) if b <= limits.max_num_seqs):
        length = min(-(-256 // block_size) * block_size + half, cap)
        shapes.append(Shape("copy", f"copies-{b}", (length,) * b, num_copies=b))
    for blocks in ((8, 32) if quick else (16, 128, 512)):
        shapes.append(Shape("swap", f"out-{blocks}", contexts(*short, 4), num_swap_out_blocks=blocks))
        shapes.append(Shape("swap", f"in-{blocks}", contexts(*short, 4), num_swap_in_blocks=blocks))
    return shapes


def build_plan(shape: Shape, alloc: PagedAllocator, step_id: int = 0) -> tuple[StepPlan, list[int]]:
    """The detail-mode plan of ``shape`` on ``alloc``; returns it with the sequence ids to free."""
    seqs: list[int] = []

    def allocate(num_tokens: int) -> int:
        seq = max(alloc.block_tables, default=-1) + 1
        if alloc.allocate(seq, num_tokens, num_tokens) is None:
            raise ValueError(f"the pool cannot hold shape {shape}")
        seqs.append(seq)
        return seq

    details: list[SeqDetail] = []
    chunks: tuple[PrefillChunk, ...] = ()
    if shape.chunk_tokens:
        m, n = shape.cached_tokens, shape.chunk_tokens
        seq = allocate(m + n)
        chunks = (PrefillChunk(seq, n, m, True),)
        details.append(SeqDetail(seq, m, n, m + n, alloc.block_table(seq),
                                 tuple(alloc.slot_mapping(seq, m, n))))
    for c in shape.decode_contexts:
        seq = allocate(c)
        details.append(SeqDetail(seq, c - 1, 1, c, alloc.block_table(seq),
                                 tuple(alloc.slot_mapping(seq, c - 1, 1))))
    copies: list[tuple[int, int]] = []
    copy_tokens = 0
    if shape.num_copies:
        targets = alloc.block_table(allocate(shape.num_copies * alloc.block_size))
        for d, dst in zip(details[len(chunks):], targets):
            copies.append((d.block_table[-1], dst))
            copy_tokens += (d.context_len - 1) % alloc.block_size
    lens = shape.decode_contexts
    plan = StepPlan(
        step_id=step_id, prefills=chunks, num_decode_seqs=len(lens), decode_context_tokens=sum(lens),
        decode_context_sq=float(sum(c * c for c in lens)), decode_max_context=max(lens, default=0),
        num_swap_out_blocks=shape.num_swap_out_blocks, num_swap_in_blocks=shape.num_swap_in_blocks,
        cow_copies=tuple(copies), num_copy_tokens=copy_tokens, details=tuple(details),
    )
    return plan, seqs


@dataclass(frozen=True)
class CalibrateOptions:
    model: str
    tp: int = 1
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: the model's torch_dtype
    layers: int | None = None
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    quick: bool | None = None  # None: the quick sweep on a CPU, the full one on a GPU
    seed: int = 0
    # the sweep stays inside these (a scenario's limits); None: the sweep's defaults
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None


@dataclass
class Calibration:
    profile: dict[str, Any]
    num_skipped_shapes: int = 0  # shapes dropped because they did not fit the device's memory


@dataclass(frozen=True, slots=True)
class SweepEstimate:
    """What the sweep will take, from two shapes timed before it starts."""

    setup_s: float  # already spent: building the model with random weights, timing the two shapes
    num_shapes: int
    runs_per_shape: int  # warm-up runs + timed repeats
    light_step_s: float  # wall time of one run of the lightest shape
    heavy_step_s: float  # ... and of the heaviest
    total_s: float  # the sweep's predicted wall time

    def describe(self) -> str:
        return (f"model ready in {_duration(self.setup_s)}; sweep of {self.num_shapes} shapes × "
                f"{self.runs_per_shape} runs: about {_duration(self.total_s)} more (one run takes "
                f"{1e3 * self.light_step_s:,.0f} ms for the lightest shape, "
                f"{1e3 * self.heavy_step_s:,.0f} ms for the heaviest)")


def estimate_sweep_s(shapes: list[Shape], light_s: float, heavy_s: float, runs_per_shape: int) -> float:
    """The sweep's wall time: each shape's run time interpolated linearly in
    :attr:`Shape.work_tokens` between the lightest shape's (``light_s``) and the heaviest's
    (``heavy_s``), times the runs per shape. Attention over long contexts is not in the proxy, so
    this is an estimate; the progress bar's remaining time corrects it as shapes complete."""
    if not shapes:
        return 0.0
    lo = min(s.work_tokens for s in shapes)
    hi = max(s.work_tokens for s in shapes)
    slope = (heavy_s - light_s) / (hi - lo) if hi > lo else 0.0
    return runs_per_shape * sum(light_s + slope * (s.work_tokens - lo) for s in shapes)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def resolve_device(name: str | None) -> torch.device:
    """``cuda``/``cuda:N``/``cpu`` (None: cuda when available). No CUDA for a cuda request -> KvplanError."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name.strip().lower()):
        raise KvplanError(f"unknown --device '{name}' (known: cuda, cuda:N, cpu)")
    device = torch.device(name.strip().lower())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KvplanError("no CUDA device: use --device cpu")
    return device


def match_gpu(device_name: str) -> str | None:
    """The catalog GPU a device calls itself (``"NVIDIA H200"`` -> ``"H200-141GB"``), or None."""
    for pattern, gpu in _GPU_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            assert gpu in list_gpus()
            return gpu
    return None


def calibrate(opts: CalibrateOptions, *, on_shape: Callable[[int, int], None] | None = None,
              on_estimate: Callable[[SweepEstimate], None] | None = None,
              on_stage: Callable[[str], None] | None = None) -> Calibration:
    """Run the sweep and fit; returns the profile (not yet written). Bad options -> KvplanError.

    ``on_stage(message)`` is called once the options are valid, before the model is built;
    ``on_estimate(estimate)`` once, before the sweep, with its predicted wall time (two shapes
    are timed for it, so it is only computed when asked for); ``on_shape(done, total)`` after
    each timed shape.
    """
    model = get_model(opts.model)
    device = resolve_device(opts.device)
    quick = opts.quick if opts.quick is not None else device.type == "cpu"
    if opts.block_size < 1:
        raise KvplanError(f"--block-size must be positive, got {opts.block_size}")
    shape = rank_shape(model, tp=opts.tp, num_layers=opts.layers)
    dtype_name = canonical_dtype(opts.dtype or model.torch_dtype, "--dtype")
    compute = torch_dtype(dtype_name)
    if opts.kv_cache_dtype.strip().lower() == "auto":
        kv_name, kv = dtype_name, compute  # vLLM's auto: the KV cache in the model's dtype
    else:
        kv_name = resolve_kv_dtype(model, opts.kv_cache_dtype)
        kv = torch_dtype(kv_name, "--kv-cache-dtype")
    limits = SweepLimits(
        max_num_seqs=opts.max_num_seqs or (16 if quick else 256),
        max_num_batched_tokens=opts.max_num_batched_tokens or (256 if quick else 8192),
        max_model_len=opts.max_model_len or model.max_position_embeddings)
    shapes = sweep_shapes(limits, quick=quick, block_size=opts.block_size, seed=opts.seed)
    block_bytes = 2 * shape.num_layers * opts.block_size * shape.num_kv_heads * shape.head_dim * kv.itemsize
    kept = _fitting_shapes(shapes, device, shape.num_q_heads, block_bytes,
                           _weight_bytes(model, opts, compute), opts.block_size)
    if len(kept) < 2 * len(FEATURES):
        raise KvplanError(f"only {len(kept)} sweep shapes fit this device's memory: try --layers or --tp")
    if on_stage is not None:
        on_stage(f"building {model.name} ({shape.num_layers} of {model.num_hidden_layers} layers, random "
                 f"weights, {dtype_name}) on {device}; {'quick' if quick else 'full'} sweep")
    load_before, start_s = sample_load(), time.perf_counter()
    max_len = max(s.max_len_tokens for s in kept) + 1
    runner = ModelRunner(model, num_blocks=max(s.num_blocks(opts.block_size) for s in kept),
                         block_size=opts.block_size, device=device, dtype=compute, kv_dtype=kv,
                         max_num_seqs=limits.max_num_seqs,
                         max_num_batched_tokens=limits.max_num_batched_tokens, max_model_len=max_len,
                         num_layers=opts.layers, tp=opts.tp, seed=opts.seed)
    runner.prepare()
    warmup, repeats = (1, 3) if quick else (2, 5)
    rows: list[tuple[float, ...]] = []
    measured: list[float] = []
    alloc = PagedAllocator(runner.num_blocks, opts.block_size)
    if on_estimate is not None:
        on_estimate(_estimate(kept, runner, alloc, warmup + repeats, start_s))
    for i, s in enumerate(kept):
        plan, seqs = build_plan(s, alloc, i)
        for _ in range(warmup):
            runner.execute(plan)
        measured.append(statistics.median(runner.execute(plan).full_model_s for _ in range(repeats)))
        rows.append(features(plan, opts.block_size))
        for seq in seqs:
            alloc.free(seq)
        if on_shape is not None:
            on_shape(i + 1, len(kept))
    host = host_overhead(limits, opts.block_size)
    load = StageLoad("calibration", load_before, sample_load())
    profile = _profile(opts, model, device, dtype_name, kv_name, shape.num_layers, kept, rows, measured, host)
    profile["fit"]["sweep_size"] = "quick" if quick else "full"
    profile["fit"]["machine_load"] = load.as_dict()
    profile["fit"]["wall_s"] = round(time.perf_counter() - start_s, 1)  # model build + sweep + fit
    return Calibration(profile, len(shapes) - len(kept))


def _estimate(shapes: list[Shape], runner: ModelRunner, alloc: PagedAllocator, runs: int,
              start_s: float) -> SweepEstimate:
    """Time one run (after one warm-up) of the lightest and the heaviest shape; extrapolate."""
    def one_run_s(shape: Shape) -> float:
        plan, seqs = build_plan(shape, alloc)
        runner.execute(plan)
        start = time.perf_counter()
        runner.execute(plan)  # synchronised: the wall time is the step's
        elapsed = time.perf_counter() - start
        for seq in seqs:
            alloc.free(seq)
        return elapsed

    light = one_run_s(min(shapes, key=lambda s: s.work_tokens))
    heavy = one_run_s(max(shapes, key=lambda s: s.work_tokens))
    return SweepEstimate(time.perf_counter() - start_s, len(shapes), runs, light, heavy,
                         estimate_sweep_s(shapes, light, heavy, runs))


def default_out_path(profile: dict[str, Any]) -> Path:
    """``profiles/<gpu or device>-<model>[-tpN].yaml``."""
    where = profile["gpu"] or re.sub(r"[^A-Za-z0-9.]+", "-", str(profile["device"])).strip("-")
    tp = f"-tp{profile['tensor_parallel']}" if profile["tensor_parallel"] > 1 else ""
    return Path("profiles") / f"{where}-{profile['model']}{tp}.yaml"


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Write the profile YAML (creating folders); an unwritable path -> KvplanError."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(profile, sort_keys=False, width=120))
    except OSError as err:
        raise KvplanError(f"cannot write profile {p}: {err.strerror or err}") from None
    return p


# ---------------------------------------------------------------------- helpers
def _weight_bytes(model: ModelConfig, opts: CalibrateOptions, dtype: torch.dtype) -> int:
    s = rank_shape(model, tp=opts.tp, num_layers=opts.layers)
    mlp = (3 if s.gated_mlp else 2) * s.hidden_size * s.intermediate_size
    layer = s.qkv_width * s.hidden_size + s.num_q_heads * s.head_dim * s.hidden_size + mlp
    vocab = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
    return (s.num_layers * layer + vocab) * dtype.itemsize


def _fitting_shapes(shapes: list[Shape], device: torch.device, num_q_heads: int, block_bytes: int,
                    weight_bytes: int, block_size: int) -> list[Shape]:
    """The shapes whose KV blocks and prefill attention scores fit the device's memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    left = max(free - weight_bytes, 0)
    pool_blocks = int(left * POOL_MEMORY_FRACTION) // block_bytes
    scores_bytes = left * ATTENTION_MEMORY_FRACTION
    return [s for s in shapes if s.num_blocks(block_size) <= pool_blocks
            and 3 * 4 * num_q_heads * s.chunk_tokens * (s.chunk_tokens + s.cached_tokens) <= scores_bytes]


def host_overhead(limits: SweepLimits, block_size: int, *, num_steps: int = 200) -> tuple[float, float]:
    """Seconds the scheduler itself adds to a step, as (per step, per decoding sequence).

    The sweep times ``runner.execute`` alone; a served step also runs ``schedule()`` and
    ``complete()`` in detail mode, which visit every scheduled sequence. They are timed here on the
    host for a few batch sizes (no device work) and fitted as a line, so the profile predicts the
    whole step the real-time engine measures.
    """
    batches = sorted({1, max(1, limits.max_num_seqs // 4), limits.max_num_seqs})
    x, y = [], []
    for b in batches:
        length = min(64, max(2, limits.max_model_len // 4))
        output = max(2, min(num_steps + 1, limits.max_model_len - length))
        config = SchedulerConfig(max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=max(
            limits.max_num_batched_tokens, limits.max_num_seqs, length * b), max_model_len=limits.max_model_len,
            block_size=block_size)
        alloc = PagedAllocator(b * -(-(length + output) // block_size) + 1, block_size)
        sched = Scheduler(alloc, config, detail=True)
        for i in range(b):
            sched.add_request(Request(i, 0.0, length, output))
        sched.complete(sched.schedule())  # the prefill step is not the one measured
        steps = min(num_steps, output - 1)
        start = time.perf_counter()
        for _ in range(steps):
            sched.complete(sched.schedule())
        x.append(b)
        y.append((time.perf_counter() - start) / steps)
    slope, intercept = np.polyfit(np.array(x, dtype=float), np.array(y), 1) if len(x) > 1 else (0.0, y[0])
    return max(float(intercept), 0.0), max(float(slope), 0.0)


def _profile(opts: CalibrateOptions, model: ModelConfig, device: torch.device, dtype_name: str, kv_name: str,
             num_layers: int, shapes: list[Shape], rows: list[tuple[float, ...]],
             measured: list[float], host: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    x, y = np.array(rows), np.array(measured)
    heldout = np.arange(len(y)) % HELDOUT_EVERY == HELDOUT_EVERY - 1
    coef = fit_linear(x[~heldout], y[~heldout])
    predicted = x @ coef
    # the scheduler's own time is part of every served step (see host_overhead)
    coef[FEATURES.index("const")] += host[0]
    coef[FEATURES.index("decode_seqs")] += host[1]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sweep = [
        {"kind": s.kind, "label": s.label, "batch": len(s.decode_contexts),
         "context": int(sum(s.decode_contexts)), "max_context": max(s.decode_contexts, default=0),
         "chunk": s.chunk_tokens, "cached": s.cached_tokens, "copies": s.num_copies,
         "swap_blocks": s.num_swap_out_blocks + s.num_swap_in_blocks,
         "measured_s": float(m), "predicted_s": float(p), "heldout": bool(h)}
        for s, m, p, h in zip(shapes, y, predicted, heldout)
    ]
    return {
        "kvplan_profile": PROFILE_VERSION,
        "model": model.name,
        "tensor_parallel": opts.tp,
        "kv_cache_dtype": kv_name,
        "block_size": opts.block_size,
        "device": device_name,
        "gpu": match_gpu(device_name) if device.type == "cuda" else None,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {"kvplan": _version("kvplan"), "torch": str(torch.__version__),
                     "triton": _version("triton"), "python": platform.python_version()},
        "dtype": dtype_name,
        "layers": {"run": num_layers, "total": model.num_hidden_layers},
        "latency_model": {"form": FORM,
                          "coefficients_s": {name: float(c) for name, c in zip(FEATURES, coef)}},
        "fit": {"num_samples": int((~heldout).sum()), "num_heldout": int(heldout.sum()),
                "host_overhead_s": {"per_step": host[0], "per_decode_seq": host[1]},
                "mape_train": _finite(mape(predicted[~heldout], y[~heldout])),
                "mape_heldout": _finite(mape(predicted[heldout], y[heldout]))},
        "sweep": sweep,
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
