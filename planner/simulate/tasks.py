"""Work items of the simulation, priced by the analytic model's own functions.

Every second and byte here comes from `planner.cost` (docs/design.md principle 1):
`layer_time` and `layer_comm` per layer, `stage_cost` per stage (p2p,
data-parallel totals, optimizer, offload, memory).  The simulator only
changes *when* work happens, never how long it takes, so any difference from
`evaluate` is a difference of schedule and overlap, not of prices.

A stage's layers are split into `vpp` chunks as Megatron-LM interleaves them
(Narayanan et al. 2021, arXiv 2104.04473 Sec. 2.2): blocks evenly per chunk,
pre-block layers (embedding) in chunk 0, post-block layers (norm, head) in
the last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog
from hardware import collectives as coll
from models.graph import Layer, RecomputeMode
from planner.cost.comm import data_parallel_comm, grad_reduce_bytes, layer_comm
from planner.cost.compute import layer_time
from planner.cost.evaluate import micro_batches, stage_cost
from planner.cost.layout import StageGroups, StagePlacement, is_block_layer, place_stages, stage_groups
from planner.cost.memory import layer_params_per_rank, saved_bytes
# the stage's pricing helpers: reused, not re-derived, so the prices stay identical
from planner.cost.stage import StageCost, host_rate, param_fetch_seconds
from planner.job import Job
from planner.strategy import Strategy


@dataclass(frozen=True)
class LayerWork:
    """One layer's seconds and bytes per micro-batch on one rank of its stage."""

    name: str
    forward: float  # forward compute + forward share of exposed TP/CP/EP collectives
    backward: float  # recompute + backward compute + the rest of the exposed collectives
    recompute: float  # the recompute part of `backward`
    params: float  # parameters per rank before ZeRO sharding (share of the data-parallel traffic)
    kept_bytes: float  # activations saved per micro-batch in flight
    working_bytes: float  # un-recomputed bytes re-materialised during its backward (full recompute)


@dataclass(frozen=True)
class StageWork:
    """Everything the simulator schedules on one pipeline stage."""

    index: int
    device: str
    chunks: tuple[tuple[LayerWork, ...], ...]  # vpp chunks, layers in forward order
    transfer: float  # seconds of one boundary activation (or gradient) transfer
    send_block: float  # seconds a send keeps the sender's compute stream (pp_p2p_exposed_fraction)
    dp_gather: float  # ZeRO-3 gathers (+ half the offloaded-weight fetch) of one micro-batch's forward
    dp_regather: float  # ZeRO-3 re-gathers (+ the other half of the fetch) of one backward
    dp_reduce: float  # ZeRO-2/3 gradient reduce-scatter of one backward
    step_end: float  # step-end gradient sync / parameter gather, raw seconds
    optimizer: float
    offload: float
    static_bytes: float  # weights + grads + optimizer + buffers in HBM
    capacity: float  # HBM bytes of the device
    cost: StageCost  # the analytic stage cost (for the comparison)

    @property
    def params(self) -> float:
        """Parameters per rank of the stage (the denominator of each unit's share of a collective)."""
        return sum(layer.params for chunk in self.chunks for layer in chunk)


# Collectives per direction, as planner.cost.comm issues them: TP one all-reduce forward and one backward
# (+1 with full recompute, in backward); CP one KV all-gather forward, gather + reduce-scatter backward;
# EP dispatch + combine each way (+2 recomputed).  The exposed total is split in that ratio.
def _forward_share(collectives_forward: int, collectives_backward: int, recomputed: int) -> float:
    return collectives_forward / (collectives_forward + collectives_backward + recomputed)


def layer_work(layer: Layer, mode: RecomputeMode, job: Job, strategy: Strategy, stage: StagePlacement,
               groups: StageGroups, catalog: Catalog) -> LayerWork:
    """A layer's work from `layer_time`, `layer_comm`, `saved_bytes` (the functions `stage_cost` sums)."""
    time = layer_time(layer, job, strategy, stage.device, catalog, mode)
    comm = layer_comm(layer, job, strategy, groups, time, catalog, mode)
    full = 1 if mode == "full" else 0
    tp_fwd = comm.tp * (_forward_share(1, 1, full) if is_block_layer(layer) else 0.5)
    cp_fwd = comm.cp * _forward_share(1, 2, full)
    ep_fwd = comm.ep * _forward_share(2, 2, 2 * full)
    forward = time.forward + tp_fwd + cp_fwd + ep_fwd
    backward = time.recompute + time.backward + (comm.tp - tp_fwd) + (comm.cp - cp_fwd) + (comm.ep - ep_fwd)
    params = layer_params_per_rank(layer, strategy)
    if strategy.pp > 1:  # as layer_sums: tied embeddings are held (and reduced) on both ends
        params += layer.tied_params / (strategy.tp if layer.tp_splittable else 1)
    return LayerWork(
        name=layer.name, forward=forward, backward=backward, recompute=time.recompute, params=params,
        kept_bytes=saved_bytes(layer, job, strategy, mode),
        working_bytes=saved_bytes(layer, job, strategy, "none") if mode == "full" else 0.0,
    )


