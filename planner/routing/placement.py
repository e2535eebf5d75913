"""Where the experts of a MoE layer sit on its expert-parallel ranks, and how busy that leaves the busiest one.

Three placements of the same loads on the same slots:

* contiguous: Megatron-Core's order, rank r holds experts r*E/ep .. (r+1)*E/ep - 1, no replicas;
* EPLB: DeepSeek's expert-parallel load balancer (deepseek-ai/EPLB eplb.py, re-implemented here from its
  published code, not called): replicate_experts gives each redundant slot to the expert with the largest
  load per replica, balanced_packing deals replicas heaviest first to the lightest rank with a free slot;
  the hierarchical policy first packs expert groups to nodes when the group count divides by the nodes;
* planner's program (CP-SAT): the replicas of the optimal replica counts (the greedy is exact for the
  largest load per replica) on distinct ranks, every rank filling its slots, minimising the busiest rank's
  load; a large neighbourhood search (the busiest rank and the lightest others per program, exact when they
  are all the ranks) warm-started from EPLB's global packing, its programs spent on the layers EPLB leaves
  busiest; the result is the best of it, EPLB and (without replicas) the contiguous order, so it is never
  worse than EPLB.  EPLB may put two replicas of an expert on one rank; planner's runtime accepts that.

A replicated expert's tokens split evenly among its replicas (the runtime deals them round-robin), so a
replica carries share / replicas.  The busiest rank's load over the mean (1 / ep) is the ratio the cost
model charges the routed experts' compute and the all-to-all with.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from planner.routing.stats import RoutingStats

# shares scaled to integers for CP-SAT: a millionth of the routed tokens is below any trace's precision
SHARE_SCALE = 1_000_000
# CP-SAT's deterministic time (about seconds of one core) for one neighbourhood's program; deterministic, on one
# worker, so that the same inputs give the same placement (principle 5)
ROUND_BUDGET = 0.02
# a neighbourhood's program has at most about this many placement variables (ranks^2 x slots per rank): DeepSeek-V3
# at ep 32 (9 slots) redeals 8 ranks, at ep 8 (36 slots) 4, each in hundredths of a second
NEIGHBOURHOOD_VARIABLES = 600
# a busiest rank within this share of the lower bound is balanced: traces are not more precise
TOLERANCE = 1e-3
ROUNDS = 4  # neighbourhoods per layer at most
# neighbourhood programs per expert-parallel degree, over all its layers (each at most ROUND_BUDGET): a
# DeepSeek-V3 trace of 58 layers places in seconds; the layers past the budget keep EPLB's global packing
PROGRAMS_PER_DEGREE = 16


@dataclass(frozen=True)
class ExpertPlacement:
    """Expert ids in each expert-parallel rank's slots (a replicated expert sits on several ranks)."""

    ranks: tuple[tuple[int, ...], ...]

    def counts(self, num_experts: int) -> list[int]:
        """Replicas of each expert."""
        out = [0] * num_experts
        for slots in self.ranks:
            for expert in slots:
                out[expert] += 1
        return out

    def rank_loads(self, shares: tuple[float, ...]) -> list[float]:
        """Share of the layer's routed copies each rank computes (a replica takes share / replicas)."""
        counts = self.counts(len(shares))
        return [sum(shares[e] / counts[e] for e in slots) for slots in self.ranks]

    def ratio(self, shares: tuple[float, ...]) -> float:
        """Busiest rank's load over the mean."""
        return max(self.rank_loads(shares)) * len(self.ranks)

    def replicated_slots(self, num_experts: int) -> int:
        """Most slots one rank gives to experts that have several replicas (their gradients are synced)."""
        counts = self.counts(num_experts)
        return max(sum(1 for e in slots if counts[e] > 1) for slots in self.ranks)


def contiguous(num_experts: int, ep: int) -> ExpertPlacement:
    """Megatron-Core's placement: rank r holds the r-th block of E / ep consecutive experts."""
    per = num_experts // ep
    return ExpertPlacement(tuple(tuple(range(r * per, (r + 1) * per)) for r in range(ep)))


def replicate(shares: tuple[float, ...], physical: int) -> list[int]:
    """EPLB's replicate_experts: replica counts for `physical` slots, each extra slot going to the expert with the
    largest load per replica (lowest id on ties); this minimises the largest load of any replica."""
    counts = [1] * len(shares)
    for expert in _replica_order(shares, physical)[len(shares):]:
        counts[expert] += 1
    return counts


