"""DeepSpeed launch files: ds_config.json, pipeline.json, hostfile, launch.sh, README.md.

`emit(plan, job, inputs)` turns a Plan into the files that run `planner.runtime.deepspeed_train` (the
torch runtime's model and data path under the DeepSpeed engine, pipeline plans through a PipelineModule
split at the plan's boundaries) with DeepSpeed's own launcher. Where DeepSpeed cannot express what the
plan chose, the nearest supported setting is written, and the folder's README.md explains the substitution:
ZeRO-2/3 under its PipelineEngine, NVMe optimizer offload below ZeRO-3, interleaved schedules, fp8, and
uneven recompute counts (and ZeRO-3 for a mixture-of-experts model, which DeepSpeed's MoE layer refuses).
Plans with tensor or context parallelism are refused, because the trainer has none; a mixture-of-experts
model runs DeepSpeed's own MoE layer with the plan's expert parallelism (pipeline.json `moe`,
planner.emit.deepspeed_moe), without pipeline parallelism or shared experts. `written_strategy` reads
ds_config.json and pipeline.json back as the strategy DeepSpeed runs (planner.emit.check costs it before
anything is written).

The modules: deepspeed_config (the settings, ds_config.json, pipeline.json), deepspeed_launch (hostfile,
launch.sh, README.md). Output is deterministic: JSON with sorted keys and indent 2, a trailing newline,
no timestamps, no absolute paths.
"""

from __future__ import annotations

from planner.emit import UnsupportedPlan
from planner.emit.deepspeed_config import Decisions, ds_config, layer_specs, pipeline_json, to_json
from planner.emit.deepspeed_launch import hostfile, launch_sh, readme
from planner.emit.inputs import LaunchInputs
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Offload, OffloadDevice, Recompute, Strategy

__all__ = ["emit", "layer_specs", "written_strategy"]


def _offload_of(section: dict) -> tuple[Offload, OffloadDevice, float]:
    """(offload, device, ratio) of a zero_optimization section."""
    opt, par = section.get("offload_optimizer"), section.get("offload_param")
    kinds: dict[tuple[bool, bool], Offload] = {(False, False): "none", (True, False): "optimizer",
                                               (False, True): "params", (True, True): "all"}
    device = (opt or par or {"device": "cpu"})["device"]
    return kinds[(opt is not None, par is not None)], device, float((opt or {}).get("ratio", 1.0))


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The strategy ds_config.json and pipeline.json ask DeepSpeed to run, read off them: ZeRO stage and
    offload after the PipelineEngine's and ZeRO-Offload's substitutions, 1F1B with one chunk per stage, the
    plan's split (custom parts), one activation-checkpoint count, expert parallelism without the plan's
    expert tensor parallelism or all-to-all overlap (DeepSpeed's MoE has neither). Tensor and context parallel
    sizes are read back as the plan has them: the check then finds that the deepspeed runtime cannot run them."""
    d = Decisions(plan, job)
    config, pipeline = ds_config(d), pipeline_json(d)
    section = config["zero_optimization"]
    offload, device, ratio = _offload_of(section)
    recompute: Recompute = "none"
    recompute_layers: tuple[int, ...] | None = None
    checkpointing = config.get("activation_checkpointing")
    if pipeline["activation_checkpoint_interval"] and checkpointing is not None:
        recompute = "full"
        count = checkpointing["number_checkpoints"]  # the first `count` blocks of every stage
        if count < max(pipeline["blocks_per_stage"]):
            recompute_layers = (count,)
    return Strategy(
        tp=pipeline["tensor_model_parallel_size"], pp=pipeline["pipeline_model_parallel_size"],
        dp=pipeline["data_parallel_size"], cp=pipeline["context_parallel_size"],
        ep=pipeline["expert_parallel_size"], mbs=config["train_micro_batch_size_per_gpu"], vpp=1,
        sp=pipeline["sequence_parallel"] and pipeline["tensor_model_parallel_size"] > 1,
        zero=section["stage"], shard="node" if "zero_hpz_partition_size" in section else "full",
        recompute=recompute, recompute_layers=recompute_layers, offload=offload, offload_device=device,
        offload_ratio=ratio, schedule="1f1b",
        split=tuple(pipeline["blocks_per_stage"]) if pipeline["stages"] > 1 else None,
        stage_pools=plan.single_strategy.stage_pools)


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """DeepSpeed launch files of `plan`, keyed by path relative to the deepspeed/ folder; UnsupportedPlan when
    planner.runtime.deepspeed_train cannot run the plan."""
    d = Decisions(plan, job)
    problem = d.unsupported()
    if problem is not None:
        raise UnsupportedPlan(problem)
    config = ds_config(d, inputs)
    pipeline = pipeline_json(d)
    return {
        "ds_config.json": to_json(config),
        "pipeline.json": to_json(pipeline),
        "hostfile": hostfile(plan),
        "launch.sh": launch_sh(plan, inputs, experts=bool(job.model.num_experts)),
        "README.md": readme(d, inputs),
    }
