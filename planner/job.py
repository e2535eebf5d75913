"""A training job: what to train, where, and on how much data per step."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware import Cluster
from models.graph import ModelGraph

Precision = Literal["bf16", "fp16", "fp8"]


class Job(BaseModel):
    """Model x cluster x batch: the fixed inputs every strategy is scored on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: ModelGraph = Field(description="The model graph.")
    cluster: Cluster = Field(description="The hardware topology.")
    global_batch: int = Field(gt=0, description="Sequences (samples for recsys) per optimizer step.")
    seq_len: int = Field(gt=0, description="Tokens per sequence (1 for recsys models).")
    precision: Precision = Field(
        "bf16", description="Compute precision: bf16/fp16 mixed precision, or fp8 GEMMs with bf16 elsewhere."
    )
    optimizer: Literal["adam"] = Field("adam", description="Optimizer (Adam, mixed-precision states).")
    flash_attention: bool = Field(
        True, description="Fused flash attention (no s^2 score tensors); False for 2021-22 era kernels."
    )
    fused_kernels: bool = Field(
        True,
        description="Element-wise work runs in fused kernels (Megatron/Transformer Engine fusions or "
        "torch.compile); False for eager PyTorch, whose unfused kernels move more bytes.",
    )

    @property
    def tokens_per_step(self) -> int:
        """Tokens (or samples) processed per optimizer step."""
        return self.global_batch * self.seq_len

    @property
    def compute_dtype(self) -> str:
        """Datatype of non-GEMM work and of attention (fp8 runs keep bf16 there)."""
        return "bf16" if self.precision == "fp8" else self.precision
