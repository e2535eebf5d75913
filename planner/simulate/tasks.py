"""Work items of the simulation, priced by the analytic model's own functions.

Every second and byte here comes from `planner.cost` (docs/design.md principle 1):
`layer_sums` per layer (compute, exposed TP/CP/EP collectives, parameters, saved
bytes and the runtime's collective counts), `data_parallel_comm` per gather unit,
`stage_cost` per stage (p2p, step-end sync, optimizer, offload, memory).  The
simulator only changes *when* work happens, never how long it takes, so any
difference from `evaluate` is a difference of schedule and overlap, not of prices.

Sharded weights (ZeRO-3 / FSDP) are priced per gather unit (one transformer
block, or a run of non-block layers) as the runtime issues them
(`GatherCalls`): the unit's own all-gathers and reduce-scatters, each paying
its ring latency steps, and the host copies of list-based collectives.  The
collectives are affine in their bytes, so the units' prices add up to the
stage's.

A stage's layers are split into `vpp` chunks as Megatron-LM interleaves them
(Narayanan et al. 2021, arXiv 2104.04473 Sec. 2.2): blocks evenly per chunk,
pre-block layers (embedding) in chunk 0, post-block layers (norm, head) in
the last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hardware import Catalog
from models.graph import Layer, RecomputeMode
from planner.cost.comm import DataParallelComm, data_parallel_comm, gathered_policy
from planner.cost.evaluate import micro_batches, stage_cost
from planner.cost.layout import StageComms, StagePlacement, is_block_layer, place_stages, stage_comms
from planner.cost.sums import StageSums
# the stage's pricing helpers: reused, not re-derived, so the prices stay identical
from planner.cost.stage import StageCost, host_rate, layer_sums, param_fetch_seconds
from planner.job import Job
from planner.strategy import Strategy


@dataclass(frozen=True)
class UnitComm:
    """The data-parallel work of one gather unit per micro-batch, seconds."""

    gather: float = 0.0  # the forward's gather of its sharded weights (+ its share of the offloaded-weight fetch)
    regather: float = 0.0  # the backward's gather (+ the other half of the fetch)
    recompute_gather: float = 0.0  # a fully recomputed forward's own gather (GatherCalls.regather_for_recompute)
    reduce: float = 0.0  # its gradients' reduce-scatter (ZeRO-2/3)
    sync: float = 0.0  # its share of the step-end gradient sync / once-per-step gather
    gather_copies: float = 0.0  # host copies of the forward gather's list-based collectives (per_rank_copies)
    regather_copies: float = 0.0  # host copies of the backward's gathers (re-gather and recompute gather)
    reduce_copies: float = 0.0  # host copies of the reduce-scatters

    @property
    def backward_work(self) -> bool:
        """Whether a backward of this unit issues any data-parallel work besides the step-end sync."""
        return self.regather + self.recompute_gather + self.reduce + self.regather_copies + self.reduce_copies > 0.0


@dataclass(frozen=True)
class LayerWork:
    """One layer's (or gather unit's) seconds and bytes per micro-batch on one rank of its stage."""

    name: str
    forward: float  # forward compute + forward share of exposed TP/CP/EP collectives
    backward: float  # recompute + backward compute + the rest of the exposed collectives
    recompute: float  # the recompute part of `backward`
    sums: StageSums  # the cost model's sums of these layers (parameters, collective counts)
    kept_bytes: float  # activations saved per micro-batch in flight (the loss head's too: its backward frees them)
    output_bytes: float = 0.0  # logits a pipeline schedule keeps from its forward to the step's end
    dp: UnitComm = field(default_factory=UnitComm)  # its data-parallel collectives (set per gather unit)

    @property
    def params(self) -> float:
        """Parameters per rank before ZeRO sharding."""
        return self.sums.params


@dataclass(frozen=True)
class StageWork:
    """Everything the simulator schedules on one pipeline stage."""

    index: int
    device: str
    chunks: tuple[tuple[LayerWork, ...], ...]  # vpp chunks of gather units, in forward order
    prefetch: int  # gather units the runtime issues ahead of the compute (GatherCalls.prefetch; 0: none)
    transfer: float  # seconds of one boundary activation (or gradient) transfer
    send_block: float  # seconds a send keeps the sender's compute stream (pp_p2p_exposed_fraction)
    optimizer: float
    offload: float
    static_bytes: float  # weights + grads + optimizer + buffers in HBM
    capacity: float  # HBM bytes of the device
    cost: StageCost  # the analytic stage cost (for the comparison)
    exposed_sync: float = 0.0  # the step-end sync with nothing to hide behind (dp_overlap=off): after the barrier
    after_step: float = 0.0  # after the optimizer step (dp_overlap grad/off: the distributed optimizer's gather)

    def _total(self, part: str) -> float:
        return sum(getattr(unit.dp, part) for chunk in self.chunks for unit in chunk)

    @property
    def dp_gather(self) -> float:
        """Seconds of one micro-batch's forward gathers (with their host copies)."""
        return self._total("gather") + self._total("gather_copies")

    @property
    def dp_regather(self) -> float:
        """Seconds of one micro-batch's backward gathers (with their host copies)."""
        return self._total("regather") + self._total("recompute_gather") + self._total("regather_copies")

    @property
    def dp_reduce(self) -> float:
        """Seconds of one micro-batch's gradient reduce-scatters (with their host copies)."""
        return self._total("reduce") + self._total("reduce_copies")

    @property
    def step_end(self) -> float:
        """Seconds of the step-end sync (raw)."""
        return self._total("sync")


