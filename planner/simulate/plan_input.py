"""Rebuild the job(s) and strategies of a plan.json, and simulate them.

A plan names its model and cluster (`plan.job`): zoo names and PRESET:NODES
load as they are; a model or cluster that came from a file is only named, so
the caller passes the file (`--model`, `--cluster`), and it is checked
against the plan (parameters, GPUs).  Replica-group plans simulate every
group on its pool and add the cross-group sync (planner.cost.replica_groups).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog, HardwareInputError, load_catalog, load_cluster
from models import ModelInputError, load_model
from models.spec import parse_json, read_text
from planner.cost.replica_groups import group_job, sync_seconds
from planner.errors import PlannerInputError
from planner.job import Job
from planner.profile import load_runtime
from planner.plan.build import inputs_digest
from planner.plan.consistency import plan_from_text, stage_problem
from planner.plan.schema import Plan
from planner.simulate.result import TOLERANCE, SimulationResult, summarize
from planner.simulate.simulator import SimulationRun, simulate

EMBEDDING_SCHEMA = "planner.embedding-plan/1"


class GroupSimulation(BaseModel):
    """One simulated strategy of a plan: the whole plan, or one replica group."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pool: str | None = Field(description="The replica group's pool (None for a single-strategy plan).")
    batch: int = Field(description="Sequences per step this strategy trains on.")
    result: SimulationResult = Field(description="The simulated step against evaluate().")


class PlanSimulation(BaseModel):
    """A plan's simulated step against the step time it records."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    simulated_step_s: float = Field(description="Slowest simulated group's step plus the cross-group sync, seconds.")
    analytic_step_s: float = Field(description="evaluate()'s step time of the plan's strategy on the loaded model "
                                   "and cluster (slowest group plus the sync), seconds: recomputed, not read.")
    recorded_step_s: float = Field(description="The step time plan.json records (plan.time.step_time_s), seconds.")
    difference: float = Field(description="(simulated - analytic) / analytic.")
    agrees: bool = Field(description=f"|difference| <= {TOLERANCE:.0%}.")
    sync_s: float = Field(description="Cross-group gradient all-reduce after the groups' steps (0: one strategy).")
    groups: list[GroupSimulation] = Field(description="Each simulated strategy (one for a single-strategy plan).")


def read_plan(path: Path) -> Plan:
    """The plan in `path`, or one line naming the file and what is wrong."""
    if not path.exists():
        raise PlannerInputError(f"{path}: no such plan file")
    try:
        text = read_text(path, "plan file")  # size cap, UTF-8, not a directory
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    try:
        data = parse_json(text, str(path))
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    if isinstance(data, dict) and data.get("schema") == EMBEDDING_SCHEMA:
        raise PlannerInputError(f"{path}: schema: a recommendation-model plan ({EMBEDDING_SCHEMA}); simulate covers "
                                "dense (pipeline) plans only")
    return plan_from_text(text, str(path))


def _load(loader, error: type[Exception], given: str | None, named: str, path: Path, field: str):
    """The model or cluster: the file the user gave (its own errors), or the one the plan names."""
    try:
        return loader(given or named)
    except error as err:
        if given:
            raise
        raise PlannerInputError(f"{path}: job.{field}: '{named}' does not load ({err}); pass --{field} FILE") from None


def plan_job(plan: Plan, path: Path, model: str | None = None, cluster: str | None = None) -> Job:
    """The plan's job from its zoo model / cluster preset names, or from the given files."""
    j = plan.job
    graph = _load(load_model, ModelInputError, model, j.model, path, "model")
    if graph.params != j.model_params:
        raise PlannerInputError(f"{path}: job.model_params: the plan's model has {j.model_params:,} parameters, "
                                f"{model or j.model} has {graph.params:,}")
    problem = stage_problem(plan, graph.num_blocks)
    if problem is not None:
        raise PlannerInputError(f"{path}: {problem}")
    topology = _load(load_cluster, HardwareInputError, cluster, j.cluster, path, "cluster")
    if topology.num_gpus != j.cluster_gpus:
        raise PlannerInputError(f"{path}: job.cluster_gpus: the plan's cluster has {j.cluster_gpus} GPUs, "
                                f"{cluster or j.cluster} has {topology.num_gpus}")
    # validated as it is read: plan.json's precision is a string
    job = Job.model_validate(dict(
        model=graph, cluster=topology, global_batch=j.global_batch, seq_len=j.seq_len, precision=j.precision,
        flash_attention=j.flash_attention, fused_kernels=j.fused_kernels, runtime=load_runtime(j.runtime),
        memory_margin=j.memory_margin, moe_routing=j.moe_routing, routing=j.routing))
    _check_digest(plan, job, path, model, cluster)
    return job


def _check_digest(plan: Plan, job: Job, path: Path, model: str | None, cluster: str | None) -> None:
    """The plan's inputs_digest against the one of the loaded model, cluster, job and the recorded options."""
    if plan.options is None:
        return  # written before the options were recorded: nothing to recompute the digest from
    if inputs_digest(job, plan.options) != plan.inputs_digest:
        given = " and ".join(f"{flag} {value}" for flag, value in (("--model", model), ("--cluster", cluster))
                             if value) or "the model and cluster it names"
        raise PlannerInputError(f"{path}: inputs_digest: the plan was not compiled for {given} with its recorded "
                                "job and options (or plan.json was edited); give the files it was compiled from")


def plan_runs(plan: Plan, job: Job, catalog: Catalog | None = None) -> tuple[list[tuple[str | None, int,
                                                                                       SimulationRun]], float]:
    """(pool, batch, run) of every strategy in the plan, and the cross-group sync seconds."""
    catalog = catalog or load_catalog()
    if not plan.groups:
        return [(None, job.global_batch, simulate(job, plan.single_strategy, catalog))], 0.0
    runs: list[tuple[str | None, int, SimulationRun]] = [
        (g.pool, g.batch, simulate(group_job(job, g.pool, g.batch), g.plan.single_strategy, catalog))
        for g in plan.groups]
    return runs, sync_seconds(job, [g.pool for g in plan.groups], catalog)


def simulate_plan(plan: Plan, runs: list[tuple[str | None, int, SimulationRun]], sync: float) -> PlanSimulation:
    """The plan's simulated step (the slowest group plus the sync) against evaluate() of the same strategies."""
    groups = [GroupSimulation(pool=pool, batch=batch, result=summarize(run)) for pool, batch, run in runs]
    simulated = max(g.result.simulated_step_s for g in groups) + sync
    analytic = max(g.result.analytic_step_s for g in groups) + sync  # the plan's strategy, re-evaluated
    difference = (simulated - analytic) / analytic
    return PlanSimulation(simulated_step_s=simulated, analytic_step_s=analytic,
                          recorded_step_s=plan.time.step_time_s, difference=difference,
                          agrees=abs(difference) <= TOLERANCE, sync_s=sync, groups=groups)
