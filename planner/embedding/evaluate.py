"""Score an embedding sharding: step time, per-rank load and memory in every tier.

The step of a recommendation model (TorchRec's train pipeline without
overlap, which keeps the estimate conservative):

    lookups (slowest rank, forward + backward)
  + all-to-all of ids, pooled outputs and their gradients (slowest sender or
    receiver, plus the per-message latencies)
  + dense compute (bottom/top MLPs and interaction, data parallel on B/W samples)
  + gradient all-reduce of the dense part and of data-parallel tables
  + the dense optimizer step.

Memory per rank: its units' HBM (cache rows, row-wise optimizer state, output
buffers) plus the dense part (model states, activations, pooled-vector
buffers) plus the reserve; per node: host DRAM of the units cached from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog, load_catalog
from hardware.collectives import all_reduce
from planner.cost.compute import layer_time
from planner.cost.memory import GRAD_BYTES, WEIGHT_BYTES
from planner.embedding.cost import CostTable
from planner.embedding.options import ALL_RANKS, ShardingType, TableOption
from planner.job import Job
from planner.strategy import Strategy

GB = 1e9


@dataclass(frozen=True)
class TablePlacement:
    """Where one table goes: its option and the ranks holding its units."""

    table: int
    option: TableOption
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class DenseCost:
    """The data-parallel dense part of one rank of a pool."""

    compute_s: float
    sync_s: float
    optimizer_s: float
    hbm_bytes: float  # model states, activations and pooled-vector buffers (before the reserve)


class RankLoad(BaseModel):
    """One rank's embedding work and HBM."""

    model_config = ConfigDict(extra="forbid")
    rank: int = Field(description="Global rank.")
    node: int = Field(description="Global node index.")
    tables: int = Field(description="Table units this rank holds.")
    lookup_s: float = Field(description="Forward + backward lookup seconds.")
    send_s: float = Field(description="Forward + backward all-to-all seconds as a holder of units.")
    receive_s: float = Field(description="Forward + backward all-to-all seconds receiving its samples' vectors.")
    hbm_bytes: float = Field(description="HBM in use at the peak, reserve included.")
    hbm_capacity: float = Field(description="HBM of the device.")


class NodeHost(BaseModel):
    """Host DRAM one node gives to embedding shards."""

    model_config = ConfigDict(extra="forbid")
    node: int = Field(description="Global node index.")
    host_bytes: float = Field(description="Bytes of shards held in host DRAM.")
    host_capacity: float = Field(description="Usable host DRAM.")


class EmbeddingBreakdown(BaseModel):
    """Seconds per step by term (their sum is the step)."""

    model_config = ConfigDict(extra="forbid")
    lookup_s: float = Field(description="Slowest rank's lookups, forward + backward.")
    all_to_all_s: float = Field(description="Slowest sender or receiver of the all-to-alls, plus latencies.")
    dense_compute_s: float = Field(description="MLPs and interaction, forward + backward.")
    dense_sync_s: float = Field(description="All-reduce of the dense gradients.")
    table_sync_s: float = Field(description="All-reduce of data-parallel tables' gradients.")
    optimizer_s: float = Field(description="Dense optimizer step.")


class EmbeddingEstimate(BaseModel):
    """The cost model's verdict on an embedding sharding."""

    model_config = ConfigDict(extra="forbid")
    step_time_s: float = Field(description="Seconds per optimizer step.")
    samples_per_s: float = Field(description="Samples per second, whole job.")
    samples_per_s_per_gpu: float = Field(description="Samples per second per GPU.")
    breakdown: EmbeddingBreakdown = Field(description="Step time by term.")
    fits: bool = Field(description="Every rank's HBM and every node's host DRAM hold what is placed there.")
    problems: list[str] = Field(description="What does not fit where, and by how much.")
    peak_hbm_bytes: float = Field(description="Largest HBM use of any rank.")
    peak_host_bytes: float = Field(description="Largest host DRAM use of any node.")
    ranks: list[RankLoad] = Field(description="Per-rank load and memory.")
    nodes: list[NodeHost] = Field(description="Per-node host DRAM.")


