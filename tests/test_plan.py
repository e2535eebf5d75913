"""The Plan, report.md, atomic output and `planner compile` / `planner schema`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from hardware import load_cluster
from models import load_model
from planner.cli import cli
from planner.errors import PlannerInputError
from planner.search.explain import explain_infeasible
from planner.job import Job
from planner.plan.output import write_outputs
from planner.plan.build import rank_location
from planner.plan.assemble import build_plan
from planner.plan.schema import GroupStrategy, Plan, ReplicaGroupsStrategy, plan_json, plan_json_schema
from planner.plan.report import render_report
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions
from planner.strategy import Strategy

TINY = ["tiny-llama", "cpu:1", "--batch", "8", "--seq-len", "128"]
MID = ["llama3-8b", "dgx-h100:2", "--batch", "16", "--seq-len", "4096", "--work-limit", "30"]
# the reference runtime: its ZeRO-3 gathers 16-bit layers, so more CPU "nodes" do fit (the planner runtime's fp32
# gathers of the 617M-parameter embedding never fit a 16 GB device)
INFEASIBLE = ["gpt3-175b", "cpu:1", "--batch", "8", "--seq-len", "128", "--runtime", "reference"]


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


HETERO = str(Path(__file__).resolve().parents[1] / "examples" / "clusters" / "hetero-3pool.yaml")


def compiled(model: str, cluster: str, batch: int, seq_len: int, fixed: dict | None = None):
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq_len)
    options = CompileOptions(time_limit=30.0, space=SpaceOptions(fixed=fixed or {}))
    result = compile_job(job, options)
    return job, result, build_plan(job, result, options)


@pytest.fixture(scope="module", params=[
    ("tiny-llama", "cpu:1", 8, 128),
    ("llama3-8b", "dgx-h100:2", 16, 4096),
    ("llama3-8b", "dgx-h100:2", 64, 4096, {"tp": 2, "pp": 4}),
    ("llama3-8b", HETERO, 256, 4096, {"tp": 8, "pp": 3, "dp": 2, "cp": 1}),
], ids=["tiny", "mid", "pipeline", "hetero"])
def case(request):
    return compiled(*request.param)


# ---------------------------------------------------------------- the plan


def test_plan_round_trips_and_matches_schema_keys(case):
    _, _, plan = case
    text = plan_json(plan)
    assert text.endswith("}\n")
    assert Plan.model_validate_json(text) == plan
    schema = plan_json_schema()
    data = json.loads(text)
    # `moe` (routing statistics' expert placement) is written only when the plan has one
    assert set(data) == set(schema["properties"]) - ({"moe"} if plan.moe is None else set())
    assert set(schema["required"]) <= set(data)
    assert data["schema_version"] == "2" and len(data["inputs_digest"]) == 64
    assert "wall_s" not in text


def test_plan_strategy_is_typed_and_resolved(case):
    _, _, plan = case
    s = plan.strategy
    assert isinstance(s, Strategy) and s.dp is not None and s.sp is not None and s.schedule is not None
    assert json.loads(plan_json(plan))["strategy"] == s.model_dump(mode="json") == s.resolved()
    # a hand-built plan gets sp and schedule written out; dp must be known
    bare = plan.model_dump()
    bare["strategy"] = {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp}
    again = Plan.model_validate(bare).strategy
    assert (again.sp, again.schedule) == (s.tp > 1, "1f1b")
    bare["strategy"] = {"tp": s.tp}
    with pytest.raises(ValidationError, match="dp resolved"):
        Plan.model_validate(bare)


def test_group_strategy_checks_like_a_strategy_and_writes_pool_first():
    group = GroupStrategy(pool="a", batch=4, tp=2, pp=2, dp=1, zero=3, stage_offload=("optimizer", "none"))
    assert group.for_stage(0).offload == "optimizer" and group.for_stage(1).offload == "none"
    assert list(group.model_dump(mode="json"))[:3] == ["pool", "batch", "tp"]
    with pytest.raises(ValidationError, match="sp=on needs tp > 1"):
        GroupStrategy(pool="a", batch=4, tp=1, sp=True)
    both = ReplicaGroupsStrategy(replica_groups=[group], sync_s=0.5)
    assert ReplicaGroupsStrategy.model_validate_json(both.model_dump_json()) == both


def test_plan_agrees_with_the_estimate(case):
    job, result, plan = case
    est = result.estimate
    assert plan.time.step_time_s == est.step_time_s and plan.time.mfu == est.mfu
    assert plan.strategy.model_dump(mode="json") == est.strategy and plan.strategy_spec == est.strategy_spec
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE")
    assert plan.solver.objective == result.certificate.objective
    assert len(plan.stages) == est.strategy["pp"]
    assert [st.memory.hbm.peak_bytes for st in plan.stages] == [r.peak_bytes for r in est.memory.per_stage]
    assert plan.job.num_gpus == est.num_gpus <= job.cluster.num_gpus
    blocks = [b for st in plan.stages for b in range(st.blocks[0], st.blocks[1] + 1)]
    assert blocks == list(range(job.model.num_blocks))
    assert sum(st.layers for st in plan.stages) == len(job.model.layers)


def test_stage_ranks_cover_the_gpus_used_once(case):
    job, _, plan = case
    s = plan.strategy
    per_stage = s.tp * s.cp * s.dp
    ranks, places = [], set()
    for st in plan.stages:
        r = st.ranks
        assert r.last_rank - r.first_rank + 1 == per_stage
        for span in r.spans:
            for rank in range(span.first_rank, span.last_rank + 1):
                ranks.append(rank)
                node, local = rank_location(span, rank)
                assert span.gpus_per_node == job.cluster.pool(span.pool).node.gpus_per_node
                assert 0 <= local < span.gpus_per_node and r.nodes[0] <= node <= r.nodes[1]
                places.add((node, local))
        assert sorted({x for g in r.tp_groups for x in g}) == sorted({x for g in r.cp_groups for x in g})
        assert all(len(g) == s.tp for g in r.tp_groups) and all(len(g) == s.cp for g in r.cp_groups)
        assert min(r.tp_groups[0]) == r.first_rank
    assert sorted(ranks) == list(range(plan.job.num_gpus))
    assert len(places) == plan.job.num_gpus  # no two ranks on one GPU
    assert all(0 <= node < job.cluster.num_nodes for node, _ in places)


def test_stage_pools_place_stages_on_their_pools():
    from planner.plan.build import stage_spans
    cluster = load_cluster(HETERO)
    strategy = Strategy(tp=8, pp=3, dp=2, stage_pools=("h100", "a100", "h100"))
    spans = stage_spans(cluster, strategy)
    assert [s[0].pool for s in spans] == ["h100", "a100", "h100"]
    # a100 has 16 nodes first: h100's nodes start at 16; the second h100 stage takes the next two nodes
    assert (spans[0][0].first_node, spans[0][0].last_node) == (16, 17)
    assert (spans[1][0].first_node, spans[1][0].last_node) == (0, 1)
    assert (spans[2][0].first_node, spans[2][0].last_node) == (18, 19)
    assert [s[0].first_rank for s in spans] == [0, 16, 32]


def test_report_mentions_every_stage_and_runner_up(case):
    _, _, plan = case
    report = render_report(plan)
    assert report == render_report(plan)
    assert report.startswith("# Training plan") and report.endswith("\n")
    for heading in ("## Strategy", "## Stages", "## Memory per GPU", "## Time per step", "## Solver certificate",
                    "## Runners-up", "## Launch"):
        assert heading in report
    for st in plan.stages:
        assert f"| {st.index} | {st.blocks[0]}-{st.blocks[1]} |" in report
    for r in plan.runners_up:
        assert r.strategy_spec in report
    assert plan.strategy_spec in report and plan.solver.status in report


# ---------------------------------------------------------------- atomic output


def test_write_outputs_refuses_non_empty_dir_without_force(tmp_path):
    out = tmp_path / "out"
    write_outputs(out, {"plan.json": "{}", "a.txt": "one\n", "sub/b.bin": b"\x00\x01"})
    assert (out / "a.txt").read_text() == "one\n" and (out / "sub" / "b.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(PlannerInputError, match="exists; use --force"):
        write_outputs(out, {"plan.json": "{}", "a.txt": "two\n"})
    assert (out / "a.txt").read_text() == "one\n"
    write_outputs(out, {"plan.json": "{}", "a.txt": "two\n"}, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "plan.json", "planner-manifest.json"]
    assert (out / "a.txt").read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary directories left


def test_write_outputs_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError):
        write_outputs(out, {"ok.txt": "x", "../escape.txt": "y"})
    with pytest.raises(TypeError):
        write_outputs(out, {"a_ok.txt": "x", "b_bad.txt": 42})  # not text or bytes  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(PlannerInputError, match="not a directory"):
        write_outputs(tmp_path / "file", {"a": "b"}, force=True)


# ---------------------------------------------------------------- planner compile


@pytest.mark.parametrize("args", [TINY, MID], ids=["tiny", "mid"])
def test_compile_output_is_byte_identical(tmp_path, args):
    texts = []
    for _ in range(3):
        result = run("compile", *args, "-o", tmp_path / "out", "--force")
        assert result.exit_code == 0, result.output
        out = tmp_path / "out"
        texts.append({str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert texts[0] == texts[1] == texts[2]
    # plan, report and the default launch targets
    assert {"plan.json", "report.md"} <= set(texts[0]) and any(name.startswith("deepspeed/") for name in texts[0])
    plan = Plan.model_validate_json(texts[0]["plan.json"])
    assert plan.job.model == args[0]


def test_compile_into_non_empty_dir_without_force_exits_2_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run("compile", *TINY, "-o", out)
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert err.startswith("Error: ") and "exists; use --force" in err and "\n" not in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_compile_text_output():
    result = run("compile", *TINY)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for fragment in ("strategy", "tokens/s", "MFU", "step time", "stage", "solver", "OPTIMAL"):
        assert fragment in out
    assert "later release" not in result.stderr


def test_compile_json_has_design_keys():
    result = run("compile", *MID, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "memory", "breakdown", "strategy",
                "solver", "plan"):
        assert key in data
    assert {"status", "objective", "bound", "gap", "wall_s"} <= set(data["solver"])
    assert data["solver"]["status"] in ("OPTIMAL", "FEASIBLE")
    assert data["solver"]["bound"] <= data["solver"]["objective"] * (1 + 1e-9)
    assert Plan.model_validate(data["plan"]).strategy.model_dump(mode="json") == data["strategy"]
    assert data["step_time_s"] == data["plan"]["time"]["step_time_s"]


def test_compile_infeasible_explains_and_exits_1():
    result = run("compile", *INFEASIBLE)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    err = result.stderr
    assert err.startswith("Error: does not fit")
    assert "would fit on" in err and "nodes" in err and "GB" in err
    assert len(err.strip().splitlines()) <= 4
    assert result.stdout == ""


def test_explain_names_stage_overage_and_smaller_change():
    # (on eight L4s it fits: ZeRO-3 over one rank with everything offloaded to NVMe)
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("pcie-t4:1"), global_batch=8, seq_len=8192,
              precision="fp16")
    text = explain_infeasible(job)
    assert text.startswith("does not fit") and "stage 0 (t4)" in text and "over by" in text
    assert "would fit on 2 nodes (pcie-t4:2" in text


@pytest.mark.parametrize("what,key", [("plan", "stages"), ("model", "layers"), ("cluster", "pools")])
def test_schema(what, key):
    result = run("schema", what)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert key in data["properties"]


def test_schema_unknown_kind_exits_2():
    assert run("schema", "strategy").exit_code == 2


def test_report_lists_the_launch_command_of_every_target_written(tmp_path):
    result = run("compile", *TINY, "-o", tmp_path / "out", "--target", "deepspeed", "--target", "slurm")
    assert result.exit_code == 0, result.output
    report = (tmp_path / "out" / "report.md").read_text()
    assert "bash deepspeed/launch.sh" in report and "sbatch slurm/job.sbatch" in report
    assert "torch/launch.sh  " not in report  # not written, not listed
    assert (tmp_path / "out" / "deepspeed" / "launch.sh").stat().st_mode & 0o111  # executable
