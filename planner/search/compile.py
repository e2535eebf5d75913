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

On a mixed cluster (objective time) the configurations are walked first, with all but GROUP_SHARE of the
time limit; then the replica groups (`planner.search.replica_groups`: a strategy and batch share per pool,
each share a compile of its pool alone through `_compile_pool`) prove that no split beats the configurations'
incumbent, or find one that does (each pool asked only whether a plan within a limit exists: cheap where the
incumbent is good).  Their bound joins the certificate.  When they finish inside the budget, the walk resumes
where the budget paused it (`Search.pause`).  A group plan that fits counts as "something fits" for offload.

The steps live in their own modules: `planner.search.state` (the search's clock, budget and incumbent),
`planner.search.branch` (the configurations in bound order, pruning), `planner.search.config_solve` (one
configuration's tables and program); this module drives them and assembles the result and its certificate.
"""

from __future__ import annotations

from typing import Callable

from hardware import Catalog, load_catalog
from planner.cost import evaluate
from planner.cost.evaluate import has_shared_experts
from planner.cost.replica_groups import ReplicaGroup, evaluate_groups, group_job
from planner.errors import InfeasibleError
from planner.job import Job
from planner.search.branch import legal_configs, resume_configs, search_configs, solve_closest_runners_up, warm
from planner.search.ilp.surcharge import Surcharge
from planner.search.ilp.tables import TableBuilder
from planner.search.replica_groups import GroupSearch, search_groups, share_grid
from planner.search.result import Certificate, CompileOptions, CompileResult, RunnerUp
from planner.search.space import limits_note, narrow_to_runtime
from planner.search.state import Search, price_rate
from planner.strategy import Strategy


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
    search = Search(job=job, options=options, catalog=catalog, builder=TableBuilder(job, catalog), progress=progress,
                     surcharge=surcharge)
    legal = legal_configs(job, options.space)  # counts the space
    with_groups = (len(job.cluster.pools) > 1 and options.objective == "time" and options.space.replica_groups
                   and not surcharge)
    if with_groups:
        # the configurations first, leaving the replica groups GROUP_SHARE of the budget: their plan is the
        # incumbent the groups must beat, and proving that none does asks each pool only whether a plan within a
        # limit exists, which is cheap where the limit is tight
        search.limit = options.time_limit * (1 - GROUP_SHARE)
    warm(search, [config for _, config in legal])
    configs = search_configs(search, legal)
    search.limit = None
    grouped = _search_groups(search) if with_groups else None
    if grouped is not None and search.paused and search.remaining() > 0:
        # the groups left time: the configurations go on, against the groups' plan where it is the better
        if grouped.groups is not None:
            search.incumbent = grouped.objective * (1 + 1e-9)
        resume_configs(search)
    # the groups win when they beat every single strategy found
    has_groups = grouped is not None and grouped.groups is not None and not search.best_step < grouped.objective
    if search.best is None and not has_groups:
        if not configs:
            raise InfeasibleError("no legal strategy: no combination of tp, pp, cp, dp and micro-batch size "
                                  f"divides the model and batch {job.global_batch} on {job.cluster.num_gpus} GPUs"
                                  + limits_note(options.space))
        raise InfeasibleError(_explain_infeasible(job, catalog, options.space.offload_devices))
    solve_closest_runners_up(search)
    if has_groups and grouped is not None and grouped.groups is not None:
        return _group_result(search, grouped, grouped.groups, len(configs))
    if search.best is None:
        raise RuntimeError("no plan: neither a single strategy nor replica groups")
    return _result(search, search.best, len(configs), grouped.bound if grouped is not None else float("inf"))


def _search_groups(search: Search) -> GroupSearch:
    """The replica groups of a mixed cluster, against the configurations' incumbent, within the time left."""
    job, catalog = search.job, search.catalog
    # one table builder per pool: its tables do not depend on the batch share
    builders = {pool.name: TableBuilder(group_job(job, pool.name, job.global_batch), catalog)
                for pool in job.cluster.pools}
    grain = job.global_batch // share_grid(job.global_batch)
    limit = search.options.time_limit
    grouped = search_groups(
        job, lambda sub, cap, first: _compile_pool(search, sub, cap, builders[sub.cluster.pools[0].name], grain,
                                                   limit, first),
        catalog, remaining=lambda: search.remaining(), incumbent=search.incumbent)
    search.stopped = search.stopped or grouped.stopped
    if grouped.groups is not None:
        search.say(f"[{search.elapsed():6.2f}s] replica groups {grouped.objective:.6g} "
                   f"({grouped.compiled} pool compiles)")
    return grouped


GROUP_SHARE = 0.25  # of the time limit, what the configurations leave to the replica groups' pool compiles


def _compile_pool(parent: Search, job: Job, cap: float, builder: TableBuilder, grain: int,
                  time_limit: float, first: bool = False) -> tuple[float, float, "CompileResult | None"]:
    """A replica group's compile: one pool's sub-job under the grain rule, only plans no slower than
    `cap`, on the parent's clock, within `time_limit` of the parent's start; `first`: it stops at its
    first such plan (the question is whether one exists)."""
    space = parent.options.space.model_copy(update={"batch_grain": grain})
    options = parent.options.model_copy(update={"runners_up": 0, "space": space})
    # past the budget, a compile under a cap stops with or without a plan (there is a plan to beat, or the
    # configurations find the first one); one without a cap, asked while no split has a plan, goes on to one
    search = Search(job=job, options=options, catalog=parent.catalog, builder=builder, progress=None,
                    start=parent.start, need_plan=parent.need_plan and cap == float("inf"), limit=time_limit,
                    first_plan=first)
    if cap < float("inf"):
        search.incumbent = cap * (1 + 1e-9)
    legal = legal_configs(job, space)
    warm(search, [config for _, config in legal])
    configs = search_configs(search, legal)
    parent.stopped = parent.stopped or search.cut_short
    if search.best is None:
        return float("inf"), min([cap, *search.bounds_left]), None
    result = _result(search, search.best, len(configs))
    return result.certificate.objective, result.certificate.bound, result


def _group_result(search: Search, grouped: GroupSearch, groups: list[ReplicaGroup],
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


def _certificate(search: Search, objective: float, other_bound: float, configurations: int) -> Certificate:
    """The certificate of `objective`: the bound is the least of it, `other_bound` and the open bounds."""
    bound = min([objective, other_bound, *search.bounds_left])
    gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)
    return Certificate(
        status="OPTIMAL" if gap <= 1e-9 else "FEASIBLE", objective=objective, bound=bound, gap=gap,
        wall_s=search.elapsed(), configurations=configurations, solved=len(search.solved), pruned=search.pruned,
        stopped="time_limit" if search.cut_short else None,
    )


def _best_runners_up(search: Search, exclude: str | None) -> list[RunnerUp]:
    """The best solved configurations other than `exclude`, best first."""
    others = sorted((v, spec) for v, spec, _ in search.solved if spec != exclude)
    return [RunnerUp(strategy=spec, objective=v) for v, spec in others[: search.options.runners_up]]


def _explain_infeasible(job: Job, catalog: Catalog, offload_devices: tuple[str, ...]) -> str:
    from planner.search.explain import explain_infeasible  # explain evaluates strategies; imported when needed

    return explain_infeasible(job, catalog, offload_devices)


def _result(search: Search, best: Strategy, configurations: int, other_bound: float = float("inf")) -> CompileResult:
    """The single-strategy result: `best` (the search's), re-checked by evaluate."""
    estimate = evaluate(search.job, best, catalog=search.catalog)  # the re-check every plan gets
    objective = search.incumbent
    step = (objective / price_rate(search.job, best, search.catalog) if search.options.objective == "cost"
            else search.best_step)
    if not estimate.memory.fits or abs(estimate.step_time_s - step) > 0.005 * step:
        # the tables are built from evaluate's own functions: a disagreement is a bug, not an input error
        raise RuntimeError(f"plan {best.spec()} re-evaluates to {estimate.step_time_s:.6g} s "
                           f"(fits: {estimate.memory.fits}) against the program's {step:.6g} s")
    return CompileResult(strategy=best, estimate=estimate,
                         certificate=_certificate(search, objective, other_bound, configurations),
                         runners_up=_best_runners_up(search, exclude=best.spec()))
