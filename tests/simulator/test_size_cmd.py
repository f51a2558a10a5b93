"""`kvplan size`: driven through a real argparse parser built with add_parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from simulator.errors import KvplanError
from simulator.kv.gpus import get_gpu
from simulator.kv.models import get_model
from simulator.kv.sizing import kv_capacity
from simulator.commands.size import add_parser, run


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvplan")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["size", *argv])


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert run(_args(*argv, "--json")) == 0
    return json.loads(capsys.readouterr().out)


def test_llama2_13b_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("--model", "llama-2-13b")) == 0
    out = capsys.readouterr().out
    assert "819,200 B = 800.0 KiB = 0.781 MiB" in out
    assert "1.562 GiB" in out  # 2048 tokens


def test_llama2_13b_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, "--model", "meta-llama/Llama-2-13b-hf", "--batch", "4")
    assert result["bytes_per_token"] == 819_200
    assert result["total_bytes"] == 819_200 * 2048 * 4
    assert "num_blocks" not in result


def test_explicit_dimensions_default_to_fp16(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                   "--seq-len", "6000")
    assert result["kv_cache_dtype"] == "fp16"
    assert result["bytes_per_token"] == 131_072
    assert result["total_bytes"] == 131_072 * 6000


def test_explicit_mla(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, "--layers", "61", "--kv-lora-rank", "512", "--kv-cache-dtype", "bf16")
    assert result["bytes_per_token"] == 70_272
    result = _json(capsys, "--layers", "61", "--kv-lora-rank", "512", "--qk-rope-head-dim", "0",
                   "--kv-cache-dtype", "fp8")
    assert result["bytes_per_token"] == 61 * 512


def test_fp8_and_tp(capsys: pytest.CaptureFixture[str]) -> None:
    full = _json(capsys, "--model", "llama-3.1-70b")["bytes_per_token"]
    assert _json(capsys, "--model", "llama-3.1-70b", "--kv-cache-dtype", "fp8")[
        "bytes_per_token"] * 2 == full
    assert _json(capsys, "--model", "llama-3.1-70b", "--tp", "4")["bytes_per_token"] * 4 == full


def test_tp_replication_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("--model", "llama-3.1-8b", "--tp", "16")) == 0
    assert "every rank holds 1 KV head" in capsys.readouterr().out
    result = _json(capsys, "--model", "llama-3.1-8b", "--tp", "16")
    assert result["kv_replicated"] is True and result["notes"]


def test_gpu_capacity_json_matches_kv_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192")
    cap = kv_capacity(get_model("llama-3.1-8b"), get_gpu("h100"), max_model_len=8192)
    for key in ("num_blocks", "capacity_tokens", "available_kv_bytes", "weight_bytes",
                "activation_bytes"):
        assert result[key] == getattr(cap, key)
    assert result["max_concurrency"] == pytest.approx(cap.capacity_tokens / 8192)
    assert result["max_seqs_at_seq_len"] == cap.num_blocks // (2048 // 16)


def test_gpu_capacity_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("--model", "llama-3.1-8b", "--gpu", "H100")) == 0
    out = capsys.readouterr().out
    assert "Available KV cache memory:" in out
    assert "GPU KV cache size:" in out
    assert "Maximum concurrency for 131,072 tokens per request:" in out


def test_config_json_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 30, "num_attention_heads": 8,
                                "num_key_value_heads": 2, "hidden_size": 512,
                                "intermediate_size": 1408, "vocab_size": 32000,
                                "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}))
    assert _json(capsys, "--model", str(path))["bytes_per_token"] == 15_360


@pytest.mark.parametrize(("argv", "message"), [
    (("--model", "llama-2-7b", "--seq-len", "0"), "--seq-len must be a positive integer"),
    (("--model", "llama-2-7b", "--batch", "-1"), "--batch must be a positive integer"),
    (("--model", "llama-2-7b", "--tp", "0"), "--tp must be a positive integer"),
    (("--model", "llama-2-7b", "--block-size", "0"), "--block-size must be a positive integer"),
    (("--layers", "-2", "--kv-heads", "8", "--head-dim", "128"), "--layers must be a positive"),
    (("--layers", "32", "--kv-heads", "8", "--head-dim", "0"), "--head-dim must be a positive"),
    (("--model", "llama-2-7b", "--kv-cache-dtype", "fp9"), "did you mean 'fp8'"),
    (("--model", "lama-2-7b",), "unknown model 'lama-2-7b'"),
    (("--model", "llama-2-7b", "--gpu", "h1000"), "unknown GPU 'h1000'"),
    (("--model", "llama-2-7b", "--layers", "32"), "either --model or explicit dimensions"),
    ((), "give --model"),
    (("--layers", "32", "--kv-heads", "8"), "need --head-dim"),
    (("--kv-heads", "8", "--head-dim", "128"), "need --layers"),
    (("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--gpu", "h100"),
     "--gpu needs --model"),
    (("--model", "llama-2-7b", "--gpu", "h100", "--gpu-memory-utilization", "1.5"),
     "gpu memory utilization"),
    # an H100 reports 85,045,477,376 B = 79.20 GiB, the total vLLM takes 0.9 of
    (("--model", "llama-3.1-70b", "--gpu", "h100"), "do not fit in 0.90 × 79.20 GiB of H100-80GB"),
])
def test_bad_input_raises(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(KvplanError, match=message):
        run(_args(*argv))


def test_config_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_attention_heads": 8}))
    with pytest.raises(KvplanError, match="missing required field 'num_hidden_layers'"):
        run(_args("--model", str(path)))


def test_quantization_flag(capsys: pytest.CaptureFixture[str]) -> None:
    base = _json(capsys, "--model", "llama-3.3-70b", "--gpu", "a100", "--tp", "2",
                 "--quantization", "none")
    awq = _json(capsys, "--model", "llama-3.3-70b", "--gpu", "a100", "--tp", "2",
                "--quantization", "awq")
    assert awq["weights"]["weight_dtype"] == "int4" and awq["weights"]["gemm_dtype"] == "bf16"
    assert awq["weight_bytes"] < base["weight_bytes"] / 3
    assert awq["num_blocks"] > base["num_blocks"]
    assert any("vLLM needs such a checkpoint" in note for note in awq["notes"])
    assert run(_args("--model", "llama-3.1-8b-fp8", "--gpu", "a100")) == 0
    out = capsys.readouterr().out
    assert "fp8_e4m3 (quantization fp8, checkpoint), GEMMs in bf16" in out
    assert "note: A100-80GB has no FP8 tensor cores" in out


def test_sliding_window_note_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, "--model", "gemma-3-27b")
    assert result["notes"] == ["52 of 62 layers are sliding-window 1024"]


@pytest.mark.parametrize(("argv", "message"), [
    (("--model", "llama-3.1-8b", "--gpu", "h100", "--quantization", "fp9"),
     "unknown quantization 'fp9' — did you mean 'fp8'"),
    (("--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--quantization", "awq"),
     "does not match DeepSeek-V3's checkpoint"),
])
def test_bad_quantization(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(KvplanError, match=message):
        run(_args(*argv))
