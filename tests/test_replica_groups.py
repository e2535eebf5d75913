"""Replica groups on mixed clusters: a strategy and a batch share per pool (planner.cost.replica_groups,
planner.search.replica_groups), held to a brute-force oracle, and their plan, report and CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import cli
from planner.cost.replica_groups import evaluate_groups, sync_seconds
from planner.errors import GroupPlanError
from planner.plan.runnable import strategy_problem
from planner.search.exhaustive import batch_splits, exhaustive_groups
from planner.plan.assemble import build_plan
from planner.plan.schema import Plan, ReplicaGroupsStrategy, plan_json
from planner.plan.report import render_report
from planner.search.compile import _search_groups, compile_job
from planner.search.ilp.tables import TableBuilder
from planner.search.result import CompileOptions
from planner.search.replica_groups import compute_floor, proportional, share_grid
from planner.search.space import SpaceOptions, narrow_to_runtime
from planner.search.state import Search
from hardware import load_catalog
from test_compile import PROPERTY, SMALL, _cluster, _job, _model, assert_matches_oracle

A100_H100 = _cluster("a100-h100", ("a100", "dgx-a100-80g", 2), ("h100", "dgx-h100", 2))
A100X4_H100 = _cluster("a100x4-h100", ("a100", "dgx-a100-80g", 4), ("h100", "dgx-h100", 2))
WIDE = _model(2, 8192, 64, 8, 28672, 32000)  # 1.9 B parameters in two wide blocks


# enough sequences per GPU that compute, not the fixed per-kernel costs both pools pay alike, sets the step
def _faster_pool_job():
    return _job(_model(4, 256, 4, 2, 768, 512), A100_H100, batch=128, seq=2048)


def test_faster_pool_takes_more_of_the_batch():
    result = compile_job(_faster_pool_job(), CompileOptions(space=SpaceOptions(**SMALL)))
    assert result.certificate.status == "OPTIMAL" and result.groups is not None
    batches = {g.group.pool: g.group.batch for g in result.groups.groups}
    assert batches["h100"] > batches["a100"] > 0 and sum(batches.values()) == 128


@pytest.mark.long
def test_faster_pool_split_is_the_exhaustive_optimum():
    # the brute force over every share and every pool strategy (25 CPU-s; the hypothesis test below holds
    # compile == exhaustive on smaller mixed jobs in the default run)
    result, _ = assert_matches_oracle(_faster_pool_job(), SpaceOptions(**SMALL))
    assert result.groups is not None


def test_each_pool_gets_its_own_tensor_parallel_degree():
    # 4 A100s and 2 H100s: the A100 group shards over tp=4, the H100 group over tp=2
    space = SpaceOptions(**SMALL, fixed={"cp": 1})
    job = _job(WIDE, A100X4_H100, batch=16, seq=4096)
    result, _ = assert_matches_oracle(job, space)
    tps = {g.group.pool: g.group.strategy.tp for g in result.groups.groups}
    assert tps == {"a100": 4, "h100": 2}
    # the split the oracle also finds: the A100s take 7 of 16 since their flash attention runs at 0.70 of their GEMM
    # rate and the H100s' FlashAttention-2 at 0.38 (hardware/data/attention.yaml)
    assert [g.group.batch for g in result.groups.groups] == [7, 9]


@st.composite
def mixed_jobs(draw):
    heads = draw(st.sampled_from([2, 4]))
    hidden = heads * draw(st.sampled_from([32, 64]))
    model = _model(layers=draw(st.integers(2, 4)), hidden=hidden, heads=heads, kv_heads=heads // 2 or 1,
                   ffn=hidden * 3, vocab=draw(st.integers(64, 512)))
    slow = draw(st.sampled_from(["pcie-l4", "dgx-a100-40g", "dgx-a100-80g"]))
    cluster = _cluster("mix", ("slow", slow, draw(st.sampled_from([1, 2]))), ("fast", "dgx-h100", 2))
    job = _job(model, cluster, draw(st.sampled_from([8, 16])), draw(st.sampled_from([256, 1024])))
    return job, SpaceOptions(**SMALL, zero_stages=draw(st.sampled_from([(0,), (1,), (0, 3)])))


@settings(PROPERTY, max_examples=12)
@given(mixed_jobs())
def test_compile_matches_exhaustive_with_replica_groups(case):
    assert_matches_oracle(*case)


# ---------------------------------------------------------------------------- the cost of a group plan


def _groups():
    job = _job(WIDE, A100X4_H100, batch=16, seq=4096)
    result = compile_job(job, CompileOptions(space=SpaceOptions(**SMALL, fixed={"cp": 1})))
    return job, result


def test_group_step_is_the_slowest_group_plus_the_sync():
    job, result = _groups()
    groups = [g.group for g in result.groups.groups]
    again = evaluate_groups(job, groups)
    slowest = max(g.estimate.step_time_s for g in again.groups)
    assert again.step_time_s == pytest.approx(slowest + again.sync_s)
    # sync: a ring over 2 groups moves the fp32 gradient once at the slower group's NIC rate
    cluster, catalog = job.cluster, load_catalog()
    rate = min(cluster.pool(p).gpus * cluster.inter_node_bandwidth_per_gpu(p) for p in ("a100", "h100"))
    want = job.model.params * 4.0 / (rate * catalog.constant("network_efficiency")) + 2 * cluster.fabric.latency
    assert again.sync_s == pytest.approx(want)
    assert sync_seconds(job, ["h100"], catalog) == 0.0
    assert again.tokens_per_s == pytest.approx(16 * 4096 / again.step_time_s)
    with pytest.raises(ValueError, match="sum to 15"):
        evaluate_groups(job, [groups[0].model_copy(update={"batch": groups[0].batch - 1}), groups[1]])


def test_compute_floor_is_below_every_compiled_group():
    job, result = _groups()
    catalog = load_catalog()
    for scored in result.groups.groups:
        g = scored.group
        assert compute_floor(job, g.pool, g.batch, catalog) < scored.estimate.step_time_s


def test_share_grid_and_proportional_split():
    assert [share_grid(b) for b in (1, 6, 8, 48, 1024, 1536)] == [1, 2, 8, 16, 16, 16]
    split = proportional(16, {"a": 1.0, "b": 3.0})
    assert sum(split.values()) == 16 and split["b"] > 2 * split["a"] >= 2
    assert proportional(1, {"a": 1.0, "b": 1.0}) == {}  # every pool needs a share
    assert sorted(batch_splits(2, 3)) == [(0, 3), (1, 2), (2, 1), (3, 0)]


def test_grain_rule_keeps_strategies_legal_on_fewer_shares():
    job, result = _groups()
    grain = job.global_batch // share_grid(job.global_batch)
    for scored in result.groups.groups:
        s = scored.group.strategy
        assert grain % (s.dp * s.mbs) == 0
    oracle = exhaustive_groups(job, SpaceOptions(**SMALL, fixed={"cp": 1}))
    assert oracle is not None and oracle[1] == pytest.approx(result.groups.step_time_s, rel=1e-6)


@pytest.mark.parametrize("start", ["none", "above", "below"])
def test_group_search_from_any_incumbent_ends_at_the_exhaustive_split(start):
    # the compile hands the groups its configurations' best plan (compile._search_groups); without one they
    # water-fill.  From no incumbent, or one above the best split, they end at the brute force's split (its shares
    # compiled to their optimum, whatever the first plan each existence question found); from one below it no
    # split beats it and the bound is the incumbent itself (the proof completed)
    job = _job(WIDE, A100X4_H100, batch=16, seq=4096)
    space = SpaceOptions(**SMALL, fixed={"cp": 1})
    groups, best = exhaustive_groups(job, space)
    incumbent = {"none": float("inf"), "above": 1.2 * best, "below": 0.99 * best}[start]
    options = CompileOptions(space=narrow_to_runtime(space, job.runtime, job), work_limit=10)  # no wall clock
    search = Search(job=job, options=options, catalog=load_catalog(), builder=TableBuilder(job, load_catalog()),
                    progress=None)
    search.incumbent = incumbent
    grouped = _search_groups(search)
    assert not grouped.stopped
    if start == "below":
        assert grouped.groups is None and grouped.bound == pytest.approx(incumbent, rel=1e-9)
        return
    assert grouped.objective == pytest.approx(best, rel=1e-6) and grouped.bound == grouped.objective
    assert [(g.pool, g.batch) for g in grouped.groups] == [(g.pool, g.batch) for g in groups]
    assert evaluate_groups(job, grouped.groups).step_time_s == pytest.approx(best, rel=1e-6)
    assert all(result.certificate.status == "OPTIMAL" for result in grouped.results.values())


# ---------------------------------------------------------------------------- plan, report, CLI


def test_group_plan_lists_each_group_with_its_own_plan():
    job, result = _groups()
    options = CompileOptions(space=SpaceOptions(**SMALL, fixed={"cp": 1}))
    plan = build_plan(job, result, options)
    assert plan_json(plan) == plan_json(build_plan(job, result, options))  # deterministic
    assert plan.layout is None and plan.stages == [] and plan.time.micro_batches == 0
    assert [(g.pool, g.batch, g.first_rank, g.first_node) for g in plan.groups] == [("a100", 7, 0, 0),
                                                                                    ("h100", 9, 4, 1)]
    # the typed replica-group strategy: each group's pool, batch and strategy, and the sync
    assert isinstance(plan.strategy, ReplicaGroupsStrategy)
    assert [(s.pool, s.batch) for s in plan.strategy.replica_groups] == [(g.pool, g.batch) for g in plan.groups]
    assert [s.model_dump(exclude={"pool", "batch"}) for s in plan.strategy.replica_groups] == \
        [g.plan.strategy.model_dump() for g in plan.groups]
    assert plan.strategy.sync_s == pytest.approx(result.groups.sync_s)
    assert list(json.loads(plan_json(plan))["strategy"]["replica_groups"][0])[:3] == ["pool", "batch", "tp"]
    assert Plan.model_validate_json(plan_json(plan)) == plan
    assert strategy_problem(plan.strategy).startswith("a replica-group plan")  # the torch runtime refuses it
    # the narrowing accessors: one strategy (and rank layout) only from a single-strategy plan or result
    with pytest.raises(GroupPlanError, match="replica-group plan \\(2 groups"):
        plan.single_strategy
    with pytest.raises(GroupPlanError, match="no single rank layout"):
        plan.rank_layout
    with pytest.raises(GroupPlanError):
        result.single_strategy
    with pytest.raises(GroupPlanError):
        result.single_estimate
    assert result.replica_groups is result.groups
    for g in plan.groups:
        assert g.plan.single_strategy is g.plan.strategy and g.plan.rank_layout is g.plan.layout
        with pytest.raises(GroupPlanError, match="no replica groups"):
            result.group_results[g.pool].replica_groups
    for g in plan.groups:
        assert g.plan.job.global_batch == g.batch and g.plan.job.num_gpus == g.plan.job.cluster_gpus
        assert g.plan.stages and g.plan.strategy_spec in plan.strategy_spec
        assert g.plan.time.step_time_s == pytest.approx(
            evaluate_groups(job, [x.group for x in result.groups.groups]).groups[plan.groups.index(g)]
            .estimate.step_time_s)
    assert plan.time.step_time_s == pytest.approx(result.groups.step_time_s)
    assert plan.job.num_gpus == 6
    report = render_report(plan)
    assert "## Replica groups" in report and "## Group a100: batch 7" in report and "### Stages" in report


def test_cli_compiles_replica_groups_and_refuses_single_strategy_targets(tmp_path, mixed_job_files):
    spec, cluster = mixed_job_files
    args = ["compile", str(spec), str(cluster), "-b", "16", "-s", "4096", "--fix", "cp=1"]
    out = tmp_path / "out"
    run = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert run.exit_code == 0, run.output
    assert "replica groups" in run.output and "a100" in run.output
    assert "note: no deepspeed/ files: a replica-group plan" in run.output
    plan = json.loads((out / "plan.json").read_text())
    assert [g["pool"] for g in plan["groups"]] == ["a100", "h100"]
    assert "## Replica groups" in (out / "report.md").read_text()
    # a named target narrows the search to what it runs: one strategy over every rank
    single = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "mg"), "--target", "megatron"])
    assert single.exit_code == 0, single.output
    plan = json.loads((tmp_path / "mg" / "plan.json").read_text())
    assert plan["groups"] == [] and (tmp_path / "mg" / "megatron" / "args.txt").exists()
