"""Compile a job: branch and bound over global configurations, CP-SAT inside each.

1. `planner.search.space` lists every legal global configuration (tp, pp, cp, ep,
   dp, mbs, vpp, ZeRO, scope, base recompute).
2. Each gets a lower bound from the cost model (perfectly balanced stages,
   nothing recomputed, no stage-level terms); configurations are visited in
   bound order.
3. A configuration whose bound is not below the incumbent is pruned, and so
   is every later one.  Otherwise its cost tables are built (only contents
   that could beat the incumbent) and a CP-SAT program picks the split, the
   recomputed blocks and the pools per stage.
4. The certificate: the incumbent's step time is the objective; the bound is
   the smallest of the incumbent, the bounds of configurations never solved
   (time limit) and the best bounds of programs stopped early.  Gap =
   (objective - bound) / objective.  OPTIMAL means gap 0 up to table rounding.

The time limit is a wall-clock budget for the whole search, replica groups and
runners-up included.  The budget is checked before every configuration,
every CP-SAT solve and every runner-up; each solve may run for at most the
time left, and for at most `solve_work` of CP-SAT's deterministic time (a
machine-independent measure of work, about a second each): a program stopped
by that limit stops at the same point on any machine under any load.  Once
the budget is spent (and a plan exists: before the first plan the search goes
on until it has one) the search returns its incumbent as FEASIBLE, with the
bounds of what it did not solve in the certificate, and marks the certificate
`stopped="time_limit"`: what it found depends on the machine's speed and load,
so another run may choose differently.  A search the wall clock never cut is
reproducible: the same inputs give the same plan.

Offload is tried only where no configuration fits without it (it adds time
and saves only memory, so it cannot win where something else fits).  Where
state lives is decided per stage inside each program: every stage picks one
of its configuration's placement variants (`planner.search.space.placement_variants`:
the FCDP host cache; in the offload pass also optimizer and parameter offload
to host or NVMe and partial optimizer offload).

On a mixed cluster (objective time) replica groups are searched first
(`planner.search.replica_groups`: a strategy and batch share per pool, each share a
compile of its pool alone through `_compile_pool`); their best plan is the
incumbent the configurations must beat, and their bound joins the
certificate.  A group plan that fits counts as "something fits" for offload.
"""

from __future__ import annotations

import heapq
import math
import time as clock
from dataclasses import dataclass, field
from typing import Callable

from ortools.sat.python import cp_model

from hardware import Catalog, load_catalog
from planner.cost import evaluate
from planner.cost.evaluate import has_shared_experts
from planner.cost.layout import place_stages
from planner.errors import InfeasibleError
from planner.search.ilp.model import Program, Row, build_program
from planner.search.ilp.surcharge import Surcharge
from planner.search.ilp.build import build_tables, stage_pools_for
from planner.search.ilp.tables import NS, ConfigTables, TableBuilder
from planner.cost.replica_groups import ReplicaGroup, evaluate_groups, group_job
from planner.search.result import Certificate, CompileOptions, CompileResult, RunnerUp
from planner.job import Job
from planner.search.replica_groups import GroupSearch, cluster_floor, search_groups, share_grid
from planner.search.space import (SpaceOptions, every_kth_families, global_configs, limits_note, narrow_to_runtime,
                                  placement_variants, ties_recompute)
from planner.search.warm import routed_share, state_share, warm_start
from planner.strategy import Strategy

def _now() -> float:
    """The search's clock: monotonic seconds (tests replace it to drive the budget)."""
    return clock.perf_counter()


FIRST_PLAN_SECONDS = 1.0  # wall seconds a CP-SAT solve may take while the search has no plan yet
SOLVE_WORK_SHARE = 0.25  # deterministic time of one solve: this share of the time limit ...
MIN_SOLVE_WORK = 1.0  # ... but at least this much (short limits)


def solve_work(options: CompileOptions) -> float:
    """CP-SAT deterministic time one configuration's program may spend: a function of the inputs only, so
    a program it stops stops at the same point on every machine (the wall clock caps it too: see
    _Search.solve_seconds)."""
    if options.work_limit is not None:
        return options.work_limit
    return max(MIN_SOLVE_WORK, SOLVE_WORK_SHARE * options.time_limit)


