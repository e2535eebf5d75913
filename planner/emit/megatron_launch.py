"""Megatron-LM target: launch.sh (torchrun with c10d rendezvous on every node) and README.md.

launch.sh runs from the plan folder (report.md: `bash megatron/launch.sh`); it finds args.txt through its
own folder, reads it into an array (one flag and its value per line, split without globbing: MoE layer
patterns such as `([0]*3+[1]*58)` are shell patterns), and adds the launch inputs (planner.emit.shell:
values given to `planner compile`, else environment variables that stop the script when unset).
"""

from __future__ import annotations

from typing import Any

from planner.emit.inputs import TARGET_INPUTS, LaunchInputs, input_lines
from planner.emit.nodes import EnvSetting, nccl_env
from planner.emit.quote import comment
from planner.emit.shell import HERE, rendezvous_host, run_on_every_node, trainer_inputs
from planner.job import Job
from planner.plan.schema import Plan

RELEASE = "Megatron-LM core_v0.16.1"


def _env_lines(env: list[EnvSetting]) -> list[str]:
    lines = []
    for setting in env:
        if setting.value is None:
            lines.append(f"# {setting.name}: {setting.why}")
        else:
            lines.append(f'export {setting.name}="${{{setting.name}:-{setting.value}}}"  # {setting.why}')
    return lines


