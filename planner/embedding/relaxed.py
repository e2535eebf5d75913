"""The relaxed sharding program's coefficients: per (table, option), what any placement must pay.

Per option, over the pools, the fastest unit times and the smallest unit sizes
(a valid relaxation on mixed clusters), times the option's unit count for the
totals; one-rank units also keep their own time (a unit sits on one rank
whole).  The relaxed CP-SAT program (program.py), its LP bound (bound.py) and
the price-directed start (heuristic.py) all read this one table.
"""

from __future__ import annotations

import numpy as np

from planner.embedding.evaluate import EmbeddingCostModel
from planner.embedding.options import ALL_RANKS, ShardingType, TableOption


class RelaxedCoefficients:
    """Coefficients of every (table, option) of the relaxed program, padded to a rectangle (`valid` marks
    the real entries); seconds, bytes, and the summed capacities they are held to."""

    def __init__(self, model: EmbeddingCostModel, space: list[list[TableOption]]):
        world = model.sites.world
        pools = range(len(model.job.cluster.pools))
        gpn = min(model.sites.node_spec(p).gpus_per_node for p in pools)
        shape = (len(space), max(map(len, space)))
        self.valid = np.zeros(shape, dtype=bool)
        # per (table, option): one unit's lookup and send seconds (0 for options on every rank), the summed
        # lookup and send seconds and HBM bytes of all its units, HBM bytes on every rank, host bytes, the
        # receive seconds and the data-parallel gradient sync seconds
        self.unit_lookup, self.unit_send = np.zeros(shape), np.zeros(shape)
        self.lookup, self.send, self.hbm = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.everywhere, self.host = np.zeros(shape), np.zeros(shape)
        self.receive, self.sync = np.zeros(shape), np.zeros(shape)
        costs = model.costs
        for t, options in enumerate(space):
            for i, option in enumerate(options):
                units = [costs.unit(t, option, p) for p in pools]
                lookup, send = min(u.lookup_s for u in units), min(u.send_s for u in units)
                hbm, host = min(u.hbm_bytes for u in units), min(u.host_bytes for u in units)
                spread = option.kind in ALL_RANKS
                count = option.unit_count(world, gpn)
                self.valid[t, i] = True
                self.unit_lookup[t, i] = 0.0 if spread else lookup
                self.unit_send[t, i] = 0.0 if spread else send
                self.lookup[t, i] = count * lookup
                self.send[t, i] = count * send
                self.hbm[t, i] = count * hbm
                self.everywhere[t, i] = hbm if spread else 0.0
                self.host[t, i] = count * host
                self.receive[t, i] = min(costs.receive_s(t, option, p) for p in pools)
                if option.kind == ShardingType.DATA_PARALLEL:
                    self.sync[t, i] = costs.dp_sync_s(t)
        self.world = world
        self.hbm_budget = sum(model.hbm_budget(s.pool) for s in model.sites.ranks)
        self.everywhere_budget = min(model.hbm_budget(s.pool) for s in model.sites.ranks)
        self.host_budget = sum(model.sites.host_capacity(n) for n in range(model.sites.num_nodes))

    def pick(self, cap_lookup: float, cap_send: float, price: float) -> np.ndarray:
        """Per table, the index of the cheapest option within the caps (the smallest unit when none is)."""
        base = (self.lookup + self.send) / self.world + self.receive + self.sync + price * self.hbm / self.world
        within = self.valid & (self.unit_lookup <= cap_lookup) & (self.unit_send <= cap_send)
        score = np.where(within, base, np.inf)
        fallback = np.where(self.valid, self.unit_lookup + self.unit_send, np.inf)
        none = ~within.any(axis=1)
        score[none] = fallback[none]
        return np.argmin(score, axis=1)

    def evaluate(self, pick: np.ndarray) -> tuple[float, bool]:
        """(relaxed objective, fits the summed capacities) of a choice."""
        rows = np.arange(len(pick))
        def take(a):
            return a[rows, pick]
        lookup = max(take(self.lookup).sum() / self.world, take(self.unit_lookup).max())
        comm = max(take(self.send).sum() / self.world, take(self.unit_send).max(), take(self.receive).sum())
        fits = (take(self.hbm).sum() <= self.hbm_budget and take(self.everywhere).sum() <= self.everywhere_budget
                and take(self.host).sum() <= self.host_budget)
        return lookup + comm + take(self.sync).sum(), bool(fits)
