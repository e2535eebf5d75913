"""Nothing is written that its framework cannot hold: each target's written strategy, costed under its runtime
profile, before any of its files (planner/emit/check.py), and the Targets section of report.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.cost import evaluate
from planner.emit import TARGET_RUNTIMES, RefusedPlan, UnsupportedPlan, strategy_writer
from planner.emit.check import TOLERANCE, check_target, emit_checked, emit_targets
from planner.job import Job
from planner.plan.assemble import build_plan
from planner.plan.report import render_report
from planner.plan.schema import Plan
from planner.profile import load_runtime
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions
from planner.strategy import parse_strategy
from launch_plans import certified_plan

GB = r"\d+\.\d GB"


def _cli(*args: str):
    return CliRunner().invoke(cli, ["compile", *args], catch_exceptions=False)


def _targets_section(report: str) -> str:
    return report[report.index("## Targets"):report.index("## Launch")]


def _plan(path: Path) -> Plan:
    return Plan.model_validate_json((path / "plan.json").read_text())


# ---------------------------------------------------------------- the report of a written target


def test_llama3_70b_megatron_report_fits_under_the_megatron_profile(tmp_path):
    out = tmp_path / "o70"
    result = _cli("llama3-70b", "dgx-h100:32", "-b", "1024", "-s", "8192", "--target", "megatron",
                  "--work-limit", "20", "-o", str(out))
    assert result.exit_code == 0, result.output
    plan = _plan(out)
    assert plan.job.runtime == "megatron" and plan.solver.status == "OPTIMAL"
    section = _targets_section((out / "report.md").read_text())
    margin = load_catalog().constant("memory_margin_default")  # compile's default: 10% of HBM left free
    assert plan.job.memory_margin == margin
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:32"), global_batch=1024,
              seq_len=8192, memory_margin=margin).on(load_runtime("megatron"))
    estimate = evaluate(job, strategy_writer("megatron")(plan, job))
    assert estimate.memory.fits and estimate.runtime == "megatron"
    # an H100 80GB holds 79.11 GiB as CUDA reports it (PyTorch's out-of-memory message), less the margin
    assert all(r.peak_bytes <= 79.11 * 2**30 * (1 - margin) for r in estimate.memory.per_stage)
    row = next(line for line in section.splitlines() if line.startswith("| megatron | megatron |"))
    assert f"| {estimate.step_time_s:.4f} |" in row and row.endswith("| yes |")
    assert f"{estimate.tokens_per_s_per_gpu:,.0f}" in row
    assert "under the megatron runtime it fits on every stage" in section
    peaks = " | ".join(f"{r.peak_bytes / 1e9:.1f} / {r.capacity_bytes / 1e9:.1f}" for r in estimate.memory.per_stage)
    assert f"| megatron | {peaks} |" in section
    assert "Not written" not in section


def test_report_without_checks_has_no_targets_section(tmp_path):
    result = _cli("tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--fix", "pp=2,vpp=1", "-o", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    plan = _plan(tmp_path / "o")
    assert "## Targets" not in render_report(plan)
    assert "## Targets" in (tmp_path / "o" / "report.md").read_text()


# ---------------------------------------------------------------- refusals


def test_named_target_runs_zero3_as_megatron_fsdp(tmp_path):
    # the plan (ZeRO-3, no pipeline) fits under the reference runtime; Megatron used to run it as its distributed
    # optimizer with whole fp32 gradients and refuse it (exit 1); it now writes it as planned, as Megatron FSDP
    out = tmp_path / "ref"
    result = _cli("llama3-8b", "dgx-h100:1", "-b", "64", "-s", "8192", "--runtime", "reference", "--target",
                  "megatron", "--work-limit", "20", "--memory-margin", "0", "--fix", "zero=3", "-o", str(out))
    assert result.exit_code == 0, result.output
    args = (out / "megatron" / "args.txt").read_text().splitlines()
    assert {"--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
            "--ckpt-format fsdp_dtensor"} <= set(args)


@pytest.fixture(scope="module")
def zero3():
    """llama3-8b on 8 H100s at 64 x 12288 under the reference runtime with zero=3 over two pipeline stages (zero 1
    does not fit; Megatron runs ZeRO-3 without pipelining as Megatron FSDP, with it as zero 1).  At 8192 tokens
    zero 1 fits the 79.11 GiB (84.9 GB) an H100 reports to CUDA (#28)."""
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:1"), global_batch=64, seq_len=12288)
    options = CompileOptions(time_limit=10, space=SpaceOptions(fixed={"zero": 3, "pp": 2}))
    return build_plan(job, compile_job(job, options), options), job


def test_translation_that_breaks_the_plan_is_refused_with_numbers(zero3):
    plan, job = zero3
    assert plan.strategy.zero == 3 and plan.job.runtime == "reference"
    check = check_target(plan, job, "megatron")
    assert check.status == "refused" and check.runtime == "megatron"
    assert check.changed == ("zero=1",) and check.planned == ("zero=3",)
    assert re.fullmatch(rf"megatron: the written strategy \(zero=1; plan: zero=3\) needs {GB} per GPU on stage 0, "
                        r"84\.9 GB available \(megatron runtime\)", check.line), check.line
    assert check.fits is False and not check.stages[0].fits
    with pytest.raises(RefusedPlan, match="needs .* GB per GPU on stage 0"):
        emit_targets(plan, job, ("megatron",))
    assert emit_checked(plan, job, "megatron")[1] == {}


def test_slower_written_strategy_is_refused():
    # DeepSpeed's PipelineEngine runs one chunk per stage: the interleaved plan becomes 1F1B, a bigger bubble
    job = Job(model=load_model("tiny-llama"), cluster=load_cluster("cpu:1"), global_batch=8, seq_len=128)
    options = CompileOptions(time_limit=10, space=SpaceOptions(fixed={"pp": 2, "dp": 2, "vpp": 2, "zero": 0}))
    plan = build_plan(job, compile_job(job, options), options)
    check = check_target(plan, job, "deepspeed")
    assert check.status == "refused" and check.fits
    assert check.slower > TOLERANCE
    assert re.fullmatch(r"deepspeed: the written strategy \(vpp=1,schedule=1f1b; plan: vpp=2,schedule=interleaved\) "
                        r"runs [0-9.]+ s per step, \d+\.\d% slower than the plan's strategy under the same runtime, "
                        r"[0-9.]+ s \(deepspeed runtime\)", check.line), check.line


def test_default_target_refused_is_skipped_with_a_note(tmp_path):
    out = tmp_path / "tiny"
    result = _cli("tiny-llama", "cpu:1", "-b", "8", "-s", "128", "--fix", "pp=2,dp=2,vpp=2", "-o", str(out))
    assert result.exit_code == 0, result.output
    note = next(line for line in result.output.splitlines() if line.startswith("note: no deepspeed/ files:"))
    assert "% slower than the plan's strategy under the same runtime" in note and note.endswith("(deepspeed runtime)")
    assert not (out / "deepspeed").exists() and (out / "torch" / "launch.sh").exists()
    section = _targets_section((out / "report.md").read_text())
    assert "| torch | planner |" in section and "- deepspeed (deepspeed runtime): the written strategy" in section
    assert "bash deepspeed/launch.sh" not in (out / "report.md").read_text()


def test_moe_model_default_targets_write_no_torch_folder_and_say_why(tmp_path):
    out = tmp_path / "moe"
    result = _cli("mixtral-8x7b", "dgx-h100:2", "-b", "64", "-s", "4096", "--work-limit", "20", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "note: no torch/ files: the planner runtime cannot run mixture-of-experts models" in result.output
    # DeepSpeed runs MoE (its own layer, issue 27): what it refuses is the Megatron plan's layout, named
    note = next(line for line in result.output.splitlines() if line.startswith("note: no deepspeed/ files:"))
    assert note.startswith("note: no deepspeed/ files: the deepspeed runtime cannot run ")
    assert "mixture-of-experts models" not in note
    assert not (out / "torch").exists() and not (out / "deepspeed").exists() and (out / "plan.json").exists()
    section = _targets_section((out / "report.md").read_text())
    assert "- torch (planner runtime): the planner runtime cannot run mixture-of-experts models" in section


def test_named_target_that_cannot_express_the_plan_is_skipped_with_a_note(tmp_path):
    # torch (planner's dense runtime) cannot run Mixtral; megatron can: the compile writes megatron/ and notes torch
    out = tmp_path / "moe"
    result = _cli("mixtral-8x7b", "dgx-h100:2", "-b", "64", "-s", "4096", "--work-limit", "20", "-o", str(out),
                  "--target", "torch", "--target", "megatron")
    assert result.exit_code == 0, result.output
    assert "note: no torch/ files: the planner runtime cannot run mixture-of-experts models" in result.output
    assert (out / "megatron" / "args.txt").exists() and not (out / "torch").exists()
    assert json.loads((out / "plan.json").read_text())["job"]["runtime"] == "megatron"


def test_what_a_runtime_cannot_run_is_unsupported(zero3):
    plan, job = zero3
    tp = plan.model_copy(update={"strategy": plan.strategy.model_copy(update={"tp": 2, "dp": 4})})
    check = check_target(tp, job, "deepspeed")
    assert check.status == "unsupported" and check.reasons == (
        "the deepspeed runtime cannot run tensor parallelism (tp=2)",)
    with pytest.raises(UnsupportedPlan, match="tensor parallelism"):
        emit_targets(tp, job, ("deepspeed",))
    nvme = plan.model_copy(update={"strategy": plan.strategy.model_copy(
        update={"offload": "optimizer", "offload_device": "nvme"})})
    assert "offload_device=nvme" in check_target(nvme, job, "torch").why  # the torch runtime's own refusal


# ---------------------------------------------------------------- property: a named target holds its plan

JOBS = [
    ("tiny-llama", "cpu:1", "8", "128", "pp=2"),
    ("tiny-llama", "cpu:1", "8", "128", "tp=2"),
    ("tiny-llama", "cpu:1", "16", "128", ""),
    ("llama3-8b", "dgx-h100:1", "64", "4096", ""),
    ("llama3-8b", "dgx-h100:2", "128", "8192", "pp=2"),
]


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan", "torch"])
@pytest.mark.parametrize("model, cluster, batch, seq, fix", JOBS)
def test_named_target_written_strategy_costs_what_the_plan_costs(tmp_path, target, model, cluster, batch, seq,
                                                                 fix):
    out = tmp_path / "out"
    args = [model, cluster, "-b", batch, "-s", seq, "--target", target, "--work-limit", "10", "-o", str(out)]
    result = _cli(*args, *(["--fix", fix] if fix else []))
    if result.exit_code == 1 and "Error: no legal strategy" in result.output:
        pytest.skip(f"--fix {fix} is outside {target}'s space")
    assert result.exit_code == 0, result.output
    plan = _plan(out)
    runtime = load_runtime(TARGET_RUNTIMES[target])
    assert plan.job.runtime == runtime.name
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=int(batch),
              seq_len=int(seq)).on(runtime)
    written = strategy_writer(target)(plan, job)
    estimate = evaluate(job, written)
    assert estimate.memory.fits
    assert estimate.step_time_s == pytest.approx(plan.time.step_time_s, rel=TOLERANCE)
    assert (out / target).is_dir()
    check = check_target(plan, job, target)
    assert check.status == "written" and check.written_spec == written.spec()


# ---------------------------------------------------------------- written strategies say what the files say


def _plan_of(job: Job, spec: str) -> Plan:
    """The plan of a hand-written strategy (scored by evaluate, certified as itself)."""
    return certified_plan(job, parse_strategy(spec).with_dp(job.cluster.num_gpus))


@pytest.fixture(scope="module")
def job70():
    return Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=512, seq_len=4096)


