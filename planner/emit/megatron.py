"""Megatron-LM launch files: `args.txt`, `launch.sh`, `README.md`.

Targets Megatron-LM's `pretrain_gpt.py` argument parser as of core_r0.12
(megatron/training/arguments.py): parallel degrees, the uneven first/last
pipeline stages (--decoder-first/last-pipeline-num-layers), interleaving
(--num-layers-per-virtual-pipeline-stage), recomputation, the distributed
optimizer, micro/global batch, sequence length, the model's shape and the
precision.  `args.txt` holds one flag per line; `launch.sh` runs
`torchrun ... pretrain_gpt.py $(cat args.txt)` plus data and training flags
the plan does not decide (mock data by default).

Every emitted argument set is checked with `check_megatron_args` (our
re-implementation of Megatron's validate_args rules); a violation raises
ValueError instead of writing files that fail on the cluster.  What the plan
decides but Megatron cannot express (per-stage recompute counts, an uneven
split with unequal middle stages, ZeRO-2/3, parameter offload) is listed in
README.md together with what Megatron will do instead; `written_strategy`
reads the argument set back as the strategy Megatron runs (flag by flag, as
pretrain_gpt.py parses it), which planner.emit.check costs before writing.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from models.graph import LayerKind, ModelGraph
from planner.emit import UnsupportedPlan, one_placement
from planner.emit.megatron_check import check_megatron_args
from planner.emit.slurm import launch_shape
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy
from planner.emit.inputs import LaunchInputs

MEGATRON_VERSION = "Megatron-LM core_r0.12 (megatron/training/arguments.py)"


def _zoo_config(model: ModelGraph):
    """The zoo's TransformerConfig of `model` when it is an unmodified zoo model, else None."""
    try:
        from models.transformer import TransformerConfig
        from models.zoo import get_entry

        config = get_entry(model.name).config
    except Exception:  # not a zoo name
        return None
    if not isinstance(config, TransformerConfig):
        return None
    if (config.num_layers, config.hidden) != (model.num_blocks, model.hidden):
        return None
    return config


def model_shape(model: ModelGraph) -> dict[str, Any]:
    """Layers, hidden, heads, query groups, FFN width, gating, experts and tying of a transformer graph."""
    if model.num_blocks == 0 or model.family not in ("decoder", "encoder"):
        raise UnsupportedPlan(f"{model.name}: launch files for Megatron/torchtitan need a transformer "
                              f"(family {model.family}, {model.num_blocks} blocks)")
    ffn, gated, moe = None, False, None
    for layer in model.layers:
        if layer.kind == LayerKind.MLP and ffn is None:
            # weights = 3hf (gated) or 2hf; the graph does not say which, so ask the zoo's config,
            # else take a bias-free MLP (params = weights + norm) as gated (Llama) and one with biases as not (GPT)
            weights = layer.flops_per_token / 2.0  # 2 FLOPs per weight per token
            gated = layer.params - weights <= 2 * model.hidden
            ffn = round(weights / ((3 if gated else 2) * model.hidden))
        if layer.moe is not None and moe is None:
            moe = layer.moe
    config = _zoo_config(model)
    if config is not None:
        ffn, gated = config.ffn, config.gated
    tied = any(layer.tied_params for layer in model.layers if layer.kind == LayerKind.HEAD)
    if moe is not None and ffn is None and config is None:
        gated = True  # MoE models (Mixtral, DeepSeek) use SwiGLU experts
    return {
        "num_layers": model.num_blocks, "hidden": model.hidden, "heads": model.heads, "kv_heads": model.kv_heads,
        "ffn": ffn if ffn is not None else (moe.expert_ffn if moe else 4 * model.hidden), "gated": gated,
        "moe": moe, "tied": tied, "vocab": model.vocab,
    }


def stage_block_counts(plan: Plan) -> list[int]:
    """Transformer blocks on each pipeline stage."""
    return [(s.blocks[1] - s.blocks[0] + 1) if s.blocks else 0 for s in plan.stages]


