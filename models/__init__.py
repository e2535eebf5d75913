"""The workload: model graph IR, builders, zoo and importers.

`load_model(arg)` is what the command line calls with its MODEL argument: a zoo
name, a Hugging Face config.json (recognised by its `model_type`), or a model
spec file (models/spec.py documents the format).
"""

from __future__ import annotations

from pathlib import Path

from models.errors import ModelInputError
from models.graph import AttentionShape, EmbeddingTable, Layer, LayerKind, ModelGraph, MoEShape
from models.hf import load_hf_config
from models.recsys import DLRMConfig, build_dlrm
from models.spec import load_model_file, parse_json, read_text
from models.transformer import MLAConfig, MoEConfig, TransformerConfig, build_transformer
from models.zoo import ZOO, ZooEntry, close_matches, get_model, list_models

__all__ = [
    "AttentionShape", "DLRMConfig", "EmbeddingTable", "Layer", "LayerKind", "MLAConfig", "ModelGraph",
    "ModelInputError", "MoEConfig", "MoEShape", "TransformerConfig", "ZOO", "ZooEntry", "build_dlrm",
    "build_transformer", "get_model", "list_models", "load_hf_config", "load_model", "load_model_file",
]


def _is_hf_config(path: Path) -> bool:
    """A JSON object with a `model_type` key is a Hugging Face config."""
    if path.suffix.lower() != ".json":
        return False
    try:
        data = parse_json(read_text(path), str(path))
    except ModelInputError:
        return False  # the spec loader reports the problem with its position
    return isinstance(data, dict) and "model_type" in data


def load_model(arg: str) -> ModelGraph:
    """A zoo name, else an existing HF config.json (or a folder holding one) or spec file, else ModelInputError."""
    if arg in ZOO:
        return get_model(arg)
    path = Path(arg)
    if path.is_dir():
        if (path / "config.json").is_file():  # a downloaded HF model folder
            return load_hf_config(path / "config.json")
        raise ModelInputError(f"{arg}: is a directory without a config.json, not a model file")
    if path.is_file():
        return load_hf_config(path) if _is_hf_config(path) else load_model_file(path)
    if path.exists():  # reading a FIFO or device would block or never end
        raise ModelInputError(f"{arg}: is not a regular file (a FIFO, socket or device); give a model file")
    raise ModelInputError(
        f"unknown model '{arg}': not a zoo name nor an existing file{close_matches(arg, ZOO)}; "
        f"zoo: {', '.join(sorted(ZOO))}"
    )
