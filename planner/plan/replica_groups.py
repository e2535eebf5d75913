"""The Plan of a replica-group compile: every pool's group with its own plan, and the whole job's summary
(`planner.plan.assemble.build_plan` picks this or the single-strategy plan).

Each group's plan is the single-strategy plan of its pool sub-job (pool alone, its batch
share) and that compile's result, so it carries the group's strategy, stages,
ranks (counted from the group's first rank), memory and certificate.  The
top-level plan has the job, the groups' strategies in one SPEC-like line, the
step time (slowest group plus the cross-group sync), the binding group's
memory and the certificate of the whole search; `layout` is None and
`stages` empty, since no single layout covers the groups.
"""

from __future__ import annotations

from planner.version import __version__
from planner.cost.confidence import Confidence
from planner.cost.replica_groups import group_job
from planner.job import Job
from planner.plan.build import build_single_plan, inputs_digest, plan_job, plan_solver, runner_up
from planner.plan.schema import GroupStrategy, Plan, PlanGroup, PlanMemory, PlanTime, ReplicaGroupsStrategy
from planner.search.result import CompileOptions, CompileResult


def groups_spec(plan_groups: list[PlanGroup]) -> str:
    """One line naming every group: `pool[batch=B]: SPEC; ...`."""
    return "; ".join(f"{g.pool}[batch={g.batch}]: {g.plan.strategy_spec}" for g in plan_groups)


def build_group_plan(job: Job, result: CompileResult, options: CompileOptions) -> Plan:
    """The Plan of a compile result whose answer is replica groups."""
    estimate = result.replica_groups
    offsets, rank, node = {}, 0, 0
    for cluster_pool in job.cluster.pools:
        offsets[cluster_pool.name] = (rank, node)
        rank, node = rank + cluster_pool.gpus, node + cluster_pool.count
    groups = []
    for scored in estimate.groups:
        pool, batch = scored.group.pool, scored.group.batch
        sub = build_single_plan(group_job(job, pool, batch), result.group_results[pool], options)
        groups.append(PlanGroup(pool=pool, batch=batch, first_rank=offsets[pool][0], first_node=offsets[pool][1],
                                plan=sub))
    slowest = max(groups, key=lambda g: g.plan.time.step_time_s)
    binding = max(groups, key=lambda g: g.plan.memory.peak_bytes / g.plan.memory.capacity_bytes)
    # the slowest group's breakdown, with the cross-group sync as exposed data-parallel traffic
    breakdown = slowest.plan.time.breakdown.model_copy(update={
        "dp_comm_s": slowest.plan.time.breakdown.dp_comm_s + estimate.sync_s,
        "exposed_comm_s": slowest.plan.time.breakdown.exposed_comm_s + estimate.sync_s,
        "dp_comm_total_s": slowest.plan.time.breakdown.dp_comm_total_s + estimate.sync_s,
    })
    cert = result.certificate
    return Plan(
        planner_version=__version__,
        inputs_digest=inputs_digest(job, options),
        options=options.model_dump(mode="json"),
        job=plan_job(job, estimate.num_gpus),
        strategy=ReplicaGroupsStrategy(
            replica_groups=[GroupStrategy(pool=g.pool, batch=g.batch, **g.plan.single_strategy.model_dump())
                            for g in groups],
            sync_s=estimate.sync_s),
        strategy_spec=groups_spec(groups),
        layout=None,
        stages=[],
        time=PlanTime(
            step_time_s=estimate.step_time_s, tokens_per_s=estimate.tokens_per_s,
            tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu, mfu=estimate.mfu,
            hfu=estimate.hfu, micro_batches=0, breakdown=breakdown,
        ),
        memory=PlanMemory(**binding.plan.memory.model_dump()),
        solver=plan_solver(cert, options),
        runners_up=[runner_up(job, r.strategy, r.objective, cert.objective) for r in result.runners_up],
        groups=groups,
        confidence=_confidence(groups),
    )


def _confidence(groups: list) -> Confidence:
    """The groups' extrapolated terms together, each named once."""
    found = dict.fromkeys((f"{g.pool}: {r}", d) for g in groups
                          for r, d in zip(g.plan.confidence.reasons, g.plan.confidence.details))
    return Confidence(extrapolated=bool(found), reasons=[r for r, _ in found], details=[d for _, d in found])