# Collectives per direction, as planner.cost.comm issues them: TP one all-reduce forward and one backward
# (+1 with full recompute, in backward); CP one KV all-gather forward, gather + reduce-scatter backward;
# EP dispatch + combine each way (+2 recomputed).  The exposed total is split in that ratio.
def _forward_share(collectives_forward: int, collectives_backward: int, recomputed: int) -> float:
    return collectives_forward / (collectives_forward + collectives_backward + recomputed)


def layer_work(layer: Layer, mode: RecomputeMode, job: Job, strategy: Strategy, stage: StagePlacement,
               groups: StageComms, catalog: Catalog) -> LayerWork:
    """A layer's work from `layer_sums` (what `stage_cost` adds up), its exposed collectives split by direction."""
    sums = layer_sums(layer, job, strategy, stage.site, groups, catalog, mode)
    full = 1 if mode == "full" else 0
    tp_fwd = sums.tp * (_forward_share(1, 1, full) if is_block_layer(layer) else 0.5)
    cp_fwd = sums.cp * _forward_share(1, 2, full)
    ep_fwd = sums.ep * _forward_share(2, 2, 2 * full)
    forward = sums.forward + tp_fwd + cp_fwd + ep_fwd
    backward = (sums.recompute + (sums.compute - sums.forward) + (sums.tp - tp_fwd) + (sums.cp - cp_fwd)
                + (sums.ep - ep_fwd))
    return LayerWork(name=layer.name, forward=forward, backward=backward, recompute=sums.recompute, sums=sums,
                     kept_bytes=sums.kept_activations + sums.head_activations,
                     output_bytes=sums.pipeline_outputs)


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
            recompute=sum(u.recompute for u in unit), sums=sum((u.sums for u in unit), StageSums()),
            kept_bytes=sum(u.kept_bytes for u in unit),
            output_bytes=sum(u.output_bytes for u in unit),
        )
        for unit, key in zip(units, keys)
    ]
    return merged, keys


def pricing_sums(units: list[LayerWork]) -> list[StageSums | None]:
    """The sums each unit's own collectives are priced on (None: it issues none of its own).

    A unit that issues no all-gather or no reduce-scatter of its own travels in the stage's first unit that
    issues both: torchtitan's final norm and output are parameters of the root FSDP module, gathered and
    reduced with the token embeddings (torchtitan parallelize.py apply_fsdp)."""
    own = [u.sums.gather_calls > 0 and u.sums.reduce_calls > 0 for u in units]
    carrier = own.index(True) if any(own) else 0
    priced: list[StageSums | None] = [u.sums if own[i] else None for i, u in enumerate(units)]
    priced[carrier] = sum((u.sums for i, u in enumerate(units) if i == carrier or not own[i]), StageSums())
    return priced


