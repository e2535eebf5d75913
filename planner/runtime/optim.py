"""AdamW with linear warmup and cosine decay, and gradient clipping by the global norm over every shard.

One AdamW per model chunk (vpp > 1 runs several chunks on a rank; torchtitan keeps one optimizer per
model part too, so each chunk's optimizer state is keyed by its parameters' whole-model names).  Weight
decay applies to matrices only (not to norm weights).  The learning rate of optimizer step s (0-based) is

    lr * (s + 1) / warmup                                         for s < warmup
    lr * (r + (1 - r) * (1 + cos(pi * (s - warmup) / (steps - warmup))) / 2)   after, r = min_lr_ratio

so it rises to `lr` over the warmup steps and falls to r * lr at the last step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.distributed.tensor import DTensor


class OptimConfig(BaseModel):
    """The optimizer and learning-rate schedule of a training run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(3e-4, gt=0, description="Peak learning rate, reached at the end of warmup.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final learning rate as a share of the peak.")
    warmup_steps: int = Field(1, ge=0, description="Steps of linear warmup from lr / warmup to lr.")
    train_steps: int = Field(ge=1, description="Steps of the whole run: the cosine reaches its end here.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decoupled weight decay of matrices.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW (beta1, beta2).")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, ge=0, description="Clip gradients to this global L2 norm (0: no clipping).")


def lr_factor(step: int, config: OptimConfig) -> float:
    """Share of the peak learning rate at optimizer step `step` (0-based): warmup, then cosine."""
    warmup = config.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    decay = max(1, config.train_steps - warmup)
    progress = min(1.0, (step - warmup) / decay)
    r = config.min_lr_ratio
    return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(chunk: nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `chunk`'s parameters: decay on matrices, none on vectors (norm weights)."""
    params = [p for p in chunk.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.eps)


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The warmup + cosine schedule of `optimizer` (call `.step()` after every optimizer step)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config))


# ---------------------------------------------------------------- clipping


def _copies(param: torch.Tensor, stage_ranks: int) -> int:
    """How many ranks of the stage hold this same piece of `param` (the rest hold other pieces)."""
    if not isinstance(param, DTensor):
        return stage_ranks  # a plain tensor: whole on every rank of its stage
    shards = 1
    for dim, placement in enumerate(param.placements):
        if placement.is_partial():
            raise RuntimeError("a gradient with Partial placement has no local norm; reduce it first")
        # Shard and FSDP2's strided shards (_StridedShard, not a Shard subclass) split the data; Replicate does not
        if not placement.is_replicate():
            shards *= param.device_mesh.size(dim)
    return stage_ranks // shards


def settle_partial_grads(params: Sequence[torch.Tensor]) -> None:
    """All-reduce gradients DTensor left Partial (a sequence-parallel norm weight: each tp rank holds its
    share of the sum) to the parameter's Replicate, as the optimizer step would on first use."""
    from torch.distributed.tensor import Replicate

    for p in params:
        grad = p.grad
        if isinstance(grad, DTensor) and any(pl.is_partial() for pl in grad.placements):
            placements = [Replicate() if pl.is_partial() else pl for pl in grad.placements]
            p.grad = grad.redistribute(grad.device_mesh, placements)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def global_grad_norm(params: Sequence[torch.Tensor], *, stage_ranks: int,
                     reduce: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """L2 norm of the whole model's gradient: every rank's local shards, each piece counted once.

    Each rank adds the squares of its local gradient pieces divided by how many ranks hold the same
    piece, and one all-reduce over all ranks (every pipeline stage) sums them.  `reduce` replaces
    that all-reduce (a test runs it in one process)."""
    settle_partial_grads(params)
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        local = _local(p.grad)
        norm = torch.linalg.vector_norm(local.float()).double().cpu()
        total += norm * norm / _copies(p.grad, stage_ranks)
    device = params[0].device if params else torch.device("cpu")
    total = total.to(device if device.type != "meta" else "cpu")
    (reduce or dist.all_reduce)(total)
    return total.sqrt()


@torch.no_grad()
def clip_grads(params: Sequence[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale every local gradient by max_norm / total_norm when the norm is above max_norm (torch's rule)."""
    coef = max_norm / (float(total_norm) + 1e-6)
    if max_norm <= 0 or coef >= 1.0:
        return
    for p in params:
        if p.grad is not None:
            _local(p.grad).mul_(coef)
