"""Exhaustive search over embedding shardings, for small jobs: the oracle of the program's tests.

Every table takes every option of the space and every placement of its units
(table-wise: each rank; column-wise: each set of k distinct ranks;
table-row-wise: each node; row-wise and data-parallel: all ranks), and every
combination is scored by `EmbeddingCostModel.evaluate`.  No tables, no program: an
independent path to the optimum of the same cost model.
"""

from __future__ import annotations

import itertools

from planner.embedding.evaluate import EmbeddingEstimate, EmbeddingCostModel, TablePlacement
from planner.embedding.options import ALL_RANKS, ShardingType, TableOption

MAX_COMBINATIONS = 2_000_000


def table_placements(model: EmbeddingCostModel, t: int, option: TableOption) -> list[TablePlacement]:
    """Every placement of table t under `option`."""
    sites = model.sites
    if option.kind in ALL_RANKS:
        return [TablePlacement(t, option, tuple(range(sites.world)))]
    if option.kind == ShardingType.TABLE_ROW_WISE:
        return [TablePlacement(t, option, tuple(ranks)) for ranks in sites.node_ranks]
    return [TablePlacement(t, option, ranks) for ranks in itertools.combinations(range(sites.world), option.shards)]


def exhaustive_sharding(model: EmbeddingCostModel, space: list[list[TableOption]]
                        ) -> tuple[EmbeddingEstimate, list[TablePlacement]] | None:
    """The fastest fitting sharding in `space` (first in enumeration order on ties), or None."""
    per_table = [[p for option in options for p in table_placements(model, t, option)]
                 for t, options in enumerate(space)]
    total = 1
    for choices in per_table:
        total *= len(choices)
    if total > MAX_COMBINATIONS:
        raise ValueError(f"{total} combinations: too many for the exhaustive search")
    best = None
    for combo in itertools.product(*per_table):
        estimate = model.evaluate(list(combo))
        if estimate.fits and (best is None or estimate.step_time_s < best[0].step_time_s):
            best = (estimate, list(combo))
    return best
