"""torchtitan target: `train.toml`, `launch.sh`, `README.md` for torchtitan 0.2.2 (the release on PyPI).

train.toml is 0.2.2's TOML job config (`torchtitan/config/job_config.py`, read by
`torchtitan/config/manager.py`'s ConfigManager with `--job.config_file`). launch.sh runs
`torchrun ... -m torchtitan.train --job.config_file <folder>/train.toml` and passes the launch inputs on
the command line: dataset path, tokenizer folder, checkpoint folder, steps and warmup. Those are either given
to `planner compile` or read from environment variables at launch (`planner.emit.inputs`).
tests/test_emit_torchtitan.py loads every emitted config with 0.2.2's own ConfigManager.

Mapping of the plan:

* dp with zero=0 -> data_parallel_replicate_degree=dp (DDP). zero>=1 over the whole dp group ->
  data_parallel_shard_degree=dp (FSDP2). shard=node -> HSDP: shard = the dp ranks inside one node,
  replicate = the rest. ZeRO-1/2 keep weights gathered between forward and backward
  (fsdp_reshard_after_forward="never"). ZeRO-3 reshards ("default"), and so does ZeRO-1/2 with CPU
  offload (training.enable_cpu_offload moves parameters, gradients and optimizer states: zero=3,
  offload=all).
* tp, cp and pp degrees (ep with expert_tensor_parallel_degree = tp for MoE models). Schedules 1F1B,
  GPipe and Interleaved1F1B, and without compile ZBVZeroBubble and DualPipeV (torchtitan-eager: torch's V
  schedules refuse torch.compile'd stage modules). pipeline_parallel_microbatch_size = mbs. The split is written as
  module_fqns_per_model_part, the modules of each model chunk (with vpp > 1, pp*vpp uniform chunks;
  torchtitan runs chunk k on pipeline rank k % pp). tp_overlap -> enable_async_tensor_parallel.
  [compile] is on (the torchtitan runtime profile costs fused kernels, and async TP needs compile) but under
  ZBVZeroBubble and DualPipeV, which run only eager (the torchtitan-eager profile).
* training.local_batch_size is per data-parallel rank: all micro-batches when pp > 1, one micro-batch
  otherwise (torchtitan accumulates the rest). Also written: global_batch_size, seq_len, mixed_precision_param.
* activation_checkpoint.mode none / selective (per-op) / full. Per-stage block counts have no equivalent
  and become every-n-th-layer selective AC.
* fp8 -> model.converters=["quantize.linear.float8"] with [quantize.linear.float8]; mxfp8 (Blackwell) ->
  ["quantize.linear.mx"] with [quantize.linear.mx] recipe_name = "mxfp8_cublas" (torchtitan 0.2.2's MXLinear
  converter over torchao's MX formats).
* AdamW, warmup and cosine decay, and clipping (planner.emit.optim). Checkpoints every `save_every` steps.

The TOML is written by hand, in a fixed key order, with no toml dependency. `written_strategy` reads the
sections back as the strategy torchtitan runs (planner.emit.check costs it before anything is written).
"""

from __future__ import annotations

import math
from typing import Any

from planner.emit import one_placement, optim
from planner.emit.inputs import LaunchInputs
from planner.emit.megatron import stage_block_counts
from planner.emit.quote import comment, toml_string
from planner.emit.slurm import launch_shape
from planner.emit.torchtitan_launch import launch_script, readme
from planner.emit.torchtitan_model import DOCUMENT_FLAVORS, RELEASE, torchtitan_model
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import V_SCHEDULES, Schedule, Strategy

# torchtitan's pipeline_parallel_schedule names (torch.distributed.pipelining get_schedule_class)
SCHEDULES: dict[Schedule, str] = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
                                  "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}

# the model converter torchtitan swaps the linear layers with, per low-precision job precision
CONVERTERS = {"fp8": "quantize.linear.float8", "mxfp8": "quantize.linear.mx"}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def toml_text(sections: dict[str, dict[str, Any]], header: list[str]) -> str:
    """TOML of {section: {key: value}} in the given order, after '# ' header lines."""
    lines = [f"# {comment(line)}" if line else "#" for line in header]
    for name, keys in sections.items():
        lines += ["", f"[{name}]"]
        for key, value in keys.items():
            if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
                lines += [f"{key} = [", *(f"    {_value(v)}," for v in value), "]"]  # one inner array a line
            else:
                lines.append(f"{key} = {_value(value)}")
    return "\n".join(lines) + "\n"


