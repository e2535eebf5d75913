"""torchtitan target: `train.toml`, `launch.sh`, `README.md`.

Targets the TOML job config of torchtitan v0.1.0 (`torchtitan/config/job_config.py`:
sections [job] [model] [optimizer] [lr_scheduler] [training] [parallelism]
[checkpoint] [activation_checkpoint] [float8]) run as
`torchrun ... -m torchtitan.train --job.config_file ./train.toml`.

Mapping of the plan:

* dp with zero=0 -> data_parallel_replicate_degree=dp (DDP); zero>=1 over
  the whole dp group -> data_parallel_shard_degree=dp (FSDP2); shard=node ->
  HSDP: shard = the dp ranks inside one node, replicate = the rest.  ZeRO-1/2
  keep weights gathered between forward and backward
  (fsdp_reshard_after_forward="never"), ZeRO-3 reshards ("default"), and so
  does ZeRO-1/2 with CPU offload (training.enable_cpu_offload, which moves
  parameters, gradients and optimizer states: zero=3, offload=all).
* tp, cp, pp, ep degrees; schedule 1F1B / GPipe / Interleaved1F1B;
  pipeline_parallel_microbatch_size = mbs; the split as
  pipeline_parallel_split_points ("layers.<i>" where each stage begins; with
  vpp > 1 pp*vpp uniform chunks); tp_overlap -> enable_async_tensor_parallel
  (with training.compile, which async TP needs).
* training.local_batch_size (per data-parallel rank: all micro-batches with
  pp > 1, one micro-batch otherwise, torchtitan accumulates the rest),
  global_batch_size, seq_len, mixed_precision_param.
* activation_checkpoint.mode none / selective (per-op) / full; per-stage
  block counts have no equivalent and become every-n-th-layer selective AC.
* fp8 -> model.converters=["float8"] with the [float8] section.

The TOML is written by hand (deterministic key order, no toml dependency).
`written_strategy` reads the sections back as the strategy torchtitan runs
(planner.emit.check costs it before anything is written).
"""

from __future__ import annotations

import json
import math
from typing import Any

from planner.emit import one_placement
from planner.emit.megatron import model_shape, stage_block_counts
from planner.emit.slurm import launch_shape
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy
from planner.emit.inputs import LaunchInputs

TORCHTITAN_VERSION = "torchtitan v0.1.0"

# zoo name -> (torchtitan model name, flavor) where torchtitan ships the same sizes
FLAVORS = {
    "llama3-8b": ("llama3", "8B"),
    "llama3-70b": ("llama3", "70B"),
    "llama3-405b": ("llama3", "405B"),
}

SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for printable ASCII
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def toml_text(sections: dict[str, dict[str, Any]], header: list[str]) -> str:
    """TOML of {section: {key: value}} in the given order, after '# ' header lines."""
    lines = [f"# {line}" if line else "#" for line in header]
    for name, keys in sections.items():
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def dp_degrees(plan: Plan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree)."""
    s = plan.strategy
    dp = s.dp
    if s.zero == 0:
        return dp, 1
    if s.shard == "full":
        return 1, dp
    in_node = max(1, launch_shape(plan)["nproc_per_node"] // (s.tp * s.cp))
    shard = max(1, math.gcd(dp, min(dp, in_node)))
    return dp // shard, shard


def split_points(plan: Plan) -> list[str]:
    """Names of the blocks that begin each pipeline stage after the first (pp*vpp stages with vpp > 1)."""
    s = plan.strategy
    counts = stage_block_counts(plan)
    if s.pp == 1:
        return []
    if s.vpp > 1:
        chunk = sum(counts) // (s.pp * s.vpp)
        return [f"layers.{k * chunk}" for k in range(1, s.pp * s.vpp)]
    points, first = [], 0
    for count in counts[:-1]:
        first += count
        points.append(f"layers.{first}")
    return points


def _activation_checkpoint(plan: Plan, notes: list[str]) -> dict[str, Any]:
    s = plan.strategy
    if s.recompute == "none":
        return {"mode": "none"}
    if s.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    per_stage = s.recompute_layers
    counts = stage_block_counts(plan)
    chunks = [max(1, c // s.vpp) for c in counts]
    if per_stage is None:
        return {"mode": "full"}
    values = [per_stage[0 if len(per_stage) == 1 else i] for i in range(len(counts))]
    if max(values) == 0:
        return {"mode": "none"}
    if all(v >= c for v, c in zip(values, chunks)):
        return {"mode": "full"}
    every = max(1, min(chunks) // max(values))
    notes.append(f"The plan recomputes the first {'/'.join(map(str, values))} blocks of each stage; torchtitan "
                 f"has no per-stage block count, so it checkpoints every {every}th block (selective_ac_option "
                 f"\"{every}\"), at least as many blocks on every stage.")
    return {"mode": "selective", "selective_ac_option": str(every)}


def torchtitan_config(plan: Plan, job: Job) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Sections of train.toml and README notes."""
    s = plan.strategy
    one_placement(plan, "torchtitan")  # one [training] and [parallelism] section for every rank
    shape = model_shape(job.model)
    notes: list[str] = []
    name, flavor = FLAVORS.get(plan.job.model, ("llama3", plan.job.model))
    if plan.job.model not in FLAVORS:
        notes.append(f"torchtitan ships no flavor with the sizes of {plan.job.model}; register flavor "
                     f"\"{plan.job.model}\" (dim={shape['hidden']}, n_layers={shape['num_layers']}, "
                     f"n_heads={shape['heads']}, n_kv_heads={shape['kv_heads']}, vocab_size={shape['vocab']}, "
                     f"ffn hidden {shape['ffn']}) in torchtitan/models/llama3/__init__.py.")
    replicate, shard = dp_degrees(plan)
    dp = replicate * shard
    if s.pp > 1:
        local_batch = job.global_batch // dp
    else:
        local_batch = s.mbs
    model: dict[str, Any] = {"name": name, "flavor": flavor,
                             "tokenizer_path": "./assets/tokenizer/original/tokenizer.model"}
    if job.precision == "fp8":
        model["converters"] = ["float8"]
    param_dtype = "bfloat16"
    if job.precision == "fp16":
        notes.append("precision fp16: torchtitan's mixed_precision_param takes bfloat16 or float32 only; "
                     "the config uses bfloat16.")
    offload = s.offload != "none"
    cpu_offload = offload and s.offload_device == "cpu" and shard > 1
    if offload and not cpu_offload:
        notes.append(f"offload={s.offload} to {s.offload_device}: torchtitan offloads only through FSDP to "
                     "CPU memory (training.enable_cpu_offload); not set here, everything stays in HBM.")
    elif cpu_offload and s.offload != "all":
        notes.append(f"offload={s.offload}: torchtitan's training.enable_cpu_offload moves parameters, "
                     "gradients and optimizer states to CPU together (more than the plan offloads).")
    # ZeRO-1/2 are FSDP2 keeping the gathered weights from forward to backward; CPU offload moves the
    # parameters to the host, so they are re-gathered for backward as under ZeRO-3
    reshard = "default" if s.zero in (0, 3) or cpu_offload else "never"
    if s.zero in (1, 2) and shard > 1:
        notes.append(f"zero={s.zero}: FSDP2 always shards weights too; fsdp_reshard_after_forward=\"never\" "
                     "keeps them gathered from forward to backward, as ZeRO-1/2 would."
                     if reshard == "never" else
                     f"zero={s.zero} -> 3: with training.enable_cpu_offload FSDP2 keeps the parameters on the "
                     "host and re-gathers them for backward (fsdp_reshard_after_forward=\"default\").")
    if s.regather == "host":
        notes.append("regather=host (a host-memory weight cache) has no torchtitan counterpart: FSDP2 re-gathers "
                     "weights over the data-parallel group.")
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": s.tp,
        "disable_loss_parallel": not (s.tp > 1),
        "enable_async_tensor_parallel": s.tp_overlap and s.tp > 1,
        "context_parallel_degree": s.cp,
        "pipeline_parallel_degree": s.pp,
    }
    if s.pp > 1:
        parallelism["pipeline_parallel_schedule"] = SCHEDULES[s.pipeline_schedule]
        parallelism["pipeline_parallel_microbatch_size"] = s.mbs
        parallelism["pipeline_parallel_split_points"] = split_points(plan)
        counts = stage_block_counts(plan)
        if s.vpp > 1 and len(set(counts)) > 1:
            notes.append(f"The plan's uneven split {'/'.join(map(str, counts))} is replaced by uniform chunks: "
                         "torchtitan's looped schedules need pp*vpp split points.")
        notes.append("Pipeline stages: the first stage also holds tok_embeddings, the last norm and output "
                     "(split points name the block that begins each stage).")
    parallelism["expert_parallel_degree"] = s.ep
    if not s.sequence_parallel and s.tp > 1:
        notes.append("sp=off: torchtitan's tensor parallelism always shards norms and dropout along the "
                     "sequence (sequence parallel).")
    sections: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": f"{plan.job.model}: {plan.strategy_spec}"},
        "metrics": {"log_freq": 10, "enable_tensorboard": False},
        "model": model,
        "optimizer": {"name": "AdamW", "lr": 0.0003, "eps": 1e-08},
        "lr_scheduler": {"warmup_steps": 200},
        "training": {
            "local_batch_size": local_batch,
            "global_batch_size": job.global_batch,
            "seq_len": job.seq_len,
            "max_norm": 1.0,
            "steps": 1000,
            "dataset": "c4_test",
            "mixed_precision_param": param_dtype,
            "mixed_precision_reduce": "float32",
            "enable_cpu_offload": cpu_offload,
            "compile": bool(parallelism["enable_async_tensor_parallel"]),
        },
        "parallelism": parallelism,
        "checkpoint": {"enable_checkpoint": False, "folder": "checkpoint", "interval": 500},
        "activation_checkpoint": _activation_checkpoint(plan, notes),
    }
    if job.precision == "fp8":
        sections["float8"] = {
            "enable_fsdp_float8_all_gather": shard > 1,
            "precompute_float8_dynamic_scale_for_fsdp": shard > 1,
            "filter_fqns": ["output"],
        }
    return sections, notes


