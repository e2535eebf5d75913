"""Launch files of an embedding plan: the DLRM runtime (planner/runtime/dlrm.py) under torchrun, Slurm or
Kubernetes.

All three run `python -m planner.runtime.dlrm --plan plan.json` from the plan folder on every rank:
torch/launch.sh on each node by hand, slurm/job.sbatch one torchrun per node through srun, k8s/ a
PyTorchJob with one pod per node (planner.emit.slurm and planner.emit.k8s write them; this module
gives them the DLRM runtime and its arguments).  The runtime trains on synthetic data and keeps no
checkpoints, so no launch input but the Kubernetes image applies.
"""

from __future__ import annotations

from planner.embedding.plan_doc import EmbeddingPlan
from planner.emit.inputs import LaunchInputs
from planner.emit.k8s import PodSpec, emit_files
from planner.emit.nodes import job_name, nccl_env, node_spec, on_gpus
from planner.emit.slurm import SbatchSpec, sbatch_script
from planner.emit.torch import torchrun_script
from planner.job import Job

MODULE = "planner.runtime.dlrm"
ARGS = ["--plan", "plan.json"]  # relative to the plan folder, where every launcher runs it


def _title(plan: EmbeddingPlan) -> str:
    return f"{plan.job.model} on {plan.job.cluster}: embedding plan by {plan.strategy}"


def _launch(plan: EmbeddingPlan, job: Job) -> str:
    return torchrun_script(_title(plan), plan.sharding.world_size, job.cluster.num_nodes,
                           job.cluster.pools[0].node.gpus_per_node, MODULE, "--steps 100 --report report.json")


def _readme(plan: EmbeddingPlan) -> str:
    return f"""# torch launch files (embedding plan)

Plan: {plan.job.model} on {plan.job.cluster}, {len(plan.sharding.tables)} tables over
{plan.sharding.world_size} ranks (planned by {plan.strategy}).

`launch.sh` starts `torchrun`, which runs `python -m planner.runtime.dlrm --plan plan.json`
from the plan folder in each process: every rank keeps the table shards `../sharding_plan.json` gives it
(TorchRec ParameterSharding fields: sharding type, compute kernel, ranks, shard offsets and
sizes, cache params) and a replica of the MLPs and of data-parallel tables, and trains on
synthetic data, printing `step <i> loss <x>` and `table_bytes <rank> <bytes>`.

The runtime uses plain `torch.nn.functional.embedding_bag` and gloo collectives, not TorchRec,
and keeps cached tables whole in memory (the HBM cache and the host-DRAM tier are the plan's
to predict). A TorchRec user loads the same file as a TorchRec ShardingPlan:
`planner.embedding.torchrec_plan.torchrec_sharding_plan` (needs the `torchrec` extra).

```
MASTER_ADDR=<first node> MASTER_PORT=29500 RUN_ID=myrun ./launch.sh --steps 100
```
"""


def emit_dlrm_torch(plan: EmbeddingPlan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """torch/launch.sh and torch/README.md of an embedding plan."""
    return {"torch/launch.sh": _launch(plan, job), "torch/README.md": _readme(plan)}


def emit_dlrm_slurm(plan: EmbeddingPlan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """slurm/job.sbatch of an embedding plan: one torchrun of the DLRM runtime per node."""
    spec = SbatchSpec(title=_title(plan), name=job_name(plan.job.model), nnodes=job.cluster.num_nodes,
                      nproc_per_node=node_spec(job).gpus_per_node, gpus=on_gpus(job), partition=inputs.partition,
                      module=MODULE, args=ARGS, env=nccl_env(job))
    return {"slurm/job.sbatch": sbatch_script(spec)}


def emit_dlrm_k8s(plan: EmbeddingPlan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """k8s/apply.sh and k8s/pytorchjob.yaml of an embedding plan (no checkpoint claim: the runtime keeps none)."""
    spec = PodSpec(title=_title(plan), name=job_name(plan.job.model), nnodes=job.cluster.num_nodes,
                   nproc_per_node=node_spec(job).gpus_per_node, gpus=on_gpus(job),
                   host_dram_bytes=node_spec(job).host_dram_bytes, image=inputs.env_ref("image"), module=MODULE,
                   args=ARGS, env=nccl_env(job), checkpoint_dir=None,
                   from_env=() if inputs.image is not None else ("image",))
    return {f"k8s/{path}": text for path, text in emit_files(spec).items()}


# target -> the emitter of its folder for an embedding plan
DLRM_EMITTERS = {"torch": emit_dlrm_torch, "slurm": emit_dlrm_slurm, "k8s": emit_dlrm_k8s}
DLRM_INPUTS = {"torch": (), "slurm": ("partition",), "k8s": ("image",)}  # launch inputs each folder reads
