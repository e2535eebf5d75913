"""Choose the plan for a changed allocation: migration time + steps left x step time.

The decomposition (what is optimised, and how):

1. Step time.  The job (same model, global batch, sequence, precision, runtime, memory margin and compile
   options as the old plan) is compiled for the new cluster by `planner.search.compile.compile_job`: branch
   and bound over the global configurations with a CP-SAT program per configuration.  Its certificate
   bounds the step time of every plan in the space (the from-scratch optimum the report compares with).
2. Migration in the programs.  The job is compiled again with the migration as a term of every program
   (planner.replan.program_term): each configuration's program minimises step + migration / steps_left,
   the migration of a split being its busiest receiving port (a lower bound of the exact migration), so
   splits that keep blocks where their state already is win where that pays.  The fastest plan keeping
   the old tp, pp and cp is compiled the same way.  On a mixed cluster (the programs choose each stage's
   pool, so its GPUs are unknown before solving) the term is left out and only step 4 weighs migration.
3. Candidates.  The two compiles' optima and the first's runners-up; the plan keeping tp/pp/cp; and the
   old strategy itself with dp re-derived (old stage boundaries and shard layout) on the most nodes where
   that divides the global batch (the other nodes idle).  Each is re-costed by `evaluate` and must fit,
   and its migration is computed exactly (planner.replan.migration): seconds to move the state, surviving
   GPUs keeping what they hold.
4. The choice.  The candidate with the least migration + steps_left x step time (ties: fewer bytes moved).
   Its certificate: no plan on the compiled cluster totals less than steps_left x the migration-aware
   compile's bound (every program's term is a lower bound of its split's migration), nor less than
   steps_left x the step-time bound + the least migration any layout needs (the state no surviving GPU
   holds, read through the storage and the NICs); gap = (total - the larger bound) / total.

Batch policy: the global batch is kept (the learning-rate schedule and the loss curve stay those of the
old run).  When no strategy of the whole new cluster divides it, or none that does fits, the plan uses the
largest number of nodes that has one that fits (whole nodes dropped from the end of the last pools: fresh
nodes before survivors); the rest stay idle, and the result says so.  Only when no number of nodes has one
does the re-plan fail, with the whole cluster's explanation of what does not fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog, Cluster, Pool, load_catalog
from planner.cost import Estimate, evaluate
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job
from planner.replan.layout import StateLayout, moving_terms, strategy_layout
from planner.replan.migration import (Migration, cluster_rates, migration_floor, plan_migration,
                                      unrecoverable_bytes)
from planner.replan.nodes import NodeMap, map_nodes
from planner.replan.program_term import MigrationSurcharge
from planner.search.compile import compile_job
from planner.search.result import Certificate, CompileOptions, CompileResult, RunnerUp
from planner.search.space import global_configs
from planner.strategy import Strategy, parse_strategy
from planner.validation import check_strategy

Source = Literal["optimum", "runner-up", "least total", "keeps tp/pp/cp", "keeps layout"]
_FIELD = ConfigDict(extra="forbid", frozen=True)
OBJECTIVE = "migration seconds + steps_left x step seconds"


class ReplanOptions(BaseModel):
    """What `planner replan` is asked besides the old plan and the new cluster."""

    model_config = _FIELD
    steps_left: int = Field(gt=0, description="Optimizer steps still to train after the change.")
    checkpoint_bandwidth: float | None = Field(
        None, gt=0, description="Aggregate checkpoint read rate, bytes/s; None: the hardware constant "
        "checkpoint_read_bandwidth_per_node per node that reads.")
    lost_nodes: tuple[int, ...] | None = Field(
        None, description="Old nodes that left (plan.json numbering); None: the last nodes of each shrunk pool.")
    time_limit: float | None = Field(None, gt=0, description="Search budget of each compile, seconds; None: the "
                                     "old plan's.")
    fixed: dict[str, int | str] = Field(default_factory=dict, description="Global choices every candidate keeps "
                                        "(compile's --fix); the old plan's own --fix is not carried over.")


class Candidate(BaseModel):
    """One plan the choice weighed."""

    model_config = _FIELD
    strategy_spec: str = Field(description="Its SPEC.")
    source: Source = Field(description="How it entered the list (see planner.replan.candidates).")
    nodes: int = Field(description="Nodes of the new cluster it uses (fewer when the old layout only divides the "
                       "batch on fewer).")
    step_time_s: float = Field(description="Its step time on the new cluster (evaluate), seconds.")
    migration_s: float = Field(description="Its migration time, seconds.")
    moved_bytes: float = Field(description="Bytes its migration moves (local bytes excluded).")
    kept_bytes: float = Field(description="Bytes already on the GPU that needs them.")
    restart_s: float = Field(description="A restart reading every rank's state from the checkpoint, seconds.")
    total_s: float = Field(description=f"{OBJECTIVE}.")


class ReplanChoice(BaseModel):
    """The choice and its certificate."""

    model_config = _FIELD
    objective: str = Field(OBJECTIVE, description="What was minimised.")
    steps_left: int = Field(description="Steps left, as given.")
    chosen: str = Field(description="SPEC of the chosen plan.")
    candidates: list[Candidate] = Field(description="Every candidate that fits, best total first.")
    step_status: str = Field(description="The step-time search's status (OPTIMAL or FEASIBLE).")
    step_bound_s: float = Field(description="No plan on the new cluster runs a step faster than this, seconds.")
    step_optimum_s: float = Field(description="The fastest plan's step time, seconds.")
    unrecoverable_bytes: float = Field(description="State no surviving GPU holds (read from the checkpoint by "
                                       "any plan).")
    migration_floor_s: float = Field(description="Seconds any plan's migration takes at least.")
    total_s: float = Field(description="The chosen plan's total, seconds.")
    migration_in_programs: bool = Field(description="Whether the migration was a term of the compile's CP-SAT "
                                        "programs (False on a mixed cluster: weighed over the candidates only).")
    program_bound_s: float | None = Field(description="steps_left x the migration-aware compile's bound: no plan's "
                                          "step time x steps_left + migration is below it (None without that "
                                          "compile).")
    total_bound_s: float = Field(description="No plan's total is below this: min(the candidates' best, max("
                                 "program_bound_s, steps_left x step_bound_s + migration_floor_s)).")
    gap: float = Field(description="(total_s - total_bound_s) / total_s.")
    nodes_used: int = Field(description="Nodes of the new cluster the plan uses.")
    nodes_compiled: int = Field(description="Nodes the step-time search planned for (its certificate covers "
                                "plans on them).")
    batch_policy: str = Field(description="How the global batch was kept (and nodes left idle, if any).")


class ReplanResult(BaseModel):
    """Everything `planner replan` writes."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    job: Job = Field(description="The job on the new cluster (or the part of it the plan uses).")
    options: CompileOptions = Field(description="The compile options used.")
    result: CompileResult = Field(description="The chosen strategy as a compile result (its certificate: the "
                                  "step-time search's bound).")
    choice: ReplanChoice
    migration: Migration
    nodes: NodeMap


