"""The DeepSpeed emitter: every ds_config.json passes DeepSpeed's own DeepSpeedConfig, as the engine builds it.

DeepSpeedConfig takes the data-parallel world size from `mpu`, or, without one, from deepspeed.comm's
world size (after asking it for the rank). planner.runtime.deepspeed_train passes no Megatron-style mpu.
Without pipeline parallelism the engine gets none, and the world is every rank. Under a PipelineModule,
deepspeed.initialize uses the module's own mpu, whose data-parallel size comes from DeepSpeed's
PipeDataParallelTopology(num_pp=pp, num_dp=world // pp). The tests answer deepspeed.comm with the plan's
world size and, for pipelines, build that topology, so the batch assertion
(train_batch == micro * grad_acc * dp) runs for real. Plans come from the compiler (ZeRO 0-3 forced with
--fix) or, for settings the search would not pick on a quick job, from `evaluate` of a hand-written
strategy. launch.sh runs under bash with fake `deepspeed` and `scontrol` commands that record what they
were asked, and shellcheck checks it.
"""

from __future__ import annotations

import json
import os
import re
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
ds_lr_schedules = pytest.importorskip("deepspeed.runtime.lr_schedules")
ds_topology = pytest.importorskip("deepspeed.runtime.pipe.topology")

from hardware import load_cluster  # noqa: E402
from ports import MULTIPROCESS, free_port  # noqa: E402
from models import load_model  # noqa: E402
from tools import shellcheck  # noqa: E402
from planner.cli import cli  # noqa: E402
from planner.cost.evaluate import evaluate  # noqa: E402
from planner.emit import UnsupportedPlan  # noqa: E402
from planner.emit.deepspeed import emit, layer_specs  # noqa: E402
from planner.emit.inputs import LaunchInputs  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.plan.assemble import build_plan  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import Certificate, CompileOptions, CompileResult  # noqa: E402
from planner.search.space import SpaceOptions  # noqa: E402
from planner.strategy import Strategy, parse_strategy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 1000  # train_steps given to the emitter in most tests
GIVEN = LaunchInputs(data="data/c4", tokenizer="meta-llama/Meta-Llama-3-8B", checkpoint_dir="ckpt",
                     train_steps=STEPS, save_every=250)


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
    "zero0": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 0, "tp": 1, "cp": 1}), 0, None, None),
    "zero1": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 1, "tp": 1, "cp": 1}), 1, None, None),
    "zero2": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 2, "pp": 1, "tp": 1, "cp": 1}), 2, None, None),
    "zero3": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 3, "tp": 1, "cp": 1}), 3, None, None),
    "pp2-zero2-to-1": (compiled, ("tiny-llama", "cpu:1", 8, 128, {"zero": 2, "pp": 2, "tp": 1, "cp": 1}),
                       1, None, None),
    "dp8-2nodes": (compiled, ("tiny-llama", "cpu:2", 16, 128, {"zero": 1, "tp": 1, "cp": 1, "pp": 1}), 1, None, None),
    "pp2-2nodes": (compiled, ("tiny-llama", "cpu:2", 16, 128, {"zero": 1, "tp": 1, "cp": 1, "pp": 2}), 1, None, None),
    "cpu-offload": (direct, ("llama3-8b", "pcie-t4:1", 16, 4096, "tp=1,mbs=1,zero=3,recompute=full,offload=all"),
                    3, "cpu", "cpu"),
    # NVMe optimizer offload under a pipeline: ZeRO-1 with the optimizer on the host in DeepSpeed
    "nvme-offload-pp": (direct, ("llama3-70b", "pcie-l4:2", 16, 4096,
                                 "tp=1,pp=2,mbs=1,zero=2,recompute=full,offload=optimizer,offload_device=nvme"),
                        1, "cpu", None),
    "nvme-zero3": (direct, ("llama3-70b", "pcie-l4:2", 16, 4096,
                            "tp=1,pp=1,cp=1,mbs=1,zero=3,recompute=full,offload=all,offload_device=nvme"),
                   3, "nvme", "nvme"),
    "fp16-recompute-partial": (direct, ("llama3-8b", "dgx-h100:1", 16, 4096,
                                        "tp=1,pp=2,mbs=1,zero=1,recompute=full,recompute_layers=4"), 1, None, None),
    # fp8 needs a device with FP8 (the job refuses it elsewhere): 2 DGX H100 nodes, sharded within each
    "fp8-hsdp": (direct, ("tiny-llama", "dgx-h100:2", 16, 128, "tp=1,mbs=1,zero=3,shard=node"), 3, None, None),
    "partial-offload": (direct, ("llama3-8b", "pcie-t4:2", 16, 4096,
                                 "tp=1,mbs=1,zero=3,recompute=full,offload=optimizer,offload_ratio=0.5"),
                        3, "cpu", None),
    "zero0-offload-to-1": (direct, ("tiny-llama", "cpu:1", 8, 128, "mbs=1,zero=0,offload=optimizer"), 1, "cpu", None),
    # DeepSpeed's MoE layer: expert parallelism over 8 of 32 ranks; ZeRO-3 refused with MoE, stage 2 written
    "moe-ep8": (direct, ("mixtral-8x7b", "dgx-h100:4", 256, 4096, "ep=8,mbs=1,zero=2,recompute=full"), 2, None, None),
    "moe-zero3-to-2": (direct, ("tiny-mixtral", "cpu:1", 8, 128, "ep=2,mbs=1,zero=3"), 2, None, None),
}
PRECISION = {"fp16-recompute-partial": "fp16", "fp8-hsdp": "fp8", "cpu-offload": "fp16",  # T4s have no bf16
             "partial-offload": "fp16"}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    build, args, zero, opt, par = CASES[request.param]
    precision = PRECISION.get(request.param, "bf16")
    job, plan = build(*args, precision=precision)
    return request.param, job, plan, emit(plan, job, GIVEN), (zero, opt, par)


