"""Megatron-LM launch files: `args.txt`, `launch.sh`, `README.md`.

Targets `pretrain_gpt.py` of Megatron-LM core_v0.16.1, the release of the megatron-core 0.16.1 that the
tests build configs with (flag names from its megatron/training/arguments.py; planner.emit.megatron_check
lists every flag written here).  `args.txt` holds every flag with a fixed value, one per line:

* the plan's decisions: parallel degrees, the uneven first/last pipeline stages
  (--decoder-first/last-pipeline-num-layers), interleaving (--num-layers-per-virtual-pipeline-stage),
  recomputation, the distributed optimizer and its CPU offload, micro/global batch, sequence length,
  precision, and the overlap the megatron runtime profile costs (hardware/data/runtimes/megatron.yaml
  `overlap`): --overlap-grad-reduce whenever gradients are reduced over dp x cp > 1 ranks, and
  --overlap-param-gather with the distributed optimizer (the strategy's dp_overlap: grad drops the second,
  off both, as Megatron-LM's defaults do);
* the model (planner.emit.megatron_model): the architecture whose graph is the plan's model, with the
  all-to-all token dispatcher, grouped expert GEMMs, fp32 router and balancing loss of MoE models;
* --make-vocab-size-divisible-by chosen so that Megatron's padded vocabulary is the model's;
* the optimizer and schedule (planner.emit.optim: AdamW, warmup, cosine decay, clipping; the same values
  the DeepSpeed and torchtitan files write), the tokenizer type and the checkpoint format.

`launch.sh` (planner.emit.megatron_launch) adds the launch inputs: data, tokenizer, checkpoint folder,
save interval, train steps and the warmup derived from them.

Every argument set is checked with `check_megatron_args` (Megatron's validate_args and TransformerConfig
rules, and the flag names); a violation raises ValueError instead of writing files that fail on the
cluster.  ZeRO-2/3 run as Megatron FSDP (--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads or
optim_grads_params, with the --no-gradient-accumulation-fusion and --ckpt-format fsdp_dtensor its user guide
requires).  What the plan decides but Megatron cannot express (per-stage recompute counts, an uneven split
with unequal middle stages, parameter offload) is listed in README.md with what Megatron will
do instead; `written_strategy` reads the argument set back as the strategy Megatron runs (flag by flag,
as pretrain_gpt.py parses it), which planner.emit.check costs before writing.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from planner.emit import UnsupportedPlan, one_placement, optim
from planner.emit.inputs import LaunchInputs
from planner.emit.megatron_check import check_megatron_args
from planner.emit.megatron_launch import launch_script, readme
from planner.chunks import layout_string, split_chunks
from planner.emit.megatron_model import architecture, architecture_args, vocab_args
from planner.emit.nodes import launch_shape
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy

MEGATRON_VERSION = "Megatron-LM core_v0.16.1 (megatron/training/arguments.py; megatron-core 0.16.1)"


def stage_block_counts(plan: Plan) -> list[int]:
    """Transformer blocks on each pipeline stage."""
    return [(s.blocks[1] - s.blocks[0] + 1) if s.blocks else 0 for s in plan.stages]


def _pipeline_split(counts: list[int], vpp: int) -> tuple[dict[str, Any], list[str]]:
    """Flags for the layer split and notes on what could not be expressed."""
    total, pp = sum(counts), len(counts)
    notes: list[str] = []
    if vpp > 1:
        chunks = split_chunks(tuple(counts), vpp)
        if len({size for stage in chunks for size in stage}) == 1:
            return {"num-layers-per-virtual-pipeline-stage": chunks[0][0]}, notes
        # uneven chunks: the embedding and the loss count as layers (planner.chunks), written out as Megatron-
        # Core's explicit layout (its TransformerConfig validates it)
        return {"pipeline-model-parallel-layout": layout_string(tuple(counts), vpp)}, notes
    if pp == 1 or len(set(counts)) == 1:
        return {}, notes
    middle = counts[1:-1]
    if len(set(middle)) <= 1:
        flags: dict[str, Any] = {}
        mid = middle[0] if middle else None
        if counts[0] != mid:
            flags["decoder-first-pipeline-num-layers"] = counts[0]
        if counts[-1] != mid:
            flags["decoder-last-pipeline-num-layers"] = counts[-1]
        return flags, notes
    if total % pp == 0:
        notes.append(f"The plan's split {'/'.join(map(str, counts))} has unequal middle stages, which Megatron "
                     f"cannot express (only the first and last stage may differ); Megatron will use "
                     f"{total // pp} layers on every stage.")
        return {}, notes
    q = total // pp
    first = total - q * (pp - 1)
    notes.append(f"The plan's split {'/'.join(map(str, counts))} has unequal middle stages, which Megatron "
                 f"cannot express (only the first and last stage may differ); the arguments put {first} layers "
                 f"on the first stage and {q} on each other stage.")
    return {"decoder-first-pipeline-num-layers": first}, notes



def _sharding_args(plan: Plan) -> tuple[dict[str, Any], list[str]]:
    """The distributed optimizer, its instances, CPU offload, and the overlap the megatron profile costs."""
    s = plan.single_strategy
    args: dict[str, Any] = {}
    notes: list[str] = []
    if s.zero >= 1:
        args["use-distributed-optimizer"] = True
        if plan.job.fp8_params:  # FP8 primary weights (memory.fp8_weight_copy_bytes counts no copies beside them)
            args["fp8-param-gather"] = True
        if s.zero >= 2 and s.pp == 1:  # Megatron FSDP, with the flags its user guide requires
            args.update({"use-megatron-fsdp": True, "data-parallel-sharding-strategy": FSDP_SHARDING[s.zero],
                         "no-gradient-accumulation-fusion": True})
        elif s.zero >= 2:
            what = "sharded gradients" if s.zero == 2 else "sharded gradients and weights"
            notes.append(f"zero={s.zero} ({what}) with pipeline parallelism -> Megatron's distributed optimizer "
                         "(zero=1), which shards the optimizer states only: fp32 gradients and weights stay whole "
                         "on every dp rank (Megatron FSDP is not run with pipeline parallelism here).")
        if s.shard == "node":
            shard = max(1, min(s.data_parallel, launch_shape(plan)["nproc_per_node"] // (s.tp * s.cp)))
            if s.data_parallel // shard > 1:
                args["num-distributed-optimizer-instances"] = s.data_parallel // shard
    if s.offload in ("optimizer", "all") and s.offload_device == "cpu":
        # core_v0.16 runs the CPU optimizer through the precision-aware optimizer (validate_args asserts it)
        args.update({"optimizer-cpu-offload": True, "use-precision-aware-optimizer": True})
        if s.offload_ratio < 1.0:
            args["optimizer-offload-fraction"] = s.offload_ratio  # the rest is updated on the GPU
    if s.offload in ("params", "all") or s.offload_device == "nvme" and s.offload != "none":
        notes.append(f"offload={s.offload} to {s.offload_device}: Megatron offloads only optimizer states, "
                     "and only to CPU memory (--optimizer-cpu-offload); the rest stays in HBM.")
    if s.regather == "host":
        notes.append("regather=host (a host-memory weight cache) has no Megatron counterpart; weights are not "
                     "sharded, so nothing is re-gathered.")
    # gradients are reduced over dp x cp ranks: hide it behind the backward pass (unless the strategy says not)
    if s.data_parallel * s.cp > 1 and s.dp_overlap != "off":
        args["overlap-grad-reduce"] = True
        if s.zero >= 1 and s.dp_overlap == "on":  # and gather the updated weights during the next forward
            args["overlap-param-gather"] = True
    return args, notes


def _dp_overlap(args: dict[str, Any], dp_cp: int) -> str:
    """How much of the data-parallel sync the arguments overlap: on (--overlap-grad-reduce, with
    --overlap-param-gather where the distributed optimizer gathers), grad (the reduction only) or off; on when
    nothing is reduced (dp x cp = 1), the flags then changing nothing."""
    if dp_cp == 1:
        return "on"
    if not args.get("overlap-grad-reduce"):
        return "off"
    gathers = args.get("use-distributed-optimizer") or megatron_fsdp(args)
    return "grad" if gathers and not args.get("overlap-param-gather") else "on"


# ZeRO stage -> Megatron FSDP's --data-parallel-sharding-strategy (megatron_fsdp/param_and_grad_buffer.py
# _init_each_parameter_group_buffers: optim_grads shards fp32 gradients and optimizer, optim_grads_params the
# 16-bit weights too); zero 1 stays the distributed optimizer
FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def megatron_fsdp(args: dict[str, Any]) -> bool:
    """Whether the argument set runs Megatron FSDP (--use-megatron-fsdp)."""
    return bool(args.get("use-megatron-fsdp"))


def checkpoint_format(strategy: Strategy) -> str:
    """--ckpt-format of the files written for `strategy`: Megatron FSDP (zero 2/3 without pipelining) saves
    only fsdp_dtensor (validate_args), everything else torch_dist."""
    return "fsdp_dtensor" if strategy.zero >= 2 and strategy.pp == 1 else "torch_dist"


def _parallel_args(plan: Plan, moe: bool) -> tuple[dict[str, Any], list[str]]:
    """Parallel degrees, pipeline split and interleaving, recomputation and optimizer sharding."""
    s = plan.single_strategy
    args: dict[str, Any] = {
        "tensor-model-parallel-size": s.tp,
        "pipeline-model-parallel-size": s.pp,
        "context-parallel-size": s.cp,
        "expert-model-parallel-size": s.ep,
    }
    notes: list[str] = []
    if moe:  # each expert is split over etp ranks (default: the tensor-parallel group)
        args["expert-tensor-parallel-size"] = s.expert_tp
        if s.ep_overlap and s.ep > 1:  # a2a of one micro-batch behind another's compute (core_v0.14+)
            args["overlap-moe-expert-parallel-comm"] = True
            args["delay-wgrad-compute"] = True
        if s.ep > 1 and s.tp > 1 and not s.sequence_parallel:
            notes.append("Expert and tensor parallelism without sequence parallelism: megatron-core warns that "
                         "MoE training needs --sequence-parallel here.")
    if s.sequence_parallel and s.tp > 1:
        args["sequence-parallel"] = True
    if s.tp_overlap and s.tp > 1:
        args["tp-comm-overlap"] = True
    split, split_notes = _pipeline_split(stage_block_counts(plan), s.vpp)
    args.update(split)
    notes += split_notes
    if s.recompute == "selective":
        args["recompute-granularity"] = "selective"
    elif s.recompute == "full":
        per_stage = s.recompute_layers
        if per_stage is None:
            args.update({"recompute-granularity": "full", "recompute-method": "uniform", "recompute-num-layers": 1})
        elif max(per_stage) > 0:
            n = max(per_stage)
            args.update({"recompute-granularity": "full", "recompute-method": "block", "recompute-num-layers": n})
            if len(set(per_stage)) > 1:
                notes.append(f"The plan recomputes {'/'.join(map(str, per_stage))} blocks per stage; Megatron's "
                             f"--recompute-num-layers is one value for every stage, so it is the maximum ({n}): "
                             "stages that needed fewer recompute more (slower, never out of memory).")
    sharding, sharding_notes = _sharding_args(plan)
    args.update(sharding)
    notes += sharding_notes
    if s.pp > 1 and s.pipeline_schedule == "gpipe":
        notes.append("schedule=gpipe -> 1F1B: Megatron runs 1F1B (interleaved with vpp > 1) only.")
    return args, notes


def _kernel_args(job: Job) -> dict[str, Any]:
    """Precision, and the attention and fusion kernels when the plan costs unfused ones."""
    args: dict[str, Any] = {"fp16": True} if job.precision == "fp16" else {"bf16": True}
    if job.precision == "fp8":
        args["fp8-format"] = "hybrid"
    if job.precision == "mxfp8":  # Transformer Engine's MXFP8BlockScaling: E4M3 data in both passes
        args.update({"fp8-format": "e4m3", "fp8-recipe": "mxfp8"})
    if not job.flash_attention:  # the plan costs the s^2 score tensors of unfused attention
        args["attention-backend"] = "unfused"
    if not job.fused_kernels:  # and eager element-wise kernels
        args.update({"no-bias-gelu-fusion": True, "no-bias-swiglu-fusion": True, "no-bias-dropout-fusion": True,
                     "no-masked-softmax-fusion": True, "no-rope-fusion": True})
    return args


def _recipe_args() -> dict[str, Any]:
    """Optimizer, schedule and tokenizer type: not the plan's, the same for every plan."""
    return {
        "optimizer": "adam",  # Megatron's adam decouples weight decay (AdamW) unless told otherwise
        "lr": optim.LR, "min-lr": float(f"{optim.LR * optim.MIN_LR_RATIO:.6g}"), "lr-decay-style": "cosine",
        "weight-decay": optim.WEIGHT_DECAY, "clip-grad": optim.GRAD_CLIP,
        "adam-beta1": optim.BETAS[0], "adam-beta2": optim.BETAS[1], "adam-eps": optim.EPS,
        "tokenizer-type": "HuggingFaceTokenizer", "split": "100,0,0", "eval-iters": 0,  # every document trains
    }


