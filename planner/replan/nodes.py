"""Which old node is which new node: the physical identity a migration needs (a GPU that stays keeps what
it holds).

Cluster descriptions carry no host names, so identity is by pool: a pool of the new cluster with the
same name and GPU type as a pool of the old one holds that pool's surviving nodes first, in their old
order, then fresh nodes; a surviving node keeps its GPUs 0..g-1 when the new pool's nodes have g GPUs
(the others left).  The survivors are the old pool's nodes not named in `lost` (old node numbers,
as plan.json numbers nodes: 0.. across pools in cluster order); without `lost`, the first nodes of each
pool survive (the last ones left).  Old pools missing from the new cluster are lost whole; new pools
(or pools whose GPU type changed) are fresh.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hardware import Cluster
from planner.errors import PlannerInputError

_FIELD = ConfigDict(extra="forbid", frozen=True)


class NodeFate(BaseModel):
    """What became of one node of the old cluster."""

    model_config = _FIELD
    old_node: int = Field(description="Node number in the old cluster (plan.json numbering).")
    pool: str = Field(description="Its pool in the old cluster.")
    new_node: int | None = Field(description="Its number in the new cluster; None: it is gone.")


class NodeMap(BaseModel):
    """Old nodes onto new nodes (see the module docstring)."""

    model_config = _FIELD
    fates: list[NodeFate] = Field(description="Every old node, in order.")
    new_nodes: int = Field(description="Nodes of the new cluster.")
    gpus_per_node: list[int] = Field(description="GPUs of each new node.")
    fresh: list[int] = Field(description="New nodes that were not in the old cluster (they hold no state).")

    def new_of(self, old_node: int) -> int | None:
        """The new number of an old node, None when it is gone."""
        return self.fates[old_node].new_node

    def gpu(self, old_node: int, local: int) -> tuple[int, int] | None:
        """(new node, local GPU) of an old GPU, None when it is gone."""
        node = self.new_of(old_node)
        if node is None or local >= self.gpus_per_node[node]:
            return None
        return node, local

    @property
    def lost(self) -> list[int]:
        """Old nodes that are gone."""
        return [f.old_node for f in self.fates if f.new_node is None]


def _offsets(cluster: Cluster) -> dict[str, int]:
    out, node = {}, 0
    for pool in cluster.pools:
        out[pool.name] = node
        node += pool.count
    return out


def map_nodes(old: Cluster, new: Cluster, lost: tuple[int, ...] | None = None, idle: bool = False) -> NodeMap:
    """The node identity of a re-plan; PlannerInputError naming --lost-nodes when `lost` is inconsistent.

    idle: `new` is the first nodes of the user's new cluster (a plan that leaves the rest idle, checked against
    the whole cluster before): survivors beyond it sit idle, and their state counts as gone (read from the
    checkpoint, not copied from them: an upper bound on the migration)."""
    old_offsets, new_offsets = _offsets(old), _offsets(new)
    if lost is not None:
        bad = [n for n in lost if not 0 <= n < old.num_nodes]
        if bad:
            raise PlannerInputError(f"--lost-nodes: node {bad[0]} is not a node of the old cluster "
                                    f"(0..{old.num_nodes - 1})")
    new_pools = {pool.name: pool for pool in new.pools}
    fates: list[NodeFate] = []
    kept: set[int] = set()
    for pool in old.pools:
        first = old_offsets[pool.name]
        nodes = list(range(first, first + pool.count))
        target = new_pools.get(pool.name)
        if target is None or target.node.device != pool.node.device:
            fates += [NodeFate(old_node=n, pool=pool.name, new_node=None) for n in nodes]
            continue
        survivors = [n for n in nodes if n not in lost] if lost is not None else nodes[:target.count]
        if idle:
            survivors = survivors[:target.count]
        elif len(survivors) > target.count:
            raise PlannerInputError(f"--lost-nodes: pool {pool.name} keeps {len(survivors)} of its {pool.count} "
                                    f"nodes, the new cluster has {target.count} there; name every node that left")
        place = {n: new_offsets[pool.name] + i for i, n in enumerate(survivors)}
        kept.update(place.values())
        fates += [NodeFate(old_node=n, pool=pool.name, new_node=place.get(n)) for n in nodes]
    fresh = [n for n in range(new.num_nodes) if n not in kept]
    gpus = [pool.node.gpus_per_node for pool in new.pools for _ in range(pool.count)]
    return NodeMap(fates=fates, new_nodes=new.num_nodes, gpus_per_node=gpus, fresh=fresh)
