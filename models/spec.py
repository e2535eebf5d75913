"""Model spec files (YAML or JSON): the user's way to describe a model.

A spec is one mapping in one of four shapes::

    # 1. a builder and its config fields (models.transformer.TransformerConfig)
    builder: transformer        # or a family with its defaults: llama | gpt | bert
    name: my-model
    num_layers: 4
    hidden: 512
    heads: 8
    ffn: 1408
    vocab: 32000

    # 2. a DLRM (models.recsys.DLRMConfig)
    builder: dlrm
    name: my-dlrm
    bottom_mlp: [512, 256, 64]
    top_mlp: [512, 256, 1]
    tables: [{rows: 100000, dim: 64}, {rows: 5000, dim: 64, pooling_factor: 3}]

    # 3. a zoo model with some fields changed (nested mappings merge)
    zoo: llama3-8b
    overrides: {name: llama3-8b-4l, num_layers: 4}

    # 4. a raw model graph (models.graph.ModelGraph), e.g. a dumped one
    name: custom
    family: decoder
    hidden: 64
    num_blocks: 1
    layers: [{name: embedding, kind: embedding, params: 16384, hidden: 64, flops_per_token: 0}, ...]

Sizes are integers (not true, 4.0 or "4") under generous bounds (models/graph.py: MAX_WIDTH, MAX_VOCAB,
MAX_LAYERS, MAX_ROWS).  A file over 8 MiB (models/yamlio.py: MAX_INPUT_BYTES), not UTF-8, or with a key
repeated in one mapping is refused.  Every error is a ModelInputError of one line, ``path: field.path: message``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from models.errors import ModelInputError
from models.graph import ModelGraph
from models.recsys import DLRMConfig, build_dlrm
from models.transformer import TransformerConfig, bert, build_transformer, gpt, llama
from models.zoo import ZOO, build_config, close_matches
from models.zoo.entry import ZooEntry
from models import yamlio

# builder name -> function from the spec's fields to a config
BUILDERS: dict[str, Callable[..., TransformerConfig | DLRMConfig]] = {
    "transformer": TransformerConfig,
    "llama": llama,
    "gpt": gpt,
    "bert": bert,
    "dlrm": DLRMConfig,
}


def format_validation_error(where: str, err: ValidationError, prefix: str = "", rename=None) -> str:
    """One line `where: loc.path: message; ...` for a pydantic ValidationError.

    `prefix` goes before every location (e.g. 'overrides'); `rename` maps a
    dotted field path to the name the user wrote (HF config keys).
    """
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        loc = (rename or {}).get(loc, loc)
        loc = ".".join(p for p in (prefix, loc) if p)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "int_type":  # strict sizes: say what came instead (true, 4.0, "4")
            msg += f", got {type(e['input']).__name__}"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return f"{where}: {'; '.join(parts)}"


def read_text(path: str | Path, what: str = "model file") -> str:
    """The text of a user file: a regular file of at most MAX_INPUT_BYTES of UTF-8, else ModelInputError."""
    return yamlio.read_text(path, str(path), ModelInputError, what)


def parse_json(text: str, where: str) -> Any:
    """json.loads with every failure as one ModelInputError line naming `where`."""
    return yamlio.parse_json(text, where, ModelInputError)


def read_mapping(path: str | Path, what: str = "model file") -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold one mapping (repeated YAML keys are errors)."""
    return yamlio.read_mapping(path, str(path), ModelInputError, what)


def _merge(base: dict, overrides: dict) -> dict:
    """Deep merge: nested mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _config_dict(entry: ZooEntry) -> dict:
    cfg = entry.config
    return cfg.to_spec() if isinstance(cfg, TransformerConfig) else cfg.model_dump()


def spec_from_data(data: dict[str, Any], where: str = "<spec>") -> ModelGraph:
    """Build a graph from an already parsed spec mapping; `where` names it in errors."""
    data = dict(data)
    if "zoo" in data:
        name = data.pop("zoo")
        overrides = data.pop("overrides", {}) or {}
        if data:
            raise ModelInputError(f"{where}: {sorted(data)[0]}: not allowed next to 'zoo' (use overrides)")
        if not isinstance(name, str) or name not in ZOO:
            raise ModelInputError(
                f"{where}: zoo: unknown model '{name}'{close_matches(str(name), ZOO)}; known: {', '.join(sorted(ZOO))}"
            )
        if not isinstance(overrides, dict):
            raise ModelInputError(f"{where}: overrides: expected a mapping, got {type(overrides).__name__}")
        entry = ZOO[name]
        try:
            cfg = type(entry.config).model_validate(_merge(_config_dict(entry), overrides))
        except ValidationError as err:
            raise ModelInputError(format_validation_error(where, err, prefix="overrides")) from None
        return build_config(cfg)
    if "builder" in data:
        builder = data.pop("builder")
        if not isinstance(builder, str) or builder not in BUILDERS:
            raise ModelInputError(
                f"{where}: builder: unknown '{builder}'{close_matches(str(builder), BUILDERS)}; "
                f"known: {', '.join(sorted(BUILDERS))}"
            )
        try:
            cfg = BUILDERS[builder](**data)
        except ValidationError as err:
            raise ModelInputError(format_validation_error(where, err)) from None
        except TypeError:  # a non-string key cannot become a keyword argument
            bad = next((k for k in data if not isinstance(k, str)), "?")
            raise ModelInputError(f"{where}: {bad}: field names must be strings") from None
        return build_transformer(cfg) if isinstance(cfg, TransformerConfig) else build_dlrm(cfg)
    if "layers" in data:
        try:
            return ModelGraph.model_validate(data)
        except ValidationError as err:
            raise ModelInputError(format_validation_error(where, err)) from None
    raise ModelInputError(
        f"{where}: expected 'builder' ({', '.join(sorted(BUILDERS))}), 'zoo' or 'layers' (a raw model graph)"
    )


def load_model_file(path: str | Path) -> ModelGraph:
    """Load a model spec file (see the module docstring for the format)."""
    return spec_from_data(read_mapping(path), where=str(path))
