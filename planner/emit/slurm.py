"""Slurm target: `job.sbatch`, submitted from the plan folder with `sbatch slurm/job.sbatch`.

The script is self-contained (it needs no other target's folder):

* it asks for the plan's nodes, whole (`--exclusive`), one task per node and every GPU of the node;
  the partition is the `--partition` launch input, else sbatch reads SBATCH_PARTITION itself, and the
  time limit is the partition's default unless SBATCH_TIMELIMIT says otherwise;
* sbatch runs a spool copy of the script, so it finds the plan folder from $SLURM_SUBMIT_DIR (the
  folder itself, or its parent when submitted from slurm/), not from $0, and works from there;
* `srun --ntasks-per-node=1` starts one `torchrun` per node with c10d rendezvous on the allocation's
  first node (the first of `scontrol show hostnames`), run id $SLURM_JOB_ID; the rendezvous hands out
  node ranks, so every node runs the same command;
* each torchrun runs the trainer with the arguments the torch target writes (`train_args`: paths
  relative to the plan folder, launch inputs not given read from their environment variables);
* NCCL settings for the nodes' compute NICs (planner.emit.nodes.nccl_env); a value in the submitting
  environment wins (sbatch and srun pass the environment on).

Plans the torch runtime cannot run (experts, NVMe offload) get UnsupportedPlan, as the torch target
does.  DeepSpeed is not launched from here: its launcher starts the other nodes itself (ssh/pdsh with
a hostfile), so one per node would start it N times; deepspeed/launch.sh runs on one node.
Format: sbatch directives of Slurm >= 22.05 (--gpus-per-node; srun does not inherit --cpus-per-task).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.emit import UnsupportedPlan, strategy_writer
from planner.emit.inputs import LaunchInputs
from planner.emit.nodes import EnvSetting, job_name, launch_shape, nccl_env, on_gpus
from planner.emit.quote import comment, sbatch_value
from planner.emit.torch import train_args
from planner.plan.runnable import runtime_problem
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy

__all__ = ["SbatchSpec", "emit", "launch_shape", "sbatch_script", "written_strategy"]

RDZV_PORT = 29500  # torchrun's default rendezvous port; MASTER_PORT in the environment overrides it


class SbatchSpec(BaseModel):
    """What a job.sbatch runs: the allocation, the module each rank runs and its arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    title: str = Field(description="One line on what runs (model, cluster, strategy).")
    name: str = Field(description="Slurm job name.")
    nnodes: int = Field(ge=1, description="Nodes (one torchrun each).")
    nproc_per_node: int = Field(ge=1, description="Processes per node (GPUs per node).")
    gpus: bool = Field(description="Whether the nodes have GPUs (--gpus-per-node; NCCL settings).")
    partition: str | None = Field(description="Partition; None: sbatch reads SBATCH_PARTITION.")
    module: str = Field(description="Python module each rank runs (python -m MODULE).")
    args: list[str] = Field(description="Its arguments as shell words, paths relative to the plan folder.")
    env: list[EnvSetting] = Field(description="Environment the ranks get (NCCL).")


def trainer_words(plan: Plan, job: Job, inputs: LaunchInputs) -> list[str]:
    """The trainer's arguments as shell words (planner.emit.torch.train_args)."""
    words = train_args(plan, job, inputs)
    return [words] if isinstance(words, str) else list(words)


def _directives(spec: SbatchSpec) -> list[str]:
    lines = [f"#SBATCH --job-name={sbatch_value(spec.name, 'job name')}"]
    if spec.partition is not None:
        lines.append(f"#SBATCH --partition={sbatch_value(spec.partition, '--partition')}")
    lines += [f"#SBATCH --nodes={spec.nnodes}", "#SBATCH --ntasks-per-node=1"]
    if spec.gpus:
        lines.append(f"#SBATCH --gpus-per-node={spec.nproc_per_node}")
    return lines + ["#SBATCH --exclusive", "#SBATCH --output=%x-%j.out"]


def _env_lines(env: list[EnvSetting]) -> list[str]:
    if not env:
        return []
    lines = ["", "# NCCL over the nodes' compute fabric (a value set before sbatch wins)"]
    for setting in env:
        if setting.value is None:
            lines.append(f"# {setting.name}: {setting.why}")
        else:
            name, value = setting.name, setting.value
            lines += [f"# {name}: {setting.why}", f'export {name}="${{{name}:-{value}}}"']
    return lines


