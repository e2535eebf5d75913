"""torchtitan target: launch.sh (torchrun with c10d rendezvous on every node) and README.md."""

from __future__ import annotations

from planner.emit.inputs import TARGET_INPUTS, LaunchInputs, input_lines
from planner.emit.quote import comment
from planner.emit.shell import HERE, rendezvous_host, run_on_every_node, trainer_inputs
from planner.emit.torchtitan_model import RELEASE
from planner.plan.schema import Plan

# launch input -> the torchtitan 0.2.2 job-config field launch.sh sets from it
OVERRIDES = {"data": "training.dataset_path", "tokenizer": "model.hf_assets_path",
             "checkpoint_dir": "checkpoint.folder", "train_steps": "training.steps"}


def launch_script(plan: Plan, inputs: LaunchInputs, shape: dict[str, int]) -> str:
    """launch.sh: the launch inputs, then torchrun over `shape` running torchtitan.train with train.toml."""
    nnodes, nproc = shape["nnodes"], shape["nproc_per_node"]
    addr = rendezvous_host(nnodes)
    lines = [
        "#!/usr/bin/env bash",
        "# " + comment(f"torchtitan launch ({RELEASE}) for {plan.job.model} on {plan.job.cluster}: "
                       f"{plan.strategy_spec}"),
        f"# {plan.job.num_gpus} ranks = {nnodes} node(s) x {nproc} processes. Run it on EVERY node, from the plan",
        "# folder (bash torchtitan/launch.sh), with the same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere.",
        "# Extra arguments go to torchtitan.train (they override train.toml, e.g. --metrics.enable_tensorboard).",
        "set -euo pipefail",
        HERE,
        *trainer_inputs(inputs),
        "",
        f"exec torchrun --nnodes {nnodes} --nproc-per-node {nproc} --rdzv-backend c10d \\",
        f'    --rdzv-endpoint "{addr}:${{MASTER_PORT:-29500}}" --rdzv-id "${{RUN_ID:-planner}}" \\',
        '    -m torchtitan.train --job.config_file "$here/train.toml" \\',
        f'    --{OVERRIDES["data"]} "$data" --{OVERRIDES["tokenizer"]} "$tokenizer" \\',
        f'    --{OVERRIDES["checkpoint_dir"]} "$checkpoint_dir" --{OVERRIDES["train_steps"]} "$train_steps" \\',
        '    --lr_scheduler.warmup_steps "$warmup_steps" "$@"',
    ]
    return "\n".join(lines) + "\n"


def readme(plan: Plan, inputs: LaunchInputs, shape: dict[str, int], notes: list[str]) -> str:
    """README.md: the files, how to run them, the launch inputs, and what the plan chose that torchtitan cannot
    express."""
    lines = [
        "# torchtitan launch files",
        "",
        f"Plan: `{plan.strategy_spec}` for {plan.job.model} on {plan.job.cluster} "
        f"({plan.job.num_gpus} GPUs: {shape['nnodes']} nodes x {shape['nproc_per_node']}).",
        "",
        f"Format: the TOML job config of {RELEASE} (`pip install torchtitan==0.2.2`; "
        "`torchtitan/config/job_config.py`).",
        "",
        "- `train.toml`: [parallelism], [training] batch, sequence and precision, [activation_checkpoint] and "
        "[compile] come from the plan. The optimizer, learning-rate schedule and clipping are common "
        "pretraining values (planner/emit/optim.py); edit them as you like.",
        "- `launch.sh`: `torchrun` with c10d rendezvous running `-m torchtitan.train --job.config_file "
        "<this folder>/train.toml`, plus the launch inputs as command-line overrides: "
        + ", ".join(f"`--{field}`" for field in OVERRIDES.values()) + " and `--lr_scheduler.warmup_steps`.",
        "",
        *run_on_every_node(
            "MASTER_ADDR=<one node> MASTER_PORT=29500 RUN_ID=myrun bash torchtitan/launch.sh",
            "A relative checkpoint folder is made absolute there, because torchtitan would otherwise put it "
            "under `job.dump_folder` (./outputs)."),
        "",
        "## Launch inputs",
        "",
        *input_lines(inputs, TARGET_INPUTS["torchtitan"]),
        f"- **save_every**: `{inputs.save_every}` steps between checkpoints (`checkpoint.interval`)",
        "",
        f"What torchtitan reads them as: **data** is `training.dataset_path` for {RELEASE}'s `c4` dataset, a "
        "Hugging Face text dataset loaded with `datasets.load_dataset(PATH, name=\"en\", split=\"train\", "
        "streaming=True)` (a local copy of allenai/c4, or another dataset with an `en` configuration and a "
        "`text` column). It is not planner's pre-tokenized PREFIX.bin/.idx, which torchtitan cannot read. To use "
        "another dataset, register it in `torchtitan/hf_datasets/text_datasets.py` and set "
        "`training.dataset`. **tokenizer** is `model.hf_assets_path`, a local folder with the Hugging Face "
        "tokenizer files (`tokenizer.json`, `tokenizer_config.json`; torchtitan's "
        "`scripts/download_hf_assets.py` downloads them).",
        "",
        "## No torchtitan equivalent",
        "",
    ]
    lines += [f"- {note}" for note in notes] or ["- Nothing: every choice of the plan maps to a field."]
    return "\n".join(lines) + "\n"