def launch_script(plan: Plan, job: Job, inputs: LaunchInputs, shape: dict[str, int]) -> str:
    """launch.sh: the launch inputs, args.txt as an array, then torchrun over `shape` running pretrain_gpt.py."""
    nnodes, nproc = shape["nnodes"], shape["nproc_per_node"]
    addr = rendezvous_host(nnodes)
    env = nccl_env(job)
    lines = [
        "#!/usr/bin/env bash",
        "# " + comment(f"{RELEASE} launch for {plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}"),
        f"# {plan.job.num_gpus} ranks = {nnodes} node(s) x {nproc} processes. Run it on EVERY node, from the plan",
        "# folder (bash megatron/launch.sh), with the same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere and",
        "# MEGATRON_DIR set (or compile --megatron-dir). Extra arguments go to pretrain_gpt.py (a flag given again "
        "overrides args.txt).",
        "set -euo pipefail",
        HERE,
        f"megatron_dir={inputs.shell('megatron_dir')}",
        *trainer_inputs(inputs),
        "",
        "# args.txt: one flag and its value per line; read -a splits the words without globbing them",
        "args=()",
        "while read -r -a words; do",
        '  args+=("${words[@]}")',
        'done < "$here/args.txt"',
        "",
    ]
    s = plan.single_strategy
    if s.zero >= 2 and s.pp == 1:  # Megatron FSDP: validate_args asserts it is not 1
        lines += ["# Megatron FSDP overlaps its gathers on more than one hardware queue (validate_args)",
                  "unset CUDA_DEVICE_MAX_CONNECTIONS"]
    else:
        lines += ["# Megatron requires it with tensor or context parallelism on GPUs before Blackwell (validate_args)",
                  "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    if env:
        lines += ["# NCCL over the nodes' compute fabric (a value already in the environment wins)", *_env_lines(env)]
    lines += [
        "",
        f"exec torchrun --nnodes {nnodes} --nproc-per-node {nproc} --rdzv-backend c10d \\",
        f'    --rdzv-endpoint "{addr}:${{MASTER_PORT:-29500}}" --rdzv-id "${{RUN_ID:-planner}}" \\',
        '    "$megatron_dir/pretrain_gpt.py" "${args[@]}" \\',
        '    --data-path "$data" --tokenizer-model "$tokenizer" \\',
        f'    --save "$checkpoint_dir" --load "$checkpoint_dir" --save-interval {inputs.save_every} '
        f"--eval-interval {inputs.save_every} \\",
        '    --train-iters "$train_steps" --lr-warmup-iters "$warmup_steps" "$@"',
    ]
    return "\n".join(lines) + "\n"


def _model_line(args: dict[str, Any]) -> str:
    """One sentence naming the model Megatron builds, from the flags."""
    parts = [f"{args['num-layers']} layers", f"hidden {args['hidden-size']}", f"{args['num-attention-heads']} heads"]
    if "num-query-groups" in args:
        parts.append(f"{args['num-query-groups']} query groups")
    if args.get("multi-latent-attention"):
        parts.append("multi-latent attention")
    parts.append(f"FFN {args['ffn-hidden-size']}")
    if "num-experts" in args:
        parts.append(f"{args['num-experts']} experts of {args['moe-ffn-hidden-size']}, top {args['moe-router-topk']}")
    return ", ".join(parts)


def readme(plan: Plan, job: Job, inputs: LaunchInputs, shape: dict[str, int], args: dict[str, Any],
           notes: list[str]) -> str:
    """README.md: the files, how to run them, the launch inputs, and what Megatron cannot express."""
    tp, divisor = args["tensor-model-parallel-size"], args["make-vocab-size-divisible-by"]
    lines = [
        "# Megatron-LM launch files",
        "",
        f"Plan: `{plan.strategy_spec}` for {plan.job.model} on {plan.job.cluster} "
        f"({plan.job.num_gpus} GPUs: {shape['nnodes']} nodes x {shape['nproc_per_node']}).",
        "",
        f"Format: command-line arguments of `pretrain_gpt.py`, {RELEASE} (megatron/training/arguments.py; "
        "the tests build megatron-core 0.16.1's TransformerConfig from them).",
        "",
        "- `args.txt`: one flag per line, checked against Megatron's validate_args and TransformerConfig rules "
        "(planner.emit.megatron_check) before writing: the plan's parallel degrees, pipeline split, "
        "recomputation, distributed optimizer and the overlap the plan's time assumes; the model "
        f"({_model_line(args)}); precision; the optimizer and schedule (planner/emit/optim.py: AdamW, "
        "warmup, cosine decay, clipping; common pretraining values, edit them as you like).",
        "- `launch.sh`: `torchrun` with c10d rendezvous running `pretrain_gpt.py` with args.txt and the launch "
        "inputs (`--data-path`, `--tokenizer-model`, `--save`/`--load`, `--save-interval`, `--train-iters`, "
        "`--lr-warmup-iters`).",
        "",
        *run_on_every_node(
            "MEGATRON_DIR=<Megatron-LM checkout> MASTER_ADDR=<one node> MASTER_PORT=29500 RUN_ID=myrun "
            "bash megatron/launch.sh",
            "Flags after `launch.sh` override args.txt (argparse keeps the last value), e.g. `--split 99,1,0 "
            "--eval-iters 10` for a validation set (the plan's time has none)."),
        "",
        "## Launch inputs",
        "",
        *input_lines(inputs, TARGET_INPUTS["megatron"]),
        f"- **save_every**: `{inputs.save_every}` steps between checkpoints (`--save-interval`)",
        "",
        "What Megatron reads them as: **data** is `--data-path`, a dataset in Megatron's own indexed format "
        "(PREFIX.bin/.idx written by Megatron-LM's `tools/preprocess_data.py --tokenizer-type "
        "HuggingFaceTokenizer --tokenizer-model <tokenizer> --append-eod --output-prefix OUT`, which names "
        "them OUT_text_document.bin/.idx: PREFIX is OUT_text_document); planner's PREFIX.bin/.idx "
        "(`python -m planner.runtime.data`) has another header, which Megatron cannot read. **tokenizer** is "
        "`--tokenizer-model` of Megatron's HuggingFaceTokenizer: a Hugging Face name or a local folder. "
        f"**checkpoint_dir** is both `--save` and `--load` (`--ckpt-format {args['ckpt-format']}`): a restarted "
        "job resumes from the last checkpoint there.",
        "",
        f"Vocabulary: Megatron pads the tokenizer's vocabulary up to a multiple of "
        f"--make-vocab-size-divisible-by x tp = {divisor} x {tp} = {divisor * tp} rows, which is the model's "
        f"vocabulary ({job.model.vocab}) for any tokenizer of at most that many tokens"
        + (" (rounded up to a multiple of tp)." if divisor * tp != job.model.vocab else "."),
        "",
        "## What Megatron does differently, and what was assumed",
        "",
    ]
    lines += [f"- {note}" for note in notes] or ["- Nothing: every choice of the plan maps to a flag, and the "
                                                 "model's own values are known."]
    return "\n".join(lines) + "\n"
