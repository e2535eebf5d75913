"""What a compile is asked and what it returns: options, certificate, runners-up, result.

Kept apart from the search (`planner.search.compile`) so that the plan, the report and
the emitters read these types without the search's imports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.cost import Estimate
from planner.cost.replica_groups import GroupsEstimate
from planner.errors import GroupPlanError
from planner.search.space import SpaceOptions
from planner.strategy import Strategy

Status = Literal["OPTIMAL", "FEASIBLE"]
Prefer = Literal["validated", "fastest"]  # compile --prefer (planner.plan.prefer)


Objective = Literal["time", "cost"]


class CompileOptions(BaseModel):
    """What to optimise and how long to search."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    objective: Objective = Field("time", description="Minimise step time, or cost per step.")
    max_step_time: float | None = Field(None, gt=0, description="With objective=cost: step time limit, seconds.")
    time_limit: float = Field(60.0, gt=0, description="Wall-clock budget of the search, seconds (inf: none; the "
                              "command line asks for a finite one, as plan.json records it).")
    work_limit: float | None = Field(
        None, gt=0, description="Instead of the wall clock: CP-SAT deterministic seconds each program may spend "
        "(about a second of solving each on these machines), and no wall-clock budget at all, so the search stops "
        "at the same point on any machine under any load (time_limit is then ignored).")
    space: SpaceOptions = Field(default_factory=SpaceOptions, description="The strategy space.")
    runners_up: int = Field(5, ge=0, description="Best other configurations to report.")
    prefer: Prefer = Field(
        "validated", description="Which plan to return among those within the model's error of the optimum "
        "(planner.plan.prefer); the search and its certificate are the same either way.")
    space_runtimes: tuple[str, ...] = Field(
        (), description="Runtimes besides the job's own whose strategy spaces `space` was narrowed to (the named "
        "targets' frameworks): the plan is one every one of them can express.")


class Certificate(BaseModel):
    """How good the returned plan is known to be."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    status: Status = Field(description="OPTIMAL (proved) or FEASIBLE (a limit stopped the search: see gap).")
    objective: float = Field(description="Objective of the plan (seconds per step, or USD per step).")
    bound: float = Field(description="No plan in the space does better than this.")
    gap: float = Field(description="(objective - bound) / objective.")
    wall_s: float = Field(description="Search wall time, seconds.")
    configurations: int = Field(description="Global configurations in the space.")
    solved: int = Field(description="Configurations whose program was solved.")
    pruned: int = Field(description="Configurations pruned by their lower bound.")
    stopped: Literal["time_limit"] | None = Field(
        None, description="None: the search ran to its end (the same inputs give the same plan on any machine); "
        "time_limit: the wall-clock budget cut the search or its runners-up short, so the result depends on the "
        "machine's speed and load and another run may differ.")


class RunnerUp(BaseModel):
    """A next-best configuration, for the report."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategy: str = Field(description="Its SPEC string.")
    objective: float = Field(description="Its objective.")


class CompileResult(BaseModel):
    """The chosen strategy, its evaluation and the certificate (or, on a mixed cluster, replica groups)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategy: Strategy | None = Field(description="The plan's strategy; None for a replica-group plan.")
    estimate: Estimate | None = Field(description="evaluate() of the strategy; None for a replica-group plan.")
    certificate: Certificate
    runners_up: list[RunnerUp]
    groups: GroupsEstimate | None = Field(None, description="The replica groups (one strategy and batch share "
                                          "per pool) when they beat every single-strategy plan.")
    group_results: dict[str, "CompileResult"] = Field(
        default_factory=dict, description="Each group's compile of its pool sub-job, by pool.")

    @property
    def single_strategy(self) -> Strategy:
        """The chosen strategy of a single-strategy result; GroupPlanError for replica groups."""
        if self.strategy is None:
            raise GroupPlanError("a replica-group result (a strategy per pool) has no single strategy")
        return self.strategy

    @property
    def single_estimate(self) -> Estimate:
        """evaluate() of the chosen strategy of a single-strategy result; GroupPlanError for replica groups."""
        if self.estimate is None:
            raise GroupPlanError("a replica-group result (a strategy per pool) has no single estimate")
        return self.estimate

    @property
    def replica_groups(self) -> GroupsEstimate:
        """The replica groups of a replica-group result; GroupPlanError for a single-strategy one."""
        if self.groups is None:
            raise GroupPlanError("a single-strategy result has no replica groups")
        return self.groups


CompileResult.model_rebuild()
