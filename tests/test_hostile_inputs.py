"""Hostile and broken input, case by case: each ends in one line — ``kvplan: error: ...`` with exit
code 2, or ``kvplan: warning: ...`` saying what the run leaves out — never a traceback, a
RecursionError, a numpy warning or a result made of garbage.

Every case of the table is the input (files written to a fresh folder), the command line run
through :func:`simulator.cli.main`, and the one line it must print (``{tmp}`` is the folder).
The unit tests below the table pin what the table does not show: the limits themselves, the
readers' other callers, what is still accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import KvplanError
from simulator.kv.models import load_model
from simulator.yamlfile import MAX_NESTING, check_json_nesting, parse_yaml
from workloads.loaders import MAX_ARRIVAL_S, load_trace

DEEP = "[" * 100_000 + "]" * 100_000  # far past Python's recursion limit

# A Llama-shaped config.json small enough to size in an instant.
CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "hidden_size": 256, "intermediate_size": 512,
          "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
NEMOTRON_H = {**CONFIG, "model_type": "nemotron_h", "hybrid_override_pattern": "M*",
              "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 16, "n_groups": 1,
              "conv_kernel": 4}
QWEN3_NEXT = {**CONFIG, "model_type": "qwen3_next", "linear_num_key_heads": 2,
              "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
              "linear_conv_kernel_dim": 4}


def config(**fields: object) -> str:
    return json.dumps({**CONFIG, **fields})


SCENARIO = """\
model: llama-3.1-8b
gpu: h100
max_model_len: 4096
latency: {model: constant, step_s: 0.01}
workload:
  rate: inf
  num_requests: 4
  prompt_tokens: {dist: fixed, value: 32}
  output_tokens: {dist: fixed, value: 4}
"""
# Speculative decoding is costed by the roofline.
ROOFLINE = SCENARIO.replace("latency: {model: constant, step_s: 0.01}", "latency: {model: roofline}")
TRACE_SCENARIO = """\
model: llama-3.1-8b
gpu: h100
max_model_len: 4096
latency: {model: constant, step_s: 0.01}
workload:
  trace: trace.csv
"""
TRACE = "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n2,10,5\n"
SYNTHETIC = """\
model: llama-3.1-8b
gpu: h100
max_model_len: 4096
latency: {model: constant, step_s: 0.01}
workload:
  num_requests: 4
  arrival: {process: poisson, rate: 1}
  prompt_tokens: {dist: fixed, value: 32}
  output_tokens: {dist: fixed, value: 4}
