#!/usr/bin/env python3
"""Read, for each InferenceX row of AIConfigurator's silicon sample, the script InferenceX ran it
with, the checkpoint it served and its engine flags: ``validation/inferencex_recipes.csv``.

    python validation/inferencex_recipes.py --inferencex /path/to/InferenceX \\
        [--sample .../aiconfigurator_core/systems/silicon_sample.csv] [--out validation/inferencex_recipes.csv]

``--inferencex`` is a clone of https://github.com/SemiAnalysisAI/InferenceX (a bare git directory
will do: files are read with ``git show <commit>:<path>``). For each single-node row whose
method is InferenceX's (simulator/commands/validate/silicon.py), it takes the last commit of
InferenceX's main before the end of the row's measured day, finds the config of the row's
model, precision, framework and hardware in ``.github/configs/nvidia-master.yaml`` (the served
checkpoint; whether a speculative-decoding ``-mtp`` variant existed), the script
``benchmarks/single_node/<prefix>_<precision>_<hw>[_trt].sh`` (before 2025-11:
``benchmarks/<prefix>_<precision>_<hw>[_trt]_{slurm,docker}.sh``), and **runs it with every
command stubbed** (vllm, sglang's python3, trtllm-serve, mpirun, hf, pip, git, curl, rm, ...
only record their arguments; ``tail`` says the server started) under the row's environment
(TP, EP_SIZE, DP_ATTENTION, CONC, ISL, OSL, MAX_MODEL_LEN = ISL + OSL + 200 as
utils/matrix_logic/generate_sweep_configs.py sets it), so the flags are the ones its
conditionals chose for that row. The config files the script writes (vLLM's config.yaml,
TensorRT-LLM's extra options) are read back. As root it runs as ``nobody`` in a network
namespace of its own (``unshare -n setpriv``); otherwise as the user, with the stubs first on a
PATH of a few coreutils. Nothing is fetched.

The converter (validation/silicon_convert.py) joins this file on ``aic_id``; regenerating it
needs the clone, regenerating the table does not.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from simulator.commands.validate import silicon  # noqa: E402

COLUMNS = ("aic_id", "recipe", "served_model", "engine_flags", "bench_flags", "ambiguous", "launch")
STUBS = ("python3", "python", "vllm", "mpirun", "trtllm-serve", "trtllm-llmapi-launch", "hf",
         "huggingface-cli", "pip", "pip3", "git", "nvidia-smi", "sleep", "curl", "wget", "uv", "docker",
         "srun", "rm", "mv", "cp", "ln", "chmod", "chown", "kill", "pkill", "ps", "nohup", "numactl",
         "sudo", "apt", "apt-get", "rocm-smi", "amd-smi", "enroot", "salloc", "scancel", "squeue", "lsof")
TOOLS = ("cat", "sed", "awk", "grep", "expr", "head", "tr", "cut", "date", "basename", "dirname", "seq",
         "env", "mkdir", "ls", "wc", "sort", "uniq", "touch", "nproc", "bc", "mktemp", "tee", "printf",
         "echo", "test", "true", "false", "bash", "sh", "timeout")
LIB_OVERRIDES = r"""
check_env_vars() { :; }
start_gpu_monitor() { :; }
stop_gpu_monitor() { :; }
wait_for_server_ready() { :; }
run_eval() { :; }
append_lm_eval_summary() { :; }
setup_eval_context() { :; }
move_profile_trace_for_relay() { :; }
run_benchmark_serving() { local line; line="run_benchmark_serving$(printf ' %q' "$@")"; printf '%s\n' "$line" >> "$STUB_LOG"; }
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout


@functools.lru_cache(maxsize=None)
def commit_before(repo: Path, day: str) -> str:
    return git(repo, "rev-list", "-1", "--first-parent", f"--before={day}T23:59:59Z", "HEAD").strip()


@functools.lru_cache(maxsize=None)
def show(repo: Path, commit: str, path: str) -> str:
    return git(repo, "show", f"{commit}:{path}")