# ---------------------------------------------------------------- the cluster the plan uses


def _first_nodes(cluster: Cluster, nodes: int) -> Cluster:
    """The cluster cut to its first `nodes` nodes (pools in order)."""
    pools, left = [], nodes
    for pool in cluster.pools:
        if left <= 0:
            break
        pools.append(Pool(name=pool.name, node=pool.node, count=min(pool.count, left)))
        left -= pool.count
    shorthand = re.fullmatch(r"(.+):(\d+)", cluster.name)
    name = f"{shorthand.group(1)}:{nodes}" if shorthand and len(cluster.pools) == 1 else f"{cluster.name}-{nodes}-nodes"
    return Cluster(name=name, pools=pools, fabric=cluster.fabric)


def _policy(job: Job, nodes: int, why: str) -> str:
    total = job.cluster.num_nodes
    if nodes == total:
        return f"global batch {job.global_batch} kept; every node used"
    return (f"global batch {job.global_batch} kept: {why} on all {total} nodes, so the plan uses the first {nodes} "
            f"({total - nodes} idle)")


def compile_usable(job: Job, options: CompileOptions,
                   progress: Callable[[str], None] | None = None) -> tuple[Job, str, CompileResult]:
    """(the job on the most nodes of its cluster where a plan divides the global batch and fits, the batch
    policy in words, its compile).  Nodes are dropped from the end (fresh nodes before survivors); when no
    number of nodes has a plan, the whole cluster's InfeasibleError (what does not fit, by how much)."""
    first_error: InfeasibleError | None = None
    why = "no strategy divides it"
    for nodes in range(job.cluster.num_nodes, 0, -1):
        sub = job if nodes == job.cluster.num_nodes else job.model_copy(
            update={"cluster": _first_nodes(job.cluster, nodes)})
        if next(iter(global_configs(sub, options.space)), None) is None:
            continue
        try:
            return sub, _policy(job, nodes, why), _compile(sub, options, progress)
        except InfeasibleError as err:
            first_error = first_error or err
            why = "no strategy that divides it fits"
    if first_error is not None:
        raise first_error
    raise InfeasibleError(f"no legal strategy: no combination of tp, pp, cp, dp and micro-batch size divides batch "
                          f"{job.global_batch} on any number of nodes of {job.cluster.name}")


