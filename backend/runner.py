"""StepPlan -> step tensors -> one forward pass on a device, timed.

Per step (:meth:`ModelRunner.execute`)::

    host:   plan.details -> input_ids, positions, slot_mapping, block tables, context_lens,
            sample rows, written into PREALLOCATED (pinned, on CUDA) host buffers
    device: copy them into preallocated device buffers (no per-step allocation of inputs)
            swap-out / swap-in copies (plan.num_swap_*_blocks, over PCIe on CUDA)
            copy-on-write block copies (plan.cow_copies) in every layer, BEFORE the writes
            forward: embed -> layer stack -> lm_head on sampling rows -> greedy argmax

Token ids: a trace gives only lengths, so the id at (sequence, position) is a fixed pseudo-
random function of the two, for prompt tokens and forced output tokens alike. The sampled token
is computed (its cost is real) but the next input is the forced id, so a real run and a
simulated one do the same work whatever the weights produce.

Decode-only steps run at fixed batch-size buckets (1, 2, 4, 8, 16, ...): the batch is padded
with rows that write nowhere (slot -1) and read one token of a scratch block. On CUDA each
bucket's three phases (embed, layers, head) are captured as CUDA graphs and replayed after
copying the step's inputs into the captured buffers; on other devices the padded batch runs
eagerly (which exercises the padding). Steps with prefill run eagerly.

Every step is timed in phases (CUDA events on CUDA, perf_counter elsewhere), so that a run of
k of the model's L layers can be scaled to the full model: the KV copies and the layer stack
repeat per layer, the rest (input preparation, embedding, lm_head) does not.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from backend.model import PagedLlama, PrefillSpan, StepBatch, torch_dtype
from simulator.kv.models import ModelConfig
from simulator.scheduler.plan import StepPlan

_MARKS = ("start", "copies_start", "copies_end", "layers_start", "layers_end", "end")


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Seconds one executed step took (host preparation included)."""

    total_s: float
    per_layer_s: float  # the part that repeats per layer: KV block copies and the layer stack
    num_layers: int  # layers run
    num_total_layers: int  # layers of the model

    @property
    def full_model_s(self) -> float:
        """The step's time with all L layers: the per-layer part scaled by L / k."""
        return self.total_s + self.per_layer_s * (self.num_total_layers / self.num_layers - 1.0)


def token_ids(seq_ids: np.ndarray, positions: np.ndarray, vocab_size: int) -> np.ndarray:
    """Deterministic pseudo-random token ids in ``[0, vocab_size)`` of (sequence, position) pairs
    (a splitmix64-style mix; uint64 arithmetic wraps by design)."""
    x = seq_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x ^= positions.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return (x % np.uint64(vocab_size)).astype(np.int64)


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes decode-only steps are padded to: 1, 2, 4, then multiples of 8, and
    ``max_num_seqs`` itself as the last one."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return tuple(sizes) + (max_num_seqs,)


