"""plan.json of a recommendation job: inputs, the sharding, its estimate and the certificate.

The same envelope as the dense plans (schema tag, inputs digest, job section)
around the embedding compile result; `sharding` is the TorchRec-style file
that `compile -o DIR` also writes on its own as sharding_plan.json.  Wall
times are left out so the same inputs give byte-identical files.
"""

from __future__ import annotations

import json
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.embedding.compile import EmbeddingCompileResult, EmbeddingStrategyName
from planner.embedding.evaluate import EmbeddingEstimate, EmbeddingCostModel
from planner.embedding.sharding_plan import ShardingPlanFile, sharding_plan
from planner.job import Job
from planner.plan.build import inputs_digest, plan_job
from planner.plan.schema import PlanJob

SCHEMA: Final = "planner.embedding-plan/1"


class EmbeddingCompileOptions(BaseModel):
    """What the embedding compile was asked (part of the inputs digest)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategy: EmbeddingStrategyName = Field("planner", description="planner (the compiler) or greedy-torchrec-style "
                                            "(planner's own greedy).")
    time_limit: float = Field(60.0, gt=0, description="CP-SAT deterministic work budget (about seconds).")


class EmbeddingSolver(BaseModel):
    """The certificate, without wall time."""

    model_config = ConfigDict(extra="forbid")
    status: str = Field(description="OPTIMAL, FEASIBLE or BASELINE.")
    form: str = Field(description="exact, relaxed or greedy.")
    objective: float = Field(description="Step seconds of the plan.")
    bound: float = Field(description="No sharding in the space is faster.")
    gap: float = Field(description="(objective - bound) / objective.")
    options: int = Field(description="Table options in the space.")


class EmbeddingPlan(BaseModel):
    """Everything a person or a launcher needs about a recommendation model's plan."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal["planner.embedding-plan/1"] = Field(SCHEMA, alias="schema",
                                                               description="Format of this file.")
    inputs_digest: str = Field(description="sha256 of model, cluster, job and options.")
    job: PlanJob = Field(description="The job.")
    strategy: EmbeddingStrategyName = Field(description="Who planned it.")
    solver: EmbeddingSolver = Field(description="How good the plan is known to be.")
    estimate: EmbeddingEstimate = Field(description="The cost model's evaluation.")
    baseline: EmbeddingEstimate | None = Field(description="The greedy TorchRec-style plan's evaluation (planner's own "
                                                           "greedy, not TorchRec's planner).")
    sharding: ShardingPlanFile = Field(description="Per-table sharding (TorchRec ParameterSharding fields).")


def build_embedding_plan(job: Job, result: EmbeddingCompileResult, options: EmbeddingCompileOptions) -> EmbeddingPlan:
    """The plan document of an embedding compile."""
    model = EmbeddingCostModel(job)
    cert = result.certificate
    return EmbeddingPlan(
        inputs_digest=inputs_digest(job, options), job=plan_job(job, model.sites.world), strategy=result.strategy,
        solver=EmbeddingSolver(status=cert.status, form=cert.form, objective=cert.objective, bound=cert.bound,
                               gap=cert.gap, options=cert.options),
        estimate=result.estimate, baseline=result.baseline,
        sharding=sharding_plan(result, job.model.name, model.costs.tables, model.sites),
    )


def to_json(document: BaseModel) -> str:
    """Deterministic JSON text (field order as declared, aliases, trailing newline)."""
    return json.dumps(document.model_dump(mode="json", by_alias=True), indent=2, allow_nan=False) + "\n"
