"""What one shard of an embedding table costs the rank that holds it.

A table under an option becomes units: the shards that land on one rank each
(table_wise: 1 on a chosen rank; column_wise: k on k chosen ranks; row_wise:
one on every rank; table_row_wise: one on each GPU of a chosen node;
data_parallel: a full replica on every rank).  Per unit, per pool:

* lookup seconds, forward plus backward: rows read = lookups x unit width x
  element bytes, hits at the HBM gather rate, misses (1 - hit rate) at the
  host gather rate every GPU of the node shares; backward (gradient scatter
  and the fused row-wise optimizer) costs `embedding_backward_ratio` times the
  forward (TorchRec's planner uses the same multiplier).
* send seconds, forward plus backward, of the rank holding the unit: pooled
  outputs (table/column-wise: all B samples, scattered to their owners),
  partial sums (row-wise: reduce-scattered over all ranks; table-row-wise:
  reduce-scattered inside the node, then scattered), and the lookup ids it
  receives.  Backward moves the output gradients back over the same links.
* receive seconds every rank pays for its own B/W samples of the table's
  pooled output (and their gradients).
* HBM bytes (cached rows, their row-wise optimizer state when the whole table
  is in HBM, the pooled-output buffer) and host DRAM bytes (the whole shard
  with its optimizer state when HBM only caches it: FBGEMM's UVM caching keeps
  the full table in host memory).
* data-parallel sync seconds: a replica's fp32 gradient all-reduce.

The table of these numbers is shared by `evaluate_sharding`, the greedy
baseline and the CP-SAT program.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from hardware import Catalog
from hardware.collectives import CommGroup, all_reduce
from models.graph import EmbeddingTable, Layer, LayerKind
from planner.embedding.options import ShardingType, TableOption, table_hit_rate
from planner.cost.layout import comm_group
from planner.embedding.sites import JobSites
from planner.job import Job


@dataclass(frozen=True)
class UnitCost:
    """One unit of a table on one rank of a pool."""

    lookup_s: float  # forward + backward lookups
    send_s: float  # forward + backward traffic of the holder
    hbm_bytes: float
    host_bytes: float


def embedding_tables(job: Job) -> list[tuple[Layer, EmbeddingTable]]:
    """The embedding-bag layers of the model with their tables, in model order."""
    return [(layer, layer.table) for layer in job.model.layers
            if layer.kind == LayerKind.EMBEDDING_BAG and layer.table is not None]


class CostTable:
    """Unit costs of every (table, option, pool), computed once per job."""

    def __init__(self, job: Job, catalog: Catalog):
        self.job = job
        self.catalog = catalog
        self.sites = JobSites(job.cluster, catalog)
        self.tables = [table for _, table in embedding_tables(job)]
        self.layers = [layer for layer, _ in embedding_tables(job)]
        self._units: dict[tuple[int, TableOption, int], UnitCost] = {}
        self._syncs: dict[int, float] = {}
        self._out = catalog.constant("embedding_output_bytes_per_element")
        self._ids = catalog.constant("embedding_index_bytes")

    @property
    def local_batch(self) -> float:
        """Samples per rank."""
        return self.job.global_batch / self.sites.world

    def unit(self, t: int, option: TableOption, pool: int) -> UnitCost:
        """Cost of one unit of table `t` under `option` on a rank of pool index `pool`."""
        key = (t, option, pool)
        if key not in self._units:
            self._units[key] = self._unit(t, option, pool)
        return self._units[key]

    def _unit(self, t: int, option: TableOption, pool: int) -> UnitCost:
        table, c = self.tables[t], self.catalog
        rates, sites = self.sites.rates(pool), self.sites
        world, g = sites.world, sites.node_spec(pool).gpus_per_node
        batch, kind = float(self.job.global_batch), option.kind
        width = table.dim // option.shards
        rows: float = table.rows
        if kind == ShardingType.ROW_WISE:
            rows, lookups = rows / world, batch * table.pooling_factor / world
        elif kind == ShardingType.TABLE_ROW_WISE:
            rows, lookups = rows / g, batch * table.pooling_factor / g
        elif kind == ShardingType.DATA_PARALLEL:
            lookups = self.local_batch * table.pooling_factor
        else:
            lookups = batch * table.pooling_factor
        hit = table_hit_rate(table, option.cache)
        read = lookups * width * table.bytes_per_element
        forward = read * (hit / rates.hbm_lookup + (1.0 - hit) / rates.host_lookup)
        lookup_s = forward * (1.0 + c.constant("embedding_backward_ratio"))

        pooled = batch * table.dim * self._out  # all B samples' pooled vectors of the whole table
        ids = lookups * self._ids
        scatter, intra = rates.scatter_s_per_byte, rates.intra_s_per_byte
        if kind in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
            send_s = 2.0 * scatter * pooled / option.shards + scatter * ids
        elif kind == ShardingType.ROW_WISE:
            send_s = 2.0 * scatter * pooled + scatter * ids
        elif kind == ShardingType.TABLE_ROW_WISE:
            send_s = 2.0 * (intra * pooled * (g - 1) / g + scatter * pooled / g) + scatter * ids
        else:
            send_s = 0.0  # replicas look up their own samples

        row_bytes = width * table.bytes_per_element
        opt_bytes = c.constant("embedding_optimizer_bytes_per_row")
        if kind == ShardingType.DATA_PARALLEL:
            hbm, host = rows * (row_bytes + opt_bytes), 0.0
        else:
            buffer = pooled / option.shards  # the unit's pooled outputs (or partial sums) before they leave
            if option.cache >= 1.0:
                hbm, host = rows * (row_bytes + opt_bytes) + buffer, 0.0
            else:
                hbm, host = int(option.cache * rows) * row_bytes + buffer, rows * (row_bytes + opt_bytes)
        return UnitCost(lookup_s=lookup_s, send_s=send_s, hbm_bytes=hbm, host_bytes=host)

    def receive_s(self, t: int, option: TableOption, pool: int) -> float:
        """Forward + backward seconds every rank of `pool` spends receiving its samples of table `t`."""
        if option.kind == ShardingType.DATA_PARALLEL:
            return 0.0
        table = self.tables[t]
        rates = self.sites.rates(pool)
        if option.kind == ShardingType.ROW_WISE:
            # reduce-scatter: every rank receives a (W-1)/W share of the partial sums
            received = self.job.global_batch * table.dim * self._out
        else:
            received = self.local_batch * table.dim * self._out
        return 2.0 * rates.scatter_s_per_byte * received

    def dp_sync_s(self, t: int) -> float:
        """Seconds to all-reduce the fp32 gradients of a data-parallel replica of table `t`."""
        if t not in self._syncs:
            table = self.tables[t]
            self._syncs[t] = all_reduce(table.rows * table.dim * 4.0, self.world_group, self.catalog)
        return self._syncs[t]

    @cached_property
    def world_group(self) -> CommGroup:
        """All ranks (the data-parallel group of the dense part)."""
        cluster = self.job.cluster
        return comm_group(cluster, tuple(cluster.pools), self.sites.world, 1)
