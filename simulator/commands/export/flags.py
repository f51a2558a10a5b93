"""The option names of the tools ``kvplan export`` writes commands for, as their sources define
them (a vendored list: no network at test time). ``tests/simulator/test_export.py`` parses every
generated command against these names; :mod:`simulator.commands.export.cmd` cites them flag by flag.

Each list gives the source file and commit it was read from. Update a list together with the
commit when a tool renames or drops an option.
"""

from __future__ import annotations

# vllm-project/vllm @ 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b, vllm/engine/arg_utils.py
# (EngineArgs.add_cli_args): the ModelConfig, ParallelConfig, CacheConfig and SchedulerConfig
# groups. Options built by get_kwargs from a bool field use argparse.BooleanOptionalAction, so
# each of VLLM_SERVE_BOOL_FLAGS also exists as --no-<name>.
VLLM_SERVE_FLAGS: frozenset[str] = frozenset({
    # ModelConfig
    "--model", "--runner", "--convert", "--task", "--tokenizer", "--tokenizer-mode",
    "--trust-remote-code", "--dtype", "--seed", "--hf-config-path", "--allowed-local-media-path",
    "--allowed-media-domains", "--revision", "--code-revision", "--rope-scaling", "--rope-theta",
    "--tokenizer-revision", "--max-model-len", "--quantization", "-q", "--enforce-eager",
    "--max-logprobs", "--logprobs-mode", "--disable-sliding-window", "--disable-cascade-attn",
    "--skip-tokenizer-init", "--enable-prompt-embeds", "--served-model-name", "--config-format",
    "--hf-token", "--hf-overrides", "--pooler-config", "--generation-config",
    "--override-generation-config", "--enable-sleep-mode", "--model-impl",
    "--override-attention-dtype",
    # LoadConfig
    "--load-format", "--download-dir", "--safetensors-load-strategy",
    "--model-loader-extra-config", "--ignore-patterns", "--use-tqdm-on-load",
    "--pt-load-map-location",
    # ParallelConfig
    "--distributed-executor-backend", "--pipeline-parallel-size", "-pp",
    "--tensor-parallel-size", "-tp", "--decode-context-parallel-size", "-dcp",
    "--data-parallel-size", "-dp", "--data-parallel-rank", "--data-parallel-start-rank",
    "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
    "--data-parallel-backend", "--data-parallel-hybrid-lb", "--enable-expert-parallel",
    "--all2all-backend", "--enable-dbo", "--enable-eplb", "--eplb-config",
    "--max-parallel-loading-workers", "--disable-custom-all-reduce",
    # CacheConfig
    "--block-size", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--swap-space",
    "--kv-cache-dtype", "--num-gpu-blocks-override", "--enable-prefix-caching",
    "--prefix-caching-hash-algo", "--cpu-offload-gb", "--calculate-kv-scales",
    "--kv-sharing-fast-prefill",
    # SchedulerConfig
    "--max-num-batched-tokens", "--max-num-seqs", "--max-num-partial-prefills",
    "--max-long-partial-prefills", "--long-prefill-token-threshold", "--num-lookahead-slots",
    "--scheduling-policy", "--enable-chunked-prefill", "--disable-chunked-mm-input",
    "--scheduler-cls", "--disable-hybrid-kv-cache-manager", "--async-scheduling",
    # VllmConfig and others
    "--speculative-config", "--kv-transfer-config", "--kv-events-config", "--compilation-config",
    "-O", "--additional-config", "--disable-log-stats",
})
VLLM_SERVE_BOOL_FLAGS: frozenset[str] = frozenset({
    "--enable-prefix-caching", "--enable-chunked-prefill", "--enforce-eager",
    "--trust-remote-code", "--disable-sliding-window", "--enable-expert-parallel",
    "--disable-custom-all-reduce", "--async-scheduling", "--disable-hybrid-kv-cache-manager",
    "--calculate-kv-scales",
})