def merge_units(layers: list[LayerWork], blocks_of: list[int | None]) -> tuple[list[LayerWork], list[int | None]]:
    """Consecutive layers of one transformer block (or a run of non-block layers) as one unit: the granularity
    at which FSDP2 / torchtitan wrap and gather parameters (one FSDP module per TransformerBlock)."""
    units: list[list[LayerWork]] = []
    keys: list[int | None] = []
    for layer, block in zip(layers, blocks_of):
        if units and keys[-1] == block:
            units[-1].append(layer)
        else:
            units.append([layer])
            keys.append(block)
    merged = [
        LayerWork(
            name=f"block.{key}" if key is not None else "+".join(u.name for u in unit),
            forward=sum(u.forward for u in unit), backward=sum(u.backward for u in unit),
            recompute=sum(u.recompute for u in unit), params=sum(u.params for u in unit),
            kept_bytes=sum(u.kept_bytes for u in unit), working_bytes=max(u.working_bytes for u in unit),
        )
        for unit, key in zip(units, keys)
    ]
    return merged, keys


def split_chunks(units: list[LayerWork], blocks_of: list[int | None], vpp: int) -> tuple[tuple[LayerWork, ...], ...]:
    """Units into `vpp` chunks: blocks evenly, leading non-block units to the first chunk, trailing to the last."""
    if vpp == 1:
        return (tuple(units),)
    blocks = sorted({b for b in blocks_of if b is not None})
    size = max(1, len(blocks) // vpp)
    chunk_of_block = {b: min(i // size, vpp - 1) for i, b in enumerate(blocks)}
    chunks: list[list[LayerWork]] = [[] for _ in range(vpp)]
    seen_block = False
    for unit, block in zip(units, blocks_of):
        if block is not None:
            seen_block = True
            chunks[chunk_of_block[block]].append(unit)
        else:
            chunks[-1 if seen_block else 0].append(unit)
    return tuple(tuple(c) for c in chunks)


def stage_work(job: Job, strategy: Strategy, stage: StagePlacement, catalog: Catalog) -> StageWork:
    """The simulator's view of one stage, priced by `stage_cost` and its per-layer parts."""
    cost = stage_cost(job, strategy, stage, catalog)
    strategy = strategy.for_stage(stage.index)  # the stage's own offload / regather, as stage_cost prices it
    modes = [strategy.layer_recompute(layer.block, stage.index, stage.blocks) for layer in stage.layers]
    groups = stage_groups(job, strategy, stage.site)
    layers = [layer_work(layer, mode, job, strategy, stage, groups, catalog) for layer, mode in zip(stage.layers, modes)]
    m = micro_batches(job, strategy)
    cache_rate = host_rate(stage.site, catalog) if strategy.regather == "host" else 0.0
    dp = data_parallel_comm(cost.sums.params, cost.sums.largest_layer_params, job, strategy, groups, m, catalog,
                            cache_rate)
    # offloaded weights are fetched half before the forward, half before the backward, as compose_stage charges
    fetch = param_fetch_seconds(job, cost.memory, stage.site, strategy, catalog)
    # data_parallel_comm's backward term is re-gather + reduce-scatter (ZeRO-3) or reduce-scatter (ZeRO-2)
    reduce = 0.0
    if dp.per_microbatch_backward and strategy.zero >= 2:
        reduce = coll.reduce_scatter(cost.sums.params * grad_reduce_bytes(job), groups.dp_shard, catalog)
    fraction = catalog.constant("pp_p2p_exposed_fraction")
    transfer = cost.pp / (2 * strategy.vpp * fraction) if cost.pp and fraction > 0 else 0.0
    mem = cost.memory
    return StageWork(
        index=stage.index, device=stage.device.name,
        chunks=split_chunks(*merge_units(layers, [layer.block for layer in stage.layers]), strategy.vpp),
        transfer=transfer, send_block=fraction * transfer,
        dp_gather=dp.per_microbatch_forward + fetch / 2, dp_regather=dp.per_microbatch_backward - reduce + fetch / 2,
        dp_reduce=reduce,
        step_end=dp.step_end + dp.step_start, optimizer=cost.optimizer, offload=cost.offload,
        static_bytes=mem.weights + mem.grads + mem.optimizer + mem.buffers, capacity=mem.capacity, cost=cost,
    )


def build_work(job: Job, strategy: Strategy, catalog: Catalog) -> list[StageWork]:
    """Every stage's work under a resolved strategy."""
    return [stage_work(job, strategy, stage, catalog) for stage in place_stages(job, strategy, catalog)]