def _replica_order(shares: tuple[float, ...], physical: int) -> list[int]:
    """EPLB's physical experts: the experts in id order, then each added replica in the order it was added."""
    counts, order = [1] * len(shares), list(range(len(shares)))
    for _ in range(physical - len(shares)):
        best = max(range(len(shares)), key=lambda e: (shares[e] / counts[e], -e))
        counts[best] += 1
        order.append(best)
    return order


def balanced_packing(weights: list[float], packs: int) -> list[int]:
    """EPLB's balanced_packing: items heaviest first (lowest index on ties), each to the lightest pack that has
    room for len(weights) / packs items (lowest pack on ties); the pack of each item."""
    per = len(weights) // packs
    room = [(0.0, p) for p in range(packs)]  # (load, pack) of the packs with a free slot: a heap
    items = [0] * packs
    out = [-1] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, pack = heapq.heappop(room)
        out[i], items[pack] = pack, items[pack] + 1
        if items[pack] < per:
            heapq.heappush(room, (load + weights[i], pack))
    return out


def _pack_replicas(shares: tuple[float, ...], counts: list[int], ep: int,
                   items: list[int] | None = None) -> ExpertPlacement:
    """The replicas of `counts` dealt to `ep` ranks by balanced_packing (`items`: the physical experts in
    EPLB's order, which breaks its ties; default each expert's replicas together)."""
    items = items if items is not None else [e for e, c in enumerate(counts) for _ in range(c)]
    packs = balanced_packing([shares[e] / counts[e] for e in items], ep)
    return ExpertPlacement(tuple(tuple(e for e, p in zip(items, packs) if p == r) for r in range(ep)))


def eplb(shares: tuple[float, ...], ep: int, physical: int, groups: int, nodes: int,
         pinned: tuple[int, ...] | None = None) -> ExpertPlacement:
    """DeepSeek EPLB's rebalance_experts for one layer: hierarchical when the expert groups divide among the
    nodes of the expert-parallel group, else global (pinned replica counts: global packing of those)."""
    if pinned is not None:
        return _pack_replicas(shares, list(pinned), ep)
    if nodes > 1 and groups % nodes == 0 and ep % nodes == 0:
        return _eplb_hierarchical(shares, ep, physical, groups, nodes)
    return _pack_eplb(shares, physical, ep)


def _pack_eplb(shares: tuple[float, ...], physical: int, ep: int) -> ExpertPlacement:
    """replicate_experts then balanced_packing, physical experts in EPLB's order."""
    order = _replica_order(shares, physical)
    return _pack_replicas(shares, replicate(shares, physical), ep, order)