@dataclass
class _Search:
    """Mutable state of one compile."""

    job: Job
    options: CompileOptions
    catalog: Catalog
    builder: TableBuilder
    progress: Callable[[str], None] | None
    start: float = field(default_factory=lambda: _now())
    incumbent: float = float("inf")
    best: Strategy | None = None
    best_peak: float = float("inf")  # peak HBM of the best plan (tie-break)
    solved: list[tuple[float, str, Strategy]] = field(default_factory=list)
    open_bounds: list[float] = field(default_factory=list)
    pruned: int = 0
    near: list = field(default_factory=list)  # (bound, spec, config, m, variants) the incumbent cap closed
    stopped: bool = False  # the wall-clock budget cut something short: the result depends on the machine
    need_plan: bool = True  # go on past the budget until a first plan exists (a replica group's compile does not)
    surcharge: Surcharge | None = None  # a per-step term added to the step time (a re-plan's amortised migration)
    best_step: float = float("inf")  # step time of the best plan (its objective without the surcharge)

    def elapsed(self) -> float:
        return _now() - self.start

    def remaining(self) -> float:
        """Wall seconds left of the budget (<= 0 once it is spent; inf under a deterministic work limit)."""
        if self.options.work_limit is not None:
            return float("inf")
        return self.options.time_limit - self.elapsed()

    def spent(self) -> bool:
        """Stop searching: the budget is spent and a plan (or a cap) exists.  Without one the search
        goes on to a first plan (a time limit returns the best plan found, so it finds one if the
        space has one), unless need_plan is off."""
        return (self.incumbent < float("inf") or not self.need_plan) and self.remaining() <= 0

    def solve_seconds(self) -> float:
        """Wall-clock cap of the next CP-SAT solve: the time left (while a first plan is still
        needed, at least FIRST_PLAN_SECONDS)."""
        if self.incumbent == float("inf") and self.need_plan:
            return max(FIRST_PLAN_SECONDS, self.remaining())
        return max(0.0, self.remaining())

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)


def _price_rate(job: Job, strategy: Strategy, catalog: Catalog) -> float:
    """USD per second of the GPUs a (resolved) strategy uses (cost objective)."""
    ranks = strategy.tp * strategy.cp * strategy.data_parallel
    return sum(ranks * stage.device.price_per_hour for stage in place_stages(job, strategy, catalog)) / 3600.0


def _chosen_options(program: Program, solver: cp_model.CpSolver) -> list:
    """The table option each stage takes in the solution."""
    return [row.option for row in _chosen_rows(program, solver)]


def _chosen_rows(program: Program, solver: cp_model.CpSolver) -> list[Row]:
    """The table row each stage takes in the solution."""
    return [rows.rows[solver.value(var)] for rows, var in zip(program.stage_rows, program.option)]


def _read(program: Program, solver: cp_model.CpSolver) -> Strategy:
    """The full strategy of a solved program."""
    tables = program.tables
    chosen = _chosen_rows(program, solver)
    base = tables.strategy
    split = tuple(sum(row.counts) for row in chosen)
    recompute = tuple(row.option.recompute for row in chosen)
    update: dict = {"split": split if base.pp > 1 else None}
    if any(recompute):
        update.update(recompute="full", recompute_layers=recompute)
    if program.mixed_cluster:
        update["stage_pools"] = tuple(tables.pools[row.pool].name for row in chosen)
    return base.with_stage_placements([tables.variants[row.option.variant] for row in chosen], **update)


def _even_hint(program: Program) -> list[int] | None:
    """Row per stage of the most even split on the first pools, when the tables have it."""
    tables = program.tables
    pp, blocks = tables.strategy.pp, tables.blocks
    base, extra = divmod(blocks, pp)
    hint = []
    for s, rows in enumerate(program.stage_rows):
        want = base + (1 if s < extra else 0)
        match = [r for r, row in enumerate(rows.rows) if sum(row.counts) == want]
        if not match:
            return None
        hint.append(match[0])
    return hint


