"""A greedy sharding planner in the style of TorchRec's, and the greedy partitioner the compiler reuses.

`greedy_torchrec_style` is this project's own greedy, NOT TorchRec's planner
(planner.compare.torchrec_baseline runs the real EmbeddingShardingPlanner): it
follows the shape of TorchRec's loop (torchrec/distributed/planner/planners.py)
over this project's cost model and option space.  Options per table are
ranked by estimated time (the sum over its units), HBM (`fused`) or UVM
caching at TorchRec's default cache_load_factor 0.2; the best option of
every table is proposed and the shards are partitioned largest first, each
onto the least-loaded rank that still has memory (after TorchRec's
GreedyPerfPartitioner); when a proposal does not partition, the table that
did not fit moves to its next option that needs less HBM.  It stops at the
first proposal that partitions.  Where it differs from TorchRec's planner:
one proposer instead of four (no grid search, no uniform proposals), this
project's option space (column shards of 32+ columns in 2, 4 or 8; TorchRec
splits columns at 128 by default), this project's cost model for the ranking,
and no storage reservation beyond the dense part (planner/compare/
torchrec_baseline.py measures the two side by side).
"""

from __future__ import annotations

from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement
from planner.embedding.options import ALL_RANKS, TORCHREC_CACHE_LEVELS, ShardingType, TableOption, table_options

MAX_RELIEFS = 200  # tables `place_choice` may move to a smaller option before it gives up


def option_perf(model: EmbeddingCostModel, t: int, option: TableOption) -> float:
    """The greedy's ranking key, as TorchRec ranks options: the total seconds over all its shards (first pool's
    rates)."""
    world = model.sites.world
    unit = model.costs.unit(t, option, 0)
    count = option.unit_count(world, model.sites.node_spec(0).gpus_per_node)
    sync = model.costs.dp_sync_s(t) if option.kind == ShardingType.DATA_PARALLEL else 0.0
    return count * (unit.lookup_s + unit.send_s) + world * model.costs.receive_s(t, option, 0) + sync


def option_hbm(model: EmbeddingCostModel, t: int, option: TableOption) -> float:
    """HBM bytes of one unit on a rank of the first pool."""
    return model.costs.unit(t, option, 0).hbm_bytes


class Partitioner:
    """Greedy placement of chosen options onto ranks under HBM and host-DRAM capacities."""

    def __init__(self, model: EmbeddingCostModel):
        self.model = model
        sites = model.sites
        self.pools = range(len(model.job.cluster.pools))
        self.load = [0.0] * sites.world
        self.hbm_left = [model.hbm_budget(site.pool) for site in sites.ranks]
        self.host_left = [sites.host_capacity(n) for n in range(sites.num_nodes)]
        self.failed: int | None = None  # the table that did not fit, after a failed partition

    def _fits(self, units: list, ranks: tuple[int, ...]) -> bool:
        sites = self.model.sites
        host: dict[int, float] = {}
        for rank in ranks:
            site = sites.ranks[rank]
            unit = units[site.pool]
            if unit.hbm_bytes > self.hbm_left[rank]:
                return False
            host[site.node] = host.get(site.node, 0.0) + unit.host_bytes
        return all(need <= self.host_left[node] for node, need in host.items())

    def _take(self, t: int, option: TableOption, units: list, ranks: tuple[int, ...]) -> TablePlacement:
        sites = self.model.sites
        for rank in ranks:
            site = sites.ranks[rank]
            unit = units[site.pool]
            self.load[rank] += unit.lookup_s + unit.send_s
            self.hbm_left[rank] -= unit.hbm_bytes
            self.host_left[site.node] -= unit.host_bytes
        return TablePlacement(t, option, tuple(sorted(ranks)))

    def place(self, t: int, option: TableOption) -> TablePlacement | None:
        """Put table `t` under `option` on the least-loaded ranks that hold it; None when nothing fits."""
        sites = self.model.sites
        units = [self.model.costs.unit(t, option, p) for p in self.pools]
        if option.kind in ALL_RANKS:
            ranks = tuple(range(sites.world))
            return self._take(t, option, units, ranks) if self._fits(units, ranks) else None
        if option.kind == ShardingType.TABLE_ROW_WISE:
            nodes = sorted(range(sites.num_nodes), key=lambda n: (max(self.load[r] for r in sites.node_ranks[n]), n))
            for node in nodes:
                ranks = tuple(sites.node_ranks[node])
                if self._fits(units, ranks):
                    return self._take(t, option, units, ranks)
            return None
        chosen: list[int] = []
        for rank in sorted(range(sites.world), key=lambda r: (self.load[r], r)):
            if self._fits(units, (rank,)):
                chosen.append(rank)  # column shards land on distinct ranks
                if len(chosen) == option.shards:
                    break
        if len(chosen) < option.shards:
            return None
        return self._take(t, option, units, tuple(chosen))


