"""The state migration between two layouts: which bytes each new rank needs, from which old rank (or the
checkpoint), over which link, and how long that takes.

For every rank of the new layout, every layer it holds and every state term (planner.replan.layout: the
runtime's weight and optimizer terms, laid out by each strategy), the bytes it needs are matched against
the old layout's holders and fetched from the cheapest one still there:

1. `local`: the same physical GPU held them (a GPU that stays keeps what it holds; node identity:
   planner.replan.nodes);
2. `nvlink`: a surviving GPU of the same node holds them (the least loaded such sender);
3. `fabric`: a surviving GPU of another node holds them (the least loaded sender);
4. `storage`: no surviving GPU holds them: they are read from the checkpoint.

The time is a bottleneck estimate: every transfer runs at once and each port moves its bytes at its
achieved rate: a GPU's NVLink port in and out (the node's intra link x hardware constants'
nvlink_efficiency), a node's NICs in and out (the cluster's inter-node rate x network_efficiency; a
node's NICs carry both its fabric receives and its checkpoint reads), and the checkpoint reads: each
node's at hardware constants' checkpoint_read_bandwidth_per_node, or with --checkpoint-bandwidth all of
them through one storage port at that aggregate rate.  The time is the busiest port's bytes / rate.  When
reading every remote byte from the checkpoint would be faster than the fabric (a slow fabric, fast storage),
the route switches to `storage` for them.  Latency, congestion beyond the fabric's oversubscription, and the
restart itself (process launch, rendezvous, compilation: the same for every candidate) are left out.

`restart` is what the emitted launch files do: every new rank reads its whole state from the checkpoint
(torch.distributed.checkpoint resharding on load, DeepSpeed's universal checkpoint, Megatron's torch_dist
load), so its bytes per rank are the state each rank holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog, Cluster
from hardware.collectives import intra_efficiency
from models.graph import ModelGraph
from planner.replan.layout import MovedKind, RankSite, StateLayout, StateTerm, overlapping
from planner.replan.nodes import NodeMap

Link = Literal["local", "nvlink", "fabric", "storage"]
LINKS: tuple[Link, ...] = ("local", "nvlink", "fabric", "storage")
MIGRATION_FORMAT = "planner.migration/1"
_FIELD = ConfigDict(extra="forbid", frozen=True)


class Move(BaseModel):
    """Bytes of one state kind one new rank takes from one source over one link."""

    model_config = _FIELD
    kind: MovedKind = Field(description="weights (the runtime's weight copies) or "
                                                  "optimizer (master weights and Adam moments).")
    layers: list[tuple[int, int]] = Field(description="[first, last] runs of model layer indices (inclusive) "
                                          "whose bytes this move carries.")
    first_layer: str = Field(description="Name of the first layer moved.")
    last_layer: str = Field(description="Name of the last layer moved.")
    from_rank: int | None = Field(description="Old rank that sends; None: read from the checkpoint.")
    from_gpu: tuple[int, int] | None = Field(description="(node, local GPU) of the sender in the NEW cluster's "
                                             "numbering; None for storage.")
    to_rank: int = Field(description="New rank that receives.")
    to_gpu: tuple[int, int] = Field(description="(node, local GPU) of the receiver in the new cluster.")
    link: Link = Field(description="local (already there), nvlink (same node), fabric (another node) or "
                       "storage (the checkpoint).")
    bytes: float = Field(description="Bytes moved.")


class LinkTotal(BaseModel):
    """Everything that crosses one class of link."""

    model_config = _FIELD
    link: Link = Field(description="The link class.")
    bytes: float = Field(description="Bytes over it, all moves.")
    moves: int = Field(description="Moves over it.")
    seconds: float = Field(description="Its busiest port's bytes / rate (0 for local).")
    busiest: str = Field(description="That port ('' when nothing crosses).")


class RankLoad(BaseModel):
    """What one new rank holds and how it gets there."""

    model_config = _FIELD
    rank: int = Field(description="New rank.")
    gpu: tuple[int, int] = Field(description="(node, local GPU) in the new cluster.")
    state_bytes: float = Field(description="State it holds under the new layout (what a restart reads for it).")
    by_link: dict[str, float] = Field(description="Bytes it takes per link class (sums to state_bytes).")


class Estimate(BaseModel):
    """A transfer time and what limits it."""

    model_config = _FIELD
    bytes: float = Field(description="Bytes that travel (local bytes excluded).")
    seconds: float = Field(description="The busiest port's bytes / rate.")
    bottleneck: str = Field(description="That port.")


class Migration(BaseModel):
    """migration.json: the state moves from the old layout to the new one (see the module docstring)."""

    model_config = _FIELD
    format: str = Field(MIGRATION_FORMAT, description="Format of this file.")
    old_strategy: str = Field(description="SPEC of the old plan.")
    new_strategy: str = Field(description="SPEC of the new plan.")
    route: Literal["peer", "storage"] = Field(
        description="peer: surviving holders send over NVLink and the fabric, state no surviving GPU holds is "
        "read from the checkpoint; storage: every byte a new rank does not hold already is read from the "
        "checkpoint (faster than the fabric here).")
    checkpoint_bandwidth: float = Field(description="Aggregate checkpoint read rate assumed, bytes/s.")
    terms: list[str] = Field(description="State terms moved (the runtime's weight and optimizer terms).")
    state_bytes: float = Field(description="State of the new layout, all ranks (replicas counted).")
    kept_bytes: float = Field(description="Of it, bytes already on the GPU that needs them.")
    moved: Estimate = Field(description="The migration: bytes that travel and the time.")
    restart: Estimate = Field(description="A restart from the checkpoint instead: every rank reads its whole "
                              "state (what the emitted launch files do).")
    links: list[LinkTotal] = Field(description="Totals per link class.")
    ranks: list[RankLoad] = Field(description="Per new rank.")
    moves: list[Move] = Field(description="Every move, by receiving rank ([] when only the totals were asked).")


# ---------------------------------------------------------------- link rates


@dataclass(frozen=True)
class Rates:
    """Achieved rates of the new cluster's ports, bytes/s."""

    nvlink: tuple[float, ...]  # per node: one GPU's NVLink port, each direction
    nic: tuple[float, ...]  # per node: all its NICs together, each direction
    storage_per_node: float  # default: the read rate of each node from the storage
    storage: float | None  # --checkpoint-bandwidth (aggregate), or None for the default

    def storage_rate(self, readers: int) -> float:
        """Aggregate read rate when `readers` nodes read at once (evenly)."""
        return self.storage if self.storage is not None else self.storage_per_node * max(1, readers)

    def storage_port(self, node: int) -> tuple[tuple, float]:
        """(port, rate) a checkpoint read by `node` goes through: the node's own reads (default) or the one
        aggregate storage port (--checkpoint-bandwidth)."""
        if self.storage is None:
            return ("node", node, None, "checkpoint reads"), self.storage_per_node
        return ("storage", -1, None, ""), self.storage


