"""The torch runtime: reference model vs the planner's parameter counts, the torch emitter, and
end-to-end runs of the emitted launch.sh under torchrun on CPU (gloo, 4 processes).

End to end, each forced shape is compiled on the cpu preset with the launch inputs, trained for 4
steps in fp32 on a tiny byte-level dataset (one of them is the launch the trainer's and the re-plan's
tests share: tests/conftest.py pipeline_run), every rank's parameter bytes are held to the plan's
prediction: stages[i].params_per_gpu x 4 bytes (fp32 parameters; also the master parameters under bf16
mixed precision, tests/test_memory_fidelity.py), divided by dp when zero >= 1 (FSDP2 keeps parameters
sharded at rest for every ZeRO stage; see planner/runtime/parallelize.py), and all layouts give the same
losses and gradient norms.  Under tensor parallelism both keep the norm weights whole on
every rank (Layer.tp_replicated_params) and split the rest, so the bytes match exactly.  The model is
built on the meta device: no rank ever holds more than its own shards, one init block and the rotary
tables (measured by planner.runtime.materialize.InitMemory), far below the whole model.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from models.transformer import llama  # noqa: E402
from models.zoo import get_entry, get_model  # noqa: E402
from planner.emit import UnsupportedPlan, emitter  # noqa: E402
from planner.emit.inputs import LaunchInputs  # noqa: E402
from planner.emit.torch import train_args  # noqa: E402
from planner.runtime.model import Transformer  # noqa: E402
from planner.runtime.parallelize import _check_supported, apply_ac, mesh_shape  # noqa: E402
from planner.plan.schema import Plan  # noqa: E402
from planner.runtime.train import compute_dtype, synthetic_batch  # noqa: E402
from ports import MULTIPROCESS  # noqa: E402
from trainer_runs import PIPELINE_FIX, compile_tiny, launch  # noqa: E402


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- model


def test_tiny_llama_params_equal_model_graph():
    model = Transformer(get_entry("tiny-llama").config)
    assert _count(model) == get_model("tiny-llama").params == 180_800


@pytest.mark.parametrize("name", ["llama3-8b", "mistral-7b", "llama2-7b"])
def test_zoo_llama_params_equal_model_graph(name):
    with torch.device("meta"):
        model = Transformer(get_entry(name).config)
    assert _count(model) == get_model(name).params


def test_layers_keyed_by_block_and_stage_pieces_dropped():
    cfg = llama(name="t", num_layers=4, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64)
    model = Transformer(cfg)
    assert list(model.layers.keys()) == ["0", "1", "2", "3"]
    model.keep_blocks(1, 2, first_stage=False, last_stage=True)
    assert list(model.layers.keys()) == ["1", "2"] and model.tok_embeddings is None and model.output is not None
    out = model(torch.randn(2, 8, 32))
    assert out.shape == (2, 8, 64)


def test_unsupported_config_names_the_field():
    with pytest.raises(ValueError, match="activation"):
        Transformer(get_entry("gpt2-xl").config)


def test_synthetic_data_follows_a_permutation():
    tokens, labels = synthetic_batch(0, batch=4, seq_len=16, vocab=32)
    assert tokens.shape == labels.shape == (4, 16)
    assert torch.equal(tokens[:, 1:], labels[:, :-1])
    # the same token is always followed by the same token
    pairs = {}
    for t, n in zip(tokens.flatten().tolist(), labels.flatten().tolist()):
        assert pairs.setdefault(t, n) == n


# ---------------------------------------------------------------- compile + emit


def _compile(tmp_path: Path, fix: str, *inputs: str) -> Path:
    return compile_tiny(tmp_path / "out", fix, *inputs)


def _inputs(dataset: Path) -> tuple[str, ...]:
    # the checkpoint folder is left to $PLANNER_CHECKPOINTS at launch (the environment-variable path)
    return ("--data", str(dataset), "--tokenizer", "bytes", "--train-steps", "4")


def test_torch_emitter_launch_and_readme(tmp_path):
    out = _compile(tmp_path, "pp=2,tp=2")
    launch = (out / "torch" / "launch.sh").read_text()
    assert launch.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in launch
    assert 'cd "$(dirname "$0")/.."' in launch  # the plan folder
    assert "torchrun --nnodes 1 --nproc_per_node 4 --rdzv_backend c10d" in launch
    assert '--rdzv_endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}"' in launch
    assert '--rdzv_id "${RUN_ID:-planner}"' in launch
    command = " ".join(launch.split("-m planner.runtime.train", 1)[1].replace("\\\n", " ").split())
    assert command.startswith("--plan plan.json --data \"${PLANNER_DATA:?set PLANNER_DATA: ")
    assert '--checkpoint-dir "${PLANNER_CHECKPOINTS:?set PLANNER_CHECKPOINTS: ' in command
    assert command.endswith('--save-every 1000 "$@"')
    assert subprocess.run(["bash", "-n", str(out / "torch" / "launch.sh")]).returncode == 0
    assert os.access(out / "torch" / "launch.sh", os.X_OK)
    readme = (out / "torch" / "README.md").read_text()
    assert "every node" in readme and "PLANNER_DATA" in readme and "--stop-at-step" in readme
    plan = Plan.model_validate_json((out / "plan.json").read_text())
    # launch.sh passes no --precision: the trainer computes in the plan's precision, bf16 mixed precision (the
    # end-to-end runs below ask for fp32; tests/test_memory_fidelity.py measures bf16 runs)
    assert "--precision" not in launch and plan.job.precision == "bf16"
    assert compute_dtype(plan, "plan", out / "plan.json") is torch.bfloat16
    assert compute_dtype(plan, "bf16", out / "plan.json") is torch.bfloat16
    assert compute_dtype(plan, "fp32", out / "plan.json") is None
    given = LaunchInputs(data="data/train", tokenizer="bytes", checkpoint_dir="ck dir", train_steps=7, save_every=3)
    assert train_args(plan, None, given) == ["--plan", "plan.json", "--data", "data/train", "--tokenizer", "bytes",
                                             "--checkpoint-dir", "'ck dir'", "--train-steps", "7", "--save-every", "3"]
    assert "--checkpoint-dir 'ck dir'" in emitter("torch")(plan, None, given)["launch.sh"].replace("\\\n    ", "")
    fp8 = plan.model_copy(update={"job": plan.job.model_copy(update={"precision": "fp8"})})
    with pytest.raises(UnsupportedPlan, match="precision fp8"):
        emitter("torch")(fp8, None)
    files = emitter("torch")(plan, None)
    assert files == emitter("torch")(plan, None)  # deterministic
    assert mesh_shape(plan) == {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 2}
    for update, message in (({"ep": 2}, "ep=2: not supported"),
                            ({"offload": "optimizer", "offload_device": "nvme"}, "offload_device=nvme")):
        with pytest.raises(ValueError, match=message):
            _check_supported(plan.model_copy(update={"strategy": plan.strategy.model_copy(update=update)}))
        with pytest.raises(UnsupportedPlan, match=message):
            emitter("torch")(plan.model_copy(update={"strategy": plan.strategy.model_copy(update=update)}), None)
    gpt = plan.model_copy(update={"job": plan.job.model_copy(update={"model": "gpt2-xl"})})
    with pytest.raises(UnsupportedPlan, match="activation"):
        emitter("torch")(gpt, None)
    hsdp = plan.model_copy(update={"strategy": plan.strategy.model_copy(
        update={"tp": 1, "pp": 1, "dp": 8, "zero": 3, "shard": "node"})})
    assert mesh_shape(hsdp) == {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 1}


def test_activation_checkpointing_keeps_the_math():
    cfg = llama(name="t", num_layers=3, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64)
    torch.manual_seed(0)
    plain = Transformer(cfg)
    torch.manual_seed(0)
    wrapped = Transformer(cfg)
    apply_ac(wrapped, blocks=2)
    assert [type(b).__name__ for b in wrapped.layers.values()] == ["CheckpointWrapper"] * 2 + ["TransformerBlock"]
    tokens = torch.randint(64, (2, 8))
    for model in (plain, wrapped):
        model(tokens).square().mean().backward()
    for a, b in zip(plain.parameters(), wrapped.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


# ---------------------------------------------------------------- end to end


def _gloo_ok() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


def _predicted_bytes(plan: Plan, rank: int) -> float:
    # FSDP2 shards each stage over dp x cp ranks, the cost model's ZeRO shard group (shard_degree).
    s = plan.strategy
    stage = plan.stages[rank // (s.tp * s.cp * s.dp)]
    shards = s.dp * s.cp if s.zero >= 1 else 1
    return stage.params_per_gpu * 4 / shards


def _rope_bytes(plan: Plan) -> int:
    """The rotary tables of one model chunk: cos and sin, max_positions x head_dim / 2 fp32 values each."""
    cfg = get_entry(plan.job.model).config
    return 2 * cfg.max_positions * cfg.head_dim // 2 * 4


# Each layout trains 4 steps in fp32 from the same data, as the shared pipeline run (tests/conftest.py
# pipeline_run: pp=2 x dp=2, ZeRO-3), which is the first case here.
# pp x tp repeats two paths the default run covers one at a time, and DualPipeV the V layout and split
# backward of ZB-V: they run under `-m long` (README).
LAYOUTS = [
    (PIPELINE_FIX, 3, "1f1b"),               # pipeline + FSDP2 (ZeRO-3)
    ("tp=2,dp=2,zero=2", 2, "1f1b"),         # 2D: tensor parallel + FSDP2's strided shards, no reshard after forward
    pytest.param("pp=2,tp=2,vpp=1,zero=0", 0, "1f1b", marks=pytest.mark.long),  # pipeline + tp, no data parallelism
    ("pp=2,vpp=2,dp=2,zero=2", 2, "interleaved"),  # interleaved pipeline: two chunks per rank
    ("cp=2,dp=2,zero=2", 2, "1f1b"),         # context parallel: FSDP2 over dp x cp
    # zero-bubble V schedules (torch ScheduleZBVZeroBubble / ScheduleDualPipeV): chunks 0 and 3 on the first
    # stage (embedding and head), 1 and 2 on the second; split backwards, 4 micro-batches per replica
    ("pp=2,vpp=2,dp=2,zero=2,mbs=1,schedule=zbv", 2, "zbv"),
    pytest.param("pp=2,vpp=2,dp=2,zero=2,mbs=1,schedule=dualpipev", 2, "dualpipev", marks=pytest.mark.long),
]


@pytest.fixture(scope="module")
def layout_run(request, tmp_path_factory, dataset):
    """fix -> (plan, the trainer's report, rank 0's output): each layout compiled and launched once, by
    the first test that asks for it."""
    root, runs = tmp_path_factory.mktemp("layouts"), {}

    def run(fix: str) -> tuple[Plan, dict, str]:
        if fix == PIPELINE_FIX:
            shared = request.getfixturevalue("pipeline_run")
            runs[fix] = (Plan.model_validate_json((shared.plan / "plan.json").read_text()), shared.report,
                         shared.stdout)
        if fix not in runs:
            folder = root / fix.replace(",", "_").replace("=", "")
            out = compile_tiny(folder / "out", fix, *_inputs(dataset))
            report, done = launch(out, folder / "report.json", "--precision", "fp32",
                                  env={"PLANNER_CHECKPOINTS": str(folder / "checkpoints")})
            runs[fix] = (Plan.model_validate_json((out / "plan.json").read_text()), report, done.stdout)
        return runs[fix]

    return run


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("fix, zero, schedule", LAYOUTS)
def test_launch_sh_trains_and_matches_param_prediction(layout_run, fix, zero, schedule):
    plan, data, stdout = layout_run(fix)
    assert plan.strategy.zero == zero and plan.strategy.schedule == schedule and plan.job.num_gpus == 4
    losses = [float(line.split()[3]) for line in stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert data["losses"] == pytest.approx(losses, abs=1e-5)
    # fp32 throughout, as --precision fp32 asks (the plan's bf16 mixed precision: tests/test_memory_fidelity.py)
    assert data["precision"] == "fp32" and set(data["compute_dtype"].values()) == {"float32"}
    printed = {line.split()[1]: int(line.split()[2]) for line in stdout.splitlines() if line.startswith("param_bytes ")}
    assert printed == data["param_bytes"]
    measured = {int(rank): b for rank, b in data["param_bytes"].items()}
    assert sorted(measured) == [0, 1, 2, 3]
    whole = get_model("tiny-llama").params * 4
    for rank, got in measured.items():
        want = _predicted_bytes(plan, rank)
        assert got == pytest.approx(want, rel=0.01), (rank, got, want)  # the bar
        assert got == want  # and in fact exactly the cost model's parameters
        # meta-device init: the most this rank ever held while building the model is its own shards, one
        # init block and each chunk's rotary tables with their temporaries, never the whole model
        peak, block = data["init_peak_bytes"][str(rank)], data["init_block_bytes"][str(rank)]
        assert got <= peak <= got + block + 4 * _rope_bytes(plan) * plan.strategy.vpp, (rank, peak)
        assert peak < whole


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("fix, zero, schedule", LAYOUTS[1:])
def test_layouts_train_the_same_model(layout_run, fix, zero, schedule):
    # Same init (layout-independent, materialized per rank), same data, same global mean loss and the
    # same global gradient norm: splitting sequences over cp (K/V all-gathered), layers over (interleaved)
    # pipeline stages, or matrices over tp with FSDP2's strided shards must not change the math, only where
    # it runs.  fp32 (--precision fp32), so that only the reduction order differs.  Among the layouts, pairs
    # share no pass (pp=2 x tp=2 without data parallelism, cp=2 x dp=2): if all agree, none changed the math.
    reference = layout_run(PIPELINE_FIX)[1]
    assert reference["grad_norms"][0] > 1.0  # clipped: the norm is the one the clipping used
    other = layout_run(fix)[1]
    assert other["losses"] == pytest.approx(reference["losses"], rel=1e-5), fix
    assert other["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5), fix