def test_megatron_written_strategy(job70):
    plan = _plan_of(job70, "tp=8,pp=4,mbs=1,zero=3,recompute=full,recompute_layers=1/0/3/0,split=19/21/21/19,"
                           "offload=all,schedule=gpipe")
    written = strategy_writer("megatron")(plan, job70)
    assert written.spec() == parse_strategy("tp=8,pp=4,dp=2,mbs=1,zero=1,recompute=full,recompute_layers=3,"
                                            "offload=optimizer,split=19/21/21/19").spec()
    readme = emitter_files(plan, job70, "megatron")["README.md"]
    assert "zero=3 (sharded gradients and weights) with pipeline parallelism -> Megatron's distributed optimizer" \
        in readme
    assert "schedule=gpipe -> 1F1B" in readme and "maximum (3)" in readme
    # unequal middle stages: an even split; uniform method, one layer: every block recomputes
    plan = _plan_of(job70, "tp=8,pp=4,mbs=1,zero=1,recompute=full,split=20/18/22/20")
    assert strategy_writer("megatron")(plan, job70).spec() == parse_strategy(
        "tp=8,pp=4,dp=2,mbs=1,zero=1,recompute=full,split=20/20/20/20").spec()


def test_deepspeed_written_strategy(job70):
    plan = _plan_of(job70, "tp=1,pp=4,mbs=1,vpp=2,zero=2,recompute=full,recompute_layers=2,offload=optimizer,"
                           "offload_device=nvme,split=20/20/20/20")
    written = strategy_writer("deepspeed")(plan, job70)
    config = json.loads(emitter_files(plan, job70, "deepspeed")["ds_config.json"])
    assert config["zero_optimization"]["stage"] == written.zero == 1
    assert config["zero_optimization"]["offload_optimizer"]["device"] == written.offload_device == "cpu"
    assert config["activation_checkpointing"]["number_checkpoints"] == 4  # 2 per chunk, one chunk per stage
    assert written.spec() == parse_strategy("tp=1,pp=4,dp=16,mbs=1,zero=1,recompute=full,recompute_layers=4,"
                                            "offload=optimizer,offload_device=cpu,split=20/20/20/20").spec()
    # no pipeline: ZeRO-3 with a partial optimizer offload is written as planned
    plan = _plan_of(job70, "tp=1,pp=1,mbs=1,zero=3,offload=optimizer,offload_ratio=0.5,recompute=full")
    assert strategy_writer("deepspeed")(plan, job70).spec() == plan.strategy_spec


