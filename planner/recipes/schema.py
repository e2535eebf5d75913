"""A published recipe, as its framework's file states it (hardware/data/recipes/*.yaml).

Every value is the recipe file's (or, where the file inherits it, the base recipe's it names in `read`);
nothing is tuned to planner.  `inexpressible` says, in one line, what of the recipe the cost model cannot
run; such a recipe is listed and shown with that reason, not bent into a nearby strategy.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import PlannerInputError
from planner.strategy import Dispatcher

Family = Literal["nemo", "torchtitan"]


class RecipeSource(BaseModel):
    """Where the recipe is published."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    repository: str = Field(description="GitHub owner/name of the framework's repository.")
    path: str = Field(description="File that defines the recipe, relative to the repository root.")
    config: str = Field(description="Name of the recipe in that file (a preset constant, a CSV row, a TOML file).")
    revision: str = Field(description="Release tag (or branch) the values were read at.")
    commit: str = Field(description="Commit of that revision (40 hex digits).", pattern="^[0-9a-f]{40}$")
    read: str = Field(description="What was read to resolve the values the file inherits (base recipes, "
                      "defaults), file by file.")


class RecipeHardware(BaseModel):
    """The machines the recipe was written for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cluster: str = Field(description="planner cluster (PRESET:NODES) of those GPUs.")
    gpus: int = Field(gt=0, description="GPU count the recipe states (num_gpus, or the benchmark's).")
    note: str = Field("", description="Where the count comes from when the recipe file itself does not say.")


class RecipeLayout(BaseModel):
    """The recipe's parallel layout, memory savers and overlap flags, in the framework's own terms."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tp: int = Field(gt=0, description="Tensor-parallel size (tensor_model_parallel_size / tensor_parallel_degree).")
    pp: int = Field(gt=0, description="Pipeline stages (pipeline_model_parallel_size / pipeline_parallel_degree).")
    vpp: int = Field(1, gt=0, description="Virtual pipeline chunks per stage (virtual_pipeline_model_parallel_size; "
                     "1 when unset).")
    cp: int = Field(1, gt=0, description="Context-parallel size.")
    ep: int = Field(1, gt=0, description="Expert-parallel size.")
    etp: int | None = Field(None, gt=0, description="Expert tensor-parallel size; None: the framework's default "
                            "(Megatron: tp).")
    sp: bool = Field(description="Sequence parallelism (Megatron-Bridge: on whenever tp > 1; torchtitan: always "
                     "with tp).")
    mbs: int = Field(gt=0, description="Micro-batch size (torchtitan: training.local_batch_size).")
    sharding: Literal["distributed-optimizer", "megatron-fsdp", "fsdp"] = Field(
        description="Optimizer/parameter sharding over data parallelism: Megatron's distributed optimizer "
        "(ZeRO-1), Megatron FSDP (use_megatron_fsdp, ZeRO-3), or torchtitan's FSDP2 over every data-parallel rank "
        "(data_parallel_shard_degree = -1, ZeRO-3).")
    recompute: Literal["none", "selective", "full"] = Field(
        description="Activation recomputation granularity (Megatron recompute_granularity; torchtitan "
        "activation_checkpoint.mode).")
    recompute_modules: tuple[str, ...] | None = Field(
        None, description="Megatron's --recompute-modules under selective (None: its default, core_attn).")
    recompute_method: Literal["block", "uniform"] | None = Field(
        None, description="Megatron's --recompute-method under full.")
    recompute_num_layers: int | None = Field(None, gt=0, description="Megatron's --recompute-num-layers under full.")
    selective_ac_option: str | None = Field(
        None, description="torchtitan's activation_checkpoint.selective_ac_option: 'op' (per-op SAC) or every "
        "n-th layer.")
    pipeline_layout: str | None = Field(
        None, description="Megatron's --pipeline-model-parallel-layout (E embedding, t block, m MTP, L loss).")
    account_for_embedding_and_loss: bool = Field(
        False, description="--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split.")
    tp_comm_overlap: bool = Field(False, description="TP communication overlap (Megatron --tp-comm-overlap, "
                                  "torchtitan enable_async_tensor_parallel).")
    moe_a2a_overlap: bool = Field(False, description="Megatron --overlap-moe-expert-parallel-comm with "
                                  "--delay-wgrad-compute (Megatron-Bridge moe_a2a_overlap).")
    moe_dispatcher: Dispatcher = Field(
        "alltoall", description="MoE token dispatcher (Strategy.dispatcher): alltoall, or the flex dispatcher's "
        "backend (Megatron-Bridge moe_flex_dispatcher_backend deepep / hybridep).")
    cuda_graphs: str | None = Field(None, description="cuda_graph_impl/scope the recipe sets (None: off).")