@functools.lru_cache(maxsize=None)
def configs(repo: Path, commit: str) -> dict:
    import yaml

    for path in (".github/configs/nvidia-master.yaml", "configs/nvidia-master.yaml"):
        text = show(repo, commit, path)
        if text:
            try:
                return yaml.safe_load(text) or {}
            except yaml.YAMLError:
                return {}
    return {}


def config_of(repo: Path, commit: str, prefix: str, precision: str, framework: str, hw: str
              ) -> tuple[str | None, bool]:
    """(served checkpoint, whether an MTP variant of this config existed) at ``commit``."""
    served, mtp = None, False
    for value in configs(repo, commit).values():
        if not isinstance(value, dict) or value.get("multinode"):
            continue
        if (value.get("model-prefix"), value.get("precision"), value.get("framework")) != (prefix, precision, framework):
            continue
        if str(value.get("runner", "")).split("-")[0] != hw:
            continue
        specs = {str(e.get("spec-decoding", "none")) for s in value.get("seq-len-configs") or []
                 for e in s.get("search-space") or []}
        if specs - {"none"}:
            mtp = True
        if "none" in specs and served is None:
            served = value.get("model")
    return served, mtp


def scripts(repo: Path, commit: str, prefix: str, precision: str, hw: str, framework: str) -> list[str]:
    names = script_names(prefix, precision, hw, framework)
    return [n for n in names if show(repo, commit, n)]


def script_names(prefix: str, precision: str, hw: str, framework: str) -> list[str]:
    """Where InferenceX kept the script over time: benchmarks/<name>_{slurm,docker}.sh (to
    2025-11), benchmarks/<name>.sh (to 2026-02), benchmarks/single_node/<name>.sh."""
    sfx = "_trt" if framework == "trt" else ""
    name = f"{prefix}_{precision}_{hw}{sfx}"
    return [f"benchmarks/single_node/{name}.sh", f"benchmarks/{name}.sh",
            f"benchmarks/{name}_slurm.sh", f"benchmarks/{name}_docker.sh"]


@functools.lru_cache(maxsize=None)
def first_commit_with(repo: Path, day: str, paths: tuple[str, ...]) -> str | None:
    """The first commit of main after ``day`` that has one of ``paths``: for a run measured
    from a branch before its script reached main."""
    for line in git(repo, "log", "--first-parent", "--reverse", "--format=%H", f"--after={day}T00:00:00Z",
                    "HEAD", "--", *paths).split():
        if any(show(repo, line, p) for p in paths):
            return line
    return None


