"""Solve one global configuration: cap its stage times by the incumbent, build its cost tables, build and
solve its CP-SAT program, read the strategy back and keep it if it beats the incumbent.

A step of the branch and bound (`planner.search.branch` decides which configurations reach it).
"""

from __future__ import annotations

import hashlib

import math

from ortools.sat.python import cp_model

from planner.search.ilp.build import build_tables
from planner.search.ilp.model import Program, Row, build_program
from planner.search.ilp.tables import NS, ConfigTables
from planner.search.space import ties_recompute
from planner.search.state import Search, pools_of, price_rate, rate_floor, solve_work
from planner.strategy import Strategy


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


def solve_config(search: Search, config: Strategy, micro_batches: int, bound: float,
                 variants: tuple[dict, ...], runner_up: bool = False, order: float | None = None,
                 offload: bool = False) -> float:
    """Solve one configuration: (1) cap the stage times, (2) build and check its tables, (3) build its
    program, (4) solve it, (5) record the value.  runner_up: only to learn its value for the report (no
    incumbent cap, a short limit, the certificate untouched).  `order`: the key that orders it among the
    runner-up candidates (default its bound).  `offload`: the walk's pass (a configuration the budget cuts short
    is paused with it).

    Returns the bound its tables prove for every plan with any per-stage recompute counts (the tables hold
    them whatever counts the program ties: SpaceOptions.recompute_counts), at least `bound`: inf when no
    plan runs within the incumbent's stage cap, the incumbent or more when the tables prune it.  The
    program's own bound may hold only under the runtime's counts, so it is not this."""
    order = bound if order is None else order
    pools = pools_of(search.job, config)
    floor = rate_floor(search, config, pools)
    cap = _stage_cap(search, config, micro_batches, pools, floor, runner_up)
    settles = search.incumbent * (1 - 1e-9)  # a bound at least this prunes the configuration
    tables = build_tables(search.builder, config, micro_batches, cap, variants,
                          prune=search.options.space.stage_placement, even=search.options.space.split_shape == "even",
                          every_recompute=ties_recompute(search.options.space, config),
                          prune_at=settles / floor if not runner_up else float("inf"))
    if tables is None:
        if cap < float("inf") and not runner_up:  # nothing within the incumbent's cap: a runner-up candidate
            search.near.append((order, config.spec(), config, micro_batches, variants))
        return float("inf")
    table_bound = tables.bottleneck_bound() * floor
    if (table_bound >= settles or tables.relaxed) and not runner_up:
        search.pruned += 1  # its own tables prove it cannot beat the incumbent
        if not runner_up and table_bound < float("inf"):
            search.near.append((table_bound, config.spec(), config, micro_batches, variants))  # a runner-up candidate
        return table_bound
    bound = max(bound, table_bound)
    program, cutoff = _program(search, tables, micro_batches, runner_up)
    if not runner_up and search.spent():  # the budget ran out while the tables were built: visited again on resume
        search.pause([(bound, micro_batches, config)], offload)
        return bound
    digest = None if runner_up else hashlib.blake2b(str(program.model.Proto()).encode(), digest_size=16).digest()
    if digest in search.infeasible:  # the same program was proved infeasible: so is this one
        if cutoff is not None:  # a runner-up candidate, as after an INFEASIBLE solve
            search.near.append((order, config.spec(), config, micro_batches, variants))
        return bound
    solver, status = _solve(search, program, runner_up)
    if status == cp_model.INFEASIBLE and digest is not None:
        search.infeasible.add(digest)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.UNKNOWN and not runner_up:
            search.open_bounds.append(bound)
        elif status == cp_model.INFEASIBLE and cutoff is not None:
            search.near.append((order, config.spec(), config, micro_batches, variants))  # a runner-up candidate
        return bound
    _record(search, program, solver, status, bound, runner_up)
    return bound


def _stage_cap(search: Search, config: Strategy, micro_batches: int, pools: list, floor: float,
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


def _program(search: Search, tables: ConfigTables, micro_batches: int, runner_up: bool) -> tuple[Program, int | None]:
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


def _solve(search: Search, program: Program, runner_up: bool) -> tuple[cp_model.CpSolver, cp_model.CpSolverStatus]:
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
    if len(search.job.cluster.pools) > 1:
        # which pool hosts each stage: the LP relaxation of those choices (level 2 linearizes them all) proves
        # the deep mixed-pool programs infeasible against the incumbent's cutoff at once (llama3-70b on
        # hetero-3pool, tp=1 pp=15 dp=2 cp=8: 0.34 s against 21 s at the default level; docs/solver.md)
        solver.parameters.linearization_level = 2
    # a deterministic limit (the same result on any machine) and the wall-clock time left (a stop by the
    # latter makes the result depend on the machine: flagged)
    work = RUNNER_UP_WORK if runner_up else solve_work(search.options)
    solver.parameters.max_deterministic_time = work
    solver.parameters.max_time_in_seconds = max(0.0, search.remaining()) if runner_up else search.solve_seconds()
    status = solver.solve(program.model)
    if status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and solver.deterministic_time < work * (1 - 1e-6):
        search.stopped = True  # the wall clock, not the work limit, ended this solve
    return solver, status


def _objective_values(search: Search, program: Program, solver: cp_model.CpSolver,
                      strategy: Strategy) -> tuple[float, float]:
    """(the solution's objective, the program's best bound) in SI units: seconds per step, or USD per step.

    The program counts time in nanoseconds x program.scale, and with per-pool prices cost in
    PRICE_UNITS per GPU-hour x microseconds; these are the only conversions back."""
    step = solver.value(program.step) / program.scale / NS
    if program.prices is None:  # the objective is the step time (plus a surcharge, objective time)
        rate = price_rate(search.job, strategy, search.catalog) if search.options.objective == "cost" else 1.0
        value = solver.value(program.objective) / program.scale / NS
        return value * rate, solver.best_objective_bound / program.scale / NS * rate
    usd_per_unit = 1e-6 / PRICE_UNITS / 3600.0
    return step * price_rate(search.job, strategy, search.catalog), solver.best_objective_bound * usd_per_unit


def _record(search: Search, program: Program, solver: cp_model.CpSolver, status: cp_model.CpSolverStatus, bound: float,
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

