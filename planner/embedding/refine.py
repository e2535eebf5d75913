"""Local search on a placement: move single-rank units off the bottleneck ranks.

The relaxed program fixes every table's option; the greedy partitioner places
them by combined load, which can leave the slowest lookup rank and the
slowest sender on different, unbalanced ranks.  Here, while it helps, a
table- or column-wise unit on a rank that attains the lookup or the send
maximum moves to the rank where the step (max lookup + max of send and
receive) drops the most, within HBM and host-DRAM capacity.  Options do not
change, so receive times stay put.  Deterministic: ties break on rank order.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement
from planner.embedding.options import ALL_RANKS, ShardingType

MAX_MOVES = 4000
EPS = 1e-12


def _top3(values: list[float]) -> list[tuple[float, int]]:
    return heapq.nlargest(3, ((v, -r) for r, v in enumerate(values)))


def _max_without(top: list[tuple[float, int]], a: int, b: int, va: float, vb: float) -> float:
    rest = next((v for v, neg in top if -neg not in (a, b)), 0.0)
    return max(rest, va, vb)


class _State:
    def __init__(self, model: EmbeddingCostModel, placements: list[TablePlacement]):
        self.model = model
        sites, costs = model.sites, model.costs
        world = sites.world
        self.lookup, self.send, self.receive = [0.0] * world, [0.0] * world, [0.0] * world
        self.hbm_left = [model.hbm_budget(s.pool) for s in sites.ranks]
        self.host_left = [sites.host_capacity(n) for n in range(sites.num_nodes)]
        self.placements = {p.table: p for p in placements}
        self.on_rank: list[set[int]] = [set() for _ in range(world)]  # tables with a single-rank unit there
        for p in placements:
            single = p.option.kind not in ALL_RANKS and p.option.kind != ShardingType.TABLE_ROW_WISE
            for rank in p.ranks:
                site = sites.ranks[rank]
                unit = costs.unit(p.table, p.option, site.pool)
                if single:
                    self.on_rank[rank].add(p.table)
                self.lookup[rank] += unit.lookup_s
                self.send[rank] += unit.send_s
                self.hbm_left[rank] -= unit.hbm_bytes
                self.host_left[site.node] -= unit.host_bytes
            for site in sites.ranks:
                self.receive[site.rank] += costs.receive_s(p.table, p.option, site.pool)
        self.receive_max = max(self.receive)

    def step(self) -> float:
        return max(self.lookup) + max(max(self.send), self.receive_max)

    def movable_on(self, rank: int) -> list[TablePlacement]:
        """Single-rank units on `rank`, largest lookup + send first."""
        costs, pool = self.model.costs, self.model.sites.ranks[rank].pool

        def weight(p: TablePlacement) -> float:
            unit = costs.unit(p.table, p.option, pool)
            return unit.lookup_s + unit.send_s

        units = [self.placements[t] for t in self.on_rank[rank]]
        return sorted(units, key=lambda p: (-weight(p), p.table))

    def best_move(self) -> tuple[float, TablePlacement, int, int] | None:
        sites, costs = self.model.sites, self.model.costs
        now = self.step()
        top_l, top_s = _top3(self.lookup), _top3(self.send)
        sources = sorted({-top_l[0][1], -top_s[0][1]})
        best = None
        for a in sources:
            site_a = sites.ranks[a]
            for p in self.movable_on(a):
                ua = costs.unit(p.table, p.option, site_a.pool)
                for b in range(sites.world):
                    if b in p.ranks:
                        continue
                    site_b = sites.ranks[b]
                    ub = costs.unit(p.table, p.option, site_b.pool)
                    if ub.hbm_bytes > self.hbm_left[b]:
                        continue
                    if site_b.node != site_a.node and ub.host_bytes > self.host_left[site_b.node]:
                        continue
                    lookup = _max_without(top_l, a, b, self.lookup[a] - ua.lookup_s, self.lookup[b] + ub.lookup_s)
                    send = _max_without(top_s, a, b, self.send[a] - ua.send_s, self.send[b] + ub.send_s)
                    after = lookup + max(send, self.receive_max)
                    if after < now - EPS and (best is None or after < best[0] - EPS):
                        best = (after, p, a, b)
        return best

    def apply(self, p: TablePlacement, a: int, b: int) -> None:
        sites, costs = self.model.sites, self.model.costs
        site_a, site_b = sites.ranks[a], sites.ranks[b]
        ua, ub = costs.unit(p.table, p.option, site_a.pool), costs.unit(p.table, p.option, site_b.pool)
        self.lookup[a] -= ua.lookup_s
        self.send[a] -= ua.send_s
        self.hbm_left[a] += ua.hbm_bytes
        self.host_left[site_a.node] += ua.host_bytes
        self.lookup[b] += ub.lookup_s
        self.send[b] += ub.send_s
        self.hbm_left[b] -= ub.hbm_bytes
        self.host_left[site_b.node] -= ub.host_bytes
        ranks = tuple(sorted(b if r == a else r for r in p.ranks))
        self.placements[p.table] = replace(p, ranks=ranks)
        self.on_rank[a].discard(p.table)
        self.on_rank[b].add(p.table)


def refine(model: EmbeddingCostModel, placements: list[TablePlacement], max_moves: int = MAX_MOVES
           ) -> list[TablePlacement]:
    """A placement at least as fast as `placements` under the cost model (same options)."""
    state = _State(model, placements)
    for _ in range(max_moves):
        move = state.best_move()
        if move is None:
            break
        _, p, a, b = move
        state.apply(p, a, b)
    return [state.placements[t] for t in sorted(state.placements)]
