"""Collective communication times: alpha-beta models limited by the slowest link.

A group is described by how its ranks sit on nodes (`CommGroup`): `size`
ranks, `ranks_per_node` of them on each node it touches, the intra-node link
and the inter-node bandwidth each GPU gets when every GPU of the node talks at
once (NICs are shared).  Formulas (Thakur et al. 2005; NCCL docs "Performance"):

* ring all-reduce moves 2(n-1)/n * S per rank; reduce-scatter and all-gather
  (n-1)/n * S.  A ring crossing nodes sends that volume once per node boundary,
  and NCCL spreads its channels over all NICs, so the inter-node rate of a node
  is k * (per-GPU NIC share) for k ranks per node.
* hierarchical all-reduce: intra-node reduce-scatter, inter-node all-reduce of
  S/k on each rank's NIC share, intra-node all-gather.  The faster of the two is
  taken, as NCCL's tuner does.
* all-to-all: each rank sends (n-1)/n * S, the share to ranks on other nodes
  over the NICs, the rest over the intra-node link, both at once.
* node-deduplicated dispatch (DeepEP's normal kernels, README "Normal kernels with NVLink and RDMA
  forwarding"): a row crosses the fabric once per distinct remote destination node and is forwarded over
  NVLink once per distinct destination rank there; NICs and NVLink work at once, the slower sets the time.

Every collective call also pays a fixed cost beyond its ring steps (`collective_launch_seconds`: NCCL's
base latency, src/graph/tuning.cc), once per call; a point-to-point send pays only its link latency.

Efficiencies and the link-kind mapping come from `constants.yaml`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware.catalog import Catalog, LinkSpec


class CommGroup(BaseModel):
    """Placement of a communicator's ranks, as far as its speed is concerned."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    size: int = Field(gt=0, description="Ranks in the group.")
    ranks_per_node: int = Field(gt=0, description="Ranks of the group on each node it spans.")
    intra: LinkSpec = Field(description="GPU-to-GPU link inside a node.")
    inter_bandwidth: float = Field(
        gt=0, description="Inter-node bytes/s per GPU when all GPUs of a node communicate."
    )
    inter_latency: float = Field(ge=0, description="Inter-node latency, seconds.")

    @model_validator(mode="after")
    def _fits(self) -> "CommGroup":
        if self.ranks_per_node > self.size:
            raise ValueError("ranks_per_node exceeds group size")
        return self

    @property
    def spans_nodes(self) -> bool:
        """True when the group crosses a node boundary."""
        return self.size > self.ranks_per_node


def intra_efficiency(link: LinkSpec, catalog: Catalog) -> float:
    """Achieved fraction of an intra-node link's line rate (constants.yaml, by link kind)."""
    if link.kind == "pcie":
        return catalog.constant("pcie_efficiency")
    if link.kind == "loopback":
        return catalog.constant("loopback_efficiency")
    return catalog.constant("nvlink_efficiency")


def _rates(group: CommGroup, catalog: Catalog) -> tuple[float, float]:
    """(intra bytes/s, inter bytes/s per GPU) after efficiencies."""
    intra = group.intra.bandwidth * intra_efficiency(group.intra, catalog)
    inter = group.inter_bandwidth * catalog.constant("network_efficiency")
    return intra, inter


def _ring(volume_factor: float, size_bytes: float, steps: int, group: CommGroup, catalog: Catalog) -> float:
    """A ring collective moving `volume_factor` * S per rank in `steps` hops."""
    intra, inter = _rates(group, catalog)
    if group.spans_nodes:
        rate = min(intra, group.ranks_per_node * inter)
        alpha = group.inter_latency
    else:
        rate = intra
        alpha = group.intra.latency
    return volume_factor * size_bytes / rate + steps * alpha


def _launch(catalog: Catalog) -> float:
    """Fixed seconds of one collective call beyond its ring steps (NCCL's base latency)."""
    return catalog.constant("collective_launch_seconds")


