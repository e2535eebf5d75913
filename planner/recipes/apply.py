"""A published recipe as planner runs it: its Strategy, its own job (hardware, batch, sequence, precision,
runtime), the same layout on another job (data parallelism from the GPUs left), and why the cost model
cannot run it when it cannot."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hardware import load_catalog
from hardware.topology import load_cluster
from models import load_model
from planner.chunks import accounted_split
from planner.cost import evaluate
from planner.cost.estimate import Estimate
from planner.cost.evaluate import has_shared_experts
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job
from planner.profile import load_runtime
from planner.recipes.schema import PublishedRecipe
from planner.strategy import Recompute, Strategy

# Megatron's --recompute-modules default: the attention core alone, which the cost model's selective mode is
MEGATRON_SELECTIVE = ("core_attn",)


def layout_split(layout: str, pp: int) -> tuple[int, ...]:
    """Transformer blocks ('t') per stage of a --pipeline-model-parallel-layout, its `x*n` and `(...)*n`
    repetitions written out as Megatron-Core unrolls them; chunk c belongs to stage c % pp."""
    text = layout.replace(",", "")
    while "(" in text:  # innermost group first: (body)*n
        start = text.rindex("(")
        end = text.index(")", start)
        times, rest = _count(text[end + 2:]) if text[end + 1:end + 2] == "*" else (1, text[end + 1:])
        text = text[:start] + text[start + 1:end] * times + rest
    chunks = [_blocks(chunk) for chunk in text.split("|")]
    return tuple(sum(chunks[c] for c in range(s, len(chunks), pp)) for s in range(pp))


def _count(text: str) -> tuple[int, str]:
    digits = len(text) - len(text.lstrip("0123456789"))
    return int(text[:digits]), text[digits:]


def _blocks(chunk: str) -> int:
    """Blocks in one chunk: each 't', or 't*n'."""
    total, i = 0, 0
    while i < len(chunk):
        if chunk[i] == "t" and chunk[i + 1:i + 2] == "*":
            n, rest = _count(chunk[i + 2:])
            total, i = total + n, len(chunk) - len(rest)
            continue
        total, i = total + (chunk[i] == "t"), i + 1
    return total


def refusal(recipe: PublishedRecipe) -> str:
    """What of `recipe` the cost model cannot run ('' when it can run all of it): recompute modules other than
    Megatron's default, and what its runtime profile cannot cost of its layout on its own hardware."""
    modules = recipe.layout.recompute_modules
    reasons = []
    if recipe.layout.recompute == "selective" and modules not in (None, MEGATRON_SELECTIVE):
        reasons.append(f"recompute_modules {', '.join(modules or ())}: planner's selective recompute is "
                       f"Megatron's default ({', '.join(MEGATRON_SELECTIVE)}) only")
    model = load_model(recipe.model)
    strategy = recipe_strategy(recipe, recipe.hardware.gpus // recipe.model_parallel, model.num_blocks)
    shared = any(layer.moe is not None and layer.moe.shared_experts for layer in model.layers)
    missing = load_runtime(recipe.runtime).cannot_express(strategy, bool(model.num_experts), shared_experts=shared)
    if missing:
        reasons.append(f"the {recipe.runtime} runtime profile cannot cost {'; '.join(missing)}")
    return "; ".join(reasons)


def _recompute(recipe: PublishedRecipe) -> dict:
    """The Strategy fields of the recipe's activation recomputation."""
    layout = recipe.layout
    option = layout.selective_ac_option
    if layout.recompute == "selective" and option not in (None, "op"):  # torchtitan: every n-th block
        every = int(option)
        return {"recompute": "full", "recompute_every": None if every == 1 else every}
    mode: Recompute = layout.recompute
    if mode == "full" and layout.recompute_method == "block" and layout.recompute_num_layers is not None:
        return {"recompute": mode, "recompute_layers": (layout.recompute_num_layers,)}
    return {"recompute": mode}


def _split(recipe: PublishedRecipe, blocks: int) -> tuple[int, ...] | None:
    """Blocks per stage the recipe's layout gives (None: the runtime's default split)."""
    layout = recipe.layout
    if layout.pipeline_layout is not None:
        return layout_split(layout.pipeline_layout, layout.pp)
    if layout.account_for_embedding_and_loss and layout.pp > 1:
        return accounted_split(blocks, layout.pp, layout.vpp)
    return None


def recipe_strategy(recipe: PublishedRecipe, dp: int, blocks: int) -> Strategy:
    """The recipe's layout with `dp` data-parallel ranks on a model of `blocks` transformer blocks."""
    layout = recipe.layout
    zero = 3 if layout.sharding in ("megatron-fsdp", "fsdp") else (1 if dp > 1 else 0)
    return Strategy(tp=layout.tp, pp=layout.pp, vpp=layout.vpp, cp=layout.cp, ep=layout.ep, etp=layout.etp,
                    dp=dp, mbs=layout.mbs, sp=layout.sp and layout.tp > 1, zero=zero,
                    tp_overlap=layout.tp_comm_overlap, ep_overlap=layout.moe_a2a_overlap,
                    dispatcher=layout.moe_dispatcher if layout.ep > 1 else "alltoall",
                    split=_split(recipe, blocks), **_recompute(recipe))


class RecipeRun(BaseModel):
    """A recipe on a job: the strategy and its estimate, or why it is not costed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    recipe: PublishedRecipe = Field(description="The published recipe.")
    job: Job = Field(description="The job it runs (under the recipe's runtime).")
    strategy: Strategy | None = Field(None, description="Its strategy on the job; None when not applicable.")
    estimate: Estimate | None = Field(None, description="The strategy's estimate; None when not costed.")
    why: str = Field("", description="Why it is not costed (the refusal or the arithmetic), or ''.")
    applicable: bool = Field(True, description="False when the recipe cannot run on the job at all.")


def own_job(recipe: PublishedRecipe) -> Job:
    """The job the recipe was written for: its model, hardware, batch, sequence, precision and runtime."""
    job = Job(model=load_model(recipe.model), cluster=load_cluster(recipe.hardware.cluster),
              global_batch=recipe.global_batch, seq_len=recipe.seq_len, precision=recipe.precision,
              fp8_params=recipe.fp8_params, moe_routing="balanced" if recipe.balanced_routing else "learned",
              memory_margin=load_catalog().constant("memory_margin_default"))
    return job.on(load_runtime(recipe.runtime))


def on_own_hardware(recipe: PublishedRecipe) -> RecipeRun:
    """The recipe costed on the job it was written for."""
    return on_job(recipe, own_job(recipe))


def _fit(recipe: PublishedRecipe, job: Job) -> tuple[Strategy | None, str]:
    """(the recipe's strategy on `job`, '') or (None, the arithmetic that rules it out)."""
    gpus, mp, layout = job.cluster.num_gpus, recipe.model_parallel, recipe.layout
    if gpus % mp:
        return None, (f"tp x pp x cp = {layout.tp} x {layout.pp} x {layout.cp} = {mp} does not divide "
                      f"{gpus} GPUs")
    dp = gpus // mp
    if job.global_batch % (dp * layout.mbs):
        return None, (f"micro-batch {layout.mbs} x dp {dp} = {dp * layout.mbs} does not divide the global "
                      f"batch {job.global_batch}")
    return recipe_strategy(recipe, dp, job.model.num_blocks), ""


def on_job(recipe: PublishedRecipe, job: Job) -> RecipeRun:
    """The recipe's layout on `job` (under the recipe's runtime): data parallelism takes the GPUs its model
    parallelism leaves; the job's batch, sequence and precision stay the job's."""
    job = job.on(load_runtime(recipe.runtime))
    blocked = refusal(recipe)
    if blocked:
        return RecipeRun(recipe=recipe, job=job, why=blocked, applicable=False)
    strategy, why = _fit(recipe, job)
    if strategy is None:
        return RecipeRun(recipe=recipe, job=job, why=why, applicable=False)
    missing = job.runtime.cannot_express(strategy, bool(job.model.num_experts), job.flash,
                                         shared_experts=has_shared_experts(job))
    if missing:
        return RecipeRun(recipe=recipe, job=job, strategy=strategy, applicable=False,
                         why=f"{job.runtime.name} cannot run {'; '.join(missing)}")
    try:
        estimate = evaluate(job, strategy)
    except (PlannerInputError, InfeasibleError) as err:  # the layout breaks a rule of this job (heads and tp)
        return RecipeRun(recipe=recipe, job=job, strategy=strategy, why=str(err).splitlines()[0], applicable=False)
    return RecipeRun(recipe=recipe, job=job, strategy=strategy, estimate=estimate)