PRICE_UNITS = 1e4  # prices in the program: 1e-4 USD per GPU-hour
RUNNER_UP_WORK = 1.0  # CP-SAT deterministic time per runner-up re-solve (about a second; its value is informational)
RUNNER_UP_SPAN = 1.5  # runners-up re-solved for the report: stages no slower than this times the incumbent allows
RUNNER_UP_SOLVES = 4  # at most this many runner-up programs per runner-up reported


def _solve_config(search: _Search, config: Strategy, micro_batches: int, bound: float,
                  variants: tuple[dict, ...], runner_up: bool = False, order: float | None = None) -> None:
    """Solve one configuration: (1) cap the stage times, (2) build and check its tables, (3) build its
    program, (4) solve it, (5) record the value.  runner_up: only to learn its value for the report (no
    incumbent cap, a short limit, the certificate untouched).  `order`: the key that orders it among the
    runner-up candidates (default its bound)."""
    order = bound if order is None else order
    pools = _pools(search.job, config)
    floor = _rate_floor(search, config, pools)
    cap = _stage_cap(search, config, micro_batches, pools, floor, runner_up)
    tables = build_tables(search.builder, config, micro_batches, cap, variants,
                          prune=search.options.space.stage_placement, even=search.options.space.split_shape == "even",
                          every_recompute=ties_recompute(search.options.space, config))
    if tables is None:
        if cap < float("inf") and not runner_up:  # nothing within the incumbent's cap: a runner-up candidate
            search.near.append((order, config.spec(), config, micro_batches, variants))
        return
    table_bound = tables.bottleneck_bound() * floor
    if table_bound >= search.incumbent * (1 - 1e-9) and not runner_up:
        search.pruned += 1  # its own tables prove it cannot beat the incumbent
        if not runner_up and table_bound < float("inf"):
            search.near.append((table_bound, config.spec(), config, micro_batches, variants))  # a runner-up candidate
        return
    bound = max(bound, table_bound)
    program, cutoff = _program(search, tables, micro_batches, runner_up)
    if not runner_up and search.spent():  # the budget ran out while the tables were built
        search.open_bounds.append(bound)
        search.stopped = True
        return
    solver, status = _solve(search, program, runner_up)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.UNKNOWN and not runner_up:
            search.open_bounds.append(bound)
        elif status == cp_model.INFEASIBLE and cutoff is not None:
            search.near.append((order, config.spec(), config, micro_batches, variants))  # a runner-up candidate
        return
    _record(search, program, solver, status, bound, runner_up)


def _stage_cap(search: _Search, config: Strategy, micro_batches: int, pools: list, floor: float,
               runner_up: bool) -> float:
    """Seconds per micro-batch no stage of a better plan exceeds: incumbent / (m x the cheapest rate this
    configuration can pay); for step time also (m - 1/v) t_s + (the least sum of stage times) / v <= step."""
    if search.incumbent == float("inf"):
        return float("inf")
    v, m = config.vpp, micro_batches
    if runner_up:  # slower than the incumbent by definition: the report lists those within RUNNER_UP_SPAN of it
        return RUNNER_UP_SPAN * search.incumbent / (m * floor)
    cap = search.incumbent / (m * floor)
    if search.options.objective == "time" and m * v > 1:
        least_sum = search.builder.sum_floor(config, pools)  # of the fills (a V's: its forwards)
        cap = min(cap, (search.incumbent - least_sum / v) / (m - 1 / v) * (1 + 1e-9))
    return cap


