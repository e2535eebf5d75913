"""torch target: `launch.sh` (torchrun on each node) for the plan runtime, and a README.

`launch.sh` runs, from the plan folder (where plan.json is),

    torchrun --nnodes N --nproc_per_node G --rdzv_backend c10d \\
        --rdzv_endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv_id "${RUN_ID:-planner}" \\
        -m planner.runtime.train TRAIN_ARGS "$@"

once per node (c10d rendezvous hands out node ranks, so every node runs the
same command; MASTER_ADDR defaults to localhost on one node and stops the
script when unset on several: planner.emit.shell.rendezvous_host).
TRAIN_ARGS (`train_args`, also what the Slurm and Kubernetes targets run) are
`--plan plan.json` and the launch inputs: `--data`, `--tokenizer`,
`--checkpoint-dir`, `--train-steps` (each given to `planner compile` or read
from its environment variable at launch) and `--save-every`;
relative paths resolve from the plan folder.  `planner.runtime.train` builds
the reference model on the meta device, applies the plan (pipeline split,
tensor parallel, activation checkpointing, FSDP2; planner/runtime/parallelize.py),
materializes each rank's shards and trains in the plan's precision on the token
shards, with checkpoints; extra arguments (`--lr`, `--report FILE`, ...) pass through.

The runtime builds Llama-style zoo models (TransformerConfig: SwiGLU,
RMSNorm, RoPE, untied head, dense) and runs every tp, pp (1f1b, gpipe,
interleaved vpp), cp, dp and ZeRO of a plan; ep > 1 and NVMe offload get
`UnsupportedPlan` (a default target then writes no torch/ folder, with a note).
`runtime_problem` (planner/plan/runnable.py) is that check; the runtime itself calls it too.
"""

from __future__ import annotations

from planner.emit import UnsupportedPlan
from planner.emit.nodes import launch_shape
from planner.job import Job
from planner.plan.runnable import runtime_problem
from planner.plan.schema import Plan
from planner.strategy import Strategy
from planner.emit.inputs import TARGET_INPUTS, LaunchInputs, input_lines
from planner.emit.quote import comment
from planner.emit.shell import rendezvous_host

TRAIN_INPUTS = ("data", "tokenizer", "checkpoint_dir", "train_steps")  # launch inputs the trainer takes


def train_args(plan: Plan, job: Job | None, inputs: LaunchInputs = LaunchInputs()) -> list[str]:
    """The arguments after `python -m planner.runtime.train`, as shell words, run from the plan folder:
    `--plan plan.json`, then each launch input: its quoted value when given to `planner compile`, else a
    `"${VAR:?...}"` expansion that stops the launch naming the variable; `--save-every` always."""
    words = ["--plan", "plan.json"]
    for field in TRAIN_INPUTS:
        words += [f"--{field.replace('_', '-')}", inputs.shell(field)]
    return words + ["--save-every", str(inputs.save_every)]


def train_argv(inputs: LaunchInputs) -> list[str]:
    """The same arguments as an argv (no shell): given values as they are, the others `${VAR}` (Kubernetes
    fills them in with envsubst)."""
    words = ["--plan", "plan.json"]
    for field in TRAIN_INPUTS:
        words += [f"--{field.replace('_', '-')}", inputs.env_ref(field)]
    return words + ["--save-every", str(inputs.save_every)]


def torchrun_script(title: str, ranks: int, nnodes: int, nproc: int, module: str, example_args: str,
                    args: list[str] | None = None) -> str:
    """launch.sh: torchrun with c10d rendezvous running `python -m module ARGS` from the plan folder on each
    node (ARGS: shell words, default `--plan plan.json`)."""
    lines: list[list[str]] = []
    for word in args if args is not None else ["--plan", "plan.json"]:
        if word.startswith("--") or not lines:  # one option and its value per line
            lines.append([])
        lines[-1].append(word)
    words = " \\\n    ".join(" ".join(line) for line in lines)
    addr = rendezvous_host(nnodes)
    return f"""#!/usr/bin/env bash
# {comment(title)}
# {ranks} ranks = {nnodes} node(s) x {nproc} processes. Run this script on EVERY node
# (same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere); extra arguments go to {module},
# e.g. ./launch.sh {example_args}
set -euo pipefail
cd "$(dirname "$0")/.."  # the plan folder: plan.json and relative paths resolve here
exec torchrun --nnodes {nnodes} --nproc_per_node {nproc} --rdzv_backend c10d \\
    --rdzv_endpoint "{addr}:${{MASTER_PORT:-29500}}" --rdzv_id "${{RUN_ID:-planner}}" \\
    -m {module} \\
    {words} \\
    "$@"
"""


