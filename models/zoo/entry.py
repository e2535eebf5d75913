"""ZooEntry: one named model with its published parameter count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from models.graph import ModelGraph
from models.recsys import DLRMConfig, build_dlrm
from models.transformer import TransformerConfig, build_transformer


@dataclass(frozen=True)
class ZooEntry:
    """One named model.

    `config` is kept so specs can say `{zoo: name, overrides: {...}}`;
    `builder()` builds the graph from it.
    """

    name: str
    config: TransformerConfig | DLRMConfig
    published_params: int
    source: str
    published_active_params: int | None = None  # MoE: parameters each token touches

    @property
    def builder(self) -> Callable[[], ModelGraph]:
        """A zero-argument callable that builds this model's graph."""
        return lambda: build_config(self.config)


def build_config(config: BaseModel) -> ModelGraph:
    """Build a graph from a TransformerConfig or DLRMConfig."""
    if isinstance(config, TransformerConfig):
        return build_transformer(config)
    if isinstance(config, DLRMConfig):
        return build_dlrm(config)
    raise TypeError(f"no builder for {type(config).__name__}")
