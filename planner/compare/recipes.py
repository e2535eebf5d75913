"""Published recipes as named baselines: the frameworks' own parallel layouts (hardware/data/recipes.yaml).

`nemo-recipe` takes NVIDIA's Megatron-Bridge performance presets (the NeMo 2 / Megatron-Core recipes) and
`torchtitan-recipe` torchtitan's train_configs, each for the job's model when the file has one.  The row keeps
the recipe's model parallelism (tp, pp, vpp, cp, ep), micro-batch, optimizer sharding and recompute as
published; data parallelism takes the GPUs left, and the job's global batch and sequence length stay the
job's.  It is costed under the framework's runtime profile, with the recipe's source in the row.  A recipe
whose model parallelism does not divide the cluster, or whose micro-batch does not divide the batch, is
reported as not applicable with the arithmetic, not bent to fit.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from planner.job import Job
from planner.strategy import Strategy

RECIPE_BASELINES = {"nemo-recipe": "nemo", "torchtitan-recipe": "torchtitan"}


class PublishedRecipe(BaseModel):
    """One model's layout in a framework's recipe file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = Field(description="Zoo name of the model the recipe trains.")
    tp: int = Field(ge=1, description="Tensor-parallel size.")
    pp: int = Field(ge=1, description="Pipeline stages.")
    vpp: int = Field(1, ge=1, description="Virtual pipeline chunks per stage.")
    cp: int = Field(1, ge=1, description="Context-parallel size.")
    ep: int = Field(1, ge=1, description="Expert-parallel size.")
    mbs: int = Field(ge=1, description="Micro-batch (torchtitan: local_batch_size).")
    zero: int = Field(ge=0, le=3, description="Optimizer/parameter sharding: 1 = Megatron's distributed optimizer, "
                      "3 = FSDP.")
    recompute: Literal["none", "selective", "full", "per-op"] = Field(
        description="Activation recomputation; per-op is torchtitan's selective_ac_option='op' (keeps matmul "
        "outputs, recomputes the rest), which the cost model has no term for.")
    sp: bool = Field(False, description="Sequence parallelism with tp.")
    tp_overlap: bool = Field(False, description="TP communication overlap (async TP, --tp-comm-overlap).")
    preset: str = Field(description="The cluster and batch the recipe was written for.")
    source: str = Field(description="The recipe file and its revision.")

    def strategy(self, dp: int) -> Strategy:
        """The recipe with `dp` data-parallel ranks."""
        assert self.recompute != "per-op"
        return Strategy(tp=self.tp, pp=self.pp, vpp=self.vpp, cp=self.cp, ep=self.ep, dp=dp, mbs=self.mbs,
                        zero=self.zero, recompute=self.recompute, sp=self.sp, tp_overlap=self.tp_overlap)


class RecipeFamily(BaseModel):
    """A framework's recipes and the runtime profile they run under."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runtime: str = Field(description="Runtime profile (hardware/data/runtimes) the recipes are costed under.")
    description: str = Field(description="Where the recipes come from.")
    recipes: list[PublishedRecipe] = Field(description="One entry per model.")


@cache
def load_recipes() -> dict[str, RecipeFamily]:
    """hardware/data/recipes.yaml, validated."""
    text = files("hardware").joinpath("data/recipes.yaml").read_text(encoding="utf-8")
    return {name: RecipeFamily.model_validate(body) for name, body in yaml.safe_load(text).items()}


def recipe_strategy(baseline: str, job: Job) -> tuple[Strategy | None, str, str]:
    """(the recipe's strategy on `job` or None, why not, its source) for baseline `baseline` (RECIPE_BASELINES)."""
    family = load_recipes()[RECIPE_BASELINES[baseline]]
    recipe = next((r for r in family.recipes if r.model == job.model.name), None)
    if recipe is None:
        known = ", ".join(r.model for r in family.recipes)
        return None, f"no published {RECIPE_BASELINES[baseline]} recipe for {job.model.name} (recipes: {known})", ""
    if recipe.recompute == "per-op":  # not Megatron's selective (attention core only): no honest stand-in
        return None, (f"the recipe checkpoints per op (torchtitan selective_ac_option='op'), which the cost model "
                      f"does not model ({recipe.source})"), recipe.source
    model_parallel = recipe.tp * recipe.pp * recipe.cp
    gpus = job.cluster.num_gpus
    if gpus % model_parallel:
        return None, (f"the recipe's tp x pp x cp = {recipe.tp} x {recipe.pp} x {recipe.cp} = {model_parallel} "
                      f"does not divide {gpus} GPUs ({recipe.source})"), recipe.source
    dp = gpus // model_parallel
    if job.global_batch % (dp * recipe.mbs):
        return None, (f"the recipe's micro-batch {recipe.mbs} x dp {dp} does not divide the global batch "
                      f"{job.global_batch} ({recipe.source})"), recipe.source
    return recipe.strategy(dp), "", f"{recipe.source}; written for {recipe.preset}"


def recipe_runtime(baseline: str) -> str:
    """The runtime profile baseline `baseline` is costed under."""
    return load_recipes()[RECIPE_BASELINES[baseline]].runtime
