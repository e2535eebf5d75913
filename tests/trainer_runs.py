"""Compile tiny-llama for the torch runtime and run the emitted torch/launch.sh under torchrun (gloo, CPU):
the helpers of the runtime's end-to-end tests (tests/test_runtime.py, test_trainer.py, test_replan_resume.py),
and the launch they share (tests/conftest.py `pipeline_run`).

A launch's cost is almost all start-up (torchrun, four interpreters importing torch, the process groups),
not its steps, so the tests share launches where one run answers several questions.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the trainer options every end-to-end launch passes: a learning rate that lowers the loss within a few steps
TRAIN = ("--lr", "1e-2", "--warmup-steps", "1")
# the shared run's plan: pipeline (pp=2) x FSDP2 ZeRO-3 (dp=2) on cpu:1's 4 ranks
PIPELINE_FIX = "pp=2,dp=2,zero=3,vpp=1"


def run_planner(*args: str) -> None:
    """`planner ARGS`, in this process (click's CliRunner: these tests are about the launch, not the command's
    process boundary, which tests/test_cli.py and tests/test_output_safety.py cross)."""
    from click.testing import CliRunner

    from planner.cli import cli

    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    assert result.exit_code == 0, result.output[-4000:]


def compile_tiny(out: Path, fix: str, *extra: str, cluster: str = "cpu:1") -> Path:
    """`planner compile tiny-llama CLUSTER -b 8 -s 64 --fix FIX --target torch -o OUT` with `extra`; OUT."""
    run_planner("compile", "tiny-llama", cluster, "-b", "8", "-s", "64", "--fix", fix, "-o", str(out), "--target",
            "torch", "--force", *extra)
    return out


def launch(folder: Path, report: Path, *args: str, env: dict[str, str] | None = None,
           timeout: float = 240, warm: bool = True) -> tuple[dict, subprocess.CompletedProcess]:
    """folder/torch/launch.sh on a free port with TRAIN, `--report REPORT` and `args`; (the report, the run).

    `warm`: the script's torchrun is tests/warm_torchrun.py (ranks forked from an interpreter that has
    imported torch; see there why), else the torchrun executable itself."""
    from ports import free_port
    from warm_torchrun import shim_dir

    port = free_port()
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RUN_ID": f"test-{port}", **(env or {})}
    if warm:
        environ["PATH"] = f"{shim_dir(report.parent / 'warm-bin')}{os.pathsep}{environ['PATH']}"
    try:
        run = subprocess.run(["bash", str(folder / "torch" / "launch.sh"), *TRAIN, "--report", str(report), *args],
                             env=environ, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:  # with the stacks the warm launcher dumps (warm_torchrun.HANG_DUMP)
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr or ""
        raise AssertionError(f"the launch did not end within {timeout} s; its stderr ends:\n{stderr[-8000:]}") from None
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(report.read_text()), run


@dataclass(frozen=True)
class PipelineRun:
    """The shared launch: PIPELINE_FIX trained 4 steps in fp32 from `dataset`, checkpoints after steps 2 and 4.

    Tests read it and never write into it: one that changes checkpoints copies them first."""

    plan: Path  # the plan folder (plan.json, torch/launch.sh)
    checkpoints: Path  # step-00000002 and step-00000004, beside the plan folder
    inputs: tuple[str, ...]  # the compile's launch inputs (--data ... --save-every 2)
    report: dict  # the trainer's JSON report (rank 0)
    stdout: str  # rank 0's output


def pipeline_run(root: Path, dataset: Path) -> PipelineRun:
    inputs = ("--data", str(dataset), "--tokenizer", "bytes", "--train-steps", "4", "--save-every", "2")
    plan = compile_tiny(root / "plan", PIPELINE_FIX, *inputs, "--checkpoint-dir", "../checkpoints")
    # the real torchrun executable: the one default launch whose ranks start as fresh interpreters
    report, run = launch(plan, root / "report.json", "--precision", "fp32", warm=False)
    return PipelineRun(plan=plan, checkpoints=root / "checkpoints", inputs=inputs, report=report, stdout=run.stdout)
