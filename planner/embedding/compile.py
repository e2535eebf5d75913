"""Compile a recommendation job: the sharding and caching plan of its tables, with a certificate.

1. The TorchRec-style greedy plan (greedy.py): the baseline, and a candidate.
2. The option space: every table's options (options.py) whose single unit fits
   some rank's HBM and some node's host DRAM.
3. A price-directed choice of options (heuristic.py), placed by the greedy
   partitioner and improved by local search (refine.py): a candidate, and the
   hint of the relaxed program.
4. The relaxed program's LP bound (bound.py, GLOP) and the relaxed CP-SAT
   program (program.py): its options, placed and refined, are a candidate; the
   stronger of the two bounds holds for every plan.
5. When its placement variables are few enough (EXACT_PLACEMENT_LIMIT), the
   exact program, hinted with the best plan so far; its bound replaces the
   others when stronger.
The returned plan is the best of all candidates under `evaluate`, so never
worse than the baseline; OPTIMAL means the exact program proved it.
"""

from __future__ import annotations

import math
import time as clock
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog
from planner.embedding.evaluate import GB, EmbeddingEstimate, EmbeddingCostModel, TablePlacement
from planner.embedding.greedy import partition, torchrec_greedy
from planner.embedding.bound import lp_bound
from planner.embedding.heuristic import price_directed_choice
from planner.embedding.relaxed import RelaxedCoefficients
from planner.embedding.refine import refine
from planner.embedding.options import CACHE_LEVELS, ShardingType, TableOption, table_options
from planner.embedding.program import ShardingProgram
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job

# Above this many rank/node placement variables the relaxed program runs instead of the exact one.
EXACT_PLACEMENT_LIMIT = 20_000
# CP-SAT deterministic work the exact program may spend (it proves small jobs in far less; on a
# node of 8 ranks with 26 tables it improves the relaxed plan by a few percent and stops here).
EXACT_WORK = 5.0
# CP-SAT deterministic work of the relaxed program (on hundreds of tables the price-directed start and
# the GLOP bound carry the result; on tens of tables CP-SAT proves the relaxed optimum well within it).
RELAXED_WORK = 5.0
EmbeddingStrategyName = Literal["planner", "torchrec-greedy"]


class TableChoice(BaseModel):
    """One table's sharding in a compiled plan."""

    model_config = ConfigDict(extra="forbid")
    table: int = Field(description="Index of the table among the model's embedding bags.")
    name: str = Field(description="Layer name of the table.")
    sharding_type: ShardingType = Field(description="TorchRec sharding type.")
    column_shards: int = Field(description="Column shards (column_wise), 1 otherwise.")
    cache_fraction: float = Field(description="Share of rows cached in HBM; 1.0: the whole table in HBM.")
    ranks: list[int] = Field(description="Ranks holding its shards.")


class EmbeddingCertificate(BaseModel):
    """How good the returned sharding is known to be."""

    model_config = ConfigDict(extra="forbid")
    status: str = Field(description="OPTIMAL (proved), FEASIBLE (see gap) or BASELINE (the greedy plan, "
                        "no search).")
    form: str = Field(description="exact (options and placement) or relaxed (options; greedy placement).")
    objective: float = Field(description="Step seconds of the plan.")
    bound: float = Field(description="No sharding in the space is faster than this.")
    gap: float = Field(description="(objective - bound) / objective.")
    wall_s: float = Field(description="Compile wall time, seconds.")
    tables: int = Field(description="Tables planned.")
    options: int = Field(description="Table options in the space.")


class EmbeddingCompileResult(BaseModel):
    """The chosen sharding, its estimate, the certificate and the baseline's estimate."""

    model_config = ConfigDict(extra="forbid")
    strategy: EmbeddingStrategyName = Field(description="Who planned it: the compiler or the greedy baseline.")
    tables: list[TableChoice] = Field(description="Per-table sharding.")
    estimate: EmbeddingEstimate = Field(description="The cost model's evaluation of the plan.")
    certificate: EmbeddingCertificate
    baseline: EmbeddingEstimate | None = Field(description="The TorchRec-style greedy plan's evaluation "
                                               "(None when it finds no plan that fits).")


