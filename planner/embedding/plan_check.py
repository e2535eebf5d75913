"""Read a sharding plan file and check it against the model and the cluster it is scored on.

`planner estimate MODEL CLUSTER --sharding FILE` takes a `sharding_plan.json`
(or the plan.json of a recommendation model around one).  A file that the cost
model would score as something else than what it says, or could not score at
all, is refused with one line naming the file, the table and the field
(docs/design.md principle 6), e.g.::

    sharding_plan.json: tables[3] (t_cat_3) ranks: rank 9 out of range 0-7

The rules, one function each, in the order they run:

* the whole file: its schema tag, the model's name, world_size and
  local_world_size of the cluster, and exactly the model's tables;
* each table: rows and dim as in the model; ranks not empty and in range;
  ranks laid out as the type needs (table_wise: one rank; row_wise and
  data_parallel: every rank once; table_row_wise: the ranks of one node);
  column_wise shards that divide the dimension; cache_params with a
  load_factor strictly between 0 and 1, and none on a data-parallel replica;
  the compute_kernel TorchRec offers for the type and cache (dense for
  data_parallel, else fused, fused_uvm_caching with cache_params, or
  fused_uvm); the sharding_spec TorchRec's even split gives; an
  expected_hit_rate between 0 and 1.

A table's rules stop at its first problem; the message gives the first
problem of the file and how many more there are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from models.errors import ModelInputError
from models.graph import EmbeddingTable
from models.spec import read_text
from planner.embedding.options import ShardingType
from planner.embedding.plan_doc import SCHEMA as PLAN_SCHEMA  # a plan.json: the sharding sits under `sharding`
from planner.embedding.sharding_plan import (DENSE, FUSED, FUSED_UVM, FUSED_UVM_CACHING, SCHEMA, ParameterSharding,
                                             ShardingPlanFile, expected_shards)
from planner.embedding.sites import JobSites
from planner.errors import PlannerInputError

KERNELS = (DENSE, FUSED, FUSED_UVM_CACHING, FUSED_UVM)  # TorchRec EmbeddingComputeKernel values a file may name
_SHOWN_PROBLEMS = 1  # problems spelled out in the message; the rest are counted


@dataclass(frozen=True)
class TableEntry:
    """One table of the file with what it is checked against."""

    name: str
    entry: ParameterSharding
    table: EmbeddingTable
    sites: JobSites

    @property
    def world(self) -> int:
        return self.sites.world


Problem = tuple[str, str]  # (field, message)


def _shown(value: Any, width: int = 24) -> str:
    """A value of the file as the message shows it: cut short when a hand edit made it huge."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."


# ---------------------------------------------------------------- reading


