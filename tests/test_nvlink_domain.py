"""GB200 NVL72: a 72-GPU NVLink domain of 18 four-GPU trays, priced at NVLink inside a rack and at the NICs across.

Expected times are worked by hand from the ring / all-to-all formulas of the DESIGN notes and the catalog's
figures: NVLink 5 900 GB/s per direction at constants.yaml's nvlink_efficiency 0.80 (720 GB/s achieved), one
400 Gb/s NIC per GPU (50 GB/s) at network_efficiency 0.85 (42.5 GB/s), link latency 2 us on NVLink and 5 us on
the fabric, and 8.4 us of NCCL base latency per collective call.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hardware import collectives as coll
from hardware import load_catalog, load_cluster
from planner.cli import cli
from planner.cost.layout import place_stages, stage_comms
from planner.strategy import parse_strategy
from planner.validation import check_strategy
from tests.conftest import make_job

NVLINK = 900e9 * 0.80  # achieved NVLink bytes/s per direction
NIC = 50e9 * 0.85  # achieved NIC bytes/s per GPU
LAUNCH = 8.4e-6
GB = 1e9


def _groups(cluster, spec: str, model: str = "llama3-70b", batch: int = 576):
    job = make_job(model, cluster, batch=batch, seq=4096)
    strategy = check_strategy(job, parse_strategy(spec))
    return [stage_comms(job, strategy, stage.site) for stage in place_stages(job, strategy, load_catalog())]


def _trays_without_domain(tmp_path, trays: int):
    """The same GB200 trays with the NVLink domain cut at the tray (each tray its own domain, as on a DGX)."""
    path = tmp_path / "trays.yaml"
    path.write_text("pools:\n  - {name: trays, preset: gb200-nvl72, nodes: %d, overrides: {nvlink_domain_nodes: 1}}\n"
                    % trays)
    return load_cluster(str(path))


def test_preset_is_trays_of_four_in_racks_of_eighteen():
    # gb200-nvl72:N counts compute trays, the nodes Slurm schedules: 18 of them are one rack of 72 GPUs
    cluster = load_cluster("gb200-nvl72:36")
    pool = cluster.pools[0]
    assert (cluster.num_nodes, cluster.num_gpus, pool.node.gpus_per_node) == (36, 144, 4)
    assert pool.nvlink_domain_gpus == 72
    assert load_cluster("gb200-nvl72:2").pools[0].nvlink_domain_gpus == 8  # a partial rack: its own trays
    device = load_catalog().device("gb200")
    assert device.peak("bf16") == pytest.approx(360e15 / 72 / 2)  # NVL72: 360 PF sparse BF16 per rack
    assert device.peak("fp8") == pytest.approx(720e15 / 72 / 2)
    assert device.hbm_bytes == pytest.approx(13.4e12 / 72, rel=0.01)  # 13.4 TB HBM3e per rack
    assert "NVLink domains of 72 GPUs" in cluster.describe()


def test_tp8_across_two_trays_in_a_rack_costs_nvlink(tmp_path):
    # tp=8 spans trays 0 and 1 (4 GPUs each); in the rack both are one NVLink domain
    size = 1.0 * GB
    rack = _groups("gb200-nvl72:18", "tp=8,pp=1,sp=on")[0].tp
    assert not rack.spans_nodes and rack.intra.bandwidth == 900e9
    ring = 2 * 7 / 8 * size / NVLINK + 2 * 7 * 2e-6 + LAUNCH  # 2.44 ms
    assert coll.all_reduce(size, rack, load_catalog()) == pytest.approx(ring, rel=1e-9)
    # the same trays with the domain cut at the tray: the best of ring and hierarchical over the NICs
    split = _groups(_trays_without_domain(tmp_path, 18), "tp=8,pp=1,sp=on")[0].tp
    assert split.spans_nodes and split.ranks_per_node == 4
    flat = 2 * 7 / 8 * size / min(NVLINK, 4 * NIC) + 2 * 7 * 5e-6  # ring over 2 trays: 10.36 ms
    in_tray = 3 / 4 * size / NVLINK + 3 * 2e-6  # reduce-scatter (and all-gather) over 4
    hierarchical = 2 * in_tray + 2 * 1 / 2 * (size / 4) / NIC + 2 * 5e-6  # 8.00 ms
    expected = min(flat, hierarchical) + LAUNCH
    assert coll.all_reduce(size, split, load_catalog()) == pytest.approx(expected, rel=1e-9)
    assert expected > 3 * ring


def test_expert_parallel_64_inside_a_rack_is_nvlink_and_across_nodes_is_not():
    size = 1.0 * GB
    # DeepSeek-V3's 256 experts over ep=64 ranks 0..63: one rack of trays, but 8 DGX B200 nodes
    rack = _groups("gb200-nvl72:16", "tp=1,pp=1,ep=64,zero=1", model="deepseek-v3", batch=64)[0].ep
    assert rack.size == 64 and not rack.spans_nodes
    expected = 63 / 64 * size / NVLINK + 63 * 2e-6 + LAUNCH
    assert coll.all_to_all(size, rack, load_catalog()) == pytest.approx(expected, rel=1e-9)
    dgx = _groups("dgx-b200:8", "tp=1,pp=1,ep=64,zero=1", model="deepseek-v3", batch=64)[0].ep
    assert dgx.spans_nodes and dgx.ranks_per_node == 8
    # 56 of 64 shares leave the node at one NIC per GPU: the NIC term dominates
    nic = max(7 / 64 * size / NVLINK, 56 / 64 * size / NIC) + 63 * 5e-6 + LAUNCH
    assert coll.all_to_all(size, dgx, load_catalog()) == pytest.approx(nic, rel=1e-9)


def test_a_group_across_racks_pays_the_nic():
    # two racks, pp=2 with 72 ranks per stage: the stage boundary is the rack boundary
    groups = _groups("gb200-nvl72:36", "tp=8,pp=2,sp=on")
    pp = groups[0].pp
    assert pp.spans_nodes
    size = 0.1 * GB
    assert coll.point_to_point(size, pp, load_catalog()) == pytest.approx(size / NIC + 5e-6, rel=1e-9)
    # the data-parallel group of 9 (stride 8) stays in its rack: NVLink ring
    dp = groups[0].dp
    assert dp.size == 9 and not dp.spans_nodes
    expected = 8 / 9 * size / NVLINK + 8 * 2e-6 + LAUNCH
    assert coll.reduce_scatter(size, dp, load_catalog()) == pytest.approx(expected, rel=1e-9)


def test_estimate_scores_the_rack_and_data_parallel_stays_on_nvlink(tmp_path):
    # the same 72 GPUs: one NVL72 rack against trays whose domain is the tray; only communication differs
    spec = "tp=2,pp=4,sp=on,zero=1"
    args = ["estimate", "llama3-70b", "-b", "576", "-s", "8192", "--runtime", "megatron", "--strategy", spec,
            "--json"]
    _trays_without_domain(tmp_path, 18)  # writes trays.yaml
    runner = CliRunner()
    rack = runner.invoke(cli, args[:2] + ["gb200-nvl72:18"] + args[2:])
    split = runner.invoke(cli, args[:2] + [str(tmp_path / "trays.yaml")] + args[2:])
    assert rack.exit_code == 0, rack.output
    assert split.exit_code == 0, split.output
    one, cut = json.loads(rack.output), json.loads(split.output)
    assert one["breakdown"]["compute_s"] == pytest.approx(cut["breakdown"]["compute_s"], rel=1e-12)
    assert one["breakdown"]["dp_comm_total_s"] < cut["breakdown"]["dp_comm_total_s"] / 3
    assert one["step_time_s"] < cut["step_time_s"]