def _dispatcher_args(strategy: Strategy, moe: bool) -> dict[str, Any]:
    """The flex dispatcher with the plan's backend (hardware/data/dispatchers.yaml megatron_args; core_v0.16.1
    spells it --moe-flex-dispatcher-backend, deprecating --moe-enable-deepep), or nothing: the model's
    alltoall dispatcher stays."""
    if not moe or strategy.dispatcher == "alltoall":
        return {}
    return {"moe-token-dispatcher-type": "flex", "moe-flex-dispatcher-backend": strategy.dispatcher}


def megatron_args(plan: Plan, job: Job) -> tuple[dict[str, Any], list[str]]:
    """Every fixed flag of args.txt (flag name without dashes -> value, True for store-true) and README notes."""
    one_placement(plan, "megatron")  # --optimizer-cpu-offload and its fraction apply to every rank
    arch = architecture(job.model)
    cfg = arch.config
    args, notes = _parallel_args(plan, moe=cfg.moe is not None)
    args.update({"micro-batch-size": plan.single_strategy.mbs, "global-batch-size": job.global_batch})
    model, model_notes = architecture_args(arch, job.seq_len)
    vocab, vocab_notes = vocab_args(cfg.vocab, plan.single_strategy.tp, cfg.hidden, cfg.tied_embeddings)
    recipe = {**_recipe_args(), "ckpt-format": checkpoint_format(plan.single_strategy)}
    args.update({**model, **vocab, **_kernel_args(job), **recipe})
    args.update(_dispatcher_args(plan.single_strategy, moe=cfg.moe is not None))  # the plan's, over the default
    notes += model_notes + vocab_notes
    if "moe-flex-dispatcher-backend" in args:
        notes.append(f"The plan dispatches MoE tokens with {args['moe-flex-dispatcher-backend']} (Megatron's flex "
                     "dispatcher): the container needs DeepEP's deep_ep package (its hybrid-ep build for hybridep), "
                     "and megatron-core's fused_a2a.py requires the network's adaptive routing off.")
    if cfg.moe is not None and job.moe_routing == "balanced":
        notes.append("The plan was costed with balanced routing (--moe-routing balanced), as published MoE "
                     "benchmarks force it; args.txt trains with the learned router and its balancing loss, whose "
                     "busiest expert rank the cost model charges moe_routing_imbalance times the mean work (add "
                     "--moe-router-force-load-balancing only to reproduce a benchmark).")
    if plan.moe is not None:
        notes.append(_placement_note(plan))
    if job.model.family == "encoder":
        notes.append(f"{job.model.name} is an encoder: run Megatron's pretrain_bert.py with the same flags "
                     "(launch.sh names pretrain_gpt.py); its post-norm layout has no pretrain_gpt.py flag.")
    return args, notes


