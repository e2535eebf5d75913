"""The Plan of any compile result: one strategy's (planner.plan.build) or replica groups'
(planner.plan.replica_groups)."""

from __future__ import annotations

from planner.job import Job
from planner.plan.build import build_single_plan
from planner.plan.replica_groups import build_group_plan
from planner.plan.schema import Plan
from planner.search.result import CompileOptions, CompileResult


def build_plan(job: Job, result: CompileResult, options: CompileOptions) -> Plan:
    """The Plan of a compile result, single-strategy or replica groups: deterministic in (job, result, options)."""
    if result.groups is None:
        return build_single_plan(job, result, options)
    return build_group_plan(job, result, options)
