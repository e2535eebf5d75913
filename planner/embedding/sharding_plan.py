"""The per-table sharding plan file (`sharding_plan.json`), close to TorchRec's ParameterSharding.

One entry per table, keyed by its layer name, with TorchRec's field names:

* `sharding_type`: table_wise | column_wise | row_wise | table_row_wise | data_parallel;
* `compute_kernel`: fused (whole shard in HBM) or fused_uvm_caching (host DRAM
  with an HBM cache), as in torchrec.distributed.embedding_types.EmbeddingComputeKernel;
* `ranks`: the ranks holding shards, in shard order;
* `sharding_spec`: the shards as ShardMetadata (shard_offsets [row, col],
  shard_sizes [rows, cols], placement "rank:R/cuda:L"); null for data_parallel,
  whose replicas are whole tables on every rank (TorchRec gives no spec there);
* `cache_load_factor`: the HBM cache fraction (CacheParams.load_factor), null when fused.

A TorchRec user builds `ParameterSharding(sharding_type=..., compute_kernel=...,
ranks=..., sharding_spec=EnumerableShardingSpec([ShardMetadata(**s) ...]),
cache_params=CacheParams(load_factor=...))` from each entry.  Row shards follow
TorchRec's even block split: ceil(rows / n) rows per shard, the last one shorter.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from planner.embedding.compile import EmbeddingCompileResult
from planner.embedding.options import ShardingType, TableOption, table_hit_rate
from planner.embedding.sites import JobSites

SCHEMA = "planner.sharding/1"


class ShardMetadata(BaseModel):
    """One shard: where it starts, its size and the device holding it."""

    model_config = ConfigDict(extra="forbid")
    shard_offsets: list[int] = Field(description="[first row, first column] of the shard in the table.")
    shard_sizes: list[int] = Field(description="[rows, columns] of the shard.")
    placement: str = Field(description="TorchRec placement string 'rank:R/cuda:L' (L: GPU index on its node).")


class ParameterSharding(BaseModel):
    """How one table is sharded (TorchRec ParameterSharding fields, plus the sizes they refer to)."""

    model_config = ConfigDict(extra="forbid")
    sharding_type: ShardingType = Field(description="TorchRec sharding type.")
    compute_kernel: str = Field(description="fused (in HBM) or fused_uvm_caching (host DRAM + HBM cache).")
    ranks: list[int] = Field(description="Ranks holding shards, in shard order.")
    sharding_spec: list[ShardMetadata] | None = Field(description="The shards; null for data_parallel.")
    cache_load_factor: float | None = Field(description="HBM cache fraction; null when the table is in HBM.")
    rows: int = Field(description="Rows of the table.")
    dim: int = Field(description="Embedding dimension.")
    expected_hit_rate: float = Field(description="Share of lookups the HBM cache serves (Zipf model, or the "
                                     "table's measured access histogram).")


class ShardingPlanFile(BaseModel):
    """The whole file: world size and one entry per table."""

    model_config = ConfigDict(extra="forbid")
    schema_version: str = Field(SCHEMA, alias="schema", description="Format of this file.")
    model: str = Field(description="Model name.")
    world_size: int = Field(description="Ranks of the job.")
    local_world_size: int = Field(description="GPUs per node (of the first pool).")
    tables: dict[str, ParameterSharding] = Field(description="Per table, by layer name.")


def _row_blocks(rows: int, parts: int) -> list[tuple[int, int]]:
    block = math.ceil(rows / parts)
    return [(min(rows, i * block), max(0, min(block, rows - i * block))) for i in range(parts)]


def expected_shards(kind: ShardingType, ranks: list[int], column_shards: int, rows: int, dim: int,
                    sites: JobSites) -> list[ShardMetadata] | None:
    """The shards of a table of `rows` x `dim` under `kind` on `ranks` (in shard order), as TorchRec splits
    them: column_wise `column_shards` equal column blocks, row_wise and table_row_wise even row blocks,
    table_wise the whole table; None for data_parallel."""
    def place(rank: int) -> str:
        return f"rank:{rank}/cuda:{sites.ranks[rank].local}"

    if kind == ShardingType.DATA_PARALLEL:
        return None
    if kind == ShardingType.COLUMN_WISE:
        width = dim // column_shards
        return [ShardMetadata(shard_offsets=[0, j * width], shard_sizes=[rows, width], placement=place(r))
                for j, r in enumerate(ranks)]
    if kind == ShardingType.TABLE_WISE:
        return [ShardMetadata(shard_offsets=[0, 0], shard_sizes=[rows, dim], placement=place(ranks[0]))]
    blocks = _row_blocks(rows, len(ranks))
    return [ShardMetadata(shard_offsets=[start, 0], shard_sizes=[size, dim], placement=place(r))
            for (start, size), r in zip(blocks, ranks)]


def sharding_plan(result: EmbeddingCompileResult, model_name: str, tables: list, sites: JobSites
                  ) -> ShardingPlanFile:
    """The sharding plan file of a compile result (`tables`: the model's EmbeddingTables in order)."""
    entries = {}
    for choice in result.tables:
        table = tables[choice.table]
        option = TableOption(choice.sharding_type, choice.column_shards, choice.cache_fraction)
        entries[choice.name] = ParameterSharding(
            sharding_type=choice.sharding_type, compute_kernel=option.compute_kernel, ranks=choice.ranks,
            sharding_spec=expected_shards(choice.sharding_type, choice.ranks, choice.column_shards, table.rows,
                                          table.dim, sites),
            cache_load_factor=None if option.cache >= 1.0 else option.cache,
            rows=table.rows, dim=table.dim,
            expected_hit_rate=table_hit_rate(table, option.cache),
        )
    return ShardingPlanFile(model=model_name, world_size=sites.world,
                            local_world_size=sites.node_spec(0).gpus_per_node, tables=entries)
