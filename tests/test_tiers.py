"""Memory tiers of dense models: the shared host link, and the FCDP host-memory parameter cache."""

from __future__ import annotations

import pytest

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cost import evaluate
from planner.errors import PlannerInputError
from planner.job import Job
from planner.strategy import parse_strategy

SLOW = "examples/clusters/a100-slow-fabric.yaml"


def test_host_link_is_shared_by_the_gpus_that_stream():
    node = load_catalog().node("dgx-a100-80g")
    assert node.host_bandwidth_per_gpu(1) == 32e9  # one GPU: its own x16 link
    assert node.host_bandwidth_per_gpu(8) == 128e9 / 8  # all eight: four switch uplinks
    cpu = load_catalog().node("cpu")  # no shared figure: every process keeps its own rate
    assert cpu.host_bandwidth_per_gpu(cpu.gpus_per_node) == cpu.pcie_bandwidth


def test_regather_host_needs_zero3_over_the_full_group():
    for spec in ("zero=2,regather=host", "zero=3,shard=node,regather=host"):
        with pytest.raises(PlannerInputError, match="regather=host"):
            parse_strategy(spec)
    assert parse_strategy("zero=3,regather=host").spec().count("regather=host") == 1
    assert "regather" not in parse_strategy("zero=3").spec()  # the default stays out of SPEC strings


def test_fcdp_moves_gathers_off_the_network_into_host_memory():
    job = Job(model=load_model("gpt-neox-20b"), cluster=load_cluster(SLOW), global_batch=256, seq_len=2048)
    base = "tp=2,zero=3,mbs=4,recompute=full"  # dp 16 over 4 nodes, 4 micro-batches per step
    network = evaluate(job, parse_strategy(base))
    host = evaluate(job, parse_strategy(base + ",regather=host"))
    assert host.step_time_s < network.step_time_s
    assert host.breakdown.dp_comm_total_s < network.breakdown.dp_comm_total_s
    stage = host.memory.per_stage[0]
    # one gathered copy per node, split over the 4 members of the sharding group on each node (tp=2 of 8 GPUs)
    assert stage.host_offload_bytes == pytest.approx(stage.params * 2.0 / 4)
    assert network.memory.per_stage[0].host_offload_bytes == 0.0
    assert stage.peak_bytes == pytest.approx(network.memory.per_stage[0].peak_bytes)  # HBM is ZeRO-3's