def test_torchtitan_written_strategy(job70):
    plan = _plan_of(job70, "tp=8,pp=4,mbs=1,zero=1,recompute=full,recompute_layers=2/0/0/0,split=19/21/21/19,sp=off")
    written = strategy_writer("torchtitan")(plan, job70)
    # every 9th block (19 // 2): blocks 9 and 18 of every stage; sequence parallel comes with every tp
    assert written.spec() == parse_strategy("tp=8,pp=4,dp=2,mbs=1,zero=1,recompute=full,recompute_every=9,"
                                            "split=19/21/21/19").spec()
    plan = _plan_of(job70, "tp=8,pp=4,mbs=1,zero=1,recompute=full,recompute_layers=5,split=19/21/21/19")
    assert strategy_writer("torchtitan")(plan, job70).recompute_every == 3  # 19 // 5: 6 or 7 blocks a stage
    plan = _plan_of(job70, "tp=8,pp=1,mbs=1,zero=2,offload=optimizer,recompute=full")
    written = strategy_writer("torchtitan")(plan, job70)
    assert (written.zero, written.offload, written.offload_device) == (3, "all", "cpu")
    assert "zero=2 -> 3: with training.enable_cpu_offload" in emitter_files(plan, job70, "torchtitan")["README.md"]
    plan = _plan_of(job70, "tp=8,pp=4,mbs=1,zero=0,recompute=full")
    assert strategy_writer("torchtitan")(plan, job70).zero == 0  # DDP


def emitter_files(plan: Plan, job: Job, target: str) -> dict[str, str]:
    from planner.emit import emitter

    return emitter(target)(plan, job)
