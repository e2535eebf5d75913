"""The model zoo: named models with their published parameter counts and sources.

Every entry is a builder config (a family plus sizes, see models.transformer and
models.recsys), the count its authors publish, and where that count comes from.
tests/test_models.py checks each built model against its published count.
"""

from __future__ import annotations

import difflib

from models.errors import ModelInputError
from models.graph import ModelGraph
from models.zoo.entry import ZooEntry, build_config

__all__ = ["ZOO", "ZooEntry", "build_config", "close_matches", "get_entry", "get_model", "list_models"]


def _entries() -> dict[str, ZooEntry]:
    from models.zoo import llm, recsys

    entries = [*llm.ENTRIES, *recsys.ENTRIES]
    return {entry.name: entry for entry in entries}


ZOO: dict[str, ZooEntry] = _entries()


def close_matches(name: str, names) -> str:
    """' (did you mean a, b?)' for near misses, else ''."""
    near = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def list_models() -> list[ZooEntry]:
    """All zoo entries, sorted by name."""
    return [ZOO[name] for name in sorted(ZOO)]


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called `name`; ModelInputError listing the known names otherwise."""
    try:
        return ZOO[name]
    except KeyError:
        raise ModelInputError(
            f"unknown model '{name}'{close_matches(name, ZOO)}; known: {', '.join(sorted(ZOO))}"
        ) from None


def get_model(name: str) -> ModelGraph:
    """Build the zoo model called `name`."""
    return get_entry(name).builder()
