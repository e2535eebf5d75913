"""Compile a recommendation job: the sharding and caching plan of its tables, with a certificate.

1. The option space: every table's options (options.py) whose single unit fits
   some rank's HBM and some node's host DRAM.
2. The LP bound of the relaxed program (bound.py, GLOP): no plan is faster.
3. A price-directed choice of options (heuristic.py), placed by the greedy
   partitioner, moved unit by unit (refine.py) and then searched table by
   table over options and places on the step itself (improve.py): a candidate.
4. The relaxed CP-SAT program (program.py: options only, per-rank maxima
   replaced by what any placement must pay), with a small work budget, on
   jobs whose option space it can search in that budget: its bound when
   stronger, and its options, placed and searched as in 3, a candidate.
5. On small jobs (`EXACT_PLACEMENT_LIMIT` placement variables) the exact
   program, hinted with the best plan so far, which proves the optimum.
The greedy TorchRec-style plan (greedy.py, this project's own greedy, not
TorchRec's planner) is a candidate and the result's `baseline` where it is
cheap (`GREEDY_LIMIT`); `strategy="greedy-torchrec-style"` returns it alone.
The returned plan is the best candidate under `evaluate`; OPTIMAL means the
exact program proved it, FEASIBLE gives the gap to the strongest bound.
Every step is deterministic (CP-SAT: one worker, a seed, work limits).
"""

from __future__ import annotations

import math
import time as clock
from typing import Callable, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog
from planner.embedding.evaluate import GB, EmbeddingEstimate, EmbeddingCostModel, TablePlacement
from planner.embedding.greedy import greedy_torchrec_style, place_choice
from planner.embedding.bound import lp_solution
from planner.embedding.improve import improve
from planner.embedding.heuristic import price_directed_choice
from planner.embedding.relaxed import RelaxedCoefficients
from planner.embedding.refine import refine
from planner.embedding.options import CACHE_LEVELS, ShardingType, TableOption, table_options
from planner.embedding.program import ShardingProgram
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job

# Up to this many rank/node placement variables the exact program runs (small jobs, which it proves in well under
# a second; on a node of 8 ranks with 26 tables, 4,400 variables, it spent seconds without beating the search).
EXACT_PLACEMENT_LIMIT = 1_000
# CP-SAT deterministic work the exact program may spend.
EXACT_WORK = 5.0
# CP-SAT deterministic work of the relaxed program (and again of its tie-break): it proves the relaxed optimum of 26
# tables on 8 ranks within 0.2 and its choice is then the best start of the search; on 64 ranks it needs 1.0 (4 s)
# and its choice starts worse than the price-directed one, so it stops short there and the LP bound stands in.
RELAXED_WORK = 0.25
# Above this many table options the relaxed CP-SAT program is skipped: on 856 tables (27,000 options) it found no
# solution in 5 units of work; the LP bound and the search carry the result.
RELAXED_OPTION_LIMIT = 5_000
# The greedy TorchRec-style plan is a candidate (and the baseline) when tables x ranks is at most this: it
# re-partitions every table after each relief, 26 s on 856 tables x 128 ranks against 0.01 s on 26 x 64.
GREEDY_LIMIT = 20_000
GREEDY_NAME: Final = "greedy-torchrec-style"
EmbeddingStrategyName = Literal["planner", "greedy-torchrec-style"]


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
    status: str = Field(description="OPTIMAL (proved), FEASIBLE (see gap) or BASELINE (the greedy TorchRec-style "
                        "plan, no search).")
    form: str = Field(description="exact (the exact program ran), relaxed (bounds from the relaxed program; plan "
                      "from the search) or greedy.")
    objective: float = Field(description="Step seconds of the plan.")
    bound: float = Field(description="No sharding in the space is faster than this.")
    gap: float = Field(description="(objective - bound) / objective.")
    wall_s: float = Field(description="Compile wall time, seconds.")
    tables: int = Field(description="Tables planned.")
    options: int = Field(description="Table options in the space.")