class _PipelineMpu:
    """What a PipelineModule's mpu (PipelineParallelGrid) tells DeepSpeedConfig: its data-parallel size is
    DeepSpeed's own PipeDataParallelTopology(num_pp=pp, num_dp=world // pp) 'data' dimension, as
    PipelineModule builds it (deepspeed/runtime/pipe/module.py)."""

    def __init__(self, world: int, pp: int) -> None:
        self.topology = ds_topology.PipeDataParallelTopology(num_pp=pp, num_dp=world // pp)

    def get_data_parallel_world_size(self) -> int:
        return max(self.topology.get_dim("data"), 1)

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture
def ds_config_of(monkeypatch):
    """DeepSpeedConfig of a config dict as deepspeed.initialize builds it for planner.runtime.deepspeed_train
    on `world` ranks: no mpu without a pipeline, the PipelineModule's mpu with one."""
    world_size = {"value": 1}
    # DeepSpeedConfig asks deepspeed.comm for the rank first and falls back to world size 1 when that fails (no
    # process group): answer it, and its world size, as an initialized group of `world` ranks would
    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *args, **kwargs: 0)
    monkeypatch.setattr(ds_runtime_config.dist, "get_world_size", lambda *args, **kwargs: world_size["value"])

    def make(config: dict, world: int, pp: int = 1):
        world_size["value"] = world
        mpu = _PipelineMpu(world, pp) if pp > 1 else None
        return ds_runtime_config.DeepSpeedConfig(json.loads(json.dumps(config)), mpu=mpu)

    return make


# ---------------------------------------------------------------- DeepSpeed's validation


def _device(section) -> str | None:
    """Offload device of a parsed offload section (DeepSpeed keeps enum values as plain strings)."""
    if section is None:
        return None
    return str(getattr(section.device, "value", section.device))


