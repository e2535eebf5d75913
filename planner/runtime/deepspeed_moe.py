"""DeepSpeed's own mixture-of-experts layer in the reference model's MoE blocks (pipeline.json `moe`).

The deepspeed target writes, for a mixture-of-experts model, the keyword arguments of
`deepspeed.moe.layer.MoE` (num_experts, ep_size, k, capacity_factor, min_capacity, drop_tokens, ...), the
experts' width, the MoE blocks and the load-balancing loss weight (planner.emit.deepspeed_moe).  Each of those
blocks gets `DeepSpeedMoE` as its feed-forward: DeepSpeed's router (TopKGate, fp32 logits) and its
SwiGLU experts, this rank's num_experts / ep_size of them.  DeepSpeed builds the expert-parallel groups
when the engine starts (MoE.set_deepspeed_parallelism -> deepspeed.utils.groups
._create_expert_and_data_parallel: without tensor or pipeline parallelism, ep_size consecutive ranks per
expert-parallel group, the expert-data-parallel groups striding over them), so expert e lives on the ranks r
with r % ep_size == e // (num_experts / ep_size), and the engine all-reduces its gradients over the ranks
that hold it.  Each expert's initial weights are drawn by its global id (materialize.fill_normal keys the
values by name), the same wherever it sits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.runtime.materialize import init_weights
from planner.runtime.model import Transformer


class SwiGLUExpert(nn.Module):
    """One expert: w2(silu(w1 x) * w3 x), as the reference model's FeedForward."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DeepSpeedMoE(nn.Module):
    """A block's feed-forward as deepspeed.moe.layer.MoE; keeps the layer's last load-balancing loss."""

    def __init__(self, hidden: int, section: dict, *, block: int, seed: int):
        super().__init__()
        from deepspeed.moe.layer import MoE

        layer = section["layer"]
        self.moe = MoE(hidden_size=hidden, expert=SwiGLUExpert(hidden, section["expert_ffn"]), **layer)
        self.aux_loss = torch.zeros(())
        prefix = f"layers.{block}.feed_forward."
        init_weights(self.moe.deepspeed_moe.gate, seed=seed, prefix=prefix + "router.")
        local = self.moe.num_local_experts
        first = (dist.get_rank() % layer["ep_size"]) * local  # this rank's place in its expert-parallel group
        for j, expert in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
            init_weights(expert, seed=seed, prefix=f"{prefix}experts.{first + j}.")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, self.aux_loss, _ = self.moe(x)
        return out


def install(model: Transformer, section: dict, *, seed: int) -> list[DeepSpeedMoE]:
    """Put DeepSpeedMoE in place of the feed-forward of every block `section` names; returns them in order."""
    layers = []
    for block in section["blocks"]:
        layer = DeepSpeedMoE(model.config.hidden, section, block=block, seed=seed)
        model.layers[str(block)].feed_forward = layer
        layers.append(layer)
    return layers


def aux_loss(layers: list[DeepSpeedMoE], coeff: float) -> torch.Tensor | float:
    """`coeff` x the sum of the layers' load-balancing losses of the last forward."""
    return coeff * sum(layer.aux_loss for layer in layers) if layers else 0.0


def rank_summary(model: nn.Module) -> dict:
    """This rank's expert-parallel and expert-data-parallel groups as DeepSpeed built them, and the sum of
    each local expert's w1 in the first MoE layer (equal on the replicas of an expert); empty for a dense
    model."""
    layer = next((m for m in model.modules() if isinstance(m, DeepSpeedMoE)), None)
    if layer is None:
        return {}
    from deepspeed.utils import groups

    name = layer.moe.expert_group_name
    experts = layer.moe.deepspeed_moe.experts.deepspeed_experts
    return {"expert_parallel_ranks": dist.get_process_group_ranks(groups._get_expert_parallel_group(name)),
            "expert_data_parallel_ranks": dist.get_process_group_ranks(
                groups._get_expert_data_parallel_group(name)),
            "expert_w1_sums": [float(expert.w1.weight.float().sum()) for expert in experts]}
