"""Alpha-beta collective timings: the textbook volumes, the slowest link, NIC sharing."""

from __future__ import annotations

import pytest

from hardware import load_catalog, load_cluster
from hardware import collectives as coll
from hardware.collectives import CommGroup

CATALOG = load_catalog()
NODE = load_cluster("dgx-h100:1").pools[0].node
NVLINK = NODE.intra_link.bandwidth * CATALOG.constant("nvlink_efficiency")
NIC = NODE.nic_bandwidth_per_gpu * CATALOG.constant("network_efficiency")
LAUNCH = CATALOG.constant("collective_launch_seconds")  # fixed cost of one collective call (NCCL's base latency)
S = 1e9


def group(size: int, per_node: int) -> CommGroup:
    return CommGroup(size=size, ranks_per_node=per_node, intra=NODE.intra_link,
                     inter_bandwidth=NODE.nic_bandwidth_per_gpu, inter_latency=5e-6)


def test_intra_node_ring_all_reduce_volume():
    n = 8
    expected = 2 * (n - 1) / n * S / NVLINK + 2 * (n - 1) * NODE.intra_link.latency + LAUNCH
    assert coll.all_reduce(S, group(n, n), CATALOG) == pytest.approx(expected)


def test_reduce_scatter_and_all_gather_are_half_an_all_reduce():
    g = group(8, 8)
    rs = coll.reduce_scatter(S, g, CATALOG)
    assert coll.all_gather(S, g, CATALOG) == pytest.approx(rs)
    # one call each: the all-reduce moves twice the bytes in twice the steps but pays one launch
    assert coll.all_reduce(S, g, CATALOG) == pytest.approx(2 * rs - LAUNCH)


def test_one_rank_per_node_is_limited_by_the_nic_share():
    n = 16
    expected = 2 * (n - 1) / n * S / NIC + 2 * (n - 1) * 5e-6 + LAUNCH
    assert coll.all_reduce(S, group(n, 1), CATALOG) == pytest.approx(expected)


def test_more_ranks_per_node_use_more_nics_and_hierarchy_never_loses():
    flat = coll.all_reduce(S, group(64, 1), CATALOG)
    packed = coll.all_reduce(S, group(64, 8), CATALOG)
    assert packed < flat
    ring_only = 2 * 63 / 64 * S / min(NVLINK, 8 * NIC) + 2 * 63 * 5e-6 + LAUNCH
    assert packed <= ring_only + 1e-12


def test_all_to_all_splits_intra_and_inter_node_shares():
    n, k = 16, 8
    t = coll.all_to_all(S, group(n, k), CATALOG)
    inter = (n - k) / n * S / NIC
    assert t == pytest.approx(inter + (n - 1) * 5e-6 + LAUNCH)
    assert coll.all_to_all(S, group(8, 8), CATALOG) < t


def test_point_to_point_and_trivial_groups():
    assert coll.point_to_point(S, group(2, 2), CATALOG) == pytest.approx(S / NVLINK + NODE.intra_link.latency)
    assert coll.point_to_point(S, group(2, 1), CATALOG) == pytest.approx(S / NIC + 5e-6)
    assert coll.all_reduce(S, group(1, 1), CATALOG) == 0.0
    assert coll.all_to_all(0.0, group(8, 8), CATALOG) == 0.0


def test_each_call_pays_the_launch_once_and_small_messages_feel_it():
    # ring or hierarchy (three phases, still one NCCL call): one launch either way
    g = group(64, 8)
    ring = 2 * 63 / 64 * S / min(NVLINK, 8 * NIC) + 2 * 63 * 5e-6
    phases = (7 / 8 * S / NVLINK + 7 * NODE.intra_link.latency) * 2 + 2 * 7 / 8 * (S / 8) / NIC + 14 * 5e-6
    assert coll.all_reduce(S, g, CATALOG) == pytest.approx(min(ring, phases) + LAUNCH)
    # a 4 KB all-reduce inside a node costs its 14 steps and the launch, however few its bytes
    tiny = coll.all_reduce(4096.0, group(8, 8), CATALOG)
    assert tiny == pytest.approx(2 * 7 / 8 * 4096 / NVLINK + 14 * NODE.intra_link.latency + LAUNCH)
    assert LAUNCH / tiny > 0.2
    assert LAUNCH / coll.all_reduce(S, group(8, 8), CATALOG) < 0.002  # a gigabyte does not notice


def test_pcie_nodes_are_slower_inside_the_node():
    l4 = load_cluster("pcie-l4:1").pools[0].node
    g = CommGroup(size=8, ranks_per_node=8, intra=l4.intra_link, inter_bandwidth=l4.nic_bandwidth_per_gpu,
                  inter_latency=5e-6)
    assert coll.all_reduce(S, g, CATALOG) > 5 * coll.all_reduce(S, group(8, 8), CATALOG)


def test_group_cannot_have_more_ranks_per_node_than_ranks():
    with pytest.raises(ValueError):
        group(2, 4)