def test_ds_config_passes_deepspeed_validation_without_an_mpu(case, ds_config_of):
    name, job, plan, files, (zero, opt, par) = case
    s = plan.strategy
    config = json.loads(files["ds_config.json"])
    cfg = ds_config_of(config, plan.job.num_gpus, s.pp)
    assert cfg.world_size == s.dp == plan.job.num_gpus // s.pp
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
    assert cfg.scheduler_name == "WarmupCosineLR"
    assert (cfg.scheduler_params["total_num_steps"], cfg.scheduler_params["warmup_num_steps"]) == (STEPS, 10)
    if plan.job.precision == "fp16":
        assert cfg.float16_config.enabled and not cfg.bfloat16_config.enabled
    else:
        assert cfg.bfloat16_config.enabled and not cfg.float16_config.enabled
    if s.recompute == "full":
        ac = cfg.activation_checkpointing_config
        assert ac.number_checkpoints == max(stage.recompute_blocks for stage in plan.stages)
        assert ac.partition_activations is False
    else:
        assert "activation_checkpointing" not in config


def test_batch_assertion_is_live(case, ds_config_of):
    """The hook really feeds DeepSpeed the world size: one rank more fails its batch assertion, and so does a
    pipeline config read as if there were no pipeline."""
    _, _, plan, files, _ = case
    config = json.loads(files["ds_config.json"])
    with pytest.raises(AssertionError, match="train_batch_size"):
        ds_config_of(config, plan.job.num_gpus * 2, plan.strategy.pp)
    if plan.strategy.pp > 1:
        with pytest.raises(AssertionError, match="train_batch_size"):
            ds_config_of(config, plan.job.num_gpus, 1)


def test_scheduler_is_deepspeeds_warmup_cosine():
    """DeepSpeed's own WarmupCosineLR, built from the emitted params: linear warmup from 0 over 1% of the
    steps, the optimizer's lr at the end of warmup, cosine decay to 10% of it at the last step."""
    import torch

    job, plan = compiled("tiny-llama", "cpu:1", 8, 128, {"zero": 1, "tp": 1, "cp": 1})
    config = json.loads(emit(plan, job, GIVEN)["ds_config.json"])
    lr = config["optimizer"]["params"]["lr"]
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    assert config["scheduler"]["type"] == "WarmupCosineLR"
    schedule = getattr(ds_lr_schedules, config["scheduler"]["type"])(optimizer, **config["scheduler"]["params"])
    lrs = []  # lrs[i]: the learning rate at DeepSpeed's batch iteration i (the engine steps it once per step)
    for i in range(STEPS + 1):
        schedule.step()
        assert schedule.last_batch_iteration == i
        lrs.append(schedule.get_last_lr()[0])
    assert lrs[0] == 0.0
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # warmup: 10 of 1000 steps
    assert lrs[10] == pytest.approx(lr, rel=1e-5) and max(lrs) == lrs[10]
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[STEPS] == pytest.approx(0.1 * lr)


@pytest.mark.parametrize("spec, what", [("tp=2,pp=1", "tensor parallelism (tp=2)"),
                                        ("tp=1,cp=2", "context parallelism (cp=2)")])
def test_plans_the_trainer_cannot_run_are_refused(spec, what):
    # planner.runtime.deepspeed_train has no tensor or context parallelism, and without them no Megatron-style
    # mpu: their ds_config.json would not hold (DeepSpeed would count every rank as data parallel)
    job, plan = direct("tiny-llama", "cpu:1", 8, 128, f"{spec},mbs=1,zero=1")
    with pytest.raises(UnsupportedPlan, match=re.escape(f"deepspeed_train has no {what}")):
        emit(plan, job)


