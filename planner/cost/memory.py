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
from models.graph import Layer, LayerKind
from planner.cost.layout import StagePlacement, shard_degree, tp_divisor
from planner.job import Job
from planner.strategy import Strategy

WEIGHT_BYTES = 2.0  # 16-bit weights (bf16/fp16; fp8 runs keep bf16 masters of the weights)
GRAD_BYTES = 2.0  # 16-bit gradients (DESIGN.md: 2 + 2 + 12 bytes per parameter)


@dataclass(frozen=True)
class StageMemory:
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

    @property
    def total(self) -> float:
        """HBM bytes in use at the peak."""
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers + self.reserve

    @property
    def fits(self) -> bool:
        """Whether the peak fits the device's HBM."""
        return self.total <= self.capacity


def layer_params_per_rank(layer: Layer, strategy: Strategy) -> float:
    """Parameters of `layer` one rank holds before ZeRO sharding (tp split; experts also by ep)."""
    tp = tp_divisor(layer, strategy.tp)
    if layer.kind == LayerKind.MOE and layer.moe is not None:
        per_expert = (layer.params - layer.touched_params) / max(1, layer.moe.num_experts - layer.moe.top_k)
        routed = per_expert * layer.moe.num_experts
        dense = layer.params - routed
        return dense / tp + routed / (tp * strategy.ep)
    return layer.params / tp


def stage_params_per_rank(layers: tuple[Layer, ...], strategy: Strategy, with_tied: bool) -> float:
    """Parameters a rank of a stage holds (tied copies counted when they sit on another stage)."""
    total = sum(layer_params_per_rank(layer, strategy) for layer in layers)
    if with_tied:
        total += sum(layer.tied_params / tp_divisor(layer, strategy.tp) for layer in layers)
    return total


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


def stage_activation_bytes(stage: StagePlacement, job: Job, strategy: Strategy, in_flight: float) -> float:
    """Saved activation bytes of a stage at its peak for one rank."""

    def saved(layer: Layer, recompute: str) -> float:
        tp = strategy.tp if layer.tp_splittable else 1
        sp = strategy.sequence_parallel and layer.tp_splittable
        return layer.saved_activation_bytes(
            strategy.mbs, job.seq_len, tp=tp, sequence_parallel=sp,
            recompute=recompute, flash_attention=job.flash_attention,
        ) / strategy.cp

    modes = [strategy.layer_recompute(layer.block, stage.blocks) for layer in stage.layers]
    kept = sum(saved(layer, mode) for layer, mode in zip(stage.layers, modes)) * in_flight
    if "full" in modes:
        # backward re-materialises one recomputed layer at a time
        kept += max(saved(layer, "none") for layer, mode in zip(stage.layers, modes) if mode == "full")
    return kept


def stage_memory(
    job: Job,
    strategy: Strategy,
    stage: StagePlacement,
    micro_batches: int,
    catalog: Catalog,
) -> StageMemory:
    """Peak HBM and offloaded bytes of one rank of `stage`."""
    s = strategy
    tied_elsewhere = s.pp > 1
    params = stage_params_per_rank(stage.layers, s, with_tied=tied_elsewhere)
    shard = shard_degree(s, min(p.node.gpus_per_node for p in stage.pools))

    weights = params * WEIGHT_BYTES / (shard if s.zero >= 3 else 1)
    grads = params * GRAD_BYTES / (shard if s.zero >= 2 else 1)
    optimizer = params * catalog.constant("optimizer_bytes_per_param") / (shard if s.zero >= 1 else 1)

    host = nvme = 0.0
    if s.offloads_optimizer:
        # the fp32 master, moments and the fp32 gradient copy the CPU optimizer reads
        moved = optimizer + params * 4.0 / (shard if s.zero >= 1 else 1)
        host, nvme = (moved, 0.0) if s.offload_device == "cpu" else (params * 4.0 / shard, optimizer)
        optimizer = 0.0
    if s.offloads_params:
        if s.offload_device == "cpu":
            host += weights
        else:
            nvme += weights
        weights = 0.0

    in_flight = in_flight_microbatches(s, stage.index, micro_batches)
    activations = stage_activation_bytes(stage, job, s, in_flight)

    buffers = 0.0
    if s.zero >= 3:
        # the running and the prefetched layer's gathered weights (and their gradients)
        largest = max((layer_params_per_rank(layer, s) for layer in stage.layers), default=0.0)
        buffers += 2.0 * largest * (WEIGHT_BYTES + GRAD_BYTES)
    allocated = weights + grads + optimizer + activations + buffers
    reserve = catalog.constant("memory_reserve_bytes") + catalog.constant("memory_fragmentation") * allocated
    return StageMemory(
        stage=stage.index, params=params, weights=weights, grads=grads, optimizer=optimizer,
        activations=activations, buffers=buffers, reserve=reserve, capacity=stage.hbm_bytes,
        host_offload=host, nvme_offload=nvme,
    )
