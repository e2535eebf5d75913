"""Replica groups: data parallelism across pools, each pool with its own strategy and batch share.

On a mixed cluster a job can run one data-parallel *replica group* per pool:
the pool's GPUs train the whole model under their own strategy (tensor-parallel
degree, pipeline, micro-batch, ZeRO, recompute) on their own share of the
global batch, and the groups average gradients before the optimizer step
(HetPipe, Park et al. 2020, "virtual workers"; Whale, Jia et al. 2022,
hardware-aware batch split; Cephalo, Guo et al. 2024).  Faster pools take more
samples, so every group finishes its step at about the same time.

    step = max over groups of step_g(batch_g) + sync

step_g is `evaluate` of the group's strategy on the group's sub-job (its pool
alone, batch_g sequences), which charges everything inside the group,
including its own gradient reduction.  sync is the cross-group gradient
all-reduce after that: the K groups' reduced gradients (params x the wire
bytes of a gradient) are summed by a ring over the groups, each group's share
spread over all its GPUs' NICs, so the slowest group's aggregate NIC bandwidth
sets the rate.  It is not overlapped: a group's gradients are final only when
its own reduction ends.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog, load_catalog
from hardware.topology import Cluster
from planner.cost.comm import grad_reduce_bytes
from planner.cost.estimate import Estimate
from planner.cost.evaluate import evaluate
from planner.job import Job
from planner.strategy import Strategy

_FIELD = ConfigDict(extra="forbid", frozen=True)


class ReplicaGroup(BaseModel):
    """One pool's data-parallel replicas: its batch share and its strategy."""

    model_config = _FIELD
    pool: str = Field(description="The cluster pool the group occupies (all its GPUs the strategy uses).")
    batch: int = Field(gt=0, description="Sequences (samples) per step this group trains on.")
    strategy: Strategy = Field(description="The group's strategy on its pool, dp resolved.")


class GroupEstimate(BaseModel):
    """A replica group and its evaluation."""

    model_config = _FIELD
    group: ReplicaGroup = Field(description="The group.")
    estimate: Estimate = Field(description="evaluate() of the group's strategy on its sub-job.")


class GroupsEstimate(BaseModel):
    """Step time, throughput and memory of a replica-group plan."""

    model_config = _FIELD
    groups: list[GroupEstimate] = Field(description="Every group with its evaluation, in cluster pool order.")
    sync_s: float = Field(description="Cross-group gradient all-reduce, seconds (0 with one group).")
    step_time_s: float = Field(description="Slowest group's step plus sync, seconds.")
    tokens_per_s: float = Field(description="Tokens (samples for recsys) per second, whole job.")
    tokens_per_s_per_gpu: float = Field(description="tokens_per_s / GPUs the groups use.")
    mfu: float = Field(description="Model FLOPs utilisation over the GPUs the groups use.")
    hfu: float = Field(description="Hardware FLOPs utilisation (recompute included) over those GPUs.")
    num_gpus: int = Field(description="GPUs the groups use.")
    fits: bool = Field(description="Every group fits its memory.")


def pool_cluster(cluster: Cluster, pool: str) -> Cluster:
    """The one-pool cluster of `pool` (same fabric)."""
    return Cluster(name=f"{cluster.name}/{pool}", pools=[cluster.pool(pool)], fabric=cluster.fabric)


def group_job(job: Job, pool: str, batch: int) -> Job:
    """The sub-job a group trains: its pool alone, `batch` sequences per step."""
    return job.model_copy(update={"cluster": pool_cluster(job.cluster, pool), "global_batch": batch})


def sync_seconds(job: Job, pools: list[str], catalog: Catalog) -> float:
    """Cross-group all-reduce of the gradients among the groups on `pools` (0 for one group)."""
    if len(pools) < 2:
        return 0.0
    cluster, k = job.cluster, len(pools)
    # a group's share of the ring: every GPU of the pool sends its slice of the gradient at once
    rate = min(cluster.pool(p).gpus * cluster.inter_node_bandwidth_per_gpu(p) for p in pools)
    rate *= catalog.constant("network_efficiency")
    size = job.model.params * grad_reduce_bytes(job)
    return 2.0 * (k - 1) / k * size / rate + 2 * (k - 1) * cluster.fabric.latency

def evaluate_groups(job: Job, groups: list[ReplicaGroup], catalog: Catalog | None = None) -> GroupsEstimate:
    """Score a replica-group plan: each group by `evaluate` on its sub-job, plus the cross-group sync."""
    catalog = catalog or load_catalog()
    if sum(g.batch for g in groups) != job.global_batch:
        raise ValueError(f"group batches sum to {sum(g.batch for g in groups)}, not the global batch "
                         f"{job.global_batch}")
    scored = [GroupEstimate(group=g, estimate=evaluate(group_job(job, g.pool, g.batch), g.strategy, catalog=catalog))
              for g in groups]
    sync = sync_seconds(job, [g.pool for g in groups], catalog)
    step = max(s.estimate.step_time_s for s in scored) + sync
    gpus = sum(s.estimate.num_gpus for s in scored)
    tokens = job.global_batch * job.seq_len / step
    # MFU: the groups' model FLOPs (mfu x step x peak of each) over the whole step's peak
    peaks = [s.estimate.num_gpus * catalog.device(job.cluster.pool(s.group.pool).node.device).peak(job.compute_dtype)
             for s in scored]
    model_flops = sum(s.estimate.mfu * s.estimate.step_time_s * peak for s, peak in zip(scored, peaks))
    hardware_flops = sum(s.estimate.hfu * s.estimate.step_time_s * peak for s, peak in zip(scored, peaks))
    return GroupsEstimate(groups=scored, sync_s=sync, step_time_s=step, tokens_per_s=tokens,
                          tokens_per_s_per_gpu=tokens / gpus, mfu=model_flops / (step * sum(peaks)),
                          hfu=hardware_flops / (step * sum(peaks)), num_gpus=gpus,
                          fits=all(s.estimate.memory.fits for s in scored))