# ---------------------------------------------------------------- candidates


def _compile(job: Job, options: CompileOptions, progress: Callable[[str], None] | None,
             surcharge: MigrationSurcharge | None = None) -> CompileResult:
    result = compile_job(job, options, progress=progress, surcharge=surcharge)
    if result.strategy is None:  # replica groups are off (see replan); a guard, not a user error
        raise RuntimeError("the re-plan's compile returned replica groups")
    return result


def _respects(strategy: Strategy, fixed: dict[str, int | str]) -> bool:
    return all(getattr(strategy, key) == value for key, value in fixed.items())


def _keeps_degrees(job: Job, options: CompileOptions, old: Strategy,
                   surcharge: MigrationSurcharge | None) -> Strategy | None:
    """The best plan with the old tp, pp and cp (and ep, where the new cluster allows it: experts stay on their
    ranks), by step time (+ the amortised migration with a surcharge); None when the new cluster has none that
    fits."""
    degrees = {"tp": old.tp, "pp": old.pp, "cp": old.cp}
    if any(options.space.fixed.get(key, value) != value for key, value in degrees.items()):
        return None  # --fix asks for other degrees
    tries = [{**degrees, "ep": old.ep}, degrees] if old.ep > 1 and "ep" not in options.space.fixed else [degrees]
    for fixed in tries:
        space = options.space.model_copy(update={"fixed": {**options.space.fixed, **fixed}})
        try:
            return _compile(job, options.model_copy(update={"space": space, "runners_up": 0}), None,
                            surcharge).strategy
        except InfeasibleError:
            continue
    return None


def _keeps_layout(job: Job, old: Strategy) -> tuple[Job, Strategy] | None:
    """The old strategy with dp re-derived, on the most nodes of the cluster where that is legal (the others
    idle); None when no number of nodes allows it."""
    for nodes in range(job.cluster.num_nodes, 0, -1):
        sub = job if nodes == job.cluster.num_nodes else job.model_copy(
            update={"cluster": _first_nodes(job.cluster, nodes)})
        try:
            return sub, check_strategy(sub, old.model_copy(update={"dp": None}))
        except PlannerInputError:
            continue
    return None


def _candidates(job: Job, options: CompileOptions, old: Strategy, best: CompileResult,
                aware: CompileResult | None,
                surcharge: MigrationSurcharge | None) -> list[tuple[Source, Strategy, Job]]:
    out: list[tuple[Source, Strategy, Job]] = [("optimum", best.single_strategy, job)]
    if aware is not None:
        out.append(("least total", aware.single_strategy, job))
    out += [("runner-up", check_strategy(job, parse_strategy(r.strategy)), job) for r in best.runners_up]
    kept = _keeps_degrees(job, options, old, surcharge)
    if kept is not None:
        out.append(("keeps tp/pp/cp", kept, job))
    layout = _keeps_layout(job, old)
    if layout is not None and _respects(layout[1], options.space.fixed):
        out.append(("keeps layout", layout[1], layout[0]))
    seen, unique = set(), []
    for source, strategy, on in out:
        key = (strategy.spec(), on.cluster.num_nodes)
        if key not in seen:
            seen.add(key)
            unique.append((source, strategy, on))
    return unique


