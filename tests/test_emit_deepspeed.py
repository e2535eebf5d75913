"""The DeepSpeed emitter: every ds_config.json passes DeepSpeed's own DeepSpeedConfig.

DeepSpeedConfig reads the data-parallel world size from `mpu` (after asking
deepspeed.comm for the rank); the tests give it the plan's dp through a tiny
mpu so that its batch assertion (train_batch == micro * grad_acc * dp) runs
for real.  Plans come from the compiler (ZeRO 0-3 forced with --fix, offload
where nothing fits without it) or, for settings the search would not pick on
a quick job, from `evaluate` of a hand-written strategy.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")
ds_runtime_config = pytest.importorskip("deepspeed.runtime.config")

from hardware import load_cluster  # noqa: E402
from ports import MULTIPROCESS, free_port  # noqa: E402
from models import load_model  # noqa: E402
from planner.cli import cli  # noqa: E402
from planner.cost.evaluate import evaluate  # noqa: E402
from planner.emit.deepspeed import emit, layer_specs  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.plan.groups import build_plan  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import Certificate, CompileOptions, CompileResult  # noqa: E402
from planner.search.space import SpaceOptions  # noqa: E402
from planner.strategy import Strategy, parse_strategy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- plans


def compiled(model, cluster, batch, seq_len, fixed, precision="bf16"):
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq_len,
              precision=precision)
    options = CompileOptions(time_limit=20.0, space=SpaceOptions(fixed=fixed))
    return job, build_plan(job, compile_job(job, options), options)


def direct(model, cluster, batch, seq_len, spec, precision="bf16"):
    """A plan of a hand-written strategy (evaluated, not searched)."""
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq_len,
              precision=precision)
    estimate = evaluate(job, parse_strategy(spec))
    cert = Certificate(status="FEASIBLE", objective=estimate.step_time_s, bound=estimate.step_time_s, gap=0.0,
                       wall_s=0.0, configurations=1, solved=1, pruned=0)
    result = CompileResult(strategy=Strategy.model_validate(estimate.strategy), estimate=estimate,
                           certificate=cert, runners_up=[])
    return job, build_plan(job, result, CompileOptions())


# id: (builder, args, expected ds zero stage, expected optimizer offload, expected param offload)
CASES = {
    "zero0": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 0}), 0, None, None),
    "zero1": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 1}), 1, None, None),
    "zero2": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 2, "pp": 1}), 2, None, None),
    "zero3": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 3}), 3, None, None),
    "pp2-zero2-to-1": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 2, "pp": 2}), 1, None, None),
    "tp2-2nodes": (compiled, ("tiny-llama", "cpu:2", 16, 128, {"zero": 1, "tp": 2, "dp": 2}), 1, None, None),
    # nothing fits 8 T4s without offload: the compiler offloads to host DRAM
    "cpu-offload": (compiled, ("llama3-8b", "pcie-t4:1", 16, 4096, {"tp": 2, "mbs": 1}), 3, "cpu", "cpu"),
    # llama3-70b on 16 L4s: the compiler offloads the optimizer to NVMe (pp=2: ZeRO-1 + CPU in DeepSpeed)
    "nvme-offload-pp": (compiled, ("llama3-70b", "pcie-l4:2", 16, 4096,
                                   {"tp": 4, "pp": 2, "cp": 2, "vpp": 2, "mbs": 1}), 1, "cpu", None),
    "nvme-zero3": (direct, ("llama3-70b", "pcie-l4:2", 16, 4096,
                            "tp=4,pp=1,cp=1,mbs=1,zero=3,recompute=full,offload=all,offload_device=nvme"),
                   3, "nvme", "nvme"),
    "fp16-recompute-partial": (direct, ("llama3-8b", "dgx-h100:1", 16, 4096,
                                        "tp=2,pp=2,mbs=1,zero=1,recompute=full,recompute_layers=4"), 1, None, None),
    # fp8 needs a device with FP8 (the job refuses it elsewhere): 2 DGX H100 nodes, sharded within each
    "fp8-hsdp": (direct, ("tiny-llama", "dgx-h100:2", 16, 128, "tp=1,mbs=1,zero=3,shard=node"), 3, None, None),
    "partial-offload": (direct, ("llama3-8b", "pcie-t4:2", 16, 4096,
                                 "tp=2,mbs=1,zero=3,recompute=full,offload=optimizer,offload_ratio=0.5"),
                        3, "cpu", None),
    "zero0-offload-to-1": (direct, ("tiny-llama", "cpu:1", 8, 128, "mbs=1,zero=0,offload=optimizer"), 1, "cpu", None),
}
PRECISION = {"fp16-recompute-partial": "fp16", "fp8-hsdp": "fp8"}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    build, args, zero, opt, par = CASES[request.param]
    precision = PRECISION.get(request.param, "bf16")
    job, plan = build(*args, precision=precision)
    return request.param, job, plan, emit(plan, job), (zero, opt, par)


class _Mpu:
    """What DeepSpeedConfig asks Megatron's mpu for."""

    def __init__(self, dp: int, mp: int = 1) -> None:
        self.dp, self.mp = dp, mp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.mp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture
