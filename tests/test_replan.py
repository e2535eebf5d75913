"""`planner replan`: the migration model on hand-worked cases, the choice between migrating little and
stepping fast, the command line's errors, its outputs, and the resume commands' syntax (bash -n,
shellcheck, and DeepSpeed's own ds_to_universal argument parser).

Hand-worked numbers use tiny-llama (models/zoo/llm.py: 4 x (attention 12,352 + mlp 24,640) + embedding
16,384 + final norm 64 + head 16,384 = 180,800 parameters; each attention and mlp layer has one 64-weight
norm that tensor parallelism replicates) under planner's torch runtime, whose checkpoint holds fp32
weights (4 B) and two fp32 Adam moments (8 B) per parameter (hardware/data/runtimes/planner.yaml).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.job import Job
from planner.profile import load_runtime
from planner.replan.layout import moving_terms, strategy_layout
from planner.replan.migration import cluster_rates, plan_migration, unrecoverable_bytes
from planner.replan.nodes import map_nodes
from planner.strategy import parse_strategy
from planner.validation import check_strategy
from benches import load_bench
from conftest import TWO_GPUS
from tools import shellcheck

PARAMS = 180_800
BYTES_PER_PARAM = 4 + 8  # fp32 weights + Adam exp_avg and exp_avg_sq
STATE = PARAMS * BYTES_PER_PARAM
STAGE0 = 16_384 + 2 * (12_352 + 24_640)  # embedding + blocks 0-1 (split 2/2)
STAGE1 = PARAMS - STAGE0  # blocks 2-3, final norm, head
SPLIT = 16_384 + 4 * (12_352 - 64) + 4 * (24_640 - 64) + 16_384  # what tp splits (the rest is replicated)



def _migration(old_cluster: str, old_spec: str, new_cluster, new_spec: str, lost=None):
    model = load_model("tiny-llama")
    terms = moving_terms(load_runtime("planner"))
    old_c = load_cluster(old_cluster)
    new_c = load_cluster(str(new_cluster))
    old = check_strategy(Job(model=model, cluster=old_c, global_batch=8, seq_len=64), parse_strategy(old_spec))
    new = check_strategy(Job(model=model, cluster=new_c, global_batch=8, seq_len=64), parse_strategy(new_spec))
    nodes = map_nodes(old_c, new_c, lost)
    old_layout = strategy_layout(model, old_c, old)
    migration = plan_migration(old_layout, strategy_layout(model, new_c, new), terms, nodes,
                               cluster_rates(new_c, load_catalog(), None), model)
    return migration, unrecoverable_bytes(old_layout, terms, nodes)


def _by_link(migration) -> dict[str, float]:
    return {total.link: total.bytes for total in migration.links}


@pytest.fixture
def two_gpus(tmp_path) -> Path:
    path = tmp_path / "cpu-2.yaml"
    path.write_text(TWO_GPUS)
    return path


# ---------------------------------------------------------------- hand-worked migrations


def test_pp2_dp2_to_dp2_keeps_the_first_stage_and_reads_the_lost_one(two_gpus):
    # Old: stage 0 on GPUs 0-1, stage 1 on GPUs 2-3, each stage's state halved over dp (ZeRO-3).  New: dp=2
    # on GPUs 0-1, each holding half of every layer.  New rank i keeps the half of stage 0 it held; the half
    # of stage 1 it needs sat on GPU 2 + i, which is gone: read from the checkpoint.
    migration, lost = _migration("cpu:1", "pp=2,dp=2,zero=3,split=2/2", two_gpus, "dp=2,zero=3")
    links = _by_link(migration)
    assert links["local"] == STAGE0 * BYTES_PER_PARAM
    assert links["storage"] == STAGE1 * BYTES_PER_PARAM
    assert links["nvlink"] == links["fabric"] == 0
    assert lost == STAGE1 * BYTES_PER_PARAM  # only GPUs 2 and 3 held stage 1
    for rank in migration.ranks:
        assert rank.state_bytes == STATE / 2
        assert rank.by_link["local"] == STAGE0 * BYTES_PER_PARAM / 2
    # the storage reads cross node 0's one NIC (cpu preset: 1 x 1.25 GB/s, network_efficiency 0.85)
    assert migration.moved.seconds == pytest.approx(STAGE1 * BYTES_PER_PARAM / (1.25e9 * 0.85))
    assert migration.restart.bytes == STATE


def test_tp2_to_tp4_moves_the_quarters_a_gpu_did_not_hold_over_nvlink():
    # Old: tp=2 x dp=2 replicated (ZeRO-0): GPUs 0 and 2 hold the first half of every split layer, 1 and 3
    # the second.  New: tp=4 on the same GPUs: quarter q sits inside old half q // 2, so GPUs 0 and 3 hold
    # theirs already, GPU 1 (quarter 1, half 0) and GPU 2 (quarter 2, half 1) take theirs from a
    # neighbour; the replicated norms are on every GPU.
    migration, lost = _migration("cpu:1", "tp=2,dp=2,zero=0", "cpu:1", "tp=4,zero=0")
    links = _by_link(migration)
    quarter = SPLIT / 4 * BYTES_PER_PARAM
    assert links["nvlink"] == pytest.approx(2 * quarter)
    assert links["fabric"] == links["storage"] == 0 and lost == 0
    assert migration.state_bytes == pytest.approx(4 * (SPLIT / 4 + (PARAMS - SPLIT)) * BYTES_PER_PARAM)
    receivers = {m.to_rank for m in migration.moves if m.link == "nvlink"}
    assert receivers == {1, 2}
    # one quarter in per receiving GPU, one out per sender, over the 5 GB/s loopback (efficiency 1)
    assert migration.moved.seconds == pytest.approx(quarter / 5e9)


def test_a_lost_node_is_read_from_the_checkpoint_and_the_survivor_renumbered():
    # Old: dp=8 ZeRO-3 over 2 nodes, rank r holding eighth r of every layer on node r // 4.  Node 0 leaves;
    # node 1 becomes the new node 0.  New dp=4: rank i needs eighths 2i and 2i+1.  Ranks 0 and 1 need
    # eighths 0-3, only node 0 held them: storage.  Rank 2 takes eighths 4 and 5 from the survivor's GPUs
    # 0 and 1 (NVLink); rank 3 holds eighth 7 already (old rank 7 was GPU 3 of node 1) and takes eighth 6.
    migration, lost = _migration("cpu:2", "dp=8,zero=3", "cpu:1", "dp=4,zero=3", lost=(0,))
    links = _by_link(migration)
    eighth = STATE / 8
    assert links["storage"] == pytest.approx(4 * eighth)
    assert links["nvlink"] == pytest.approx(3 * eighth)
    assert links["local"] == pytest.approx(eighth)
    assert lost == pytest.approx(4 * eighth)
    senders = sorted({m.from_rank for m in migration.moves if m.link == "nvlink"})
    assert senders == [4, 5, 6]
    # without --lost-nodes the last node leaves: node 0 survives, mirrored (ranks 0-1 take eighths 0-3)
    default, _ = _migration("cpu:2", "dp=8,zero=3", "cpu:1", "dp=4,zero=3")
    assert {m.to_rank for m in default.moves if m.link == "storage"} == {2, 3}


def test_lost_nodes_must_be_consistent_with_the_new_cluster():
    from planner.errors import PlannerInputError

    with pytest.raises(PlannerInputError, match="--lost-nodes: node 5 is not a node"):
        map_nodes(load_cluster("cpu:2"), load_cluster("cpu:1"), (5,))
    with pytest.raises(PlannerInputError, match="keeps 2 of its 2 nodes, the new cluster has 1"):
        map_nodes(load_cluster("cpu:2"), load_cluster("cpu:1"), ())


# ---------------------------------------------------------------- the command


def _run(*args) -> "object":
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def old_plan(tmp_path_factory) -> Path:
    """tiny-llama on two 4-GPU nodes, the fastest plan keeping pp=2 (split 2/2)."""
    out = tmp_path_factory.mktemp("old") / "plan"
    result = _run("compile", "tiny-llama", "cpu:2", "-b", 8, "-s", 64, "--fix", "pp=2,dp=4,vpp=1", "-o", out,
                  "--target", "torch")
    assert result.exit_code == 0, result.output
    return out / "plan.json"


def _choice(old_plan: Path, steps: int, *fix: str) -> dict:
    result = _run("replan", old_plan, "cpu:1", "--steps-left", steps, *fix, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["choice"]


def test_few_steps_left_choose_the_plan_that_moves_least_many_the_fastest(old_plan):
    # ZeRO-0 fixed: a sharded optimizer moves as little as the old layout (each new rank loads its shard), and is
    # the fastest here once every kernel's launch is priced, so only replicated state makes the two choices differ
    few, many = _choice(old_plan, 1, "--fix", "zero=0"), _choice(old_plan, 1_000_000, "--fix", "zero=0")
    least = min(few["candidates"], key=lambda c: c["migration_s"])
    chosen_few = next(c for c in few["candidates"] if c["strategy_spec"] == few["chosen"])
    chosen_many = next(c for c in many["candidates"] if c["strategy_spec"] == many["chosen"])
    # keeping pp=2 on the surviving node keeps half its GPUs' state; the fastest plan (pp=1) moves more
    assert chosen_few["migration_s"] == least["migration_s"] < chosen_many["migration_s"]
    assert chosen_few["source"] in ("least total", "keeps layout", "keeps tp/pp/cp")
    assert chosen_many["step_time_s"] == pytest.approx(many["step_optimum_s"])
    assert chosen_many["step_time_s"] < chosen_few["step_time_s"]
    # the migration is a term of the programs: both certificates are tight
    assert few["migration_in_programs"] and many["migration_in_programs"]
    assert 0 <= few["gap"] < 1e-3 and 0 <= many["gap"] < 1e-3
    # (the program counts whole nanoseconds: its bound may pass the exact total by that rounding)
    assert few["total_bound_s"] <= few["total_s"] and few["program_bound_s"] <= few["total_s"] * (1 + 1e-6)


def test_outputs_resume_files_and_a_plan_simulate_accepts(old_plan, tmp_path):
    out = tmp_path / "new"
    # the torch launch resolves a relative folder from the plan folder: ../ckpt keeps checkpoints outside it
    result = _run("replan", old_plan, "cpu:1", "--steps-left", 1, "--checkpoint-dir", "../ckpt", "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["memory.png", "migration.json", "plan.json",
                                                     "planner-manifest.json", "report.md", "time.png", "torch"]
    migration = json.loads((out / "migration.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert migration["new_strategy"] == plan["strategy_spec"]
    assert plan["options"]["replan"]["steps_left"] == 1
    assert sum(r["state_bytes"] for r in migration["ranks"]) == pytest.approx(migration["state_bytes"])
    report = (out / "report.md").read_text()
    for heading in ("## What was optimised", "## Candidates", "## Old and new layout", "## What moves",
                    "## Migration against the steps left", "## Resuming"):
        assert heading in report
    assert "--checkpoint-dir ../ckpt" in (out / "torch" / "launch.sh").read_text()
    simulated = _run("simulate", out / "plan.json")  # the plan's digest covers its re-plan record
    assert simulated.exit_code == 0, simulated.output
    again = tmp_path / "again"
    assert _run("replan", old_plan, "cpu:1", "--steps-left", 1, "--checkpoint-dir", "../ckpt", "-o",
                again).exit_code == 0
    for name in ("plan.json", "migration.json", "report.md", "torch/launch.sh"):
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_user_errors_are_one_line(old_plan, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args, code, message in (
        ((bad, "cpu:1"), 2, "bad.json: not valid JSON"),
        ((tmp_path / "absent.json", "cpu:1"), 2, "absent.json: no such plan file"),
        ((old_plan, "cpu:x"), 2, "node count must be a positive integer"),
        ((old_plan, "cpu:1", "--lost-nodes", "a,b"), 2, "expected comma-separated node numbers"),
        ((old_plan, "cpu:1", "--lost-nodes", "9"), 2, "--lost-nodes: node 9 is not a node of the old cluster"),
    ):
        result = _run("replan", *args)
        assert result.exit_code == code, result.output
        assert message in result.output and result.output.count("\n") == 1, result.output


def test_a_cluster_too_small_exits_1_saying_what_does_not_fit(tmp_path):
    out = tmp_path / "big"
    assert _run("compile", "llama3-8b", "dgx-h100:1", "-b", 8, "-s", 4096, "-o", out,
                "--target", "torch").exit_code == 0
    tiny = tmp_path / "one-gpu.yaml"
    # one GPU with little host memory and disk: nothing to offload the states to either
    tiny.write_text("pools:\n  - name: dgx-h100\n    nodes: 1\n    preset: dgx-h100\n"
                    "    overrides: {gpus_per_node: 1, host_dram_bytes: 16000000000, nvme_bytes: 16000000000}\n")
    result = _run("replan", out / "plan.json", tiny)
    assert result.exit_code == 1, result.output
    assert "does not fit" in result.output and "GB" in result.output


# ---------------------------------------------------------------- conversion commands


@pytest.fixture(scope="module")
def framework_files(tmp_path_factory) -> Path:
    """A llama3-8b plan with deepspeed and megatron folders, re-planned onto one node fewer."""
    root = tmp_path_factory.mktemp("frameworks")
    old = root / "old"
    result = _run("compile", "llama3-8b", "dgx-h100:2", "-b", 64, "-s", 4096, "-o", old, "--target", "megatron",
                  "--target", "deepspeed", "--fix", "pp=2")
    assert result.exit_code == 0, result.output
    new = root / "new"
    # zero 1 keeps Megatron's torch_dist checkpoints (Megatron FSDP, zero 2/3, saves fsdp_dtensor: no reshard)
    result = _run("replan", old / "plan.json", "dgx-h100:1", "--checkpoint-dir", "ckpt", "--fix", "zero=1",
                  "-o", new)
    assert result.exit_code == 0, result.output
    return new


def test_resume_scripts_are_valid_bash(framework_files, tmp_path):
    from planner.replan.convert import megatron_reshard_sh

    # the other branches: tp and pp change under the distributed optimizer (dp_reshardable state), and a change
    # from the distributed to the plain optimizer
    tp_change, zero_change = tmp_path / "reshard-tp.sh", tmp_path / "reshard-zero.sh"
    tp_change.write_text(megatron_reshard_sh(parse_strategy("tp=2,pp=2,dp=2,zero=1"),
                                             parse_strategy("tp=4,dp=2,zero=1")))
    zero_change.write_text(megatron_reshard_sh(parse_strategy("tp=2,pp=2,dp=2,zero=1"),
                                               parse_strategy("tp=2,pp=2,dp=1")))
    assert "--no-load-optim --no-load-rng" in tp_change.read_text() and "FULLY_RESHARDABLE" in tp_change.read_text()
    assert "extra+=(--no-load-optim --no-load-rng)\n" in zero_change.read_text()
    scripts = [framework_files / "deepspeed" / "convert.sh", framework_files / "megatron" / "reshard.sh", tp_change,
               zero_change]
    for script in scripts:
        assert script.is_file(), sorted(p.name for p in script.parent.iterdir())
        subprocess.run(["bash", "-n", str(script)], check=True)
    run = subprocess.run([shellcheck(), "-S", "warning", *map(str, scripts)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    config = json.loads((framework_files / "deepspeed" / "ds_config.json").read_text())
    assert config["checkpoint"] == {"load_universal": True}  # DeepSpeed reads deepspeed/runtime/config.py's key


def test_ds_to_universal_accepts_the_written_arguments(framework_files, monkeypatch):
    universal = pytest.importorskip("deepspeed.checkpoint.ds_to_universal")
    text = (framework_files / "deepspeed" / "convert.sh").read_text()
    command = text[text.index("python -m "):].split("\n#")[0].replace("\\\n", " ")
    words = shlex.split(command.replace("$checkpoint_dir", "/ckpt").replace("${tag}", "step-2").replace("$tag",
                                                                                                     "step-2"))
    assert words[:3] == ["python", "-m", "deepspeed.checkpoint.ds_to_universal"]
    monkeypatch.setattr(sys, "argv", ["ds_to_universal", *words[3:]])
    args = universal.parse_arguments()  # DeepSpeed's own parser: exits 2 on an unknown or missing option
    assert args.input_folder == "/ckpt/step-2" and args.output_folder == "/ckpt/step-2_universal"


def test_megatron_reshard_names_the_resharding_flags(framework_files):
    """The flags' meaning is Megatron-LM's own: tests/test_megatron_lm_parser.py parses them with it."""
    from planner.replan.convert import optimizer_state_reshards

    text = (framework_files / "megatron" / "reshard.sh").read_text()
    assert "--ckpt-fully-parallel-load" in text
    args = (framework_files / "megatron" / "args.txt").read_text()
    assert "torch_dist" in args  # the format whose load reshards
    plan = json.loads((framework_files / "plan.json").read_text())
    old = parse_strategy(plan["options"]["replan"]["old_strategy"])
    new = parse_strategy(plan["strategy_spec"])
    assert ("--no-load-optim --no-load-rng" in text) == (not optimizer_state_reshards(old, new))


def test_the_bench_runs_and_renders_a_small_job():
    bench = load_bench("replan")
    scenario = bench.Scenario("tiny-llama", "tiny-llama", "cpu", 2, 8, 64, 0)
    rows = bench.run(scenario, (1,), steps_left=10, time_limit=30)
    assert [r.nodes for r in rows] == ["2 -> 1"]
    table = bench.render(rows, 10)
    assert table.count("\n| tiny-llama |") == 1 and "10 steps left" in table
