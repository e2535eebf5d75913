"""Routing statistics of a mixture-of-experts model: each MoE layer's share of routed tokens per expert.

`--routing FILE` (YAML or JSON) gives them either measured (`layers`: per MoE layer the tokens or shares
each expert received, as Megatron-Core's router logging or planner's trainer write them) or as a named
synthetic skew (`synthetic`: Zipf with exponent s, for research sweeps).  A share is the fraction of the
layer's routed token copies (tokens x top_k) an expert receives; an expert gets at most one copy of a
token, so no share exceeds 1/top_k.

The file also says how many redundant expert slots the placement may fill (`redundant_slots`: physical
experts per layer beyond the model's, EPLB's num_replicas - num_logical_experts) and EPLB's expert groups.
"""

from __future__ import annotations

import math
import random
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.graph import LayerKind, ModelGraph
from models.yamlio import read_mapping
from planner.errors import PlannerInputError

# shares printed with a few digits sum to 1 only roughly; a trace off by more is a wrong trace
SHARE_SUM_TOLERANCE = 1e-3
MAX_EXPERTS = 4096  # no published MoE has more routed experts per layer (DeepSeek-V3: 256)
MAX_LAYERS = 1024

_FIELD = ConfigDict(extra="forbid")


class LayerLoads(BaseModel):
    """One MoE layer's measured loads."""

    model_config = _FIELD
    layer: int = Field(ge=0, le=MAX_LAYERS, strict=True,
                       description="Index of the layer among the model's MoE layers (0 = the first MoE block).")
    shares: list[float] | None = Field(
        None, max_length=MAX_EXPERTS,
        description="Share of the layer's routed token copies each expert received (sums to 1), by expert id.")
    tokens: list[int] | None = Field(
        None, max_length=MAX_EXPERTS,
        description="Routed token copies each expert received (counts from a trace), by expert id; "
        "normalised to shares.")
    replicas: list[int] | None = Field(
        None, max_length=MAX_EXPERTS,
        description="Replicas per expert the deployment pins (each >= 1, at most the experts plus "
        "redundant_slots in all); omitted: the placement chooses.")

    @model_validator(mode="after")
    def _one_measure(self) -> "LayerLoads":
        if (self.shares is None) == (self.tokens is None):
            raise ValueError("give exactly one of shares or tokens")
        if self.shares is not None:
            bad = next((i for i, s in enumerate(self.shares) if not (math.isfinite(s) and s >= 0)), None)
            if bad is not None:
                raise ValueError(f"shares[{bad}] is {self.shares[bad]}: a share is a finite number >= 0")
            total = sum(self.shares)
            if abs(total - 1.0) > SHARE_SUM_TOLERANCE:
                raise ValueError(f"shares sum to {total:.6g}, not 1 (within {SHARE_SUM_TOLERANCE:g}); give tokens "
                                 "to have counts normalised")
        if self.tokens is not None:
            bad = next((i for i, t in enumerate(self.tokens) if t < 0), None)
            if bad is not None:
                raise ValueError(f"tokens[{bad}] is {self.tokens[bad]}: a token count is >= 0")
            if not sum(self.tokens):
                raise ValueError("tokens are all 0: the layer routed nothing")
        if self.replicas is not None:
            bad = next((i for i, r in enumerate(self.replicas) if r < 1), None)
            if bad is not None:
                raise ValueError(f"replicas[{bad}] is {self.replicas[bad]}: every expert keeps at least 1 replica")
        return self

    @property
    def normalised(self) -> tuple[float, ...]:
        """Shares summing to 1 exactly."""
        raw = self.shares if self.shares is not None else [float(t) for t in self.tokens or []]
        total = sum(raw)
        return tuple(s / total for s in raw)


class SyntheticSkew(BaseModel):
    """A named synthetic skew: the k-th busiest expert gets a share proportional to k**-exponent (Zipf)."""

    model_config = _FIELD
    distribution: Literal["zipf"] = Field("zipf", description="The skew's law (zipf: share of rank k ~ k^-s).")
    exponent: float = Field(ge=0.0, le=10.0, description="Zipf exponent s (0: balanced).")
    seed: int = Field(0, ge=0, le=2**31 - 1, strict=True,
                      description="Seed of the permutation that says which expert ids are the busy ones (the same in "
                      "every layer, so one placement serves them all).")

    def shares(self, num_experts: int) -> tuple[float, ...]:
        """Shares by expert id: Zipf weights over popularity ranks, ranks dealt to ids by a seeded shuffle."""
        weights = [(k + 1) ** -self.exponent for k in range(num_experts)]
        total = sum(weights)
        ids = list(range(num_experts))
        random.Random(self.seed).shuffle(ids)  # Python's shuffle is stable across versions for a given seed
        out = [0.0] * num_experts
        for rank, expert in enumerate(ids):
            out[expert] = weights[rank] / total
        return tuple(out)