def cluster_rates(cluster: Cluster, catalog: Catalog, checkpoint_bandwidth: float | None) -> Rates:
    """The port rates of every node of `cluster` (nodes numbered across pools in order)."""
    nvlink, nic = [], []
    for pool in cluster.pools:
        node = pool.node
        gpu = node.intra_link.bandwidth * intra_efficiency(node.intra_link, catalog)
        nics = cluster.inter_node_bandwidth_per_gpu(pool) * node.gpus_per_node * catalog.constant("network_efficiency")
        nvlink += [gpu] * pool.count
        nic += [nics] * pool.count
    return Rates(nvlink=tuple(nvlink), nic=tuple(nic),
                 storage_per_node=catalog.constant("checkpoint_read_bandwidth_per_node"), storage=checkpoint_bandwidth)


# ---------------------------------------------------------------- routing


@dataclass
class _Router:
    """Picks a sender per piece and keeps the load of every port (see the module docstring)."""

    old: StateLayout
    nodes: NodeMap
    nvlink_out: dict[tuple[int, int], float] = field(default_factory=dict)
    fabric_out: dict[int, float] = field(default_factory=dict)
    _alive: dict = field(default_factory=dict)

    def alive(self, stage: int, sharded: bool, classes: tuple, layer: int) -> list[tuple[RankSite, tuple[int, int]]]:
        """Surviving holders of a segment with their GPU in the new numbering."""
        whole = not (self.old.layer_shape[layer][2] and self.old.strategy.tp > 1)
        key = (stage, sharded, classes, whole)
        if key not in self._alive:
            out = []
            for site in self.old.holders(stage, sharded, classes, layer):
                where = self.nodes.gpu(site.node, site.local)
                if where is not None:
                    out.append((site, where))
            self._alive[key] = out
        return self._alive[key]

    def pick(self, holders: list, gpu: tuple[int, int], nbytes: float) -> tuple[RankSite | None, tuple | None, Link]:
        for site, where in holders:
            if where == gpu:
                return site, where, "local"
        same = [(self.nvlink_out.get(w, 0.0), s.rank, s, w) for s, w in holders if w[0] == gpu[0]]
        if same:
            _, _, site, where = min(same, key=lambda item: item[:2])
            self.nvlink_out[where] = self.nvlink_out.get(where, 0.0) + nbytes
            return site, where, "nvlink"
        if holders:
            _, _, site, where = min(((self.fabric_out.get(w[0], 0.0), s.rank, s, w) for s, w in holders),
                                    key=lambda item: item[:2])
            self.fabric_out[where[0]] = self.fabric_out.get(where[0], 0.0) + nbytes
            return site, where, "fabric"
        return None, None, "storage"


