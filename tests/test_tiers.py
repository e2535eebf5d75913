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


def test_partial_optimizer_offload_splits_states_and_work():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("pcie-t4:2"), global_batch=16, seq_len=4096,
              precision="fp16")  # T4s have no bf16
    base = "tp=2,mbs=1,zero=3,recompute=full,offload=optimizer"
    whole = evaluate(job, parse_strategy(base))
    half = evaluate(job, parse_strategy(base + ",offload_ratio=0.5"))
    w, h = whole.memory.per_stage[0], half.memory.per_stage[0]
    assert h.host_offload_bytes == pytest.approx(w.host_offload_bytes / 2)
    assert w.optimizer_bytes == 0.0 and h.optimizer_bytes > 0.0  # the other half stays in HBM
    assert half.breakdown.offload_s < whole.breakdown.offload_s
    assert half.breakdown.optimizer_s > whole.breakdown.optimizer_s == 0.0
    for spec in ("zero=2,offload=optimizer,offload_ratio=0.5", "zero=3,offload_ratio=0.5",
                 "zero=3,offload=optimizer,offload_device=nvme,offload_ratio=0.5"):
        with pytest.raises(PlannerInputError, match="offload_ratio"):
            parse_strategy(spec)


# ----------------------------------------------------------------------------- per-stage placement


def test_per_stage_placement_spells_one_value_per_stage():
    s = parse_strategy("tp=2,pp=2,zero=3,offload=all/none,offload_device=nvme/cpu")
    assert s.stage_offload == ("all", "none") and s.stage_offload_device == ("nvme", "cpu")
    assert "offload=all/none" in s.spec() and "offload_device=nvme/cpu" in s.spec()
    assert parse_strategy(s.spec()).spec() == s.spec()
    first, second = s.for_stage(0), s.for_stage(1)
    assert (first.offload, first.offload_device, first.stage_offload) == ("all", "nvme", None)
    assert (second.offload, second.offload_device) == ("none", "cpu")
    assert s.offloads_params and not second.offloads_params
    # the same value on every stage is the plain key
    same = parse_strategy("pp=2,zero=3,offload=optimizer/optimizer,offload_ratio=0.5/0.5")
    assert same.stage_offload is None and same.offload == "optimizer" and same.offload_ratio == 0.5


@pytest.mark.parametrize("spec, message", [
    ("pp=2,zero=1,offload=all/none", "stage 0: offload=all needs zero=3"),
    ("pp=3,zero=3,offload=all/none", "offload has 2 per-stage values, pp=3"),
    ("pp=2,zero=3,offload=optimizer,offload_ratio=0.5/x", "expected numbers per stage"),
    ("pp=2,zero=3,regather=host/network,shard=node", "stage 0: regather=host needs zero=3 and shard=full"),
])
def test_per_stage_placement_errors_name_the_stage_and_key(spec, message):
    with pytest.raises(PlannerInputError, match=message):
        parse_strategy(spec)


def test_each_stage_is_costed_under_its_own_placement():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-a100-40g:1"), global_batch=16, seq_len=4096)
    mixed = evaluate(job, parse_strategy("tp=2,pp=2,mbs=1,zero=3,recompute=full,offload=all/none"))
    whole = evaluate(job, parse_strategy("tp=2,pp=2,mbs=1,zero=3,recompute=full,offload=all"))
    plain = evaluate(job, parse_strategy("tp=2,pp=2,mbs=1,zero=3,recompute=full"))
    s0, s1 = mixed.memory.per_stage
    # stage 0 parks its state like the all-offload plan, stage 1 like the plain one
    assert s0.host_offload_bytes > 0
    assert s0.host_offload_bytes == pytest.approx(whole.memory.per_stage[0].host_offload_bytes)
    assert s0.weights_bytes == 0.0 and s0.optimizer_bytes == 0.0
    assert s1.host_offload_bytes == 0.0 and s1.peak_bytes == pytest.approx(plain.memory.per_stage[1].peak_bytes)
    assert s0.microbatch_time_s == pytest.approx(whole.memory.per_stage[0].microbatch_time_s)
    assert s1.microbatch_time_s == pytest.approx(plain.memory.per_stage[1].microbatch_time_s)
    # after the barrier each stage updates on its own: stage 0's offload ends the step, no more than the
    # slower of the two offloading stages does in the all-offload plan
    assert 0 < mixed.breakdown.offload_s <= whole.breakdown.offload_s
    assert plain.step_time_s < mixed.step_time_s <= whole.step_time_s
