"""Memory per stage: model states, activations in flight, buffers, host tiers.

* Model states (mixed-precision Adam, Rajbhandari et al. 2020): 2 B weights,
  2 B gradients, 12 B optimizer per parameter; ZeRO-1/2/3 shard the optimizer,
  + gradients, + weights over the sharding group; offload moves optimizer
  states (and with ZeRO-3 weights) to host DRAM or NVMe.
* Activations: per-layer saved bytes (Korthikanti et al. 2022) times the
  micro-batches a stage holds in flight: 1F1B stage i of p keeps min(p-i, m);
  interleaved keeps p + (p-1)/v stage-equivalents on the first stage
  (Megatron's warm-up count); GPipe keeps all m.  Full recompute keeps the
  layer inputs plus one layer's full working set.
* FSDP/ZeRO-3 holds the gathered weights of the running and the prefetched
  layer; a fixed reserve (context, NCCL, workspaces) and fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog
from models.graph import Layer, LayerKind, RecomputeMode
from planner.cost.layout import StageSite, group_ranks_per_node, shard_degree, tp_divisor
from planner.cost.sums import StageSums
from planner.job import Job
from planner.strategy import Strategy


WEIGHT_BYTES = 2.0  # 16-bit weights (bf16/fp16; fp8 runs keep bf16 masters of the weights)
GRAD_BYTES = 2.0  # 16-bit gradients (docs/cost-model.md: 2 + 2 + 12 bytes per parameter)


@dataclass(frozen=True)
class RankMemory:
    """Bytes one GPU of a stage holds, by kind, and what its node's host holds."""

    stage: int
    params: float  # parameters resident per rank (count, after tp/ep split)
    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserve: float
    capacity: float
    host_offload: float  # bytes this rank parks in host DRAM
    nvme_offload: float  # bytes this rank parks on NVMe
    host_capacity: float  # usable host DRAM per rank (the node's, shared by its GPUs)
    nvme_capacity: float  # NVMe per rank

    @property
    def total(self) -> float:
        """HBM bytes in use at the peak."""
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers + self.reserve

    @property
    def fits_hbm(self) -> bool:
        """Whether the peak fits the device's HBM."""
        return self.total <= self.capacity

    @property
    def fits_host(self) -> bool:
        """Whether the rank's share of host DRAM and NVMe holds what is placed there."""
        return self.host_offload <= self.host_capacity and self.nvme_offload <= self.nvme_capacity

    @property
    def fits(self) -> bool:
        """Whether HBM, and the rank's share of host DRAM and NVMe, all hold what is placed there."""
        return self.fits_hbm and self.fits_host


def layer_params_per_rank(layer: Layer, strategy: Strategy) -> float:
    """Parameters of `layer` one rank holds before ZeRO sharding: tensor parallelism splits all but
    the replicated ones (norms, row-parallel biases, routers); routed experts are also split by ep."""
    tp = tp_divisor(layer, strategy.tp)
    replicated = layer.tp_replicated_params if tp > 1 else 0
    if layer.kind == LayerKind.MOE and layer.moe is not None:
        per_expert = (layer.params - layer.touched_params) / max(1, layer.moe.num_experts - layer.moe.top_k)
        routed = per_expert * layer.moe.num_experts
        dense = layer.params - routed - replicated
        return dense / tp + routed / (tp * strategy.ep) + replicated
    return (layer.params - replicated) / tp + replicated


def in_flight_microbatches(strategy: Strategy, stage: int, micro_batches: int) -> float:
    """Stage-equivalents of activations a stage holds at its peak."""
    p, m = strategy.pp, micro_batches
    schedule = strategy.pipeline_schedule
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved":
        v = strategy.vpp
        warmup_chunks = (p - stage - 1) * 2 + (v - 1) * p + 1
        return min(warmup_chunks, m * v) / v
    return float(min(p - stage, m))


def saved_bytes(layer: Layer, job: Job, strategy: Strategy, recompute: RecomputeMode) -> float:
    """Activation bytes one rank saves for `layer` per micro-batch under `recompute`."""
    tp = strategy.tp if layer.tp_splittable else 1
    sp = strategy.sequence_parallel and layer.tp_splittable
    return layer.saved_activation_bytes(
        strategy.mbs, job.seq_len, tp=tp, sequence_parallel=sp,
        recompute=recompute, flash_attention=job.flash_attention,
    ) / strategy.cp


def stage_memory(
    job: Job,
    strategy: Strategy,
    site: StageSite,
    sums: StageSums,
    micro_batches: int,
    catalog: Catalog,
) -> RankMemory:
    """Peak HBM and offloaded bytes of one rank of the stage at `site` holding `sums`."""
    s = strategy
    params = sums.params
    gpn = site.node.gpus_per_node
    shard = shard_degree(s, gpn)
    opt_shard = shard if s.zero >= 1 else 1

    weights = params * WEIGHT_BYTES / (shard if s.zero >= 3 else 1)
    grads = params * GRAD_BYTES / (shard if s.zero >= 2 else 1)
    optimizer = params * catalog.constant("optimizer_bytes_per_param") / opt_shard

    host = nvme = 0.0
    if s.offloads_optimizer:
        # the offloaded share of the optimizer states plus the fp32 gradient copy the CPU optimizer reads
        share = s.offload_ratio
        fp32_grads = share * params * 4.0 / opt_shard
        moved = share * optimizer
        host, nvme = (moved + fp32_grads, 0.0) if s.offload_device == "cpu" else (fp32_grads, moved)
        optimizer -= moved
    if s.offloads_params:
        if s.offload_device == "cpu":
            host += weights
        else:
            nvme += weights
        weights = 0.0

    if s.regather == "host" and shard > 1:
        # FCDP: the node keeps one gathered copy of the stage's weights, split over its members of the group
        host += params * WEIGHT_BYTES / group_ranks_per_node(shard, s.tp, gpn)

    in_flight = in_flight_microbatches(s, site.index, micro_batches)
    # backward re-materialises one recomputed layer at a time on top of what is kept
    activations = sums.kept_activations * in_flight + sums.working_set

    buffers = 0.0
    if s.zero >= 3:
        # the running and the prefetched layer's gathered weights (and their gradients)
        buffers += 2.0 * sums.largest_layer_params * (WEIGHT_BYTES + GRAD_BYTES)
    allocated = weights + grads + optimizer + activations + buffers
    reserve = catalog.constant("memory_reserve_bytes") + catalog.constant("memory_fragmentation") * allocated
    return RankMemory(
        stage=site.index, params=params, weights=weights, grads=grads, optimizer=optimizer,
        activations=activations, buffers=buffers, reserve=reserve, capacity=site.hbm_bytes,
        host_offload=host, nvme_offload=nvme,
        host_capacity=site.node.host_dram_bytes * catalog.constant("host_memory_usable_fraction") / gpn,
        nvme_capacity=site.node.nvme_bytes / gpn,
    )
