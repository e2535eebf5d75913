"""The ranks of a recommendation job: where each sits and the rates it gets.

Ranks are numbered pool by pool, node by node, GPU by GPU (the order of the
hostfile).  A rank's rates depend only on its pool, so costs are tabled per
pool and shared by its ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from hardware import Catalog, Cluster, DeviceSpec, NodeSpec
from hardware.collectives import intra_efficiency


@dataclass(frozen=True)
class RankSite:
    """One GPU of the job."""

    rank: int
    node: int  # global node index (pools in order)
    local: int  # GPU index inside its node
    pool: int  # index of its pool in the cluster


@dataclass(frozen=True)
class PoolRates:
    """Achieved rates one GPU of a pool gets during the embedding phase (bytes/s, seconds/byte)."""

    hbm_lookup: float  # bytes/s of pooled row gathers from HBM
    host_lookup: float  # bytes/s of row gathers from host DRAM while every GPU of the node does the same
    scatter_s_per_byte: float  # seconds per byte of a message spread evenly over all ranks (all-to-all)
    intra_s_per_byte: float  # seconds per byte sent inside the node (node-local reduce-scatter)
    a2a_latency: float  # alpha of one all-to-all over the job


class JobSites:
    """Ranks, nodes and per-pool rates of a cluster."""

    def __init__(self, cluster: Cluster, catalog: Catalog):
        self.cluster = cluster
        self.catalog = catalog
        sites: list[RankSite] = []
        node = 0
        for p, pool in enumerate(cluster.pools):
            for _ in range(pool.count):
                for local in range(pool.node.gpus_per_node):
                    sites.append(RankSite(rank=len(sites), node=node, local=local, pool=p))
                node += 1
        self.ranks: list[RankSite] = sites
        self.num_nodes = node

    @property
    def world(self) -> int:
        """Ranks in the job."""
        return len(self.ranks)

    def node_spec(self, pool: int) -> NodeSpec:
        """The node type of pool index `pool`."""
        return self.cluster.pools[pool].node

    def device(self, pool: int) -> DeviceSpec:
        """The GPU of pool index `pool`."""
        return self.catalog.node_device(self.node_spec(pool))

    @cached_property
    def node_ranks(self) -> list[list[int]]:
        """Ranks of every node, by global node index."""
        nodes: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for site in self.ranks:
            nodes[site.node].append(site.rank)
        return nodes

    @cached_property
    def node_pool(self) -> list[int]:
        """Pool index of every node."""
        return [self.ranks[ranks[0]].pool for ranks in self.node_ranks]

    def host_capacity(self, node: int) -> float:
        """Usable host DRAM bytes of node `node`."""
        spec = self.node_spec(self.node_pool[node])
        return spec.host_dram_bytes * self.catalog.constant("host_memory_usable_fraction")

    def rates(self, pool: int) -> PoolRates:
        """Achieved rates of a GPU of pool index `pool` (every GPU of its node busy at once)."""
        return self._rates[pool]

    @cached_property
    def _rates(self) -> list[PoolRates]:
        c, world = self.catalog, self.world
        fabric = self.cluster.fabric
        out = []
        for p, pool in enumerate(self.cluster.pools):
            node, device = pool.node, self.device(p)
            g = node.gpus_per_node
            intra_rate = node.intra_link.bandwidth * intra_efficiency(node.intra_link, c)
            inter_rate = self.cluster.inter_node_bandwidth_per_gpu(pool) * c.constant("network_efficiency")
            local = min(g, world)
            # an even all-to-all sends (g-1)/W of each byte inside the node and (W-g)/W over the NICs, at once
            scatter = max((local - 1) / world / intra_rate, (world - local) / world / inter_rate)
            latency = (world - 1) * (fabric.latency if world > g else node.intra_link.latency)
            out.append(PoolRates(
                hbm_lookup=device.hbm_bandwidth * c.constant("embedding_lookup_efficiency"),
                host_lookup=node.host_bandwidth_per_gpu(g) * c.constant("pcie_efficiency")
                * c.constant("host_gather_efficiency"),
                scatter_s_per_byte=scatter, intra_s_per_byte=1.0 / intra_rate, a2a_latency=latency,
            ))
        return out
