"""`kvplan export`: every generated command parses with its tool's option names (vendored in
simulator/commands/export/flags.py from each tool's source) and carries the values the simulation used."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.commands.export.cmd import is_flag, trace_rows
from simulator.commands.export.flags import (
    GUIDELLM_KINDS,
    GUIDELLM_RUN_FLAGS,
    SGLANG_FLAGS,
    SGLANG_MOE_A2A_BACKENDS,
    SGLANG_KV_CACHE_DTYPES,
    SGLANG_RADIX_EVICTION_POLICIES,
    SGLANG_SCHEDULE_POLICIES,
    TRTLLM_BACKENDS,
    TRTLLM_CAPACITY_SCHEDULER_POLICIES,
    TRTLLM_CONTEXT_CHUNKING_POLICIES,
    TRTLLM_KV_CACHE_CONFIG_KEYS,
    TRTLLM_LLM_ARGS_KEYS,
    TRTLLM_SCHEDULER_CONFIG_KEYS,
    TRTLLM_SERVE_BOOL_FLAGS,
    TRTLLM_SERVE_FLAGS,
    VLLM_BENCH_DATASETS,
    VLLM_BENCH_FLAGS,
    VLLM_SERVE_BOOL_FLAGS,
    VLLM_SERVE_FLAGS,
)
from workloads.request import Request

PROGRAMS = {("vllm", "serve"): 2, ("vllm", "bench"): 3, ("python", "-m"): 3, ("guidellm", "run"): 2}


def _commands(script: str) -> list[tuple[dict[str, str], list[str], dict[str, list[str]]]]:
    """Each command of a generated script: its environment, its program words, and its flags
    (flag -> the values after it). Continuation lines are joined, comments and shell plumbing
    (set, cd, mkdir, case, echo, exit) skipped."""
    joined = script.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        env = {}
        while words and "=" in words[0] and not words[0].startswith("-"):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        lead = PROGRAMS.get(tuple(words[:2]))  # type: ignore[arg-type]
        if words[:1] == ["trtllm-serve"]:  # one word, then the positional model
            lead = 1
        if lead is None:
            continue
        program, rest = words[:lead], words[lead:]
        if program == ["vllm", "serve"] or program == ["trtllm-serve"]:  # the positional model
            program.append(rest.pop(0))
        flags: dict[str, list[str]] = {}
        while rest:
            flag = rest.pop(0)
            assert is_flag(flag), f"{flag!r} where a flag belongs in {line!r}"
            assert flag not in flags, f"{flag} given twice"
            flags[flag] = []
            while rest and not is_flag(rest[0]):
                flags[flag].append(rest.pop(0))
        out.append((env, program, flags))
    return out


def _vllm_known(flag: str) -> bool:
    return flag in VLLM_SERVE_FLAGS or (
        flag.startswith("--no-") and "--" + flag.removeprefix("--no-") in VLLM_SERVE_BOOL_FLAGS)


def _check_guidellm(flags: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """Every flag is guidellm run's, every kind=...,key=value option names a known kind and only
    that kind's keys. Returns option -> parsed mapping."""
    parsed = {}
    for flag, values in flags.items():
        assert flag in GUIDELLM_RUN_FLAGS, flag
        assert len(values) == 1
        items = dict(item.split("=", 1) for item in values[0].split(","))
        kinds = GUIDELLM_KINDS[flag]
        assert items["kind"] in kinds, (flag, items["kind"])
        assert set(items) <= kinds[items["kind"]], (flag, set(items) - kinds[items["kind"]])
        parsed[flag] = items
    return parsed


def _scenario(tmp_path: Path, name: str = "plan", **overrides: object) -> Path:
    data: dict[str, object] = {
        "name": name, "model": "llama-3.1-8b", "gpu": "h200-141gb", "max_model_len": 8192,
        "workload": {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 30,
                     "prompt_tokens": {"dist": "fixed", "value": 1000},
                     "output_tokens": {"dist": "fixed", "value": 100}},
        "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.05},
    }
    data.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _export(tmp_path: Path, source: Path, *extra: str) -> Path:
    out = tmp_path / f"export-{len(list(tmp_path.iterdir()))}"
    assert main(["export", str(source), "--out", str(out), *extra]) == 0
    return out