def ds_config_of(monkeypatch):
    # DeepSpeedConfig asks deepspeed.comm for the rank first and falls back to world size 1 when that fails
    # (no process group): answer it, so that the mpu's data-parallel size is used.
    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *args, **kwargs: 0)

    def make(config: dict, dp: int, mp: int = 1):
        return ds_runtime_config.DeepSpeedConfig(json.loads(json.dumps(config)), mpu=_Mpu(dp, mp))

    return make


# ---------------------------------------------------------------- DeepSpeed's validation


def _device(section) -> str | None:
    """Offload device of a parsed offload section (DeepSpeed keeps enum values as plain strings)."""
    if section is None:
        return None
    return str(getattr(section.device, "value", section.device))


def test_ds_config_passes_deepspeed_validation(case, ds_config_of):
    name, job, plan, files, (zero, opt, par) = case
    s = plan.strategy
    config = json.loads(files["ds_config.json"])
    cfg = ds_config_of(config, s.dp, s.tp * s.pp * s.cp)
    assert cfg.world_size == s.dp
    assert cfg.train_batch_size == plan.job.global_batch
    assert cfg.train_micro_batch_size_per_gpu == s.mbs
    assert cfg.gradient_accumulation_steps == plan.time.micro_batches
    assert cfg.train_batch_size == s.mbs * plan.time.micro_batches * s.dp
    assert cfg.zero_optimization_stage == zero
    offload_opt = cfg.zero_config.offload_optimizer
    offload_par = cfg.zero_config.offload_param
    assert _device(offload_opt) == opt
    assert _device(offload_par) == par
    if opt is not None:
        assert offload_opt.ratio == s.offload_ratio  # ZeRO-Offload++ share on CPU Adam
    for section in (offload_opt, offload_par):
        if _device(section) == "nvme":
            assert str(section.nvme_path) == "/local_nvme"
    assert cfg.gradient_clipping == 1.0
    assert cfg.optimizer_name == "adamw"
    if plan.job.precision == "fp16":
        assert cfg.float16_config.enabled and not cfg.bfloat16_config.enabled
    else:
        assert cfg.bfloat16_config.enabled and not cfg.float16_config.enabled
    if s.recompute == "full":
        ac = cfg.activation_checkpointing_config
        assert ac.number_checkpoints == max(stage.recompute_blocks for stage in plan.stages)
        assert ac.partition_activations == (s.tp > 1)
    else:
        assert "activation_checkpointing" not in config


def test_batch_assertion_is_live(case, ds_config_of):
    """The hook really feeds DeepSpeed the world size: a wrong dp fails its batch assertion."""
    _, _, plan, files, _ = case
    config = json.loads(files["ds_config.json"])
    with pytest.raises(AssertionError, match="train_batch_size"):
        ds_config_of(config, plan.strategy.dp + 1)


def test_substitutions_are_explained(case):
    name, _, plan, files, (zero, opt, par) = case
    readme = files["README.md"]
    config = json.loads(files["ds_config.json"])
    assert "_planner_note" not in config
    if plan.strategy.zero != zero:
        assert f"ZeRO stage {plan.strategy.zero} -> {zero}" in readme
    if plan.strategy.tp > 1 or plan.strategy.cp > 1:
        assert "--tensor-model-parallel-size" in readme
    if plan.job.precision == "fp8":
        assert "fp8 -> bf16" in readme
    if opt == "nvme" or par == "nvme":
        assert "/local_nvme" in readme
    if plan.strategy.offload_device == "nvme" and opt == "cpu":
        assert "nvme -> cpu" in readme
    if plan.strategy.shard == "node" and zero == 3:
        # hpZ's secondary partition is one node (4 ranks on the cpu preset, 8 on a DGX)
        per_node = plan.stages[0].ranks.spans[0].gpus_per_node
        assert config["zero_optimization"]["zero_hpz_partition_size"] == per_node == {"cpu": 4, "dgx-h100": 8}[
            plan.job.cluster.split(":")[0]]
    if name == "fp16-recompute-partial":
        assert "recompute=full on part of the blocks" in readme