def _command(spec: SbatchSpec) -> list[str]:
    options: list[list[str]] = []
    for word in spec.args:  # one option and its value per line
        if word.startswith("--") or not options:
            options.append([])
        options[-1].append(word)
    lines = [
        "srun --ntasks-per-node=1 --cpus-per-task=\"$SLURM_CPUS_ON_NODE\" --kill-on-bad-exit=1",
        f"    torchrun --nnodes {spec.nnodes} --nproc-per-node {spec.nproc_per_node} --rdzv-backend c10d",
        "    --rdzv-endpoint \"$MASTER_ADDR:$MASTER_PORT\" --rdzv-id \"$SLURM_JOB_ID\"",
        f"    -m {spec.module}",
        *(f"    {' '.join(option)}" for option in options),
    ]
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


def sbatch_script(spec: SbatchSpec) -> str:
    """job.sbatch text of `spec` (see the module docstring)."""
    partition = (f"partition {comment(spec.partition)}" if spec.partition is not None else
                 "partition from $SBATCH_PARTITION (sbatch reads it; unset: the cluster's default)")
    header = [
        "#!/bin/bash",
        f"# Slurm batch script: {comment(spec.title)}",
        f"# {spec.nnodes * spec.nproc_per_node} ranks = {spec.nnodes} node(s) x {spec.nproc_per_node}: srun starts one "
        "torchrun per node, c10d rendezvous on the first node.",
        "# Submit from the plan folder (where plan.json is): sbatch slurm/job.sbatch",
        f"# {partition}; time limit: the partition's default, or $SBATCH_TIMELIMIT.",
        "# The nodes need planner with its runtime extra (pip install -e '.[runtime]' in its checkout) in",
        "# the submitting environment, which sbatch passes on, or the image the repository's Dockerfile builds.",
        *_directives(spec),
    ]
    body = [
        "set -euo pipefail",
        "",
        "# sbatch runs a spool copy of this script: the plan folder is where it was submitted from",
        "PLAN_DIR=$SLURM_SUBMIT_DIR",
        "if [[ ! -f $PLAN_DIR/plan.json && -f $PLAN_DIR/../plan.json ]]; then",
        "    PLAN_DIR=$(dirname \"$PLAN_DIR\")  # submitted from slurm/",
        "fi",
        "if [[ ! -f $PLAN_DIR/plan.json ]]; then",
        "    echo \"job.sbatch: no plan.json in $SLURM_SUBMIT_DIR: submit from the plan folder "
        "(sbatch slurm/job.sbatch)\" >&2",
        "    exit 2",
        "fi",
        "cd \"$PLAN_DIR\"",
        "",
        "# c10d rendezvous on the allocation's first node (no `| head`: under pipefail its SIGPIPE would end the job)",
        "HOSTS=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\")",
        "MASTER_ADDR=${HOSTS%%$'\\n'*}",
        f"MASTER_PORT=${{MASTER_PORT:-{RDZV_PORT}}}",
        *_env_lines(spec.env),
        "# threads per rank: the node's CPUs shared by its ranks",
        f"export OMP_NUM_THREADS=\"${{OMP_NUM_THREADS:-$(( SLURM_CPUS_ON_NODE / {spec.nproc_per_node} ))}}\"",
        "",
        "# one torchrun per node, with every CPU of the node (srun does not inherit sbatch's CPU count)",
        *_command(spec),
    ]
    return "\n".join(header + body) + "\n"


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """job.sbatch for the plan; UnsupportedPlan when the torch runtime cannot run it."""
    problem = runtime_problem(plan)
    if problem is not None:
        raise UnsupportedPlan(problem)
    shape = launch_shape(plan)
    spec = SbatchSpec(
        title=f"{plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}", name=job_name(plan.job.model),
        nnodes=shape["nnodes"], nproc_per_node=shape["nproc_per_node"], gpus=on_gpus(job),
        partition=inputs.partition, module="planner.runtime.train", args=trainer_words(plan, job, inputs),
        env=nccl_env(job),
    )
    return {"job.sbatch": sbatch_script(spec)}


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """job.sbatch runs planner.runtime.train on plan.json: the torch target's strategy (the plan's own)."""
    return strategy_writer("torch")(plan, job)