def _scripts(out: Path) -> tuple[list, list]:
    serve = _commands((out / "serve.sh").read_text(encoding="utf-8"))
    bench = _commands((out / "bench.sh").read_text(encoding="utf-8"))
    return serve, bench


def test_vllm_v1_serve_on_h200_has_v1_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _export(tmp_path, _scenario(tmp_path))
    (env, program, flags), = _scripts(out)[0]
    assert env == {} and program == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    assert [f for f in flags if not _vllm_known(f)] == []
    # vLLM V1's defaults on a >= 70 GiB GPU that is not an A100 (simulator/config/deployment.py)
    assert flags["--max-num-seqs"] == ["1024"]
    assert flags["--max-num-batched-tokens"] == ["8192"]
    assert flags["--gpu-memory-utilization"] == ["0.9"]
    assert flags["--block-size"] == ["16"]
    assert flags["--max-model-len"] == ["8192"]
    assert flags["--tensor-parallel-size"] == ["1"]
    assert flags["--kv-cache-dtype"] == ["auto"]
    assert "--enable-prefix-caching" in flags and "--enable-chunked-prefill" in flags
    assert "--data-parallel-size" not in flags and "--quantization" not in flags
    assert "vllm serve meta-llama/Llama-3.1-8B" in capsys.readouterr().out


def test_bench_commands_replay_the_trace(tmp_path: Path) -> None:
    out = _export(tmp_path, _scenario(tmp_path))
    rows = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    assert len(rows) == 30
    assert all(r["input_length"] == 1000 and r["output_length"] == 100 for r in rows)
    assert all(len(r["hash_ids"]) == 2 for r in rows)  # ⌈1000 / 512⌉, no id shared
    assert len({i for r in rows for i in r["hash_ids"]}) == 60
    assert rows[0]["timestamp"] == 0.0
    bench = _scripts(out)[1]
    by_name = {}
    for env, program, flags in bench:
        if program[0] == "vllm":
            assert [f for f in flags if f not in VLLM_BENCH_FLAGS] == []
            assert flags["--dataset-name"][0] in VLLM_BENCH_DATASETS
            by_name[flags["--dataset-name"][0]] = (env, flags)
        else:
            parsed = _check_guidellm(flags)
            by_name[parsed["--profile"]["kind"]] = parsed
    env, replay = by_name["timed_trace"]
    assert env == {"PYTHONHASHSEED": "0"}
    assert replay["--dataset-path"] == ["trace.jsonl"] and replay["--num-prompts"] == ["30"]
    assert replay["--timed-trace-chunk-hash-size"] == ["512"]
    assert "--self-timed" in replay and "--ignore-eos" in replay and "--save-result" in replay
    assert replay["--goodput"] == ["ttft:2000", "tpot:50"]
    assert "--max-concurrency" not in replay
    _, random = by_name["random"]  # fixed lengths and Poisson arrivals: the tool's generator
    assert random["--request-rate"] == ["4"] and random["--burstiness"] == ["1"]
    assert random["--random-input-len"] == ["1000"] and random["--random-output-len"] == ["100"]
    assert by_name["replay"]["--data"] == {"kind": "mooncake", "path": "trace.jsonl",
                                           "hash_id_block_size": "512"}
    assert by_name["replay"]["--constraint"] == {"kind": "max_requests", "count": "30"}
    assert by_name["poisson"]["--profile"]["rate"] == "4"
    assert by_name["poisson"]["--data"] == {"kind": "synthetic_text", "prompt_tokens": "1000",
                                            "output_tokens": "100"}


def test_gamma_arrivals_set_burstiness(tmp_path: Path) -> None:
    workload = {"arrival": {"process": "gamma", "rate": 2.0, "cv": 2.0}, "num_requests": 10,
                "prompt_tokens": {"dist": "fixed", "value": 64},
                "output_tokens": {"dist": "fixed", "value": 8}}
    bench = _scripts(_export(tmp_path, _scenario(tmp_path, workload=workload)))[1]
    random = [f for _, p, f in bench if p[0] == "vllm" and f["--dataset-name"] == ["random"]]
    # serve.py draws gaps from gamma(shape=burstiness, scale=1/(rate·burstiness)): cv = 1/√shape
    assert random[0]["--burstiness"] == ["0.25"] and random[0]["--request-rate"] == ["2"]
    assert not [p for _, p, f in bench if p[0] == "guidellm" and "poisson" in f["--profile"][0]]


