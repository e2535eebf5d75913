"""A re-planned run resumes the old run's checkpoint (torchrun, gloo): `planner replan`'s torch/launch.sh,
pointed at the checkpoint folder of a stopped pp=2 x dp=2 run (the launch tests/conftest.py pipeline_run
shares with the runtime's and the trainer's tests), trains on under the new layout, and

* its losses equal those of the old layout's uninterrupted run within 1e-4 (same global batch, same
  data order, AdamW state and step restored: torch.distributed.checkpoint reshards on load);
* the bytes each rank loads from the checkpoint (counted by tests/replan_probe/sitecustomize.py inside
  DCP's load planner) are the state migration.json says the rank holds.

Two re-plans of the same checkpoint: onto 2 processes (a 2-GPU cluster file: dp=2, the pipeline gone),
and onto 4 processes with another shape (tp=2 x dp=2, asked for with --fix).  fp32 runs (--precision
fp32): bf16 kernels round differently for other micro-batch shapes, which is not what is tested here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ports import MULTIPROCESS  # noqa: E402
from conftest import TWO_GPUS  # noqa: E402
from trainer_runs import launch, run_planner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "replan_probe"


@MULTIPROCESS
@pytest.mark.parametrize(("name", "fix", "shape"), [
    ("two", "dp=2", (1, 1, 2)),  # onto 2 processes: the pipeline gone
    ("tp2", "tp=2,dp=2", (2, 1, 2)),  # onto 4 processes in another shape
])
def test_a_replanned_run_resumes_the_checkpoint_under_a_new_layout(tmp_path, pipeline_run, name, fix, shape):
    # the old run (tests/conftest.py pipeline_run): 4 steps uninterrupted, checkpoints after 2 and 4; the one
    # after 2 is what a run stopped there leaves (tests/test_trainer.py: a resume from it repeats this run's
    # steps 3 and 4 exactly)
    old, whole = pipeline_run.plan, pipeline_run.report
    target = "cpu:1"
    if name == "two":
        target = str(tmp_path / "cpu-2.yaml")
        Path(target).write_text(TWO_GPUS)
    checkpoints = tmp_path / "checkpoints"  # the re-plan resumes its own copy of step 2
    shutil.copytree(pipeline_run.checkpoints / "step-00000002", checkpoints / "step-00000002")
    new = tmp_path / "replanned"
    run_planner("replan", str(old / "plan.json"), target, "--fix", fix, "--steps-left", "2",
                "--checkpoint-dir", str(checkpoints), "-o", str(new), *pipeline_run.inputs)
    plan = json.loads((new / "plan.json").read_text())
    assert (plan["strategy"]["tp"], plan["strategy"]["pp"], plan["strategy"]["dp"]) == shape
    probe = tmp_path / "probe"
    probe.mkdir()
    resumed, _ = launch(new, tmp_path / "resumed.json", "--precision", "fp32", env={
        "REPLAN_PROBE_DIR": str(probe),
        "PYTHONPATH": os.pathsep.join([str(PROBE), str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert resumed["first_step"] == 2
    assert resumed["losses"] == pytest.approx(whole["losses"][2:], abs=1e-4), (resumed["losses"], whole["losses"])
    migration = json.loads((new / "migration.json").read_text())
    for rank in migration["ranks"]:
        loaded = json.loads((probe / f"loaded-{rank['rank']}.json").read_text())
        assert loaded["state"] == rank["state_bytes"], (name, rank["rank"], loaded)