@dataclass
class _Flow:
    """One move before it is written out (Move's fields; `layers`: layer index -> bytes)."""

    to_rank: int
    from_rank: int | None
    kind: MovedKind
    link: Link
    to_gpu: tuple[int, int]
    from_gpu: tuple[int, int] | None
    layers: dict[int, float]
    bytes: float = 0.0

    @property
    def sender(self) -> tuple[int, int]:
        """(node, local GPU) of the sender of a GPU-to-GPU flow; ValueError for a read from storage."""
        if self.from_gpu is None:
            raise ValueError(f"a {self.link} flow to rank {self.to_rank} has no sending GPU")
        return self.from_gpu


def _route(old: StateLayout, new: StateLayout, terms: tuple[StateTerm, ...], nodes: NodeMap) -> list[_Flow]:
    """Every (to rank, from rank, kind, link) flow with the bytes per layer, in routing order."""
    router = _Router(old, nodes)
    flows: dict = {}
    for site in new.ranks:
        gpu = (site.node, site.local)
        for layer in new.stage_layers(site.stage):
            old_stage = old.layer_stage[layer]
            for term in terms:
                sharded_old = term.sharded(old.strategy.zero)
                segments = old.segments(layer, sharded_old)
                for lo, hi in new.pieces(site, layer, term.sharded(new.strategy.zero)):
                    for segment, overlap in overlapping(segments, lo, hi):
                        nbytes = overlap * term.bytes_per_param
                        holders = router.alive(old_stage, sharded_old, segment.classes, layer)
                        sender, where, link = router.pick(holders, gpu, nbytes)
                        key = (site.rank, sender.rank if sender else None, term.kind, link)
                        flow = flows.get(key)
                        if flow is None:
                            flow = flows[key] = _Flow(site.rank, key[1], term.kind, link, gpu, where, {})
                        flow.layers[layer] = flow.layers.get(layer, 0.0) + nbytes
                        flow.bytes += nbytes
    return list(flows.values())


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [(a, b) for a, b in runs]