class PublishedRecipe(BaseModel):
    """One published recipe of a framework for one model on its hardware."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    family: Family = Field(description="nemo: Megatron-Bridge / NeMo performance configs; torchtitan: its "
                           "train_configs TOMLs.")
    model: str = Field(description="Zoo name of the model the recipe trains.")
    runtime: str = Field(description="Runtime profile (hardware/data/runtimes) it is costed under.")
    target: Literal["megatron", "torchtitan"] = Field(description="planner emit target that writes its files.")
    source: RecipeSource = Field(description="Where it is published.")
    hardware: RecipeHardware = Field(description="The GPUs it was written for.")
    global_batch: int = Field(gt=0, description="Global batch in sequences (torchtitan: local batch x dp).")
    seq_len: int = Field(gt=0, description="Sequence length in tokens.")
    precision: Literal["bf16", "fp8"] = Field(description="Compute precision (fp8: Transformer Engine current "
                                              "scaling or torchao float8 linears).")
    fp8_params: bool = Field(False, description="FP8 recipes: the weights are FP8 tensors (Megatron-Bridge's and NeMo "
                             "2's FP8 precision configs set fp8_param_gather; Job.fp8_params).")
    layout: RecipeLayout = Field(description="Parallel layout, recompute and overlap flags as published.")
    balanced_routing: bool = Field(False, description="The recipe forces even expert loads "
                                   "(Megatron moe_router_force_load_balancing): its own job routes evenly.")
    approximations: str = Field("", description="What of the recipe the cost model leaves out although it "
                                "scores it (e.g. partial CUDA graphs), or ''.")
    inexpressible: str | None = Field(None, description="Why the cost model cannot run this recipe (one line); "
                                      "None when it can.")

    @property
    def name(self) -> str:
        """The row name: family and config, short enough for a table (nemo:LLAMA3_70B_H100_BF16_V1 for
        LLAMA3_70B_PRETRAIN_CONFIG_H100_BF16_V1, nemo:MIXTRAL_8X7B_H100_BF16 for the CSV row
        pre_train,mixtral,8x7b,h100,bf16, torchtitan:llama3_70b.toml)."""
        config = self.source.config
        if "," in config:  # a row of NeMo's recommended_model_configs CSV: task,model,size,system,dtype
            config = "_".join(config.split(",")[1:]).upper()
        return f"{self.family}:{config.replace('_PRETRAIN_CONFIG', '')}"

    @property
    def model_parallel(self) -> int:
        """GPUs of one data-parallel replica: tp x pp x cp."""
        return self.layout.tp * self.layout.pp * self.layout.cp


RECIPE_FOLDER = "data/recipes"


@cache
def load_recipes() -> tuple[PublishedRecipe, ...]:
    """Every recipe file of hardware/data/recipes, validated, in file-name order."""
    folder = files("hardware").joinpath(RECIPE_FOLDER)
    entries = sorted((e for e in folder.iterdir() if e.name.endswith(".yaml")), key=lambda e: e.name)
    return tuple(parse_recipe(f"hardware/{RECIPE_FOLDER}/{e.name}", e.read_text(encoding="utf-8")) for e in entries)


def parse_recipe(path: str, text: str) -> PublishedRecipe:
    """One recipe file's text, validated; PlannerInputError naming the file and the field otherwise."""
    try:
        return PublishedRecipe.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as err:
        raise PlannerInputError(f"{path}: not YAML: {str(err).splitlines()[0]}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise PlannerInputError(f"{path}: {where}: {first['msg']}") from None


def recipes_for(model: str, family: Family | None = None) -> tuple[PublishedRecipe, ...]:
    """The recipes of zoo model `model` (of one family when given)."""
    return tuple(r for r in load_recipes() if r.model == model and family in (None, r.family))