def _placement_note(plan: Plan) -> str:
    """What Megatron-Core makes of the plan's expert placement (routing statistics)."""
    moe = plan.moe
    if moe is None:
        return ""
    if moe.redundant_slots:
        return (f"The plan places experts with {moe.redundant_slots} redundant slots per MoE layer (busiest rank "
                f"{moe.max_load_ratio:.3f} x the mean); Megatron-Core holds no expert replicas and places experts "
                "contiguously, so these files were costed with the plan's placement without replicas (busiest "
                f"rank {moe.no_replica_max_load_ratio:.3f}, a relabelling of the experts; contiguous "
                f"{moe.contiguous_max_load_ratio:.3f}). report.md, Expert placement, has the comparison.")
    return (f"expert_placement.json relabels the experts so that Megatron-Core's contiguous placement is the "
            f"plan's (busiest rank {moe.max_load_ratio:.3f} x the mean against {moe.contiguous_max_load_ratio:.3f} "
            "for the experts' own order): permute the router's rows and the experts' weights of the checkpoint "
            "by it before training; planner does not convert checkpoints.")


def expert_placement_json(plan: Plan) -> str:
    """expert_placement.json: per MoE layer, the expert id in each of Megatron's contiguous expert slots."""
    moe = plan.moe
    if moe is None:
        raise UnsupportedPlan("the plan places no experts (compile --routing)")
    layers = [{"layer": p.layer, "order": [e for slots in p.ranks for e in slots]} for p in moe.layers]
    doc = {"expert_model_parallel_size": moe.ep,
           "about": "order[i] is the expert (router row) to load into Megatron's expert i, which sits on "
                    "expert-parallel rank i // (experts / ep); a single entry with layer 0 from a synthetic skew "
                    "holds for every MoE layer",
           "layers": layers}
    return json.dumps(doc, indent=2) + "\n"


