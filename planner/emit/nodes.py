"""What the cluster launch files (Slurm, Kubernetes) need to know about the nodes a plan runs on.

* `launch_shape`: nodes and processes per node (torchrun's --nnodes and --nproc-per-node);
* `job_name`: a scheduler-safe name;
* `nccl_env`: the NCCL settings for the nodes' InfiniBand compute NICs.

NCCL finds RDMA NICs by itself, but on nodes that also carry storage or management NICs of the same
kind it may route collectives over them; `NCCL_IB_HCA` names the compute NICs where the node type's
documentation gives their device names (NodeSpec.compute_hcas, hardware/data/nodes.yaml, with the
source), with NCCL's `=` prefix for exact names (a
plain `mlx5_1` would also match `mlx5_10`).  Elsewhere the launch files say how to find the names
(`ibv_devinfo -l`) and leave the choice to NCCL.  A value already in the environment at submit time
wins in the Slurm script (`${VAR:-default}`).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from hardware.catalog import NodeSpec
from planner.job import Job
from planner.plan.schema import Plan

class EnvSetting(BaseModel):
    """One environment variable of a launch file, or a note about one that is left to the cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="Variable name.")
    value: str | None = Field(description="Value to set; None: not set, the note says how to choose one.")
    why: str = Field(description="One line: what it does here, or how to choose a value.")


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


def job_name(model: str) -> str:
    """A scheduler-safe job name from the model name (lower case, [a-z0-9-], at most 63 characters: a
    Kubernetes object name)."""
    name = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "model"
    return f"planner-{name}"[:63].rstrip("-")


def node_spec(job: Job) -> NodeSpec:
    """The node type of the job's first pool (launch files ask every node for the same resources)."""
    return job.cluster.pools[0].node


def on_gpus(job: Job) -> bool:
    """Whether the job's nodes have GPUs (the cpu presets run gloo, with no NCCL)."""
    return not node_spec(job).device.lower().startswith("cpu")


def nccl_env(job: Job) -> list[EnvSetting]:
    """NCCL settings for the job's nodes (empty on CPU nodes, which run gloo)."""
    if not on_gpus(job):
        return []
    hcas = {pool.node.compute_hcas for pool in job.cluster.pools}
    known = next(iter(hcas)) if len(hcas) == 1 else ()
    if known:
        hca = EnvSetting(name="NCCL_IB_HCA", value="=" + ",".join(known),
                         why=f"compute NICs only; {node_spec(job).compute_hcas_source}")
    else:
        hca = EnvSetting(name="NCCL_IB_HCA", value=None,
                         why="not set: NCCL uses every RDMA NIC it finds; name the compute ones "
                             "(ibv_devinfo -l; e.g. =mlx5_0,mlx5_1) when nodes also have storage NICs")
    return [
        hca,
        EnvSetting(name="NCCL_SOCKET_IFNAME", value=None,
                   why="not set: NCCL bootstraps over an interface that is not docker or loopback (ib* first); "
                       "name one (e.g. bond0) if that cannot reach the other nodes"),
        EnvSetting(name="NCCL_DEBUG", value="WARN", why="NCCL reports failures, not every setting (INFO to debug)"),
    ] + _multi_node_nvlink(job)


def _multi_node_nvlink(job: Job) -> list[EnvSetting]:
    """A note where the plan counts on NVLink between nodes (GB200 NVL72 trays): NCCL finds it by itself."""
    wide = [pool for pool in job.cluster.pools if pool.node.nvlink_domain_nodes > 1]
    if not wide:
        return []
    segment = min(min(pool.count, pool.node.nvlink_domain_nodes) for pool in wide)
    return [EnvSetting(name="NCCL_MNNVL_ENABLE", value=None,
                       why="not set: NCCL (2.23+) detects multi-node NVLink between the nodes of one NVLink domain "
                           "by itself; the plan counts on it, so the nodes need IMEX channels (Slurm: the IMEX "
                           "daemon; Kubernetes: a ComputeDomain of NVIDIA's DRA driver) and to fill whole domains "
                           f"(Slurm's topology/block plugin: sbatch --segment={segment})")]