# ---------------------------------------------------------------- the choice


@dataclass
class _Weighed:
    candidate: Candidate
    strategy: Strategy
    estimate: Estimate
    job: Job


def _weigh(source: Source, strategy: Strategy, job: Job, old_layout: StateLayout, old_job: Job, ask: ReplanOptions,
           catalog: Catalog) -> _Weighed | None:
    """A candidate's step time and migration on its cluster (None when it does not fit).  The old layout keeps
    its state layout, not its recompute counts: tuned for the old memory, they may not fit now, so it may
    recompute every block instead."""
    estimate = evaluate(job, strategy, catalog=catalog)
    if not estimate.memory.fits and source == "keeps layout" and strategy.recompute_layers is not None:
        estimate = evaluate(job, strategy.model_copy(update={"recompute": "full", "recompute_layers": None}),
                            catalog=catalog)
    if not estimate.memory.fits:
        return None
    resolved = Strategy.model_validate(estimate.strategy)
    migration = _migration(old_layout, old_job, job, resolved, ask, catalog, moves=False)
    total = migration.moved.seconds + ask.steps_left * estimate.step_time_s
    return _Weighed(Candidate(strategy_spec=estimate.strategy_spec, source=source, nodes=job.cluster.num_nodes,
                              step_time_s=estimate.step_time_s, migration_s=migration.moved.seconds,
                              moved_bytes=migration.moved.bytes, kept_bytes=migration.kept_bytes,
                              restart_s=migration.restart.seconds, total_s=total), resolved, estimate, job)


def _migration(old_layout: StateLayout, old_job: Job, job: Job, strategy: Strategy, ask: ReplanOptions,
               catalog: Catalog, moves: bool) -> Migration:
    nodes = map_nodes(old_job.cluster, job.cluster, ask.lost_nodes, idle=True)
    rates = cluster_rates(job.cluster, catalog, ask.checkpoint_bandwidth)
    return plan_migration(old_layout, strategy_layout(job.model, job.cluster, strategy), moving_terms(job.runtime),
                          nodes, rates, job.model, moves=moves)


def replan(old_layout: StateLayout, old_job: Job, old_options: CompileOptions, new_cluster: Cluster,
           ask: ReplanOptions, progress: Callable[[str], None] | None = None,
           catalog: Catalog | None = None) -> ReplanResult:
    """Compile for `new_cluster`, weigh the candidates by migration + steps left x step time, pick one."""
    catalog = catalog or load_catalog()
    options = old_options.model_copy(update={
        # one strategy to migrate to; the old --fix was for the old allocation
        "space": old_options.space.model_copy(update={"replica_groups": False, "fixed": dict(ask.fixed)}),
        **({"time_limit": ask.time_limit} if ask.time_limit is not None else {})})
    map_nodes(old_job.cluster, new_cluster, ask.lost_nodes)  # --lost-nodes checked against the whole new cluster
    job, policy, best = compile_usable(old_job.model_copy(update={"cluster": new_cluster}), options, progress)
    nodes = map_nodes(old_job.cluster, job.cluster, ask.lost_nodes, idle=True)
    surcharge = aware = None
    if len(job.cluster.pools) == 1:
        surcharge = MigrationSurcharge(old_layout, job, nodes, cluster_rates(job.cluster, catalog,
                                       ask.checkpoint_bandwidth), moving_terms(job.runtime), ask.steps_left)
        aware = _compile(job, options.model_copy(update={"runners_up": 0}), progress, surcharge)
    weighed = [w for source, strategy, on in _candidates(job, options, old_layout.strategy, best, aware, surcharge)
               if (w := _weigh(source, strategy, on, old_layout, old_job, ask, catalog)) is not None]
    weighed = _ranked(weighed)
    chosen = weighed[0]
    migration = _migration(old_layout, old_job, chosen.job, chosen.strategy, ask, catalog, moves=True)
    nodes = map_nodes(old_job.cluster, chosen.job.cluster, ask.lost_nodes, idle=True)
    terms = moving_terms(job.runtime)
    lost = unrecoverable_bytes(old_layout, terms, nodes)
    floor = migration_floor(lost, cluster_rates(job.cluster, catalog, ask.checkpoint_bandwidth), job.cluster.num_nodes)
    cert = best.certificate
    total = chosen.candidate.total_s
    program_bound = ask.steps_left * aware.certificate.bound if aware is not None else None
    bound = min(total, max(ask.steps_left * cert.bound + floor, program_bound or 0.0))
    if chosen.job.cluster.num_nodes != job.cluster.num_nodes:
        policy = (f"global batch {job.global_batch} kept; the chosen plan keeps the old layout on the first "
                  f"{chosen.job.cluster.num_nodes} of {job.cluster.num_nodes} nodes (the rest idle)")
    choice = ReplanChoice(
        steps_left=ask.steps_left, chosen=chosen.candidate.strategy_spec, candidates=[w.candidate for w in weighed],
        step_status=cert.status, step_bound_s=cert.bound, step_optimum_s=cert.objective, unrecoverable_bytes=lost,
        migration_floor_s=floor, migration_in_programs=aware is not None, program_bound_s=program_bound,
        total_s=total, total_bound_s=bound,
        gap=max(0.0, (total - bound) / total) if total > 0 else 0.0, nodes_used=chosen.job.cluster.num_nodes,
        nodes_compiled=job.cluster.num_nodes,
        batch_policy=policy)
    return ReplanResult(job=chosen.job, options=options,
                        result=_as_result(best, chosen.strategy, chosen.estimate, chosen.job),
                        choice=choice, migration=migration, nodes=nodes)