# vllm-project/vllm @ 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1, vllm/benchmarks/serve.py
# (add_cli_args), and @ 003cf0297cf60998854c652a0ca2b310dd3375af,
# vllm/benchmarks/datasets/datasets.py (add_dataset_parser and add_random_dataset_base_args).
VLLM_BENCH_FLAGS: frozenset[str] = frozenset({
    # serve.py add_cli_args
    "--label", "--backend", "--base-url", "--host", "--port", "--endpoint", "--header",
    "--max-concurrency", "--model", "--input-len", "--output-len", "--tokenizer",
    "--tokenizer-mode", "--use-beam-search", "--logprobs", "--request-rate", "--burstiness",
    "--probe-request-rate", "--disable-tqdm", "--num-warmups", "--profile", "--save-result",
    "--save-detailed", "--append-result", "--metadata", "--result-dir", "--result-filename",
    "--ignore-eos", "--self-timed", "--no-self-timed", "--percentile-metrics",
    "--metric-percentiles", "--goodput", "--request-id-prefix", "--top-p", "--top-k", "--min-p",
    "--temperature", "--frequency-penalty", "--presence-penalty", "--repetition-penalty",
    "--served-model-name", "--lora-modules", "--lora-assignment", "--ramp-up-strategy",
    "--ramp-up-start-rps", "--ramp-up-end-rps", "--ready-check-timeout-sec",
    "--chat-template-kwargs", "--extra-body", "--skip-tokenizer-init", "--insecure",
    "--plot-timeline",
    # datasets.py add_dataset_parser
    "--trust-remote-code", "--seed", "--num-prompts", "--dataset-name", "--no-stream",
    "--dataset-path", "--no-oversample", "--skip-chat-template", "--enable-multimodal-chat",
    "--disable-shuffle", "--custom-output-len", "--custom-ensure-client-side-data",
    "--spec-bench-output-len", "--spec-bench-category", "--sonnet-input-len",
    "--sonnet-output-len", "--sonnet-prefix-len", "--sharegpt-output-len",
    "--timed-trace-chunk-hash-size", "--timed-trace-sec-multiplier",
    "--timed-trace-label-timestamp", "--timed-trace-label-input-length",
    "--timed-trace-label-output-length", "--timed-trace-label-hash-ids",
    "--blazedit-min-distance", "--blazedit-max-distance", "--asr-max-audio-len-sec",
    "--asr-min-audio-len-sec", "--hf-subset", "--hf-split", "--hf-name", "--hf-output-len",
    "--prefix-repetition-prefix-len", "--prefix-repetition-suffix-len",
    "--prefix-repetition-num-prefixes", "--prefix-repetition-output-len",
    # datasets.py add_random_dataset_base_args
    "--random-input-len", "--random-output-len", "--random-range-ratio",
})
# datasets.py add_dataset_parser: --dataset-name choices
VLLM_BENCH_DATASETS: frozenset[str] = frozenset({
    "sharegpt", "burstgpt", "sonnet", "random", "random-mm", "random-rerank", "hf", "custom",
    "custom_audio", "custom_image", "prefix_repetition", "spec_bench", "speed_bench",
    "timed_trace",
})

# sgl-project/sglang @ 001067fffe33427bee0ed2f007fb7551a1d76b44, python/sglang/srt/server_args.py
# (ServerArgs): each field's flag is --<field name with dashes>, plus the aliases it declares.
SGLANG_FLAGS: frozenset[str] = frozenset({
    "--model-path", "--model", "--tokenizer-path", "--tokenizer-mode", "--skip-tokenizer-init",
    "--load-format", "--trust-remote-code", "--context-length", "--revision", "--dtype",
    "--quantization", "--kv-cache-dtype", "--host", "--port",
    "--mem-fraction-static", "--max-running-requests", "--max-queued-requests",
    "--max-total-tokens", "--chunked-prefill-size", "--max-prefill-tokens",
    "--prefill-max-requests", "--schedule-policy", "--schedule-conservativeness", "--page-size",
    "--radix-eviction-policy", "--disable-radix-cache", "--disable-overlap-schedule",
    "--enable-mixed-chunk", "--num-continuous-decode-steps",
    "--tp-size", "--tensor-parallel-size", "--pp-size", "--pipeline-parallel-size",
    "--dp-size", "--data-parallel-size", "--load-balance-method", "--random-seed",
    # DP attention and expert parallelism (ServerArgs.enable_dp_attention, ep_size with its
    # aliases, moe_a2a_backend)
    "--enable-dp-attention", "--ep-size", "--expert-parallel-size", "--ep", "--moe-a2a-backend",
})
# server_args.py @ 001067ff: ServerArgs.moe_a2a_backend choices (MOE_A2A_BACKEND_CHOICES)
SGLANG_MOE_A2A_BACKENDS: frozenset[str] = frozenset({
    "none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer", "megamoe",
    "deepep_v2", "pplx", "ascend_tp"})