class _Clock:
    """Phase marks of one step: CUDA events on a CUDA device, perf_counter otherwise."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._events = {m: torch.cuda.Event(enable_timing=True) for m in _MARKS} if self.cuda else {}
        self._times: dict[str, float] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            self._events[name].record()
        else:
            self._times[name] = time.perf_counter()

    def seconds(self, start: str, end: str) -> float:
        """Seconds between two marks (after :meth:`wait`)."""
        if self.cuda:
            return self._events[start].elapsed_time(self._events[end]) / 1e3
        return self._times[end] - self._times[start]

    def wait(self) -> None:
        if self.cuda:
            self._events["end"].synchronize()


class ModelRunner:
    """Executes StepPlans of a detail-mode scheduler on a :class:`PagedLlama` of ``model_cfg``.

    ``num_blocks`` is the allocator's pool (block ids ``0..num_blocks-1``); the device pool has
    one more scratch block for padded rows and ``swap_buffer_blocks`` staging blocks that swap-in
    writes to (swapped contents are not preserved: only the transfer's cost matters). Plans may
    hold at most ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences, each at most
    ``max_model_len`` tokens long. ``dtype`` is the compute dtype (fp32/fp16/bf16), ``kv_dtype``
    the pool's (default: the compute dtype; or fp8). ``torch.set_num_threads`` is left to the caller.

    ``use_cuda_graphs`` (default: on CUDA devices) pads decode-only steps to bucket sizes and, on
    CUDA, replays them as CUDA graphs; on other devices the padded buckets run eagerly, which
    only serves to test the padding.
    """

    def __init__(self, model_cfg: ModelConfig, *, num_blocks: int, block_size: int,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype = torch.float32,
                 max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 num_layers: int | None = None, tp: int = 1, seed: int = 0,
                 use_cuda_graphs: bool | None = None, kv_dtype: str | torch.dtype | None = None,
                 swap_buffer_blocks: int = 64):
        self.device = torch.device(device)
        compute = torch_dtype(dtype) if isinstance(dtype, str) else dtype
        kv = torch_dtype(kv_dtype, "--kv-cache-dtype") if isinstance(kv_dtype, str) else kv_dtype
        if max_num_seqs < 1 or max_num_batched_tokens < max_num_seqs:
            raise ValueError("need 1 <= max_num_seqs <= max_num_batched_tokens")
        if swap_buffer_blocks < 1:
            raise ValueError(f"swap_buffer_blocks must be positive, got {swap_buffer_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_blocks_per_seq = math.ceil(max_model_len / block_size)
        self.scratch_block = num_blocks
        self._staging_block = num_blocks + 1
        self._swap_chunk_blocks = swap_buffer_blocks
        self.model = PagedLlama(model_cfg, num_blocks=num_blocks + 1 + swap_buffer_blocks,
                                block_size=block_size, max_model_len=max_model_len, dtype=compute,
                                kv_dtype=kv, device=self.device, tp=tp, num_layers=num_layers, seed=seed)
        self.num_layers = self.model.shape.num_layers
        self._vocab = self.model.shape.vocab_size
        tokens, seqs, width = max_num_batched_tokens, max_num_seqs, self.max_blocks_per_seq
        specs = {  # name -> (size, dtype); tables are flat so a step can view them compactly
            "input_ids": (tokens, torch.int64), "positions": (tokens, torch.int64),
            "slot_mapping": (tokens, torch.int64), "block_tables": (seqs * width, torch.int32),
            "context_lens": (seqs, torch.int32), "prefill_tables": (seqs * width, torch.int32),
            "sample_rows": (seqs, torch.int64), "cow_src": (2 * seqs, torch.int64),
            "cow_dst": (2 * seqs, torch.int64),
        }
        pin = self.device.type == "cuda"
        self.buffers: dict[str, torch.Tensor] = {}
        self._host: dict[str, torch.Tensor] = {}
        for name, (size, kind) in specs.items():
            self.buffers[name] = torch.zeros(size, dtype=kind, device=self.device)
            self._host[name] = torch.zeros(size, dtype=kind, pin_memory=True) if pin else self.buffers[name]
        self._np = {name: t.numpy() for name, t in self._host.items()}
        pool = self.model.kv_pool
        swap_shape = (pool.shape[0], 2, swap_buffer_blocks) + tuple(pool.shape[3:])
        self._swap_host = torch.zeros(swap_shape, dtype=pool.dtype, pin_memory=pin)
        self._clock = _Clock(self.device)
        graphs = self.device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
        self.buckets = decode_buckets(max_num_seqs) if graphs else ()
        self._graphs = _DecodeGraphs(self, capture=self.device.type == "cuda") if graphs else None
        self.last_sampled: torch.Tensor | None = None  # greedy tokens of the last step's sampling rows

    # ------------------------------------------------------------------ public
    def prepare(self) -> None:
        """Capture every bucket's CUDA graphs now (otherwise on first use). No-op off CUDA."""
        if self._graphs is not None:
            self._graphs.capture_all()

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepTiming:
        """Run one step of a detail-mode plan to completion (synchronized); return its timing.

        Raises ValueError for a plan without details or exceeding the runner's sizes.
        """
        if plan.details is None:
            raise ValueError("the runner needs plans from a Scheduler(..., detail=True)")
        clock = self._clock
        clock.mark("start")
        num_decode = len(plan.details) - len(plan.prefills)
        if num_decode != plan.num_decode_seqs:
            raise ValueError(f"plan {plan.step_id}: {num_decode} decode details for "
                             f"{plan.num_decode_seqs} decodes")
        bucket = self._bucket(plan, num_decode)
        batch = self._prepare(plan, num_decode, bucket)
        clock.mark("copies_start")
        self._swap(plan.num_swap_out_blocks, plan.num_swap_in_blocks)
        self._copy_on_write(plan.cow_copies)
        clock.mark("copies_end")
        if bucket is not None:
            assert self._graphs is not None
            self.last_sampled = self._graphs.run(bucket, clock)[:num_decode]
        elif batch is not None:
            hidden = self.model.embed(batch.input_ids)
            clock.mark("layers_start")
            hidden = self.model.run_layers(hidden, batch)
            clock.mark("layers_end")
            self.last_sampled = self.model.head(hidden, batch.sample_rows).argmax(dim=-1)
        else:  # nothing to compute (a step of swaps or copies only)
            clock.mark("layers_start")
            clock.mark("layers_end")
        clock.mark("end")
        clock.wait()
        per_layer = clock.seconds("copies_start", "copies_end") + clock.seconds("layers_start", "layers_end")
        return StepTiming(clock.seconds("start", "end"), per_layer, self.num_layers,
                          self.model.shape.num_total_layers)

    # ------------------------------------------------------------------ inputs
    def _bucket(self, plan: StepPlan, num_decode: int) -> int | None:
        if self._graphs is None or plan.prefills or num_decode == 0:
            return None
        return next((b for b in self.buckets if b >= num_decode), None)  # too many: _prepare refuses

    def _prepare(self, plan: StepPlan, num_decode: int, bucket: int | None) -> StepBatch | None:
        """Fill the host buffers from the plan, copy them to the device, and return the step's
        batch of device views (None when the step computes nothing)."""
        details = plan.details
        assert details is not None
        num_tokens = sum(d.num_tokens for d in details)
        if num_tokens > self.max_num_batched_tokens or len(details) > self.max_num_seqs:
            raise ValueError(f"plan {plan.step_id}: {num_tokens} tokens / {len(details)} sequences exceed "
                             f"the runner's {self.max_num_batched_tokens} / {self.max_num_seqs}")
        if num_tokens == 0:
            return None
        h = self._np
        counts = np.fromiter((d.num_tokens for d in details), np.int64, len(details))
        ends = np.cumsum(counts)
        rows = np.arange(num_tokens) - np.repeat(ends - counts, counts)
        firsts = np.fromiter((d.position for d in details), np.int64, len(details))
        positions = np.repeat(firsts, counts) + rows
        seqs = np.repeat(np.fromiter((d.seq_id for d in details), np.int64, len(details)), counts)
        h["positions"][:num_tokens] = positions
        h["input_ids"][:num_tokens] = token_ids(seqs, positions, self._vocab)
        h["slot_mapping"][:num_tokens] = np.fromiter(
            itertools.chain.from_iterable(d.slot_mapping for d in details), np.int64, num_tokens)
        num_chunks = len(plan.prefills)
        num_prefill_tokens = int(ends[num_chunks - 1]) if num_chunks else 0
        if bucket is not None:
            self._prepare_bucket(plan, num_decode, bucket)
            return None
        # decode rows: compact [B, w] tables, w = the longest table of the step
        decodes = details[num_chunks:]
        width = max((len(d.block_table) for d in decodes), default=1)
        self._check_width(plan, width)
        tables = h["block_tables"][:num_decode * width].reshape(num_decode, width)
        for i, d in enumerate(decodes):
            tables[i, :len(d.block_table)] = d.block_table
            h["context_lens"][i] = d.context_len
        offset = 0
        spans_at: list[tuple[int, int]] = []
        for c, d in zip(plan.prefills, details[:num_chunks]):
            if c.seq_id != d.seq_id:
                raise ValueError(f"plan {plan.step_id}: detail of seq {d.seq_id} where the chunk of seq "
                                 f"{c.seq_id} was expected")
            self._check_width(plan, len(d.block_table))
            h["prefill_tables"][offset:offset + len(d.block_table)] = d.block_table
            spans_at.append((offset, len(d.block_table)))
            offset += len(d.block_table)
        samples = [int(end) - 1 for c, end in zip(plan.prefills, ends) if c.samples_token]
        samples.extend(range(num_prefill_tokens, num_tokens))
        h["sample_rows"][:len(samples)] = samples
        sizes = {"input_ids": num_tokens, "positions": num_tokens, "slot_mapping": num_tokens,
                 "block_tables": num_decode * width, "context_lens": num_decode, "prefill_tables": offset,
                 "sample_rows": len(samples)}
        dev = self._to_device(sizes)
        spans = tuple(
            PrefillSpan(int(end - c.num_tokens), c.num_tokens, c.num_computed_tokens, c.context_tokens,
                        dev["prefill_tables"][start:start + size])
            for c, end, (start, size) in zip(plan.prefills, ends, spans_at)
        )
        all_rows = len(samples) == num_tokens  # decode only: every row samples, no gather needed
        return StepBatch(
            dev["input_ids"][:num_tokens], dev["positions"][:num_tokens], dev["slot_mapping"][:num_tokens],
            spans, num_prefill_tokens, dev["block_tables"][:num_decode * width].view(num_decode, width),
            dev["context_lens"][:num_decode], None if all_rows else dev["sample_rows"][:len(samples)],
            plan.decode_max_context or None,
        )

    def _prepare_bucket(self, plan: StepPlan, num_decode: int, bucket: int) -> None:
        """Decode rows into the captured full-width buffers, padded up to ``bucket`` rows."""
        h, width = self._np, self.max_blocks_per_seq
        details = plan.details
        assert details is not None
        tables = h["block_tables"][:bucket * width].reshape(bucket, width)
        for i, d in enumerate(details):
            self._check_width(plan, len(d.block_table))
            tables[i, :len(d.block_table)] = d.block_table
            h["context_lens"][i] = d.context_len
        self._fill_padding(num_decode, bucket)
        self._to_device({"input_ids": bucket, "positions": bucket, "slot_mapping": bucket,
                         "block_tables": bucket * width, "context_lens": bucket})

    def _fill_padding(self, start: int, end: int) -> None:
        """Rows ``start..end-1`` of a bucket: write nowhere, read one token of the scratch block."""
        h = self._np
        h["input_ids"][start:end] = 0
        h["positions"][start:end] = 0
        h["slot_mapping"][start:end] = -1
        h["context_lens"][start:end] = 1
        width = self.max_blocks_per_seq
        h["block_tables"][start * width:end * width:width] = self.scratch_block  # column 0 of each row

    def _check_width(self, plan: StepPlan, num_blocks: int) -> None:
        if num_blocks > self.max_blocks_per_seq:
            raise ValueError(f"plan {plan.step_id}: a block table of {num_blocks} blocks exceeds "
                             f"max_model_len ({self.max_blocks_per_seq} blocks of {self.block_size})")

    def _to_device(self, sizes: dict[str, int]) -> dict[str, torch.Tensor]:
        if self.device.type != "cpu":
            for name, size in sizes.items():
                if size:
                    self.buffers[name][:size].copy_(self._host[name][:size], non_blocking=True)
        return self.buffers

    # ------------------------------------------------------------------ KV copies
    def _copy_on_write(self, copies: tuple[tuple[int, int], ...]) -> None:
        if not copies:
            return
        n = len(copies)
        if n > self._np["cow_src"].shape[0]:
            raise ValueError(f"{n} copy-on-write copies in one step exceed 2 x max_num_seqs")
        self._np["cow_src"][:n] = [src for src, _ in copies]
        self._np["cow_dst"][:n] = [dst for _, dst in copies]
        dev = self._to_device({"cow_src": n, "cow_dst": n})
        self.model.copy_blocks(dev["cow_src"][:n], dev["cow_dst"][:n])

    def _swap(self, num_out_blocks: int, num_in_blocks: int) -> None:
        """Pay the transfer of swapped blocks, every layer's K and V, in chunks of the host buffer.
        Swap-out reads resident blocks (any: contents are not kept); swap-in writes the staging
        blocks, so no live KV is overwritten."""
        pool, host, chunk = self.model.kv_pool, self._swap_host, self._swap_chunk_blocks
        num_layers = pool.shape[0]
        for remaining, out in ((num_out_blocks, True), (num_in_blocks, False)):
            while remaining > 0:
                n = min(chunk, remaining)
                for layer, kv in itertools.product(range(num_layers), range(2)):
                    if out:
                        host[layer, kv, :n].copy_(pool[layer, kv, :n], non_blocking=True)
                    else:
                        at = self._staging_block
                        pool[layer, kv, at:at + n].copy_(host[layer, kv, :n], non_blocking=True)
                remaining -= n


class _DecodeGraphs:
    """Decode-only steps at fixed bucket sizes over the runner's static buffers: captured as
    three CUDA graphs per bucket (embed, layers, head) on CUDA, run eagerly elsewhere."""

    def __init__(self, runner: ModelRunner, *, capture: bool):
        self.runner = runner
        self.capture = capture
        self._graphs: dict[int, _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def static_batch(self, bucket: int) -> StepBatch:
        r = self.runner
        b, width = r.buffers, r.max_blocks_per_seq
        return StepBatch(b["input_ids"][:bucket], b["positions"][:bucket], b["slot_mapping"][:bucket], (), 0,
                         b["block_tables"][:bucket * width].view(bucket, width), b["context_lens"][:bucket])

    def capture_all(self) -> None:
        if self.capture:
            # largest first: the smaller buckets reuse its memory in the shared pool
            for bucket in sorted(self.runner.buckets, reverse=True):
                if bucket not in self._graphs:
                    self._capture(bucket)

    def run(self, bucket: int, clock: _Clock) -> torch.Tensor:
        """Run the bucket's decode step (inputs already in the static buffers); greedy tokens."""
        model = self.runner.model
        if not self.capture:
            batch = self.static_batch(bucket)
            hidden = model.embed(batch.input_ids)
            clock.mark("layers_start")
            hidden = model.run_layers(hidden, batch)
            clock.mark("layers_end")
            return model.head(hidden, None).argmax(dim=-1)
        if bucket not in self._graphs:
            self._capture(bucket)
        captured = self._graphs[bucket]
        captured.embed.replay()
        clock.mark("layers_start")
        captured.layers.replay()
        clock.mark("layers_end")
        captured.head.replay()
        return captured.tokens

    @torch.no_grad()
    def _capture(self, bucket: int) -> None:
        r, model = self.runner, self.runner.model
        r._fill_padding(0, bucket)  # valid inputs for the warm-up and capture runs: all rows padding
        r._to_device({"input_ids": bucket, "positions": bucket, "slot_mapping": bucket,
                      "block_tables": bucket * r.max_blocks_per_seq, "context_lens": bucket})
        batch = self.static_batch(bucket)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles the Triton kernels outside the capture
            for _ in range(2):
                model.head(model.run_layers(model.embed(batch.input_ids), batch), None).argmax(dim=-1)
        torch.cuda.current_stream().wait_stream(side)
        graphs = (torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph())
        with torch.cuda.graph(graphs[0], pool=self._pool):
            hidden_in = model.embed(batch.input_ids)
        with torch.cuda.graph(graphs[1], pool=self._pool):
            hidden_out = model.run_layers(hidden_in, batch)
        with torch.cuda.graph(graphs[2], pool=self._pool):
            tokens = model.head(hidden_out, None).argmax(dim=-1)
        self._graphs[bucket] = _Captured(*graphs, hidden_in, hidden_out, tokens)


@dataclass(frozen=True, slots=True)
class _Captured:
    """One bucket's graphs and the graph-owned tensors between them (kept alive with them)."""

    embed: torch.cuda.CUDAGraph
    layers: torch.cuda.CUDAGraph
    head: torch.cuda.CUDAGraph
    hidden_in: torch.Tensor
    hidden_out: torch.Tensor
    tokens: torch.Tensor