def test_substitutions_are_explained(case):
    name, _, plan, files, (zero, opt, par) = case
    readme = files["README.md"]
    config = json.loads(files["ds_config.json"])
    assert "_planner_note" not in config
    if plan.strategy.zero != zero:
        assert f"ZeRO stage {plan.strategy.zero} -> {zero}" in readme
    if plan.job.precision == "fp8":
        assert "fp8 -> bf16" in readme
    if opt == "nvme" or par == "nvme":
        assert "/local_nvme" in readme
    if plan.strategy.offload_device == "nvme" and opt == "cpu":
        assert "nvme -> cpu" in readme
    if plan.strategy.shard == "node" and zero == 3:
        # hpZ's secondary partition is one node (8 ranks on a DGX)
        per_node = plan.stages[0].ranks.spans[0].gpus_per_node
        assert config["zero_optimization"]["zero_hpz_partition_size"] == per_node == 8
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
    assert pipe["expert_parallel_size"] == s.ep
    assert ("moe" in pipe) == bool(job.model.num_experts)


def test_emit_is_deterministic(case):
    _, job, plan, files, _ = case
    again = emit(plan.model_copy(deep=True), job, GIVEN)
    assert again == files
    for path, text in files.items():
        assert text.endswith("\n"), path
        if path.endswith(".json"):
            assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"


# ---------------------------------------------------------------- launch.sh


def _write_folder(tmp_path: Path, files: dict[str, str]) -> Path:
    """The plan folder as `planner compile -o` writes it: plan.json next to deepspeed/."""
    plan_dir = tmp_path / "plan"
    folder = plan_dir / "deepspeed"
    folder.mkdir(parents=True)
    (plan_dir / "plan.json").write_text("{}\n")
    for path, text in files.items():
        (folder / path).write_text(text)
    return plan_dir