def _program(search: _Search, tables: ConfigTables, micro_batches: int, runner_up: bool) -> tuple[Program, int | None]:
    """The configuration's CP-SAT program and the incumbent cutoff it carries (None: no cutoff)."""
    mixed = len(search.job.cluster.pools) > 1
    max_step = search.options.max_step_time
    prices = None
    if search.options.objective == "cost" and mixed:
        prices = [round(search.catalog.device(pool.node.device).price_per_hour * PRICE_UNITS) for pool in tables.pools]
    # time objective: the incumbent's step time caps the program; ties stay in (for the memory tie-break),
    # with slack for the tables' rounding to whole nanoseconds (half a ns per term of the step formula)
    cutoff = (math.ceil(search.incumbent * NS) + micro_batches + tables.strategy.pp + 3
              if search.options.objective == "time" and search.incumbent < float("inf") and not runner_up
              else None)
    surcharge = (search.surcharge.table(tables.strategy, tables.strategy.vpp)
                 if search.surcharge is not None and search.options.objective == "time" else None)
    program = build_program(tables, max_step_ns=round(max_step * NS) if max_step else None, prices=prices,
                            mixed_cluster=mixed, cutoff_ns=cutoff,
                            uniform_placement=not search.options.space.stage_placement,
                            middle_stages_equal=search.options.space.split_shape == "ends",
                            recompute_counts=search.options.space.recompute_counts, surcharge=surcharge)
    hint = _even_hint(program)
    if hint is not None:
        for s, row in enumerate(hint):
            program.model.add_hint(program.option[s], row)
    return program, cutoff