def _own_comm(dp: DataParallelComm) -> UnitComm:
    """A unit's collectives from `data_parallel_comm` of its own layers."""
    return UnitComm(
        gather=dp.per_microbatch_forward, regather=dp.per_microbatch_backward - dp.reduce,
        recompute_gather=dp.regather - dp.regather_copies, reduce=dp.reduce,
        gather_copies=dp.host_gather, regather_copies=dp.host_regather + dp.regather_copies,
        reduce_copies=dp.host_reduce,
    )


def price_units(units: list[LayerWork], job: Job, strategy: Strategy, stage: StagePlacement, groups: StageComms,
                cost: StageCost, catalog: Catalog) -> tuple[list[LayerWork], DataParallelComm]:
    """Each unit with its data-parallel work: weights gathered per layer or per micro-batch are priced by
    `data_parallel_comm` on the unit's own layers (its collectives, with their latency steps and host copies);
    everything else of the stage (ZeRO-1/2 reduce-scatters, once-per-step gathers, the step-end sync, the
    offloaded-weight fetch) is shared among the units by parameters.  Also the stage's whole data-parallel
    traffic, which prices what no unit carries (the sync a strategy leaves exposed)."""
    m = micro_batches(job, strategy)
    cache_rate = host_rate(stage.site, catalog) if strategy.regather == "host" else 0.0
    sums = cost.sums
    whole = data_parallel_comm(sums.params, sums.largest_layer_params, job, strategy, groups, m, catalog,
                               cache_rate, sums)
    # offloaded weights are fetched half before the forward, half before the backward, as compose_stage charges
    fetch = param_fetch_seconds(job, cost.memory, stage.site, strategy, catalog)
    per_unit = gathered_policy(job, strategy, groups) in ("layers", "microbatch")
    priced = pricing_sums(units) if per_unit else [None] * len(units)
    out = []
    for unit, own in zip(units, priced):
        share = unit.params / sums.params if sums.params > 0 else 0.0
        if own is not None:
            base = _own_comm(data_parallel_comm(own.params, own.largest_layer_params, job, strategy, groups, m,
                                                catalog, cache_rate, own))
        elif per_unit:  # its collectives travel in another unit's
            base = UnitComm()
        else:
            base = UnitComm(gather=share * whole.per_microbatch_forward,
                            regather=share * (whole.per_microbatch_backward - whole.reduce),
                            reduce=share * whole.reduce)
        # without the overlap the step-end sync waits for the whole backward (StageWork.exposed_sync)
        sync = 0.0 if strategy.dp_overlap == "off" else share * (whole.step_end + whole.step_start)
        dp = replace(base, gather=base.gather + share * fetch / 2, regather=base.regather + share * fetch / 2,
                     sync=sync)
        out.append(replace(unit, dp=dp))
    return out, whole


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
    groups = stage_comms(job, strategy, stage.site)
    layers = [layer_work(layer, mode, job, strategy, stage, groups, catalog)
              for layer, mode in zip(stage.layers, modes)]
    units, blocks_of = merge_units(layers, [layer.block for layer in stage.layers])
    units, whole = price_units(units, job, strategy, stage, groups, cost, catalog)
    # the sync the strategy leaves behind nothing: the gradients' without any overlap, the gather's after the step
    exposed = whole.step_end + whole.step_start if strategy.dp_overlap == "off" else 0.0
    fraction = catalog.constant("pp_p2p_exposed_fraction")
    transfer = cost.pp / (2 * strategy.vpp * fraction) if cost.pp and fraction > 0 else 0.0
    mem = cost.memory
    return StageWork(
        index=stage.index, device=stage.device.name, chunks=split_chunks(units, blocks_of, strategy.vpp),
        prefetch=job.runtime.gathering.calls.prefetch, transfer=transfer, send_block=fraction * transfer,
        optimizer=cost.optimizer, offload=cost.offload,
        static_bytes=mem.weights + mem.grads + mem.optimizer + mem.buffers, capacity=mem.capacity, cost=cost,
        exposed_sync=exposed, after_step=whole.after_step,
    )


def build_work(job: Job, strategy: Strategy, catalog: Catalog) -> list[StageWork]:
    """Every stage's work under a resolved strategy."""
    return [stage_work(job, strategy, stage, catalog) for stage in place_stages(job, strategy, catalog)]
