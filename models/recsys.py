"""DLRM builder (Naumov et al. 2019, arXiv 1906.00091).

A DLRM sample flows: dense features -> bottom MLP; each categorical feature ->
a pooled embedding-bag lookup; the bottom output and the pooled vectors meet in
a feature interaction; the result goes through the top MLP to one logit.

For recommendation models a "token" is a sample (the planner runs them with
seq_len 1), so every per-token coefficient is per sample.  Activations are
counted at 4 bytes per element: DLRM trains its MLPs and tables in fp32.

Layers, in order: bottom_mlp.{i}, table.{j}, interaction, top_mlp.{i}.
`ModelGraph.edges` adds table.{j} -> interaction and the last bottom layer ->
interaction, so the networkx view shows the fan-in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.graph import EmbeddingTable, Layer, LayerKind, ModelGraph, ModelName, Width

FP32 = 4  # bytes per activation element


class DLRMConfig(BaseModel):
    """Sizes of a DLRM: MLP widths, tables and the interaction."""

    model_config = ConfigDict(extra="forbid")
    name: ModelName = Field(description="Model name shown in plans and reports (letters, digits and ._+:-/).")
    dense_features: Width = Field(13, gt=0, description="Continuous input features (Criteo: 13).")
    bottom_mlp: list[Width] = Field(
        min_length=1, description="Output widths of the bottom MLP layers; the input width is dense_features."
    )
    top_mlp: list[Width] = Field(
        min_length=1, description="Output widths of the top MLP layers; the input width follows the interaction."
    )
    tables: list[EmbeddingTable] = Field(min_length=1, description="Categorical feature tables.")
    interaction: Literal["dot", "cat"] = Field(
        "dot", description="dot: pairwise dot products of all vectors plus the dense vector; cat: concatenation."
    )
    source: str = Field("", description="Paper, benchmark config or data the sizes come from.")

    @model_validator(mode="after")
    def _check(self) -> "DLRMConfig":
        for field in ("bottom_mlp", "top_mlp"):
            for i, width in enumerate(getattr(self, field)):
                if width <= 0:
                    raise ValueError(f"{field}[{i}] must be positive, got {width}")
        if self.interaction == "dot":
            dims = {t.dim for t in self.tables}
            if dims != {self.bottom_mlp[-1]}:
                raise ValueError(
                    f"dot interaction needs every table dim equal to bottom_mlp[-1] ({self.bottom_mlp[-1]}); "
                    f"got dims {sorted(dims)}"
                )
        return self

    @property
    def num_vectors(self) -> int:
        """Vectors entering the interaction: one per table plus the bottom-MLP output."""
        return len(self.tables) + 1

    @property
    def interaction_width(self) -> int:
        """Width of the interaction output (the top MLP's input)."""
        d = self.bottom_mlp[-1]
        if self.interaction == "dot":
            f = self.num_vectors
            return f * (f - 1) // 2 + d  # strict upper triangle, then the dense vector appended
        return d + sum(t.dim for t in self.tables)

    def mlp_params(self) -> int:
        """Parameters of both MLPs (weights and biases)."""
        total = 0
        for widths, first in ((self.bottom_mlp, self.dense_features), (self.top_mlp, self.interaction_width)):
            fan_in = first
            for out in widths:
                total += fan_in * out + out
                fan_in = out
        return total

    def table_params(self) -> int:
        """Parameters of all embedding tables (rows x dim)."""
        return sum(t.rows * t.dim for t in self.tables)


def _dense(name: str, fan_in: int, fan_out: int) -> Layer:
    return Layer(
        name=name, kind=LayerKind.DENSE, params=fan_in * fan_out + fan_out, hidden=fan_out,
        flops_per_token=2.0 * fan_in * fan_out,
        # saved for backward: the input (weight gradient) and the ReLU output (its mask)
        act_replicated=float(FP32 * (fan_in + fan_out)),
    )


def build_dlrm(cfg: DLRMConfig) -> ModelGraph:
    """Lay out a DLRM (see the module docstring for order and edges)."""
    layers: list[Layer] = []
    fan_in = cfg.dense_features
    for i, out in enumerate(cfg.bottom_mlp):
        layers.append(_dense(f"bottom_mlp.{i}", fan_in, out))
        fan_in = out
    last_bottom = layers[-1].name
    for j, table in enumerate(cfg.tables):
        layers.append(Layer(
            name=f"table.{j}", kind=LayerKind.EMBEDDING_BAG, params=table.rows * table.dim, hidden=table.dim,
            # pooling sums `pooling_factor` rows of `dim` elements (kept simple: 2 FLOP per element read)
            flops_per_token=2.0 * table.pooling_factor * table.dim,
            tp_splittable=True,  # tables are sharded table-/row-/column-wise (TorchRec model parallel)
            table=table,
        ))
    f, d = cfg.num_vectors, cfg.bottom_mlp[-1]
    width = cfg.interaction_width
    # dot: one batched (F x d) @ (d x F) product per sample, as DLRM computes it
    inter_flops = 2.0 * f * f * d if cfg.interaction == "dot" else 0.0
    in_width = d + sum(t.dim for t in cfg.tables)
    layers.append(Layer(
        name="interaction", kind=LayerKind.INTERACTION, params=0, hidden=width,
        flops_per_token=inter_flops, act_replicated=float(FP32 * in_width),  # its input vectors
    ))
    fan_in = width
    for i, out in enumerate(cfg.top_mlp):
        layers.append(_dense(f"top_mlp.{i}", fan_in, out))
        fan_in = out
    edges = [(f"table.{j}", "interaction") for j in range(len(cfg.tables))]
    edges.append((last_bottom, "interaction"))
    return ModelGraph(
        name=cfg.name, family="recsys", layers=layers, hidden=d, num_blocks=0,
        source=cfg.source, edges=edges,
    )