def partition(model: EmbeddingCostModel, choice: dict[int, TableOption], failed: list[int] | None = None
              ) -> list[TablePlacement] | None:
    """Place every table's chosen option, largest perf first (GreedyPerfPartitioner); None if any fails
    (its table is appended to `failed` when given)."""
    partitioner = Partitioner(model)
    perf = {t: option_perf(model, t, choice[t]) for t in choice}
    placements = []
    for t in sorted(choice, key=lambda t: (-perf[t], t)):
        placed = partitioner.place(t, choice[t])
        if placed is None:
            if failed is not None:
                failed.append(t)
            return None
        placements.append(placed)
    return sorted(placements, key=lambda p: p.table)


def place_choice(model: EmbeddingCostModel, space: list[list[TableOption]], choice: dict[int, TableOption],
                 max_reliefs: int = MAX_RELIEFS) -> list[TablePlacement] | None:
    """`partition` of a choice that fits the summed capacities but may not pack: while a table does not fit, it
    takes its fastest option of `space` that needs less HBM per unit (the greedy's relief, from this choice)."""
    choice = dict(choice)
    for _ in range(max_reliefs):
        failed: list[int] = []
        placed = partition(model, choice, failed)
        if placed is not None:
            return placed
        t = failed[0]
        now = option_hbm(model, t, choice[t])
        smaller = [o for o in space[t] if option_hbm(model, t, o) < now]
        if not smaller:
            return None
        choice[t] = min(smaller, key=lambda o: (option_perf(model, t, o), option_hbm(model, t, o), o))
    return None


def greedy_torchrec_style(model: EmbeddingCostModel, cache_levels: tuple[float, ...] = TORCHREC_CACHE_LEVELS
                          ) -> list[TablePlacement] | None:
    """The greedy plan (see the module docstring): best-time options, relieved one table at a time until they
    partition; None when no proposal partitions."""
    sites = model.sites
    gpn = sites.node_spec(0).gpus_per_node
    ranked: list[list[TableOption]] = []
    for t, table in enumerate(model.costs.tables):
        options = table_options(table, sites.world, gpn, cache_levels)
        ranked.append(sorted(options, key=lambda o: (option_perf(model, t, o), option_hbm(model, t, o), o)))
    position = [0] * len(ranked)
    for _ in range(sum(map(len, ranked)) + 1):
        choice = {t: ranked[t][position[t]] for t in range(len(ranked))}
        failed: list[int] = []
        placements = partition(model, choice, failed)
        if placements is not None:
            return placements
        # relieve storage: the table that did not fit moves to its next option that needs less HBM;
        # when it has none, the table with the most HBM per unit does
        t, step = failed[0], _relief(model, ranked, position, failed[0])
        if step is None:
            movable = [(-option_hbm(model, k, ranked[k][position[k]]), k, relief) for k in range(len(ranked))
                       if (relief := _relief(model, ranked, position, k)) is not None]
            if not movable:
                return None
            _, t, step = min(movable)
        position[t] = step
    return None


def _relief(model: EmbeddingCostModel, ranked: list[list[TableOption]], position: list[int], t: int) -> int | None:
    """Index of table t's next option (in perf order) that needs less HBM than its current one."""
    now = option_hbm(model, t, ranked[t][position[t]])
    return next((i for i in range(position[t] + 1, len(ranked[t])) if option_hbm(model, t, ranked[t][i]) < now), None)