def _pipeline_split(counts: list[int], vpp: int) -> tuple[dict[str, Any], list[str]]:
    """Flags for the layer split and notes on what could not be expressed."""
    total, pp = sum(counts), len(counts)
    notes: list[str] = []
    if pp == 1 or len(set(counts)) == 1:
        if vpp > 1:
            return {"num-layers-per-virtual-pipeline-stage": counts[0] // vpp}, notes
        return {}, notes
    if vpp > 1:
        notes.append(f"The plan splits the blocks {'/'.join(map(str, counts))} over the stages; Megatron's "
                     f"interleaved schedule needs uniform chunks, so it will use {total // (pp * vpp)} layers per "
                     "virtual stage on every stage.")
        return {"num-layers-per-virtual-pipeline-stage": total // (pp * vpp)}, notes
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


def megatron_args(plan: Plan, job: Job) -> tuple[dict[str, Any], list[str]]:
    """The argument dict (flag name without dashes -> value, True for store-true) and README notes."""
    s = plan.strategy
    one_placement(plan, "megatron")  # --optimizer-cpu-offload and its fraction apply to every rank
    shape = model_shape(job.model)
    notes: list[str] = []
    args: dict[str, Any] = {
        "tensor-model-parallel-size": s.tp,
        "pipeline-model-parallel-size": s.pp,
        "context-parallel-size": s.cp,
        "expert-model-parallel-size": s.ep,
    }
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
    if s.zero >= 1:
        args["use-distributed-optimizer"] = True
        if s.zero >= 2:
            what = "sharded gradients" if s.zero == 2 else "sharded gradients and weights"
            notes.append(f"zero={s.zero} ({what}) -> Megatron's distributed optimizer (zero=1), which shards the "
                         "optimizer states only: fp32 gradients and weights stay whole on every dp rank.")
        if s.shard == "node":
            shape_ = launch_shape(plan)
            shard = max(1, min(s.dp, shape_["nproc_per_node"] // (s.tp * s.cp)))
            if s.dp // shard > 1:
                args["num-distributed-optimizer-instances"] = s.dp // shard
    if s.offload in ("optimizer", "all") and s.offload_device == "cpu":
        args["optimizer-cpu-offload"] = True
        if s.offload_ratio < 1.0:
            args["optimizer-offload-fraction"] = s.offload_ratio  # the rest is updated on the GPU
    if s.offload in ("params", "all") or s.offload_device == "nvme" and s.offload != "none":
        notes.append(f"offload={s.offload} to {s.offload_device}: Megatron offloads only optimizer states, "
                     "and only to CPU memory (--optimizer-cpu-offload); the rest stays in HBM.")
    if s.regather == "host":
        notes.append("regather=host (a host-memory weight cache) has no Megatron counterpart; weights are not "
                     "sharded, so nothing is re-gathered.")
    if s.pp > 1 and s.pipeline_schedule == "gpipe":
        notes.append("schedule=gpipe -> 1F1B: Megatron runs 1F1B (interleaved with vpp > 1) only.")
    args.update({
        "micro-batch-size": s.mbs,
        "global-batch-size": job.global_batch,
        "seq-length": job.seq_len,
        "max-position-embeddings": job.seq_len,
        "num-layers": shape["num_layers"],
        "hidden-size": shape["hidden"],
        "num-attention-heads": shape["heads"],
    })
    if shape["kv_heads"] != shape["heads"]:
        args["group-query-attention"] = True
        args["num-query-groups"] = shape["kv_heads"]
    args["ffn-hidden-size"] = shape["ffn"]
    if shape["gated"]:
        args["swiglu"] = True
    if not shape["tied"]:
        args["untie-embeddings-and-output-weights"] = True
    moe = shape["moe"]
    if moe is not None:
        args.update({"num-experts": moe.num_experts, "moe-router-topk": moe.top_k,
                     "moe-ffn-hidden-size": moe.expert_ffn})
        if moe.shared_experts:
            args["moe-shared-expert-intermediate-size"] = moe.shared_experts * moe.expert_ffn
    if job.precision == "fp16":
        args["fp16"] = True
    else:
        args["bf16"] = True
    if job.precision == "fp8":
        args["fp8-format"] = "hybrid"
    if job.model.family == "encoder":
        notes.append(f"{job.model.name} is an encoder: run Megatron's pretrain_bert.py with the same flags "
                     "(launch.sh names pretrain_gpt.py).")
    if not job.flash_attention:
        notes.append("The plan assumes unfused attention (flash_attention off); Megatron picks its attention "
                     "backend itself (--attention-backend).")
    return args, notes


def strategy_of_args(args: dict[str, Any], world_size: int, stage_pools: tuple[str, ...] | None = None) -> Strategy:
    """The strategy Megatron runs for an argument dict (as `megatron_args` makes it), flag by flag as
    pretrain_gpt.py reads them; UnsupportedPlan when planner has no strategy for it."""
    tp, pp = int(args["tensor-model-parallel-size"]), int(args["pipeline-model-parallel-size"])
    cp, layers = int(args["context-parallel-size"]), int(args["num-layers"])
    first, last = args.get("decoder-first-pipeline-num-layers"), args.get("decoder-last-pipeline-num-layers")
    chunk = args.get("num-layers-per-virtual-pipeline-stage")
    vpp = layers // (pp * int(chunk)) if chunk else 1
    split = None
    if pp > 1:  # Megatron's layer assignment: the flagged ends, the rest evenly over the other stages
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
        "mbs": int(args["micro-batch-size"]), "vpp": vpp, "sp": bool(args.get("sequence-parallel")),
        "zero": 1 if args.get("use-distributed-optimizer") else 0,
        "shard": "node" if args.get("num-distributed-optimizer-instances") else "full",
        "recompute": recompute, "recompute_layers": recompute_layers, "offload": offload,
        "offload_ratio": float(args.get("optimizer-offload-fraction", 1.0)),
        "schedule": "interleaved" if vpp > 1 else "1f1b", "tp_overlap": bool(args.get("tp-comm-overlap")),
        "split": split, "stage_pools": stage_pools,
    }
    try:
        return Strategy(**values)
    except ValidationError as err:
        message = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise UnsupportedPlan(f"the Megatron arguments have no planner strategy: {message}") from None


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The strategy args.txt asks Megatron to run: its split (first/last-stage flags or an even one), one
    recompute count (--recompute-num-layers), the distributed optimizer for ZeRO >= 1, optimizer offload to
    CPU only."""
    args, _ = megatron_args(plan, job)
    errors = check_megatron_args(args, plan.job.num_gpus)
    if errors:
        raise UnsupportedPlan("the arguments would break Megatron's rules: " + "; ".join(errors))
    return strategy_of_args(args, plan.job.num_gpus, plan.strategy.stage_pools)


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
    launch = f"""#!/usr/bin/env bash
# Megatron-LM launch for {plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}
# Run on every node from the Megatron-LM checkout (MEGATRON_DIR), with NODE_RANK set per node.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
MEGATRON_DIR=${{MEGATRON_DIR:-.}}
NNODES=${{NNODES:-{shape['nnodes']}}}
NPROC_PER_NODE=${{NPROC_PER_NODE:-{shape['nproc_per_node']}}}
NODE_RANK=${{NODE_RANK:-0}}
MASTER_ADDR=${{MASTER_ADDR:-localhost}}
MASTER_PORT=${{MASTER_PORT:-29500}}
# Data and schedule are not part of the plan: mock data and a short run by default.
DATA_ARGS=${{DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size {max(job.model.vocab, 1)}}}
TRAIN_ARGS=${{TRAIN_ARGS:---train-iters 100 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine}}
export CUDA_DEVICE_MAX_CONNECTIONS=1
# shellcheck disable=SC2046,SC2086
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \\
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\
    "$MEGATRON_DIR/pretrain_gpt.py" $(cat "$HERE/args.txt") $DATA_ARGS $TRAIN_ARGS
"""
    lines = [
        "# Megatron-LM launch files",
        "",
        f"Plan: `{plan.strategy_spec}` for {plan.job.model} on {plan.job.cluster} "
        f"({plan.job.num_gpus} GPUs: {shape['nnodes']} nodes x {shape['nproc_per_node']}).",
        "",
        f"Format: command-line arguments of `pretrain_gpt.py`, {MEGATRON_VERSION}.",
        "",
        "- `args.txt`: one flag per line, decided by the plan; checked against Megatron's validate_args rules "
        "(planner.emit.megatron_check) before writing.",
        "- `launch.sh`: `torchrun ... pretrain_gpt.py $(cat args.txt)`; set MEGATRON_DIR, NNODES, NODE_RANK, "
        "MASTER_ADDR, MASTER_PORT, and DATA_ARGS/TRAIN_ARGS for real data (default: --mock-data).",
        "",
        "Not decided by the plan (add to TRAIN_ARGS): data, tokenizer, learning-rate schedule, normalization "
        "and position-embedding type (e.g. `--normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear` for Llama), checkpointing.",
        "",
        "## Not expressible in Megatron",
        "",
    ]
    lines += [f"- {note}" for note in notes] or ["- Nothing: every choice of the plan maps to a flag."]
    return {
        "args.txt": "\n".join(args_lines(args)) + "\n",
        "launch.sh": launch,
        "README.md": "\n".join(lines) + "\n",
    }
