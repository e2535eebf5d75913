"""The library's entry points (planner/api.py): the command line only wraps them, so the same inputs give the
same numbers and the same files through `import planner` as through `planner ...`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import planner
from planner.cli import cli
from planner.errors import InfeasibleError, PlannerInputError

ROOT = Path(__file__).resolve().parents[1]
TINY = ("tiny-llama", "cpu:1")
WORK = 20.0  # CP-SAT's deterministic budget: OPTIMAL whatever the machine's load


def _cli_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_import_planner_loads_no_entry_point_until_asked():
    code = ("import sys, planner\n"
            "before = sorted(m for m in sys.modules if m.startswith(('planner.api', 'planner.search', 'ortools')))\n"
            "planner.compile\n"
            "after = 'planner.api' in sys.modules and 'planner.search.compile' in sys.modules\n"
            "print(before, after, planner.__version__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.stdout.split() == ["[]", "True", planner.__version__], run.stdout + run.stderr


def test_the_entry_points_are_not_shadowed_by_submodules():
    import planner.compare.table  # noqa: F401 (a subpackage loaded first must not hide an entry point)
    import planner.job  # noqa: F401

    for name in planner.__all__:
        assert name == "__version__" or getattr(planner, name) is getattr(planner.api, name), name


def test_estimate_is_what_the_command_line_prints():
    job = planner.load_job("llama3-8b", "dgx-h100:1", batch=8, seq_len=8192, memory_margin=0.0)
    ours = planner.estimate(job, "tp=2,sp=on,zero=3")
    theirs = _cli_json("estimate", "llama3-8b", "dgx-h100:1", "-b", "8", "-s", "8192", "--strategy",
                       "tp=2,sp=on,zero=3")
    assert job.runtime.name == planner.DEFAULT_RUNTIME == "planner"
    assert ours.model_dump(mode="json") == theirs


def test_one_default_runtime_megatron_for_experts():
    assert planner.load_job(*TINY, batch=8, seq_len=64).runtime.name == planner.DEFAULT_RUNTIME
    assert planner.load_job("mixtral-8x7b", "dgx-h100:4", batch=64, seq_len=4096).runtime.name == "megatron"
    assert planner.load_job(*TINY, batch=8, seq_len=64, runtime="torchtitan").runtime.name == "torchtitan"


def test_estimate_refuses_what_the_runtime_cannot_run():
    job = planner.load_job(*TINY, batch=8, seq_len=64, runtime="deepspeed")
    with pytest.raises(PlannerInputError, match="runtime deepspeed cannot run tensor parallelism"):
        planner.estimate(job, "tp=2")


def test_compile_writes_the_files_the_command_line_writes(tmp_path):
    # byte for byte: plan.json, report.md, its figures and the launch folders (the CLI calls the same code)
    inputs = ("--fix", "pp=2,dp=2", "--target", "torch", "--target", "deepspeed")
    cli_out = tmp_path / "cli"
    result = CliRunner().invoke(cli, ["compile", *TINY, "-b", "8", "-s", "64", "--work-limit", str(WORK), *inputs,
                                      "-o", str(cli_out)])
    assert result.exit_code == 0, result.output
    job = planner.load_job(*TINY, batch=8, seq_len=64)
    compiled = planner.compile(job, targets=("torch", "deepspeed"), fixed={"pp": 2, "dp": 2}, work_limit=WORK)
    assert compiled.result.certificate.status == "OPTIMAL"
    api_out = tmp_path / "api"
    compiled.write(api_out)
    assert compiled.written == ("torch", "deepspeed")
    cli_files = sorted(p.relative_to(cli_out) for p in cli_out.rglob("*") if p.is_file())
    api_files = sorted(p.relative_to(api_out) for p in api_out.rglob("*") if p.is_file())
    assert cli_files == api_files and Path("torch/launch.sh") in api_files
    for name in api_files:
        assert (cli_out / name).read_bytes() == (api_out / name).read_bytes(), name
    data = compiled.as_json(work_limit=WORK)
    assert data["solver"]["status"] == "OPTIMAL" and data["plan"]["strategy"]["pp"] == 2


def test_compile_of_a_recommendation_model_gives_its_embedding_plan(tmp_path):
    job = planner.load_job("tiny-dlrm", "cpu:1", batch=512, seq_len=1)
    compiled = planner.compile(job, targets=("torch",), time_limit=5)
    compiled.write(tmp_path / "dlrm")
    assert {"plan.json", "sharding_plan.json", "report.md"} <= {p.name for p in (tmp_path / "dlrm").iterdir()}
    assert compiled.written == ("torch",) and (tmp_path / "dlrm" / "torch" / "launch.sh").is_file()


def test_a_named_target_that_would_not_run_the_plan_stops_the_write(tmp_path):
    job = planner.load_job(*TINY, batch=8, seq_len=64)
    compiled = planner.compile(job, targets=("torch",), fixed={"tp": 2}, work_limit=WORK)
    # the plan costed under another runtime than the one its only target runs: torch would not hold it as costed
    other = planner.compile(job.on(compiled.job.runtime), runtime="reference", fixed={"tp": 2}, work_limit=WORK)
    assert other.job.runtime.name == "reference"
    with pytest.raises(PlannerInputError, match="no emitter"):
        planner.compile(job, targets=("nonesuch",))
    with pytest.raises(InfeasibleError):
        planner.compile(planner.load_job("llama3-70b", "cpu:1", batch=8, seq_len=64))


def test_compare_has_the_planner_row_and_the_baselines():
    job = planner.load_job(*TINY, batch=8, seq_len=64)
    rows = planner.compare_baselines(job, only=("ddp", "uniform-pp", "planner"), time_limit=10)
    assert [(r.strategy, r.runtime) for r in rows] == [("ddp", "torchtitan"), ("uniform-pp", "planner"),
                                                       ("planner", "planner")]
    planner_row = rows[-1]
    # never slower than a fitting baseline costed under the same runtime
    assert planner_row.fits and all(planner_row.step_time_s <= r.step_time_s for r in rows
                                    if r.fits and r.runtime == planner_row.runtime)


def test_simulate_and_replan_are_what_the_command_line_prints(tmp_path):
    # a compiled tiny plan, then simulate and re-plan it for a smaller allocation through both doors
    out = tmp_path / "tiny"
    job = planner.load_job(*TINY, batch=8, seq_len=64)
    planner.compile(job, targets=("torch",), fixed={"pp": 2, "dp": 2}, work_limit=WORK).write(out)
    plan, loaded = planner.load_plan(out / "plan.json")
    assert loaded.model.name == "tiny-llama" and plan.strategy.pp == 2
    simulated = planner.simulate_plan(plan, loaded)
    assert simulated.summary.model_dump(mode="json") == _cli_json("simulate", str(out / "plan.json"))
    replanned = planner.replan_for(plan, loaded, "cpu:1", targets=("torch",), steps_left=100, time_limit=30)
    theirs = _cli_json("replan", str(out / "plan.json"), "cpu:1", "--steps-left", "100", "--time-limit", "30")
    assert replanned.result.choice.model_dump(mode="json") == theirs["choice"]
    assert replanned.plan.model_dump(mode="json") == theirs["plan"]
    assert "plan.json" in replanned.files and "torch/launch.sh" in replanned.files
    # an edited plan is refused by the digest check, as the command line refuses it
    data = json.loads((out / "plan.json").read_text())
    data["job"]["global_batch"] = 16
    (out / "plan.json").write_text(json.dumps(data))
    with pytest.raises(PlannerInputError):
        planner.load_plan(out / "plan.json")
