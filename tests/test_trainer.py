"""The torch runtime as a trainer: learning-rate schedule, gradient clipping, meta-device materialization,
user errors, and (torchrun, gloo, 4 processes) save / stop / resume with torch.distributed.checkpoint.

The resume tests read a pp=2 x dp=2 FSDP2 (ZeRO-3) plan trained in fp32 on a tiny byte-level dataset: the
run straight through 4 steps that the runtime's and the re-plan's tests share (tests/conftest.py
pipeline_run), one stopped after step 2 (`--stop-at-step`, checkpointing it), and one started again in the
stopped run's folder, which passes over damaged newer checkpoints and resumes from step 2.  The resumed
steps' losses and gradient norms equal the uninterrupted run's exactly.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from models.transformer import llama  # noqa: E402
from planner.runtime.materialize import InitMemory, materialize  # noqa: E402
from planner.runtime.model import Transformer  # noqa: E402
from planner.runtime.optim import OptimConfig, clip_grads, global_grad_norm, lr_factor  # noqa: E402
from ports import MULTIPROCESS, one_launch_at_a_time  # noqa: E402
from trainer_runs import compile_tiny, launch  # noqa: E402

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
    out = compile_tiny(tmp_path / "plan", "dp=4,zero=3")
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


@pytest.fixture(scope="module")
def stopped_and_resumed(pipeline_run, tmp_path_factory):
    """The shared pipeline run's plan (tests/conftest.py pipeline_run: 4 steps, checkpoints every 2) stopped
    after step 2 (`--stop-at-step 2`) into a checkpoint folder of its own, then started again in that folder,
    where newer checkpoints are damaged (issue #26): a truncated step 4 (the shared run's, its shards cut), a
    step 8 whose .metadata is garbage and an empty step 9 (a save that never finished).
    (folder, stopped run's report, its listing of the folder, resumed run's report, the resumed run)."""
    root = tmp_path_factory.mktemp("stop-resume")
    ck = root / "ck"
    plan, fp32 = pipeline_run.plan, ("--precision", "fp32")
    with one_launch_at_a_time(tmp_path_factory):
        first, _ = launch(plan, root / "first.json", *fp32, "--stop-at-step", "2", "--checkpoint-dir", str(ck))
        listing = sorted(p.name for p in ck.iterdir())
        shutil.copytree(pipeline_run.checkpoints / "step-00000004", ck / "step-00000004")
        for shard in (ck / "step-00000004").glob("*.distcp"):
            shard.write_bytes(shard.read_bytes()[:64])
        shutil.copytree(ck / "step-00000002", ck / "step-00000008")
        (ck / "step-00000008" / ".metadata").write_bytes(b"not a pickle")
        (ck / "step-00000009").mkdir()
        resumed, run = launch(plan, root / "resumed.json", *fp32, "--checkpoint-dir", str(ck))
    return ck, first, listing, resumed, run


@MULTIPROCESS
def test_stop_and_resume_continue_the_uninterrupted_run(pipeline_run, stopped_and_resumed):
    whole = pipeline_run.report
    assert len(whole["losses"]) == 4 and whole["losses"][-1] < whole["losses"][0]
    assert "saved checkpoint" in pipeline_run.stdout
    assert (pipeline_run.checkpoints / "step-00000002" / ".metadata").is_file()

    ck, first, listing, resumed, run = stopped_and_resumed
    assert first["losses"] == whole["losses"][:2] and first["grad_norms"] == whole["grad_norms"][:2]
    assert listing == ["step-00000002"]  # stopped after step 2: saved there, and nothing after

    assert f"resumed from {ck}/step-00000002 (step 2, data position 16)" in run.stdout
    assert resumed["first_step"] == 2
    assert resumed["losses"] == whole["losses"][2:]  # exactly: same shards, same data, same optimizer state
    assert resumed["grad_norms"] == whole["grad_norms"][2:]
    assert all(math.isfinite(x) for x in resumed["losses"])


@MULTIPROCESS
def test_a_damaged_newest_checkpoint_is_passed_over(stopped_and_resumed):
    """Issue #26: the newest checkpoints are damaged (an empty step folder, a garbage .metadata, truncated
    shards): the run says which it passes over and resumes from the newest one that loads."""
    ck, _, _, resumed, run = stopped_and_resumed
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    passed_over = [line for line in run.stderr.splitlines() if "warning: passed over checkpoint" in line]
    assert [line.split(f"checkpoint {ck}/")[1].split(":")[0] for line in passed_over] == [
        "step-00000009", "step-00000008", "step-00000004"], passed_over
    assert f"resumed from {ck}/step-00000002 (step 2, data position 16)" in run.stdout
    assert resumed["first_step"] == 2
