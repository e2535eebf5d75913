"""The dense layers of the DLRM runtime (planner/runtime/dlrm.py), kept apart from its sharding machinery so
tests/bench/kernel_counts.py can count their kernels without importing it."""

from __future__ import annotations

import torch
from torch import nn


def mlp(widths: list[int], fan_in: int, last_relu: bool) -> nn.Sequential:
    """Linear layers of `widths` with a ReLU after each (after the last only with `last_relu`)."""
    layers: list[nn.Module] = []
    for i, out in enumerate(widths):
        layers.append(nn.Linear(fan_in, out))
        if last_relu or i < len(widths) - 1:
            layers.append(nn.ReLU())
        fan_in = out
    return nn.Sequential(*layers)


def dot_interaction(x: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
    """DLRM's dot interaction: the pairwise dot products of the bottom MLP output and the pooled embeddings
    (upper triangle), then x itself."""
    vectors = torch.stack([x, *pooled], dim=1)
    products = vectors @ vectors.transpose(1, 2)
    rows, cols = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
    return torch.cat([products[:, rows, cols], x], dim=1)
