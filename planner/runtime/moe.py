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
    at least one (EPLB may put two replicas of an expert on one rank: each slot is a replica all the same)."""
    if len(ranks) != group_size:
        raise ValueError(f"placement has {len(ranks)} ranks, the expert-parallel group {group_size}")
    if len({len(slots) for slots in ranks}) != 1:
        raise ValueError("placement: every rank holds the same number of expert slots")
    for r, slots in enumerate(ranks):
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
        # replica i of expert e is slot holders[e][i] = (rank, slot index on that rank)
        self.holders = [[(r, s) for r, slots in enumerate(ranks) for s, x in enumerate(slots) if x == e]
                        for e in range(num_experts)]
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
        # tokens and gates travel in one gather: two would run their backward all-reduces in an order autograd
        # may choose differently on different ranks, pairing a token gradient with a gate gradient
        packed = _Gather.apply(torch.cat([x, gates], dim=-1), self.group)
        everyone, all_gates = packed[:, :x.shape[-1]], packed[:, x.shape[-1]:]
        all_experts = _Gather.apply(experts, self.group)  # integer: no gradient flows
        out = torch.zeros_like(everyone)
        me = dist.get_rank(self.group)
        for slot, expert in enumerate(self.slots):
            tokens, choice = (all_experts == expert).nonzero(as_tuple=True)  # copies in (token, choice) order
            replica = self.holders[expert].index((me, slot))
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
        params = (self.w1, self.w3, self.w2)
        for expert in range(self.num_experts):
            if len(self.holders[expert]) == 1:
                continue
            # one all-reduce over the whole group, zeros from ranks without the expert: gloo subgroups would
            # need one process group per holder set
            mine = [s for s, e in enumerate(self.slots) if e == expert]
            held = [p.grad for p in params]
            grads = [sum((g[s] for s in mine), torch.zeros_like(p[0])) if g is not None else torch.zeros_like(p[0])
                     for p, g in zip(params, held)]
            for grad in grads:
                dist.all_reduce(grad, group=self.group)
            for s in mine:
                for g, grad in zip(held, grads):
                    if g is not None:
                        g[s] = grad

    @torch.no_grad()
    def sync_router_grads(self) -> None:
        """Sum the router's gradient over the group (every rank routed its own tokens)."""
        dist.all_reduce(self.router.grad, group=self.group)

    def expert_weights(self) -> list[tuple[int, list[torch.Tensor]]]:
        """(expert id, [w1, w3, w2]) of each of this rank's slots, in slot order."""
        return [(e, [self.w1[s].detach(), self.w3[s].detach(), self.w2[s].detach()]) for s, e in enumerate(self.slots)]