def _launch(plan: Plan, job: Job | None, inputs: LaunchInputs) -> str:
    shape = launch_shape(plan)
    return torchrun_script(f"{plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}", plan.job.num_gpus,
                           shape["nnodes"], shape["nproc_per_node"], "planner.runtime.train",
                           "--lr 3e-4 --warmup-steps 2000 --report report.json", train_args(plan, job, inputs))


def _readme(plan: Plan, inputs: LaunchInputs) -> str:
    shape = launch_shape(plan)
    nnodes, nproc = shape["nnodes"], shape["nproc_per_node"]
    s = plan.single_strategy
    given = "\n".join(input_lines(inputs, TARGET_INPUTS["torch"]))
    return f"""# torch launch files

Plan: {plan.job.model} on {plan.job.cluster}, `{plan.strategy_spec}`
({plan.job.num_gpus} ranks: {nnodes} node(s) x {nproc} processes).

`launch.sh` changes to the plan folder (one up, where plan.json is) and starts
`torchrun` with c10d rendezvous, which runs in each process

```
python -m planner.runtime.train {" ".join(train_args(plan, None, inputs))}
```

Run it on every node with the same rendezvous settings:

```
MASTER_ADDR=<first node> MASTER_PORT=29500 RUN_ID=myrun ./launch.sh
```

Launch inputs (relative paths resolve from the plan folder; a value not given to
`planner compile` is read from its environment variable, and the launch stops
naming the variable when it is unset):

{given}
- **save_every**: `{inputs.save_every}` steps between checkpoints

- Write the dataset with `python -m planner.runtime.data write --tokenizer NAME
  --input FILE... --output PREFIX` (docs/data-format.md); `--tokenizer bytes` needs
  no download.
- The trainer saves a `torch.distributed.checkpoint` checkpoint to
  `CHECKPOINT_DIR/step-N` every save_every steps and at the end, and resumes from the
  latest one when started again: rerun the same command after an interruption.
- `MASTER_ADDR` / `MASTER_PORT`: the c10d rendezvous endpoint (any node's
  address; on several nodes the script stops when MASTER_ADDR is unset, on one
  it defaults to localhost; port 29500); `RUN_ID` (default `planner`) names the
  run. Node ranks are assigned by the rendezvous.
- Arguments after `launch.sh` go to the trainer and win over the ones above:
  `--lr X` (peak, default 3e-4), `--warmup-steps N`, `--min-lr-ratio R`,
  `--weight-decay W`, `--grad-clip G`, `--stop-at-step N`, `--precision fp32`,
  `--seed S`, `--report FILE` (JSON with the losses and each rank's parameter bytes).
- The nodes need this planner installed with its runtime extra, from its checkout
  (`pip install -e '.[runtime]'`, i.e. torch; the PyPI project named planner is another one).

What the runtime does with this plan (planner/runtime/parallelize.py):
it builds the model on the meta device and applies the device mesh over pp={s.pp},
dp={s.dp} (shard={s.shard}), cp={s.cp}, tp={s.tp};
then (1) pipeline split over the plan's stages (vpp={s.vpp} chunk(s) each) with the
`{s.pipeline_schedule}` schedule and {plan.time.micro_batches} micro-batch(es) per step, (2) DTensor
tensor parallel (vocab-parallel embedding and head{', sequence parallel' if s.sequence_parallel else ''}),
(3) context parallel attention (each cp rank one contiguous sequence chunk; K and V all-gathered over
cp), (4) activation checkpointing (recompute={s.recompute}), (5) data parallel for zero={s.zero}
over dp x cp (zero 3: FSDP2 `fully_shard` resharding after forward; zero 1/2: FSDP2 without resharding
after forward; zero 0: replicated, gradients all-reduced); then each rank materializes only its own
shards. It trains in {plan.job.precision} mixed precision (fp32 master weights, gradients and AdamW
state; FSDP2 MixedPrecisionPolicy, or autocast where there is no FSDP2) with AdamW, linear warmup and
cosine decay and gradient clipping (NCCL on GPUs, gloo on CPU), and prints `step <i> loss <x> ...` and
`param_bytes <rank> <bytes>`. Not supported: ep > 1 (the reference model is dense), NVMe offload.
"""


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The plan's own strategy: planner.runtime.train reads plan.json and runs it as it is (UnsupportedPlan
    when the runtime cannot)."""
    problem = runtime_problem(plan)
    if problem is not None:
        raise UnsupportedPlan(problem)
    return plan.single_strategy


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """launch.sh and README.md of the plan; UnsupportedPlan when the runtime cannot run it."""
    problem = runtime_problem(plan)
    if problem is not None:
        raise UnsupportedPlan(problem)
    return {"README.md": _readme(plan, inputs), "launch.sh": _launch(plan, job, inputs)}
