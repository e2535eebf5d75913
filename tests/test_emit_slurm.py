"""Slurm target: job.sbatch, submitted as report.md says (`sbatch slurm/job.sbatch` from the plan folder).

The script runs under bash here with stand-ins for `srun` and `scontrol` on PATH (they record what they
are asked), as sbatch would run it: a spool copy of the script, $SLURM_SUBMIT_DIR the folder it was
submitted from.  One test goes all the way: the stand-in srun runs the command it is given (one node), so
the script's torchrun trains the DLRM runtime on a compiled plan.  shellcheck and `bash -n` check every
variant of the script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hardware import load_cluster
from models import load_model
from tools import shellcheck
from planner.emit import UnsupportedPlan, emitter
from planner.emit.inputs import LaunchInputs
from planner.emit.torch import train_args
from planner.job import Job
from launch_plans import big_plan, plan_of, tiny_plan
from ports import MULTIPROCESS, free_port

ROOT = Path(__file__).resolve().parents[1]
INPUTS = {"PLANNER_DATA": "/data/tok/corpus", "PLANNER_TOKENIZER": "meta-llama/Meta-Llama-3-70B",
          "PLANNER_CHECKPOINTS": "/lustre/ckpt/run 1", "PLANNER_TRAIN_STEPS": "1000"}

@pytest.fixture(scope="module")
def big():
    return big_plan()


@pytest.fixture(scope="module")
def tiny():
    return tiny_plan()


FAKE_SRUN = """#!/usr/bin/env bash
# stand-in for srun: record the working folder, the arguments and the NCCL/OpenMP environment
{ printf '%s\\n' "$PWD"; printf '%s\\n' "$@"; } > "$SRUN_LOG"
printf '%s\\n' "NCCL_IB_HCA=${NCCL_IB_HCA-unset}" "NCCL_DEBUG=${NCCL_DEBUG-unset}" "OMP=${OMP_NUM_THREADS-unset}" \\
    > "$SRUN_LOG.env"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
