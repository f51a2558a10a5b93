"""Models by name or by ``config.json``: the one entry point the rest of kvplan imports.

:func:`load_model` takes a catalog name (case insensitive, Hugging Face ids accepted) or a path
to a ``config.json`` (or a downloaded checkpoint's folder). The pieces live in their own
modules: the shape and parameter counts in :mod:`simulator.kv.model_config`, config.json
parsing in :mod:`simulator.kv.hf_config`, the catalog in :mod:`simulator.kv.catalog`.
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.errors import KvplanError
from simulator.kv.catalog import get_model, list_models
from simulator.kv.hf_config import config_model_name, model_from_hf_config
from simulator.kv.model_config import ModelConfig, canonical_dtype, dtype_bits
from simulator.yamlfile import check_json_nesting


def load_model(name_or_path: str | Path) -> ModelConfig:
    """A catalog model, or the model described by a local ``config.json``.

    A name ending in ``.json``, or a folder holding a ``config.json`` (a downloaded checkpoint),
    is read as a config; anything else is looked up in the catalog.
    """
    path = Path(name_or_path)
    if path.suffix == ".json":
        return _load_config_file(path)
    if (path / "config.json").is_file():
        return _load_config_file(path / "config.json")
    return get_model(str(name_or_path))


def _load_config_file(path: Path) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise KvplanError(f"cannot read model config {path}: {err.strerror or err}") from None
    check_json_nesting(text, str(path))
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise KvplanError(f"{path}:{err.lineno}: invalid JSON: {err.msg}") from None
    if not isinstance(raw, dict):
        raise KvplanError(f"{path}: a config.json must hold a JSON object")
    _add_hf_quant_config(raw, path)
    try:
        return model_from_hf_config(raw, name=config_model_name(raw, path), source=str(path))
    except KvplanError as err:
        raise KvplanError(f"{path}: {err}") from None


def _add_hf_quant_config(raw: dict, path: Path) -> None:
    """A ModelOpt checkpoint's ``hf_quant_config.json`` beside the config, as vLLM reads it: when
    ``config.json`` has no ``quantization_config``, the file's contents become it
    (vllm/transformers_utils/config.py ``get_config``: "ModelOpt 0.29.0 and before saves the
    quantization config in a separate hf_quant_config.json"), under the ``quant_method``
    "modelopt" vLLM gives a ModelOpt producer's config (vllm/config/model.py
    ``_parse_quant_hf_config``)."""
    text = raw.get("text_config")
    if raw.get("quantization_config") is not None or (
            isinstance(text, dict) and text.get("quantization_config") is not None):
        return
    quant_path = path.parent / "hf_quant_config.json"
    if not quant_path.is_file():
        return
    try:
        quant = json.loads(quant_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise KvplanError(f"cannot read {quant_path}: {err}") from None
    if not isinstance(quant, dict):
        raise KvplanError(f"{quant_path}: must hold a JSON object")
    raw["quantization_config"] = {"quant_method": "modelopt", **quant}


__all__ = ["ModelConfig", "canonical_dtype", "dtype_bits", "get_model", "list_models",
           "load_model", "model_from_hf_config"]
