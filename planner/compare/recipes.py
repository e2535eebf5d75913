"""Published recipes as compare rows (the recipes themselves: hardware/data/recipes/, planner.recipes).

Every recipe for the job's model is its own row, named after its source (`nemo:LLAMA3_70B_H100_BF16_V1`,
`torchtitan:llama3_70b.toml`), recipes written for the job's GPUs first.  The row keeps the recipe's model
parallelism (tp, pp, vpp, cp, ep, etp), micro-batch, sharding, recompute and overlap flags as published; data
parallelism takes the GPUs left and the job's batch, sequence and precision stay the job's.  It is costed under
the recipe's runtime.  A recipe whose model parallelism does not divide the cluster, or whose micro-batch does
not divide the batch, is not applicable with the arithmetic, not bent to fit.

`nemo-recipe` and `torchtitan-recipe` (sweeps' names) stand for the family's preferred recipe for the job: the
first written for the job's GPUs, else the family's first for the model.
"""

from __future__ import annotations

from hardware.topology import load_cluster
from planner.job import Job
from planner.recipes import PublishedRecipe, load_recipes, recipes_for
from planner.recipes.schema import Family

RECIPE_ALIASES: dict[str, Family] = {"nemo-recipe": "nemo", "torchtitan-recipe": "torchtitan"}


def same_hardware(recipe: PublishedRecipe, job: Job) -> bool:
    """Whether the recipe was written for the job's GPUs (every pool's device is the recipe's)."""
    device = load_cluster(recipe.hardware.cluster).pools[0].node.device
    return all(pool.node.device == device for pool in job.cluster.pools)


def job_recipes(job: Job, family: Family | None = None) -> list[PublishedRecipe]:
    """The model's recipes (of one family when given), those written for the job's GPUs first."""
    found = recipes_for(job.model.name, family)
    return sorted(found, key=lambda r: not same_hardware(r, job))


def preferred(alias: str, job: Job) -> PublishedRecipe | None:
    """The recipe alias `alias` (RECIPE_ALIASES) stands for on `job`, or None when the family has none."""
    found = job_recipes(job, RECIPE_ALIASES[alias])
    return found[0] if found else None


def missing_family(alias: str, job: Job) -> str:
    """Why alias `alias` has no recipe for the job's model: the models its family has recipes for."""
    family = RECIPE_ALIASES[alias]
    models = ", ".join(dict.fromkeys(r.model for r in load_recipes() if r.family == family))
    return f"no published {family} recipe for {job.model.name} (recipes for: {models})"


def recipe_rows(job: Job) -> tuple[str, ...]:
    """The row names of `compare`'s default: each recipe of the model, or the family's alias (a row saying
    there is none) for a family without one."""
    names: list[str] = []
    for alias, family in RECIPE_ALIASES.items():
        found = job_recipes(job, family)
        names += [r.name for r in found] if found else [alias]
    return tuple(names)


def by_name(name: str) -> PublishedRecipe | None:
    """The recipe whose row name is `name`."""
    return next((r for r in load_recipes() if r.name == name), None)
