"""``kvplan export``: the commands that reproduce a simulated point on real GPUs.

Examples::

    kvplan export scenarios/chat.yaml                    # into runs/chat-export/
    kvplan export runs/chat                              # a run folder: the scenario it ran, into runs/chat-export/
    kvplan export scenarios/engines.yaml --engine sglang
    kvplan export scenarios/chat.yaml --engine trtllm

Writes three files (and prints the two scripts):

* ``serve.sh`` — ``vllm serve MODEL ...`` (engines vllm-v1, vllm-v0), ``python -m
  sglang.launch_server --model-path MODEL ...`` (engine sglang) or ``trtllm-serve MODEL ...``
  (engine trtllm, with the LLM API options it has no flag for in a fourth file,
  ``trtllm-config.yaml``, given to ``--extra_llm_api_options``) with every knob the simulation
  resolved: the engine defaults kvplan filled in are written out, not left to the server, so a
  later release that changes a default does not change the point. A knob kvplan models but the
  server cannot be told is a ``#`` comment that says so.
* ``trace.jsonl`` — the requests the simulation replayed (after rate scaling, the trace window,
  ``num_requests`` and the ``max_model_len_policy``), one JSON object per line in the format
  both ``vllm bench serve --dataset-name timed_trace`` and GuideLLM's ``mooncake`` data read:
  ``timestamp`` (seconds from the first request), ``input_length``, ``output_length`` and
  ``hash_ids``, one id per block of ``B`` prompt tokens (:func:`trace_rows`).
* ``bench.sh`` — ``sh bench.sh vllm`` runs ``vllm bench serve`` on that trace, ``sh bench.sh
  guidellm`` runs ``guidellm run`` on it; for a synthetic workload that the tools' own
  generators express (fixed lengths, Poisson or gamma arrivals), ``vllm-random`` and
  ``guidellm-synthetic`` draw the same distributions afresh.

What the tools reproduce, and what they approximate, is written next to each command (and in
README, "Reproducing a plan on real GPUs"): prompt *lengths*, output lengths (``--ignore-eos``),
arrival times and shared prefixes are replayed exactly; prompt *content* is random tokens;
closed-loop think time, parallel sampling and beam search are not replayed.

Every flag is checked against the option names of the tool's source, vendored with their
commits in :mod:`simulator.commands.export.flags`.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import KvplanError, warn_user

if TYPE_CHECKING:  # pragma: no cover
    from simulator.config.deployment import Deployment
    from simulator.config.scenario import Scenario
    from workloads.request import Request

PORT = 8000  # vllm serve's port, and vllm bench serve's --port default (vllm/benchmarks/serve.py)
URL = f"http://127.0.0.1:{PORT}"
# Tokens one hash id stands for when the workload has no prefix ids of its own: the block of
# Mooncake's traces (512 tokens, which GuideLLM's mooncake data also defaults to:
# src/guidellm/data/deserializers/trace_mooncake.py MooncakeTraceFormatArgs.hash_id_block_size).
UNSHARED_BLOCK_TOKENS = 512
EXPORT_FILES = ("serve.sh", "bench.sh", "trace.jsonl")
TRTLLM_CONFIG = "trtllm-config.yaml"  # trtllm-serve --extra_llm_api_options (engine trtllm)
RESULTS_DIR = "results"


def add_parser(subparsers: Any) -> None:
    """Add the ``export`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "export", help="the vllm serve / SGLang / trtllm-serve launch and benchmark commands that "
                       "reproduce a plan",
        description="Write the server command (vllm serve, SGLang's launch_server or trtllm-serve) "
                    "with every "
                    "knob the simulation assumed, the trace it replayed, and the vllm bench serve "
                    "and GuideLLM commands that send that load.")
    p.add_argument("source", metavar="SCENARIO|RUN_DIR",
                   help="a scenario YAML, or a folder `simulate` wrote (its run.json)")
    p.add_argument("--allocator", default="paged",
                   help="the simulated allocator to reproduce (default paged: the only one a "
                        "serving engine runs)")
    p.add_argument("--engine", help="vllm-v1, vllm-v0, sglang or trtllm (default: the scenario's)")
    p.add_argument("--out", help="output folder (default: RUN_DIR-export beside the run folder, or "
                                 "runs/<scenario name>-export)")
    from simulator.report.outputs import add_replace_arg

    add_replace_arg(p)
    p.set_defaults(func=run)


def is_flag(word: str) -> bool:
    """Whether a command-line word is an option (``--x``, ``-q``), not a value such as ``-1``."""
    if not word.startswith("-"):
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


@dataclass(frozen=True)
class Command:
    """One command line: ``env`` assignments, then ``argv``; ``notes`` are printed above it as
    comments (what kvplan assumed that the command cannot say, and what it approximates)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    def render(self, indent: str = "") -> str:
        """The command as shell text: notes as comments, one flag (with its value) per line."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env] + [shlex.quote(self.argv[0])]
        lines = [f"{indent}# {note}" for note in self.notes]
        head, rest = " ".join(words), list(self.argv[1:])
        while rest and not rest[0].startswith("--"):  # the program and its positionals
            head += " " + shlex.quote(rest.pop(0))
        parts = [head]
        while rest:
            flag = rest.pop(0)
            values = []
            while rest and not is_flag(rest[0]):
                values.append(rest.pop(0))
            parts.append(" ".join(shlex.quote(w) for w in (flag, *values)))
        lines.append(indent + f" \\\n{indent}  ".join(parts))
        return "\n".join(lines)


@dataclass
class Export:
    """What ``kvplan export`` writes: the server command, the benchmark commands by name (the
    argument ``bench.sh`` takes), the trace rows and the header lines both scripts carry."""

    serve: Command
    benches: dict[str, Command]
    rows: list[dict[str, Any]]
    header: list[str] = field(default_factory=list)
    # further files the server command reads, by name (trtllm-config.yaml): written beside serve.sh
    files: dict[str, str] = field(default_factory=dict)

    def serve_script(self) -> str:
        head = "\n".join(f"# {line}" for line in self.header)
        cd = 'cd "$(dirname "$0")"\n' if self.files else ""  # the files are beside the script
        return f"#!/bin/sh\n{head}\n{cd}{self.serve.render()}\n"

    def bench_script(self) -> str:
        names = "|".join(self.benches)
        cases = "\n".join(f"  {name})\n{cmd.render('    ')}\n    ;;"
                          for name, cmd in self.benches.items())
        return ("#!/bin/sh\n" + "\n".join(f"# {line}" for line in self.header) + "\n"
                f"# usage: sh bench.sh [{names}]  (default vllm), with the server of serve.sh up\n"
                "set -e\ncd \"$(dirname \"$0\")\"\n"
                f"mkdir -p {RESULTS_DIR}\n"
                "case \"${1:-vllm}\" in\n"
                f"{cases}\n"
                f"  *)\n    echo \"usage: sh bench.sh [{names}]\" >&2\n    exit 2\n    ;;\nesac\n")


def run(args: argparse.Namespace) -> int:
    """Run ``kvplan export``: write serve.sh, bench.sh and trace.jsonl, print the scripts."""
    from simulator.report.outputs import RunSource, default_out_dir, open_output, recorded_inputs

    source = Path(args.source)
    scenario, base_dir, default_out = _load(source)
    exported = build_export(scenario, base_dir, engine=args.engine, allocator=args.allocator,
                            where=str(source))
    # Beside the run folder, never inside it: a re-run of simulate replaces its folder as a whole.
    out = Path(args.out) if args.out else default_out or default_out_dir(
        scenario.name, suffix="-export", where=str(source))
    words = [str(source), *([f"--engine {args.engine}"] if args.engine else []),
             *([f"--allocator {args.allocator}"] if args.allocator != "paged" else [])]
    # an export of a run folder is one of the scenario file that run was a run of, where recorded
    inputs = (recorded_inputs(source) if source.is_dir() else None) or [source]
    run_source = RunSource.of("export", inputs, {"scenario": scenario.model_dump(mode="json"),
                                                   "engine": args.engine, "allocator": args.allocator},
                              " ".join(words))
    with open_output(out, command="export", recognised=EXPORT_FILES, source=run_source,
                     replace=args.replace) as folder:
        (folder.staging / "serve.sh").write_text(exported.serve_script(), encoding="utf-8")
        (folder.staging / "bench.sh").write_text(exported.bench_script(), encoding="utf-8")
        for name, text in exported.files.items():
            (folder.staging / name).write_text(text, encoding="utf-8")
        with open(folder.staging / "trace.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in exported.rows)
    print(exported.serve_script())
    for name, text in exported.files.items():
        print(f"# {name}\n{text}")
    print(exported.bench_script())
    more = "".join(f", {name}" for name in exported.files)
    print(f"kvplan export: wrote {out}/serve.sh, bench.sh{more} and trace.jsonl "
          f"({len(exported.rows):,} requests)")
    return 0


def _load(source: Path) -> tuple[Scenario, Path, Path | None]:
    """The scenario of ``source`` (a scenario file, or a run folder's run.json), the folder its
    relative paths resolve against, and the default output folder for a run folder."""
    from simulator.config.scenario import Scenario, load_scenario, parse_scenario
    from simulator.yamlfile import read_yaml

    if not source.is_dir():
        scenario, base_dir = load_scenario(source)
        return scenario, base_dir, None
    meta_path = source / "run.json"
    if not meta_path.is_file():
        raise KvplanError(f"{source}: no run.json: give a scenario YAML or a folder that "
                          "`simulate` wrote")
    meta = read_yaml(meta_path, "run.json")  # JSON is YAML; read_yaml gives one-line errors
    if not isinstance(meta, dict) or not isinstance(meta.get("scenario"), dict):
        raise KvplanError(f"{meta_path}: no 'scenario' in it: not a run.json `simulate` wrote")
    # run.json keeps the resolved scenario but not the scenario file's folder: relative paths
    # (a trace file, a profile) resolve against the working folder, as on the command line.
    data = _given(Scenario, meta["scenario"])
    return parse_scenario(data, str(meta_path)), Path.cwd(), source.parent / f"{source.name}-export"


def _given(model: Any, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a ``model_dump(mode="json")``) without the keys at their defaults: read back,
    it sets the fields the scenario set, as validators that ask which keys were given
    (``think_time_s`` without ``concurrency``, ``format`` of a synthetic workload) expect."""
    from pydantic import BaseModel

    out = {}
    for key, value in data.items():
        info = model.model_fields.get(key)
        if info is None:
            out[key] = value
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        if isinstance(default, tuple):
            default = list(default)
        if value == default:
            continue
        nested = info.annotation
        if isinstance(value, dict) and isinstance(nested, type) and issubclass(nested, BaseModel):
            value = _given(nested, value)
        elif isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
        out[key] = value
    return out


def build_export(scenario: Scenario, base_dir: Path, *, engine: str | None = None,
                 allocator: str = "paged", where: str = "scenario") -> Export:
    """The commands and trace rows that reproduce ``scenario`` run by ``engine`` (default: the
    scenario's one engine) with ``allocator``. Bad input -> KvplanError naming ``where``."""
    from simulator.config.deployment import build_deployment, engine_defaults
    from simulator.engine.runs import client_policy, load_workload
    from simulator.config.scenario import canonical_allocator
    from simulator.scheduler.config import ENGINES

    if scenario.disaggregation is not None:
        raise KvplanError(f"{where}: disaggregation: export writes one server's command; "
                          "launch the prefill and decode pools with vLLM's disaggregated serving")
    if engine is None:
        if len(scenario.engines) > 1:
            raise KvplanError(f"{where}: the scenario runs engines {', '.join(scenario.engines)}: "
                              "give one with --engine")
        engine = scenario.engines[0]
    if engine not in ENGINES:
        raise KvplanError(f"unknown engine '{engine}' (known: {', '.join(ENGINES)})")
    unsimulated = [] if engine in scenario.engines else [unsimulated_note(engine, scenario.engines, where)]
    for note in unsimulated:
        warn_user(note)
    if canonical_allocator(allocator) != "paged":
        raise KvplanError(f"allocator {allocator}: contiguous reservation is kvplan's baseline, "
                          "no serving engine runs it; export reproduces allocator paged")
    scenario = scenario.for_engine(engine)
    dep = build_deployment(scenario, base_dir, force_profile=True, where=where)
    sched = dep.scheduler_config
    fraction = engine_defaults(scenario, dep.gpu, sched.max_model_len, dep.model).gpu_memory_utilization
    fit = load_workload(scenario, base_dir, sched.max_model_len)
    requests = fit.requests
    clients = client_policy(scenario, len(requests))
    block = _block_tokens(requests, where)
    model = _model_id(scenario, dep, base_dir)
    files: dict[str, str] = {}
    if engine == "sglang":
        serve = _sglang_serve(scenario, dep, model, fraction)
    elif engine == "trtllm":
        serve, files[TRTLLM_CONFIG] = _trtllm_serve(scenario, dep, model, fraction)
    else:
        serve = _vllm_serve(scenario, dep, model, fraction)
    notes = _common_notes(scenario, fit.num_rejected, fit.num_truncated)
    benches = {"vllm": _vllm_bench(scenario, model, len(requests), block, clients, notes),
               "guidellm": _guidellm_replay(scenario, model, len(requests), block, clients,
                                            notes)}
    benches.update(_synthetic_benches(scenario, model, len(requests)))
    span = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    rate = f"{(len(requests) - 1) / span:.3f} req/s on average" if span > 0 else "all at t = 0"
    gpus = scenario.tensor_parallel * scenario.data_parallel_size * scenario.num_replicas
    release = ""
    if engine == "trtllm":  # whose defaults the knobs are (simulator/scheduler/trtllm.py)
        from simulator.scheduler.trtllm import TRTLLM_NEWEST, trtllm_version
        release = f" (TensorRT-LLM {trtllm_version(scenario.engine_version or TRTLLM_NEWEST)}'s defaults)"
    header = [
        f"kvplan export: scenario {scenario.name}, engine {engine}{release}, allocator paged",
        f"{dep.model.name} on {gpus} x {dep.gpu.name} (tensor parallel {scenario.tensor_parallel}"
        + (f", data parallel {scenario.data_parallel_size}" if scenario.data_parallel_size > 1 else "")
        + f", {scenario.num_replicas} replica(s)); KV pool per engine: {dep.num_blocks:,} blocks "
        f"of {sched.block_size} tokens = {dep.capacity_tokens:,} tokens",
        f"load: {len(requests):,} requests from trace.jsonl, {rate}",
        *(f"NOTE: {note}" for note in unsimulated),
    ]
    return Export(serve, benches, trace_rows(requests, block), header, files)


def unsimulated_note(engine: str, simulated: Sequence[str], where: str) -> str:
    """What to know of an export for an engine the plan was not simulated with: its knobs are
    that engine's defaults, but no latency or capacity kvplan reported is that engine's."""
    scenario = where if Path(where).is_file() else f"<the scenario file {where} ran>"
    return (f"the {engine} plan was not simulated: {where} simulates {', '.join(simulated)}, so the "
            f"latencies and capacity kvplan reported for it are not {engine}'s; to simulate it: "
            f"simulate {scenario} --set engine={engine}")


# --- the server -------------------------------------------------------------------------------


def _model_id(scenario: Scenario, dep: Deployment, base_dir: Path) -> str:
    """What the server loads: the catalog model's Hugging Face id (simulator/kv/catalog.py), a
    config.json's ``_name_or_path``, or the folder that holds the config.json."""
    if dep.model.hf_id:
        return dep.model.hf_id
    if scenario.model.endswith(".json"):
        path = Path(scenario.model)
        return str((path if path.is_absolute() else base_dir / path).resolve().parent)
    return dep.model.name


def _quantization_notes(dep: Deployment, engine: str) -> tuple[list[str], list[str]]:
    """``(--quantization flag words, notes)``. A quantized checkpoint needs no flag: both
    servers read its ``quantization_config`` (vLLM: ModelConfig.quantization left None; SGLang:
    ServerArgs.quantization left None). fp8 of a 16-bit checkpoint is quantized at load by both
    (``--quantization fp8``); other what-if formats need a checkpoint quantized that way."""
    fmt = dep.capacity.weight_format
    if fmt.origin == "online":
        return ["--quantization", "fp8"], []
    if fmt.origin == "what-if":
        return [], [f"weights: kvplan sized {fmt.quantization} weights of an unquantized "
                    f"checkpoint; {engine} does not quantize to {fmt.quantization} at load: serve a "
                    f"{fmt.quantization} checkpoint of {dep.model.name}"]
    if fmt.origin == "unquantized" and dep.model.quantization is not None:
        return [], [f"weights: kvplan sized them in {fmt.model_dtype} (quantization: none); "
                    f"the checkpoint is {dep.model.quantization.method}: serve an unquantized one"]
    return [], []


def _kv_dtype(scenario: Scenario, dep: Deployment, engine: str) -> tuple[list[str], list[str]]:
    """``(--kv-cache-dtype words, notes)``. ``auto`` is the model's dtype in both servers; fp8
    is e4m3 (vLLM's "fp8 (=fp8_e4m3)", vllm/config/cache.py; SGLang names only fp8_e4m3 and
    fp8_e5m2, python/sglang/srt/server_args.py ServerArgs.kv_cache_dtype choices)."""
    from simulator.kv.model_config import canonical_dtype
    from simulator.kv.sizing import resolve_kv_dtype

    asked = scenario.kv_cache_dtype.strip().lower()
    stored = resolve_kv_dtype(dep.model, asked)
    if asked == "auto" or stored == canonical_dtype(dep.model.torch_dtype):
        return ["--kv-cache-dtype", "auto"], []
    if stored in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        name = "fp8_e4m3" if stored == "fp8" and engine == "sglang" else stored
        return ["--kv-cache-dtype", name], []
    if engine == "sglang" and stored == "bf16":
        return ["--kv-cache-dtype", "bf16"], []
    return ["--kv-cache-dtype", "auto"], [
        f"kv_cache_dtype {stored}: kvplan sized the KV cache in {stored}; the server stores it "
        f"in the model's dtype ({canonical_dtype(dep.model.torch_dtype)}) and has no {stored} "
        "KV cache: its pool differs"]


def _vllm_serve(scenario: Scenario, dep: Deployment, model: str, fraction: float) -> Command:
    """``vllm serve``. Flags: vllm/engine/arg_utils.py EngineArgs.add_cli_args (the model is
    ``vllm serve``'s positional model_tag); booleans are BooleanOptionalAction, so
    ``--no-enable-prefix-caching`` says off explicitly."""
    sched = dep.scheduler_config
    v0 = sched.engine == "vllm-v0"
    argv = ["vllm", "serve", model,
            "--tensor-parallel-size", str(scenario.tensor_parallel),          # ParallelConfig
            "--gpu-memory-utilization", _number(fraction),                    # CacheConfig
            "--block-size", str(sched.block_size),                            # CacheConfig
            "--max-model-len", str(sched.max_model_len),                      # ModelConfig
            "--max-num-seqs", str(sched.max_num_seqs),                        # SchedulerConfig
            "--max-num-batched-tokens", str(sched.max_num_batched_tokens)]    # SchedulerConfig
    notes: list[str] = []
    words, more = _kv_dtype(scenario, dep, "vllm")
    argv += words
    notes += more
    words, more = _quantization_notes(dep, "vLLM")
    argv += words
    notes += more
    argv.append("--enable-prefix-caching" if sched.enable_prefix_caching
                else "--no-enable-prefix-caching")
    argv.append("--enable-chunked-prefill" if sched.enable_chunked_prefill
                else "--no-enable-chunked-prefill")
    if scenario.long_prefill_token_threshold is not None:
        argv += ["--long-prefill-token-threshold", str(scenario.long_prefill_token_threshold)]
    if scenario.max_num_partial_prefills is not None:
        argv += ["--max-num-partial-prefills", str(scenario.max_num_partial_prefills)]
    if scenario.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(scenario.num_gpu_blocks_override)]
    cap = dep.capacity
    if dep.model.is_moe and (scenario.data_parallel_size > 1 or cap.ep > 1):
        # vllm/engine/arg_utils.py --data-parallel-size, --enable-expert-parallel: the MoE layers
        # run over data_parallel_size x tensor_parallel GPUs (one server), expert parallel or
        # TP-sharded (FusedMoEParallelConfig.make)
        argv += ["--data-parallel-size", str(scenario.data_parallel_size)]
        if cap.ep > 1:
            argv.append("--enable-expert-parallel")
        if cap.moe_dispatch == "all-to-all":
            notes.append("moe_dispatch all-to-all: kvplan simulated DeepEP-style dispatch and "
                         "combine; vLLM's default --all2all-backend is allgather_reducescatter "
                         "(vllm/config/parallel.py): pass --all2all-backend deepep_low_latency or "
                         "deepep_high_throughput (DeepEP installed) to run what was simulated")
        if scenario.num_replicas > 1:
            notes.append(f"num_replicas {scenario.num_replicas}: run {scenario.num_replicas} such "
                         "servers (each its own group of MoE layers) behind a router")
    elif scenario.num_replicas * scenario.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(scenario.num_replicas * scenario.data_parallel_size)]
        if scenario.router.policy != "vllm-dp":
            notes.append(f"router: kvplan routed by {scenario.router.policy}; vLLM's own data-"
                         "parallel balancer is policy vllm-dp (waiting x 4 + running): for "
                         f"{scenario.router.policy}, run {scenario.num_replicas} servers behind "
                         "that router instead")
    env: tuple[tuple[str, str], ...] = ()
    if v0:
        # vllm/envs.py VLLM_USE_V1: 0 selects the V0 engine in the releases that still have it
        # (the newest source read, arg_utils.py @ 99d7eb5, has no V0 path: use vLLM <= 0.10)
        env = (("VLLM_USE_V1", "0"),)
        argv += ["--swap-space", _number(scenario.swap_space)]  # CacheConfig, GiB per GPU
        notes.append("engine vllm-v0: VLLM_USE_V1=0 takes effect in vLLM releases that still "
                     "ship the V0 engine (0.10 and earlier)")
        if scenario.preemption_mode == "swap":
            notes.append("preemption_mode swap: V0's --preemption-mode swap (V0 releases' "
                         "arg_utils.py); not in the newest parser, so not written here")
    if scenario.scheduler_reserve_full_isl is False:
        notes.append("scheduler_reserve_full_isl false: vLLM V1 always admits only a prompt that "
                     "fits whole (KVCacheManager.allocate_slots); no flag turns it off")
    if scenario.watermark:
        notes.append(f"watermark {scenario.watermark}: kvplan kept that share of blocks free at "
                     "admission; the newest vLLM parser has no flag for it")
    if scenario.kv_offload is not None:
        notes.append(f"kv_offload: kvplan modelled a {_number(scenario.kv_offload.size_gib)} GiB "
                     "CPU tier (vLLM's OffloadingConnector); configure it with --kv-transfer-config "
                     "as your vLLM release documents: not written here")
    return Command(tuple(argv), env, tuple(notes))


def _sglang_serve(scenario: Scenario, dep: Deployment, model: str, fraction: float) -> Command:
    """``python -m sglang.launch_server``. Flags: python/sglang/srt/server_args.py (ServerArgs:
    each field's flag is its name with dashes; --model-path, --tp-size, --dp-size,
    --mem-fraction-static, --page-size, --context-length, --max-running-requests,
    --chunked-prefill-size, --max-prefill-tokens, --schedule-policy, --schedule-conservativeness,
    --radix-eviction-policy, --disable-radix-cache, --max-total-tokens, --port; DP attention and
    expert parallelism: --enable-dp-attention with --dp-size, --ep-size, --moe-a2a-backend)."""
    sched = dep.scheduler_config
    dp, cap = scenario.data_parallel_size, dep.capacity
    chunk = sched.max_num_batched_tokens if sched.enable_chunked_prefill else -1  # -1: no chunking
    seqs, conservativeness = sched.max_num_seqs, sched.schedule_conservativeness
    if dp > 1:  # DP attention: the flags are the whole server's; SGLang divides them per DP rank
        # (ServerArgs._handle_data_parallelism; simulator/config/deployment.py
        # sglang_dp_attention_knobs): chunk // dp, conservativeness x 0.3, max_running_requests // dp
        if chunk != -1:
            chunk = scenario.max_num_batched_tokens or chunk * dp
        seqs *= dp
        conservativeness = (1.0 if scenario.schedule_conservativeness is None
                            else scenario.schedule_conservativeness)
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model,
            "--port", str(PORT),  # ServerArgs.port defaults to 30000: the bench commands use 8000
            # --tp-size: all the server's GPUs; with --enable-dp-attention, dp DP ranks of
            # tp / dp (python/sglang/srt/layers/dp_attention.py compute_dp_attention_world_info)
            "--tp-size", str(scenario.tensor_parallel * dp),
            "--mem-fraction-static", _number(fraction),
            "--page-size", str(sched.block_size),
            "--context-length", str(sched.max_model_len),
            "--max-running-requests", str(seqs),
            "--chunked-prefill-size", str(chunk),
            "--max-prefill-tokens", str(sched.max_prefill_tokens),
            "--schedule-policy", sched.schedule_policy,
            "--schedule-conservativeness", _number(conservativeness),
            "--radix-eviction-policy", sched.radix_eviction_policy]
    notes: list[str] = []
    if dp > 1:
        argv += ["--dp-size", str(dp), "--enable-dp-attention"]
    if dep.model.is_moe and cap.ep > 1:
        # ServerArgs.ep_size: the MoE's EP groups; its MoE TP is tp_size // ep_size
        argv += ["--ep-size", str(cap.ep)]
        if cap.moe_dispatch == "all-to-all":  # _handle_a2a_moe: deepep takes ep_size = tp_size
            argv += ["--moe-a2a-backend", "deepep"]
    if dep.model.is_moe and dp > 1 and cap.moe_dispatch == "all-gather":
        notes.append("DP attention without an a2a backend: SGLang gathers every DP rank's tokens "
                     "before the MoE (dp_attention.py _dp_gather), as kvplan simulated")
    words, more = _kv_dtype(scenario, dep, "sglang")
    argv += words
    notes += more
    words, more = _quantization_notes(dep, "SGLang")
    argv += words
    notes += more
    if not sched.enable_prefix_caching:
        argv.append("--disable-radix-cache")
    if scenario.num_gpu_blocks_override is not None:
        argv += ["--max-total-tokens", str(scenario.num_gpu_blocks_override * sched.block_size)]
    if scenario.num_replicas > 1 and dp > 1:
        notes.append(f"num_replicas {scenario.num_replicas}: run {scenario.num_replicas} such servers "
                     f"behind a router (kvplan routed by {scenario.router.policy})")
    elif scenario.num_replicas > 1:
        argv += ["--dp-size", str(scenario.num_replicas)]
        notes.append(f"router: kvplan routed by {scenario.router.policy}; SGLang's --dp-size "
                     "balances by its --load-balance-method (round robin by default)")
    if dp > 1:
        notes.append(f"router: kvplan routed by {scenario.router.policy} over the DP ranks; SGLang's "
                     "DP controller balances them by its --load-balance-method")
    notes.append("SGLang's overlap scheduler (on by default) is not modelled by kvplan; "
                 "--disable-overlap-schedule brings the server closer to the simulated one")
    return Command(tuple(argv), (), tuple(notes))


def _trtllm_serve(scenario: Scenario, dep: Deployment, model: str, fraction: float) -> tuple[Command, str]:
    """``trtllm-serve MODEL`` (the PyTorch backend) and the ``--extra_llm_api_options`` YAML it
    reads. Flags: tensorrt_llm/commands/serve.py (``serve``, ``trtllm-serve``'s default command:
    MODEL, --backend, --port, --tp_size, --max_batch_size, --max_num_tokens, --max_seq_len,
    --kv_cache_free_gpu_memory_fraction, --enable_chunked_prefill, --extra_llm_api_options). The
    YAML holds what has no flag: KvCacheConfig's tokens_per_block, enable_block_reuse, dtype and
    max_tokens, SchedulerConfig's capacity_scheduler_policy (``get_llm_args`` hard-wires
    GUARANTEED_NO_EVICT). The YAML replaces a whole ``kv_cache_config`` / ``scheduler_config``
    (tensorrt_llm/llmapi/llm_utils.py ``update_llm_args_with_extra_dict`` builds each from its
    mapping alone), so it repeats free_gpu_memory_fraction. Data-parallel attention and the MoE
    layout are BaseLlmArgs fields with no serve.py flag but ``--ep_size``:
    ``enable_attention_dp``, ``moe_tensor_parallel_size``, ``moe_expert_parallel_size`` (the YAML's
    top level), with ``--tp_size`` the server's GPUs (tensorrt_llm/mapping.py ``Mapping``)."""
    from simulator.kv.model_config import canonical_dtype
    from simulator.kv.sizing import resolve_kv_dtype

    sched = dep.scheduler_config
    argv = ["trtllm-serve", model,
            "--backend", "pytorch",
            "--port", str(PORT),                                           # serve.py default 8000
            # tp_size: all the server's GPUs (with attention DP, each a DP rank of its own)
            "--tp_size", str(scenario.tensor_parallel * scenario.data_parallel_size),
            "--max_batch_size", str(sched.max_num_seqs),
            "--max_num_tokens", str(sched.max_num_batched_tokens),
            "--max_seq_len", str(sched.max_model_len),
            "--kv_cache_free_gpu_memory_fraction", _number(fraction)]
    if sched.enable_chunked_prefill:
        argv.append("--enable_chunked_prefill")
    argv += ["--extra_llm_api_options", TRTLLM_CONFIG]
    notes: list[str] = []
    stored = resolve_kv_dtype(dep.model, scenario.kv_cache_dtype.strip().lower())
    dtype = "auto"
    if stored in ("fp8", "fp8_e4m3"):
        dtype = "fp8"
    elif (scenario.kv_cache_dtype.strip().lower() != "auto"
          and stored != canonical_dtype(dep.model.torch_dtype)):
        notes.append(f"kv_cache_dtype {stored}: kvplan sized the KV cache in {stored}; TensorRT-LLM's "
                     "KvCacheConfig.dtype takes auto or fp8 here: its pool differs")
    fmt = dep.capacity.weight_format
    if fmt.origin in ("online", "what-if"):
        notes.append(f"weights: kvplan sized {fmt.quantization} weights of an unquantized checkpoint; "
                     f"TensorRT-LLM reads the checkpoint's quantization: serve a {fmt.quantization} "
                     f"checkpoint of {dep.model.name}")
    elif fmt.origin == "unquantized" and dep.model.quantization is not None:
        notes.append(f"weights: kvplan sized them in {fmt.model_dtype} (quantization: none); the "
                     f"checkpoint is {dep.model.quantization.method}: serve an unquantized one")
    if scenario.num_replicas > 1 and scenario.data_parallel_size == 1:
        notes.append(f"num_replicas {scenario.num_replicas}: run {scenario.num_replicas} such servers "
                     f"behind a router (kvplan routed by {scenario.router.policy})")
    notes.append("TensorRT-LLM's overlap scheduler (on by default) is not modelled by kvplan; "
                 "disable_overlap_scheduler: true in the YAML brings the server closer to the simulated one")
    layout: dict[str, Any] = {}
    cap = dep.capacity
    if scenario.data_parallel_size > 1:  # BaseLlmArgs.enable_attention_dp
        layout["enable_attention_dp"] = True
        if dep.model.is_moe:
            notes.append(f"moe_dispatch {cap.moe_dispatch}: kvplan simulated it; TensorRT-LLM picks "
                         "its MoE all-to-all itself under attention DP (fused_moe "
                         "select_alltoall_method_type: moe_expert_parallel_size > top_k, MNNVL or "
                         "DeepEP), else all-gathers")
        if scenario.num_replicas > 1:
            notes.append(f"num_replicas {scenario.num_replicas} of attention DP: each replica is "
                         "one such server")
    if dep.model.is_moe and (cap.ep > 1 or cap.moe_tp != scenario.tensor_parallel
                             * scenario.data_parallel_size):
        # BaseLlmArgs.moe_tensor_parallel_size / moe_expert_parallel_size; Mapping checks
        # tp_size == moe_tp_size x moe_ep_size
        layout["moe_tensor_parallel_size"] = cap.moe_tp
        layout["moe_expert_parallel_size"] = cap.ep
    kv = {"free_gpu_memory_fraction": float(_number(fraction)), "tokens_per_block": sched.block_size,
          "enable_block_reuse": sched.enable_prefix_caching, "dtype": dtype}
    if scenario.num_gpu_blocks_override is not None:
        kv["max_tokens"] = scenario.num_gpu_blocks_override * sched.block_size
    scheduler: dict[str, Any] = {"capacity_scheduler_policy": sched.capacity_scheduler_policy}
    if sched.enable_chunked_prefill:  # py_executor_creator.py: the default when none is given
        scheduler["context_chunking_policy"] = "FIRST_COME_FIRST_SERVED"
    import yaml

    text = ("# kvplan export: TensorRT-LLM LLM API options trtllm-serve has no flag for "
            "(--extra_llm_api_options)\n"
            "# kv_cache_config and scheduler_config replace the server's as a whole\n"
            + yaml.safe_dump({**layout, "kv_cache_config": kv, "scheduler_config": scheduler},
                             sort_keys=False))
    return Command(tuple(argv), (), tuple(notes)), text


# --- the load ---------------------------------------------------------------------------------


def _block_tokens(requests: Sequence[Request], where: str) -> int:
    """Tokens per hash id in trace.jsonl: the workload's prefix block (Mooncake's 512, a
    synthetic shared prefix's ``block_tokens``), or :data:`UNSHARED_BLOCK_TOKENS` without one."""
    sizes = {r.prefix_block_tokens for r in requests if r.prefix_ids}
    if len(sizes) > 1:
        raise KvplanError(f"{where}: the workload's prefix ids name blocks of "
                          f"{sorted(sizes)} tokens; a trace file has one block size")
    return sizes.pop() if sizes else UNSHARED_BLOCK_TOKENS


def trace_rows(requests: Iterable[Request], block_tokens: int) -> list[dict[str, Any]]:
    """``requests`` as timed-trace rows: ``{timestamp, input_length, output_length, hash_ids}``.

    ``hash_ids`` has exactly ⌈input_length / block_tokens⌉ ids, as GuideLLM's mooncake data
    requires (trace_mooncake.py MooncakeTraceFormat.validate_row) and vLLM's timed_trace needs
    to fill the prompt (vllm/benchmarks/datasets/datasets.py TimedTrace._expand_prompt stops
    when the ids run out). A block keeps its identity only after the same blocks: a request's
    prefix ids are renumbered by (previous block's new id, prefix id), densely from 0 (GuideLLM
    keeps a list indexed by id); the rest of its prompt gets ids no other request has. Both
    tools turn equal ids into equal token blocks, so the server's prefix cache sees the sharing
    kvplan simulated and nothing more.
    """
    numbered: dict[tuple[int, int], int] = {}
    next_id = 0
    rows = []
    for r in requests:
        blocks = -(-r.prompt_tokens // block_tokens)
        ids: list[int] = []
        parent = -1
        for pid in r.prefix_ids[:blocks]:
            key = (parent, pid)
            new = numbered.get(key)
            if new is None:
                new = numbered[key] = next_id
                next_id += 1
            ids.append(new)
            parent = new
        fresh = blocks - len(ids)
        ids.extend(range(next_id, next_id + fresh))
        next_id += fresh
        rows.append({"timestamp": round(r.arrival_s, 6), "input_length": r.prompt_tokens,
                     "output_length": r.output_tokens, "hash_ids": ids})
    return rows


def _common_notes(scenario: Scenario, rejected: int, truncated: int) -> list[str]:
    """What both tools replay of the workload only approximately, or not at all."""
    w = scenario.workload
    notes = ["prompts are random tokens of the exact lengths (blocks with equal hash ids are "
             "equal); outputs run to their length (EOS ignored)"]
    if w.n > 1 or w.beam_width > 1:
        notes.append(f"n {w.n}, beam_width {w.beam_width}: each request is sent as one sequence; "
                     "parallel samples and beams are not replayed")
    if w.warmup_requests or w.warmup_fraction:
        notes.append("warm-up: kvplan left the first requests sent out of its statistics; drop "
                     "them from the result's per-request data to compare")
    if rejected:
        notes.append(f"{rejected} request(s) longer than max_model_len stay in the trace: the "
                     "server answers them 400, as kvplan rejected them")
    if truncated:
        notes.append(f"{truncated} request(s) have their output cut at max_model_len, as kvplan "
                     "ran them (max_model_len_policy truncate)")
    return notes


def _vllm_bench(scenario: Scenario, model: str, num: int, block: int, clients: Any,
                common: list[str]) -> Command:
    """``vllm bench serve`` replaying trace.jsonl. Flags: vllm/benchmarks/serve.py add_cli_args
    (--model, --port, --max-concurrency, --request-rate, --self-timed, --ignore-eos,
    --percentile-metrics, --metric-percentiles, --goodput, --save-result, --save-detailed,
    --result-dir, --result-filename) and vllm/benchmarks/datasets/datasets.py add_dataset_parser
    (--dataset-name timed_trace, --dataset-path, --num-prompts, --seed,
    --timed-trace-chunk-hash-size, --timed-trace-sec-multiplier)."""
    w = scenario.workload
    argv = ["vllm", "bench", "serve", "--model", model, "--port", str(PORT),
            "--dataset-name", "timed_trace", "--dataset-path", "trace.jsonl",
            "--timed-trace-chunk-hash-size", str(block),
            "--timed-trace-sec-multiplier", "1",  # timestamps are seconds
            "--num-prompts", str(num), "--seed", str(scenario.seed)]
    notes = list(common)
    if w.untimed:
        # serve.py: --request-rate inf sends every request at once; with --max-concurrency N the
        # semaphore lets N run: N closed-loop clients (sends in trace order)
        argv += ["--no-self-timed", "--request-rate", "inf"]
        if w.think_time_s:
            notes.append(f"think_time_s {w.think_time_s}: vllm bench serve sends the next "
                         "request the moment a slot frees; think time is not replayed")
    else:
        argv.append("--self-timed")  # send each request at its trace timestamp
    if clients.max_in_flight is not None:
        argv += ["--max-concurrency", str(clients.max_in_flight)]
    argv += ["--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
             "--metric-percentiles", "50,90,99", *_goodput(scenario),
             "--save-result", "--save-detailed", "--result-dir", RESULTS_DIR,
             "--result-filename", "vllm-bench.json"]
    # TimedTrace seeds each block's tokens with Python's hash(), randomised per process
    # (datasets.py TimedTrace._expand_prompt): a fixed PYTHONHASHSEED makes reruns identical
    return Command(tuple(argv), (("PYTHONHASHSEED", "0"),), tuple(notes))


def _goodput(scenario: Scenario) -> list[str]:
    """serve.py --goodput "KEY:VALUE" pairs in milliseconds (ttft, tpot, e2el) from ``slo:``."""
    slo = scenario.slo
    if slo is None:
        return []
    pairs = [f"{key}:{_number(value * 1000)}" for key, value in
             (("ttft", slo.ttft_p99_s), ("tpot", slo.tpot_p99_s), ("e2el", slo.e2e_p99_s))
             if value is not None]
    return ["--goodput", *pairs] if pairs else []


def _guidellm_replay(scenario: Scenario, model: str, num: int, block: int, clients: Any,
                     common: list[str]) -> Command:
    """``guidellm run`` (GuideLLM 0.7) on trace.jsonl: --data kind=mooncake reads the same rows
    (trace_mooncake.py); --profile kind=replay sends each at its timestamp × time_scale
    (profiles/replay.py), kind=concurrent keeps N streams busy (closed loop), kind=throughput
    sends all at once (a burst)."""
    w = scenario.workload
    notes = list(common)
    if w.closed_loop:
        profile = _kv(kind="concurrent", streams=clients.max_in_flight)
        if w.think_time_s:
            notes.append(f"think_time_s {w.think_time_s}: not replayed")
    elif w.untimed:
        profile = _kv(kind="throughput", max_concurrency=clients.max_in_flight)
    else:
        profile = _kv(kind="replay", time_scale=1)
        if clients.max_in_flight is not None:
            notes.append(f"max_concurrency {clients.max_in_flight}: GuideLLM's replay profile "
                         "has no cap on requests in flight (profiles/replay.py); use bench.sh vllm")
    argv = ["guidellm", "run",
            "--backend", _kv(kind="openai_http", target=URL, model=model),
            "--profile", profile,
            "--data", _kv(kind="mooncake", path="trace.jsonl", hash_id_block_size=block),
            "--constraint", _kv(kind="max_requests", count=num),
            "--seed", _kv(kind="static", value=scenario.seed),
            "--output", _kv(kind="json", path=f"{RESULTS_DIR}/guidellm.json")]
    return Command(tuple(argv), (), tuple(notes))


def _synthetic_benches(scenario: Scenario, model: str, num: int) -> dict[str, Command]:
    """For a synthetic workload the tools' own generators express — fixed prompt and output
    lengths, Poisson or gamma arrivals, no shared prefix, open loop without a cap — the same
    distributions drawn by the tool: ``vllm bench serve --dataset-name random`` (its gamma gaps
    have shape --burstiness and mean 1 / rate: serve.py get_request, so burstiness = 1 / cv²),
    and for Poisson ``guidellm run --profile kind=poisson`` with synthetic_text data."""
    from workloads.spec import FixedLengths, GammaArrivals, PoissonArrivals

    w = scenario.workload
    if (w.trace is not None or w.untimed or w.max_concurrency is not None
            or w.shared_prefix is not None or not isinstance(w.prompt_tokens, FixedLengths)
            or not isinstance(w.output_tokens, FixedLengths)
            or not isinstance(w.arrival, (PoissonArrivals, GammaArrivals))):
        return {}
    rate = (w.rate if w.rate is not None else w.arrival.rate or 0.0) * (w.rate_scale or 1.0)
    burstiness = 1 / w.arrival.cv ** 2 if isinstance(w.arrival, GammaArrivals) else 1.0
    isl, osl = w.prompt_tokens.value, w.output_tokens.value
    notes = ("fresh draws from the workload's distributions (not trace.jsonl's requests)",)
    out = {"vllm-random": Command((
        "vllm", "bench", "serve", "--model", model, "--port", str(PORT),
        "--dataset-name", "random", "--random-input-len", str(isl),
        "--random-output-len", str(osl), "--random-range-ratio", "0",
        "--request-rate", _number(rate), "--burstiness", _number(burstiness),
        "--num-prompts", str(num), "--seed", str(scenario.seed), "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        *_goodput(scenario), "--save-result", "--result-dir", RESULTS_DIR,
        "--result-filename", "vllm-bench-random.json"), (), notes)}
    if isinstance(w.arrival, PoissonArrivals):
        out["guidellm-synthetic"] = Command((
            "guidellm", "run",
            "--backend", _kv(kind="openai_http", target=URL, model=model),
            "--profile", _kv(kind="poisson", rate=_number(rate)),
            "--data", _kv(kind="synthetic_text", prompt_tokens=isl, output_tokens=osl),
            "--constraint", _kv(kind="max_requests", count=num),
            "--seed", _kv(kind="static", value=scenario.seed),
            "--output", _kv(kind="json", path=f"{RESULTS_DIR}/guidellm-synthetic.json")),
            (), notes)
    return out


def _kv(**items: object) -> str:
    """GuideLLM's ``kind=NAME,key=value`` option value (utils/cli.py parse_arguments); None
    values are left out."""
    return ",".join(f"{k}={v}" for k, v in items.items() if v is not None)


def _number(value: float) -> str:
    """A float as the shortest text that reads back the same (0.9, not 0.9000000000000001)."""
    if math.isinf(value):
        return "inf"
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)