def dp_degrees(plan: Plan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree)."""
    s = plan.single_strategy
    dp = s.data_parallel
    if s.zero == 0:
        return dp, 1
    if s.shard == "full":
        return 1, dp
    in_node = max(1, launch_shape(plan)["nproc_per_node"] // (s.tp * s.cp))
    shard = max(1, math.gcd(dp, min(dp, in_node)))
    return dp // shard, shard


def split_points(plan: Plan) -> list[int]:
    """Index of the block that begins each model chunk after the first (pp*vpp uniform chunks with vpp > 1)."""
    s = plan.single_strategy
    counts = stage_block_counts(plan)
    if s.pp == 1:
        return []
    if s.vpp > 1:
        chunk = sum(counts) // (s.pp * s.vpp)
        return [k * chunk for k in range(1, s.pp * s.vpp)]
    points, first = [], 0
    for count in counts[:-1]:
        first += count
        points.append(first)
    return points


def model_parts(plan: Plan, num_blocks: int) -> list[list[str]]:
    """module_fqns_per_model_part: the modules of each model chunk. The first chunk also holds tok_embeddings,
    and the last holds norm and output. torchtitan runs chunk k on pipeline rank k % pp."""
    edges = [0, *split_points(plan), num_blocks]
    parts = [[f"layers.{b}" for b in range(first, stop)] for first, stop in zip(edges, edges[1:])]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _activation_checkpoint(plan: Plan, notes: list[str]) -> dict[str, Any]:
    s = plan.single_strategy
    if s.recompute == "none":
        return {"mode": "none"}
    if s.recompute == "selective":  # per-op SAC (the torchtitan profile's `selective` section)
        return {"mode": "selective", "selective_ac_option": "op"}
    if s.recompute_every is not None:  # layer SAC: every k-th block the rank wraps
        return {"mode": "selective", "selective_ac_option": str(s.recompute_every)}
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


def _parallelism(plan: Plan, num_blocks: int, replicate: int, shard: int, reshard: str,
                 notes: list[str]) -> dict[str, Any]:
    """The [parallelism] section."""
    s = plan.single_strategy
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
        parallelism["module_fqns_per_model_part"] = model_parts(plan, num_blocks)
        counts = stage_block_counts(plan)
        if s.pipeline_schedule == "dualpipev":  # torchtitan's default is on; it acts only with ep > 1
            parallelism["pipeline_parallel_expert_parallel_overlap"] = s.ep_overlap
        if s.vpp > 1 and len(set(counts)) > 1:
            notes.append(f"The plan's uneven split {'/'.join(map(str, counts))} is replaced by uniform chunks: "
                         "torchtitan's looped schedules need pp*vpp split points.")
        if s.v_shape:
            notes.append(f"Pipeline stages in a V ({SCHEDULES[s.pipeline_schedule]}): stage i runs chunks i and "
                         f"{2 * s.pp - 1} - i, so the first stage holds tok_embeddings and norm and output "
                         "(module_fqns_per_model_part lists each chunk's modules). compile.enable is off: torch's "
                         "V schedules refuse torch.compile'd stage modules; the torchtitan-eager profile costs it.")
        else:
            notes.append("Pipeline stages: the first stage also holds tok_embeddings, the last norm and output "
                         "(module_fqns_per_model_part lists each chunk's modules).")
    parallelism["expert_parallel_degree"] = s.ep
    if s.ep > 1:  # experts tensor-parallel as the dense layers, expert parallel inside the data-parallel ranks
        parallelism["expert_tensor_parallel_degree"] = s.tp
    if not s.sequence_parallel and s.tp > 1:
        notes.append("sp=off: torchtitan's tensor parallelism always shards norms and dropout along the "
                     "sequence (sequence parallel).")
    return parallelism


def _offload_and_reshard(plan: Plan, shard: int, notes: list[str]) -> tuple[bool, str]:
    """(training.enable_cpu_offload, parallelism.fsdp_reshard_after_forward)."""
    s = plan.single_strategy
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
    return cpu_offload, reshard


def _lr_scheduler(inputs: LaunchInputs) -> dict[str, Any]:
    """Warmup then cosine decay; the warmup length is written here when the step count is known (launch.sh
    passes both otherwise)."""
    section: dict[str, Any] = {"decay_type": "cosine", "min_lr_factor": optim.MIN_LR_RATIO}
    if inputs.train_steps is not None:
        section = {"warmup_steps": optim.warmup_steps(inputs.train_steps), **section}
    return section


def _document_flavor(plan: Plan, job: Job, name: str, flavor: str, notes: list[str]) -> tuple[str, str]:
    """The flavor that masks documents where torchtitan has one for the model and the plan has no context
    parallelism (torchtitan's context parallelism runs SDPA, without the mask), with a note either way."""
    limits = ("torchtitan's data loader neither balances sequences over the data-parallel ranks nor varies the "
              "context-parallel degree per sequence: it runs the plan's strategy as a static packing")
    cp, profile = plan.single_strategy.cp, plan.data.profile if plan.data is not None else "none"
    if job.model.name in DOCUMENT_FLAVORS and cp == 1:
        name, flavor = DOCUMENT_FLAVORS[job.model.name]
        notes.append(f"Data plan ({profile}): flavor {flavor}, variable-length attention under a "
                     f"document mask (documents end at the tokenizer's eos); {limits}.")
    else:
        why = (f"cp={cp}: its context parallelism runs SDPA without a document mask"
               if cp > 1 else f"{RELEASE} has no variable-length flavor of {job.model.name}")
        notes.append(f"Data plan ({profile}): rows attend across documents ({why}); {limits}.")
    return name, flavor


def torchtitan_config(plan: Plan, job: Job,
                      inputs: LaunchInputs = LaunchInputs()) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Sections of train.toml and README notes."""
    s = plan.single_strategy
    one_placement(plan, "torchtitan")  # one [training] and [parallelism] section for every rank
    name, flavor, notes = torchtitan_model(job.model)
    if plan.data is not None:
        name, flavor = _document_flavor(plan, job, name, flavor, notes)
    replicate, shard = dp_degrees(plan)
    local_batch = job.global_batch // (replicate * shard) if s.pp > 1 else s.mbs
    model: dict[str, Any] = {"name": name, "flavor": flavor}
    if job.precision in CONVERTERS:
        model["converters"] = [CONVERTERS[job.precision]]
    if job.precision == "fp16":
        notes.append("precision fp16: torchtitan's mixed_precision_param takes bfloat16 or float32 only; "
                     "the config uses bfloat16.")
    cpu_offload, reshard = _offload_and_reshard(plan, shard, notes)
    training: dict[str, Any] = {
        "local_batch_size": local_batch,
        "global_batch_size": job.global_batch,
        "seq_len": job.seq_len,
        "max_norm": optim.GRAD_CLIP,
        "dataset": "c4",
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
        "enable_cpu_offload": cpu_offload,
    }
    if inputs.train_steps is not None:
        training["steps"] = inputs.train_steps
    sections: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": f"{plan.job.model}: {plan.strategy_spec}"},
        "metrics": {"log_freq": 10, "enable_tensorboard": False},
        "model": model,
        "optimizer": {"name": "AdamW", "lr": optim.LR, "beta1": optim.BETAS[0], "beta2": optim.BETAS[1],
                      "eps": optim.EPS, "weight_decay": optim.WEIGHT_DECAY},
        "lr_scheduler": _lr_scheduler(inputs),
        "training": training,
        "parallelism": _parallelism(plan, job.model.num_blocks, replicate, shard, reshard, notes),
        # full checkpoints (model, optimizer, data loader) every save_every steps and at the end, to resume from
        "checkpoint": {"enable": True, "interval": inputs.save_every, "last_save_model_only": False},
        "activation_checkpoint": _activation_checkpoint(plan, notes),
        # torch's V schedules raise on compiled stage modules (_check_torch_compile_compatibility): eager there
        "compile": {"enable": not plan.single_strategy.v_shape, "components": ["model", "loss"]},
    }
    if job.precision == "mxfp8":
        # torchao's MXLinear through cuBLAS's block-scaled GEMM, the dim-1 casts in the CUDA kernel torchtitan's
        # MXLinear config recommends for speed; the output projection stays bf16 (its default filter)
        sections["quantize.linear.mx"] = {"recipe_name": "mxfp8_cublas", "mxfp8_dim1_cast_kernel_choice": "cuda",
                                          "filter_fqns": ["output"]}
    if job.precision == "fp8":
        sections["quantize.linear.float8"] = {
            "enable_fsdp_float8_all_gather": shard > 1,
            "precompute_float8_dynamic_scale_for_fsdp": shard > 1,
            "filter_fqns": ["output"],
        }
    return sections, notes


def _stage_counts(parts: list[list[str]], pp: int, v_shape: bool = False) -> tuple[tuple[int, ...], int]:
    """(blocks per stage, chunks per stage) of module_fqns_per_model_part: chunk k runs on stage k % pp, or in a
    V (ZBVZeroBubble, DualPipeV: torchtitan's style "v") on stage k for k < pp and 2 pp - 1 - k after."""
    chunks = [sum(name.startswith("layers.") for name in part) for part in parts]
    if v_shape:
        return tuple(chunks[i] + chunks[2 * pp - 1 - i] for i in range(pp)), len(chunks) // pp
    return tuple(sum(chunks[i::pp]) for i in range(pp)), len(chunks) // pp


def _recompute_of(section: dict[str, Any], counts: tuple[int, ...]) -> dict[str, Any]:
    """recompute and recompute_every of an [activation_checkpoint] section on stages of `counts` blocks."""
    mode, option = section["mode"], section.get("selective_ac_option")
    if mode == "none":
        return {"recompute": "none"}
    if mode == "full":
        return {"recompute": "full"}
    if option == "op":
        return {"recompute": "selective"}
    # every `option`-th block a rank wraps is checkpointed: _apply_layer_sac counts the blocks of all the rank's
    # model chunks in order, as Strategy.recompute_every counts a stage's blocks
    every = int(str(option))
    if every == 1:
        return {"recompute": "full"}
    if all(c < every for c in counts):
        return {"recompute": "none"}
    return {"recompute": "full", "recompute_every": every}


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The strategy train.toml asks torchtitan to run, read off its sections: DDP, FSDP2 or HSDP for the ZeRO
    stage, CPU offload of everything or nothing, sequence parallel with every tp, the split points, and every
    n-th block checkpointed for per-stage recompute counts."""
    sections, _ = torchtitan_config(plan, job)
    p, training = sections["parallelism"], sections["training"]
    replicate, shard = p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]
    tp, pp = p["tensor_parallel_degree"], p["pipeline_parallel_degree"]
    planned = plan.single_strategy.zero
    zero = planned  # one data-parallel rank: nothing is sharded, the plan's zero costs the same
    if shard > 1:
        zero = 3 if p["fsdp_reshard_after_forward"] == "default" else planned if planned in (1, 2) else 1
    elif replicate > 1:
        zero = 0  # DDP
    schedule = {v: k for k, v in SCHEDULES.items()}[p.get("pipeline_parallel_schedule", "1F1B")]
    counts, vpp = _stage_counts(p.get("module_fqns_per_model_part", [[]]), pp, schedule in V_SCHEDULES and pp > 1)
    return Strategy(
        tp=tp, pp=pp, dp=replicate * shard, cp=p["context_parallel_degree"], ep=p["expert_parallel_degree"],
        mbs=p["pipeline_parallel_microbatch_size"] if pp > 1 else training["local_batch_size"], vpp=vpp,
        sp=tp > 1, zero=zero, shard="node" if replicate > 1 and shard > 1 else "full",
        offload="all" if training["enable_cpu_offload"] else "none", schedule=schedule,
        tp_overlap=p["enable_async_tensor_parallel"], split=counts if pp > 1 else None,
        ep_overlap=bool(p.get("pipeline_parallel_expert_parallel_overlap")) and p["expert_parallel_degree"] > 1,
        stage_pools=plan.single_strategy.stage_pools, **_recompute_of(sections["activation_checkpoint"], counts))


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """train.toml, launch.sh and README.md for torchtitan."""
    sections, notes = torchtitan_config(plan, job, inputs)
    p = sections["parallelism"]
    product = (p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] * p["tensor_parallel_degree"]
               * p["context_parallel_degree"] * p["pipeline_parallel_degree"])
    if product != plan.job.num_gpus:
        raise ValueError(f"torchtitan: parallel degrees multiply to {product}, the plan uses {plan.job.num_gpus} GPUs")
    header = [
        f"torchtitan job config ({RELEASE}, torchtitan/config/job_config.py) written by planner",
        f"{plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}",
        "launch.sh adds the dataset path, tokenizer folder, checkpoint folder, steps and warmup on the",
        "command line (torchtitan lets command-line values override this file).",
    ]
    return {
        "train.toml": toml_text(sections, header),
        "launch.sh": launch_script(plan, inputs, launch_shape(plan)),
        "README.md": readme(plan, inputs, launch_shape(plan), notes),
    }