"""
SLO = "slo: {ttft_p99_s: 1, tpot_p99_s: 0.1}\n"
CLOSED_LOOP = SYNTHETIC.replace("  arrival: {process: poisson, rate: 1}\n", "  concurrency: 2\n")
SIMULATE = ["simulate", "{tmp}/s.yaml", "--quiet", "--no-plots", "--out", "{tmp}/out"]
SIZE = ["size", "--model", "{tmp}/config.json"]


def spec(value: str) -> list[str]:
    return [*SIMULATE, "--set", f"speculative={value}"]


# (case, files, command line, the one line printed)
CASES = [
    # --- model configs (simulator/kv/hf_config.py) ---
    ("rope factor NaN", {"config.json": config()[:-1]
                         + ', "rope_scaling": {"rope_type": "yarn", "factor": NaN}}'}, SIZE,
     "error: {tmp}/config.json: field 'rope_scaling.factor' must be a positive finite number, got nan"),
    ("rope factor Infinity", {"config.json": config()[:-1]
                              + ', "rope_scaling": {"rope_type": "linear", "factor": Infinity}}'},
     SIZE, "error: {tmp}/config.json: field 'rope_scaling.factor' must be a positive finite number,"
           " got inf"),
    ("rope factor NaN, scenario", {"s.yaml": SCENARIO.replace("llama-3.1-8b", "config.json"),
                                   "config.json": config()[:-1]
                                   + ', "rope_scaling": {"type": "dynamic", "factor": NaN}}'},
     SIMULATE, "error: {tmp}/s.yaml: model: {tmp}/config.json: field 'rope_scaling.factor' must be"
               " a positive finite number, got nan"),
    ("full_attention_interval 0", {"config.json": json.dumps({**QWEN3_NEXT,
                                                              "full_attention_interval": 0})},
     SIZE, "error: {tmp}/config.json: field 'full_attention_interval' must be a positive integer,"
           " got 0"),
    ("num_local_experts 0", {"config.json": config(num_local_experts=0, num_experts_per_tok=2)},
     SIZE, "error: {tmp}/config.json: field 'num_local_experts' must be a positive integer, got 0"),
    ("n_routed_experts 0", {"config.json": config(n_routed_experts=0, num_experts_per_tok=2,
                                                  moe_intermediate_size=64)},
     SIZE, "error: {tmp}/config.json: field 'n_routed_experts' must be a positive integer, got 0"),
    ("decoder_sparse_step 0", {"config.json": config(num_experts=4, num_experts_per_tok=1,
                                                     moe_intermediate_size=64,
                                                     decoder_sparse_step=0)},
     SIZE, "error: {tmp}/config.json: field 'decoder_sparse_step' must be a positive integer, got 0"),
    ("mamba_num_heads 0", {"nh.json": json.dumps({**NEMOTRON_H, "mamba_num_heads": 0})},
     ["size", "--model", "{tmp}/nh.json"],
     "error: {tmp}/nh.json: model 'nh': mamba_num_heads must be a positive integer, got 0"),
    ("tensor parallel of a config", {"nh.json": json.dumps({**NEMOTRON_H, "mamba_num_heads": 3})},
     ["size", "--model", "{tmp}/nh.json", "--gpu", "h100", "--tp", "2"],
     "error: {tmp}/nh.json: model 'nh': tensor parallel 2 does not divide the 3 Mamba heads and 1"
     " groups (vLLM's MambaMixer2 requires both, or n_groups 1)"),
    # --- nesting (simulator/yamlfile.py) ---
    ("deep config.json", {"config.json": DEEP}, SIZE,
     "error: {tmp}/config.json:1: nested deeper than 100 levels"),
    ("deep scenario", {"s.yaml": DEEP}, SIMULATE, "error: {tmp}/s.yaml:1: nested deeper than 100 levels"),
    ("deep scenario value", {"s.yaml": SCENARIO + "sweep: {block_size: " + DEEP + "}\n"}, SIMULATE,
     "error: {tmp}/s.yaml:10: nested deeper than 100 levels"),
    ("deep scenario, capacity", {"s.yaml": DEEP},
     ["capacity", "{tmp}/s.yaml", "--quiet", "--no-plots", "--out", "{tmp}/out"],
     "error: {tmp}/s.yaml:1: nested deeper than 100 levels"),
    ("deep YAML result, compare", {"r.yaml": DEEP, "s.yaml": SCENARIO},
     ["compare", "{tmp}/r.yaml", "--against", "{tmp}/s.yaml", "--out", "{tmp}/out"],
     "error: {tmp}/r.yaml:1: nested deeper than 100 levels"),
    ("deep trace row", {"s.yaml": TRACE_SCENARIO.replace("trace.csv", "trace.jsonl"),
                        "trace.jsonl": '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}\n'
                                       '{"arrival_s": ' + DEEP + ', "prompt_tokens": 3,'
                                       ' "output_tokens": 1}\n'},
     SIMULATE, "error: workload: {tmp}/trace.jsonl:2: nested deeper than 100 levels"),
    ("YAML alias cycle", {"s.yaml": SCENARIO + "sweep: &loop {block_size: [*loop]}\n"}, SIMULATE,
     "error: {tmp}/s.yaml: a YAML alias refers to a list or mapping that holds it"),
    # --- kv_offload (simulator/config/deployment.py) ---
    ("kv_offload of 0 GiB", {"s.yaml": SCENARIO}, [*SIMULATE, "--set", "kv_offload.size_gib=0"],
     "warning: {tmp}/s.yaml: kv_offload: size_gib 0 gives no CPU tier: the run is the same as"
     " without kv_offload"),
    ("kv_offload below a block", {"s.yaml": SCENARIO}, [*SIMULATE, "--set", "kv_offload.size_gib=1e-7"],
     "warning: {tmp}/s.yaml: kv_offload: size_gib 1e-07 is less than one KV block (2,097,152 bytes a"
     " replica), so it gives no CPU tier: the run is the same as without kv_offload"),
    ("kv_offload, contiguous allocators", {"s.yaml": SCENARIO},
     [*SIMULATE, "--set", "kv_offload.size_gib=64", "--set", "allocators=[paged, max, pow2]"],
     "warning: {tmp}/s.yaml: kv_offload: the CPU tier is modelled for allocator paged only;"
     " contiguous-max, contiguous-pow2 run without it"),
    ("kv_offload, hybrid model", {"s.yaml": SCENARIO.replace("llama-3.1-8b", "gpt-oss-20b")},
     [*SIMULATE, "--set", "kv_offload.size_gib=64"],
     "warning: {tmp}/s.yaml: kv_offload: the CPU tier is not modelled for a model with several KV"
     " cache groups (sliding-window, chunked or linear-attention layers): allocator paged runs"
     " without it"),
    # --- arrival times (workloads/) ---
    ("timestamp 1e300", {"s.yaml": TRACE_SCENARIO, "trace.csv": TRACE + "1e300,10,5\n"}, SIMULATE,
     "error: workload: {tmp}/trace.csv:5: timestamp 1e300 is 1e+300 s after the first request's,"
     " past the limit of 10^8 s (about 3 years)"),
    ("rate_scale 1e-300, synthetic", {"s.yaml": SYNTHETIC + "  rate_scale: 1.0e-300\n"}, SIMULATE,
     "error: workload: a rate of 1 req/s × rate_scale 1e-300 spaces arrivals 1e+300 s apart on"
     " average, past the limit on arrival times of 10^8 s (about 3 years)"),
    ("rate_scale 1e-300, trace", {"s.yaml": TRACE_SCENARIO + "  rate_scale: 1.0e-300\n",
                                  "trace.csv": TRACE}, SIMULATE,
     "error: workload: the last request arrives 2e+300 s after the first, past the limit on arrival"
     " times of 10^8 s (about 3 years): rate_scale 1e-300 stretches the workload that far"),
    ("--rate 1e-300, trace", {"s.yaml": TRACE_SCENARIO, "trace.csv": TRACE}, [*SIMULATE, "--rate", "1e-300"],
     "error: workload: the last request arrives 2e+300 s after the first, past the limit on arrival"
     " times of 10^8 s (about 3 years): rate 1e-300 req/s stretches the workload that far"),
    ("duration_s 1e300", {"s.yaml": SYNTHETIC.replace("num_requests: 4", "duration_s: 1.0e+300")},
     SIMULATE, "error: {tmp}/s.yaml: workload: duration_s 1e+300 s is past the limit on arrival"
               " times, 10^8 s (about 3 years)"),
    # --- speculative decoding (simulator/config/scenario.py, simulator/config/deployment.py) ---
    ("100000 speculative tokens", {"s.yaml": ROOFLINE},
     spec("{method: ngram, num_speculative_tokens: 100000, acceptance_rate: 0.5}"),
     "error: {tmp}/s.yaml: speculative: num_speculative_tokens 100000 exceeds vLLM's limit of 128"
     " draft tokens per request and step"),
    ("draft model of another vocabulary", {"s.yaml": ROOFLINE},
     spec("{method: draft_model, draft_model: llama-2-7b, num_speculative_tokens: 3,"
          " acceptance_rate: 0.5}"),
     "error: {tmp}/s.yaml: speculative.draft_model: Llama-2-7B has a vocabulary of 32,000 tokens,"
     " Llama-3.1-8B of 128,256; vLLM requires a draft model with the target's vocabulary size"),
    ("no token beside the lookahead slots", {"s.yaml": ROOFLINE},
     [*spec("{method: draft_model, draft_model: llama-3.1-8b, num_speculative_tokens: 3,"
            " acceptance_rate: 0.5}"), "--set", "max_num_batched_tokens=3", "--set", "max_num_seqs=1"],
     "error: {tmp}/s.yaml: speculative: max_num_batched_tokens 3 holds no more than the 3 KV slots a"
     " draft_model request reserves ahead; vLLM refuses to start: raise max_num_batched_tokens"),
    # --- messages (simulator/config/scenario.py, workloads/spec.py, simulator/cli.py) ---
    ("router as a name", {"s.yaml": SCENARIO + "router: least-outstanding\n"}, SIMULATE,
     "error: {tmp}/s.yaml: router: a mapping, not a policy name: write router: {policy:"
     " least-outstanding} (on the command line, --set router.policy=least-outstanding)"),
    ("--set router=NAME", {"s.yaml": SCENARIO}, [*SIMULATE, "--set", "router=round-robin"],
     "error: {tmp}/s.yaml: router: a mapping, not a policy name: write router: {policy:"
     " round-robin} (on the command line, --set router.policy=round-robin)"),
    ("NaN under an upper bound", {"s.yaml": SCENARIO}, [*SIMULATE, "--set", "router.refresh_interval_s=.nan"],
     "error: {tmp}/s.yaml: router.refresh_interval_s: expected a number, got NaN (not a number)"),
    ("NaN under a lower bound", {"s.yaml": SCENARIO.replace("step_s: 0.01", "step_s: .nan")}, SIMULATE,
     "error: {tmp}/s.yaml: latency.step_s: expected a number, got NaN (not a number)"),
    ("--rate -inf", {"s.yaml": SCENARIO}, [*SIMULATE, "--rate", "-inf"],
     "error: --rate must be positive, got -inf"),
    ("--rate -1e3", {"s.yaml": SCENARIO}, [*SIMULATE, "--rate", "-1e3"],
     "error: --rate must be positive, got -1000.0"),
    ("capacity --start-rate -inf", {"s.yaml": SCENARIO},
     ["capacity", "{tmp}/s.yaml", "--start-rate", "-inf", "--out", "{tmp}/out"],
     "error: --start-rate must be a positive number, got -inf"),
    # --- command-line values, and errors that name their file (simulator/commands/simulate.py, capacity, size) ---
    ("--set value nested too deep", {"s.yaml": SCENARIO}, [*SIMULATE, "--set", f"block_size={DEEP}"],
     "error: --set block_size: nested deeper than 100 levels"),
    ("--set value not YAML", {"s.yaml": SCENARIO}, [*SIMULATE, "--set", "block_size=["],
     "error: --set block_size: not valid YAML (expected the node content, but found '<stream end>')"),
    ("--sweep value nested too deep", {"s.yaml": SYNTHETIC + SLO},
     ["capacity", "{tmp}/s.yaml", "--sweep", f"block_size=16,{DEEP}", "--out", "{tmp}/out"],
     "error: --sweep block_size: nested deeper than 100 levels"),
    ("capacity of a burst", {"s.yaml": SCENARIO + SLO}, ["capacity", "{tmp}/s.yaml", "--out", "{tmp}/out"],
     "error: {tmp}/s.yaml: workload.rate: inf is a burst (every request at t = 0), which has no rate to "
     "search: give workload.arrival (e.g. {process: poisson, rate: 1}) to search its rate, or use --search "
     "concurrency"),
    ("disaggregation with closed-loop clients",
     {"s.yaml": CLOSED_LOOP + "disaggregation: {prefill: {replicas: 1}, decode: {replicas: 1}, "
                              "link: {bandwidth_gb_s: 50}}\n"}, SIMULATE,
     "error: {tmp}/s.yaml: disaggregation: open-loop workloads only (the decode side's arrivals come from "
     "the prefill side's run): drop workload.concurrency, or give an arrival rate"),
    ("size of a config whose weights do not fit",
     {"big.json": config(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64,
                         intermediate_size=28672, vocab_size=128256)},
     ["size", "--model", "{tmp}/big.json", "--gpu", "l4"],
     # an L4 reports 23,583,784,960 B = 21.96 GiB, the total vLLM takes 0.9 of
     "error: {tmp}/big.json: big weights (129.5 GiB per rank) do not fit in 0.90 × 21.96 GiB of L4; "
     "raise --tp"),
]


@pytest.mark.parametrize(("files", "argv", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   files: dict[str, str], argv: list[str], line: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    code = main([arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    err = capsys.readouterr().err
    assert err == f"kvplan: {line.replace('{tmp}', str(tmp_path))}\n"
    assert code == (2 if line.startswith("error: ") else 0)


# --- the limits, and what is still accepted ----------------------------------------------------------


def test_nesting_is_refused_only_past_the_limit() -> None:
    inside = "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)
    assert parse_yaml(f"a: {inside}", "f.yaml") == {"a": json.loads(inside)}
    check_json_nesting('{"a": ' + inside + "}", "f.json")  # exactly the limit
    check_json_nesting('{"a": "' + "[" * 1000 + '"}', "f.json")  # brackets inside a string
    with pytest.raises(KvplanError, match=r"^f\.yaml:2: nested deeper than 100 levels$"):
        parse_yaml(f"b: 1\na: [{inside}]", "f.yaml")
    with pytest.raises(KvplanError, match=r"^f\.json:3: nested deeper than 100 levels$"):
        check_json_nesting('{\n"a": 1,\n"b": [' + inside + "]}", "f.json")


def test_aliases_that_build_deep_or_huge_data_are_refused() -> None:
    shared = "base: &b {gpu: h100, block_size: 16}\nrun:\n  <<: *b\n  gpu: h200\nagain: *b\n"
    assert parse_yaml(shared, "s.yaml")["again"] == {"gpu": "h100", "block_size": 16}
    deep = "x0: &x0 " + "[" * 60 + "]" * 60 + "\nx1: &x1 " + "[" * 60 + "*x0" + "]" * 60 + "\n"
    with pytest.raises(KvplanError,
                       match=r"^s\.yaml: nested deeper than 100 levels \(through YAML aliases\)$"):
        parse_yaml(deep, "s.yaml")
    laughs = ["l0: &l0 [" + ", ".join(["ha"] * 10) + "]"]
    laughs += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(KvplanError,
                       match=r"^s\.yaml: its YAML aliases expand it to more than 10,000,000 values$"):
        parse_yaml("\n".join(laughs), "s.yaml")


def test_num_experts_0_is_the_dense_model_vllm_builds(tmp_path: Path) -> None:
    """Qwen2/Qwen3-MoE layers are dense where num_experts is 0 (vLLM's and transformers'
    ``config.num_experts > 0`` guard); Llama 4 with interleave_moe_layer_step 0 has no MoE layer."""
    dense = load_model(_config_file(tmp_path, "dense.json", CONFIG))
    qwen = load_model(_config_file(tmp_path, "qwen.json", {**CONFIG, "num_experts": 0,
                                                           "num_experts_per_tok": 2}))
    assert not qwen.is_moe and qwen.num_params == dense.num_params
    llama4 = {**CONFIG, "num_local_experts": 16, "num_experts_per_tok": 1,
              "intermediate_size_mlp": 512}
    assert load_model(_config_file(tmp_path, "l4.json", llama4)).num_moe_layers == 2
    no_moe_layer = {**llama4, "interleave_moe_layer_step": 0}
    assert not load_model(_config_file(tmp_path, "l4d.json", no_moe_layer)).is_moe


def test_a_scaled_window_still_follows_the_factor(tmp_path: Path) -> None:
    linear = {**CONFIG, "rope_scaling": {"rope_type": "linear", "factor": 2}}
    scaled = load_model(_config_file(tmp_path, "c.json", linear))
    assert scaled.max_position_embeddings == 8192
    # llama3 scaling keeps the window as is: its factor is not the window's (and is not read)
    llama3 = {**CONFIG, "rope_scaling": {"rope_type": "llama3", "factor": None}}
    as_is = load_model(_config_file(tmp_path, "l3.json", llama3))
    assert as_is.max_position_embeddings == 4096


def test_a_trace_may_span_the_limit_but_not_past_it(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"arrival_s,prompt_tokens,output_tokens\n5,10,5\n{MAX_ARRIVAL_S + 5:.0f},10,5\n")
    assert [r.arrival_s for r in load_trace(path)] == [0.0, MAX_ARRIVAL_S]
    path.write_text(f"arrival_s,prompt_tokens,output_tokens\n5,10,5\n{MAX_ARRIVAL_S + 6:.0f},10,5\n")
    with pytest.raises(KvplanError, match=r"t\.csv:3: timestamp 100000006 is 1e\+08 s after"):
        load_trace(path)
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,10,5\n"
                     "2027-06-01 00:00:00.0,10,5\n")
    with pytest.raises(KvplanError, match=r"azure\.csv:3: timestamp 2027-06-01 00:00:00\.0 is 1\.12e\+08 s"):
        load_trace(azure)


def test_128_speculative_tokens_still_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(ROOFLINE, encoding="utf-8")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in
            spec("{method: eagle, num_speculative_tokens: 128, acceptance_rate: 0.5}")]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["paged"]["speculative"]["acceptance_per_position"]) == 128


def _config_file(folder: Path, name: str, fields: dict[str, object]) -> Path:
    path = folder / name
    path.write_text(json.dumps(fields), encoding="utf-8")
    return path
