"""The per-table sharding plan file (`sharding_plan.json`): TorchRec's ParameterSharding, table by table.

One entry per table, keyed by the table's TorchRec name (`table_names`: `t_cat_<j>`, the
EmbeddingBagConfig names of TorchRec's DLRM on Criteo, torchrec_dlrm/dlrm_main.py, whose
feature names are torchrec.datasets.criteo.DEFAULT_CAT_NAMES `cat_<j>`), with TorchRec's fields:

* `sharding_type`: table_wise | column_wise | row_wise | table_row_wise | data_parallel;
* `compute_kernel`, a torchrec.distributed.embedding_types.EmbeddingComputeKernel value: `dense` for
  data_parallel replicas (the only kernel TorchRec offers there), `fused` for a shard kept in HBM,
  `fused_uvm_caching` for a shard in host DRAM with an HBM cache, `fused_uvm` for one in host DRAM
  without a cache;
* `ranks`: the ranks holding shards, in shard order;
* `sharding_spec`: the shards as ShardMetadata (shard_offsets [row, col], shard_sizes [rows, cols],
  placement "rank:R/cuda:L"); null for data_parallel, whose replicas are whole tables on every rank
  (TorchRec gives no spec there);
* `cache_params`: TorchRec CacheParams, `load_factor` the share of the shard's rows cached in HBM;
  null unless the kernel is fused_uvm_caching.

`rows`, `dim` and `expected_hit_rate` are planner's own (what the entry was costed for).
`planner.embedding.torchrec_plan` turns the file into TorchRec objects.  Row shards follow TorchRec's
even block split: ceil(rows / n) rows per shard, the last one shorter (or empty).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from planner.embedding.compile import EmbeddingCompileResult
from planner.embedding.options import ShardingType, TableOption, table_hit_rate
from planner.embedding.sites import JobSites

SCHEMA = "planner.sharding/2"

# compute kernels (TorchRec EmbeddingComputeKernel values) by where a table lives
DENSE, FUSED, FUSED_UVM, FUSED_UVM_CACHING = "dense", "fused", "fused_uvm", "fused_uvm_caching"


def table_names(count: int) -> list[str]:
    """TorchRec names of a DLRM's `count` tables, in table order (the model's table.<j> layers)."""
    return [f"t_cat_{j}" for j in range(count)]


def compute_kernel(kind: ShardingType, cache: float) -> str:
    """TorchRec's kernel for a table of sharding `kind` with `cache` of its rows in HBM."""
    if kind == ShardingType.DATA_PARALLEL:
        return DENSE
    if cache >= 1.0:
        return FUSED
    return FUSED_UVM if cache <= 0.0 else FUSED_UVM_CACHING


class ShardMetadata(BaseModel):
    """One shard: where it starts, its size and the device holding it."""

    model_config = ConfigDict(extra="forbid")
    shard_offsets: list[StrictInt] = Field(description="[first row, first column] of the shard in the table.")
    shard_sizes: list[StrictInt] = Field(description="[rows, columns] of the shard.")
    placement: str = Field(description="TorchRec placement string 'rank:R/cuda:L' (L: GPU index on its node).")


class CacheParams(BaseModel):
    """TorchRec CacheParams of a table kept in host DRAM with an HBM cache (the fields the plan decides)."""

    model_config = ConfigDict(extra="forbid")
    load_factor: float = Field(strict=True, allow_inf_nan=False,
                               description="Share of the shard's rows cached in HBM (CacheParams.load_factor).")


class ParameterSharding(BaseModel):
    """How one table is sharded (TorchRec ParameterSharding fields, plus the sizes they refer to)."""

    model_config = ConfigDict(extra="forbid")
    sharding_type: ShardingType = Field(description="TorchRec sharding type.")
    compute_kernel: str = Field(description="dense (data_parallel), fused (in HBM), fused_uvm_caching (host DRAM + "
                                "HBM cache) or fused_uvm (host DRAM).")
    ranks: list[StrictInt] = Field(description="Ranks holding shards, in shard order.")
    sharding_spec: list[ShardMetadata] | None = Field(description="The shards; null for data_parallel.")
    cache_params: CacheParams | None = Field(description="The HBM cache (fused_uvm_caching only), else null.")
    rows: int = Field(strict=True, description="Rows of the table.")
    dim: int = Field(strict=True, description="Embedding dimension.")
    expected_hit_rate: float = Field(strict=True, allow_inf_nan=False,
                                     description="Share of lookups the HBM cache serves (Zipf model, or the "
                                     "table's measured access histogram).")


def cache_fraction(entry: ParameterSharding) -> float:
    """The share of the entry's rows in HBM, as the cost model takes it: everything for dense and fused,
    none for fused_uvm, the cache's load factor for fused_uvm_caching."""
    if entry.compute_kernel == FUSED_UVM:
        return 0.0
    return entry.cache_params.load_factor if entry.cache_params is not None else 1.0


class ShardingPlanFile(BaseModel):
    """The whole file: world size and one entry per table."""

    model_config = ConfigDict(extra="forbid")
    schema_version: str = Field(SCHEMA, alias="schema", description="Format of this file.")
    model: str = Field(description="Model name.")
    world_size: int = Field(strict=True, description="Ranks of the job.")
    local_world_size: int = Field(strict=True, description="GPUs per node (of the first pool).")
    tables: dict[str, ParameterSharding] = Field(description="Per table, by TorchRec table name (table_names).")


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
    names = table_names(len(tables))
    entries = {}
    for choice in sorted(result.tables, key=lambda c: c.table):
        table = tables[choice.table]
        option = TableOption(choice.sharding_type, choice.column_shards, choice.cache_fraction)
        kernel = compute_kernel(choice.sharding_type, option.cache)
        entries[names[choice.table]] = ParameterSharding(
            sharding_type=choice.sharding_type, compute_kernel=kernel, ranks=choice.ranks,
            sharding_spec=expected_shards(choice.sharding_type, choice.ranks, choice.column_shards, table.rows,
                                          table.dim, sites),
            cache_params=CacheParams(load_factor=option.cache) if kernel == FUSED_UVM_CACHING else None,
            rows=table.rows, dim=table.dim,
            expected_hit_rate=table_hit_rate(table, option.cache),
        )
    return ShardingPlanFile(model=model_name, world_size=sites.world,
                            local_world_size=sites.node_spec(0).gpus_per_node, tables=entries)
