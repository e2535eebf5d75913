"""A price-directed start for the relaxed program: per-table choices under caps and an HBM price.

CP-SAT finds the relaxed program's bound quickly (its LP is tight) but, with
hundreds of tables and tens of options each, is slow to find good plans.  This
heuristic gives it one: for caps U (one unit's lookup seconds) and V (one
unit's send seconds) and a price on HBM bytes, every table independently takes
the option of least (lookup work + send work) / ranks + receive + sync + price
x HBM bytes among those within the caps.  Caps run over quantiles of the
options' unit times, the price is bisected until the tables fit the summed HBM
(and host DRAM), and the choice with the least relaxed objective wins.  Pure
numpy over a [tables x options] table, deterministic.
"""

from __future__ import annotations

import numpy as np

from planner.embedding.cost import UnitCost
from planner.embedding.evaluate import EmbeddingModel
from planner.embedding.greedy import ALL_RANKS
from planner.embedding.options import ShardingType, TableOption

CAP_STEPS = 10
PRICE_STEPS = 12


class RelaxedCoefficients:
    """Coefficients of every (table, option) of the relaxed program, padded to a rectangle; per option
    the fastest and smallest over the pools, as the relaxed program takes them (a valid relaxation)."""

    def __init__(self, model: EmbeddingModel, space: list[list[TableOption]]):
        world = model.sites.world
        gpn = min(model.sites.node_spec(p).gpus_per_node for p in range(len(model.job.cluster.pools)))
        shape = (len(space), max(map(len, space)))
        self.valid = np.zeros(shape, dtype=bool)
        names = ("unit_lookup", "unit_send", "lookup", "send", "hbm", "everywhere", "host", "receive", "sync")
        for name in names:
            setattr(self, name, np.zeros(shape))
        costs = model.costs
        pools = range(len(model.job.cluster.pools))
        for t, options in enumerate(space):
            for i, option in enumerate(options):
                units = [costs.unit(t, option, p) for p in pools]
                unit = UnitCost(lookup_s=min(u.lookup_s for u in units), send_s=min(u.send_s for u in units),
                                hbm_bytes=min(u.hbm_bytes for u in units), host_bytes=min(u.host_bytes for u in units))
                spread = option.kind in ALL_RANKS
                count = world if spread else gpn if option.kind == ShardingType.TABLE_ROW_WISE else option.shards
                self.valid[t, i] = True
                self.unit_lookup[t, i] = 0.0 if spread else unit.lookup_s
                self.unit_send[t, i] = 0.0 if spread else unit.send_s
                self.lookup[t, i] = count * unit.lookup_s
                self.send[t, i] = count * unit.send_s
                self.hbm[t, i] = count * unit.hbm_bytes
                self.everywhere[t, i] = unit.hbm_bytes if spread else 0.0
                self.host[t, i] = count * unit.host_bytes
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


def price_directed_choice(model: EmbeddingModel, space: list[list[TableOption]]) -> dict[int, TableOption] | None:
    """The best choice the caps-and-price sweep finds that fits the summed capacities, or None."""
    table = RelaxedCoefficients(model, space)
    caps_l = np.unique(np.quantile(table.unit_lookup[table.valid], np.linspace(0.5, 1.0, CAP_STEPS)))
    caps_s = np.unique(np.quantile(table.unit_send[table.valid], np.linspace(0.5, 1.0, CAP_STEPS)))
    best: tuple[float, np.ndarray] | None = None
    scale = table.hbm[table.valid].max() / table.world or 1.0
    for cap_l in caps_l:
        for cap_s in caps_s:
            pick = table.pick(cap_l, cap_s, 0.0)
            value, fits = table.evaluate(pick)
            if not fits:
                # bisect the HBM price (seconds per byte) until the choice fits
                low, high = 0.0, 1.0 / scale
                fitting = None
                for _ in range(PRICE_STEPS):
                    trial = table.pick(cap_l, cap_s, high)
                    if table.evaluate(trial)[1]:
                        fitting = trial
                        break
                    high *= 10.0
                if fitting is None:
                    continue
                for _ in range(PRICE_STEPS):
                    mid = (low + high) / 2
                    trial = table.pick(cap_l, cap_s, mid)
                    if table.evaluate(trial)[1]:
                        high, fitting = mid, trial
                    else:
                        low = mid
                pick = fitting
                value, fits = table.evaluate(pick)
            if best is None or value < best[0]:
                best = (value, pick)
    if best is None:
        return None
    return {t: space[t][int(i)] for t, i in enumerate(best[1])}