def test_closed_loop_sends_from_n_clients(tmp_path: Path) -> None:
    workload = {"concurrency": 8, "requests_per_client": 3,
                "prompt_tokens": {"dist": "fixed", "value": 100},
                "output_tokens": {"dist": "fixed", "value": 10}}
    bench = _scripts(_export(tmp_path, _scenario(tmp_path, workload=workload)))[1]
    (_, _, vllm), (_, _, guidellm) = bench
    assert vllm["--max-concurrency"] == ["8"] and vllm["--request-rate"] == ["inf"]
    assert "--no-self-timed" in vllm and vllm["--num-prompts"] == ["24"]
    assert _check_guidellm(guidellm)["--profile"] == {"kind": "concurrent", "streams": "8"}


def test_sglang_launch_command(tmp_path: Path) -> None:
    path = _scenario(tmp_path, engine="sglang", kv_cache_dtype="fp8", num_replicas=2)
    (env, program, flags), = _scripts(_export(tmp_path, path))[0]
    assert program == ["python", "-m", "sglang.launch_server"]
    assert [f for f in flags if f not in SGLANG_FLAGS] == []
    assert flags["--model-path"] == ["meta-llama/Llama-3.1-8B"]
    assert flags["--page-size"] == ["1"] and flags["--tp-size"] == ["1"]
    assert flags["--dp-size"] == ["2"] and flags["--port"] == ["8000"]
    assert flags["--kv-cache-dtype"] == ["fp8_e4m3"]
    assert flags["--kv-cache-dtype"][0] in SGLANG_KV_CACHE_DTYPES
    assert flags["--schedule-policy"][0] in SGLANG_SCHEDULE_POLICIES
    assert flags["--radix-eviction-policy"][0] in SGLANG_RADIX_EVICTION_POLICIES
    # SGLang's defaults on a 141 GiB GPU (simulator/scheduler/sglang.py sglang_defaults):
    # chunked_prefill_size 8192; mem_fraction_static = (141·1024 − max(512 + 8192·1.5 + 256·2
    # + 1024/8, 10·1024)) / (141·1024) = (144384 − 13440) / 144384 = 0.907
    assert flags["--chunked-prefill-size"] == ["8192"]
    assert flags["--mem-fraction-static"] == ["0.907"]
    assert "--disable-radix-cache" not in flags


