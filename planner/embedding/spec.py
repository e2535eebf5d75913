"""Embedding shardings a person writes: a uniform SPEC, or a sharding plan file.

`planner estimate` scores them with the same cost model the compiler uses:

* SPEC `sharding=row_wise,cache=0.2`: every table takes that option
  (sharding: table_wise, column_wise/K, row_wise, table_row_wise,
  data_parallel; cache: HBM fraction, default 1.0); table-, column- and
  table-row-wise units are placed by the greedy partitioner, or round-robin
  when they do not all fit (the report then says what overflows where).
* a `sharding_plan.json` (or the plan.json around one) of `compile -o`.
"""

from __future__ import annotations

from pathlib import Path

from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement, placement_ranks
from planner.embedding.greedy import partition
from planner.embedding.options import ShardingType, TableOption
from planner.embedding.plan_check import read_sharding_file
from planner.embedding.sharding_plan import cache_fraction, table_names
from planner.errors import PlannerInputError

_KINDS = {kind.value: kind for kind in ShardingType}


def parse_embedding_spec(spec: str) -> TableOption:
    """The option of a SPEC such as 'sharding=column_wise/4,cache=0.5'."""
    values = {"sharding": "table_wise", "cache": "1.0"}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or key not in values:
            raise PlannerInputError(f"strategy: {item!r}: recommendation models take sharding=TYPE[/K] and "
                                    f"cache=FRACTION (types: {', '.join(_KINDS)})")
        values[key] = raw.strip()
    kind_text, _, shards_text = values["sharding"].partition("/")
    if kind_text not in _KINDS:
        raise PlannerInputError(f"strategy: sharding: unknown type {kind_text!r}; known: {', '.join(_KINDS)}")
    kind = _KINDS[kind_text]
    try:
        shards = int(shards_text) if shards_text else (2 if kind == ShardingType.COLUMN_WISE else 1)
        cache = float(values["cache"])
    except ValueError:
        raise PlannerInputError("strategy: expected sharding=column_wise/<int> and cache=<float>, "
                                f"got {spec!r}") from None
    if (shards > 1) != (kind == ShardingType.COLUMN_WISE) or not 0.0 <= cache <= 1.0:
        raise PlannerInputError(f"strategy: {spec!r}: /K only with column_wise, cache between 0 and 1")
    if kind == ShardingType.DATA_PARALLEL and cache < 1.0:
        raise PlannerInputError("strategy: data_parallel replicas are whole tables in HBM (cache=1)")
    return TableOption(kind, shards, cache)


def uniform_placements(model: EmbeddingCostModel, option: TableOption) -> list[TablePlacement]:
    """Every table under `option`: placed greedily, or round-robin when the greedy placement overflows."""
    tables = range(len(model.costs.tables))
    for t in tables:
        if option.kind == ShardingType.COLUMN_WISE and model.costs.tables[t].dim % option.shards:
            raise PlannerInputError(f"strategy: column_wise/{option.shards}: table {t} has dim "
                                    f"{model.costs.tables[t].dim}, not a multiple")
    placed = partition(model, {t: option for t in tables})
    if placed is not None:
        return placed
    world, nodes = model.sites.world, model.sites.num_nodes
    out = []
    for t in tables:
        target: tuple[int, ...]
        if option.kind == ShardingType.TABLE_ROW_WISE:
            target = (t % nodes,)
        else:
            target = tuple((t * option.shards + j) % world for j in range(option.shards))
        out.append(TablePlacement(t, option, placement_ranks(option, model, target)))
    return out


def file_placements(model: EmbeddingCostModel, path: Path) -> list[TablePlacement]:
    """The placements of a sharding_plan.json (or a plan.json holding one), checked against the model and
    the cluster first (planner/embedding/plan_check.py: one line naming the file, table and field)."""
    names = table_names(len(model.costs.layers))  # the file keys tables by their TorchRec names
    plan = read_sharding_file(path, model.job.model.name, model.costs.tables, names, model.sites)
    index = {name: t for t, name in enumerate(names)}
    out = []
    for name, entry in plan.tables.items():
        shards = len(entry.ranks) if entry.sharding_type == ShardingType.COLUMN_WISE else 1
        cache = cache_fraction(entry)
        out.append(TablePlacement(index[name], TableOption(entry.sharding_type, shards, cache), tuple(entry.ranks)))
    return sorted(out, key=lambda p: p.table)