def placements_of(result: EmbeddingCompileResult) -> list[TablePlacement]:
    """The result's tables as placements for `EmbeddingCostModel.evaluate`."""
    return [TablePlacement(c.table, TableOption(c.sharding_type, c.column_shards, c.cache_fraction), tuple(c.ranks))
            for c in result.tables]


def space_options(model: EmbeddingCostModel) -> list[list[TableOption]]:
    """Every table's options whose single unit fits some rank's HBM and some node's host DRAM."""
    sites = model.sites
    pools = range(len(model.job.cluster.pools))
    gpn = min(sites.node_spec(p).gpus_per_node for p in pools)
    best_hbm = max(model.hbm_budget(p) for p in pools)
    best_host = max(sites.host_capacity(n) for n in range(sites.num_nodes))
    space = []
    for t, table in enumerate(model.costs.tables):
        options = []
        for option in table_options(table, sites.world, gpn, CACHE_LEVELS):
            unit = min((model.costs.unit(t, option, p) for p in pools), key=lambda u: u.hbm_bytes)
            per_node = unit.host_bytes * (gpn if option.kind != ShardingType.TABLE_WISE else 1)
            if unit.hbm_bytes <= best_hbm and per_node <= best_host:
                options.append(option)
        if not options:
            raise InfeasibleError(_table_infeasible(model, t, best_hbm, best_host))
        space.append(options)
    return space


def _table_infeasible(model: EmbeddingCostModel, t: int, hbm: float, host: float) -> str:
    table = model.costs.tables[t]
    size = table.rows * table.dim * table.bytes_per_element
    return (f"{model.costs.layers[t].name} ({table.rows:,} rows x {table.dim}, {size / GB:.1f} GB) fits no "
            f"option: a rank has {hbm / GB:.1f} GB of HBM left for tables and a node {host / GB:.1f} GB of host "
            f"DRAM; add nodes (row-wise sharding spreads it) or GPUs with more memory")


def _choices(model: EmbeddingCostModel, placements: list[TablePlacement]) -> list[TableChoice]:
    return [TableChoice(table=p.table, name=model.costs.layers[p.table].name, sharding_type=p.option.kind,
                        column_shards=p.option.shards, cache_fraction=p.option.cache, ranks=list(p.ranks))
            for p in sorted(placements, key=lambda p: p.table)]


def _placement_variables(model: EmbeddingCostModel, space: list[list[TableOption]]) -> int:
    per = {ShardingType.TABLE_WISE: model.sites.world, ShardingType.COLUMN_WISE: model.sites.world,
           ShardingType.TABLE_ROW_WISE: model.sites.num_nodes}
    return sum(per.get(o.kind, 0) for options in space for o in options)


def _not_fitting(model: EmbeddingCostModel, space: list[list[TableOption]]) -> str:
    gpn = model.sites.node_spec(0).gpus_per_node
    smallest_hbm = sum(min(model.costs.unit(t, o, 0).hbm_bytes * o.unit_count(model.sites.world, gpn) for o in opts)
                       for t, opts in enumerate(space))
    budget = sum(model.hbm_budget(s.pool) for s in model.sites.ranks)
    host = sum(model.sites.host_capacity(n) for n in range(model.sites.num_nodes))
    return (f"no sharding of the {len(space)} tables fits: with every table cached at its smallest HBM option "
            f"they still need {smallest_hbm / GB:.1f} GB of HBM of the {budget / GB:.1f} GB the ranks have left "
            f"after the dense part, with {host / GB:.1f} GB of host DRAM for the rest; add nodes")