def _read(path: Path) -> Any:
    try:
        text = read_text(path, "sharding plan")  # size cap, UTF-8, not a directory
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise PlannerInputError(f"{path}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except ValueError as err:  # e.g. an integer too long to convert
        raise PlannerInputError(f"{path}: not valid JSON: {err}") from None


def _section(path: Path, document: Any) -> tuple[Any, str]:
    """The sharding plan inside `document` and the prefix of its fields in messages."""
    if not isinstance(document, dict):
        raise PlannerInputError(f"{path}: not a sharding plan (expected a JSON object, got {type(document).__name__})")
    if "sharding" in document or document.get("schema") == PLAN_SCHEMA:
        section = document.get("sharding")
        if not isinstance(section, dict):
            raise PlannerInputError(f"{path}: sharding: expected the sharding plan object (a plan.json of a "
                                    "recommendation model holds one)")
        return section, "sharding."
    return document, ""


def _check_schema(section: dict) -> Problem | None:
    """`schema`, when given, is this format's tag (a dense plan.json is not a sharding plan)."""
    tag = section.get("schema", SCHEMA)
    if tag != SCHEMA:
        return "schema", (f"{_shown(tag)}, expected {SCHEMA!r} (a sharding_plan.json, or the plan.json of a "
                          "recommendation model)")
    return None


def _table_label(name: str, order: dict[str, int]) -> str:
    label = name if len(name) <= 40 else f"{name[:37]}..."
    return f"tables[{order[name]}] ({label})"


def _location(loc: tuple[Any, ...], order: dict[str, int]) -> str:
    """A pydantic location as 'tables[3] (t_cat_3) sharding_spec[1].placement'."""
    out, parts = "", list(loc)
    if len(parts) >= 2 and parts[0] == "tables" and isinstance(parts[1], str):
        out = _table_label(parts[1], order) + (" " if len(parts) > 2 else "")
        parts = parts[2:]
        rest = ""
        for part in parts:
            rest += f"[{part}]" if isinstance(part, int) else (f".{part}" if rest else str(part))
        return out + rest
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validate(path: Path, section: dict, prefix: str, order: dict[str, int]) -> ShardingPlanFile:
    try:
        return ShardingPlanFile.model_validate(section)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            message = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
            problems.append((_location(tuple(e["loc"]), order), message))
        raise _error(path, prefix, problems) from None


def _error(path: Path, prefix: str, problems: list[Problem]) -> PlannerInputError:
    shown = "; ".join(f"{prefix}{where}: {message}" if where else message
                      for where, message in problems[:_SHOWN_PROBLEMS])
    more = len(problems) - _SHOWN_PROBLEMS
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else ""
    return PlannerInputError(f"{path}: {shown}{tail}")


# ---------------------------------------------------------------- the whole file


def _check_model(plan: ShardingPlanFile, model_name: str) -> Problem | None:
    if plan.model != model_name:
        return "model", f"{_shown(plan.model)} in the file, but the model is {model_name!r}"
    return None


def _check_world_size(plan: ShardingPlanFile, sites: JobSites) -> Problem | None:
    if plan.world_size != sites.world:
        return "world_size", f"{_shown(plan.world_size)} in the file, but the cluster has {sites.world} ranks"
    return None


def _check_local_world_size(plan: ShardingPlanFile, sites: JobSites) -> Problem | None:
    gpus = sites.node_spec(0).gpus_per_node
    if plan.local_world_size != gpus:
        return "local_world_size", (f"{_shown(plan.local_world_size)} in the file, but the cluster's nodes have "
                                    f"{gpus} GPUs")
    return None


def _check_table_names(plan: ShardingPlanFile, names: list[str]) -> Problem | None:
    missing = [n for n in names if n not in plan.tables]
    unknown = [n for n in plan.tables if n not in names]
    if not missing and not unknown:
        return None
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if unknown:
        parts.append(f"not tables of the model: {', '.join(_shown(n) for n in unknown[:5])}"
                     f"{' ...' if len(unknown) > 5 else ''}")
    return "tables", f"{'; '.join(parts)} (the model has {len(names)} tables: {_span(names)})"


def _span(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{names[0]} ... {names[-1]}"


# ---------------------------------------------------------------- one table


def _check_sizes(t: TableEntry) -> Problem | None:
    """rows and dim are the model's: a plan for another table would be scored as this one."""
    for field, value, want in (("rows", t.entry.rows, t.table.rows), ("dim", t.entry.dim, t.table.dim)):
        if value != want:
            return field, f"{_shown(value)} in the file, but the model's table has {want}"
    return None


def _check_ranks_in_range(t: TableEntry) -> Problem | None:
    ranks = t.entry.ranks
    if not ranks:
        return "ranks", "empty: a table needs at least one rank"
    bad = next((r for r in ranks if not 0 <= r < t.world), None)
    if bad is not None:
        return "ranks", f"rank {_shown(bad)} out of range 0-{t.world - 1}"
    return None


def _check_ranks_layout(t: TableEntry) -> Problem | None:
    """The ranks a sharding type needs: one (table_wise), all (row_wise, data_parallel), one node's
    (table_row_wise); column_wise takes any ranks, one per column shard."""
    kind, ranks, world = t.entry.sharding_type, t.entry.ranks, t.world
    if kind == ShardingType.TABLE_WISE and len(ranks) != 1:
        return "ranks", f"table_wise puts the whole table on one rank, got {len(ranks)} ranks"
    if kind in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL):
        if sorted(ranks) != list(range(world)):
            return "ranks", f"{kind} spans every rank once (0-{world - 1}), got {_ranks_text(ranks)}"
    if kind == ShardingType.TABLE_ROW_WISE:
        node = t.sites.ranks[ranks[0]].node
        members = t.sites.node_ranks[node]
        if sorted(ranks) != members:
            nodes = sorted({t.sites.ranks[r].node for r in ranks})
            where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {', '.join(map(str, nodes))}"
            return "ranks", (f"table_row_wise spans the GPUs of one node once (node {node}: {_ranks_text(members)}), "
                             f"got {_ranks_text(ranks)} on {where}")
    return None


def _ranks_text(ranks: list[int], shown: int = 8) -> str:
    head = ", ".join(_shown(r) for r in ranks[:shown])
    return f"ranks [{head}{', ...' if len(ranks) > shown else ''}]"


def _check_column_split(t: TableEntry) -> Problem | None:
    shards = len(t.entry.ranks)
    if t.entry.sharding_type == ShardingType.COLUMN_WISE and t.table.dim % shards:
        return "ranks", f"column_wise with {shards} shards does not divide dim {t.table.dim}"
    return None


def _check_cache(t: TableEntry) -> Problem | None:
    """cache_params.load_factor: the share of a shard's rows cached in HBM, strictly between 0 and 1 (0 is
    fused_uvm, 1 is fused); a data-parallel replica is whole in HBM (TorchRec gives it no cache)."""
    if t.entry.cache_params is None:
        return None
    factor = t.entry.cache_params.load_factor
    if not (math.isfinite(factor) and 0.0 < factor < 1.0):
        return "cache_params.load_factor", (f"{_shown(factor)} is not a fraction between 0 and 1 (no cache: "
                                            "fused_uvm; all in HBM: fused)")
    if t.entry.sharding_type == ShardingType.DATA_PARALLEL:
        return "cache_params", "data_parallel replicas are whole tables in HBM: no cache (null)"
    return None


def _check_kernel(t: TableEntry) -> Problem | None:
    """compute_kernel is one TorchRec offers for the type and agrees with the cache: dense for a
    data-parallel replica (its only kernel there); fused (in HBM), fused_uvm_caching (host DRAM with the
    HBM cache of cache_params) or fused_uvm (host DRAM, no cache) for a sharded table."""
    kernel, cached = t.entry.compute_kernel, t.entry.cache_params is not None
    if kernel not in KERNELS:
        return "compute_kernel", f"{_shown(kernel)}; known: {', '.join(KERNELS)}"
    replica = t.entry.sharding_type == ShardingType.DATA_PARALLEL
    if replica and kernel != DENSE:
        return "compute_kernel", f"{kernel}: data_parallel replicas take dense (TorchRec's only kernel for them)"
    if not replica and kernel == DENSE:
        return "compute_kernel", (f"dense is for data_parallel tables; {t.entry.sharding_type} takes {FUSED}, "
                                  f"{FUSED_UVM_CACHING} or {FUSED_UVM}")
    if kernel == FUSED_UVM_CACHING and not cached:
        return "compute_kernel", f"{FUSED_UVM_CACHING} needs cache_params (the HBM share of the rows)"
    if kernel != FUSED_UVM_CACHING and cached:
        return "compute_kernel", (f"{kernel} keeps no HBM cache, but cache_params are given: use "
                                  f"{FUSED_UVM_CACHING}, or drop them")
    return None


def _check_sharding_spec(t: TableEntry) -> Problem | None:
    """The shards are the ones TorchRec's even split of this type over these ranks gives (what the
    cost model scores and the runtime loads)."""
    kind, ranks, spec = t.entry.sharding_type, t.entry.ranks, t.entry.sharding_spec
    want = expected_shards(kind, ranks, len(ranks), t.table.rows, t.table.dim, t.sites)
    if want is None:
        return None if spec is None else ("sharding_spec", "data_parallel replicas have none (null): every rank "
                                          "holds the whole table")
    if spec is None:
        return "sharding_spec", f"null, but {kind} needs its {len(want)} shard(s)"
    if len(spec) != len(want):
        return "sharding_spec", f"{len(spec)} shards for {len(ranks)} ranks"
    for j, (got, expected) in enumerate(zip(spec, want)):
        for field in ("placement", "shard_offsets", "shard_sizes"):
            if getattr(got, field) != getattr(expected, field):
                return f"sharding_spec[{j}].{field}", (f"{_shown(getattr(got, field), 40)}, expected "
                                                       f"{getattr(expected, field)!r} "
                                                       f"({kind} of {t.table.rows} x {t.table.dim} on ranks {ranks})")
    return None


def _check_hit_rate(t: TableEntry) -> Problem | None:
    rate = t.entry.expected_hit_rate
    if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
        return "expected_hit_rate", f"{_shown(rate)} is not a share between 0 and 1"
    return None


TABLE_RULES: tuple[Callable[[TableEntry], Problem | None], ...] = (
    _check_sizes, _check_ranks_in_range, _check_ranks_layout, _check_column_split, _check_cache, _check_kernel,
    _check_sharding_spec, _check_hit_rate,
)


# ---------------------------------------------------------------- entry point


def read_sharding_file(path: Path, model_name: str, tables: list[EmbeddingTable], names: list[str],
                       sites: JobSites) -> ShardingPlanFile:
    """The sharding plan in `path`, checked against the model (its name, `tables` with layer `names`)
    and the cluster's `sites`; PlannerInputError `FILE: field: what is wrong` on the first problem."""
    path = Path(path)
    section, prefix = _section(path, _read(path))
    problem = _check_schema(section)
    if problem:
        raise _error(path, prefix, [problem])
    index = {name: i for i, name in enumerate(names)}
    raw_tables = section.get("tables")
    order = dict(index)
    if isinstance(raw_tables, dict):
        for position, name in enumerate(raw_tables):
            order.setdefault(name, position)
    plan = _validate(path, section, prefix, order)
    file_rules = (_check_model(plan, model_name), _check_world_size(plan, sites), _check_local_world_size(plan, sites),
                  _check_table_names(plan, names))
    problems = [p for p in file_rules if p is not None]
    if problems:
        raise _error(path, prefix, problems)
    for name, entry in sorted(plan.tables.items(), key=lambda item: index[item[0]]):
        checked = TableEntry(name, entry, tables[index[name]], sites)
        for rule in TABLE_RULES:
            problem = rule(checked)
            if problem is not None:
                field, message = problem
                problems.append((f"{_table_label(name, order)} {field}", message))
                break
    if problems:
        raise _error(path, prefix, problems)
    return plan