def sandbox_run(repo: Path, commit: str, script: str, env: dict[str, str]) -> tuple[list[list[str]], dict[str, str]]:
    """Run ``script`` at ``commit`` with stubs; (recorded commands as argv lists, files it wrote)."""
    with tempfile.TemporaryDirectory(prefix="ixr-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        for name in STUBS:
            stub = root / "bin" / name
            # one write per line: commands left in the background write at the same time
            stub.write_text('#!/bin/bash\nline="$(basename "$0")$(printf " %q" "$@")"\n'
                            'printf "%s\\n" "$line" >> "$STUB_LOG"\n'
                            + ('read -t 0.05 < /dev/zero 2>/dev/null; exit 0\n' if name == "sleep" else ""))
            stub.chmod(0o755)
        tail = root / "bin" / "tail"
        tail.write_text("#!/bin/bash\nprintf 'Application startup complete.\\nThe server is fired up and ready"
                        " to roll!\\nUvicorn running\\n'\n")
        tail.chmod(0o755)
        for tool in TOOLS:
            real = shutil.which(tool)
            if real and not (root / "bin" / tool).exists():
                (root / "bin" / tool).symlink_to(real)
        bench = root / "benchmarks"
        (bench / "single_node").mkdir(parents=True)
        target = root / script
        target.parent.mkdir(parents=True, exist_ok=True)
        work = root / "work"
        work.mkdir()
        # The container's /workspace (server logs, results) is the sandbox's work folder: a
        # redirection into a missing /workspace would keep the launch command from running.
        target.write_text(show(repo, commit, script).replace("/workspace", str(work)))
        (bench / "benchmark_lib.sh").write_text(
            show(repo, commit, "benchmarks/benchmark_lib.sh").replace("/workspace", str(work)) + LIB_OVERRIDES)
        log = root / "calls.log"
        log.touch()
        for p in (root, work, log, root / "bin"):
            p.chmod(0o777)
        full_env = {"PATH": str(root / "bin"), "HOME": str(work), "STUB_LOG": str(log), "TMPDIR": str(work),
                    "RANDOM_RANGE_RATIO": "0.8", "RESULT_FILENAME": "result", "PORT_OFFSET": "0",
                    "PORT": "8888", "HF_TOKEN": "x", "HF_HUB_CACHE": str(work), "SPEC_DECODING": "none",
                    "RUN_EVAL": "false", "EVAL_ONLY": "false", "PROFILE": "", "GITHUB_WORKSPACE": str(work),
                    **env}
        cmd = ["/bin/bash", str(target)]
        unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
        if os.geteuid() == 0 and unshare and setpriv:
            cmd = [unshare, "-n", "--", setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", *cmd]
        _run_to_the_end(cmd, work, full_env)
        calls = []
        for line in log.read_text(errors="replace").splitlines():
            try:
                calls.append(shlex.split(line))
            except ValueError:
                calls.append(line.split())
        files = {p.name: p.read_text(errors="replace") for p in work.iterdir()
                 if p.is_file() and p.suffix in (".yaml", ".yml", ".json") and p.stat().st_size < 100_000}
        return calls, files


def _run_to_the_end(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 10.0) -> None:
    """Run ``cmd`` in a session of its own and wait for the commands it left in the background
    (the stubbed server launch ends with ``&``) before reading what they recorded."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass  # a script that waits on its (stubbed) server: what it recorded is read all the same
    deadline = time.monotonic() + 5.0
    try:
        while time.monotonic() < deadline:
            os.killpg(proc.pid, 0)  # raises once no process of the session is left
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the whole session has exited: nothing left to kill
    proc.wait()


def _options(argv: list[str]) -> dict[str, str]:
    """``--key value`` / ``--key=value`` / bare ``--flag`` of a command line, keys with dashes."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            key, eq, value = a[2:].partition("=")
            key = key.replace("_", "-")
            if eq:
                out[key] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[key] = argv[i + 1]
                i += 1
            else:
                out[key] = "true"
        i += 1
    return out


def _yaml(text: str) -> dict:
    import yaml

    try:
        y = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return y if isinstance(y, dict) else {}


def _is_launch(argv: list[str]) -> bool:
    """A server launch: vllm serve, python3 -m sglang.launch_server, trtllm-serve (perhaps under
    mpirun, nohup or numactl)."""
    head = [a for a in argv[:12] if not a.startswith("-")]
    return ((len(head) > 1 and head[0] == "vllm" and head[1] == "serve") or "sglang.launch_server" in argv[:6]
            or any(Path(a).name == "trtllm-serve" for a in argv[:12]))


def engine_flags(calls: list[list[str]], files: dict[str, str], framework: str) -> tuple[dict, str]:
    """The scheduler knobs kvplan takes, read off the launch command and its config files."""
    launch = next((c for c in calls if _is_launch(c)), None)
    if launch is None:
        return {}, ""
    opts = _options(launch)
    flags: dict[str, object] = {}
    if framework == "vllm":
        for name in ("config",):
            if name in opts and Path(opts[name]).name in files:
                for k, v in _yaml(files[Path(opts[name]).name]).items():
                    opts.setdefault(str(k).replace("_", "-"), str(v).lower() if isinstance(v, bool) else str(v))
        pick = {"max-num-seqs": "max_num_seqs", "max-num-batched-tokens": "max_num_batched_tokens",
                "gpu-memory-utilization": "gpu_memory_utilization", "kv-cache-dtype": "kv_cache_dtype",
                "block-size": "block_size", "max-model-len": "max_model_len",
                "data-parallel-size": "data_parallel_size", "speculative-config": "speculative"}
        for k, name in pick.items():
            if k in opts:
                flags[name] = opts[k]
        if "enable-expert-parallel" in opts:
            flags["enable_expert_parallel"] = True
        if opts.get("no-enable-prefix-caching") in ("true", "True") or "no-enable-prefix-caching" in opts:
            flags["enable_prefix_caching"] = False
        elif "enable-prefix-caching" in opts:
            flags["enable_prefix_caching"] = True
    elif framework == "sglang":
        pick = {"mem-fraction-static": "gpu_memory_utilization", "max-running-requests": "max_num_seqs",
                "chunked-prefill-size": "max_num_batched_tokens", "max-prefill-tokens": "max_prefill_tokens",
                "kv-cache-dtype": "kv_cache_dtype", "page-size": "block_size", "context-length": "max_model_len",
                "data-parallel-size": "data_parallel_size", "dp-size": "data_parallel_size", "dp": "data_parallel_size",
                "ep-size": "expert_parallel_size", "expert-parallel-size": "expert_parallel_size",
                "speculative-algorithm": "speculative"}
        for k, name in pick.items():
            if k in opts:
                flags[name] = opts[k]
        if "disable-radix-cache" in opts:
            flags["enable_prefix_caching"] = False
        if "enable-dp-attention" in opts:
            flags["dp_attention"] = True
    else:  # trt: command line and the --extra_llm_api_options file
        pick = {"max-batch-size": "max_num_seqs", "max-num-tokens": "max_num_batched_tokens",
                "max-seq-len": "max_model_len", "ep-size": "expert_parallel_size"}
        for k, name in pick.items():
            if k in opts:
                flags[name] = opts[k]
        extra = opts.get("extra-llm-api-options") or opts.get("config")
        y = _yaml(files.get(Path(extra).name, "")) if extra else {}
        kv = y.get("kv_cache_config") or {}
        if isinstance(kv, dict):
            if "free_gpu_memory_fraction" in kv:
                flags["kv_free_gpu_memory_fraction"] = kv["free_gpu_memory_fraction"]
            if "dtype" in kv:
                flags["kv_cache_dtype"] = kv["dtype"]
            if kv.get("enable_block_reuse") is False:
                flags["enable_prefix_caching"] = False
        for k in ("max_batch_size", "max_num_tokens"):
            if k in y:
                flags[{"max_batch_size": "max_num_seqs", "max_num_tokens": "max_num_batched_tokens"}[k]] = y[k]
        if y.get("enable_attention_dp"):
            flags["dp_attention"] = True
        if y.get("speculative_config"):
            flags["speculative"] = json.dumps(y["speculative_config"], default=str)
    return flags, shlex.join(launch)[:2000]


def bench_flags(calls: list[list[str]], lib: str) -> dict:
    """The client's settings: run_benchmark_serving's arguments (and the warm-up its library
    version adds) or, before benchmark_lib.sh, the benchmark_serving.py command line."""
    call = next((c for c in calls if c and c[0] == "run_benchmark_serving"), None)
    if call is None:
        call = next((c for c in calls if any("benchmark_serving.py" in x for x in c)), None)
        if call is None:
            return {}
        opts = _options(call)
        return {"client": next(x for x in call if "benchmark_serving.py" in x), **{
            k: opts[k] for k in ("num-prompts", "max-concurrency", "random-range-ratio", "random-input-len",
                                 "random-output-len", "request-rate", "num-warmups", "ignore-eos") if k in opts}}
    opts = _options(call)
    out = {"client": "utils/bench_serving/benchmark_serving.py (run_benchmark_serving)",
           **{k: opts[k] for k in ("num-prompts", "max-concurrency", "random-range-ratio", "input-len",
                                   "output-len") if k in opts}}
    if "--num-warmups" in lib:
        out["num-warmups"] = "2 x max-concurrency"
    if "--ignore-eos" in lib:
        out["ignore-eos"] = "true"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inferencex", required=True, type=Path, help="clone (or git dir) of SemiAnalysisAI/InferenceX")
    ap.add_argument("--sample", type=Path, default=None, help="silicon_sample.csv (default: the installed wheel's)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("inferencex_recipes.csv"))
    ap.add_argument("--jobs", type=int, default=4, help="scripts run at once (they mostly wait)")
    args = ap.parse_args(argv)
    sample = args.sample or _installed_sample()
    raws = silicon.read_sample(sample)
    table = {r["aic_id"]: r for r in silicon.convert(raws) if r["metric"] == "ttft"}
    repo = args.inferencex
    plans = []  # (aic id, served, ambiguous, commit, scripts, env) or a finished row
    for raw in raws:
        row = table[raw["id"]]
        if row["method"] != "inferencex":
            continue
        env = silicon.inferencex_env(raw)
        prefix, hw, framework = silicon.inferencex_names(raw)
        precision = (raw.get("precision") or "").lower()
        day = row["measured"]
        if env is None or prefix is None or hw is None or not day:
            continue
        commit = commit_before(repo, day)
        served, mtp = config_of(repo, commit, prefix, precision, framework, hw)
        found = scripts(repo, commit, prefix, precision, hw, framework)
        ambiguous = []
        if not found:
            later = first_commit_with(repo, day, tuple(script_names(prefix, precision, hw, framework)))
            if later is not None:
                ambiguous.append(f"no script on main at the measured date: the run used a branch; "
                                 f"flags read from the script as it reached main ({later[:12]})")
                commit = later
                found = scripts(repo, commit, prefix, precision, hw, framework)
                served2, mtp2 = config_of(repo, commit, prefix, precision, framework, hw)
                served, mtp = served or served2, mtp or mtp2
        served = served or silicon.SERVED.get((prefix, precision), "")
        if mtp:
            ambiguous.insert(0, "an MTP (speculative decoding) variant of this config ran at the time; the "
                             "sample does not say which this row is")
        env = {**env, "MAX_MODEL_LEN": str(int(env["ISL"]) + int(env["OSL"]) + 200), "MODEL": served,
               "PRECISION": precision, "FRAMEWORK": framework, "IMAGE": row["image"]}
        plans.append((raw["id"], served, ambiguous, commit, found, env, prefix, precision, hw, framework))
    keys = {(commit, script, tuple(sorted(env.items())), plan[9])
            for plan in plans for commit, script, env in [(plan[3], sc, plan[5]) for sc in plan[4]]}

    def extract(key: tuple) -> tuple:
        commit, script, env_items, framework = key
        calls, files = sandbox_run(repo, commit, script, dict(env_items))
        flags, launch = engine_flags(calls, files, framework)
        return flags, launch, bench_flags(calls, show(repo, commit, "benchmarks/benchmark_lib.sh"))

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        cache = dict(zip(keys, pool.map(extract, keys)))
    out = []
    for aic_id, served, ambiguous, commit, found, env, prefix, precision, hw, framework in plans:
        if not found:
            out.append({"aic_id": aic_id, "recipe": f"no script for {prefix}/{precision}/{hw}/{framework} at "
                        f"InferenceX {commit[:12]}", "served_model": served, "engine_flags": "", "bench_flags": "",
                        "ambiguous": "; ".join(ambiguous), "launch": ""})
            continue
        results = [(script, *cache[(commit, script, tuple(sorted(env.items())), framework)]) for script in found]
        script, flags, launch, bench = results[0]
        if len({json.dumps(r[1], sort_keys=True) for r in results}) > 1:
            ambiguous.append("the runner's scripts differ: " + ", ".join(r[0] for r in results))
        out.append({"aic_id": aic_id, "recipe": f"SemiAnalysisAI/InferenceX {script}@{commit[:12]}",
                    "served_model": served,
                    "engine_flags": json.dumps(flags, sort_keys=True, default=str) if flags else "",
                    "bench_flags": json.dumps(bench, sort_keys=True) if bench else "",
                    "ambiguous": "; ".join(ambiguous), "launch": launch})
    with args.out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(out)
    print(f"{len(out)} rows -> {args.out} ({len(cache)} script runs)")
    return 0


def _installed_sample() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("aiconfigurator-core is not installed: give --sample")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "silicon_sample.csv"


if __name__ == "__main__":
    raise SystemExit(main())