def test_pipeline_json(case):
    _, job, plan, files, _ = case
    pipe = json.loads(files["pipeline.json"])
    s = plan.strategy
    specs = layer_specs(job)
    assert pipe["stages"] == s.pp == len(pipe["parts"]) - 1
    assert pipe["schedule"] == "1F1B"
    assert pipe["layers"] == specs and specs[0] == "embedding" and specs[-1] == "head"
    parts = pipe["parts"]
    assert parts[0] == 0 and parts[-1] == len(specs) and parts == sorted(parts)
    for i, stage in enumerate(plan.stages):
        owned = specs[parts[i]:parts[i + 1]]
        blocks = [int(name.split(".")[1]) for name in owned if name.startswith("block.")]
        expected = list(range(stage.blocks[0], stage.blocks[1] + 1)) if stage.blocks else []
        assert blocks == expected
    assert (pipe["tensor_model_parallel_size"], pipe["pipeline_model_parallel_size"],
            pipe["data_parallel_size"], pipe["context_parallel_size"]) == (s.tp, s.pp, s.dp, s.cp)
    assert pipe["world_size"] == plan.job.num_gpus
    assert pipe["activation_checkpoint_interval"] == (1 if s.recompute == "full" else 0)


def test_hostfile_and_launch(case):
    _, _, plan, files, _ = case
    lines = files["hostfile"].splitlines()
    slots = [int(line.split("slots=")[1]) for line in lines]
    assert all(line.startswith("node-") for line in lines)
    assert sum(slots) == plan.job.num_gpus
    launch = files["launch.sh"]
    assert launch.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in launch
    assert '"${TRAIN_SCRIPT:-train.py}"' in launch
    assert "--deepspeed --deepspeed_config ds_config.json" in launch
    assert "--master_port 29500" in launch
    if len(lines) == 1:
        assert "--hostfile" not in launch and f"--num_gpus {slots[0]}" in launch
    else:
        assert f"--hostfile \"$host_file\" --num_nodes {len(lines)}" in launch
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=launch, text=True, check=True)


def test_emit_is_deterministic(case):
    _, job, plan, files, _ = case
    again = emit(plan.model_copy(deep=True), job)
    assert again == files
    for path, text in files.items():
        assert text.endswith("\n"), path
        if path.endswith(".json"):
            assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"