def _solve(search: _Search, program: Program, runner_up: bool) -> tuple[cp_model.CpSolver, cp_model.CpSolverStatus]:
    """Run CP-SAT on the program: (the solver, its status)."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1  # deterministic
    solver.parameters.random_seed = 0
    # CP-SAT would install its own SIGINT handler and leave SIG_DFL behind after the solve: a later Ctrl-C
    # then kills the process without the unwinding that removes a half-written output (cli/signals.py)
    solver.parameters.catch_sigint_signal = False
    # CP-SAT's symmetry detection finds the orbitopes of identical stages but spends seconds of presolve
    # on it (40x the whole solve on 1,000-block models); the tables already merge identical contents.
    solver.parameters.symmetry_level = 0
    # a deterministic limit (the same result on any machine) and the wall-clock time left (a stop by the
    # latter makes the result depend on the machine: flagged)
    work = RUNNER_UP_WORK if runner_up else solve_work(search.options)
    solver.parameters.max_deterministic_time = work
    solver.parameters.max_time_in_seconds = max(0.0, search.remaining()) if runner_up else search.solve_seconds()
    status = solver.solve(program.model)
    if status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and solver.deterministic_time < work * (1 - 1e-6):
        search.stopped = True  # the wall clock, not the work limit, ended this solve
    return solver, status


def _objective_values(search: _Search, program: Program, solver: cp_model.CpSolver,
                      strategy: Strategy) -> tuple[float, float]:
    """(the solution's objective, the program's best bound) in SI units: seconds per step, or USD per step.

    The program counts time in nanoseconds x program.scale, and with per-pool prices cost in
    PRICE_UNITS per GPU-hour x microseconds; these are the only conversions back."""
    step = solver.value(program.step) / program.scale / NS
    if program.prices is None:  # the objective is the step time (plus a surcharge, objective time)
        rate = _price_rate(search.job, strategy, search.catalog) if search.options.objective == "cost" else 1.0
        value = solver.value(program.objective) / program.scale / NS
        return value * rate, solver.best_objective_bound / program.scale / NS * rate
    usd_per_unit = 1e-6 / PRICE_UNITS / 3600.0
    return step * _price_rate(search.job, strategy, search.catalog), solver.best_objective_bound * usd_per_unit


def _record(search: _Search, program: Program, solver: cp_model.CpSolver, status: cp_model.CpSolverStatus, bound: float,
            runner_up: bool) -> None:
    """Keep the solved value; a better (or equal and lighter) plan becomes the incumbent."""
    strategy = _read(program, solver)
    value, program_bound = _objective_values(search, program, solver, strategy)
    search.solved.append((value, strategy.spec(), strategy))
    if runner_up:
        return
    if status == cp_model.FEASIBLE:
        search.open_bounds.append(max(bound, program_bound))
    peak = max(option.cost.memory.total for option in _chosen_options(program, solver))
    # equal objectives (e.g. ZeRO-1 vs ZeRO-2 with hidden traffic): keep the one using less memory
    tied = abs(value - search.incumbent) <= 1e-9 * max(value, 1e-30)
    if value < search.incumbent and not tied or tied and peak < search.best_peak:
        search.incumbent, search.best, search.best_peak = min(value, search.incumbent), strategy, peak
        search.best_step = solver.value(program.step) / program.scale / NS
        search.say(f"[{search.elapsed():6.2f}s] incumbent {value:.6g}  bound {bound:.6g}  {strategy.spec()}")


def compile_job(job: Job, options: CompileOptions | None = None, catalog: Catalog | None = None,
                progress: Callable[[str], None] | None = None, surcharge: Surcharge | None = None) -> CompileResult:
    """Search the strategy space of `job` for the best plan, with a certificate.  `surcharge` (objective time,
    no replica groups): minimise the step time plus it; the certificate's objective and bound are then that
    sum, per step (planner.search.ilp.surcharge)."""
    options = options or CompileOptions()
    catalog = catalog or load_catalog()
    options = options.model_copy(update={"space": narrow_to_runtime(options.space, job.runtime, job)})
    refusal = job.runtime.model_refusal(job.model.num_experts, has_shared_experts(job))
    if refusal is not None:
        raise InfeasibleError(f"the {job.runtime.name} runtime cannot run {refusal} "
                              f"({job.model.name} has {job.model.num_experts} experts)")
    search = _Search(job=job, options=options, catalog=catalog, builder=TableBuilder(job, catalog), progress=progress,
                     surcharge=surcharge)
    legal = _legal_configs(job, options.space)  # counts the space (bounded after the replica groups)
    grouped = None
    if len(job.cluster.pools) > 1 and options.objective == "time" and options.space.replica_groups and not surcharge:
        # replica groups first: a good plan from them prunes most single-strategy configurations
        # one table builder per pool: its tables do not depend on the batch share
        builders = {pool.name: TableBuilder(group_job(job, pool.name, job.global_batch), catalog)
                    for pool in job.cluster.pools}
        grain = job.global_batch // share_grid(job.global_batch)
        grouped = search_groups(
            job, lambda sub, cap: _compile_pool(search, sub, cap, builders[sub.cluster.pools[0].name], grain),
            catalog, remaining=search.remaining)
        search.stopped = search.stopped or grouped.stopped
        if grouped.groups is not None:
            search.incumbent = grouped.objective * (1 + 1e-9)
            search.say(f"[{search.elapsed():6.2f}s] replica groups {grouped.objective:.6g} "
                       f"({grouped.compiled} pool compiles)")
    has_groups = grouped is not None and grouped.groups is not None
    if not has_groups:
        _warm(search, [config for _, config in legal])
    # offload only where nothing fits without it: replica groups that fit count
    configs = _search_configs(search, legal, retry_offload=not has_groups)
    if search.best is None and not has_groups:
        if not configs:
            raise InfeasibleError("no legal strategy: no combination of tp, pp, cp, dp and micro-batch size "
                                  f"divides the model and batch {job.global_batch} on {job.cluster.num_gpus} GPUs"
                                  + limits_note(options.space))
        raise InfeasibleError(_explain_infeasible(job, catalog, options.space.offload_devices))
    _solve_closest_runners_up(search)
    if search.best is None:  # the replica groups won (the search raised above when it had neither)
        if grouped is None or grouped.groups is None:
            raise RuntimeError("no plan: neither a single strategy nor replica groups")
        return _group_result(search, grouped, grouped.groups, len(configs))
    return _result(search, search.best, len(configs), grouped.bound if grouped is not None else float("inf"))


def _warm(search: _Search, configs: list[Strategy]) -> None:
    """A first incumbent from strategies scored directly (planner.search.warm), for the time objective without a
    surcharge (the programs' objective is then the step time evaluate gives), on one pool (on several the
    programs choose each stage's pool, and the replica groups give a first plan)."""
    if (search.options.objective != "time" or search.surcharge is not None or search.options.max_step_time
            or len(search.job.cluster.pools) > 1):
        return
    found = warm_start(search.job, configs, search.options.space, search.catalog)
    if found is not None and found[1] < search.incumbent:
        search.best, search.best_step, search.best_peak = found
        search.incumbent = search.best_step
        search.say(f"[{search.elapsed():6.2f}s] incumbent {search.incumbent:.6g}  (warm start)  {search.best.spec()}")


def _solve_closest_runners_up(search: _Search) -> None:
    """Values of the configurations the incumbent closed, for the report's runners-up: in bound order until the
    next bound cannot beat the k-th best value found (k = runners_up), at most RUNNER_UP_SOLVES x k solves."""
    k = search.options.runners_up
    seen = {spec for _, spec, _ in search.solved}
    solves = 0
    for bound, spec, config, m, variants in sorted(search.near, key=lambda item: item[:2]):
        values = sorted(v for v, s, _ in search.solved if s != (search.best and search.best.spec()))
        if k == 0 or len(values) >= k and bound >= values[k - 1] or solves >= RUNNER_UP_SOLVES * k:
            return
        if spec in seen:
            continue
        if search.remaining() <= 0:  # the budget binds the report's extras too
            search.stopped = True
            return
        seen.add(spec)
        solves += 1
        _solve_config(search, config, m, bound, variants, runner_up=True)


def _search_configs(search: _Search, legal: list[tuple[int, Strategy]], retry_offload: bool = True) -> list:
    """Branch and bound over the configurations, then with offload if nothing was found; the configurations."""
    space = search.options.space
    configs = _bounded_configs(search, legal)
    _branch_and_bound(search, configs, offload=space.offload_search == "always")
    if search.best is None and retry_offload and space.offload_search == "fallback":
        # nothing fits: retry with offload among each stage's placements, which trades time for memory
        # (offload adds no lower-bound term, so the bounds stand)
        _branch_and_bound(search, configs, offload=True)
    return configs


def _compile_pool(parent: _Search, job: Job, cap: float, builder: TableBuilder,
                  grain: int) -> tuple[float, float, "CompileResult | None"]:
    """A replica group's compile: one pool's sub-job under the grain rule, only plans no slower than
    `cap`, on the parent's clock."""
    space = parent.options.space.model_copy(update={"batch_grain": grain})
    options = parent.options.model_copy(update={"runners_up": 0, "space": space})
    # past the budget, a compile under a cap stops with or without a plan (there is a plan to beat, or the
    # configurations find the first one); one without a cap, asked while no split has a plan, goes on to one
    search = _Search(job=job, options=options, catalog=parent.catalog, builder=builder, progress=None,
                     start=parent.start, need_plan=parent.need_plan and cap == float("inf"))
    if cap < float("inf"):
        search.incumbent = cap * (1 + 1e-9)
    legal = _legal_configs(job, space)
    _warm(search, [config for _, config in legal])
    configs = _search_configs(search, legal)
    parent.stopped = parent.stopped or search.stopped
    if search.best is None:
        return float("inf"), min([cap, *search.open_bounds]), None
    result = _result(search, search.best, len(configs))
    return result.certificate.objective, result.certificate.bound, result


def _group_result(search: _Search, grouped: GroupSearch, groups: list[ReplicaGroup],
                  configurations: int) -> CompileResult:
    """The replica-group plan (`groups`, grouped's) as the compile result, re-checked by evaluate_groups."""
    estimate = evaluate_groups(search.job, groups, search.catalog)
    if not estimate.fits or abs(estimate.step_time_s - grouped.objective) > 0.005 * grouped.objective:
        raise RuntimeError(f"replica groups re-evaluate to {estimate.step_time_s:.6g} s (fits: {estimate.fits}) "
                           f"against the search's {grouped.objective:.6g} s")
    return CompileResult(strategy=None, estimate=None,
                         certificate=_certificate(search, grouped.objective, grouped.bound, configurations),
                         runners_up=_best_runners_up(search, exclude=None), groups=estimate,
                         group_results=grouped.results)


def _certificate(search: _Search, objective: float, other_bound: float, configurations: int) -> Certificate:
    """The certificate of `objective`: the bound is the least of it, `other_bound` and the open bounds."""
    bound = min([objective, other_bound, *search.open_bounds])
    gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)
    return Certificate(
        status="OPTIMAL" if gap <= 1e-9 else "FEASIBLE", objective=objective, bound=bound, gap=gap,
        wall_s=search.elapsed(), configurations=configurations, solved=len(search.solved), pruned=search.pruned,
        stopped="time_limit" if search.stopped else None,
    )


