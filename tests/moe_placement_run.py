"""torchrun entry of tests/test_routing_trainer.py: two SGD steps of planner.runtime.moe.PlacedMoE under a
placement map (argv[1], JSON) on fixed tokens, float64 under gloo; rank 0 writes the losses and every
replica's final weights to argv[2] (JSON)."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from planner.runtime.moe import PlacedMoE
from planner.runtime.shutdown import run_then_finish

HIDDEN, FFN, EXPERTS, TOP_K, TOKENS, STEPS = 16, 24, 8, 2, 32, 2


def main() -> None:
    ranks, out = json.loads(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    me, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(7)  # the same tokens and targets whatever the placement
    tokens = torch.randn(world, TOKENS, HIDDEN, generator=gen, dtype=torch.float64)[me]
    target = torch.randn(world, TOKENS, HIDDEN, generator=gen, dtype=torch.float64)[me]
    layer = PlacedMoE(hidden=HIDDEN, ffn=FFN, num_experts=EXPERTS, top_k=TOP_K, ranks=ranks, group=dist.group.WORLD,
                      seed=3, dtype=torch.float64)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = ((layer(tokens) - target) ** 2).sum()
        loss.backward()
        layer.sync_replica_grads()
        layer.sync_router_grads()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    mine = [(e, [w.flatten().tolist() for w in ws]) for e, ws in layer.expert_weights()]
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if me == 0:
        experts: dict[str, list] = {}
        for part in gathered:
            for e, ws in part:
                experts.setdefault(str(e), []).append(ws)
        with open(out, "w") as handle:
            json.dump({"losses": losses, "experts": experts, "router": layer.router.detach().flatten().tolist()},
                      handle)


if __name__ == "__main__":
    run_then_finish(main)  # barrier, destroy the groups, leave without racing gloo's threads (shutdown.py)