# ---------------------------------------------------------------- launch.sh runs


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launch_sh_under_slurm_uses_allocation_hosts(tmp_path):
    job, plan = compiled("tiny-llama", "cpu:2", 16, 128, {"zero": 1, "tp": 2, "dp": 2})
    files = emit(plan, job)
    folder = tmp_path / "deepspeed"
    folder.mkdir()
    for path, text in files.items():
        (folder / path).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        "deepspeed": '#!/usr/bin/env bash\necho "cwd=$(pwd)"\necho "args=$*"\ncat "$2"\n',
        "scontrol": '#!/usr/bin/env bash\nprintf "gpu-a\\ngpu-b\\n"\n',
    }
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    (tmp_path / "train.py").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-[a-b]",
           "TRAIN_SCRIPT": "train.py"}
    out = subprocess.run(["bash", str(folder / "launch.sh"), "--extra", "1"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert f"cwd={folder}" in out
    assert (f"args=--hostfile hostfile.slurm --num_nodes 2 --num_gpus 4 --master_port 29500 {tmp_path}/train.py "
            "--deepspeed --deepspeed_config ds_config.json --extra 1") in out
    assert "gpu-a slots=4\ngpu-b slots=4\n" in out


def test_compile_cli_writes_deepspeed_folder(tmp_path):
    # default targets: the plan keeps ZeRO-2 with pp, and the deepspeed folder substitutes ZeRO-1
    out = tmp_path / "out"
    args = ["compile", "tiny-llama", "cpu:1", "--batch", "8", "--seq-len", "128", "--fix", "pp=2,zero=2,vpp=1"]
    result = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (out / "deepspeed").iterdir())
    assert names == ["README.md", "ds_config.json", "hostfile", "launch.sh", "pipeline.json"]
    assert json.loads((out / "deepspeed" / "ds_config.json").read_text())["zero_optimization"]["stage"] == 1
    assert "ZeRO stage 2 -> 1" in (out / "deepspeed" / "README.md").read_text()
    # --target deepspeed keeps the search to what DeepSpeed runs, which --fix zero=2 with pp=2 is not
    named = CliRunner().invoke(cli, [*args, "--target", "deepspeed"])
    assert named.exit_code == 1 and "ZeRO stages 0/1 with pipeline parallelism" in named.output


# ---------------------------------------------------------------- DeepSpeed engine, CPU, 2 processes


def _gloo_ok() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
def test_engine_trains_zero3_plan_on_cpu(tmp_path):
    cluster = tmp_path / "cpu-2.yaml"  # one node of 2 CPU "GPUs": a dp=2 plan for 2 processes
    cluster.write_text("name: cpu-2\npools:\n  - name: cpu\n    preset: cpu\n    nodes: 1\n"
                       "    overrides: {gpus_per_node: 2}\n")
    job, plan = compiled("tiny-llama", str(cluster), 8, 128, {"zero": 3, "tp": 1, "pp": 1, "cp": 1})
    assert plan.strategy.dp == 2 and plan.strategy.zero == 3
    files = emit(plan, job)
    (tmp_path / "ds_config.json").write_text(files["ds_config.json"])
    script = ROOT / "tests" / "e2e" / "ds_train.py"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(script), str(tmp_path / "ds_config.json"), str(tmp_path / "losses.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert losses["zero_stage"] == 3 and losses["world_size"] == 2
    assert losses["gradient_accumulation_steps"] == plan.time.micro_batches
    assert len(losses["losses"]) == 3
    assert losses["losses"][-1] < losses["losses"][0]


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
def test_pipeline_engine_trains_pp2_plan_on_cpu(tmp_path):
    """DeepSpeed's PipelineEngine runs a pp=2 plan split at pipeline.json's `parts` (not DeepSpeed's own split)."""
    cluster = tmp_path / "cpu-2.yaml"  # one node of 2 CPU "GPUs": a pp=2 plan for 2 processes
    cluster.write_text("name: cpu-2\npools:\n  - name: cpu\n    preset: cpu\n    nodes: 1\n"
                       "    overrides: {gpus_per_node: 2}\n")
    job, plan = compiled("tiny-llama", str(cluster), 8, 128, {"pp": 2, "tp": 1, "dp": 1, "cp": 1})
    assert (plan.strategy.pp, plan.strategy.dp, plan.job.num_gpus) == (2, 1, 2)
    files = emit(plan, job)
    for name in ("ds_config.json", "pipeline.json"):
        (tmp_path / name).write_text(files[name])
    pipe = json.loads(files["pipeline.json"])
    out = tmp_path / "out"
    out.mkdir()
    script = ROOT / "tests" / "e2e" / "ds_pipe_train.py"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(script), str(tmp_path / "ds_config.json"), str(tmp_path / "pipeline.json"), str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}
    specs, parts = pipe["layers"], pipe["parts"]
    for i, stage in enumerate(plan.stages):
        for r in range(stage.ranks.first_rank, stage.ranks.last_rank + 1):
            got = ranks[r]
            assert got["stage"] == i and got["num_stages"] == 2 and got["parts"] == parts
            assert (got["start"], got["stop"]) == (parts[i], parts[i + 1])
            assert got["layers"] == specs[parts[i]:parts[i + 1]]  # the layers each rank built
            blocks = [int(name.split(".")[1]) for name in got["layers"] if name.startswith("block.")]
            assert blocks == (list(range(stage.blocks[0], stage.blocks[1] + 1)) if stage.blocks else [])
            assert got["micro_batches"] == got["gradient_accumulation_steps"] == plan.time.micro_batches
    last = [got for got in ranks.values() if got["is_last_stage"]]
    assert len(last) == 1 and last[0]["stage"] == 1
    losses = last[0]["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]