SGLANG_SCHEDULE_POLICIES: frozenset[str] = frozenset({
    "lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key"})
SGLANG_KV_CACHE_DTYPES: frozenset[str] = frozenset({
    "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16",
    "fp4_e2m1"})
SGLANG_RADIX_EVICTION_POLICIES: frozenset[str] = frozenset({"lru", "lfu", "slru", "priority"})

# vllm-project/guidellm v0.7.3 (39383552962841086d05e25c37b58a83ef06c758): `guidellm run`
# (src/guidellm/cli/run.py; src/guidellm/__main__.py calls guidellm.cli.cli). Its registry
# options come from BenchmarkArgs (src/guidellm/benchmark/schemas/entrypoints.py), each
# "--<argument_alias>" (src/guidellm/utils/click_pydantic.py registry_options_from_model), and
# take "kind=NAME,key=value,..." strings.
GUIDELLM_RUN_FLAGS: frozenset[str] = frozenset({
    "--config", "--scenario", "-c", "--label", "-l", "--override", "--disable-console",
    "--disable-console-outputs", "--disable-console-interactive", "--disable-progress",
    "--backend", "--profile", "--constraint", "--tokenizer", "--data", "--data-column-mapper",
    "--data-preprocessor", "--data-finalizer", "--data-loader", "--seed", "--output", "--metrics",
})
# kind -> the keys its args model takes (the kinds kvplan writes), per option:
# backend: src/guidellm/backends/openai/http.py (openai_http); profile:
# src/guidellm/benchmark/profiles/{replay,asynchronous,concurrent,throughput}.py; data:
# src/guidellm/data/deserializers/{trace_common,trace_mooncake,synthetic}.py; constraint:
# src/guidellm/scheduler/constraints/request.py; output: src/guidellm/benchmark/outputs/
# serialized.py; seed: src/guidellm/benchmark/schemas/random.py.
GUIDELLM_KINDS: dict[str, dict[str, frozenset[str]]] = {
    "--backend": {"openai_http": frozenset({"kind", "target", "model", "request_format",
                                            "api_key", "api_routes", "timeout"})},
    "--profile": {
        "replay": frozenset({"kind", "time_scale"}),
        "poisson": frozenset({"kind", "rate", "max_concurrency"}),
        "constant": frozenset({"kind", "rate", "max_concurrency"}),
        "concurrent": frozenset({"kind", "streams"}),
        "throughput": frozenset({"kind", "max_concurrency"}),
    },
    "--data": {
        "mooncake": frozenset({"kind", "path", "timestamp_column", "prompt_tokens_column",
                               "output_tokens_column", "hash_ids_column", "hash_id_block_size"}),
        "synthetic_text": frozenset({"kind", "prompt_tokens", "prompt_tokens_stdev",
                                     "prompt_tokens_min", "prompt_tokens_max", "output_tokens",
                                     "output_tokens_stdev", "output_tokens_min",
                                     "output_tokens_max", "prefix_tokens"}),
    },
    "--constraint": {"max_requests": frozenset({"kind", "count"}),
                     "max_duration": frozenset({"kind", "seconds"})},
    "--output": {"json": frozenset({"kind", "path"}), "yaml": frozenset({"kind", "path"})},
    "--seed": {"static": frozenset({"kind", "value"})},
}