def _best_runners_up(search: _Search, exclude: str | None) -> list[RunnerUp]:
    """The best solved configurations other than `exclude`, best first."""
    others = sorted((v, spec) for v, spec, _ in search.solved if spec != exclude)
    return [RunnerUp(strategy=spec, objective=v) for v, spec in others[: search.options.runners_up]]


def _legal_configs(job: Job, space: SpaceOptions) -> list[tuple[int, Strategy]]:
    """(micro-batches, configuration) of every legal configuration some pool can hold, in space order."""
    return [(job.global_batch // (config.data_parallel * config.mbs), config)
            for config in global_configs(job, space, families=False) if _pools(job, config)]


def _bounded_configs(search: _Search, legal: list[tuple[int, Strategy]]) -> list[tuple[float, int, Strategy]]:
    """The configurations with their lower bounds, in bound order.  Once the budget is spent (a plan or
    not) the rest get the cheap compute floor instead, the most sharded first: without a plan yet the
    search then tries the configurations likeliest to fit before the rest (issue #26: a first plan of a
    big job within seconds of the limit, not after every configuration that does not fit)."""
    out = []
    job = search.job
    for index, (m, config) in enumerate(legal):
        if search.spent() or search.remaining() <= 0:
            floor = cluster_floor(job, search.catalog)
            # the least state per GPU first; sorted is stable: space order among ties
            routed = routed_share(job)
            rest = sorted(legal[index:], key=lambda item: state_share(item[1], routed))
            if search.options.objective == "cost":
                out += [(floor * _rate_floor(search, c, _pools(job, c)), n, c) for n, c in rest]
            else:
                out += [(floor, n, c) for n, c in rest]
            out.sort(key=lambda item: item[0])
            return out
        pools = _pools(job, config)
        out.append((search.builder.lower_bound(config, pools, m) * _rate_floor(search, config, pools), m, config))
    out.sort(key=lambda item: (item[0], item[2].spec()))
    return out



def _pools(job: Job, config: Strategy) -> list:
    """Pools a stage of the configuration can occupy (all of a one-pool cluster)."""
    return stage_pools_for(job, config) if len(job.cluster.pools) > 1 else list(job.cluster.pools)


def _rate_floor(search: _Search, config: Strategy, pools: list) -> float:
    """1 for the time objective; for cost, the cheapest USD/s the configuration's GPUs can cost."""
    if search.options.objective != "cost":
        return 1.0
    per_gpu = min(search.catalog.device(pool.node.device).price_per_hour for pool in pools) / 3600.0
    return per_gpu * config.tp * config.cp * config.data_parallel * config.pp


def _branch_and_bound(search: _Search, configs: list[tuple[float, int, Strategy]], offload: bool) -> None:
    """The configurations in bound order, each pruned by its bounds or solved; a configuration's every-k-th-block
    families join the queue when it is reached (their bounds are at least its: space.every_kth_families)."""
    queue = _BoundQueue(configs)
    while queue:
        bound, m, config = queue.pop()
        if bound >= search.incumbent * (1 - 1e-9):
            rest = [(bound, m, config), *queue.drain()]
            search.pruned += len(rest)
            # the closest of the rest are runner-up candidates (their programs are solved for the report only)
            search.near += [(b, c.spec(), c, n, placement_variants(search.job, c, search.options.space, offload))
                            for b, n, c in rest[:search.options.runners_up]]
            return
        if search.spent():
            search.open_bounds.extend([bound, *(b for b, _, _ in queue.drain())])
            search.stopped = True
            return
        pools = _pools(search.job, config)
        for family in every_kth_families(search.job, config, search.options.space,
                                         identical=len(search.builder.segments) == 1):
            queue.push((search.builder.lower_bound(family, pools, m) * _rate_floor(search, family, pools), m, family))
        variants = placement_variants(search.job, config, search.options.space, offload)
        if search.incumbent < float("inf"):
            # a memory-aware bound, dearer to compute: only for configurations the cheap bound keeps
            pools = _pools(search.job, config)
            floor = _rate_floor(search, config, pools)
            refined = search.builder.refined_bound(config, pools, m, enough=search.incumbent / floor,
                                                   variants=variants, split=search.options.space.split_shape) * floor
            if refined >= search.incumbent * (1 - 1e-9):
                search.pruned += 1
                if refined < float("inf"):  # it fits somewhere: a runner-up candidate, closest bound first
                    search.near.append((_order(search, config, pools, m, variants, bound, refined), config.spec(),
                                        config, m, variants))
                continue
            order = _order(search, config, pools, m, variants, bound, refined)
            bound = max(bound, refined)
        else:
            order = bound
        _solve_config(search, config, m, bound, variants, order=order)


def _order(search: _Search, config: Strategy, pools: list, m: int, variants: tuple[dict, ...], cheap: float,
           refined: float) -> float:
    """The key that orders a runner-up candidate: on one pool the balanced bound (the refined one stops at the
    incumbent, where every closed configuration would tie), elsewhere the refined bound."""
    if len(pools) > 1:
        return refined
    if config.v_shape:
        # a V's bound counts only forward compute in its fill, which would sort every V ahead of the nearest
        # configurations: it is ordered by the interleaved pipeline over the same chunks, whose work it runs
        interleaved = config.model_copy(update={"schedule": "interleaved"})
        return search.builder.balanced_bound(interleaved, pools, m, variants) * _rate_floor(search, config, pools)
    return max(cheap, search.builder.balanced_bound(config, pools, m, variants) * _rate_floor(search, config, pools))


class _BoundQueue:
    """Configurations in bound order: a sorted list, and a heap of those added while it is walked (ties: the
    list's first, then the order they were added)."""

    def __init__(self, configs: list[tuple[float, int, Strategy]]):
        self.configs, self.index = configs, 0
        self.added: list[tuple[float, int, int, Strategy]] = []  # (bound, arrival, micro-batches, configuration)
        self.arrivals = 0

    def __bool__(self) -> bool:
        return self.index < len(self.configs) or bool(self.added)

    def push(self, item: tuple[float, int, Strategy]) -> None:
        bound, m, config = item
        self.arrivals += 1
        heapq.heappush(self.added, (bound, self.arrivals, m, config))

    def pop(self) -> tuple[float, int, Strategy]:
        if self.added and (self.index == len(self.configs) or self.added[0][0] < self.configs[self.index][0]):
            bound, _, m, config = heapq.heappop(self.added)
            return bound, m, config
        self.index += 1
        return self.configs[self.index - 1]

    def drain(self) -> list[tuple[float, int, Strategy]]:
        """Everything left, in bound order."""
        out = []
        while self:
            out.append(self.pop())
        return out


def _explain_infeasible(job: Job, catalog: Catalog, offload_devices: tuple[str, ...]) -> str:
    from planner.search.explain import explain_infeasible  # explain evaluates strategies; imported when needed

    return explain_infeasible(job, catalog, offload_devices)


def _result(search: _Search, best: Strategy, configurations: int, other_bound: float = float("inf")) -> CompileResult:
    """The single-strategy result: `best` (the search's), re-checked by evaluate."""
    estimate = evaluate(search.job, best, catalog=search.catalog)  # the re-check every plan gets
    objective = search.incumbent
    step = (objective / _price_rate(search.job, best, search.catalog) if search.options.objective == "cost"
            else search.best_step)
    if not estimate.memory.fits or abs(estimate.step_time_s - step) > 0.005 * step:
        # the tables are built from evaluate's own functions: a disagreement is a bug, not an input error
        raise RuntimeError(f"plan {best.spec()} re-evaluates to {estimate.step_time_s:.6g} s "
                           f"(fits: {estimate.memory.fits}) against the program's {step:.6g} s")
    return CompileResult(strategy=best, estimate=estimate,
                         certificate=_certificate(search, objective, other_bound, configurations),
                         runners_up=_best_runners_up(search, exclude=best.spec()))