def strategy_of_args(args: dict[str, Any], world_size: int, stage_pools: tuple[str, ...] | None = None) -> Strategy:
    """The strategy Megatron runs for an argument dict (as `megatron_args` makes it), flag by flag as
    pretrain_gpt.py reads them; UnsupportedPlan when planner has no strategy for it."""
    tp, pp = int(args["tensor-model-parallel-size"]), int(args["pipeline-model-parallel-size"])
    cp, layers = int(args["context-parallel-size"]), int(args["num-layers"])
    first, last = args.get("decoder-first-pipeline-num-layers"), args.get("decoder-last-pipeline-num-layers")
    chunk = args.get("num-layers-per-virtual-pipeline-stage")
    vpp = layers // (pp * int(chunk)) if chunk else 1
    split = None
    layout = args.get("pipeline-model-parallel-layout")
    if layout is not None:  # the explicit layout: each stage's blocks over its chunks
        chunks = str(layout).split("|")
        vpp = len(chunks) // pp
        split = tuple(sum(_decoders(chunks[v * pp + s]) for v in range(vpp)) for s in range(pp))
    elif pp > 1:  # Megatron's layer assignment: the flagged ends, the rest evenly over the other stages
        middle = pp - (first is not None) - (last is not None)
        rest = layers - int(first or 0) - int(last or 0)
        per = rest // middle if middle else 0
        split = tuple([int(first)] if first is not None else []) + (per,) * middle + \
            tuple([int(last)] if last is not None else [])
    granularity, method = args.get("recompute-granularity"), args.get("recompute-method")
    recompute, recompute_layers = granularity or "none", None
    if granularity == "full" and method == "block":  # the first N blocks of every stage (every chunk)
        recompute_layers = (int(args["recompute-num-layers"]),)
    # method uniform with --recompute-num-layers 1 checkpoints every block: recompute_layers None (all)
    offload = "optimizer" if args.get("optimizer-cpu-offload") else "none"
    values = {
        "tp": tp, "pp": pp, "cp": cp, "dp": world_size // (tp * pp * cp), "ep": int(args["expert-model-parallel-size"]),
        "etp": _expert_tp(args, tp), "ep_overlap": bool(args.get("overlap-moe-expert-parallel-comm")),
        "dispatcher": args.get("moe-flex-dispatcher-backend", "deepep")
        if args.get("moe-token-dispatcher-type") == "flex" else "alltoall",
        "mbs": int(args["micro-batch-size"]), "vpp": vpp, "sp": bool(args.get("sequence-parallel")),
        "zero": {v: k for k, v in FSDP_SHARDING.items()}[args["data-parallel-sharding-strategy"]]
        if megatron_fsdp(args) else 1 if args.get("use-distributed-optimizer") else 0,
        "shard": "node" if args.get("num-distributed-optimizer-instances") else "full",
        "recompute": recompute, "recompute_layers": recompute_layers, "offload": offload,
        "offload_ratio": float(args.get("optimizer-offload-fraction", 1.0)),
        "schedule": "interleaved" if vpp > 1 else "1f1b", "tp_overlap": bool(args.get("tp-comm-overlap")),
        "dp_overlap": _dp_overlap(args, world_size // (tp * pp)),
        "split": split, "stage_pools": stage_pools,
    }
    try:
        return Strategy.model_validate(values)
    except ValidationError as err:
        message = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise UnsupportedPlan(f"the Megatron arguments have no planner strategy: {message}") from None


def _decoders(chunk: str) -> int:
    """Transformer blocks in one chunk of a layout string ('Et*2' -> 2), unrolled as Megatron-Core does."""
    return re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), chunk).count("t")


