"""MoE token dispatchers (issue #28, "EP across nodes"): the expected destinations of a token under
group-limited routing against brute-force enumeration, the node-deduplicated dispatch against hand-worked
bytes and rates, and the dispatcher as a strategy field that runtimes accept or refuse."""

from __future__ import annotations

import itertools

import pytest

from benches import load_bench
from conftest import make_job
from hardware import collectives as coll
from hardware import load_catalog
from models.graph import LayerKind, MoEShape
from models.transformer import MoEConfig
from planner import api
from planner.cost import evaluate
from planner.cost.comm import dispatch_seconds
from planner.cost.dispatch import expected_destinations
from planner.cost.layout import place_stages, stage_comms
from planner.errors import InfeasibleError, PlannerInputError
from planner.profile import load_runtime
from planner.strategy import Strategy, parse_strategy


def _brute_force(units: int, experts: int, top_k: int, groups: int, group_topk: int) -> float:
    """Mean distinct units over every (chosen groups, top_k experts among them) pair, each equally likely."""
    per_group, per_unit = experts // groups, experts // units
    total, count = 0.0, 0
    for chosen in itertools.combinations(range(groups), group_topk):
        usable = [e for g in chosen for e in range(g * per_group, (g + 1) * per_group)]
        for picked in itertools.combinations(usable, top_k):
            total += len({e // per_unit for e in picked})
            count += 1
    return total / count


@pytest.mark.parametrize("units, experts, top_k, groups, group_topk", [
    (4, 16, 3, 1, 1),  # no group limit
    (4, 16, 3, 4, 2),  # one group per unit (DeepSeek-V3's node-limited routing at ep = 8 x nodes)
    (2, 16, 3, 4, 2),  # two groups per unit
    (8, 16, 3, 4, 2),  # a group spans two units
    (16, 16, 4, 8, 3),  # one expert per unit: distinct units are distinct experts
])
def test_expected_destinations_match_enumeration(units, experts, top_k, groups, group_topk):
    moe = MoEShape(num_experts=experts, top_k=top_k, expert_ffn=8, router_groups=groups,
                   router_group_topk=group_topk)
    assert expected_destinations(units, moe) == pytest.approx(_brute_force(units, experts, top_k, groups,
                                                                            group_topk), rel=1e-12)


def test_expected_destinations_by_hand():
    # one unit: every token reaches it; one expert per unit, no limit: top_k distinct units
    moe = MoEShape(num_experts=8, top_k=2, expert_ffn=8)
    assert expected_destinations(1, moe) == 1.0
    assert expected_destinations(8, moe) == pytest.approx(2.0)
    # 2 units of 4 experts, top-2: missed with probability C(4,2)/C(8,2) = 6/28, so 2 x 22/28 reached
    assert expected_destinations(2, moe) == pytest.approx(2 * 22 / 28)
    # groups that do not nest with the units (3 groups of 4, 4 units of 3) are priced without the limit
    odd = MoEShape(num_experts=12, top_k=2, expert_ffn=8, router_groups=3, router_group_topk=1)
    free = MoEShape(num_experts=12, top_k=2, expert_ffn=8)
    assert expected_destinations(4, odd) == expected_destinations(4, free)


def test_node_limited_routing_caps_the_nodes_a_token_reaches():
    # DeepSeek-V3 (256 experts, top-8, 4 of 8 groups) over 8 nodes: at most 4 nodes, against 5.3 unlimited
    limited = MoEShape(num_experts=256, top_k=8, expert_ffn=2048, router_groups=8, router_group_topk=4)
    free = MoEShape(num_experts=256, top_k=8, expert_ffn=2048)
    assert 3.5 < expected_destinations(8, limited) <= 4.0 < 5.0 < expected_destinations(8, free) < 8.0


@pytest.mark.parametrize("groups, group_topk, message", [
    (3, 1, "must divide num_experts"), (4, 5, "exceeds router_groups"), (8, 1, "hold fewer than top_k")])
def test_router_groups_are_checked(groups, group_topk, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(num_experts=16, top_k=4, expert_ffn=8, router_groups=groups, router_group_topk=group_topk)


def test_node_dispatch_by_hand():
    catalog = load_catalog()
    job = make_job("mixtral-8x7b", "dgx-h100:2", 64, 4096)
    strategy = Strategy(ep=16, dp=16)
    group = stage_comms(job, strategy, place_stages(job, strategy, catalog)[0].site).ep
    assert (group.size, group.ranks_per_node) == (16, 8)
    rows, row, nodes, ranks = 1000.0, 8192.0, 1.5, 3.0
    nic = group.inter_bandwidth * catalog.constant("network_efficiency")
    nvlink = group.intra.bandwidth * catalog.constant("nvlink_efficiency")
    # remote nodes: 1.5 x (2-1)/2 per row on the NIC; forwarded ranks: 3 x 7/8 per row on NVLink
    wire = max(rows * row * 0.75 / nic, rows * row * 3 * 7 / 8 / nvlink)
    fixed = group.inter_latency + group.intra.latency + catalog.constant("collective_launch_seconds")
    assert coll.node_dispatch(rows, row, nodes, ranks, group, catalog) == pytest.approx(wire + fixed)
    # a copy-rate limit below the link's rate slows only the NVLink share
    limited = coll.node_dispatch(rows, row, nodes, ranks, group, catalog, nvlink_limit=1e9)
    assert limited == pytest.approx(max(rows * row * 0.75 / nic, rows * row * 3 * 7 / 8 / 1e9) + fixed)


def test_deepep_sends_fewer_fabric_bytes_than_the_all_to_all():
    # DeepSeek-V3 over 4 nodes (ep=32): NCCL sends top_k = 8 rows per token, 6 of them to other nodes; DeepEP
    # one row per remote node (2.2 expected of 3 under node-limited routing), so the NIC-bound call is
    # 6 / 2.2 = 2.7x shorter, less its fixed latency
    catalog = load_catalog()
    job = make_job("deepseek-v3", "dgx-h100:4", 64, 4096)
    layer = next(layer for layer in job.model.layers if layer.kind == LayerKind.MOE)
    seconds = {}
    for dispatcher in ("alltoall", "deepep"):
        strategy = Strategy(ep=32, dp=32, dispatcher=dispatcher)
        groups = stage_comms(job, strategy, place_stages(job, strategy, catalog)[0].site)
        seconds[dispatcher] = dispatch_seconds(layer, 4096.0, 2.0, strategy, groups, catalog)
    remote = expected_destinations(4, layer.moe_shape) * 3 / 4
    assert 2.0 < remote < 2.4
    assert seconds["alltoall"] / seconds["deepep"] == pytest.approx(6 / remote, rel=0.02)


def test_dispatcher_is_a_strategy_field():
    strategy = parse_strategy("ep=8,dispatcher=deepep")
    assert strategy.dispatcher == "deepep" and "dispatcher=deepep" in strategy.spec()
    assert parse_strategy(strategy.spec()).spec() == strategy.spec()  # round-trips
    assert "dispatcher" not in parse_strategy("ep=8").spec()  # the default spells nothing
    with pytest.raises(PlannerInputError, match="dispatcher=hybridep needs ep > 1"):
        parse_strategy("dispatcher=hybridep")
    with pytest.raises(PlannerInputError, match="dispatcher"):
        parse_strategy("ep=8,dispatcher=nccl")


@pytest.mark.parametrize("runtime, accepted", [("megatron", True), ("megatron-bridge", True),
                                                ("torchtitan-eager", False), ("deepspeed", False)])
def test_only_megatron_runtimes_run_deepep(runtime, accepted):
    refusals = load_runtime(runtime).cannot_express(Strategy(ep=8, dispatcher="deepep"), model_has_experts=True)
    assert ("dispatcher=deepep" not in refusals) == accepted


def test_the_rows_say_which_dispatcher_they_ran():
    # each row's own source: the Megatron-MoE-ModelZoo table's dispatcher column (DeepEP), NeMo 25.07's
    # performance script on H100 (flex + DeepEP), Megatron-Bridge's Qwen3-30B H100 preset (HybridEP); NeMo
    # 25.04's DeepSeek-V3 and Megatron-Bridge's Qwen3-235B H100 recipes run the alltoall dispatcher
    bench = load_bench("published_runs")
    data = bench.ROOT / "tests" / "data"
    rows = {row["id"]: row for name in ("published_runs.csv", "holdout_runs.csv", "holdout2_runs.csv")
            for row in bench.read_rows("all", path=data / name)}
    expected = {"1020": "deepep", "1021": "deepep", "1022": "deepep", "2011": "deepep", "406": "hybridep",
                "401": "alltoall", "402": "alltoall", "405": "alltoall", "407": "alltoall", "1025": "alltoall"}
    cases = {row_id: bench.build_case(rows[row_id]) for row_id in expected}
    assert {row_id: case.strategy.dispatcher for row_id, case in cases.items()} == expected
    # DeepSeek-V3 rows route to 4 of 8 expert groups (NeMo's DeepSeekV3Config), the Qwen3 rows without a limit
    moe = {row_id: next(layer.moe_shape for layer in case.job.model.layers if layer.moe is not None)
           for row_id, case in cases.items()}
    assert (moe["2011"].router_groups, moe["2011"].router_group_topk) == (8, 4)
    assert (moe["1020"].router_groups, moe["1020"].router_group_topk) == (1, 1)


def test_evaluate_prices_the_strategys_dispatcher():
    # DeepSeek-V3 on 512 H100, expert groups of 64 ranks over 8 nodes, under Megatron: the all-to-all sends
    # 8 x 7/8 = 7 rows per token off the node, DeepEP 3.6 x 7/8 = 3.2 (one per remote node reached), so its
    # NIC-bound expert-parallel seconds are under half; nothing else of the step moves
    from planner.cost import evaluate

    job = make_job("deepseek-v3", "dgx-h100:64", 512, 4096, runtime=load_runtime("megatron"), moe_routing="balanced")
    estimates = {d: evaluate(job, parse_strategy(f"tp=2,pp=8,ep=64,etp=1,zero=1,recompute=full,dispatcher={d}"))
                 for d in ("alltoall", "deepep")}
    alltoall, deepep = (estimates[d].breakdown for d in ("alltoall", "deepep"))
    assert 0 < deepep.ep_comm_s < alltoall.ep_comm_s / 2
    assert deepep.compute_s == alltoall.compute_s and deepep.dp_comm_s == alltoall.dp_comm_s


def test_compile_searches_deepep_only_where_the_build_has_it():
    # experts spread over four nodes (--fix ep=32): DeepEP sends a token over the fabric once per destination
    # node instead of once per destination rank, so where the build has it the search takes it
    job = api.load_job("qwen3-30b-a3b", "dgx-h100:4", batch=256, seq_len=4096, runtime="megatron")
    default = api.compile(job, fixed={"ep": 32}, targets=("megatron",))
    with_deepep = api.compile(job, fixed={"ep": 32}, targets=("megatron",), dispatchers=("alltoall", "deepep"))
    assert default.plan.strategy.dispatcher == "alltoall"
    assert with_deepep.plan.strategy.dispatcher == "deepep"
    assert with_deepep.plan.time.step_time_s < default.plan.time.step_time_s
    assert evaluate(job, parse_strategy(with_deepep.plan.strategy_spec)).step_time_s == pytest.approx(
        with_deepep.plan.time.step_time_s, rel=1e-9)
    args = with_deepep.files()["megatron/args.txt"]
    assert "--moe-token-dispatcher-type flex" in args and "--moe-flex-dispatcher-backend deepep" in args


def test_fixing_a_dispatcher_gives_the_build_that_dispatcher():
    job = api.load_job("qwen3-30b-a3b", "dgx-h100:4", batch=256, seq_len=4096, runtime="megatron")
    options = api._options(job, (), {"ep": 32, "dispatcher": "deepep"}, "time", None, 10, None, "always")
    assert options.space.dispatchers == ("alltoall", "deepep")
    # a runtime that does not run it says so in the no-legal-strategy line
    deepspeed = api.load_job("mixtral-8x7b", "dgx-h100:4", batch=256, seq_len=4096, runtime="deepspeed")
    with pytest.raises(InfeasibleError, match=r"no dispatcher=deepep \(the runtime does not run it\)"):
        api.compile(deepspeed, fixed={"ep": 8, "dispatcher": "deepep"})