class RoutingStats(BaseModel):
    """`--routing FILE`: per-layer expert loads (measured or synthetic) and the redundant slots allowed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str = Field(min_length=1, max_length=2000,
                        description="Where the loads come from: the run and tool that traced them, or the synthetic "
                        "law's purpose.")
    redundant_slots: int = Field(
        0, ge=0, le=MAX_EXPERTS, strict=True,
        description="Physical expert slots per MoE layer beyond the model's experts, spread evenly over the "
        "expert-parallel ranks (EPLB's num_replicas - num_logical_experts; DeepSeek-V3 serves with 32).")
    expert_groups: int = Field(
        1, ge=1, le=MAX_EXPERTS, strict=True,
        description="Expert groups of EPLB's hierarchical policy (DeepSeek-V3 n_group = 8): groups are packed to "
        "nodes first when the expert-parallel group spans a number of nodes dividing it.")
    layers: list[LayerLoads] | None = Field(
        None, max_length=MAX_LAYERS,
        description="Measured loads, one entry per traced MoE layer; layers not traced are costed at the traced "
        "layers' mean busiest-rank ratio.")
    synthetic: SyntheticSkew | None = Field(None, description="A synthetic skew instead of measured layers.")

    @model_validator(mode="after")
    def _one_kind(self) -> "RoutingStats":
        if (self.layers is None) == (self.synthetic is None):
            raise ValueError("give exactly one of layers (measured) or synthetic")
        if self.layers is not None:
            if not self.layers:
                raise ValueError("layers is empty: trace at least one MoE layer")
            seen: set[int] = set()
            for i, entry in enumerate(self.layers):
                if entry.layer in seen:
                    raise ValueError(f"layers[{i}].layer: layer {entry.layer} is given twice")
                seen.add(entry.layer)
        return self

    @cached_property
    def key(self) -> str:
        """Canonical JSON of the statistics: the placement cache's key (computed once)."""
        return self.model_dump_json()

    def without_replicas(self) -> "RoutingStats":
        """The same loads with no redundant slots (a fresh model: the cached key is recomputed)."""
        data = self.model_dump()
        data["redundant_slots"] = 0
        for entry in data["layers"] or []:
            entry["replicas"] = None
        return RoutingStats.model_validate(data)

    def layer_shares(self, num_experts: int) -> tuple[tuple[float, ...], ...]:
        """Shares per traced layer (in the file's layer order; one entry for a synthetic skew)."""
        if self.synthetic is not None:
            return (self.synthetic.shares(num_experts),)
        return tuple(entry.normalised for entry in sorted(self.layers or [], key=lambda e: e.layer))

    def layer_replicas(self) -> tuple[tuple[int, ...] | None, ...]:
        """Pinned replica counts per traced layer, in `layer_shares`' order (None where the placement chooses)."""
        if self.synthetic is not None:
            return (None,)
        return tuple(None if e.replicas is None else tuple(e.replicas)
                     for e in sorted(self.layers or [], key=lambda e: e.layer))

    def problem_with(self, graph: ModelGraph) -> str | None:
        """Why these statistics do not fit `graph` (None when they do), naming the field."""
        moe = [layer.moe for layer in graph.layers if layer.kind == LayerKind.MOE and layer.moe is not None]
        if not moe:
            return f"model {graph.name} has no mixture-of-experts layers to route"
        experts, top_k = moe[0].num_experts, moe[0].top_k
        if experts % self.expert_groups:
            return f"expert_groups: {self.expert_groups} does not divide the model's {experts} experts"
        if self.synthetic is not None:
            top = max(self.synthetic.shares(experts))
            if top > 1.0 / top_k + 1e-12:
                return (f"synthetic.exponent: {self.synthetic.exponent:g} gives the busiest expert {top:.3f} of the "
                        f"routed copies, more than 1/top_k = {1 / top_k:.3f} (a token visits an expert once)")
            return None
        for i, entry in enumerate(self.layers or []):
            where = f"layers[{i}]"
            if entry.layer >= len(moe):
                return (f"{where}.layer: unknown layer {entry.layer}: {graph.name} has {len(moe)} MoE layers "
                        f"(0-{len(moe) - 1})")
            given = len(entry.shares if entry.shares is not None else entry.tokens or [])
            if given != experts:
                field = "shares" if entry.shares is not None else "tokens"
                return f"{where}.{field}: {given} experts, {graph.name} has {experts}"
            top = max(entry.normalised)
            if top > 1.0 / top_k + SHARE_SUM_TOLERANCE:
                return (f"{where}: an expert gets {top:.3f} of the routed copies, more than 1/top_k = {1 / top_k:.3f} "
                        "(a token visits an expert once)")
            if entry.replicas is not None:
                if len(entry.replicas) != experts:
                    return f"{where}.replicas: {len(entry.replicas)} experts, {graph.name} has {experts}"
                if sum(entry.replicas) > experts + self.redundant_slots:
                    return (f"{where}.replicas: {sum(entry.replicas)} replicas, more than the {experts} experts + "
                            f"redundant_slots {self.redundant_slots} slots")
        return None


def load_routing(path: str | Path, graph: ModelGraph) -> RoutingStats:
    """`--routing FILE` for `graph`: every problem one PlannerInputError line naming the file and the field."""
    where = str(path)
    data = read_mapping(path, where, PlannerInputError, "routing file")
    try:
        stats = RoutingStats.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise PlannerInputError(f"{where}: {loc + ': ' if loc else ''}{msg}") from None
    problem = stats.problem_with(graph)
    if problem is not None:
        raise PlannerInputError(f"{where}: {problem}")
    return stats
