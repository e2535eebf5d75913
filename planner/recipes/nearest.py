"""The published recipe nearest a plan, for report.md: the model's recipe written for the plan's GPUs whose
layout is closest to the plan's (else the closest of all), costed on the plan's job under the recipe's
runtime, and the predicted difference."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.job import Job
from planner.recipes.apply import RecipeRun, on_job
from planner.recipes.schema import PublishedRecipe, recipes_for
from planner.strategy import Strategy

# the layout keys whose differences rank recipes against a plan (each differing key counts one)
LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "mbs", "zero", "recompute")


class NearestRecipe(BaseModel):
    """The recipe nearest a plan and how they compare, or why none applies."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    run: RecipeRun | None = Field(None, description="The nearest recipe on the plan's job; None when the model "
                                  "has no published recipe.")
    same_hardware: bool = Field(False, description="The recipe was written for the plan's GPUs.")
    distance: int = Field(0, description="Layout keys (LAYOUT_KEYS) on which the recipe and the plan differ.")
    why: str = Field("", description="Why no recipe applies, or ''.")


def _device(recipe: PublishedRecipe) -> str:
    return recipe.hardware.cluster.split(":")[0]


def _distance(recipe: RecipeRun, plan: Strategy) -> int:
    """Layout keys on which the recipe's strategy on the job differs from the plan's (all when not applicable)."""
    if recipe.strategy is None:
        return len(LAYOUT_KEYS)
    return sum(getattr(recipe.strategy, key) != getattr(plan, key) for key in LAYOUT_KEYS)


def nearest_recipe(job: Job, plan: Strategy) -> NearestRecipe:
    """The model's recipe nearest `plan` on `job`: costed ones first, then those that fit, then those written for
    the job's GPUs (the job's first pool's node preset), then those of the job's precision, then the fewest
    differing layout keys, then file order."""
    recipes = recipes_for(job.model.name)
    if not recipes:
        return NearestRecipe(why=f"no published recipe for {job.model.name} (hardware/data/recipes/)")
    node = job.cluster.pools[0].node.name
    runs = [(on_job(r, job), _device(r) == node) for r in recipes]
    def rank(item: tuple[int, tuple[RecipeRun, bool]]) -> tuple:
        order, (run, same) = item
        fits = run.estimate is not None and run.estimate.memory.fits
        return (run.estimate is None, not fits, not same, run.recipe.precision != job.precision,
                _distance(run, plan), order)

    ranked = sorted(enumerate(runs), key=rank)
    run, same = ranked[0][1]
    return NearestRecipe(run=run, same_hardware=same, distance=_distance(run, plan))


def recipe_section(nearest: NearestRecipe, step_time_s: float, tokens_per_s_per_gpu: float) -> str:
    """report.md's "Nearest published recipe" section: the recipe, its source, its strategy on this job and
    the predicted difference against the plan (its step time and tokens/s per GPU), or why none applies."""
    return "\n".join(_section(nearest, step_time_s, tokens_per_s_per_gpu)) + "\n"


def _section(nearest: NearestRecipe, step_time_s: float, tokens_per_s_per_gpu: float) -> list[str]:
    lines = ["## Nearest published recipe", ""]
    run = nearest.run
    if run is None:
        return lines + [f"None applies: {nearest.why}.", ""]
    r = run.recipe
    hardware = "written for these GPUs" if nearest.same_hardware else "written for other GPUs"
    lines += [f"`{r.name}` ({r.source.repository} `{r.source.path}` {r.source.config}, {r.source.revision}; "
              f"{hardware}: {r.hardware.gpus} x {_device(r)}, global batch {r.global_batch} x {r.seq_len}, "
              f"{r.precision}), costed on this job under the {run.job.runtime.name} runtime.", ""]
    if run.estimate is None:
        return lines + [f"It does not apply here: {run.why}.", ""]
    theirs = run.estimate
    fits = "" if theirs.memory.fits else f" (it does not fit: {theirs.memory.reasons[0]})"
    gain = theirs.step_time_s / step_time_s
    lines += [f"- its strategy here: `{theirs.strategy_spec}`{fits}",
              f"- its step: {theirs.step_time_s:.4f} s, {theirs.tokens_per_s_per_gpu:,.0f} tokens/s per GPU",
              f"- this plan: {step_time_s:.4f} s, {tokens_per_s_per_gpu:,.0f} tokens/s per GPU: "
              f"{gain:.3f}x the recipe's throughput (its step time over the plan's), as predicted by the cost "
              "model, each under its own runtime", ""]
    return lines
