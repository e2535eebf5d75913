"""Where a strategy puts things: layers on stages, ranks on nodes, comm groups.

Ranks are numbered Megatron-style (tp fastest, then cp, dp, pp) and laid on
the cluster's nodes pool by pool, so pipeline stage i occupies a contiguous
rank range and, on a mixed cluster, whichever pool that range falls on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from hardware import Catalog, Cluster, DeviceSpec, LinkSpec, NodeSpec, Pool
from hardware.collectives import CommGroup
from models.graph import Layer, LayerKind, ModelGraph
from planner.fields import Reader, reads
from planner.job import Job
from planner.strategy import Strategy


def microbatch_tokens(job: Job, strategy: Strategy) -> float:
    """Tokens of one micro-batch on one context-parallel rank."""
    return strategy.mbs * job.seq_len / strategy.cp


@dataclass(frozen=True)
class StageSite:
    """The hardware one pipeline stage's ranks sit on."""

    index: int  # stage index (the schedule's in-flight count depends on it)
    pools: tuple[Pool, ...]  # pools its ranks touch (one on homogeneous clusters)
    device: DeviceSpec  # the slowest device of the stage (bounds its compute), under its node's power/clock limit
    hbm_bytes: float  # the smallest memory capacity among its devices, as the runtime reports it
    node: NodeSpec = field(compare=False)  # the node type of the stage's slowest device


def make_site(index: int, pools: tuple[Pool, ...], catalog: Catalog) -> StageSite:
    """A site on `pools`: slowest device (as its node's limits let it run), smallest usable HBM."""
    devices = [catalog.node_device(p.node) for p in pools]
    slowest = min(range(len(pools)), key=lambda i: devices[i].sustained_peak("bf16"))
    return StageSite(index=index, pools=pools, device=devices[slowest],
                     hbm_bytes=min(d.capacity_bytes for d in devices), node=pools[slowest].node)


@dataclass(frozen=True)
class StagePlacement:
    """One pipeline stage: its layers and its site."""

    site: StageSite
    layers: tuple[Layer, ...]
    blocks: tuple[int, ...]  # transformer block indices on this stage

    @property
    def index(self) -> int:
        return self.site.index

    @property
    def device(self) -> DeviceSpec:
        return self.site.device


def split_blocks(num_blocks: int, pp: int, split: tuple[int, ...] | None) -> list[list[int]]:
    """Block indices per stage: the given split, or as even as possible (earlier stages get the extra)."""
    if split is None:
        base, extra = divmod(num_blocks, pp)
        split = tuple(base + (1 if i < extra else 0) for i in range(pp))
    stages, start = [], 0
    for count in split:
        stages.append(list(range(start, start + count)))
        start += count
    return stages


def stage_layers(model: ModelGraph, pp: int, split: tuple[int, ...] | None,
                 v_shape: bool = False) -> list[list[Layer]]:
    """Layers per stage: pre-block layers on the first stage, post-block layers on the last, or with `v_shape`
    (zbv, dualpipev: stage 0 runs the first and the last model chunk) on the first too.  Blocks are counted
    per stage only, so the first stage's blocks stand for its two chunks' (identical blocks cost the same)."""
    if pp == 1 or model.num_blocks == 0:
        return [list(model.layers)]
    per_stage = split_blocks(model.num_blocks, pp, split)
    owner = {b: i for i, blocks in enumerate(per_stage) for b in blocks}
    stages: list[list[Layer]] = [[] for _ in range(pp)]
    seen_block = False
    for layer in model.layers:
        if layer.block is not None:
            seen_block = True
            stages[owner[layer.block]].append(layer)
        else:
            stages[-1 if seen_block and not v_shape else 0].append(layer)
    return stages


def _pools_of_ranks(cluster: Cluster, first: int, last: int) -> tuple[Pool, ...]:
    """Pools holding global ranks [first, last]."""
    touched, offset = [], 0
    for pool in cluster.pools:
        end = offset + pool.gpus
        if first < end and last >= offset:
            touched.append(pool)
        offset = end
    return tuple(touched)


def place_stages(job: Job, strategy: Strategy, catalog: Catalog) -> list[StagePlacement]:
    """Stage placements for a resolved strategy (dp set)."""
    ranks_per_stage = strategy.tp * strategy.cp * strategy.data_parallel
    placements = []
    for i, layers in enumerate(stage_layers(job.model, strategy.pp, strategy.split, strategy.v_shape)):
        pools: tuple[Pool, ...]
        if strategy.stage_pools is not None:
            pools = (job.cluster.pool(strategy.stage_pools[i]),)
        else:
            first = i * ranks_per_stage
            pools = _pools_of_ranks(job.cluster, first, first + ranks_per_stage - 1)
        blocks = tuple(sorted({layer.block for layer in layers if layer.block is not None}))
        placements.append(StagePlacement(site=make_site(i, pools, catalog), layers=tuple(layers), blocks=blocks))
    return placements


