"""The torch runtime: reference model vs the planner's parameter counts, the torch emitter, and
end-to-end runs of the emitted launch.sh under torchrun on CPU (gloo, 4 processes).

End to end, each forced shape is compiled on the cpu preset, trained for 6 steps, and every
rank's parameter bytes are held to the plan's prediction: stages[i].params_per_gpu x 4 bytes
(the runtime keeps fp32 parameters), divided by dp when zero >= 1 (FSDP2 keeps parameters
sharded at rest for every ZeRO stage; see planner/runtime/parallelize.py).  Under tensor
parallelism both keep the norm weights whole on every rank (Layer.tp_replicated_params) and
split the rest, so the bytes match exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from models.transformer import llama  # noqa: E402
from models.zoo import get_entry, get_model  # noqa: E402
from planner.emit import UnsupportedPlan, emitter  # noqa: E402
from planner.runtime.model import Transformer  # noqa: E402
from planner.runtime.parallelize import _check_supported, apply_ac, mesh_shape  # noqa: E402
from planner.plan.schema import Plan  # noqa: E402
from planner.runtime.train import synthetic_batch  # noqa: E402
from ports import MULTIPROCESS, free_port  # noqa: E402


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


def _compile(tmp_path: Path, fix: str) -> Path:
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "planner", "compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "64",
                    "--fix", fix, "-o", str(out), "--target", "torch", "--force"],
                   check=True, capture_output=True, text=True, timeout=120)
    return out


def test_torch_emitter_launch_and_readme(tmp_path):
    out = _compile(tmp_path, "pp=2,tp=2")
    launch = (out / "torch" / "launch.sh").read_text()
    assert launch.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in launch
    assert 'cd "$(dirname "$0")"' in launch
    assert "torchrun --nnodes 1 --nproc_per_node 4 --rdzv_backend c10d" in launch
    assert '--rdzv_endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}"' in launch
    assert '--rdzv_id "${RUN_ID:-planner}"' in launch
    assert launch.rstrip().endswith('-m planner.runtime.train --plan ../plan.json "$@"')
    assert os.access(out / "torch" / "launch.sh", os.X_OK)
    readme = (out / "torch" / "README.md").read_text()
    assert "every node" in readme and "--steps" in readme
    plan = Plan.model_validate_json((out / "plan.json").read_text())
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


def _launch(out: Path, tmp_path: Path, steps: int = 6) -> tuple[list[float], dict]:
    """Run the emitted torch/launch.sh on a free port; (losses printed by rank 0, the JSON report)."""
    report = tmp_path / f"report-{out.name}.json"
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RUN_ID": f"test-{port}"}
    run = subprocess.run(["bash", str(out / "torch" / "launch.sh"), "--steps", str(steps), "--report", str(report)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    losses = [float(line.split()[3]) for line in run.stdout.splitlines() if line.startswith("step ")]
    data = json.loads(report.read_text())
    printed = {line.split()[1]: int(line.split()[2]) for line in run.stdout.splitlines()
               if line.startswith("param_bytes ")}
    assert printed == data["param_bytes"]
    return losses, data


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("fix, zero, schedule", [
    ("pp=2,dp=2,zero=3,vpp=1", 3, "1f1b"),       # pipeline + FSDP2 (ZeRO-3)
    ("tp=2,dp=2,zero=2", 2, "1f1b"),         # 2D: tensor parallel + FSDP2 without reshard after forward
    ("pp=2,tp=2,vpp=1", 0, "1f1b"),              # pipeline + tensor parallel, no data parallelism
    ("pp=2,vpp=2,dp=2,zero=2", 2, "interleaved"),  # interleaved pipeline: two chunks per rank
    ("cp=2,dp=2,zero=2", 2, "1f1b"),         # context parallel: FSDP2 over dp x cp
])
def test_launch_sh_trains_and_matches_param_prediction(tmp_path, fix, zero, schedule):
    out = _compile(tmp_path, fix)
    plan = Plan.model_validate_json((out / "plan.json").read_text())
    assert plan.strategy.zero == zero and plan.strategy.schedule == schedule and plan.job.num_gpus == 4
    losses, data = _launch(out, tmp_path)
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    assert data["losses"] == pytest.approx(losses, abs=1e-5)
    measured = {int(rank): b for rank, b in data["param_bytes"].items()}
    assert sorted(measured) == [0, 1, 2, 3]
    for rank, got in measured.items():
        want = _predicted_bytes(plan, rank)
        assert got == pytest.approx(want, rel=0.01), (rank, got, want)  # the bar
        assert got == want  # and in fact exactly the cost model's parameters


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
def test_context_and_interleaved_parallel_train_the_same_model_as_data_parallel(tmp_path):
    # Same init, same data, same global mean loss: splitting sequences over cp (K/V all-gathered)
    # or layers over interleaved chunks must not change the math, only where it runs.
    reference, _ = _launch(_compile(tmp_path / "dp", "dp=4,zero=2"), tmp_path, steps=3)
    losses, _ = _launch(_compile(tmp_path / "pp-vpp-cp", "pp=2,vpp=2,cp=2"), tmp_path, steps=3)
    assert losses == pytest.approx(reference, rel=1e-4), (losses, reference)
