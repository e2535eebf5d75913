"""The cost model: one `evaluate(job, strategy)` used by estimate, the solver and plan checks."""

from planner.cost.estimate import Breakdown, Estimate, MemoryReport, StageReport
from planner.cost.evaluate import StageCost, evaluate, micro_batches, stage_cost

__all__ = ["Breakdown", "Estimate", "MemoryReport", "StageCost", "StageReport", "evaluate", "micro_batches",
           "stage_cost"]
