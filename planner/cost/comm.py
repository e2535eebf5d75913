"""Communication time of tensor, context, expert, pipeline and data parallelism.

* TP (Shoeybi et al. 2019; Korthikanti et al. 2022): each attention and MLP
  sub-block does one all-reduce of b*s*h forward and one backward (with
  sequence parallelism a reduce-scatter/all-gather pair of the same volume);
  full recompute repeats the forward one.  Vocab-parallel embedding and head
  add one each way.
* CP (ring attention / Megatron CP): each attention layer all-gathers K and V
  forward and reduce-scatters their gradients backward, hidden behind the
  attention core as far as it lasts.
* EP: two all-to-alls (dispatch, combine) of the routed tokens each way, over
  the expert-parallel group (etp apart: Megatron folds expert groups over a
  stage's ranks); every rank waits for the busiest one (`Job.moe_imbalance`).
  The strategy's dispatcher (hardware/data/dispatchers.yaml) says what moves:
  NCCL's all-to-all sends every (token, expert) pair; DeepEP sends a token once
  per distinct destination node and fans it out over NVLink.
  With ep_overlap they hide behind another micro-batch's compute.  Experts
  split over etp > 1 ranks all-gather the routed tokens there and
  reduce-scatter the outputs; shared experts run tensor-parallel like an MLP.
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
from functools import lru_cache

from hardware import Catalog
from hardware import collectives as coll
from hardware.collectives import CommGroup
from models.graph import Layer, LayerKind, RecomputeMode
from planner.cost.compute import LayerTime, expert_load_ratio
from planner.cost.dispatch import expected_destinations
from planner.cost.layout import StageComms, is_block_layer, microbatch_tokens
from planner.cost.memory import WEIGHT_BYTES
from planner.cost.sums import StageSums
from planner.fields import Reader, reads
from planner.job import Job
from planner.profile import Gather
from planner.strategy import Strategy

ACT_BYTES = 2.0  # 16-bit activations on the wire


def grad_reduce_bytes(job: Job) -> float:
    """Bytes per gradient element on the wire, as the job's runtime reduces them (Megatron reduces bf16
    runs' gradients in fp32, DeepSpeed in the model's 16-bit type, FSDP2 in its reduce_dtype)."""
    # an MXFP8 run quantizes only GEMM inputs: its gradients travel as an FP8 run's do
    return job.runtime.overlap.grad_reduce_bytes["fp8" if job.precision == "mxfp8" else job.precision]


@dataclass(frozen=True)
class LayerComm:
    """Exposed communication seconds of one layer for one micro-batch."""

    tp: float
    cp: float
    ep: float


def tp_overlap_hidden(job: Job, catalog: Catalog) -> float:
    """Share of the tensor-parallel communication that tp_overlap hides: the runtime's measured value, else the
    constant."""
    hidden = job.runtime.overlap.tp_hidden
    return catalog.constant("tp_overlap_hidden_fraction") if hidden is None else hidden


def layer_comm(
    layer: Layer, job: Job, strategy: Strategy, groups: StageComms, time: LayerTime, catalog: Catalog,
    recompute: RecomputeMode,
) -> LayerComm:
    """TP, CP and EP seconds of `layer` per micro-batch (forward + backward + recompute)."""
    s = strategy
    tokens = s.mbs * job.seq_len / s.cp
    tp_s = 0.0
    if s.tp > 1 and layer.tp_splittable:
        volume = tokens * layer.hidden * ACT_BYTES
        if is_block_layer(layer):
            count: float = 2 + (1 if recompute == "full" else 0)
            if recompute == "selective" and job.runtime.selective is not None:
                # the policy's saved reduce-scatters are not redone; the all-gathers (or all-reduces) are
                count += job.runtime.selective.tp_collectives if s.sequence_parallel else 1.0
        elif layer.kind in (LayerKind.EMBEDDING, LayerKind.HEAD):
            count = 2
        else:
            count = 0
        if layer.moe is not None:
            tp_s = count * moe_tensor_parallel_seconds(layer, volume, groups, catalog)
        else:
            tp_s = count * coll.all_reduce(volume, groups.tp, catalog)
        if s.tp_overlap:
            tp_s *= 1.0 - tp_overlap_hidden(job, catalog)

    cp_s = 0.0
    if s.cp > 1 and layer.attention is not None:
        cp_s = ring_attention_seconds(layer, job, s, groups, time, catalog)
        if recompute == "full":
            cp_s += ring_attention_seconds(layer, job, s, groups, time, catalog, backward=False)

    ep_s = 0.0
    if layer.moe is not None and s.ep > 1:  # (a layer without experts reads nothing of the expert layout)
        ep_s = expert_all_to_all_seconds(layer, job, s, groups, time, catalog, recompute)
    return LayerComm(tp=tp_s, cp=cp_s, ep=ep_s)


def moe_tensor_parallel_seconds(layer: Layer, volume: float, groups: StageComms, catalog: Catalog) -> float:
    """One all-reduce-equivalent of a MoE layer's tensor-parallel traffic (`volume`: the layer's b*s*h bytes on
    a rank): shared experts are a tensor-parallel MLP; experts split over etp > 1 ranks all-gather the routed
    tokens (top_k per token) before their GEMMs and reduce-scatter the outputs (Megatron-Core's all-to-all
    dispatcher, gather_from_sequence_parallel_region over the expert tensor-parallel group)."""
    seconds = coll.all_reduce(volume, groups.tp, catalog) if layer.moe_shape.shared_experts else 0.0
    return seconds + coll.all_reduce(volume * layer.moe_shape.top_k, groups.etp, catalog)


def expert_all_to_all_seconds(layer: Layer, job: Job, strategy: Strategy, groups: StageComms, time: LayerTime,
                              catalog: Catalog, recompute: RecomputeMode) -> float:
    """Exposed expert-parallel seconds of one MoE layer per micro-batch: dispatch and combine forward, their
    gradients backward, the forward pair again under full recompute.  Each rank dispatches its tokens (its
    sequence shard under sequence parallelism) as the strategy's dispatcher moves them (`dispatch_seconds`);
    the busiest rank receives `moe_imbalance` times the mean and every rank waits for it (a capacity-padded
    runtime, DeepSpeed-MoE, sends its padded buffer instead: `expert_load_ratio`).  With ep_overlap
    (Megatron's 1F1B all-to-all overlap) they hide behind the layer's compute of the micro-batch scheduled
    beside it, as far as it lasts."""
    s = strategy
    tokens = s.mbs * job.seq_len / s.cp
    if s.sequence_parallel:
        tokens /= s.tp  # each TP rank dispatches its own sequence shard
    spec = catalog.dispatcher(s.dispatcher)
    full = recompute == "full"
    # forward dispatches (the recomputed one too) in the dispatcher's dispatch dtype; the combines and both
    # backward passes (the gradients) in its combine dtype
    dispatch = dispatch_seconds(layer, tokens, spec.dispatch_bytes_per_element, s, groups, catalog)
    combine = dispatch if spec.combine_bytes_per_element == spec.dispatch_bytes_per_element else \
        dispatch_seconds(layer, tokens, spec.combine_bytes_per_element, s, groups, catalog)
    seconds = ((1 + full) * dispatch + (3 + full) * combine) * expert_load_ratio(layer, job, s, catalog)
    if s.ep_overlap:
        window = time.forward + time.backward + time.recompute
        seconds = max(0.0, seconds - catalog.constant("comm_overlap_efficiency") * window)
    return seconds


def dispatch_seconds(layer: Layer, tokens: float, element_bytes: float, strategy: Strategy, groups: StageComms,
                     catalog: Catalog) -> float:
    """Seconds of one dispatch (or combine) of `tokens` per rank over the expert-parallel group: NCCL's
    all-to-all of top_k rows per token, or a node-deduplicated dispatch of one row per distinct destination
    node and rank (`planner.cost.dispatch.expected_destinations` under the model's group-limited routing)."""
    moe, ep, spec = layer.moe_shape, groups.ep, catalog.dispatcher(strategy.dispatcher)
    row = layer.hidden * element_bytes
    if spec.fabric_copies == "expert":
        return coll.all_to_all(tokens * moe.top_k * row, ep, catalog)
    nodes = max(1, ep.size // ep.ranks_per_node)
    return coll.node_dispatch(tokens, row, expected_destinations(nodes, moe), expected_destinations(ep.size, moe),
                              ep, catalog, spec.nvlink_rate_limit)


def ring_attention_seconds(layer: Layer, job: Job, strategy: Strategy, groups: StageComms, time: LayerTime,
                           catalog: Catalog, backward: bool = True) -> float:
    """Exposed context-parallel seconds of one attention layer per micro-batch (forward, and backward unless
    `backward` is False).

    Ring attention (Megatron-Core / Transformer Engine's p2p context parallelism, torch's templated ring
    attention) runs cp steps: each computes the local queries against one rank's keys and values while the
    next block travels one hop round the ring, cp - 1 sends in all.  A step's send (this rank's K and V chunk,
    one point-to-point message with its link latency) hides behind that step's attention block; the backward
    sends K, V and their gradients behind the backward block.  Short chunks leave little compute per step, so
    the per-step latency and bytes show (the block's own efficiency is priced in `layer_time`)."""
    att = layer.attention_shape
    steps = strategy.cp
    kv_width = 2 * att.kv_heads * att.head_dim / min(strategy.tp, att.kv_heads)
    chunk = microbatch_tokens(job, strategy) * kv_width * ACT_BYTES
    overlap = catalog.constant("comm_overlap_efficiency")
    send = coll.point_to_point(chunk, groups.cp, catalog)
    exposed = (steps - 1) * max(0.0, send - overlap * time.attention_forward / steps)
    if backward:
        send_back = coll.point_to_point(2.0 * chunk, groups.cp, catalog)
        exposed += (steps - 1) * max(0.0, send_back - overlap * time.attention_backward / steps)
    return exposed


# what `p2p_seconds` reads of the strategy (with the hidden size and the site's pools): its cache key
P2P_READS = reads(Reader.P2P)


def p2p_seconds(hidden: float, job: Job, strategy: Strategy, groups: StageComms, catalog: Catalog,
                crossings: tuple[bool, bool] | None = None) -> float:
    """Exposed pipeline send/receive seconds per micro-batch of a stage whose boundary is `hidden` wide.

    `crossings`: whether the stage's forward send (to the next stage) and its backward send (to the
    previous one) leave the NVLink domain (`boundary_crossings`); None: the cheapest the ranks' layout allows, a
    lower bound for any stage."""
    if not strategy.pipelined:
        return 0.0
    volume = microbatch_tokens(job, strategy) * hidden * ACT_BYTES
    if strategy.sequence_parallel:
        volume /= strategy.tp
    fraction = catalog.constant("pp_p2p_exposed_fraction")
    if crossings is None:
        sends = 2 * strategy.vpp  # forward activation and backward gradient, per chunk
        return sends * coll.point_to_point(volume, groups.pp, catalog) * fraction
    link = _boundary_pairs(groups.pp)
    per_chunk = sum(coll.point_to_point(volume, link[cross], catalog) for cross in crossings)
    return strategy.vpp * per_chunk * fraction


@lru_cache(maxsize=64)
def _boundary_pairs(pp: CommGroup) -> tuple[CommGroup, CommGroup]:
    """The pair of ranks one pipeline send joins, indexed by whether it crosses the NVLink domain; cached, as
    every stage of every configuration the search prices asks for the same few."""
    pair = pp.model_copy(update={"size": 2})
    return pair.model_copy(update={"ranks_per_node": 2}), pair.model_copy(update={"ranks_per_node": 1})


def boundary_crossings(strategy: Strategy, stage: int, gpus_per_node: int, mixed: bool) -> tuple[bool, bool]:
    """(forward, backward): whether stage `stage`'s send to the next stage and to the previous one (cyclically:
    interleaved chunks wrap from the last stage to the first) leave its NVLink domain (`gpus_per_node`: the
    domain's GPUs, a node's or a GB200 NVL72 rack's).  Ranks fill domains in order, tp*cp*dp per stage, so
    with fewer ranks per stage than GPUs per domain some boundaries stay inside one and the others cross the
    fabric; on a mixed cluster no node holds two stages (planner.search.space)."""
    if strategy.pp == 1:
        return False, False
    if mixed:
        return True, True
    ranks, pp = strategy.tp * strategy.cp * strategy.data_parallel, strategy.pp

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
    reduce: float = 0.0  # the reduce-scatter share of per_microbatch_backward
    after_step: float = 0.0  # after the optimizer step, behind nothing: the distributed optimizer's gather when
    # the strategy does not overlap it (dp_overlap grad or off)
    regather: float = 0.0  # per micro-batch: the recomputed forward's own gather (GatherCalls.regather_for_recompute)
    host: float = 0.0  # per micro-batch: host-side copies of list-based collectives (GatherCalls.per_rank_copies)
    host_gather: float = 0.0  # of `host`: the copies of the forward's gathers
    host_regather: float = 0.0  # of `host`: the copies of the backward's re-gathers
    host_reduce: float = 0.0  # of `host`: the copies of the gradient reduce-scatters
    regather_copies: float = 0.0  # of `regather`: the copies of the recomputed forward's gathers


def gathered_policy(job: Job, strategy: Strategy, groups: StageComms) -> Gather | None:
    """What stays gathered of this stage's sharded weights (`Gathering.policy`), None when its weights are
    whole at rest (ZeRO-0/1/2 under a runtime that does not shard them, or no sharding group)."""
    if groups.dp.size == 1 or groups.dp_shard.size == 1:
        return None
    return job.runtime.gathering.policy(strategy.zero, strategy.pipelined)


def _in_calls(collective, size_bytes: float, calls: float, group: CommGroup, catalog: Catalog) -> float:
    """`size_bytes` moved by `calls` equal collectives, each paying its own latency steps (at least one call)."""
    calls = max(1.0, calls)
    return calls * collective(size_bytes / calls, group, catalog)


def replica_sync_seconds(replica_params: float, job: Job, groups: StageComms, catalog: Catalog) -> float:
    """Seconds per step to sum the gradients of replicated experts among their replicas: an all-reduce of the
    rank's replicated slots over the expert-parallel group (an upper bound: a replica's own group is the ranks
    holding its expert, at most ep of them)."""
    if not replica_params:
        return 0.0
    return coll.all_reduce(replica_params * grad_reduce_bytes(job), groups.ep, catalog)


def data_parallel_comm(params: float, largest_layer_params: float, job: Job, strategy: Strategy,
                       groups: StageComms, micro_batches: int, catalog: Catalog,
                       host_rate: float = 0.0, sums: StageSums | None = None) -> DataParallelComm:
    """Seconds of data-parallel communication for a stage holding `params` per rank.

    Sharded weights travel in as many collectives as the runtime issues for the stage's layers
    (`GatherCalls`, counted in `sums`; without sums one per gather), each paying the ring's n - 1
    latency steps: at hundreds of ranks the count, not the bytes, sets the time.

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
    policy = gathered_policy(job, s, groups)
    fwd = bwd = end = first = start = reduce = regather = after = 0.0
    host_gather = host_regather = host_reduce = regather_copies = 0.0
    if s.zero == 0:
        end = coll.all_reduce(grad_bytes, groups.dp, catalog)
    elif policy is None:  # ZeRO-1/2: whole weights, sharded optimizer
        rs = coll.reduce_scatter(grad_bytes, shard, catalog)
        if s.zero == 2:
            bwd = reduce = rs  # partitioned gradients are reduced every micro-batch
        else:
            end += rs
        gather = coll.all_gather(params * WEIGHT_BYTES, shard, catalog)
        if s.dp_overlap != "on":
            after = gather  # Megatron-LM without --overlap-param-gather: after the step, nothing to hide behind
        elif runtime.overlap.param_gather:
            start = gather  # Megatron --overlap-param-gather: behind the next step's first forward
        else:
            end += gather
        end += coll.all_reduce(grad_bytes / shard.size, replicate, catalog)
    else:
        calls = runtime.gathering.calls
        gathers = sums.gather_calls if sums is not None else 1.0
        reduces = sums.reduce_calls if sums is not None else 1.0
        weight_bytes = params * runtime.gathering.bytes_per_param
        gather = _in_calls(coll.all_gather, weight_bytes, gathers, shard, catalog)
        rs = _in_calls(coll.reduce_scatter, grad_bytes, reduces, shard, catalog)
        first = coll.all_gather(largest_layer_params * runtime.gathering.bytes_per_param, shard, catalog)
        # a list-based collective copies one chunk per rank on the host path, per call
        copy = shard.size * catalog.constant("collective_per_rank_copy_seconds") if calls.per_rank_copies else 0.0
        gather_copies, reduce_copies = max(1.0, gathers) * copy, max(1.0, reduces) * copy
        if sums is not None and sums.regather_params:
            regather_copies = sums.regather_calls * copy
            regather = _in_calls(coll.all_gather, sums.regather_params * runtime.gathering.bytes_per_param,
                                 sums.regather_calls, shard, catalog) + regather_copies
        if policy == "step":
            start, end, first = gather, rs + gather_copies + reduce_copies, 0.0
        elif policy == "microbatch":
            fwd, bwd, reduce = gather, rs, rs
            host_gather, host_reduce = gather_copies, reduce_copies
        else:
            fwd = again = gather
            if s.regather == "host" and shard.spans_nodes:
                local = shard.ranks_per_node
                in_node = shard.model_copy(update={"size": local, "ranks_per_node": local})
                again = weight_bytes / local / host_rate + coll.all_gather(weight_bytes, in_node, catalog)
                fwd = (gather + (micro_batches - 1) * again) / micro_batches  # the first forward fills the cache
            bwd, reduce = again + rs, rs
            host_gather, host_regather, host_reduce = gather_copies, gather_copies, reduce_copies
        end += coll.all_reduce(grad_bytes / shard.size, replicate, catalog)
    host = host_gather + host_regather + host_reduce
    total = micro_batches * (fwd + bwd + regather + host) + start + end + after
    return DataParallelComm(fwd, bwd, first, start, end, total, reduce, after, regather, host, host_gather,
                            host_regather, host_reduce, regather_copies)
