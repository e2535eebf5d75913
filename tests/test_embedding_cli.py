"""`planner compile` on recommendation models, and the DLRM runtime under torchrun (gloo, 4 CPU
processes) applying a sharding plan: same losses as one process with whole tables, and every rank
holds exactly the shards the plan gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.embedding.compile import TableChoice
from planner.embedding.options import ShardingType
from planner.embedding.sharding_plan import sharding_plan
from planner.embedding.sites import JobSites
from ports import MULTIPROCESS, free_port
from warm_torchrun import command

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_compile_writes_embedding_plan_files(tmp_path):
    out = tmp_path / "dlrm"
    result = run("compile", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "-o", out, "--time-limit", "5")
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.output and "OPTIMAL" in result.output
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["plan.json", "planner-manifest.json", "ranks.png", "report.md", "sharding_plan.json",
                     "torch/README.md", "torch/launch.sh"]
    assert os.access(out / "torch" / "launch.sh", os.X_OK)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["schema"] == "planner.embedding-plan/1" and plan["strategy"] == "planner"
    assert plan["sharding"] == json.loads((out / "sharding_plan.json").read_text())
    assert "## Tables" in (out / "report.md").read_text()


def test_compile_greedy_torchrec_style_and_json():
    result = run("compile", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "--embedding-planner", "greedy-torchrec-style",
                 "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["solver"]["status"] == "BASELINE" and data["plan"]["strategy"] == "greedy-torchrec-style"
    assert data["step_time_s"] == pytest.approx(data["plan"]["estimate"]["step_time_s"])


def test_strategy_flag_refused_for_dense_models():
    result = run("compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "128",
                 "--embedding-planner", "greedy-torchrec-style")
    assert result.exit_code == 2 and "recommendation models" in result.output


def test_infeasible_tables_exit_1_with_what_does_not_fit(tmp_path):
    spec = tmp_path / "huge.yaml"
    spec.write_text("builder: dlrm\nname: huge\nbottom_mlp: [64, 32]\ntop_mlp: [64, 1]\ninteraction: cat\n"
                    "tables: [{rows: 20000000000, dim: 64}]\n")
    result = run("compile", spec, "cpu:1", "-b", "64", "-s", "1")
    assert result.exit_code == 1
    assert "fits no option" in result.output and "add nodes" in result.output


# ---------------------------------------------------------------- runtime


def _mixed_plan() -> dict:
    """A sharding of tiny-dlrm on 4 ranks that uses every sharding type the runtime applies."""
    job_sites = JobSites(load_cluster("cpu:1"), load_catalog())
    tables = [layer.table for layer in load_model("tiny-dlrm").layers if layer.table is not None]
    kinds = [(ShardingType.ROW_WISE, 1, (0, 1, 2, 3)), (ShardingType.COLUMN_WISE, 2, (1, 3)),
             (ShardingType.TABLE_ROW_WISE, 1, (0, 1, 2, 3)), (ShardingType.DATA_PARALLEL, 1, (0, 1, 2, 3)),
             (ShardingType.TABLE_WISE, 1, (2,)), (ShardingType.TABLE_WISE, 1, (3,)),
             (ShardingType.COLUMN_WISE, 4, (0, 1, 2, 3)), (ShardingType.TABLE_WISE, 1, (0,))]
    choices = [TableChoice(table=t, name=f"table.{t}", sharding_type=k, column_shards=c,
                           cache_fraction=0.2 if t == 5 else 1.0, ranks=list(r)) for t, (k, c, r) in enumerate(kinds)]
    document = sharding_plan(SimpleNamespace(tables=choices), "tiny-dlrm", tables, job_sites)
    return json.loads(document.model_dump_json(by_alias=True))


def _expected_bytes(plan: dict, world: int) -> list[int]:
    held = [0] * world
    for entry in plan["tables"].values():
        if entry["sharding_spec"] is None:
            for rank in range(world):
                held[rank] += entry["rows"] * entry["dim"] * 4
            continue
        for shard in entry["sharding_spec"]:
            rank = int(shard["placement"].split("/")[0].split(":")[1])
            held[rank] += shard["shard_sizes"][0] * shard["shard_sizes"][1] * 4
    return held


@MULTIPROCESS
def test_runtime_applies_sharding_plan_with_reference_losses(tmp_path):
    pytest.importorskip("torch")
    from planner.runtime.dlrm import train

    plan = _mixed_plan()
    path = tmp_path / "sharding_plan.json"
    path.write_text(json.dumps(plan))
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [*command(), "--nproc_per_node", "4", "--master_port", str(free_port()),
           "-m", "planner.runtime.dlrm", "--plan", str(path), "--batch", "64", "--steps", "4", "--report", str(report)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads(report.read_text())
    reference = train(None, "tiny-dlrm", 64, 4, 0.5, 0, reference=True)
    assert sharded["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert sharded["table_bytes"] == _expected_bytes(plan, 4)
    assert reference["table_bytes"] == [sum(e["rows"] * e["dim"] * 4 for e in plan["tables"].values())]


@MULTIPROCESS
def test_emitted_launch_script_runs_the_compiled_plan(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "dlrm"
    assert run("compile", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "-o", out, "--time-limit", "5").exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port()),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    report = tmp_path / "report.json"
    done = subprocess.run([str(out / "torch" / "launch.sh"), "--steps", "2", "--report", str(report)],
                          env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    sharding = json.loads((out / "sharding_plan.json").read_text())
    assert json.loads(report.read_text())["table_bytes"] == _expected_bytes(sharding, 4)


def test_estimate_scores_a_compiled_sharding_plan_as_compile_did(tmp_path):
    out = tmp_path / "dlrm"
    args = ("dlrm-criteo-terabyte", "dgx-a100-40g:2", "-b", "65536", "-s", "1")
    assert run("compile", *args, "-o", out, "--time-limit", "5").exit_code == 0
    planned = json.loads((out / "plan.json").read_text())["estimate"]
    result = run("estimate", *args, "--sharding", out / "sharding_plan.json", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["step_time_s"] == planned["step_time_s"]
    also = run("estimate", *args, "--sharding", out / "plan.json", "--json")  # the plan around it works too
    assert json.loads(also.output)["step_time_s"] == planned["step_time_s"]


def test_estimate_uniform_sharding_spec():
    args = ("dlrm-criteo-terabyte", "dgx-a100-40g:2", "-b", "65536", "-s", "1")
    rows = json.loads(run("estimate", *args, "--strategy", "sharding=row_wise", "--json").output)
    cached = json.loads(run("estimate", *args, "--strategy", "sharding=row_wise,cache=0.05", "--json").output)
    assert cached["peak_hbm_bytes"] < rows["peak_hbm_bytes"] and cached["peak_host_bytes"] > 0
    assert cached["breakdown"]["lookup_s"] > rows["breakdown"]["lookup_s"]
    assert run("estimate", *args, "--strategy", "tp=2").exit_code == 2
    assert run("estimate", *args, "--strategy", "sharding=column_wise/3").exit_code == 2  # 128 is not a multiple
    over = run("estimate", "dlrm-criteo-terabyte", ROOT / "examples/clusters/l4-box.yaml", "-b", "65536", "-s", "1",
               "--strategy", "sharding=table_wise")
    assert over.exit_code == 1 and "over by" in over.output