def test_an_engine_the_plan_did_not_simulate_is_said_so(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--engine sglang of a plan simulated with vLLM V1: the command is written, with a warning
    and a comment in both scripts that its figures are not SGLang's and how to simulate them."""
    path = _scenario(tmp_path)
    capsys.readouterr()
    out = _export(tmp_path, path, "--engine", "sglang")
    note = (f"the sglang plan was not simulated: {path} simulates vllm-v1, so the latencies and "
            f"capacity kvplan reported for it are not sglang's; to simulate it: simulate {path} "
            "--set engine=sglang")
    assert f"kvplan: warning: {note}\n" in capsys.readouterr().err
    for script in ("serve.sh", "bench.sh"):
        assert f"\n# NOTE: {note}\n" in (out / script).read_text()
    # the engine the plan simulates: nothing to say
    _export(tmp_path, _scenario(tmp_path, engine="sglang"), "--engine", "sglang")
    assert "not simulated" not in capsys.readouterr().err


def test_vllm_v0_and_what_cannot_be_set(tmp_path: Path) -> None:
    path = _scenario(tmp_path, engine="vllm-v0", kv_cache_dtype="fp16", quantization="awq")
    out = _export(tmp_path, path)
    (env, program, flags), = _scripts(out)[0]
    assert env == {"VLLM_USE_V1": "0"}
    assert [f for f in flags if not _vllm_known(f)] == []
    assert flags["--max-num-seqs"] == ["256"] and "--no-enable-prefix-caching" in flags
    assert flags["--swap-space"] == ["4"]
    assert "--quantization" not in flags  # AWQ of a bf16 checkpoint: no server does that at load
    text = (out / "serve.sh").read_text()
    assert "# kv_cache_dtype fp16: " in text and "serve a awq checkpoint" in text


def test_run_dir_gives_the_commands_of_its_scenario(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, workload={
        "trace": "bundled:azure-conv", "num_requests": 40, "rate_scale": 2.0})
    run_dir = tmp_path / "run"
    assert main(["simulate", str(scenario), "--out", str(run_dir), "--quiet", "--no-plots"]) == 0
    from_scenario = _export(tmp_path, scenario)
    from_run = _export(tmp_path, run_dir)
    for name in ("serve.sh", "bench.sh", "trace.jsonl"):
        assert (from_run / name).read_bytes() == (from_scenario / name).read_bytes(), name
    assert main(["export", str(run_dir)]) == 0  # default: RUN_DIR-export, beside the run (a re-run replaces RUN_DIR)
    assert (tmp_path / "run-export" / "trace.jsonl").read_bytes() == (from_run / "trace.jsonl").read_bytes()


@pytest.mark.parametrize("argv, message", [
    (["--engine", "vllm-v2"], "unknown engine 'vllm-v2' (known: vllm-v1, vllm-v0, sglang, trtllm)"),
    (["--allocator", "max"], "allocator max: contiguous reservation"),
])
def test_bad_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], message: str) -> None:
    assert main(["export", str(_scenario(tmp_path)), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_folder_without_run_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"kvplan: error: {tmp_path}: no run.json: give a scenario YAML or a folder "
                   "that `simulate` wrote\n")


def test_trace_rows_keep_shared_prefixes_and_nothing_more() -> None:
    def req(i: int, prompt: int, prefix: tuple[int, ...] = ()) -> Request:
        return Request(i, i * 0.5, prompt, 5, prefix_ids=prefix, prefix_block_tokens=4 if prefix else 0)

    rows = trace_rows([req(0, 10, (7, 8)), req(1, 8, (7, 9)), req(2, 3), req(3, 4, (8,)),
                       req(4, 12, (7, 8, 1))], block_tokens=4)
    # r0: blocks ⌈10/4⌉ = 3: (7), (7,8), then a fresh block. r1: (7) shared, (7,9) new. r2: one
    # fresh block. r3: id 8 without 7 before it is another block. r4: (7), (7,8), (7,8,1) new.
    assert [r["hash_ids"] for r in rows] == [[0, 1, 2], [0, 3], [4], [5], [0, 1, 6]]
    assert [r["timestamp"] for r in rows] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert rows[0] == {"timestamp": 0.0, "input_length": 10, "output_length": 5, "hash_ids": [0, 1, 2]}


def test_expert_parallel_deployment_is_one_server_of_dp_engines(tmp_path: Path) -> None:
    # DeepSeek-V3 with data-parallel attention and expert parallelism over 8 GPUs: one server,
    # --data-parallel-size 8 --enable-expert-parallel (vllm/engine/arg_utils.py); two such
    # replicas are two servers, not a data-parallel group of 16 (that would be EP 16).
    source = _scenario(tmp_path, model="deepseek-v3", tensor_parallel=1, data_parallel_size=8,
                       enable_expert_parallel=True, num_replicas=2)
    out = _export(tmp_path, source)
    (_, program, flags), = _scripts(out)[0]
    assert program == ["vllm", "serve", "deepseek-ai/DeepSeek-V3"]
    assert [f for f in flags if not _vllm_known(f)] == []
    assert flags["--data-parallel-size"] == ["8"] and "--enable-expert-parallel" in flags
    serve = (out / "serve.sh").read_text(encoding="utf-8")
    assert "on 16 x H200-141GB" in serve and "run 2 such servers" in serve


def test_vllm_dp_without_ep_is_one_server_of_dp_engines(tmp_path: Path) -> None:
    """vLLM DP 8 without EP: the MoE layers TP-sharded over the 8 GPUs of one server
    (--data-parallel-size 8, no --enable-expert-parallel), not 8 independent servers."""
    source = _scenario(tmp_path, model="deepseek-v3", tensor_parallel=2, data_parallel_size=4)
    (_, _, flags), = _scripts(_export(tmp_path, source))[0]
    assert [f for f in flags if not _vllm_known(f)] == []
    assert flags["--data-parallel-size"] == ["4"] and flags["--tensor-parallel-size"] == ["2"]
    assert "--enable-expert-parallel" not in flags
    serve = (_export(tmp_path, _scenario(tmp_path, model="deepseek-v3", tensor_parallel=1,
                                         data_parallel_size=8, enable_expert_parallel=True))
             / "serve.sh").read_text(encoding="utf-8")
    assert "--all2all-backend deepep_low_latency" in serve  # a note: vLLM's default all-gathers


def test_sglang_dp_attention_with_deepep(tmp_path: Path) -> None:
    """SGLang --tp 8 --dp 8 --enable-dp-attention --ep 8 --moe-a2a-backend deepep; the chunk,
    running-request and conservativeness flags are the server's (SGLang divides them per DP
    rank: ServerArgs._handle_data_parallelism)."""
    source = _scenario(tmp_path, engine="sglang", model="deepseek-v3", data_parallel_size=8,
                       moe_expert_parallel_size=8, max_num_seqs=256)
    (_, program, flags), = _scripts(_export(tmp_path, source))[0]
    assert program == ["python", "-m", "sglang.launch_server"]
    assert [f for f in flags if f not in SGLANG_FLAGS] == []
    assert flags["--tp-size"] == ["8"] and flags["--dp-size"] == ["8"]
    assert flags["--enable-dp-attention"] == [] and flags["--ep-size"] == ["8"]
    assert flags["--moe-a2a-backend"] == ["deepep"] and "deepep" in SGLANG_MOE_A2A_BACKENDS
    assert flags["--chunked-prefill-size"] == ["8192"]  # 1024 a DP rank
    assert flags["--max-running-requests"] == ["256"]  # 32 a DP rank
    assert flags["--schedule-conservativeness"] == ["1"]  # 0.3 a DP rank
    # the MoE TP-sharded over the 8 (no --ep-size): SGLang gathers the DP ranks' tokens
    tp_moe = _scenario(tmp_path, name="moetp", engine="sglang", model="deepseek-v3",
                       data_parallel_size=8)
    (_, _, flags), = _scripts(_export(tmp_path, tp_moe))[0]
    assert "--ep-size" not in flags and "--moe-a2a-backend" not in flags
    assert flags["--enable-dp-attention"] == []


# ----------------------------------------------------------------------------- TensorRT-LLM
def _trtllm(tmp_path: Path, **overrides: object) -> tuple[list[str], dict[str, list[str]], list[str], dict]:
    """Export a TensorRT-LLM plan: trtllm-serve's words and flags (every flag checked against
    serve.py's options, a flag option given no value), the script's comment lines and the
    --extra_llm_api_options YAML (every key one of KvCacheConfig's / SchedulerConfig's)."""
    out = _export(tmp_path, _scenario(tmp_path, engine="trtllm", **overrides))
    script = (out / "serve.sh").read_text(encoding="utf-8")
    (env, program, flags), = _commands(script)
    assert env == {} and [f for f in flags if f not in TRTLLM_SERVE_FLAGS] == []
    for flag, values in flags.items():
        assert (values == []) == (flag in TRTLLM_SERVE_BOOL_FLAGS), flag
    assert 'cd "$(dirname "$0")"' in script  # the YAML path is relative to the script
    config = yaml.safe_load((out / flags["--extra_llm_api_options"][0]).read_text(encoding="utf-8"))
    assert set(config) <= TRTLLM_LLM_ARGS_KEYS
    assert set(config["kv_cache_config"]) <= TRTLLM_KV_CACHE_CONFIG_KEYS
    assert set(config["scheduler_config"]) <= TRTLLM_SCHEDULER_CONFIG_KEYS
    assert config["scheduler_config"]["capacity_scheduler_policy"] in TRTLLM_CAPACITY_SCHEDULER_POLICIES
    comments = [line for line in script.splitlines() if line.startswith("# ")]
    return program, flags, comments, config


def test_trtllm_serve_with_its_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trtllm-serve MODEL`` (serve.py's default command) with the knobs kvplan resolved for
    TensorRT-LLM 1.2: max_batch_size 2048, max_num_tokens 8192, free fraction 0.9 on the command
    line; tokens_per_block 32, block reuse and GUARANTEED_NO_EVICT in the YAML, which repeats the
    fraction (it replaces the server's kv_cache_config as a whole)."""
    program, flags, comments, config = _trtllm(tmp_path)
    assert program == ["trtllm-serve", "meta-llama/Llama-3.1-8B"]
    assert flags["--backend"] == ["pytorch"] and flags["--backend"][0] in TRTLLM_BACKENDS
    assert flags["--max_batch_size"] == ["2048"] and flags["--max_num_tokens"] == ["8192"]
    assert flags["--max_seq_len"] == ["8192"] and flags["--tp_size"] == ["1"]
    assert flags["--kv_cache_free_gpu_memory_fraction"] == ["0.9"] and flags["--port"] == ["8000"]
    assert "--enable_chunked_prefill" not in flags  # off by default in TensorRT-LLM
    assert config == {"kv_cache_config": {"free_gpu_memory_fraction": 0.9, "tokens_per_block": 32,
                                          "enable_block_reuse": True, "dtype": "auto"},
                      "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}}
    assert any("overlap scheduler" in line for line in comments)
    printed = capsys.readouterr().out
    assert "trtllm-serve meta-llama/Llama-3.1-8B" in printed and "# trtllm-config.yaml" in printed


def test_trtllm_serve_carries_the_scenario_knobs(tmp_path: Path) -> None:
    program, flags, _, config = _trtllm(
        tmp_path, capacity_scheduler_policy="MAX_UTILIZATION", enable_chunked_prefill=True,
        max_num_seqs=64, max_num_batched_tokens=2048, block_size=64, gpu_memory_utilization=0.85,
        kv_cache_dtype="fp8", enable_prefix_caching=False, tensor_parallel=2,
        num_gpu_blocks_override=1000, engine_version="1.0")
    assert flags["--enable_chunked_prefill"] == [] and flags["--tp_size"] == ["2"]
    assert flags["--max_batch_size"] == ["64"] and flags["--max_num_tokens"] == ["2048"]
    assert flags["--kv_cache_free_gpu_memory_fraction"] == ["0.85"]
    assert config["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85, "tokens_per_block": 64,
                                         "enable_block_reuse": False, "dtype": "fp8", "max_tokens": 64000}
    assert config["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION",
                                          "context_chunking_policy": "FIRST_COME_FIRST_SERVED"}
    assert config["scheduler_config"]["context_chunking_policy"] in TRTLLM_CONTEXT_CHUNKING_POLICIES


def test_trtllm_export_of_a_vllm_plan_says_it_was_not_simulated(tmp_path: Path) -> None:
    out = _export(tmp_path, _scenario(tmp_path), "--engine", "trtllm")
    script = (out / "serve.sh").read_text(encoding="utf-8")
    assert "the trtllm plan was not simulated" in script and "trtllm-serve" in script
    assert (out / "trtllm-config.yaml").is_file()


def test_trtllm_attention_dp_and_the_moe_layout(tmp_path: Path) -> None:
    """tp_size 8 with enable_attention_dp and moe_expert_parallel_size 8 (AIConfigurator's
    attention_dp_size 8, moe_ep_size 8); a TP × EP grid without attention DP."""
    _, flags, comments, config = _trtllm(tmp_path, model="deepseek-v3", data_parallel_size=8,
                                         moe_expert_parallel_size=8)
    assert flags["--tp_size"] == ["8"]
    assert config["enable_attention_dp"] is True
    assert (config["moe_tensor_parallel_size"], config["moe_expert_parallel_size"]) == (1, 8)
    assert any("select_alltoall_method_type" in line for line in comments)
    _, flags, _, config = _trtllm(tmp_path, model="deepseek-v3", tensor_parallel=8,
                                  moe_tensor_parallel_size=2)
    assert flags["--tp_size"] == ["8"] and "enable_attention_dp" not in config
    assert (config["moe_tensor_parallel_size"], config["moe_expert_parallel_size"]) == (2, 4)
    _, _, _, config = _trtllm(tmp_path, model="deepseek-v3", tensor_parallel=8)  # TP 8 throughout
    assert "moe_tensor_parallel_size" not in config
