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
from planner.plan import Plan  # noqa: E402
from planner.runtime.train import synthetic_batch  # noqa: E402


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- model


def test_tiny_llama_params_equal_model_graph():
    model = Transformer(get_entry("tiny-llama").config)
    assert _count(model) == get_model("tiny-llama").params == 106_816


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
    for key in ("cp", "vpp"):
        with pytest.raises(ValueError, match=f"{key}=2: not supported"):
            _check_supported(plan.model_copy(update={"strategy": {**plan.strategy, key: 2}}))
        with pytest.raises(UnsupportedPlan, match=f"{key}=2"):
            emitter("torch")(plan.model_copy(update={"strategy": {**plan.strategy, key: 2}}), None)
    gpt = plan.model_copy(update={"job": plan.job.model_copy(update={"model": "gpt2-xl"})})
    with pytest.raises(UnsupportedPlan, match="activation"):
        emitter("torch")(gpt, None)
    hsdp = plan.model_copy(update={"strategy": {**plan.strategy, "tp": 1, "pp": 1, "dp": 8, "zero": 3,
                                                "shard": "node"}})
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
    s = plan.strategy
    stage = plan.stages[rank // (s["tp"] * s["cp"] * s["dp"])]
    shards = s["dp"] if s["zero"] >= 1 else 1
    return stage.params_per_gpu * 4 / shards


@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("fix, port, zero", [
    ("pp=2,dp=2,zero=3", 29641, 3),   # pipeline + FSDP2 (ZeRO-3)
    ("tp=2,dp=2", 29642, 2),          # 2D: tensor parallel + FSDP2 without reshard (the solver picks ZeRO-2)
    ("pp=2,tp=2", 29643, 0),          # pipeline + tensor parallel, no data parallelism
])
def test_launch_sh_trains_and_matches_param_prediction(tmp_path, fix, port, zero):
    out = _compile(tmp_path, fix)
    plan = Plan.model_validate_json((out / "plan.json").read_text())
    assert plan.strategy["zero"] == zero and plan.job.num_gpus == 4
    report = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RUN_ID": f"test-{port}"}
    run = subprocess.run(["bash", str(out / "torch" / "launch.sh"), "--steps", "6", "--report", str(report)],
                         env=env, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    losses = [float(line.split()[3]) for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    data = json.loads(report.read_text())
    assert data["losses"] == pytest.approx(losses, abs=1e-5)
    measured = {int(rank): b for rank, b in data["param_bytes"].items()}
    assert sorted(measured) == [0, 1, 2, 3]
    printed = {int(line.split()[1]): int(line.split()[2]) for line in run.stdout.splitlines()
               if line.startswith("param_bytes ")}
    assert printed == measured
    for rank, got in measured.items():
        want = _predicted_bytes(plan, rank)
        assert got == pytest.approx(want, rel=0.01), (rank, got, want)  # the bar
        assert got == want  # and in fact exactly the cost model's parameters
