"""planner.runtime.deepspeed_train: the torch runtime's model and token shards under the DeepSpeed engine,
on CPU (gloo, torchrun, 2 processes), from the files `planner compile --target deepspeed` writes.

* A pp=2 plan runs through deepspeed.pipe.PipelineModule split at the plan's stage boundaries: each rank
  builds exactly its stage's layers.  It trains 4 steps saving DeepSpeed checkpoints every 2; a second
  run in a folder holding only the step-2 checkpoint resumes from it and repeats steps 2 and 3 exactly.
* A ZeRO-3 plan (dp=2) builds the model inside deepspeed.zero.Init: each rank keeps half the parameters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from models.zoo import get_model  # noqa: E402
from planner.plan.schema import Plan  # noqa: E402
from ports import MULTIPROCESS, free_port  # noqa: E402
from trainer_runs import run_planner  # noqa: E402
from warm_torchrun import command  # noqa: E402

CLUSTER = "name: cpu-2\npools:\n  - {name: cpu, preset: cpu, nodes: 1, overrides: {gpus_per_node: 2}}\n"


def _compile(out: Path, fix: str, dataset: Path) -> Plan:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-2.yaml").write_text(CLUSTER)
    run_planner("compile", "tiny-llama", str(out / "cpu-2.yaml"), "-b", "8", "-s", "64", "--fix", fix, "-o",
            str(out / "plan"), "--target", "deepspeed", "--force", "--data", str(dataset), "--tokenizer", "bytes",
            "--train-steps", "4", "--save-every", "2")
    return Plan.model_validate_json((out / "plan" / "plan.json").read_text())


def _train(folder: Path, dataset: Path, checkpoints: Path, report: Path, *extra: str) -> tuple[dict, str]:
    """torchrun (2 processes) of the trainer with the arguments deepspeed/launch.sh passes it."""
    ds = folder / "plan" / "deepspeed"
    pipeline = ["--pipeline", str(ds / "pipeline.json")] if json.loads((ds / "pipeline.json").read_text())[
        "stages"] > 1 else []
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [*command(), "--nproc_per_node", "2", "--master_port", str(free_port()),
         "-m", "planner.runtime.deepspeed_train", "--ds-config", str(ds / "ds_config.json"), *pipeline,
         "--plan", str(folder / "plan" / "plan.json"), "--data", str(dataset), "--tokenizer", "bytes",
         "--checkpoint-dir", str(checkpoints), "--save-every", "2", "--lr", "1e-2", "--report", str(report),
         *extra], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return json.loads(report.read_text()), run.stdout


@MULTIPROCESS
def test_pipeline_plan_trains_saves_and_resumes(tmp_path, dataset):
    plan = _compile(tmp_path, "pp=2,tp=1,dp=1,cp=1", dataset)
    assert (plan.strategy.pp, plan.strategy.dp) == (2, 1)
    whole, log = _train(tmp_path, dataset, tmp_path / "ck", tmp_path / "whole.json", "--train-steps", "4")
    assert whole["bf16"] and len(whole["losses"]) == 4 and whole["losses"][-1] < whole["losses"][0]
    for rank, stage in enumerate(plan.stages):  # rank r runs stage r (pp=2, dp=1)
        built = whole["ranks"][str(rank)]
        blocks = [int(name.split(".")[1]) for name in built["layers"] if name.startswith("block.")]
        assert built["stage"] == rank and blocks == list(range(stage.blocks[0], stage.blocks[1] + 1))
        assert ("embedding" in built["layers"]) == (rank == 0) and ("head" in built["layers"]) == (rank == 1)
    assert "saved checkpoint" in log and (tmp_path / "ck" / "latest").read_text().strip() == "step-00000004"

    # the folder a run stopped after step 2 leaves: the step-2 checkpoint, `latest` naming it
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    shutil.copytree(tmp_path / "ck" / "step-00000002", stopped / "step-00000002")
    (stopped / "latest").write_text("step-00000002")
    resumed, log = _train(tmp_path, dataset, stopped, tmp_path / "resumed.json", "--train-steps", "4")
    assert "resumed from" in log and "(step 2, data position 16)" in log
    assert resumed["first_step"] == 2 and resumed["losses"] == whole["losses"][2:]


@MULTIPROCESS
def test_zero3_plan_partitions_the_model(tmp_path, dataset):
    plan = _compile(tmp_path, "pp=1,tp=1,dp=2,cp=1,zero=3", dataset)
    assert plan.strategy.zero == 3
    data, _ = _train(tmp_path, dataset, tmp_path / "ck", tmp_path / "r.json", "--train-steps", "2")
    assert data["zero_stage"] == 3 and len(data["losses"]) == 2
    params = get_model("tiny-llama").params
    local = [data["ranks"][r]["local_params"] for r in ("0", "1")]
    assert sum(local) >= params and max(local) <= params / 2 + 1024  # halves (DeepSpeed pads each partition)