class EmbeddingCostModel:
    """The cost model of a recommendation job: unit costs plus the dense part."""

    def __init__(self, job: Job, catalog: Catalog | None = None):
        self.catalog = catalog or load_catalog()
        self.job = job
        self.costs = CostTable(job, self.catalog)
        self.sites = self.costs.sites

    @cached_property
    def dense(self) -> list[DenseCost]:
        """Dense cost of a rank of each pool."""
        job, c = self.job, self.catalog
        local = max(1, job.global_batch // self.sites.world)
        strategy = Strategy(mbs=local, dp=self.sites.world)
        dense_layers = [layer for layer in job.model.layers if layer.table is None]
        params = sum(layer.params for layer in dense_layers)
        sync = all_reduce(params * 4.0, self.costs.world_group, c)  # fp32 dense gradients over all ranks
        pooled = local * sum(t.dim for t in self.costs.tables) * c.constant("embedding_output_bytes_per_element")
        states = params * (WEIGHT_BYTES + GRAD_BYTES + c.constant("optimizer_bytes_per_param"))
        acts = sum(layer.saved_activation_bytes(local, job.seq_len) for layer in dense_layers)
        out = []
        for p in range(len(job.cluster.pools)):
            device = self.sites.device(p)
            times = [layer_time(layer, job, strategy, device, c, "none") for layer in dense_layers]
            compute = sum(t.forward + t.backward for t in times)
            optimizer = params * c.constant("optimizer_traffic_per_param") / (
                device.hbm_bandwidth * c.constant("hbm_efficiency"))
            out.append(DenseCost(compute_s=compute, sync_s=sync, optimizer_s=optimizer,
                                 hbm_bytes=states + acts + 2.0 * pooled))
        return out

    def hbm_budget(self, pool: int) -> float:
        """HBM bytes a rank of `pool` has left for embedding units (reserve and fragmentation taken)."""
        c = self.catalog
        capacity = (self.sites.device(pool).capacity_bytes * (1.0 - self.job.memory_margin)
                    - c.constant("memory_reserve_bytes"))
        return capacity / (1.0 + c.constant("memory_fragmentation")) - self.dense[pool].hbm_bytes

    @cached_property
    def slowest_dense(self) -> DenseCost:
        """The dense part of the slowest pool (it sets the step)."""
        return max(self.dense, key=lambda d: d.compute_s + d.sync_s + d.optimizer_s)

    def a2a_latency_s(self) -> float:
        """Latency of the step's all-to-alls: ids forward, pooled vectors forward, their gradients backward."""
        if self.sites.world == 1:
            return 0.0
        return 3.0 * max(self.sites.rates(p).a2a_latency for p in range(len(self.job.cluster.pools)))

    def fixed_seconds(self) -> float:
        """Step seconds no sharding choice changes: dense work of the slowest pool and a2a latencies."""
        d = self.slowest_dense
        return d.compute_s + d.sync_s + d.optimizer_s + self.a2a_latency_s()

    def evaluate(self, placements: list[TablePlacement]) -> EmbeddingEstimate:
        """Score `placements` (one per table) with this cost model."""
        sites, costs = self.sites, self.costs
        world = sites.world
        lookup, send, receive = [0.0] * world, [0.0] * world, [0.0] * world
        hbm, held = [0.0] * world, [0] * world
        host = [0.0] * sites.num_nodes
        table_sync = 0.0
        for placement in placements:
            option = placement.option
            if option.kind == ShardingType.DATA_PARALLEL:
                table_sync += costs.dp_sync_s(placement.table)
            for rank in placement.ranks:
                site = sites.ranks[rank]
                unit = costs.unit(placement.table, option, site.pool)
                lookup[rank] += unit.lookup_s
                send[rank] += unit.send_s
                hbm[rank] += unit.hbm_bytes
                host[site.node] += unit.host_bytes
                held[rank] += 1
            for site in sites.ranks:
                receive[site.rank] += costs.receive_s(placement.table, option, site.pool)
        c = self.catalog
        problems, rank_rows = [], []
        for site in sites.ranks:
            dense = self.dense[site.pool]
            allocated = hbm[site.rank] + dense.hbm_bytes
            total = allocated * (1.0 + c.constant("memory_fragmentation")) + c.constant("memory_reserve_bytes")
            capacity = sites.device(site.pool).capacity_bytes * (1.0 - self.job.memory_margin)  # less the margin
            if total > capacity:
                problems.append(f"rank {site.rank} (node {site.node}) needs {total / GB:.1f} GB of HBM, has "
                                f"{capacity / GB:.1f} GB (over by {(total - capacity) / GB:.1f} GB)")
            rank_rows.append(RankLoad(rank=site.rank, node=site.node, tables=held[site.rank],
                                      lookup_s=lookup[site.rank], send_s=send[site.rank],
                                      receive_s=receive[site.rank], hbm_bytes=total, hbm_capacity=capacity))
        node_rows = []
        for node in range(sites.num_nodes):
            capacity = sites.host_capacity(node)
            if host[node] > capacity:
                problems.append(f"node {node} needs {host[node] / GB:.1f} GB of host DRAM for cached tables, has "
                                f"{capacity / GB:.1f} GB usable (over by {(host[node] - capacity) / GB:.1f} GB)")
            node_rows.append(NodeHost(node=node, host_bytes=host[node], host_capacity=capacity))
        dense = self.slowest_dense
        breakdown = EmbeddingBreakdown(
            lookup_s=max(lookup), all_to_all_s=max(max(send), max(receive)) + self.a2a_latency_s(),
            dense_compute_s=dense.compute_s, dense_sync_s=dense.sync_s, table_sync_s=table_sync,
            optimizer_s=dense.optimizer_s,
        )
        step = sum(breakdown.model_dump().values())
        return EmbeddingEstimate(
            step_time_s=step, samples_per_s=self.job.global_batch / step,
            samples_per_s_per_gpu=self.job.global_batch / step / world, breakdown=breakdown,
            fits=not problems, problems=problems, peak_hbm_bytes=max(r.hbm_bytes for r in rank_rows),
            peak_host_bytes=max(host), ranks=rank_rows, nodes=node_rows,
        )


def placement_ranks(option: TableOption, model: EmbeddingCostModel, target: tuple[int, ...]) -> tuple[int, ...]:
    """Ranks holding units of a table under `option`: `target` is the ranks (table/column-wise) or
    a one-element tuple with the node (table-row-wise); row-wise and data-parallel use every rank."""
    if option.kind in ALL_RANKS:
        return tuple(range(model.sites.world))
    if option.kind == ShardingType.TABLE_ROW_WISE:
        return tuple(model.sites.node_ranks[target[0]])
    return target