def compile_embedding(job: Job, *, strategy: EmbeddingStrategyName = "planner", time_limit: float = 60.0,
                      catalog: Catalog | None = None,
                      progress: Callable[[str], None] | None = None) -> EmbeddingCompileResult:
    """Plan the tables of a recommendation job (see the module docstring)."""
    start = clock.perf_counter()
    model = EmbeddingCostModel(job, catalog)
    world = model.sites.world
    if not model.costs.tables:
        raise PlannerInputError(f"model {job.model.name} has no embedding tables to shard")
    if job.global_batch % world:
        raise PlannerInputError(f"--batch ({job.global_batch}) must be a multiple of the {world} ranks "
                                "(every rank runs the dense part on an equal share)")
    fixed = model.fixed_seconds()
    greedy = torchrec_greedy(model)
    baseline = model.evaluate(greedy) if greedy is not None else None
    if strategy == "torchrec-greedy":
        if greedy is None or not baseline.fits:
            raise InfeasibleError("the TorchRec-style greedy planner finds no sharding that fits")
        return _result(model, "torchrec-greedy", greedy, baseline, "BASELINE", "greedy", baseline.step_time_s,
                       start, 0)
    space = space_options(model)
    # every candidate plan with its evaluation, scored once; greedy's is the baseline's
    candidates: list[tuple[list[TablePlacement], EmbeddingEstimate]] = [] if greedy is None else [(greedy, baseline)]

    def consider(placements: list[TablePlacement] | None) -> None:
        if placements is not None:
            candidates.append((placements, model.evaluate(placements)))

    def best_fitting() -> tuple[list[TablePlacement], EmbeddingEstimate] | None:
        fitting = [(e.step_time_s, i) for i, (_, e) in enumerate(candidates) if e.fits]
        return candidates[min(fitting)[1]] if fitting else None

    coefficients = RelaxedCoefficients(model, space)
    start_choice = price_directed_choice(coefficients, space)
    relaxed = ShardingProgram(model, space, relaxed=True, coefficients=coefficients)
    if start_choice is not None:
        placed = partition(model, start_choice)
        consider(refine(model, placed) if placed is not None else None)
        relaxed.hint([TablePlacement(t, o, ()) for t, o in sorted(start_choice.items())])
    elif greedy is not None:
        relaxed.hint(greedy)
    if progress:
        progress(f"embedding program (relaxed): {len(space)} tables, {sum(map(len, space))} options, {world} ranks")
    floor = lp_bound(coefficients)
    if floor == math.inf:
        raise InfeasibleError(_not_fitting(model, space))
    solved = relaxed.solve(min(time_limit, RELAXED_WORK))
    if solved.status == "INFEASIBLE":
        raise InfeasibleError(_not_fitting(model, space))
    bound = max(solved.bound_s, floor) + fixed
    placed = partition(model, solved.choice) if solved.choice else None
    consider(refine(model, placed) if placed is not None else None)
    form, proved = "relaxed", False
    if _placement_variables(model, space) <= EXACT_PLACEMENT_LIMIT:
        # small enough to place exactly: start from the best plan so far, keep the stronger bound
        exact = ShardingProgram(model, space, relaxed=False)
        incumbent = best_fitting()
        if incumbent is not None:
            exact.hint(incumbent[0])
        if progress:
            progress(f"embedding program (exact): {_placement_variables(model, space)} placement variables")
        result = exact.solve(min(EXACT_WORK, time_limit - relaxed.work))
        if result.status == "INFEASIBLE":
            raise InfeasibleError(_not_fitting(model, space))
        if result.placements is not None:
            # first among equals: the exact program's plan
            candidates.insert(0, (result.placements, model.evaluate(result.placements)))
        bound = max(bound, result.bound_s + fixed)
        form, proved = "exact", result.status == "OPTIMAL"
    chosen = best_fitting()
    if chosen is None:
        raise InfeasibleError(_not_fitting(model, space))
    best, estimate = chosen
    status = "OPTIMAL" if proved else "FEASIBLE"
    return _result(model, "planner", best, baseline, status, form, min(estimate.step_time_s, bound), start,
                   sum(map(len, space)), estimate)


def _result(model: EmbeddingCostModel, strategy: EmbeddingStrategyName, placements: list[TablePlacement],
            baseline: EmbeddingEstimate | None, status: str, form: str, bound: float, start: float,
            options: int, estimate: EmbeddingEstimate | None = None) -> EmbeddingCompileResult:
    estimate = estimate or model.evaluate(placements)
    objective = estimate.step_time_s
    certificate = EmbeddingCertificate(
        status=status, form=form, objective=objective, bound=bound,
        gap=max(0.0, (objective - bound) / objective) if math.isfinite(bound) else 1.0,
        wall_s=clock.perf_counter() - start, tables=len(placements), options=options,
    )
    return EmbeddingCompileResult(strategy=strategy, tables=_choices(model, placements), estimate=estimate,
                                  certificate=certificate, baseline=baseline)