# NVIDIA/TensorRT-LLM @ 00209af149e7774406881a37283dce303571eb11, tensorrt_llm/commands/serve.py:
# the click options of ``serve``, the default command of ``trtllm-serve`` (``DefaultGroup``: a
# first argument that names no subcommand runs ``serve``), whose one argument is MODEL. Aliases
# as declared (``--tensor_parallel_size`` / ``--tp_size``, ``--free_gpu_memory_fraction`` /
# ``--kv_cache_free_gpu_memory_fraction``, ``--config`` / ``--extra_llm_api_options``).
TRTLLM_SERVE_FLAGS: frozenset[str] = frozenset({
    "--tokenizer", "--custom_tokenizer", "--host", "--port", "--backend", "--custom_module_dirs",
    "--log_level", "--max_beam_width", "--max_batch_size", "--max_num_tokens", "--max_seq_len",
    "--tensor_parallel_size", "--tp_size", "--pipeline_parallel_size", "--pp_size",
    "--context_parallel_size", "--cp_size", "--moe_expert_parallel_size", "--ep_size",
    "--moe_cluster_parallel_size", "--cluster_size", "--gpus_per_node",
    "--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction",
    "--num_postprocess_workers", "--trust_remote_code", "--revision", "--config",
    "--extra_llm_api_options", "--reasoning_parser", "--tool_parser",
    "--metadata_server_config_file", "--server_role", "--fail_fast_on_attention_window_too_large",
    "--otlp_traces_endpoint", "--disagg_cluster_uri", "--enable_chunked_prefill",
    "--media_io_kwargs", "--chat_template",
})
# serve.py @ 00209af1: the options that are flags (is_flag=True: no value)
TRTLLM_SERVE_BOOL_FLAGS: frozenset[str] = frozenset({
    "--trust_remote_code", "--fail_fast_on_attention_window_too_large", "--enable_chunked_prefill",
})
TRTLLM_BACKENDS: frozenset[str] = frozenset({"pytorch", "tensorrt", "trt", "_autodeploy"})
# tensorrt_llm/llmapi/llm_args.py (a version the source index stores; its text search names no
# commit): the fields of KvCacheConfig and SchedulerConfig, which a --extra_llm_api_options YAML
# sets by name (tensorrt_llm/llmapi/llm_utils.py update_llm_args_with_extra_dict builds each from
# the YAML's mapping), and the CapacitySchedulerPolicy and ContextChunkingPolicy values.
TRTLLM_KV_CACHE_CONFIG_KEYS: frozenset[str] = frozenset({
    "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length",
    "free_gpu_memory_fraction", "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction",
    "secondary_offload_min_priority", "event_buffer_max_size",
    "attention_dp_events_gather_period_ms", "enable_partial_reuse", "copy_on_partial_reuse",
    "use_uvm", "max_gpu_total_bytes", "dtype", "mamba_ssm_cache_dtype", "tokens_per_block",
    "use_kv_cache_manager_v2", "max_util_for_resume",
})
# tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412 (BaseLlmArgs): the
# top-level LLM API fields a --extra_llm_api_options YAML sets that kvplan writes: the parallel
# layout (moe_tensor_parallel_size, moe_expert_parallel_size, enable_attention_dp; passed to
# _ParallelConfig and so to tensorrt_llm/mapping.py Mapping) and the two configs above and below.
TRTLLM_LLM_ARGS_KEYS: frozenset[str] = frozenset({
    "moe_tensor_parallel_size", "moe_expert_parallel_size", "enable_attention_dp",
    "kv_cache_config", "scheduler_config",
})
TRTLLM_SCHEDULER_CONFIG_KEYS: frozenset[str] = frozenset({
    "capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config",
    "waiting_queue_policy",
})
TRTLLM_CAPACITY_SCHEDULER_POLICIES: frozenset[str] = frozenset({
    "MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"})
TRTLLM_CONTEXT_CHUNKING_POLICIES: frozenset[str] = frozenset({
    "FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"})
