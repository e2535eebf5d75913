"""One pipeline stage's cost, built from per-layer sums.

A stage's cost is additive over its layers (`StageSums`: seconds per
micro-batch, parameters, saved bytes) plus a few stage-level terms that are
not (`compose_stage`: data-parallel exposure, optimizer, offload, memory
reserve).  The integer program builds its tables by composing the same sums
for candidate layer counts, so the solver and `evaluate` share every formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hardware import Catalog
from models.graph import Layer, LayerKind, RecomputeMode
from planner.cost.comm import (boundary_crossings, data_parallel_comm, grad_reduce_bytes, layer_comm, p2p_seconds,
                               replica_sync_seconds)
from planner.cost.compute import layer_time
from planner.cost.layout import StageComms, StageSite, nvlink_domain_gpus
from planner.cost.memory import (WEIGHT_BYTES, RankMemory, expert_params_per_rank, layer_params_per_rank,
                                 replica_params_per_rank,
                                 backward_transient_bytes, pipeline_output_bytes, resaved_checkpoint_bytes,
                                 saved_bytes, selective_rematerialised_bytes, stage_memory, transient_bytes)
from planner.cost.sums import StageSums
from planner.fields import Reader, reads
from planner.job import Job
from planner.strategy import Strategy


def layer_sums(layer: Layer, job: Job, strategy: Strategy, site: StageSite, groups: StageComms,
               catalog: Catalog, mode: RecomputeMode) -> StageSums:
    """The sums of a single layer under recompute `mode`."""
    time = layer_time(layer, job, strategy, site.device, catalog, mode)
    comm = layer_comm(layer, job, strategy, groups, time, catalog, mode)
    params = layer_params_per_rank(layer, strategy, job)
    if strategy.pipelined:
        params += layer.tied_params / (strategy.tp if layer.tp_splittable else 1)
    calls = job.runtime.gathering.calls
    gathers = calls.per_layer(layer.kind)
    regather = calls.regather_for_recompute and mode == "full"
    kept = saved_bytes(layer, job, strategy, mode)
    head = layer.kind == LayerKind.HEAD
    recomputed = mode == "full"
    # the layer that holds its block's checkpoint comes first in the block (models/graph.py saved_activation_bytes)
    opens_block = layer.kind in (LayerKind.ATTENTION, LayerKind.EMBEDDING_BAG, LayerKind.DENSE)
    whole = saved_bytes(layer, job, strategy, "none") if recomputed else 0.0
    # a per-op policy keeps part of each block and re-materialises the rest in its backward, like a recomputed
    # block whose checkpoint is what the policy kept
    rematerialised = selective_rematerialised_bytes(layer, job, strategy) if mode == "selective" else 0.0
    if rematerialised:
        recomputed, whole = True, rematerialised
    return StageSums(
        forward=time.forward, compute=time.forward + time.backward, recompute=time.recompute,
        weight_grad=time.weight_grad,
        tp=comm.tp, cp=comm.cp, ep=comm.ep, params=params, expert_params=expert_params_per_rank(layer, strategy, job),
        replica_params=replica_params_per_rank(layer, strategy, job),
        kept_activations=0.0 if head else kept, head_activations=kept if head else 0.0,
        pipeline_outputs=pipeline_output_bytes(layer, job, strategy),
        working_set=transient_bytes(layer, job, strategy),
        recomputed_kept=kept if recomputed else 0.0,
        recompute_resaved=resaved_checkpoint_bytes(layer, job, strategy) if mode == "full" and opens_block else 0.0,
        recompute_attention=whole if opens_block else 0.0, recompute_ffn=0.0 if opens_block else whole,
        block_transient=backward_transient_bytes(layer, job, strategy) if layer.block is not None else 0.0,
        root_kept=kept if layer.block is None and not head else 0.0,
        largest_layer_params=layer_params_per_rank(layer, strategy, job), max_hidden=float(layer.hidden), layers=1,
        root_params=params if layer.block is None else 0.0,
        embedding_params=params if layer.kind == LayerKind.EMBEDDING else 0.0,
        largest_attention_params=params if layer.block is not None and layer.kind == LayerKind.ATTENTION else 0.0,
        largest_ffn_params=params if layer.block is not None and layer.kind in (LayerKind.MLP, LayerKind.MOE) else 0.0,
        gather_calls=gathers, reduce_calls=calls.per_layer(layer.kind, reduce=True),
        regather_params=params if regather and gathers else 0.0, regather_calls=gathers if regather else 0.0,
    )


def layer_busy(layer: Layer, job: Job, strategy: Strategy, site: StageSite, groups: StageComms, catalog: Catalog,
               mode: RecomputeMode) -> float:
    """Seconds a layer keeps its stage busy per micro-batch: compute, recomputation and the TP, CP and EP
    collectives on the critical path (the additive time of `layer_sums`, without its bytes, which read more of
    the strategy)."""
    time = layer_time(layer, job, strategy, site.device, catalog, mode)
    comm = layer_comm(layer, job, strategy, groups, time, catalog, mode)
    return time.forward + time.backward + time.recompute + comm.tp + comm.cp + comm.ep


def layer_key(layer: Layer, mode: str) -> tuple:
    """Layers equal but for name and block cost the same."""
    return (mode, _layer_json(layer))


@lru_cache(maxsize=4096)
def _layer_json(layer: Layer) -> str:
    # cached: a stage's sums key every layer on every call (2.5 million JSON dumps in a test run); Layer is
    # frozen, so hashing it is a quarter of dumping it and an entry cannot go stale
    return layer.model_dump_json(exclude={"name", "block"})


# what `sum_layers` reads of the strategy (with the layers, their modes and the site's pools): its cache key
LAYER_SUMS_READS = reads(Reader.LAYER_SUMS)
# what `layer_busy` reads (the layer sums' time terms alone) of a layer without experts, and of an MoE layer
LAYER_TIMES_READS = reads(Reader.LAYER_TIMES)
EXPERT_TIMES_READS = reads(Reader.EXPERT_TIMES)
# what `compose_stage` adds to the sums' reads (through memory, data-parallel sync, optimizer and offload)
COMPOSE_READS = reads(Reader.COMPOSE)


def sum_layers(layers_modes: list[tuple[Layer, RecomputeMode]], job: Job, strategy: Strategy, site: StageSite,
               groups: StageComms, catalog: Catalog) -> StageSums:
    """Sums over layers, each distinct (layer, mode) evaluated once."""
    counts: dict[tuple, int] = {}
    sample: dict[tuple, tuple[Layer, RecomputeMode]] = {}
    for layer, mode in layers_modes:
        key = layer_key(layer, mode)
        counts[key] = counts.get(key, 0) + 1
        sample.setdefault(key, (layer, mode))
    total = StageSums()
    for key, count in counts.items():
        layer, mode = sample[key]
        total = total + layer_sums(layer, job, strategy, site, groups, catalog, mode).times(count)
    return total


def kept_before_last_recompute(layers_modes: list[tuple[Layer, RecomputeMode]], job: Job,
                               strategy: Strategy) -> float:
    """Saved bytes of the block layers that keep their activations yet run before the stage's last fully
    recomputed block (every k-th block recomputed, `Strategy.recompute_every`): when the backward recomputes
    that block they are still held, which `StageSums.recompute_peak` otherwise takes to be none (recomputed
    blocks first)."""
    last = max((i for i, (_, mode) in enumerate(layers_modes) if mode == "full"), default=-1)
    return sum(saved_bytes(layer, job, strategy, mode) for layer, mode in layers_modes[:last]
               if mode != "full" and layer.block is not None)


@dataclass(frozen=True)
class StageCost:
    """Seconds and bytes of one stage."""

    sums: StageSums
    pp: float  # pipeline transfers per micro-batch
    dp_exposed_microbatch: float  # ZeRO-2/3 traffic not hidden, per micro-batch
    dp_exposed_end: float  # step-end sync not hidden behind the last micro-batch
    dp_total: float
    optimizer: float
    offload: float
    memory: RankMemory

    @property
    def update(self) -> float:
        """Seconds of the stage's parameter update after the step's barrier: optimizer step and offload."""
        return self.optimizer + self.offload

    @property
    def microbatch(self) -> float:
        """Critical-path seconds of one micro-batch on this stage."""
        s = self.sums
        return s.compute + s.recompute + s.tp + s.cp + s.ep + self.pp + self.dp_exposed_microbatch


def host_rate(site: StageSite, catalog: Catalog) -> float:
    """Achieved host-to-GPU bytes/s of one GPU while every GPU of its node streams (they share the host links)."""
    node = site.node
    return node.host_bandwidth_per_gpu(node.gpus_per_node) * catalog.constant("pcie_efficiency")


def _offload_seconds(memory: RankMemory, job: Job, strategy: Strategy, site: StageSite, catalog: Catalog,
                     shard: int) -> float:
    """Per-step seconds of optimizer offload (PCIe transfers, CPU Adam, NVMe swap)."""
    if not strategy.offloads_optimizer:
        return 0.0
    node = site.node
    pcie = host_rate(site, catalog)
    owned = strategy.offload_ratio * memory.params / (shard if strategy.zero >= 1 else 1)
    transfer = owned * (grad_reduce_bytes(job) + WEIGHT_BYTES) / pcie
    cpu_adam = owned * node.gpus_per_node / catalog.constant("cpu_adam_params_per_second")
    swap = 0.0
    if strategy.offload_device == "nvme":
        nvme_rate = node.nvme_bandwidth * catalog.constant("nvme_efficiency")
        swap = 2.0 * memory.nvme_offload * node.gpus_per_node / nvme_rate  # read and write back
    return transfer + cpu_adam + swap


def param_fetch_seconds(job: Job, memory: RankMemory, site: StageSite, strategy: Strategy, catalog: Catalog) -> float:
    """Seconds per micro-batch to bring offloaded weight shards to the GPU (forward and backward)."""
    if not strategy.offloads_params:
        return 0.0
    shard_bytes = job.runtime.state_bytes("weights", memory.params, 3, strategy.data_parallel)
    node = site.node
    if strategy.offload_device == "cpu":
        rate = host_rate(site, catalog)
    else:
        rate = node.nvme_bandwidth * catalog.constant("nvme_efficiency") / node.gpus_per_node
    return 2.0 * shard_bytes / rate


def compose_stage(job: Job, strategy: Strategy, site: StageSite, groups: StageComms, sums: StageSums,
                  micro_batches: int, catalog: Catalog, cheapest_transfers: bool = False) -> StageCost:
    """Stage cost from its layer sums: the only non-additive part of the cost model.

    Communication hides behind compute as far as `comm_overlap_efficiency`
    allows; the windows are forward and backward compute without
    recomputation, so a stage's time is linear in its recomputed blocks.  `cheapest_transfers`: pipeline
    sends at the cheapest link any stage of this layout has (the search's lower bounds), not this stage's.
    """
    overlap = catalog.constant("comm_overlap_efficiency")
    forward = sums.forward
    backward = sums.compute - sums.forward
    memory = stage_memory(job, strategy, site, sums, micro_batches, catalog)
    dp = data_parallel_comm(sums.params, sums.largest_layer_params, job, strategy, groups, micro_batches, catalog,
                            host_rate(site, catalog) if strategy.regather == "host" else 0.0, sums)
    fetch = param_fetch_seconds(job, memory, site, strategy, catalog)
    dp_micro = 0.0
    if dp.per_microbatch_forward or dp.per_microbatch_backward or fetch:
        if job.runtime.gathering.calls.prefetch == 0:
            # every gather waits on the critical path; the reduce-scatters still run beside the backward
            dp_micro = (dp.per_microbatch_forward + dp.per_microbatch_backward - dp.reduce + fetch
                        + max(0.0, dp.reduce - overlap * backward))
        else:
            dp_micro = (
                max(0.0, dp.per_microbatch_forward + fetch / 2 - overlap * forward)
                + max(0.0, dp.per_microbatch_backward + fetch / 2 - overlap * backward)
                + dp.first_gather  # the first layer's gather has nothing to hide behind
            )
    # the recomputed forward's own gathers and the host's per-rank copies hide behind nothing
    dp_micro += dp.regather + dp.host
    # the step-end sync hides behind the last micro-batch's backward where the runtime overlaps it (gradients
    # exist only from the backward on: the buckets reduce from its hooks); a once-per-step gather hides behind the
    # first forward
    hidden = overlap * backward if job.runtime.overlap.grad_reduce and strategy.dp_overlap != "off" else 0.0
    # replicated experts' gradients are summed among their replicas at the step's end, beside the dp sync
    replicas = replica_sync_seconds(sums.replica_params, job, groups, catalog)
    step_end = dp.step_end + replicas
    dp_end = max(0.0, step_end - hidden) if step_end else 0.0
    if dp.step_start:
        dp_end += max(0.0, dp.step_start - overlap * forward)
    dp_end += dp.after_step

    optimizer = 0.0
    on_gpu = 1.0 - strategy.offload_ratio if strategy.offloads_optimizer else 1.0
    if on_gpu > 0.0:
        # the share of the optimizer states that stays in HBM is updated there
        owned = on_gpu * sums.params / (groups.dp_shard.size if strategy.zero >= 1 else 1)
        hbm = site.device.hbm_bandwidth * catalog.constant("hbm_efficiency")
        optimizer = owned * catalog.constant("optimizer_traffic_per_param") / hbm
    return StageCost(
        sums=sums, pp=p2p_seconds(sums.max_hidden, job, strategy, groups, catalog, None if cheapest_transfers else
                                  boundary_crossings(strategy, site.index, nvlink_domain_gpus(site.pools),
                                                     len(job.cluster.pools) > 1)),
        dp_exposed_microbatch=dp_micro, dp_exposed_end=dp_end, dp_total=dp.total + replicas,
        optimizer=optimizer, offload=_offload_seconds(memory, job, strategy, site, catalog, groups.dp_shard.size),
        memory=memory,
    )
