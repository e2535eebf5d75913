"""Where a token's routed copies go: the expected number of distinct ranks and nodes among its top_k experts.

A node-deduplicating dispatcher (DeepEP, HybridEP: hardware/data/dispatchers.yaml) sends a token across the
fabric once per distinct destination node and over NVLink once per distinct destination rank, so its bytes
scale with these counts, not with top_k.  Experts sit on the ep ranks in contiguous blocks (Megatron's
local experts: rank r holds experts r*E/ep .. (r+1)*E/ep - 1), and ranks fill nodes in order.

Routing is taken as uniform: a token's top_k experts are a uniform k-subset of the experts it may use.  Under
group-limited routing (Megatron --moe-router-num-groups G / --moe-router-group-topk g, DeepSeek-V3's
node-limited routing: G = 8, g = 4, arXiv 2412.19437 Sec. 2.1.2) those are the experts of g of the G contiguous
groups, the g groups themselves uniform.  A unit (rank or node) holding m of the c usable experts is missed
with probability C(c - m, k) / C(c, k) (hypergeometric), so the expected number of units reached is the sum
over units of one minus that.  The busiest rank's extra load under learned routing is priced apart
(`planner.cost.compute.expert_load_ratio`).
"""

from __future__ import annotations

from math import comb

from models.graph import MoEShape


def expected_destinations(units: int, moe: MoEShape) -> float:
    """Expected distinct units reached by one token's top_k experts, the experts split evenly over `units`
    contiguous units (ep ranks, or the nodes they span).  Groups and units that do not nest (neither count
    divides the other) are priced without the group limit, the larger count."""
    experts, k = moe.num_experts, moe.top_k
    groups, chosen = moe.router_groups, moe.router_group_topk
    if units <= 1:
        return 1.0
    if groups == 1 or chosen == groups or (groups % units and units % groups):
        return units * _reach(experts, experts // units, k)
    usable = chosen * experts // groups  # the experts of the token's chosen groups
    # a unit holds `per_unit` groups' worth (units nest in groups: one group, overlap experts/units)
    per_unit, overlap = (groups // units, experts // groups) if groups >= units else (1, experts // units)
    hit = 0.0
    for j in range(0, min(per_unit, chosen) + 1):  # j of the unit's groups among the chosen ones
        p_groups = comb(per_unit, j) * comb(groups - per_unit, chosen - j) / comb(groups, chosen)
        if p_groups and j:
            hit += p_groups * _reach(usable, j * overlap, k)
    return units * hit


def _reach(pool: int, held: int, k: int) -> float:
    """Probability that a uniform k-subset of `pool` experts includes one of the `held` ones."""
    return 1.0 - comb(pool - held, k) / comb(pool, k)