def _moves(flows: list[_Flow], model: ModelGraph) -> list[Move]:
    order = {link: i for i, link in enumerate(LINKS)}
    moves = []
    for f in flows:
        first, last = min(f.layers), max(f.layers)
        moves.append(Move(kind=f.kind, layers=_runs(list(f.layers)), first_layer=model.layers[first].name,
                          last_layer=model.layers[last].name, from_rank=f.from_rank, from_gpu=f.from_gpu,
                          to_rank=f.to_rank, to_gpu=f.to_gpu, link=f.link, bytes=f.bytes))
    moves.sort(key=lambda m: (m.to_rank, order[m.link], -1 if m.from_rank is None else m.from_rank, m.kind))
    return moves


def _to_storage(flows: list[_Flow]) -> list[_Flow]:
    """The same flows with every fabric transfer read from the checkpoint instead."""
    return [replace(f, link="storage", from_rank=None, from_gpu=None) if f.link == "fabric" else f for f in flows]


# ---------------------------------------------------------------- time


def _ports(flows: list[_Flow], rates: Rates) -> dict[tuple, list]:
    """port -> [bytes, rate, link class] of every port a flow set uses; a port is (what, node, GPU, direction)."""
    ports: dict[tuple, list] = {}

    def add(port: tuple, nbytes: float, rate: float, link: str) -> None:
        entry = ports.get(port)
        if entry is None:
            entry = ports[port] = [0.0, rate, link]
        entry[0] += nbytes

    for f in flows:
        node, local = f.to_gpu
        if f.link == "nvlink":
            add(("GPU", node, local, "NVLink in"), f.bytes, rates.nvlink[node], "nvlink")
            add(("GPU", f.sender[0], f.sender[1], "NVLink out"), f.bytes, rates.nvlink[f.sender[0]], "nvlink")
        elif f.link == "fabric":
            add(("node", node, None, "NICs in"), f.bytes, rates.nic[node], "fabric")
            add(("node", f.sender[0], None, "NICs out"), f.bytes, rates.nic[f.sender[0]], "fabric")
        elif f.link == "storage":
            add(("node", node, None, "NICs in"), f.bytes, rates.nic[node], "storage")  # reads cross the NICs too
            port, rate = rates.storage_port(node)
            add(port, f.bytes, rate, "storage")
    return ports


def _port_name(port: tuple) -> str:
    what, node, local, direction = port
    if what == "storage":
        return "checkpoint storage"
    return f"GPU {node}:{local} {direction}" if what == "GPU" else f"node {node} {direction}"


def estimate(flows: list, rates: Rates) -> Estimate:
    """Bytes that travel and the busiest port's time."""
    ports = _ports(flows, rates)
    moved = sum(f.bytes for f in flows if f.link != "local")
    if not ports:
        return Estimate(bytes=moved, seconds=0.0, bottleneck="")
    named = sorted((_port_name(port), b, r) for port, (b, r, _) in ports.items())
    name, nbytes, rate = max(named, key=lambda item: item[1] / item[2])  # the first by name among equals
    return Estimate(bytes=moved, seconds=nbytes / rate, bottleneck=name)


def _link_totals(flows: list, rates: Rates) -> list[LinkTotal]:
    ports = _ports(flows, rates)
    out = []
    for link in LINKS:
        own = [f for f in flows if f.link == link]
        busy = [(b / r, _port_name(port)) for port, (b, r, cls) in ports.items() if cls == link]
        seconds, busiest = max(busy) if busy else (0.0, "")
        out.append(LinkTotal(link=link, bytes=sum(f.bytes for f in own), moves=len(own), seconds=seconds,
                             busiest=busiest))
    return out