def _fake_commands(tmp_path: Path) -> Path:
    """A bin folder whose `deepspeed` writes its arguments, one a line, and the working directory to
    deepspeed.args, and whose `scontrol` answers two hostnames."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        "deepspeed": f'#!/usr/bin/env bash\n{{ pwd; printf "%s\\n" "$@"; }} > "{tmp_path}/deepspeed.args"\n',
        "scontrol": '#!/usr/bin/env bash\nprintf "gpu-a\\ngpu-b\\n"\n',
    }
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return bin_dir


def _launch(tmp_path: Path, plan_dir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """Run deepspeed/launch.sh from the plan folder, as report.md says, with the fake commands first on PATH."""
    bin_dir = tmp_path / "bin" if (tmp_path / "bin").is_dir() else _fake_commands(tmp_path)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "SLURM_"))}
    return subprocess.run(["bash", "deepspeed/launch.sh", *args], cwd=plan_dir, capture_output=True, text=True,
                          env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})


def _trainer_args(tmp_path: Path) -> tuple[str, list[str], list[str]]:
    """(working directory, launcher arguments, trainer arguments) that launch.sh gave `deepspeed`."""
    cwd, *args = (tmp_path / "deepspeed.args").read_text().splitlines()
    split = args.index("planner.runtime.deepspeed_train")
    assert args[split - 1] == "--module"
    return cwd, args[:split - 1], args[split + 1:]


def test_launch_sh_passes_shellcheck(case, tmp_path):
    _, _, plan, files, _ = case
    for inputs in (GIVEN, LaunchInputs()):
        (tmp_path / "launch.sh").write_text(emit(plan, case[1], inputs)["launch.sh"])
        result = subprocess.run([shellcheck(), "--shell=bash", str(tmp_path / "launch.sh")], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launch_sh_runs_the_trainer_through_deepspeeds_launcher(case, tmp_path):
    _, job, plan, files, _ = case
    plan_dir = _write_folder(tmp_path, files)
    result = _launch(tmp_path, plan_dir, {}, "--extra", "1")
    assert result.returncode == 0, result.stderr
    cwd, launcher, trainer = _trainer_args(tmp_path)
    folder = plan_dir / "deepspeed"
    assert cwd == str(plan_dir)  # the launcher starts every rank where launch.sh was started
    slots = [int(line.split("slots=")[1]) for line in files["hostfile"].splitlines()]
    assert sum(slots) == plan.job.num_gpus
    if len(slots) == 1:
        assert launcher[:2] == ["--num_gpus", str(slots[0])] and "--hostfile" not in launcher
    else:
        assert launcher[:4] == ["--hostfile", str(folder / "hostfile"), "--num_nodes", str(len(slots))]
    assert launcher[-3:] == ["--master_port", "29500", "--no_local_rank"]
    # the pipeline partition, or a mixture-of-experts model's `moe` section, travels in pipeline.json
    pipeline = ["--pipeline", str(folder / "pipeline.json")] if plan.strategy.pp > 1 or job.model.num_experts else []
    assert trainer == ["--ds-config", str(folder / "ds_config.json"), *pipeline,
                       "--plan", str(folder / ".." / "plan.json"), "--data", "data/c4",
                       "--tokenizer", "meta-llama/Meta-Llama-3-8B", "--checkpoint-dir", str(plan_dir / "ckpt"),
                       "--train-steps", str(STEPS), "--save-every", "250", "--extra", "1"]
    assert (folder / ".." / "plan.json").is_file()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launch_sh_reads_missing_inputs_at_launch(tmp_path, ds_config_of):
    """Inputs not given to compile come from PLANNER_* variables. The step count is written into a copy of
    ds_config.json, which DeepSpeed accepts and whose schedule has 1% warmup."""
    job, plan = compiled("tiny-llama", "cpu:2", 16, 128, {"zero": 1, "tp": 1, "cp": 1, "pp": 2})
    files = emit(plan, job)
    assert "total_num_steps" not in json.loads(files["ds_config.json"])["scheduler"]["params"]
    plan_dir = _write_folder(tmp_path, files)
    env = {"PLANNER_DATA": "/data/tokens", "PLANNER_TOKENIZER": "tok", "PLANNER_CHECKPOINTS": "/ckpt",
           "PLANNER_TRAIN_STEPS": "250"}
    missing = _launch(tmp_path, plan_dir, {k: v for k, v in env.items() if k != "PLANNER_TOKENIZER"})
    assert missing.returncode != 0 and "set PLANNER_TOKENIZER" in missing.stderr
    assert not (tmp_path / "deepspeed.args").exists()
    bad = _launch(tmp_path, plan_dir, {**env, "PLANNER_TRAIN_STEPS": "ten"})
    assert bad.returncode == 2 and "positive integer, not 'ten'" in bad.stderr
    assert not (tmp_path / "deepspeed.args").exists()
    result = _launch(tmp_path, plan_dir, env)
    assert result.returncode == 0, result.stderr
    _, _, trainer = _trainer_args(tmp_path)
    config_path = Path(trainer[trainer.index("--ds-config") + 1])
    assert config_path == plan_dir / "deepspeed" / "ds_config.steps-250.json"
    assert trainer[trainer.index("--train-steps") + 1] == "250"
    assert trainer[trainer.index("--data") + 1] == "/data/tokens"
    assert trainer[trainer.index("--checkpoint-dir") + 1] == "/ckpt"
    cfg = ds_config_of(json.loads(config_path.read_text()), plan.job.num_gpus, plan.strategy.pp)
    assert (cfg.scheduler_params["total_num_steps"], cfg.scheduler_params["warmup_num_steps"]) == (250, 3)
    assert cfg.train_batch_size == 16


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launch_sh_under_slurm_uses_allocation_hosts(tmp_path):
    job, plan = compiled("tiny-llama", "cpu:2", 16, 128, {"zero": 1, "tp": 1, "cp": 1, "pp": 1})
    files = emit(plan, job, GIVEN)
    plan_dir = _write_folder(tmp_path, files)
    result = _launch(tmp_path, plan_dir, {"SLURM_JOB_NODELIST": "gpu-[a-b]"})
    assert result.returncode == 0, result.stderr
    _, launcher, _ = _trainer_args(tmp_path)
    host_file = plan_dir / "deepspeed" / "hostfile.slurm"
    assert launcher[:6] == ["--hostfile", str(host_file), "--num_nodes", "2", "--num_gpus", "4"]
    assert host_file.read_text() == "gpu-a slots=4\ngpu-b slots=4\n"


def test_compile_cli_writes_deepspeed_folder(tmp_path):
    # default targets: the plan keeps ZeRO-2 with pp, and the deepspeed folder substitutes ZeRO-1
    out = tmp_path / "out"
    args = ["compile", "tiny-llama", "cpu:1", "--batch", "8", "--seq-len", "128", "--fix", "pp=2,zero=2,vpp=1"]
    result = CliRunner().invoke(cli, [*args, "-o", str(out), "--train-steps", "100"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (out / "deepspeed").iterdir())
    assert names == ["README.md", "ds_config.json", "hostfile", "launch.sh", "pipeline.json"]
    config = json.loads((out / "deepspeed" / "ds_config.json").read_text())
    assert config["zero_optimization"]["stage"] == 1
    assert config["scheduler"]["params"]["total_num_steps"] == 100
    assert "ZeRO stage 2 -> 1" in (out / "deepspeed" / "README.md").read_text()
    # --target deepspeed keeps the search to what DeepSpeed runs, which --fix zero=2 with pp=2 is not
    named = CliRunner().invoke(cli, [*args, "--target", "deepspeed"])
    assert named.exit_code == 1 and "ZeRO stages 0/1 with pipeline parallelism" in named.output


# ---------------------------------------------------------------- DeepSpeed engine, CPU, 2 processes


def _without_scheduler(text: str) -> str:
    """ds_config.json without its scheduler. The engine tests check that 3 steps lower the loss, and DeepSpeed's
    warmup keeps the learning rate at 0 for the first two (iteration -1 before the first step, then ratio 0 at
    iteration 0). test_scheduler_is_deepspeeds_warmup_cosine tests the schedule on its own."""
    config = json.loads(text)
    del config["scheduler"]
    return json.dumps(config)


def _gloo_ok() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.long  # the planner runtime's DeepSpeed trainer runs the same plans by default (test_deepspeed_train.py)
@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
def test_engine_trains_zero3_plan_on_cpu(tmp_path):
    cluster = tmp_path / "cpu-2.yaml"  # one node of 2 CPU "GPUs": a dp=2 plan for 2 processes
    cluster.write_text("name: cpu-2\npools:\n  - name: cpu\n    preset: cpu\n    nodes: 1\n"
                       "    overrides: {gpus_per_node: 2}\n")
    job, plan = compiled("tiny-llama", str(cluster), 8, 128, {"zero": 3, "tp": 1, "pp": 1, "cp": 1})
    assert plan.strategy.dp == 2 and plan.strategy.zero == 3
    files = emit(plan, job, LaunchInputs(train_steps=3))
    (tmp_path / "ds_config.json").write_text(_without_scheduler(files["ds_config.json"]))
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


@pytest.mark.long  # the planner runtime's DeepSpeed trainer runs the same plans by default (test_deepspeed_train.py)
@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
def test_pipeline_engine_trains_pp2_plan_on_cpu(tmp_path):
    """DeepSpeed's PipelineEngine runs a pp=2 plan split at pipeline.json's `parts` (not DeepSpeed's own split)."""
    cluster = tmp_path / "cpu-2.yaml"  # one node of 2 CPU "GPUs": a pp=2 plan for 2 processes
    cluster.write_text("name: cpu-2\npools:\n  - name: cpu\n    preset: cpu\n    nodes: 1\n"
                       "    overrides: {gpus_per_node: 2}\n")
    job, plan = compiled("tiny-llama", str(cluster), 8, 128, {"pp": 2, "tp": 1, "dp": 1, "cp": 1})
    assert (plan.strategy.pp, plan.strategy.dp, plan.job.num_gpus) == (2, 1, 2)
    files = emit(plan, job, LaunchInputs(train_steps=3))
    (tmp_path / "ds_config.json").write_text(_without_scheduler(files["ds_config.json"]))
    (tmp_path / "pipeline.json").write_text(files["pipeline.json"])
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