def _eplb_hierarchical(shares: tuple[float, ...], ep: int, physical: int, groups: int,
                       nodes: int) -> ExpertPlacement:
    """EPLB's hierarchical policy: pack expert groups to nodes, replicate inside each node, pack each node's
    replicas to its GPUs."""
    size = len(shares) // groups
    group_load = [sum(shares[g * size:(g + 1) * size]) for g in range(groups)]
    group_node = balanced_packing(group_load, nodes)
    gpus_per_node = ep // nodes
    ranks: list[tuple[int, ...]] = []
    for node in range(nodes):
        # a node's experts in the order its groups were packed to it (EPLB's log2mlog), which breaks its ties
        mine = sorted((g for g in range(groups) if group_node[g] == node), key=lambda g: (-group_load[g], g))
        experts = [e for g in mine for e in range(g * size, (g + 1) * size)]
        local = tuple(shares[e] for e in experts)
        placed = _pack_eplb(local, physical // nodes, gpus_per_node)
        ranks.extend(tuple(experts[i] for i in slots) for slots in placed.ranks)
    return ExpertPlacement(tuple(ranks))


@dataclass
class Budget:
    """Neighbourhood programs left to one degree's layers (a count, so that the placement is deterministic)."""

    programs: int


def program(shares: tuple[float, ...], ep: int, counts: list[int], start: ExpertPlacement,
            budget: Budget | None = None) -> ExpertPlacement:
    """Each expert's `counts` replicas on distinct ranks of `ep` equal-slot ranks, the busiest rank's load
    minimised from `start`: a CP-SAT program over the busiest rank and the lightest others (all ranks when the
    layer is small, then the program is exact), repeated while the busiest rank gets lighter (large
    neighbourhood search: DeepSeek-V3's 256 experts on 32 ranks are 8,192 placement variables a layer)."""
    experts = range(len(shares))
    weight = [round(shares[e] / counts[e] * SHARE_SCALE) for e in experts]
    ranks = [list(slots) for slots in start.ranks]
    if len(ranks[0]) == 1:
        return start  # one slot a rank: every placement of these replicas has the same busiest rank
    # no rank is lighter than the mean, nor than the heaviest replica's rank with the lightest replicas beside it
    items = sorted(w for e in experts for w in [weight[e]] * counts[e])
    floor = max(-(-sum(items) // ep), items[-1] + sum(items[:len(ranks[0]) - 1]))
    budget = budget or Budget(ROUNDS)
    size = max(2, min(ep, math.isqrt(NEIGHBOURHOOD_VARIABLES // max(1, len(ranks[0])))))
    for _ in range(ROUNDS):
        if budget.programs <= 0:
            break
        budget.programs -= 1
        loads = [sum(weight[e] for e in slots) for slots in ranks]
        busiest = max(range(ep), key=lambda r: (loads[r], -r))
        if loads[busiest] <= floor * (1 + TOLERANCE):
            break
        others = sorted((r for r in range(ep) if r != busiest), key=lambda r: (loads[r], r))
        chosen = [busiest] + others[:size - 1]
        moved = _solve_ranks([ranks[r] for r in chosen], weight, ROUND_BUDGET)
        if moved is None or max(sum(weight[e] for e in slots) for slots in moved) >= loads[busiest]:
            break
        for r, slots in zip(chosen, moved):
            ranks[r] = slots
        if size == ep:
            break  # the program saw every rank: another round would solve the same program
    return ExpertPlacement(tuple(tuple(sorted(slots)) for slots in ranks))


def _solve_ranks(current: list[list[int]], weight: list[int], budget: float) -> list[list[int]] | None:
    """CP-SAT: the replicas now on these ranks redealt among them (each expert's on distinct ranks, every rank
    keeping its slot count), minimising the busiest of them; None when no solution is found in `budget`.

    Sections as OR-Tools' samples: data, variables, constraints, objective, hint, solve, read."""
    # imported here: the training runtime reads this module's schemas through plan.json, and CP-SAT (with the
    # pandas it loads) would add about 0.45 s of start-up to every rank of every launch
    from ortools.sat.python import cp_model

    # data: how many replicas of each expert these ranks hold, and each rank's slots
    held: dict[int, int] = {}
    for slots in current:
        for e in slots:
            held[e] = held.get(e, 0) + 1
    experts, ranks = sorted(held), range(len(current))
    total = sum(weight[e] * c for e, c in held.items())
    model = cp_model.CpModel()
    # variables: y[e, r] = 1 if a replica of expert e sits on rank r (of these ranks)
    y = {(e, r): model.new_bool_var(f"y_{e}_{r}") for e in experts for r in ranks}
    busiest = model.new_int_var(max(max(weight[e] for e in experts), -(-total // len(current))), total, "busiest")
    # constraints: each expert's replicas on distinct ranks, every rank full, the busiest bounds every rank
    for e in experts:
        model.add(sum(y[e, r] for r in ranks) == held[e])
    for r in ranks:
        model.add(sum(y[e, r] for e in experts) == len(current[r]))
        model.add(sum(weight[e] * y[e, r] for e in experts) <= busiest)
    # objective
    model.minimize(busiest)
    # hint: where the replicas are now
    for r in ranks:
        for e in set(current[r]):
            model.add_hint(y[e, r], True)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1  # with a deterministic time limit: the same placement on every run
    solver.parameters.max_deterministic_time = budget
    solver.parameters.random_seed = 0
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    # read the solution
    return [[e for e in experts if solver.boolean_value(y[e, r])] for r in ranks]


class LayerPlacement(BaseModel):
    """One traced MoE layer's placement."""

    model_config = ConfigDict(extra="forbid")
    layer: int = Field(description="Index among the model's MoE layers (a synthetic skew: 0, shared by all).")
    ranks: list[list[int]] = Field(description="Expert ids in each expert-parallel rank's slots, rank by rank.")
    max_load_ratio: float = Field(description="Busiest rank's routed copies over the mean, under this placement.")
    eplb_max_load_ratio: float = Field(description="The same under EPLB's placement.")
    contiguous_max_load_ratio: float = Field(description="The same under Megatron's contiguous placement.")


class PlacementSummary(BaseModel):
    """The placements of every traced layer for one expert-parallel degree, and what they cost."""

    model_config = ConfigDict(extra="forbid")
    ep: int = Field(description="Expert-parallel degree.")
    slots_per_rank: int = Field(description="Expert slots each rank holds (experts / ep + its redundant slots).")
    redundant_slots: int = Field(description="Redundant slots per layer used: the file's, less what ep does not "
                                 "divide evenly (none at ep = 1).")
    replicated_slots_per_rank: int = Field(description="Most slots of one rank holding replicated experts "
                                           "(their gradients are all-reduced among the replicas).")
    eplb_replicated_slots_per_rank: int = Field(description="The same under EPLB's placement.")
    eplb_policy: str = Field(description="EPLB's policy at this degree: hierarchical (groups packed to nodes) or "
                             "global.")
    max_load_ratio: float = Field(description="Busiest rank over the mean, averaged over the MoE layers (traced "
                                  "layers; untraced ones at their mean): what the cost model charges.")
    eplb_max_load_ratio: float = Field(description="The same for EPLB's placement on the same slots.")
    contiguous_max_load_ratio: float = Field(description="The same for Megatron's contiguous placement.")
    layers: list[LayerPlacement] = Field(description="Per traced layer: its placement and ratios.")


_CACHE: dict[tuple, PlacementSummary] = {}


def placement_summary(stats: RoutingStats, num_experts: int, ep: int, nodes: int) -> PlacementSummary:
    """Placements of every traced layer on `ep` ranks spanning `nodes` nodes (cached per inputs)."""
    key = (stats.key, num_experts, ep, nodes)
    if key not in _CACHE:
        _CACHE[key] = _summarise(stats, num_experts, ep, nodes)
    return _CACHE[key]


def usable_redundant(stats: RoutingStats, num_experts: int, ep: int) -> int:
    """Redundant slots per layer at degree ep: the most, up to the file's, that fill every rank equally (none
    at ep = 1, where a replica has no other rank to relieve)."""
    if ep == 1:
        return 0
    return stats.redundant_slots - (num_experts + stats.redundant_slots) % ep


def _summarise(stats: RoutingStats, num_experts: int, ep: int, nodes: int) -> PlacementSummary:
    shares_by_layer = stats.layer_shares(num_experts)
    pinned_by_layer = stats.layer_replicas()
    redundant = usable_redundant(stats, num_experts, ep)
    physical = num_experts + redundant
    hierarchical = nodes > 1 and stats.expert_groups % nodes == 0 and ep % nodes == 0
    # pinned counts for another slot total than this degree's: the degree chooses its own
    pins = [p if p is not None and sum(p) == physical else None for p in pinned_by_layer]
    eplb_placed = [eplb(shares, ep, physical, stats.expert_groups, nodes, pin)
                   for shares, pin in zip(shares_by_layer, pins)]
    # the programs go to the layers EPLB leaves busiest first (the cost model charges the mean ratio)
    order = sorted(range(len(shares_by_layer)), key=lambda i: (-eplb_placed[i].ratio(shares_by_layer[i]), i))
    budget = Budget(PROGRAMS_PER_DEGREE)
    ours = {i: _best(shares_by_layer[i], ep, physical, pins[i], eplb_placed[i], budget) for i in order}
    base = contiguous(num_experts, ep)
    layers = [LayerPlacement(layer=stats.layers[i].layer if stats.layers else 0,
                             ranks=[list(r) for r in ours[i].ranks], max_load_ratio=ours[i].ratio(shares),
                             eplb_max_load_ratio=eplb_placed[i].ratio(shares),
                             contiguous_max_load_ratio=base.ratio(shares))
              for i, shares in enumerate(shares_by_layer)]
    placed = [ours[i] for i in range(len(shares_by_layer))]

    def mean(field: str) -> float:
        return sum(getattr(p, field) for p in layers) / len(layers)

    return PlacementSummary(
        ep=ep, slots_per_rank=physical // ep, redundant_slots=redundant,
        replicated_slots_per_rank=max(p.replicated_slots(num_experts) for p in placed),
        eplb_replicated_slots_per_rank=max(p.replicated_slots(num_experts) for p in eplb_placed),
        eplb_policy="hierarchical" if hierarchical and not any(pinned_by_layer) else "global",
        max_load_ratio=mean("max_load_ratio"), eplb_max_load_ratio=mean("eplb_max_load_ratio"),
        contiguous_max_load_ratio=mean("contiguous_max_load_ratio"), layers=layers,
    )


def _best(shares: tuple[float, ...], ep: int, physical: int, pinned: tuple[int, ...] | None,
          theirs: ExpertPlacement, budget: Budget) -> ExpertPlacement:
    """Planner's placement of one layer: the program on the optimal replica counts, warm-started from EPLB's
    global packing of them; EPLB's own placement, or without replicas the contiguous one, where that is better."""
    if ep == 1:
        return theirs
    counts = list(pinned) if pinned is not None else replicate(shares, physical)
    start = _pack_replicas(shares, counts, ep)
    ours = program(shares, ep, counts, start, budget)
    candidates = [ours, start, theirs] + ([contiguous(len(shares), ep)] if physical == len(shares) else [])
    return min(candidates, key=lambda p: (p.ratio(shares), candidates.index(p)))