def restart_estimate(ranks: list[RankLoad], rates: Rates) -> Estimate:
    """Every new rank reads its whole state from the checkpoint."""
    per_node: dict[int, float] = {}
    for rank in ranks:
        per_node[rank.gpu[0]] = per_node.get(rank.gpu[0], 0.0) + rank.state_bytes
    ports: dict[tuple, list] = {}
    for n, b in sorted(per_node.items()):
        port, rate = rates.storage_port(n)
        ports.setdefault(port, [0.0, rate])[0] += b
    candidates = [(b / r, _port_name(port)) for port, (b, r) in ports.items()]
    candidates += [(b / rates.nic[n], f"node {n} NICs in") for n, b in sorted(per_node.items())]
    total = sum(per_node.values())
    seconds, bottleneck = max(candidates, key=lambda item: item[0])
    return Estimate(bytes=total, seconds=seconds, bottleneck=bottleneck)


# ---------------------------------------------------------------- the migration


def plan_migration(old: StateLayout, new: StateLayout, terms: tuple[StateTerm, ...], nodes: NodeMap,
                   rates: Rates, model: ModelGraph, moves: bool = True) -> Migration:
    """The moves from `old` to `new`, routed as the module docstring says, with their time (`moves`: list
    every move; without, only the totals, for weighing candidates)."""
    flows = _route(old, new, terms, nodes)
    route: Literal["peer", "storage"] = "peer"
    if any(f.link == "fabric" for f in flows):
        stored = _to_storage(flows)
        if estimate(stored, rates).seconds < estimate(flows, rates).seconds:
            flows, route = stored, "storage"
    per_rank: dict[int, dict[str, float]] = {site.rank: dict.fromkeys(LINKS, 0.0) for site in new.ranks}
    for f in flows:
        per_rank[f.to_rank][f.link] += f.bytes
    ranks = [RankLoad(rank=site.rank, gpu=(site.node, site.local), state_bytes=sum(per_rank[site.rank].values()),
                      by_link=per_rank[site.rank]) for site in new.ranks]
    return Migration(
        old_strategy=old.strategy.spec(), new_strategy=new.strategy.spec(), route=route,
        checkpoint_bandwidth=rates.storage_rate(len({f.to_gpu[0] for f in flows if f.link == "storage"})),
        terms=[t.name for t in terms], state_bytes=sum(r.state_bytes for r in ranks),
        kept_bytes=sum(f.bytes for f in flows if f.link == "local"), moved=estimate(flows, rates),
        restart=restart_estimate(ranks, rates), links=_link_totals(flows, rates), ranks=ranks,
        moves=_moves(flows, model) if moves else [])


def unrecoverable_bytes(old: StateLayout, terms: tuple[StateTerm, ...], nodes: NodeMap) -> float:
    """State no surviving GPU holds (every copy was on a node that left): any new layout reads it from the
    checkpoint, so it bounds every migration from below."""
    router = _Router(old, nodes)
    lost = 0.0
    for layer, stage in enumerate(old.layer_stage):
        for term in terms:
            sharded = term.sharded(old.strategy.zero)
            for segment in old.segments(layer, sharded):
                if not router.alive(stage, sharded, segment.classes, layer):
                    lost += (segment.hi - segment.lo) * term.bytes_per_param
    return lost


def migration_floor(lost_bytes: float, rates: Rates, new_nodes: int) -> float:
    """Seconds no migration beats: the unrecoverable bytes through the storage and all the new nodes' NICs."""
    if lost_bytes <= 0:
        return 0.0
    return max(lost_bytes / rates.storage_rate(new_nodes), lost_bytes / sum(rates.nic[:new_nodes]))


def surviving_holders(old: StateLayout, nodes: NodeMap):
    """`alive(stage, sharded, classes, layer)`: the surviving holders of a segment of the old layout, each with
    its GPU in the new numbering (what the routing picks senders from)."""
    return _Router(old, nodes).alive


def receive_link(holders: list[tuple[RankSite, tuple[int, int]]], gpu: tuple[int, int]) -> Link:
    """The link class a receiver on `gpu` takes a piece over, whichever holder sends it: local, nvlink (a
    holder on its node), fabric (a holder elsewhere) or storage (none survives)."""
    if any(where == gpu for _, where in holders):
        return "local"
    if any(where[0] == gpu[0] for _, where in holders):
        return "nvlink"
    return "fabric" if holders else "storage"
