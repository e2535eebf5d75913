"""torch launch files of an embedding plan: torchrun of the DLRM runtime (planner/runtime/dlrm.py)."""

from __future__ import annotations

from planner.embedding.plan_doc import EmbeddingPlan
from planner.emit.inputs import LaunchInputs
from planner.emit.torch import torchrun_script
from planner.job import Job


def _launch(plan: EmbeddingPlan, job: Job) -> str:
    return torchrun_script(f"{plan.job.model} on {plan.job.cluster}: embedding plan by {plan.strategy}",
                           plan.sharding.world_size, job.cluster.num_nodes, job.cluster.pools[0].node.gpus_per_node,
                           "planner.runtime.dlrm", "--steps 100 --report report.json")


def _readme(plan: EmbeddingPlan) -> str:
    return f"""# torch launch files (embedding plan)

Plan: {plan.job.model} on {plan.job.cluster}, {len(plan.sharding.tables)} tables over
{plan.sharding.world_size} ranks (planned by {plan.strategy}).

`launch.sh` starts `torchrun`, which runs `python -m planner.runtime.dlrm --plan ../plan.json`
in each process: every rank keeps the table shards `../sharding_plan.json` gives it
(TorchRec ParameterSharding fields: sharding type, ranks, shard offsets and sizes, cache
load factor) and a replica of the MLPs and of data-parallel tables, and trains on
synthetic data, printing `step <i> loss <x>` and `table_bytes <rank> <bytes>`.

The runtime uses plain `torch.nn.functional.embedding_bag` and gloo/NCCL collectives,
not TorchRec, and keeps cached tables whole in device memory (the HBM cache and the
host-DRAM tier are the plan's to predict; a TorchRec user applies them with
`fused_uvm_caching` and `CacheParams(load_factor=...)` from sharding_plan.json).

```
MASTER_ADDR=<first node> MASTER_PORT=29500 RUN_ID=myrun ./launch.sh --steps 100
```
"""


def emit_dlrm_torch(plan: EmbeddingPlan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """torch/launch.sh and torch/README.md of an embedding plan."""
    return {"torch/launch.sh": _launch(plan, job), "torch/README.md": _readme(plan)}
