"""The torch runtime as a trainer: learning-rate schedule, gradient clipping, meta-device materialization,
user errors, and (torchrun, gloo, 4 processes) save / stop / resume with torch.distributed.checkpoint.

The resume test trains a pp=2 x dp=2 FSDP2 (ZeRO-3) plan in bf16 on a tiny byte-level dataset: one run
straight through 4 steps, one stopped after step 2 (`--stop-at-step`, checkpointing it), and one started
again in the stopped run's folder, which resumes from that checkpoint.  The resumed steps' losses and
gradient norms equal the uninterrupted run's exactly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from models.transformer import llama  # noqa: E402
from planner.runtime.materialize import InitMemory, materialize  # noqa: E402
from planner.runtime.model import Transformer  # noqa: E402
from planner.runtime.optim import OptimConfig, clip_grads, global_grad_norm, lr_factor  # noqa: E402
from ports import MULTIPROCESS, free_port  # noqa: E402
from tokens import write_tokens  # noqa: E402

CFG = llama(name="t", num_layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64, max_positions=16)


# ---------------------------------------------------------------- schedule and clipping


def test_warmup_then_cosine():
    config = OptimConfig(lr=1.0, warmup_steps=4, train_steps=14, min_lr_ratio=0.1)
    assert [lr_factor(s, config) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]  # linear, peak at the last warmup step
    assert lr_factor(4, config) == 1.0  # cosine starts at the peak
    assert lr_factor(9, config) == pytest.approx(0.55)  # halfway: (1 + 0.1) / 2
    assert lr_factor(14, config) == pytest.approx(0.1)  # the end: min_lr_ratio of the peak
    factors = [lr_factor(s, config) for s in range(4, 15)]
    assert factors == sorted(factors, reverse=True)


def test_clipping_matches_torch_on_whole_tensors():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, r in zip(params, reference):
        p.grad = torch.randn_like(p) * 10
        r.grad = p.grad.clone()
    want = torch.nn.utils.clip_grad_norm_(reference, 1.0)  # torch's own, on whole tensors
    norm = global_grad_norm(params, stage_ranks=1, reduce=lambda t: None)  # one process: nothing to sum
    assert float(norm) == pytest.approx(float(want), rel=1e-6)
    # replicated pieces count once: a tensor every one of 4 stage ranks holds, summed over the 4 ranks
    copies = global_grad_norm(params, stage_ranks=4, reduce=lambda t: t.mul_(4))
    assert float(copies) == pytest.approx(float(norm), rel=1e-6)
    clip_grads(params, 1.0, norm)
    for p, r in zip(params, reference):
        assert torch.allclose(p.grad, r.grad, rtol=1e-6)


# ---------------------------------------------------------------- meta-device materialization


def test_meta_build_materializes_the_same_model():
    direct = Transformer(CFG, seed=7)
    with InitMemory() as memory:
        with torch.device("meta"):
            meta = Transformer(CFG)
        assert all(p.device.type == "meta" for p in meta.parameters())
        assert memory.peak == 0  # shapes only: nothing allocated
        materialize([meta], device=torch.device("cpu"), seed=7)
    for (name, a), (_, b) in zip(direct.state_dict().items(), meta.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(direct.rope_cos, meta.rope_cos) and torch.equal(direct.rope_sin, meta.rope_sin)
    params = sum(p.numel() * p.element_size() for p in meta.parameters())
    buffers = sum(b.numel() * b.element_size() for b in meta.buffers())
    # one process holds the whole model; on top of it at most one init block (at most one parameter here)
    # and the rotary tables' temporaries (angles, cos, sin: 3 x the buffers' size)
    assert params + buffers <= memory.peak <= params + 4 * buffers + max(p.numel() * 4 for p in meta.parameters())
    tokens = torch.randint(64, (2, 8))
    assert torch.equal(direct(tokens), meta(tokens))
    other = Transformer(CFG, seed=8)
    assert not torch.equal(other.output.weight, direct.output.weight)
    assert torch.equal(direct.layers["0"].attention_norm.weight, torch.ones(32))


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_tokens(tmp_path_factory.mktemp("data"))


def compile_plan(out: Path, fix: str, *extra: str) -> Path:
    subprocess.run([sys.executable, "-m", "planner", "compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "64",
                    "--fix", fix, "-o", str(out), "--target", "torch", "--force", *extra],
                   check=True, capture_output=True, text=True, timeout=120)
    return out


def _edited(out: Path, name: str, edit) -> str:
    """A copy of the plan beside it (outside the plan folder) with `edit` applied to its JSON; its path."""
    plan = json.loads((out / "plan.json").read_text())
    edit(plan)
    path = out.parent / name
    path.write_text(json.dumps(plan))
    return str(path)


def test_trainer_user_errors_are_one_line(tmp_path, dataset, capsys, monkeypatch):
    from planner.runtime import train

    for name in train.TORCHRUN_ENV:  # started by hand, not by torchrun
        monkeypatch.delenv(name, raising=False)
    out = compile_plan(tmp_path / "plan", "dp=4,zero=3")
    fp8 = _edited(out, "fp8.json", lambda plan: plan["job"].update(precision="fp8"))
    blocks = _edited(out, "blocks.json", lambda plan: plan["stages"][0].update(blocks=[0, 99]))
    boolean = _edited(out, "boolean.json", lambda plan: plan["strategy"].update(tp=True))
    for args, message in (
        (["--data", str(dataset), "--tokenizer", "gpt2"], "train.idx: tokenizer: written with 'bytes'"),
        (["--data", str(tmp_path / "none")], "none.idx: no such file"),
        (["--stop-at-step", "20", "--train-steps", "10"], "--stop-at-step: must be within 1..--train-steps"),
        (["--plan", fp8], "fp8.json: job.precision: fp8: the planner torch runtime trains in bf16"),
        (["--plan", str(out / "absent.json")], "absent.json: --plan: cannot read: No such file"),
        # issue #26: an edited plan, non-finite options, checkpoints inside the plan folder, no torchrun
        (["--plan", blocks], "blocks.json: stages[0].blocks: [0, 99], the strategy puts blocks [0, 3] of the "
                             "model's 4 there"),
        (["--plan", boolean], "boolean.json: strategy.tp: expected a number, got bool True"),
        (["--lr", "nan"], "--lr: must be a finite number above 0, got nan"),
        (["--grad-clip", "inf"], "--grad-clip: must be a finite number at least 0, got inf"),
        (["--checkpoint-dir", str(out / "checkpoints")], f"--checkpoint-dir: inside planner's output folder {out}"),
        ([], "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set: start the trainer with torchrun"),
    ):
        with pytest.raises(SystemExit) as exit_info:  # before any process group: nothing to tear down
            train.main(["--plan", str(out / "plan.json"), *args])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1, err
        assert message in err


def _run(out: Path, report: Path, *args: str) -> tuple[dict, str]:
    """torch/launch.sh of `out` with extra trainer arguments; (the report, rank 0's output)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RUN_ID": f"test-{port}"}
    run = subprocess.run(["bash", str(out / "torch" / "launch.sh"), "--lr", "1e-2", "--warmup-steps", "1",
                          "--report", str(report), *args], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(report.read_text()), run.stdout


@MULTIPROCESS
def test_stop_and_resume_continue_the_uninterrupted_run(tmp_path, dataset):
    fix = "pp=2,dp=2,zero=3,vpp=1"
    inputs = ("--data", str(dataset), "--tokenizer", "bytes", "--train-steps", "4", "--save-every", "2")
    # checkpoints beside each plan folder, never inside one (--force replaces that)
    straight = compile_plan(tmp_path / "straight", fix, *inputs, "--checkpoint-dir", "../straight-checkpoints")
    stopped = compile_plan(tmp_path / "stopped", fix, *inputs, "--checkpoint-dir", "../stopped-checkpoints")
    whole, log = _run(straight, tmp_path / "whole.json")
    assert whole["precision"] == "bf16" and set(whole["compute_dtype"].values()) == {"bfloat16"}
    assert len(whole["losses"]) == 4 and whole["losses"][-1] < whole["losses"][0]
    assert "saved checkpoint" in log and (tmp_path / "straight-checkpoints" / "step-00000002" / ".metadata").is_file()

    first, log = _run(stopped, tmp_path / "first.json", "--stop-at-step", "2")
    assert first["losses"] == whole["losses"][:2]
    assert sorted(p.name for p in (tmp_path / "stopped-checkpoints").iterdir()) == ["step-00000002"]

    resumed, log = _run(stopped, tmp_path / "resumed.json")
    assert "resumed from ../stopped-checkpoints/step-00000002 (step 2, data position 16)" in log
    assert resumed["first_step"] == 2
    assert resumed["losses"] == whole["losses"][2:]  # exactly: same shards, same data, same optimizer state
    assert resumed["grad_norms"] == whole["grad_norms"][2:]
    assert all(math.isfinite(x) for x in resumed["losses"])


@MULTIPROCESS
def test_a_damaged_newest_checkpoint_is_passed_over(tmp_path, dataset):
    """Issue #26: the newest checkpoints are damaged (an empty step folder, a garbage .metadata, truncated
    shards): the run says which it passes over and resumes from the newest one that loads."""
    out = compile_plan(tmp_path / "plan", "pp=2,dp=2,zero=3,vpp=1", "--data", str(dataset), "--tokenizer", "bytes",
                       "--train-steps", "4", "--save-every", "2", "--checkpoint-dir", "../ck")
    whole, _ = _run(out, tmp_path / "whole.json")  # checkpoints after steps 2 and 4
    ck = tmp_path / "ck"
    for shard in (ck / "step-00000004").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:64])
    (ck / "step-00000008").mkdir()
    for part in (ck / "step-00000002").iterdir():
        (ck / "step-00000008" / part.name).write_bytes(part.read_bytes())
    (ck / "step-00000008" / ".metadata").write_bytes(b"not a pickle")
    (ck / "step-00000009").mkdir()  # a save that never finished
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RUN_ID": f"test-{port}"}
    report = tmp_path / "resumed.json"
    run = subprocess.run(["bash", str(out / "torch" / "launch.sh"), "--lr", "1e-2", "--warmup-steps", "1",
                          "--report", str(report)], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    passed_over = [line for line in run.stderr.splitlines() if "warning: passed over checkpoint" in line]
    assert [line.split("checkpoint ../ck/")[1].split(":")[0] for line in passed_over] == [
        "step-00000009", "step-00000008", "step-00000004"], passed_over
    assert "resumed from ../ck/step-00000002 (step 2, data position 16)" in run.stdout
    resumed = json.loads(report.read_text())
    assert resumed["first_step"] == 2 and resumed["losses"] == whole["losses"][2:]
