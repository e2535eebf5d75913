"""Slurm target: `job.sbatch`, one task per node running the torch launcher.

The batch script asks for the plan's nodes with one task per node and every
GPU of the node, takes the first host of the allocation as the rendezvous
address (`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`), and
`srun` starts `../torch/launch.sh` (torchrun) on each node with
NODE_RANK=$SLURM_NODEID.  The rendezvous settings are exported both under
plain names (NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT)
and under torchrun's PET_* environment names, so any torchrun-based
launcher of the plan folder (torch/, torchtitan/, megatron/) picks them up.
Format: sbatch directives of Slurm >= 20.11 (--gpus-per-node).
"""

from __future__ import annotations

import re

from planner.emit import strategy_writer
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy
from planner.emit.inputs import LaunchInputs

CPUS_PER_GPU = 8  # placeholder: hardware catalog nodes carry no CPU core count


def launch_shape(plan: Plan) -> dict[str, int]:
    """Nodes the plan uses and processes per node (torchrun's --nnodes and --nproc-per-node)."""
    nodes: set[int] = set()
    gpn = 0
    for stage in plan.stages:
        for span in stage.ranks.spans:
            nodes.update(range(span.first_node, span.last_node + 1))
            gpn = max(gpn, span.gpus_per_node)
    nproc = min(gpn, plan.job.num_gpus) if gpn else plan.job.num_gpus
    nnodes = max(len(nodes), -(-plan.job.num_gpus // max(nproc, 1)))
    return {"nnodes": nnodes, "nproc_per_node": nproc}


def job_name(plan: Plan) -> str:
    """A scheduler-safe job name from the model name (lower case, [a-z0-9-])."""
    name = re.sub(r"[^a-z0-9]+", "-", plan.job.model.lower()).strip("-") or "model"
    return f"planner-{name}"[:63].rstrip("-")


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """job.sbatch for the plan."""
    shape = launch_shape(plan)
    nnodes, gpn = shape["nnodes"], shape["nproc_per_node"]
    text = f"""#!/bin/bash
# Slurm batch script for {plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}
# {plan.job.num_gpus} GPUs = {nnodes} nodes x {gpn}. Submit from this folder: sbatch job.sbatch
#SBATCH --job-name={job_name(plan)}
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpn}
#SBATCH --cpus-per-task={CPUS_PER_GPU * gpn}
#SBATCH --time=04:00:00
#SBATCH --output=%x-%j.out
# --time is a placeholder: set the run's wall-clock limit. --cpus-per-task assumes {CPUS_PER_GPU} cores per GPU.
set -euo pipefail
cd "${{SLURM_SUBMIT_DIR:-.}}"

MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export MASTER_ADDR
export MASTER_PORT=${{MASTER_PORT:-29500}}
export NNODES=$SLURM_JOB_NUM_NODES
export NPROC_PER_NODE={gpn}
# torchrun reads its options from PET_* variables too
export PET_MASTER_ADDR=$MASTER_ADDR PET_MASTER_PORT=$MASTER_PORT PET_NNODES=$NNODES PET_NPROC_PER_NODE=$NPROC_PER_NODE

# The torch launcher (torchrun) of this plan; ../torchtitan/launch.sh and ../megatron/launch.sh take the
# same variables.  DeepSpeed alternative: run `deepspeed --hostfile` from ../deepspeed/ on the first node
# instead (its launcher starts the other nodes over ssh/pdsh), or LAUNCHER=../deepspeed/launch.sh here.
LAUNCHER=${{LAUNCHER:-../torch/launch.sh}}

# One task per node; each starts torchrun with its node rank.
srun --kill-on-bad-exit=1 --ntasks-per-node=1 \\
    bash -c 'export NODE_RANK=$SLURM_NODEID PET_NODE_RANK=$SLURM_NODEID; exec bash "$0"' "$LAUNCHER"
"""
    return {"job.sbatch": text}


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """job.sbatch runs ../torch/launch.sh: the torch target's strategy (the plan's own)."""
    return strategy_writer("torch")(plan, job)