def group_ranks_per_node(size: int, stride: int, gpus_per_node: int) -> int:
    """Members of a group of `size` ranks spaced `stride` apart that share one node (at least one)."""
    return max(1, min(size, gpus_per_node // stride)) if stride <= gpus_per_node else 1


def nvlink_domain_gpus(pools: tuple[Pool, ...]) -> int:
    """GPUs of one NVLink domain on `pools` (the smallest): a node, or a GB200 NVL72 rack of 18 nodes."""
    return min(p.nvlink_domain_gpus for p in pools)


def comm_group(cluster: Cluster, pools: tuple[Pool, ...], size: int, stride: int) -> CommGroup:
    """A group of `size` ranks spaced `stride` apart in rank order, on `pools`.

    Consecutive ranks share an NVLink domain (a node, or a GB200 NVL72 rack of
    18 nodes), so a domain of g GPUs holds g // stride members of such a group
    (at least one); the CommGroup's "node" is that domain: its members talk
    over the intra link, and only traffic between domains uses the NICs.
    """
    return _group_on(_links(cluster, pools), size, stride)


@dataclass(frozen=True)
class _Links:
    """What every communicator on a set of pools shares: the smallest NVLink domain, the slowest intra link,
    the slowest inter-node rate per GPU and the fabric's latency."""

    domain_gpus: int
    intra: LinkSpec
    inter_bandwidth: float
    inter_latency: float


def _links(cluster: Cluster, pools: tuple[Pool, ...]) -> _Links:
    return _Links(domain_gpus=nvlink_domain_gpus(pools),
                  intra=min((p.node.intra_link for p in pools), key=lambda link: link.bandwidth),
                  inter_bandwidth=min(cluster.inter_node_bandwidth_per_gpu(p) for p in pools),
                  inter_latency=cluster.fabric.latency)


def _group_on(links: _Links, size: int, stride: int) -> CommGroup:
    return CommGroup(size=size, ranks_per_node=group_ranks_per_node(size, stride, links.domain_gpus),
                     intra=links.intra, inter_bandwidth=links.inter_bandwidth, inter_latency=links.inter_latency)


@dataclass(frozen=True)
class StageComms:
    """The communicators a rank of one stage belongs to."""

    tp: CommGroup
    cp: CommGroup
    dp: CommGroup  # gradient reduction group (dp x cp ranks, Megatron reduces over both)
    dp_shard: CommGroup  # ZeRO/FSDP sharding group (dp, or its intra-node part for shard=node)
    dp_replicate: CommGroup  # HSDP replica group across nodes (size 1 when shard=full)
    ep: CommGroup  # the expert-parallel all-to-all group
    etp: CommGroup  # the ranks one routed expert is split over
    pp: CommGroup  # to the next stage


def shard_degree(strategy: Strategy, gpus_per_node: int) -> int:
    """Ranks a ZeRO/FSDP shard group spans: all of dp, or those of dp inside one node."""
    if strategy.shard == "full":
        return strategy.data_parallel * strategy.cp
    in_node = max(1, gpus_per_node // (strategy.tp * strategy.cp))
    return max(1, min(strategy.data_parallel, in_node)) * strategy.cp


# what `stage_comms` reads of the strategy (with the site's pools): its cache key (strategy_key)
COMMS_READS = reads(Reader.COMMS)

# each communicator's (size, stride in rank order) from a stage's strategy and its GPUs per node
GROUP_SHAPES: dict[str, Callable[[Strategy, int], tuple[int, int]]] = {
    "tp": lambda s, gpn: (s.tp, 1),
    "cp": lambda s, gpn: (s.cp, s.tp),
    "dp": lambda s, gpn: (s.data_parallel * s.cp, s.tp),
    "dp_shard": lambda s, gpn: (shard_degree(s, gpn), s.tp),
    "dp_replicate": lambda s, gpn: (s.data_parallel * s.cp // shard_degree(s, gpn), s.tp * shard_degree(s, gpn)),
    # Megatron-Core folds expert groups over a stage's tp x cp x dp ranks in the order etp, ep, edp
    # (parallel_state's expert RankGenerator, order "tp-ep-dp-pp"): an ep group's members are etp apart
    "ep": lambda s, gpn: (s.ep, s.expert_tp),
    "etp": lambda s, gpn: (s.expert_tp, 1),
    "pp": lambda s, gpn: (2 if s.pipelined else 1, s.tp * s.cp * s.data_parallel),
}


def stage_comms(job: Job, strategy: Strategy, site: StageSite) -> StageComms:
    """Communicator shapes for one stage under a resolved strategy."""
    gpn = min(p.node.gpus_per_node for p in site.pools)
    links = _links(job.cluster, site.pools)  # once per stage: the eight groups share it, and several a shape
    shapes = {name: shape(strategy, gpn) for name, shape in GROUP_SHAPES.items()}
    groups = {shape: _group_on(links, *shape) for shape in set(shapes.values())}
    return StageComms(**{name: groups[shape] for name, shape in shapes.items()})


def tp_divisor(layer: Layer, tp: int) -> int:
    """How many ways tensor parallelism splits this layer's weights and GEMMs."""
    return tp if layer.tp_splittable else 1


def is_block_layer(layer: Layer) -> bool:
    """Attention/MLP/MoE layers: the ones with per-layer TP collectives."""
    return layer.kind in (LayerKind.ATTENTION, LayerKind.MLP, LayerKind.MOE)
