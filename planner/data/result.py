"""The data plan: what plan.json's `data` section and `compile --json`'s `data` hold."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StaticLayout(BaseModel):
    """A static layout of the step's sequences under one strategy, priced by the cost model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    layout: Literal["pad", "pack-unmasked", "pack"] = Field(
        description="pad: each sequence alone in a seq_len row; pack-unmasked: seq_len rows attending across "
                    "documents; pack: seq_len rows cut from the sequences in data order, a document mask in each.")
    strategy: str = Field(description="The strategy (SPEC) with its fixed context-parallel degree.")
    cp: int = Field(ge=1, description="The fixed context-parallel degree every row runs on.")
    step_time_s: float = Field(ge=0, description="Seconds per step of this layout (the cost model's prediction).")
    fits: bool = Field(description="Every micro-batch fits in HBM.")


class Bucket(BaseModel):
    """The sequences that run on one context-parallel degree."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cp: int = Field(ge=1, description="Context-parallel degree of the bucket's micro-batches (1: one rank).")
    min_tokens: int = Field(ge=1, description="Shortest sequence of the bucket in the planned step.")
    max_tokens: int = Field(ge=1, description="Longest sequence of the bucket in the planned step.")
    sequences: int = Field(ge=1, description="Sequences of the planned step in the bucket.")
    tokens: int = Field(ge=1, description="Their tokens.")
    micro_batches: int = Field(ge=1, description="Micro-batches they are packed into.")


class CostFit(BaseModel):
    """A micro-batch's seconds at one degree as the trainer's sampler balances them: fixed + per_token x T +
    per_token_squared x sum(L^2), least squares against the cost model over the plan's range of T."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cp: int = Field(ge=1, description="Context-parallel degree.")
    fixed_s: float = Field(description="Seconds per micro-batch.")
    per_token_s: float = Field(description="Seconds per token of the micro-batch.")
    per_token_squared_s: float = Field(description="Seconds per squared sequence length (the attention term).")


class DataPlan(BaseModel):
    """Packing, per-bucket context parallelism and balancing of a data profile, against the best static plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    profile: str = Field(description="The data profile's name.")
    source: str = Field(description="The data profile's source.")
    sequences: int = Field(ge=1, description="Sequences in the planned step (drawn from the profile's quantiles).")
    tokens: int = Field(ge=1, description="Their tokens (at most batch x seq_len).")
    layout: Literal["hybrid", "static-pad", "static-pack-unmasked", "static-pack"] = Field(
        description="What the plan runs: hybrid data parallelism (buckets below), or a static layout when none "
                    "is faster.")
    strategy: str = Field(description="The strategy (SPEC) whose cp x dp ranks are the data ranks.")
    token_budget: int = Field(ge=1, description="Tokens per rank and micro-batch: seq_len x mbs / cp of the "
                                                "strategy (no rank holds more activations than its static plan), "
                                                "or a half or a quarter of it where that is faster.")
    bucket_factors: dict[str, int] = Field(
        description="Per bucket (keyed by its smallest degree, the power of two c with length <= c x budget), "
                    "the multiple of it the bucket runs on; absent: 1.")
    buckets: list[Bucket] = Field(description="The planned step's buckets (hybrid layout).")
    micro_batches: int = Field(ge=0, description="Micro-batches of the planned step (hybrid layout).")
    encoder_placement: Literal["co-located", "spread"] | None = Field(
        None, description="Where the profile's encoders run (planner.data.encoder): with their samples, or "
                          "evenly over the data ranks with an all-to-all of the embeddings; None: no encoder "
                          "priced.")
    step_time_s: float = Field(ge=0, description="Predicted seconds per step of the plan on this data.")
    bound_s: float = Field(ge=0, description="Seconds no assignment of the same micro-batches to the data ranks "
                                             "beats (rank-seconds spread evenly, at least the longest one).")
    gap: float = Field(ge=0, description="(step_time_s - bound_s) / step_time_s.")
    baseline: str = Field(description="The best static layout and its strategy.")
    baseline_step_time_s: float = Field(ge=0, description="Its predicted seconds per step on the same data.")
    speedup: float = Field(gt=0, description="baseline_step_time_s / step_time_s (>= 1: the plan never loses).")
    static: list[StaticLayout] = Field(description="Every static layout priced, per candidate strategy.")
    cost_fit: list[CostFit] = Field(description="Per degree, the micro-batch seconds the trainer's sampler "
                                                "balances with.")
    notes: list[str] = Field(default_factory=list, description="What the plan leaves out of the profile.")
