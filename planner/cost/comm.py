"""Communication time of tensor, context, expert, pipeline and data parallelism.

* TP (Shoeybi et al. 2019; Korthikanti et al. 2022): each attention and MLP
  sub-block does one all-reduce of b*s*h forward and one backward (with
  sequence parallelism a reduce-scatter/all-gather pair of the same volume);
  full recompute repeats the forward one.  Vocab-parallel embedding and head
  add one each way.
* CP (ring attention / Megatron CP): each attention layer all-gathers K and V
  forward and reduce-scatters their gradients backward, hidden behind the
  attention core as far as it lasts.
* EP: two all-to-alls (dispatch, combine) of the routed tokens each way.
* PP: one boundary activation each way per micro-batch (v per micro-batch
  with interleaving).
* DP: DDP all-reduce; ZeRO-1/2 reduce-scatter + all-gather; sharded weights
  (ZeRO-3/FSDP) as the runtime gathers them (`RuntimeProfile.gathering`):
  per layer forward and backward plus a reduce-scatter every micro-batch,
  once per micro-batch, or once per step (FSDP without reshard under
  pipeline parallelism); HSDP shards inside the node and all-reduces across
  replicas.  Gradients travel in the runtime's reduce dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog
from hardware import collectives as coll
from models.graph import Layer, LayerKind, RecomputeMode
from planner.cost.compute import LayerTime
from planner.cost.layout import StageGroups, is_block_layer
from planner.cost.memory import WEIGHT_BYTES
from planner.job import Job
from planner.strategy import Strategy

ACT_BYTES = 2.0  # 16-bit activations on the wire


def grad_reduce_bytes(job: Job) -> float:
    """Bytes per gradient element on the wire, as the job's runtime reduces them (Megatron reduces bf16
    runs' gradients in fp32, DeepSpeed in the model's 16-bit type, FSDP2 in its reduce_dtype)."""
    return job.runtime.overlap.grad_reduce_bytes[job.precision]


@dataclass(frozen=True)
class LayerComm:
    """Exposed communication seconds of one layer for one micro-batch."""

    tp: float
    cp: float
    ep: float


def layer_comm(
    layer: Layer, job: Job, strategy: Strategy, groups: StageGroups, time: LayerTime, catalog: Catalog,
    recompute: RecomputeMode,
) -> LayerComm:
    """TP, CP and EP seconds of `layer` per micro-batch (forward + backward + recompute)."""
    s = strategy
    tokens = s.mbs * job.seq_len / s.cp
    tp_s = 0.0
    if s.tp > 1 and layer.tp_splittable:
        volume = tokens * layer.hidden * ACT_BYTES
        if is_block_layer(layer):
            count = 2 + (1 if recompute == "full" else 0)
        elif layer.kind in (LayerKind.EMBEDDING, LayerKind.HEAD):
            count = 2
        else:
            count = 0
        tp_s = count * coll.all_reduce(volume, groups.tp, catalog)
        if s.tp_overlap:
            tp_s *= 1.0 - catalog.constant("tp_overlap_hidden_fraction")

    cp_s = 0.0
    if s.cp > 1 and layer.attention is not None:
        att = layer.attention
        kv_width = 2 * att.kv_heads * att.head_dim / min(s.tp, att.kv_heads)
        kv_bytes = s.mbs * job.seq_len * kv_width * ACT_BYTES
        forward = coll.all_gather(kv_bytes, groups.cp, catalog)
        backward = forward + coll.reduce_scatter(kv_bytes, groups.cp, catalog)
        hide = catalog.constant("comm_overlap_efficiency") * time.attention_forward
        cp_s = max(0.0, forward - hide) + max(0.0, backward - 2.0 * hide)
        if recompute == "full":
            cp_s += max(0.0, forward - hide)

    ep_s = 0.0
    if s.ep > 1 and layer.moe is not None:
        routed = tokens * layer.moe.top_k * layer.hidden * ACT_BYTES
        if s.sequence_parallel:
            routed /= s.tp  # each TP rank dispatches its own sequence shard
        ep_s = 4 * coll.all_to_all(routed, groups.ep, catalog)
        if recompute == "full":
            ep_s += 2 * coll.all_to_all(routed, groups.ep, catalog)
    return LayerComm(tp=tp_s, cp=cp_s, ep=ep_s)


# what `p2p_seconds` reads of the strategy (with the hidden size and the site's pools): its cache key
P2P_READS = ("tp", "cp", "dp", "mbs", "sequence_parallel", "vpp", "pipelined")


def p2p_seconds(hidden: float, job: Job, strategy: Strategy, groups: StageGroups, catalog: Catalog,
                crossings: tuple[bool, bool] | None = None) -> float:
    """Exposed pipeline send/receive seconds per micro-batch of a stage whose boundary is `hidden` wide.

    `crossings`: whether the stage's forward send (to the next stage) and its backward send (to the
    previous one) leave the node (`boundary_crossings`); None: the cheapest the ranks' layout allows, a
    lower bound for any stage."""
    if strategy.pp == 1:
        return 0.0
    volume = strategy.mbs * job.seq_len / strategy.cp * hidden * ACT_BYTES
    if strategy.sequence_parallel:
        volume /= strategy.tp
    fraction = catalog.constant("pp_p2p_exposed_fraction")
    if crossings is None:
        sends = 2 * strategy.vpp  # forward activation and backward gradient, per chunk
        return sends * coll.point_to_point(volume, groups.pp, catalog) * fraction
    pair = groups.pp.model_copy(update={"size": 2})
    link = {False: pair.model_copy(update={"ranks_per_node": 2}), True: pair.model_copy(update={"ranks_per_node": 1})}
    per_chunk = sum(coll.point_to_point(volume, link[cross], catalog) for cross in crossings)
    return strategy.vpp * per_chunk * fraction


def boundary_crossings(strategy: Strategy, stage: int, gpus_per_node: int, mixed: bool) -> tuple[bool, bool]:
    """(forward, backward): whether stage `stage`'s send to the next stage and to the previous one (cyclically:
    interleaved chunks wrap from the last stage to the first) leave its node.  Ranks fill nodes in order,
    tp*cp*dp per stage, so with fewer ranks per stage than GPUs per node some boundaries stay inside a node
    and the others cross the fabric; on a mixed cluster no node holds two stages (planner.search.space)."""
    if strategy.pp == 1:
        return False, False
    if mixed:
        return True, True
    ranks, pp = strategy.tp * strategy.cp * strategy.dp, strategy.pp

    def crosses(boundary: int) -> bool:  # between stage `boundary` and the next one
        last = ((boundary % pp + 1) * ranks - 1) // gpus_per_node
        first = ((boundary + 1) % pp * ranks) // gpus_per_node
        return last != first

    return crosses(stage), crosses(stage - 1)


@dataclass(frozen=True)
class DataParallelComm:
    """Data-parallel traffic of one stage: raw seconds and where they can hide."""

    per_microbatch_forward: float  # sharded weights gathered before each forward
    per_microbatch_backward: float  # re-gather + reduce-scatter of sharded weights, ZeRO-2 reduce-scatter
    first_gather: float  # gather of the first layer, which nothing hides
    step_start: float  # once per step before the first forward (it hides behind that forward)
    step_end: float  # gradient sync / parameter gather once per step
    total: float  # everything, for the breakdown


def data_parallel_comm(params: float, largest_layer_params: float, job: Job, strategy: Strategy,
                       groups: StageGroups, micro_batches: int, catalog: Catalog,
                       host_rate: float = 0.0) -> DataParallelComm:
    """Seconds of data-parallel communication for a stage holding `params` per rank.

    Weights sharded at rest are gathered as the runtime's policy says
    (`Gathering.policy`): "layers" gathers each layer before its forward and
    again before its backward and reduce-scatters its gradients, every
    micro-batch; "microbatch" gathers once per micro-batch and keeps the
    weights through its backward; "step" gathers the stage once per step and
    reduce-scatters the accumulated gradients once.

    With regather=host (FCDP, arXiv 2602.06499) only the first forward of a
    step gathers ZeRO-3 weights over the sharding group; it leaves them in host
    DRAM, one copy per node split over the node's members of the group, and
    every later gather (the backward ones, and the forwards of later
    micro-batches) reads the rank's slice at `host_rate` and all-gathers inside
    the node.  Gradients are still reduce-scattered over the whole group.
    """
    s = strategy
    if groups.dp.size == 1:
        return DataParallelComm(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    runtime = job.runtime
    grad_bytes = params * grad_reduce_bytes(job)
    shard, replicate = groups.dp_shard, groups.dp_replicate
    policy = runtime.gathering.policy(s.zero, s.pipelined) if shard.size > 1 else None
    fwd = bwd = end = first = start = 0.0
    if s.zero == 0:
        end = coll.all_reduce(grad_bytes, groups.dp, catalog)
    elif policy is None:  # ZeRO-1/2: whole weights, sharded optimizer
        rs = coll.reduce_scatter(grad_bytes, shard, catalog)
        if s.zero == 2:
            bwd = rs  # partitioned gradients are reduced every micro-batch
        else:
            end += rs
        gather = coll.all_gather(params * WEIGHT_BYTES, shard, catalog)
        if runtime.overlap.param_gather:
            start = gather  # Megatron --overlap-param-gather: behind the next step's first forward
        else:
            end += gather
        end += coll.all_reduce(grad_bytes / shard.size, replicate, catalog)
    else:
        weight_bytes = params * runtime.gathering.bytes_per_param
        gather = coll.all_gather(weight_bytes, shard, catalog)
        rs = coll.reduce_scatter(grad_bytes, shard, catalog)
        first = coll.all_gather(largest_layer_params * runtime.gathering.bytes_per_param, shard, catalog)
        if policy == "step":
            start, end, first = gather, rs, 0.0
        elif policy == "microbatch":
            fwd, bwd = gather, rs
        else:
            fwd = again = gather
            if s.regather == "host" and shard.spans_nodes:
                local = shard.ranks_per_node
                in_node = shard.model_copy(update={"size": local, "ranks_per_node": local})
                again = weight_bytes / local / host_rate + coll.all_gather(weight_bytes, in_node, catalog)
                fwd = (gather + (micro_batches - 1) * again) / micro_batches  # the first forward fills the cache
            bwd = again + rs
        end += coll.all_reduce(grad_bytes / shard.size, replicate, catalog)
    total = micro_batches * (fwd + bwd) + start + end
    return DataParallelComm(fwd, bwd, first, start, end, total)
