"""A mixture-of-experts feed-forward whose routed experts sit on expert-parallel ranks by a placement map.

The map is plan.json's `moe.layers[i].ranks` (planner.routing.placement): the expert ids in each rank's
slots, a replicated expert on several ranks.  Every rank routes its own tokens (top-k of a softmax router,
the gates renormalised, as Mixtral), then:

    dispatch   all ranks' tokens and routes are gathered (gloo has no all-to-all: the gather and the
               sum below move more bytes than an all-to-all, with the same result)
    compute    the k-th copy routed to expert e goes to e's replica k mod replicas(e) (copies ordered by
               token, then choice): a replicated expert's tokens split evenly among its replicas; each
               rank runs the SwiGLU experts of its slots on the copies sent to them, times their gates
    combine    the ranks' partial outputs are summed and each rank keeps its own tokens' rows

Backward runs through the same collectives.  After backward, `sync_replica_grads` sums each replicated
expert's gradients over its replicas (they saw different tokens), so every replica takes the same update
as the single copy of a contiguous placement would, and `sync_router_grads` sums the router's.  Replicas
start equal: an expert's weights are drawn from a generator seeded by its id, wherever it sits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _Gather(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward sums the gradient over the group and keeps this rank's
    rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.rows = group, dist.get_rank(group), x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows], None


class _Sum(torch.autograd.Function):
    """All-reduce (sum) over a group; backward sums the gradient over the group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def check_placement(ranks: list[list[int]], num_experts: int, group_size: int) -> None:
    """ValueError unless `ranks` gives every one of `group_size` ranks the same number of slots and every expert
    at least one, on distinct ranks."""
    if len(ranks) != group_size:
        raise ValueError(f"placement has {len(ranks)} ranks, the expert-parallel group {group_size}")
    if len({len(slots) for slots in ranks}) != 1:
        raise ValueError("placement: every rank holds the same number of expert slots")
    for r, slots in enumerate(ranks):
        if len(set(slots)) != len(slots):
            raise ValueError(f"placement: rank {r} holds an expert twice")
        bad = [e for e in slots if not 0 <= e < num_experts]
        if bad:
            raise ValueError(f"placement: rank {r} holds expert {bad[0]}, the layer has {num_experts}")
    missing = set(range(num_experts)) - {e for slots in ranks for e in slots}
    if missing:
        raise ValueError(f"placement: expert {min(missing)} sits on no rank")


class PlacedMoE(nn.Module):
    """Router and routed SwiGLU experts of one MoE layer, this rank's slots of `ranks`."""

    def __init__(self, *, hidden: int, ffn: int, num_experts: int, top_k: int, ranks: list[list[int]],
                 group: dist.ProcessGroup, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        check_placement(ranks, num_experts, dist.get_world_size(group))
        self.group, self.top_k, self.num_experts = group, top_k, num_experts
        self.ranks = [list(slots) for slots in ranks]
        self.slots = self.ranks[dist.get_rank(group)]
        # replica r of expert e sits on holders[e][r]
        self.holders = [[r for r, slots in enumerate(ranks) if e in slots] for e in range(num_experts)]
        router = torch.Generator().manual_seed(seed)
        self.router = nn.Parameter(torch.randn(num_experts, hidden, generator=router, dtype=dtype) / hidden ** 0.5)
        weights = [self._expert_weights(seed, e, hidden, ffn, dtype) for e in self.slots]
        self.w1 = nn.Parameter(torch.stack([w[0] for w in weights]))  # (slots, ffn, hidden)
        self.w3 = nn.Parameter(torch.stack([w[1] for w in weights]))  # (slots, ffn, hidden)
        self.w2 = nn.Parameter(torch.stack([w[2] for w in weights]))  # (slots, hidden, ffn)

    @staticmethod
    def _expert_weights(seed: int, expert: int, hidden: int, ffn: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """w1, w3, w2 of `expert`, the same on every rank that holds it."""
        gen = torch.Generator().manual_seed(seed * 100_003 + expert + 1)
        return [torch.randn(ffn, hidden, generator=gen, dtype=dtype) / hidden ** 0.5,
                torch.randn(ffn, hidden, generator=gen, dtype=dtype) / hidden ** 0.5,
                torch.randn(hidden, ffn, generator=gen, dtype=dtype) / ffn ** 0.5]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (tokens, hidden) of this rank; the routed experts' output for them."""
        probs = F.softmax(x @ self.router.t(), dim=-1)
        gates, experts = probs.topk(self.top_k, dim=-1)
        gates = gates / gates.sum(dim=-1, keepdim=True)
        everyone = _Gather.apply(x, self.group)
        all_gates = _Gather.apply(gates, self.group)
        all_experts = _Gather.apply(experts, self.group)  # integer: no gradient flows
        out = torch.zeros_like(everyone)
        me = dist.get_rank(self.group)
        for slot, expert in enumerate(self.slots):
            tokens, choice = (all_experts == expert).nonzero(as_tuple=True)  # copies in (token, choice) order
            replica = self.holders[expert].index(me)
            mine = torch.arange(len(tokens)) % len(self.holders[expert]) == replica
            tokens, choice = tokens[mine], choice[mine]
            h = everyone[tokens]
            y = (F.silu(h @ self.w1[slot].t()) * (h @ self.w3[slot].t())) @ self.w2[slot].t()
            out = out.index_add(0, tokens, y * all_gates[tokens, choice].unsqueeze(-1))
        total = _Sum.apply(out, self.group)
        rows = x.shape[0]
        return total[me * rows:(me + 1) * rows]

    @torch.no_grad()
    def sync_replica_grads(self) -> None:
        """Sum each replicated expert's gradients over its replicas (every rank calls it, in expert order)."""
        for expert in range(self.num_experts):
            holders = self.holders[expert]
            if len(holders) == 1:
                continue
            # one all-reduce over the whole group, zeros from ranks without the expert: gloo subgroups would
            # need one process group per holder set
            grads = [torch.zeros_like(self.w1[0]), torch.zeros_like(self.w3[0]), torch.zeros_like(self.w2[0])]
            if expert in self.slots:
                slot = self.slots.index(expert)
                grads = [self.w1.grad[slot].clone(), self.w3.grad[slot].clone(), self.w2.grad[slot].clone()]
            for grad in grads:
                dist.all_reduce(grad, group=self.group)
            if expert in self.slots:
                slot = self.slots.index(expert)
                self.w1.grad[slot], self.w3.grad[slot], self.w2.grad[slot] = grads

    @torch.no_grad()
    def sync_router_grads(self) -> None:
        """Sum the router's gradient over the group (every rank routed its own tokens)."""
        dist.all_reduce(self.router.grad, group=self.group)

    def expert_weights(self) -> dict[int, list[torch.Tensor]]:
        """This rank's experts' (w1, w3, w2) by expert id."""
        return {e: [self.w1[s].detach(), self.w3[s].detach(), self.w2[s].detach()] for s, e in enumerate(self.slots)}
