"""compile --prefer: which plan to return among those the cost model cannot tell apart from the optimum.

The search certifies the optimum of the stated objective, and that certificate stands whatever is chosen.
Under `validated` (the default) the optimum is set aside when its advantage is smaller than the model's error
in comparing two plans (planner.cost.interval, comparison_error) and it buys that advantage with risk: it
leaves less than
`validated_hbm_headroom` of its usable HBM free, or it leans on more terms no published run validates
(planner.cost.confidence).  The plan returned is then the fastest runner-up within that error of the optimum
which carries less of that risk; the optimum stays in the plan as `preference` and
in the runners-up, so report.md shows both.  `fastest` returns the optimum.  Replica-group plans and the
cost objective return the optimum (their intervals are per group, or in dollars).
"""

from __future__ import annotations

from hardware import Catalog, load_catalog
from planner.cost.estimate import Estimate
from planner.cost.evaluate import evaluate
from planner.job import Job
from planner.plan.schema import PlanPreference
from planner.search.result import CompileOptions, CompileResult, RunnerUp
from planner.strategy import Strategy, parse_strategy


class Risk:
    """What an estimate risks: too little HBM headroom, and its extrapolated terms."""

    def __init__(self, estimate: Estimate, catalog: Catalog):
        worst = max(estimate.memory.per_stage, key=lambda r: r.peak_bytes / r.capacity_bytes)
        self.free_gb = (worst.capacity_bytes - worst.peak_bytes) / 1e9
        self.capacity_gb = worst.capacity_bytes / 1e9
        self.tight = self.free_gb < catalog.constant("validated_hbm_headroom") * self.capacity_gb
        self.extrapolated = len(estimate.confidence.reasons)

    def lower_than(self, other: Risk) -> bool:
        """No more of either risk than `other`, and less of one."""
        return (self.tight <= other.tight and self.extrapolated <= other.extrapolated
                and (self.tight < other.tight or self.extrapolated < other.extrapolated))

    def reasons_against(self, chosen: Risk, catalog: Catalog) -> list[str]:
        """Why this (the optimum's) risk was set aside for `chosen`'s."""
        out = []
        if self.tight and not chosen.tight:
            share = catalog.constant("validated_hbm_headroom")
            out.append(f"the optimum leaves {self.free_gb:.1f} of {self.capacity_gb:.1f} GB HBM free (< {share:.0%}); "
                       f"the plan leaves {chosen.free_gb:.1f}")
        if chosen.extrapolated < self.extrapolated:
            out.append(f"the optimum has {self.extrapolated} extrapolated terms, the plan {chosen.extrapolated}")
        return out


def prefer(job: Job, result: CompileResult, options: CompileOptions,
           catalog: Catalog | None = None) -> tuple[CompileResult, PlanPreference | None]:
    """The result to build the plan from under `options.prefer`, and the preference record (None where the
    rule does not apply: replica groups, the cost objective, nothing found)."""
    best = result.estimate
    if best is None or result.groups is not None or options.objective != "time":
        return result, None
    catalog = catalog or load_catalog()
    record = PlanPreference(rule=options.prefer, optimum_spec=best.strategy_spec,
                            optimum_step_time_s=best.step_time_s, chose_optimum=True, reasons=[])
    if options.prefer == "fastest":
        return result, record
    risk = Risk(best, catalog)
    for runner in result.runners_up:  # best first: the first with less risk is the alternative
        estimate = evaluate(job, parse_strategy(runner.strategy), catalog=catalog)
        candidate = Risk(estimate, catalog)
        if not (estimate.memory.fits and candidate.lower_than(risk)):
            continue
        reasons = risk.reasons_against(candidate, catalog)
        alternative = {"alternative_spec": estimate.strategy_spec, "alternative_step_time_s": estimate.step_time_s}
        if best.interval.indistinguishable(estimate.step_time_s, best.step_time_s):
            return _swap(result, runner, estimate), record.model_copy(
                update={"chose_optimum": False, "reasons": reasons, **alternative})
        return result, record.model_copy(update={"reasons": reasons, **alternative})
    return result, record


def _swap(result: CompileResult, runner: RunnerUp, estimate: Estimate) -> CompileResult:
    """The result with `runner` as its plan and the optimum first among the runners-up."""
    optimum = RunnerUp(strategy=result.estimate.strategy_spec, objective=result.certificate.objective)
    others = [r for r in result.runners_up if r.strategy != runner.strategy]
    return result.model_copy(update={"strategy": Strategy.model_validate(estimate.strategy), "estimate": estimate,
                                     "runners_up": [optimum, *others]})
