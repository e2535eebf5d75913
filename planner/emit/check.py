"""The check every target passes before any of its files is produced: nothing is written that its
framework cannot hold.

For a target T with runtime profile R = TARGET_RUNTIMES[T]:

1. W = T's written strategy (`planner.emit.<T>.written_strategy`): what T's
   files ask the framework to run, after T's substitutions.  A translation that
   has no strategy at all (a replica-group plan, a model the framework cannot
   build, per-stage offload for a one-setting framework) is *unsupported*.
2. R.cannot_express(W) non-empty: *unsupported* (e.g. a mixture-of-experts
   model for a dense-only runtime).
3. Otherwise W is costed under R, and so is the plan's own strategy (the
   reference; when R is the plan's runtime that is the plan's estimate).  W is
   *refused* when it does not fit, or runs more than TOLERANCE slower than the
   reference; else T's files are *written*.

The result is a `planner.plan.targets.TargetCheck` (report.md lists them).
"""

from __future__ import annotations

from hardware import Catalog
from planner.cost import evaluate
from planner.cost.evaluate import has_shared_experts
from planner.cost.layout import split_blocks as layout_split
from planner.emit.inputs import LaunchInputs
from planner.emit import TARGET_RUNTIMES, RefusedPlan, UnsupportedPlan, emitter, strategy_writer
from planner.errors import PlannerInputError
from planner.job import Job
from planner.plan.moe import without_replicas
from planner.plan.schema import Plan
from planner.plan.targets import StageFit, TargetCheck, memory_reason, slower_reason
from planner.profile import RuntimeProfile, load_runtime
from planner.strategy import Strategy

# Largest slowdown of the written strategy against the plan's strategy under the same runtime that still
# writes the files: what `compile --target` promises (its help and report.md state it)
TOLERANCE = 0.005

# targets whose framework holds no expert replicas (Megatron-Core: E/ep consecutive experts a rank): their written
# strategy is costed under the routing statistics' placement without redundant slots
NO_EXPERT_REPLICAS = ("megatron",)
# SPEC keys the canonical spec leaves out at their default, and how to show that default
_OMITTED = {"recompute_layers": "all", "offload_ratio": "1", "regather": "network", "split": "even",
            "stage_pools": "in order", "dp": "auto"}


def _items(strategy: Strategy) -> dict[str, str]:
    """SPEC items of `strategy`, one recompute count where every stage has the same (19/19/19/19 is 19)."""
    layers = strategy.recompute_layers
    if layers is not None and len(set(layers)) == 1:
        strategy = strategy.model_copy(update={"recompute_layers": layers[:1]})
    return dict(item.split("=", 1) for item in strategy.spec().split(","))


