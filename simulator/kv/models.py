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
    try:
        return model_from_hf_config(raw, name=config_model_name(raw, path), source=str(path))
    except KvplanError as err:
        raise KvplanError(f"{path}: {err}") from None


__all__ = ["ModelConfig", "canonical_dtype", "dtype_bits", "get_model", "list_models",
           "load_model", "model_from_hf_config"]