class EmbeddingCompileResult(BaseModel):
    """The chosen sharding, its estimate, the certificate and the baseline's estimate."""

    model_config = ConfigDict(extra="forbid")
    strategy: EmbeddingStrategyName = Field(description="Who planned it: the compiler (planner) or this project's "
                                            "greedy TorchRec-style planner.")
    tables: list[TableChoice] = Field(description="Per-table sharding.")
    estimate: EmbeddingEstimate = Field(description="The cost model's evaluation of the plan.")
    certificate: EmbeddingCertificate
    baseline: EmbeddingEstimate | None = Field(description="The greedy TorchRec-style plan's evaluation (this "
                                               "project's greedy, not TorchRec's planner); None when it finds no plan "
                                               "that fits or the job is too large for it (GREEDY_LIMIT).")


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
    if strategy == GREEDY_NAME:
        greedy = greedy_torchrec_style(model)
        baseline = model.evaluate(greedy) if greedy is not None else None
        if greedy is None or baseline is None or not baseline.fits:
            raise InfeasibleError("the greedy TorchRec-style planner finds no sharding that fits")
        return _result(model, GREEDY_NAME, greedy, baseline, "BASELINE", "greedy", baseline.step_time_s, start, 0)
    fixed = model.fixed_seconds()
    space = space_options(model)
    candidates = _Candidates(model, space)
    greedy, baseline = None, None
    if len(model.costs.tables) * world <= GREEDY_LIMIT:
        greedy = greedy_torchrec_style(model)
        baseline = model.evaluate(greedy) if greedy is not None else None
        candidates.add(greedy, search=False)  # the plan itself (the baseline), then a search from it
        candidates.add(greedy)
    coefficients = RelaxedCoefficients(model, space)
    floor, _ = lp_solution(coefficients)
    if floor == math.inf:
        raise InfeasibleError(_not_fitting(model, space))
    bound = floor + fixed
    start_choice = price_directed_choice(coefficients, space)
    if start_choice is not None:
        candidates.add_choice(start_choice)
    options = sum(map(len, space))
    form, proved, work = "relaxed", False, 0.0
    if options <= RELAXED_OPTION_LIMIT:
        relaxed = ShardingProgram(model, space, relaxed=True, coefficients=coefficients)
        hint = start_choice or ({p.table: p.option for p in greedy} if greedy else None)
        if hint is not None:
            relaxed.hint([TablePlacement(t, o, ()) for t, o in sorted(hint.items())])
        if progress:
            progress(f"embedding program (relaxed): {len(space)} tables, {options} options, {world} ranks")
        solved = relaxed.solve(min(time_limit, RELAXED_WORK))
        work = relaxed.work
        if solved.status == "INFEASIBLE":
            raise InfeasibleError(_not_fitting(model, space))
        bound = max(bound, solved.bound_s + fixed)
        if solved.choice:
            candidates.add_choice(solved.choice)
    if _placement_variables(model, space) <= EXACT_PLACEMENT_LIMIT:
        # small enough to place exactly: start from the best plan so far, keep the stronger bound
        exact = ShardingProgram(model, space, relaxed=False)
        incumbent = candidates.best()
        if incumbent is not None:
            exact.hint(incumbent[0])
        if progress:
            progress(f"embedding program (exact): {_placement_variables(model, space)} placement variables")
        result = exact.solve(max(0.1, min(EXACT_WORK, time_limit - work)))
        if result.status == "INFEASIBLE":
            raise InfeasibleError(_not_fitting(model, space))
        if result.placements is not None:
            candidates.add(result.placements, search=False, first=True)  # first among equals: the exact plan
        bound = max(bound, result.bound_s + fixed)
        form, proved = "exact", result.status == "OPTIMAL"
    chosen = candidates.best()
    if chosen is None:
        raise InfeasibleError(_not_fitting(model, space))
    best, estimate = chosen
    status = "OPTIMAL" if proved else "FEASIBLE"
    return _result(model, "planner", best, baseline, status, form, min(estimate.step_time_s, bound), start,
                   options, estimate)


class _Candidates:
    """Plans found so far, each evaluated once; a choice of options is placed and searched before it joins."""

    def __init__(self, model: EmbeddingCostModel, space: list[list[TableOption]]):
        self.model, self.space = model, space
        self.plans: list[tuple[list[TablePlacement], EmbeddingEstimate]] = []

    def add(self, placements: list[TablePlacement] | None, *, search: bool = True, first: bool = False) -> None:
        """Evaluate `placements` (after the local searches when `search`) and keep them."""
        if placements is None:
            return
        if search:
            placements = improve(self.model, self.space, refine(self.model, placements))
        entry = (placements, self.model.evaluate(placements))
        if first:
            self.plans.insert(0, entry)
        else:
            self.plans.append(entry)

    def add_choice(self, choice: dict[int, TableOption]) -> None:
        """Place a choice of options with the greedy partitioner (moving tables that do not pack to smaller
        options), search from there, keep the result."""
        self.add(place_choice(self.model, self.space, choice))

    def best(self) -> tuple[list[TablePlacement], EmbeddingEstimate] | None:
        """The fastest plan that fits (the first on ties), or None."""
        fitting = [(e.step_time_s, i) for i, (_, e) in enumerate(self.plans) if e.fits]
        return self.plans[min(fitting)[1]] if fitting else None


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