TIE = 1e-6  # totals this close (relative) are equal: the one moving fewer bytes wins, then the earlier candidate


def _ranked(weighed: list[_Weighed]) -> list[_Weighed]:
    """Candidates best first: least total; among totals within TIE of each other, fewer bytes moved, then the
    candidates' own order (the step-time optimum first)."""
    order = {id(item): i for i, item in enumerate(weighed)}
    out, rest = [], list(weighed)
    while rest:
        least = min(item.candidate.total_s for item in rest)
        tied = [item for item in rest if item.candidate.total_s <= least * (1 + TIE)]
        pick = min(tied, key=lambda item: (item.candidate.moved_bytes, order[id(item)]))
        out.append(pick)
        rest.remove(pick)
    return out


def _as_result(best: CompileResult, strategy: Strategy, estimate: Estimate, job: Job) -> CompileResult:
    """The chosen strategy as a compile result: the step-time search's bound, its own step time as the
    objective (FEASIBLE with a gap when it is not the step-time optimum), the search's runners-up and, when
    another plan was chosen, the optimum among them: those that run on the chosen plan's nodes (a plan kept
    on fewer nodes than were compiled is no place for the others)."""
    cert = best.certificate
    if strategy.spec() == best.single_strategy.spec():
        return best
    gap = max(0.0, (estimate.step_time_s - cert.bound) / estimate.step_time_s)
    certificate = Certificate(status="OPTIMAL" if gap <= 1e-9 else "FEASIBLE", objective=estimate.step_time_s,
                              bound=cert.bound, gap=gap, wall_s=cert.wall_s, configurations=cert.configurations,
                              solved=cert.solved, pruned=cert.pruned, stopped=cert.stopped)
    others = [RunnerUp(strategy=best.single_strategy.spec(), objective=cert.objective)]
    others += [r for r in best.runners_up if r.strategy != strategy.spec()]
    others = [r for r in others if _runs_on(job, r.strategy)]
    return CompileResult(strategy=strategy, estimate=estimate, certificate=certificate, runners_up=others)


def _runs_on(job: Job, spec: str) -> bool:
    """Whether the strategy SPEC holds on `job` (its degrees fill the job's GPUs)."""
    try:
        check_strategy(job, parse_strategy(spec))
    except PlannerInputError:
        return False
    return True


def old_options(plan_options: dict | None) -> CompileOptions:
    """The compile options an old plan records (a re-plan's own `replan` record dropped); defaults when it
    records none."""
    if plan_options is None:
        return CompileOptions()
    return CompileOptions.model_validate({k: v for k, v in plan_options.items() if k != "replan"})