def _stage_counts(points: list[str], total: int, pp: int) -> tuple[tuple[int, ...], int]:
    """(blocks per stage, chunks per stage) of pipeline_parallel_split_points: chunk k runs on stage k % pp."""
    edges = [0, *(int(point.removeprefix("layers.")) for point in points), total]
    chunks = [b - a for a, b in zip(edges, edges[1:])]
    return tuple(sum(chunks[i::pp]) for i in range(pp)), len(chunks) // pp


def _recompute_of(section: dict[str, Any], counts: tuple[int, ...], vpp: int) -> dict[str, Any]:
    """recompute and recompute_layers of an [activation_checkpoint] section on stages of `counts` blocks."""
    mode, option = section["mode"], section.get("selective_ac_option")
    if mode == "none":
        return {"recompute": "none"}
    if mode == "full":
        return {"recompute": "full"}
    if option == "op":
        return {"recompute": "selective"}
    # every `option`-th block of a stage is checkpointed (torchtitan counts the blocks it wraps): per chunk,
    # as planner counts recompute_layers
    chunks = [max(1, c // vpp) for c in counts]
    per_stage = tuple(c // int(option) for c in chunks)
    if all(k >= c for k, c in zip(per_stage, chunks)):
        return {"recompute": "full"}
    return {"recompute": "full", "recompute_layers": per_stage[:1] if len(set(per_stage)) == 1 else per_stage}


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The strategy train.toml asks torchtitan to run, read off its sections: DDP, FSDP2 or HSDP for the ZeRO
    stage, CPU offload of everything or nothing, sequence parallel with every tp, the split points, and every
    n-th block checkpointed for per-stage recompute counts."""
    sections, _ = torchtitan_config(plan, job)
    p, training = sections["parallelism"], sections["training"]
    replicate, shard = p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]
    tp, pp = p["tensor_parallel_degree"], p["pipeline_parallel_degree"]
    zero = plan.strategy.zero  # one data-parallel rank: nothing is sharded, the plan's zero costs the same
    if shard > 1:
        zero = 3 if p["fsdp_reshard_after_forward"] == "default" else plan.strategy.zero if plan.strategy.zero in (
            1, 2) else 1
    elif replicate > 1:
        zero = 0  # DDP
    schedule = {v: k for k, v in SCHEDULES.items()}[p.get("pipeline_parallel_schedule", "1F1B")]
    counts, vpp = _stage_counts(p.get("pipeline_parallel_split_points", []), job.model.num_blocks, pp)
    return Strategy(
        tp=tp, pp=pp, dp=replicate * shard, cp=p["context_parallel_degree"], ep=p["expert_parallel_degree"],
        mbs=p["pipeline_parallel_microbatch_size"] if pp > 1 else training["local_batch_size"], vpp=vpp,
        sp=tp > 1, zero=zero, shard="node" if replicate > 1 and shard > 1 else "full",
        offload="all" if training["enable_cpu_offload"] else "none", schedule=schedule,
        tp_overlap=p["enable_async_tensor_parallel"], split=counts if pp > 1 else None,
        stage_pools=plan.strategy.stage_pools, **_recompute_of(sections["activation_checkpoint"], counts, vpp))


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """train.toml, launch.sh and README.md for torchtitan."""
    sections, notes = torchtitan_config(plan, job)
    shape = launch_shape(plan)
    p = sections["parallelism"]
    product = (p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] * p["tensor_parallel_degree"]
               * p["context_parallel_degree"] * p["pipeline_parallel_degree"])
    if product != plan.job.num_gpus:
        raise ValueError(f"torchtitan: parallel degrees multiply to {product}, the plan uses {plan.job.num_gpus} GPUs")
    header = [
        f"torchtitan job config ({TORCHTITAN_VERSION}, torchtitan/config/job_config.py) written by planner",
        f"{plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}",
        "Data, tokenizer, optimizer and schedule values are placeholders; parallelism is the plan's.",
    ]
    launch = f"""#!/usr/bin/env bash
# torchtitan launch for {plan.job.model} on {plan.job.cluster} ({TORCHTITAN_VERSION}).
# Run on every node from a torchtitan checkout or install, with NODE_RANK set per node.
set -euo pipefail
cd "$(dirname "${{BASH_SOURCE[0]}}")"
NNODES=${{NNODES:-{shape['nnodes']}}}
NPROC_PER_NODE=${{NPROC_PER_NODE:-{shape['nproc_per_node']}}}
NODE_RANK=${{NODE_RANK:-0}}
MASTER_ADDR=${{MASTER_ADDR:-localhost}}
MASTER_PORT=${{MASTER_PORT:-29500}}
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \\
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\
    -m torchtitan.train --job.config_file ./train.toml "$@"
"""
    readme = [
        "# torchtitan launch files",
        "",
        f"Plan: `{plan.strategy_spec}` for {plan.job.model} on {plan.job.cluster} "
        f"({plan.job.num_gpus} GPUs: {shape['nnodes']} nodes x {shape['nproc_per_node']}).",
        "",
        f"Format: the TOML job config of {TORCHTITAN_VERSION} (`torchtitan/config/job_config.py`).",
        "",
        "- `train.toml`: [parallelism], [training] batch/sequence/precision and [activation_checkpoint] come "
        "from the plan; data, tokenizer, optimizer and step counts are placeholders.",
        "- `launch.sh`: `torchrun ... -m torchtitan.train --job.config_file ./train.toml`; set NNODES, "
        "NODE_RANK, MASTER_ADDR, MASTER_PORT per node (slurm/job.sbatch does).",
        "",
        "## No torchtitan equivalent",
        "",
    ]
    readme += [f"- {note}" for note in notes] or ["- Nothing: every choice of the plan maps to a field."]
    return {
        "train.toml": toml_text(sections, header),
        "launch.sh": launch,
        "README.md": "\n".join(readme) + "\n",
    }
