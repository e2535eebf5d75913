"""The cost model: one `evaluate(job, strategy)` used by estimate, the solver and plan checks."""

from planner.cost.estimate import Breakdown, Estimate, MemoryReport, StageReport
from planner.cost.evaluate import evaluate, micro_batches, refusals, stage_cost
from planner.cost.stage import StageCost, compose_stage, sum_layers
from planner.cost.sums import StageSums

__all__ = ["Breakdown", "Estimate", "MemoryReport", "StageCost", "StageReport", "StageSums", "compose_stage",
           "evaluate", "micro_batches", "refusals", "stage_cost", "sum_layers"]