def spec_changes(plan_strategy: Strategy, written: Strategy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """('key=value' of the written strategy, 'key=value' of the plan) for every SPEC key they differ in,
    in SPEC order."""
    planned, wrote = _items(plan_strategy), _items(written)
    keys = list(dict.fromkeys([*planned, *wrote]))
    differ = [k for k in keys if planned.get(k) != wrote.get(k)]
    return (tuple(f"{k}={wrote.get(k, _OMITTED.get(k, '-'))}" for k in differ),
            tuple(f"{k}={planned.get(k, _OMITTED.get(k, '-'))}" for k in differ))


def split_blocks(job: Job, strategy: Strategy) -> tuple[int, ...] | None:
    """Blocks per stage of `strategy` (its split, or the even split the cost model uses), None without pp."""
    if strategy.pp == 1:
        return None
    return tuple(len(blocks) for blocks in layout_split(job.model.num_blocks, strategy.pp, strategy.split))


def _unsupported(plan: Plan, target: str, runtime: RuntimeProfile, reasons: list[str],
                 written: Strategy | None = None) -> TargetCheck:
    changed, planned = spec_changes(plan.single_strategy, written) if written is not None else ((), ())
    return TargetCheck(target=target, runtime=runtime.name, status="unsupported", reasons=tuple(reasons),
                       written_spec=written.spec() if written is not None else None, changed=changed,
                       planned=planned, plan_step_time_s=plan.time.step_time_s, tolerance=TOLERANCE)


def check_target(plan: Plan, job: Job, target: str, *, catalog: Catalog | None = None) -> TargetCheck:
    """Whether `target`'s files hold `plan` (compiled for `job`): its written strategy, costed under the
    target's runtime profile, against the plan's strategy under the same profile."""
    runtime = load_runtime(TARGET_RUNTIMES[target])
    if plan.groups:  # every framework here runs one strategy over all its ranks
        return _unsupported(plan, target, runtime, [
            f"a replica-group plan (a strategy per pool) has no {target} form; plan.json lists each group's plan"])
    refusal = runtime.model_refusal(job.model.num_experts, has_shared_experts(job))
    if refusal is not None:  # the model before the strategy
        return _unsupported(plan, target, runtime, [f"the {runtime.name} runtime cannot run {refusal}"])
    try:
        written = strategy_writer(target)(plan, job)
    except UnsupportedPlan as err:
        return _unsupported(plan, target, runtime, [str(err)])
    on_runtime = job.on(runtime)
    missing = runtime.cannot_express(written, model_has_experts=bool(job.model.num_experts),
                                     shared_experts=has_shared_experts(job),
                                     flash_attention=on_runtime.flash, split_blocks=split_blocks(job, written),
                                     micro_batches=job.global_batch // (written.data_parallel * written.mbs))
    if missing:
        return _unsupported(plan, target, runtime, [f"the {runtime.name} runtime cannot run {', '.join(missing)}"],
                            written)
    held = without_replicas(job) if target in NO_EXPERT_REPLICAS else job
    try:
        estimate = evaluate(held, written, runtime, catalog=catalog)
    except PlannerInputError as err:  # the translation broke a rule of the job (e.g. a split of the blocks)
        return _unsupported(plan, target, runtime, [f"the written strategy is not valid for this job: {err}"],
                            written)
    same = runtime.name == plan.job.runtime
    reference = (plan.time.step_time_s if same
                 else evaluate(job, plan.single_strategy, runtime, catalog=catalog).step_time_s)
    changed, planned = spec_changes(plan.single_strategy, written)
    stages = tuple(StageFit(stage=r.stage, peak_bytes=r.peak_bytes, capacity_bytes=r.capacity_bytes, fits=r.fits)
                   for r in estimate.memory.per_stage)
    record = TargetCheck(
        target=target, runtime=runtime.name, status="written", written_spec=written.spec(), changed=changed,
        planned=planned, step_time_s=estimate.step_time_s, tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu,
        fits=estimate.memory.fits, stages=stages, reference_step_time_s=reference,
        plan_step_time_s=plan.time.step_time_s, tolerance=TOLERANCE)
    reasons = []
    if not estimate.memory.fits:
        reasons.append(memory_reason(record.what, stages, estimate.memory.reasons))
    if estimate.step_time_s > reference * (1 + TOLERANCE):
        reasons.append(slower_reason(record.what if not reasons else "it", estimate.step_time_s, reference, same))
    if reasons and held is not job:
        slots = job.routing.redundant_slots if job.routing is not None else 0
        reasons.append(f"{runtime.name} holds no expert replicas, so its files were costed with the plan's "
                       f"expert placement less its {slots} redundant slots (report.md, Expert placement)")
    if reasons:
        record = record.model_copy(update={"status": "refused", "reasons": tuple(reasons)})
    return record


def emit_checked(plan: Plan, job: Job, target: str,
                 inputs: LaunchInputs = LaunchInputs()) -> tuple[TargetCheck, dict[str, str]]:
    """The check of `target` and, when it passes, its files keyed by "target/relative/path" ({} otherwise)."""
    check = check_target(plan, job, target)
    if check.status != "written":
        return check, {}
    try:
        produced = emitter(target)(plan, job, inputs)
    except UnsupportedPlan as err:  # a refusal the emitter makes itself (belt and braces: the check ran it)
        return check.model_copy(update={"status": "unsupported", "reasons": (str(err),)}), {}
    return check, {f"{target}/{path}": text for path, text in sorted(produced.items())}


def emit_targets(plan: Plan, job: Job, targets: tuple[str, ...],
                 inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """Files of every target, keyed by "target/relative/path", each target checked first: UnsupportedPlan when
    its framework cannot express the plan, RefusedPlan when its written strategy would not hold it."""
    files: dict[str, str] = {}
    for target in targets:
        check, produced = emit_checked(plan, job, target, inputs)
        if check.status == "unsupported":
            raise UnsupportedPlan(check.why)
        if check.status == "refused":
            raise RefusedPlan(check.line)
        files.update(produced)
    return files
