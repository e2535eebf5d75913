"""The static plans a data plan is measured against, and the data plan over them.

The compiled plan's strategy and the best plan at every other context-parallel degree (each its own search
with the compile's options and `cp` fixed) are the candidates: `planner.data.plan.plan_data` prices every
static layout of each on the profile's data and the hybrid layout over each, and runs the fastest.  Used by
`planner compile --data-profile` (planner.api) and `planner sweep` with `data_profiles`.
"""

from __future__ import annotations

from collections.abc import Callable

from hardware import load_catalog
from planner.data.plan import plan_data
from planner.data.profile import DataProfile
from planner.data.result import DataPlan
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job
from planner.search.compile import compile_job
from planner.search.result import CompileOptions, CompileResult


def static_candidates(job: Job, options: CompileOptions, result: CompileResult) -> list[CompileResult]:
    """The compiled result, then the best plan at every other power-of-two context-parallel degree that fits
    (none when the caller fixed cp)."""
    candidates = [result]
    degree = 1
    while degree <= job.cluster.num_gpus:
        if degree != result.strategy.cp and "cp" not in options.space.fixed and job.seq_len % (2 * degree) == 0:
            fixed = {**options.space.fixed, "cp": degree}
            pinned = options.model_copy(update={"space": options.space.model_copy(update={"fixed": fixed}),
                                                "runners_up": 0})
            try:
                found = compile_job(job, pinned)
            except (InfeasibleError, PlannerInputError):
                found = None  # nothing fits at this degree
            if found is not None and found.strategy is not None:
                candidates.append(found)
        degree *= 2
    return candidates


def data_plan_over_degrees(job: Job, options: CompileOptions, result: CompileResult, profile: DataProfile,
                           progress: Callable[[str], None] | None = None) -> tuple[DataPlan, CompileResult]:
    """The data plan over the static candidates, and the compile result of the strategy it runs (the plan is
    built from it: its certificate is that search's)."""
    candidates = static_candidates(job, options, result)
    if progress:
        progress(f"data plan: {len(candidates)} static strategies on {profile.name}")
    data, chosen = plan_data(job, profile, [c.strategy for c in candidates], load_catalog())
    return data, candidates[chosen]