def _expert_tp(args: dict[str, Any], tp: int) -> int | None:
    """--expert-tensor-parallel-size as a strategy's etp: None when it is tp (the strategy's default)."""
    etp = args.get("expert-tensor-parallel-size")
    return None if etp is None or int(etp) == tp else int(etp)


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The strategy args.txt asks Megatron to run: its split (first/last-stage flags or an even one), one
    recompute count (--recompute-num-layers), the distributed optimizer for ZeRO >= 1, optimizer offload to
    CPU only."""
    args, _ = megatron_args(plan, job)
    errors = check_megatron_args(args, plan.job.num_gpus)
    if errors:
        raise UnsupportedPlan("the arguments would break Megatron's rules: " + "; ".join(errors))
    return strategy_of_args(args, plan.job.num_gpus, plan.single_strategy.stage_pools)


def args_lines(args: dict[str, Any]) -> list[str]:
    """One `--flag [value]` line per argument, in insertion order."""
    return [f"--{key}" if value is True else f"--{key} {value}" for key, value in args.items()]


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """args.txt, launch.sh and README.md for Megatron-LM's pretrain_gpt.py."""
    args, notes = megatron_args(plan, job)
    errors = check_megatron_args(args, plan.job.num_gpus)
    if errors:
        raise ValueError("megatron: the emitted arguments break Megatron's rules: " + "; ".join(errors))
    shape = launch_shape(plan)
    files = {
        "args.txt": "\n".join(args_lines(args)) + "\n",
        "launch.sh": launch_script(plan, job, inputs, shape),
        "README.md": readme(plan, job, inputs, shape, args, notes),
    }
    if plan.moe is not None and not plan.moe.redundant_slots:
        files["expert_placement.json"] = expert_placement_json(plan)
    return files
