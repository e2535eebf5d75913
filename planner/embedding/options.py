"""Sharding options of one embedding table: how it is split and how much of it HBM caches.

The sharding types are TorchRec's (torchrec/distributed/types.py ShardingType):

* table_wise: the whole table on one rank;
* column_wise: the embedding dimension split into k equal shards, each on one rank;
* row_wise: rows split evenly over every rank (pooled partial sums reduce-scattered);
* table_row_wise: rows split over the GPUs of one node;
* data_parallel: a full replica on every rank, gradients all-reduced.

The cache fraction is the share of a shard's rows kept in HBM.  1.0 is
TorchRec's `fused` kernel (all in HBM); below 1.0 the shard lives in host DRAM
and HBM caches its hottest rows (TorchRec's `fused_uvm_caching` with that
cache_load_factor, ScaleFreeCTR's MixCache).  Under Zipf(alpha) access the hit
rate of caching the k hottest of N rows is H(k, alpha) / H(N, alpha) (docs/embedding.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from models.graph import EmbeddingTable

# Cache fractions the compiler chooses among (1.0 = everything in HBM, 0.0 = pure host lookups); they
# include TorchRec's levels, so the greedy baseline's plan is always in the compiler's space.
CACHE_LEVELS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.01, 0.0)
# TorchRec's planner enumerates fused (HBM) and fused_uvm_caching at its default cache_load_factor 0.2
# (torchrec/distributed/planner/constants.py, enumerators.py); the greedy baseline keeps to those.
TORCHREC_CACHE_LEVELS = (1.0, 0.2)
# Column shards narrower than this waste the row gathers (TorchRec's column shards are >= 32 wide in practice).
MIN_COLUMN_WIDTH = 32
COLUMN_SHARDS = (2, 4, 8)
# Terms of the generalised harmonic number summed exactly before the Euler-Maclaurin tail.
_EXACT_TERMS = 500


class ShardingType(StrEnum):
    """How a table's rows and columns are split over ranks."""

    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    DATA_PARALLEL = "data_parallel"


# Types that put a unit on every rank (row shards, or whole replicas).
ALL_RANKS = (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL)


@dataclass(frozen=True, order=True)
class TableOption:
    """One choice for one table: sharding type, column shards and HBM cache fraction."""

    kind: ShardingType
    shards: int = 1  # column shards for column_wise, 1 otherwise
    cache: float = 1.0  # fraction of rows in HBM; the rest stays in host DRAM

    @property
    def compute_kernel(self) -> str:
        """TorchRec's compute kernel for this option."""
        return "fused" if self.cache >= 1.0 else "fused_uvm_caching"

    def unit_count(self, world: int, gpus_per_node: int) -> int:
        """Ranks holding a unit of a table under this option (table-row-wise: the GPUs of one node)."""
        if self.kind in ALL_RANKS:
            return world
        if self.kind == ShardingType.TABLE_ROW_WISE:
            return gpus_per_node
        return self.shards

    def label(self) -> str:
        """Short text, e.g. 'column_wise/4 cache 0.25'."""
        kind = f"{self.kind}/{self.shards}" if self.kind == ShardingType.COLUMN_WISE else str(self.kind)
        return kind if self.cache >= 1.0 else f"{kind} cache {self.cache:g}"


def _harmonic_tail(start: float, end: float, alpha: float) -> float:
    """Integral of x^-alpha from start to end (the Euler-Maclaurin bulk of a harmonic sum)."""
    if abs(alpha - 1.0) < 1e-12:
        return math.log(end / start)
    return (end ** (1.0 - alpha) - start ** (1.0 - alpha)) / (1.0 - alpha)


@lru_cache(maxsize=4096)
def generalized_harmonic(n: int, alpha: float) -> float:
    """H(n, alpha) = sum_{i=1..n} i^-alpha: exact for the first terms, integral tail with midpoint ends."""
    if n <= 0:
        return 0.0
    head = min(n, _EXACT_TERMS)
    total = math.fsum(i ** -alpha for i in range(1, head + 1))
    if n > head:
        total += _harmonic_tail(head + 0.5, n + 0.5, alpha)
    return total


def zipf_hit_rate(cache_fraction: float, rows: int, alpha: float) -> float:
    """Share of lookups served by caching the hottest `cache_fraction` of `rows` rows under Zipf(alpha)."""
    if cache_fraction >= 1.0:
        return 1.0
    cached = int(cache_fraction * rows)
    if cached <= 0:
        return 0.0
    return generalized_harmonic(cached, alpha) / generalized_harmonic(rows, alpha)


def table_hit_rate(table: EmbeddingTable, cache_fraction: float) -> float:
    """Share of a table's lookups an HBM cache of its hottest `cache_fraction` of rows serves: from its
    measured access histogram when it has one (buckets hottest first, linear inside a bucket), else Zipf."""
    if table.access_histogram is None or cache_fraction >= 1.0 or cache_fraction <= 0.0:
        return zipf_hit_rate(cache_fraction, table.rows, table.zipf_alpha)
    counts = sorted(table.access_histogram, reverse=True)
    covered = cache_fraction * len(counts)
    whole = int(covered)
    served = math.fsum(counts[:whole]) + (covered - whole) * (counts[whole] if whole < len(counts) else 0.0)
    return served / math.fsum(counts)


def table_options(table: EmbeddingTable, world: int, gpus_per_node: int,
                  cache_levels: tuple[float, ...] = CACHE_LEVELS) -> list[TableOption]:
    """Every option the space holds for `table` on `world` ranks, nodes of `gpus_per_node`.

    Data parallel keeps the table whole in HBM on every rank, so it has no cache
    level; types that need more ranks than the job has are left out.
    """
    kinds: list[tuple[ShardingType, int]] = [(ShardingType.TABLE_WISE, 1)]
    kinds += [(ShardingType.COLUMN_WISE, k) for k in COLUMN_SHARDS
              if k <= world and table.dim % k == 0 and table.dim // k >= MIN_COLUMN_WIDTH]
    if world > 1:
        kinds.append((ShardingType.ROW_WISE, 1))
    if 1 < gpus_per_node < world:
        kinds.append((ShardingType.TABLE_ROW_WISE, 1))
    options = [TableOption(kind, shards, cache) for kind, shards in kinds for cache in cache_levels]
    if world > 1:
        options.append(TableOption(ShardingType.DATA_PARALLEL))
    return options
