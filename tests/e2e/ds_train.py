"""Train a tiny model for 3 steps with DeepSpeed on CPU (gloo) from an emitted ds_config.json.

Run by tests/test_emit_deepspeed.py under torchrun:

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 ds_train.py ds_config.json out.json

Uses the config as emitted (batch sizes, ZeRO stage, precision, AdamW), except
that the optimizer is torch's AdamW (`torch_adam`): DeepSpeed's fused Adam is
a compiled extension that a CPU-only install does not have, and DeepSpeed's
shared-memory all-reduce extension is not built (plain gloo).  Rank 0 writes the
losses of the 3 optimizer steps (each over gradient_accumulation_steps
micro-batches) to out.json.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import deepspeed.comm.torch  # noqa: E402,F401
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from planner.runtime.shutdown import run_then_finish  # noqa: E402

ds_comm_torch = sys.modules["deepspeed.comm.torch"]  # the attribute `deepspeed.comm.torch` is torch itself

# DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce extension (minutes, needs a compiler);
# gloo alone is enough for a test.
ds_comm_torch.build_shm_op = lambda: None


class TinyBlock(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyModel(torch.nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(TinyBlock(width) for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    config_path, out_path = sys.argv[1], sys.argv[2]
    with open(config_path) as f:
        config = json.load(f)
    config["optimizer"]["params"]["torch_adam"] = True
    config["optimizer"]["params"]["lr"] = 1e-2  # 3 steps must show progress
    config["steps_per_print"] = 1000
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyModel()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    generator = torch.Generator().manual_seed(1234 + rank)
    seq = 16
    # A fixed, learnable task: predict the next token of a repeating sequence.
    batches = []
    for _ in range(accum):
        start = torch.randint(0, 64, (micro, 1), generator=generator)
        tokens = (start + torch.arange(seq + 1)) % 64
        batches.append(tokens)
    losses = []
    for _ in range(3):
        step_loss = 0.0
        for tokens in batches:
            logits = engine(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 64), tokens[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / accum
        mean = torch.tensor([step_loss])
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"losses": losses, "zero_stage": engine.zero_optimization_stage(), "world_size": world,
                       "gradient_accumulation_steps": accum, "bf16": engine.bfloat16_enabled()}, f)
        print("losses", losses, flush=True)


if __name__ == "__main__":
    # barrier, destroy the groups, and leave without racing gloo's worker threads (planner/runtime/shutdown.py)
    run_then_finish(main)