def _all_reduce_steps(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    """All-reduce seconds without the call's fixed cost: best of ring and hierarchical."""
    n = group.size
    if n == 1 or size_bytes <= 0:
        return 0.0
    ring = _ring(2.0 * (n - 1) / n, size_bytes, 2 * (n - 1), group, catalog)
    if not group.spans_nodes or group.ranks_per_node == 1:
        return ring
    k = group.ranks_per_node
    nodes = n // k
    intra_group = group.model_copy(update={"size": k, "ranks_per_node": k})
    inter_group = group.model_copy(update={"size": nodes, "ranks_per_node": 1})
    hierarchical = (
        _reduce_scatter_steps(size_bytes, intra_group, catalog)
        + _all_reduce_steps(size_bytes / k, inter_group, catalog)
        + _reduce_scatter_steps(size_bytes, intra_group, catalog)  # the all-gather moves the same
    )
    return min(ring, hierarchical)


def _reduce_scatter_steps(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    n = group.size
    if n == 1 or size_bytes <= 0:
        return 0.0
    return _ring((n - 1) / n, size_bytes, n - 1, group, catalog)


def all_reduce(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    """Seconds to all-reduce `size_bytes` over the group (best of ring and hierarchical, one call)."""
    steps = _all_reduce_steps(size_bytes, group, catalog)
    return steps + _launch(catalog) if steps else 0.0


def reduce_scatter(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    """Seconds to reduce-scatter `size_bytes` (the unsharded size) over the group."""
    steps = _reduce_scatter_steps(size_bytes, group, catalog)
    return steps + _launch(catalog) if steps else 0.0


def all_gather(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    """Seconds to all-gather into `size_bytes` (the gathered size) over the group."""
    return reduce_scatter(size_bytes, group, catalog)


def all_to_all(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    """Seconds for an all-to-all where each rank holds `size_bytes` to scatter."""
    n = group.size
    if n == 1 or size_bytes <= 0:
        return 0.0
    intra, inter = _rates(group, catalog)
    k = group.ranks_per_node
    intra_time = (k - 1) / n * size_bytes / intra
    inter_time = (n - k) / n * size_bytes / inter if group.spans_nodes else 0.0
    alpha = group.inter_latency if group.spans_nodes else group.intra.latency
    return max(intra_time, inter_time) + (n - 1) * alpha + _launch(catalog)


def node_dispatch(rows: float, row_bytes: float, nodes_per_row: float, ranks_per_row: float, group: CommGroup,
                  catalog: Catalog, nvlink_limit: float | None = None) -> float:
    """Seconds for each rank to dispatch `rows` rows of `row_bytes` when each row goes to `nodes_per_row` distinct
    nodes and `ranks_per_row` distinct ranks of the group on average (or to combine them back: the same bytes).

    Per rank, the remote share of the nodes ((N-1)/N of them, N nodes) leaves on the rank's NIC share, and the
    forwarding rank of each reached node sends the rows on to the other (k-1)/k destination ranks over NVLink,
    at most at `nvlink_limit` bytes/s (the dispatcher's copy kernels, where they and not the link bind)."""
    n, k = group.size, group.ranks_per_node
    if n == 1 or rows <= 0:
        return 0.0
    intra, inter = _rates(group, catalog)
    if nvlink_limit is not None:
        intra = min(intra, nvlink_limit)
    nodes = n // k
    fabric = rows * row_bytes * nodes_per_row * (nodes - 1) / nodes
    nvlink = rows * row_bytes * ranks_per_row * (k - 1) / k
    seconds = max(fabric / inter, nvlink / intra)
    alpha = (nodes - 1) * group.inter_latency + (group.intra.latency if k > 1 else 0.0)
    return seconds + alpha + _launch(catalog)


def point_to_point(size_bytes: float, group: CommGroup, catalog: Catalog) -> float:
    """Seconds to send `size_bytes` between two ranks (inter-node when the group spans nodes)."""
    if size_bytes <= 0:
        return 0.0
    intra, inter = _rates(group, catalog)
    if group.spans_nodes:
        return size_bytes / inter + group.inter_latency
    return size_bytes / intra + group.intra.latency