# stand-in for `scontrol show hostnames LIST`
[[ $1 == show && $2 == hostnames ]] || exit 1
printf '%s\\n' $FAKE_HOSTS
"""


def _bin(folder: Path, srun: str = FAKE_SRUN) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in (("srun", srun), ("scontrol", FAKE_SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _plan_folder(tmp: Path, script: str) -> Path:
    """A plan folder as `compile -o` writes it (plan.json, slurm/job.sbatch)."""
    folder = tmp / "plan"
    (folder / "slurm").mkdir(parents=True)
    (folder / "plan.json").write_text("{}\n")
    (folder / "slurm" / "job.sbatch").write_text(script)
    return folder


def _sbatch(tmp: Path, script: str, submit_dir: Path, env: dict[str, str], bin_dir: Path | None = None):
    """Run a spool copy of `script` as sbatch would, submitted from `submit_dir`."""
    spool = tmp / "spool"
    spool.mkdir(exist_ok=True)
    (spool / "slurm_script").write_text(script)
    bin_dir = bin_dir or _bin(tmp / "bin")
    full = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp), "SRUN_LOG": str(tmp / "srun.log"),
            "FAKE_HOSTS": "gpu-017 gpu-018", "SLURM_SUBMIT_DIR": str(submit_dir), "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "gpu-[017-018]", "SLURM_CPUS_ON_NODE": "224", **env}
    return subprocess.run(["bash", str(spool / "slurm_script")], cwd=spool, env=full, capture_output=True, text=True,
                          timeout=60)


def _directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH --"):].partition("=")
            out[key] = value
    return out


def test_directives_ask_for_whole_nodes_with_every_gpu(big, tiny):
    text = emitter("slurm")(*big)["job.sbatch"]
    assert _directives(text) == {"job-name": "planner-llama3-70b", "nodes": "8", "ntasks-per-node": "1",
                                 "gpus-per-node": "8", "exclusive": "", "output": "%x-%j.out"}
    # sbatch stops reading directives at the first command
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert "SBATCH_PARTITION" in text  # named where the partition directive would be
    given = emitter("slurm")(*big, LaunchInputs(partition="batch"))["job.sbatch"]
    assert _directives(given)["partition"] == "batch"
    cpu = _directives(emitter("slurm")(*tiny)["job.sbatch"])
    assert cpu["nodes"] == "2" and "gpus-per-node" not in cpu  # cpu nodes: gloo ranks, no GPUs


def test_submitted_from_the_plan_folder_srun_starts_one_torchrun_per_node(big, tmp_path):
    plan, job = big
    script = emitter("slurm")(plan, job)["job.sbatch"]
    folder = _plan_folder(tmp_path, script)
    done = _sbatch(tmp_path, script, folder, INPUTS)
    assert done.returncode == 0, done.stderr
    cwd, *argv = (tmp_path / "srun.log").read_text().splitlines()
    assert cwd == str(folder)  # the trainer's plan-relative paths (plan.json) resolve here
    assert argv[:3] == ["--ntasks-per-node=1", "--cpus-per-task=224", "--kill-on-bad-exit=1"]
    torchrun = argv[3:]
    assert torchrun[:13] == ["torchrun", "--nnodes", "8", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", "gpu-017:29500", "--rdzv-id", "4242", "-m", "planner.runtime.train"]
    trainer = torchrun[13:]
    options = dict(zip(trainer[::2], trainer[1::2]))
    assert options["--plan"] == "plan.json" and (folder / options["--plan"]).is_file()
    assert options["--data"] == INPUTS["PLANNER_DATA"] and options["--tokenizer"] == INPUTS["PLANNER_TOKENIZER"]
    assert options["--checkpoint-dir"] == "/lustre/ckpt/run 1"  # one argument, space and all
    assert options["--train-steps"] == "1000"
    # the words the torch target gives the trainer, as bash expands them
    words = " ".join(train_args(plan, job, LaunchInputs()))
    expanded = subprocess.run(["bash", "-c", f"printf '%s\\n' {words}"], env={**os.environ, **INPUTS},
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert trainer == expanded
    env = (tmp_path / "srun.log.env").read_text().splitlines()
    assert env == ["NCCL_IB_HCA==mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11", "NCCL_DEBUG=WARN",
                   "OMP=28"]


def test_submitted_from_the_slurm_folder_it_still_runs_in_the_plan_folder(big, tmp_path):
    script = emitter("slurm")(*big)["job.sbatch"]
    folder = _plan_folder(tmp_path, script)
    done = _sbatch(tmp_path, script, folder / "slurm", {**INPUTS, "NCCL_IB_HCA": "=mlx5_2", "MASTER_PORT": "31000"})
    assert done.returncode == 0, done.stderr
    cwd, *argv = (tmp_path / "srun.log").read_text().splitlines()
    assert cwd == str(folder) and "gpu-017:31000" in argv
    assert (tmp_path / "srun.log.env").read_text().splitlines()[0] == "NCCL_IB_HCA==mlx5_2"  # the site's value wins


def test_submitted_elsewhere_it_stops_naming_the_plan_folder(big, tmp_path):
    script = emitter("slurm")(*big)["job.sbatch"]
    _plan_folder(tmp_path, script)
    done = _sbatch(tmp_path, script, tmp_path, INPUTS)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"job.sbatch: no plan.json in {tmp_path}: submit from the plan folder "
                                   "(sbatch slurm/job.sbatch)")
    assert not (tmp_path / "srun.log").exists()


def test_an_input_not_given_stops_the_job_naming_its_variable(big, tmp_path):
    script = emitter("slurm")(*big)["job.sbatch"]
    folder = _plan_folder(tmp_path, script)
    done = _sbatch(tmp_path, script, folder, {k: v for k, v in INPUTS.items() if k != "PLANNER_TOKENIZER"})
    assert done.returncode != 0 and "PLANNER_TOKENIZER" in done.stderr
    assert not (tmp_path / "srun.log").exists()
    given = emitter("slurm")(*big, LaunchInputs(data="/d/x", tokenizer="tok", checkpoint_dir="ck", train_steps=5))
    assert "PLANNER_" not in given["job.sbatch"]  # every input given: nothing read from the environment


@pytest.mark.parametrize("target", ["slurm", "k8s"])
def test_plans_the_torch_runtime_cannot_run_are_refused(target):
    plan, job = plan_of("mixtral-8x7b", "dgx-h100:4", "tp=4,ep=8,dp=8,mbs=1,zero=1", batch=256)
    with pytest.raises(UnsupportedPlan, match="mixtral-8x7b"):
        emitter(target)(plan, job)


def _dlrm_out(tmp_path: Path, *targets: str) -> Path:
    """The folder `compile -o` writes for tiny-dlrm on one CPU node of 2 ranks (a short launch)."""
    from click.testing import CliRunner

    from planner.cli import cli

    cluster = tmp_path / "two.yaml"
    cluster.write_text("pools:\n  - {name: two, preset: cpu, nodes: 1, overrides: {gpus_per_node: 2}}\n")
    out = tmp_path / "dlrm"
    args = ["compile", "tiny-dlrm", str(cluster), "-b", "64", "-s", "1", "--time-limit", "2", "-o", str(out)]
    for target in targets:
        args += ["--target", target]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


RUN_SRUN = """#!/usr/bin/env bash
# stand-in for srun on a one-node allocation: run the command once
while [[ $1 == --* ]]; do shift; done
exec "$@"
"""


@MULTIPROCESS
def test_dlrm_job_trains_through_srun_and_torchrun(tmp_path):
    pytest.importorskip("torch")
    out = _dlrm_out(tmp_path, "slurm")
    report = (out / "report.md").read_text()
    assert "sbatch slurm/job.sbatch" in report and "SBATCH_PARTITION" in report
    script = (out / "slurm" / "job.sbatch").read_text()
    bin_dir = _bin(tmp_path / "bin", RUN_SRUN)
    python = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:{python}:{os.environ['PATH']}", "FAKE_HOSTS": "127.0.0.1", "SLURM_CPUS_ON_NODE": "2",
           "MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT)}
    done = _sbatch(tmp_path, script, out, env, bin_dir=bin_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2 loss" in done.stdout and "table_bytes 1" in done.stdout, done.stdout[-2000:]


def _shell_files(big, tiny) -> dict[str, str]:
    return {"dense-gpu": emitter("slurm")(*big)["job.sbatch"],
             "dense-gpu-given": emitter("slurm")(*big, LaunchInputs(partition="p", data="/d", tokenizer="t",
                                                                    checkpoint_dir="c d", train_steps=3))["job.sbatch"],
             "dense-cpu": emitter("slurm")(*tiny)["job.sbatch"]}


def test_every_script_passes_shellcheck_and_bash_n(big, tiny, tmp_path):
    from planner.emit.dlrm import emit_dlrm_slurm
    from planner.embedding.compile import compile_embedding
    from planner.embedding.plan_doc import EmbeddingCompileOptions, build_embedding_plan

    files = _shell_files(big, tiny)
    job = Job(model=load_model("tiny-dlrm"), cluster=load_cluster("dgx-a100-40g:2"), global_batch=64, seq_len=1)
    plan = build_embedding_plan(job, compile_embedding(job, time_limit=1), EmbeddingCompileOptions(time_limit=1))
    files["dlrm-gpu"] = emit_dlrm_slurm(plan, job)["slurm/job.sbatch"]
    for name, text in files.items():
        path = tmp_path / f"{name}.sbatch"
        path.write_text(text)
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, (name, syntax.stderr)
        lint = subprocess.run([shellcheck(), "--severity=style", str(path)], capture_output=True, text=True)
        assert lint.returncode == 0, (name, lint.stdout)
