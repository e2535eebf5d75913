"""Train a tiny layer stack for 3 steps with DeepSpeed's PipelineEngine on CPU (gloo) from emitted files.

Run by tests/test_emit_deepspeed.py under torchrun:

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \
        ds_pipe_train.py ds_config.json pipeline.json OUT_DIR

The PipelineModule is built from LayerSpecs named as pipeline.json's `layers`
(embedding, one block per transformer block, final norm, head) and split at
pipeline.json's explicit `parts`: DeepSpeed's partition_method (uniform,
parameters, type:REGEX) cannot express an arbitrary split, so
PlannedPipelineModule overrides `_partition_layers`, as the emitted README
shows.  Like ds_train.py, the config is used as emitted except that the
optimizer is torch's AdamW (`torch_adam`; DeepSpeed's fused Adam is a compiled
extension a CPU-only install lacks), with a larger learning rate so that 3
steps show progress, and DeepSpeed's shared-memory all-reduce extension is not
built (plain gloo).

Every rank writes OUT_DIR/rank<R>.json: its pipeline stage, the LayerSpec
index range it built and the names of the layers it holds; the ranks of the
last stage add the losses of the 3 steps (each over gradient_accumulation_steps
micro-batches).
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
from deepspeed.pipe import LayerSpec, PipelineModule  # noqa: E402
from deepspeed.runtime.pipe.topology import PipeDataParallelTopology  # noqa: E402

ds_comm_torch = sys.modules["deepspeed.comm.torch"]  # the attribute `deepspeed.comm.torch` is torch itself

# DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce extension (minutes, needs a compiler);
# gloo alone is enough for a test.
ds_comm_torch.build_shm_op = lambda: None

VOCAB, WIDTH, SEQ = 64, 32, 16


class Embedding(torch.nn.Module):
    layer_name = "embedding"

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens)


class Block(torch.nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.layer_name = f"block.{index}"
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class FinalNorm(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.layer_name = name
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class Head(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.layer_name = name
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def layer_spec(name: str) -> LayerSpec:
    """The LayerSpec of one pipeline.json `layers` entry."""
    if name == "embedding":
        return LayerSpec(Embedding)
    if name.startswith("block."):
        return LayerSpec(Block, int(name.split(".")[1]))
    if name == "head":
        return LayerSpec(Head, name)
    return LayerSpec(FinalNorm, name)  # final_norm (any other post-block layer: a norm)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))


class PlannedPipelineModule(PipelineModule):
    """A PipelineModule split at the planner's explicit `parts` (pipeline.json)."""

    def __init__(self, layers, parts: list[int], **kwargs) -> None:
        self.planned_parts = list(parts)
        super().__init__(layers, **kwargs)

    def _partition_layers(self, method="uniform"):
        if len(self.planned_parts) != self.num_stages + 1 or self.planned_parts[-1] != len(self._layer_specs):
            raise ValueError(f"parts {self.planned_parts} do not split {len(self._layer_specs)} layers into "
                             f"{self.num_stages} stages")
        self.parts = list(self.planned_parts)
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


def main() -> None:
    config_path, pipeline_path, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(config_path) as f:
        config = json.load(f)
    with open(pipeline_path) as f:
        pipeline = json.load(f)
    config["optimizer"]["params"]["torch_adam"] = True
    config["optimizer"]["params"]["lr"] = 1e-2  # 3 steps must show progress
    config["steps_per_print"] = 1000
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = pipeline["stages"]
    topology = PipeDataParallelTopology(num_pp=stages, num_dp=world // stages)
    model = PlannedPipelineModule(
        [layer_spec(name) for name in pipeline["layers"]],
        parts=pipeline["parts"],
        topology=topology,
        loss_fn=loss_fn,
        partition_method="uniform",  # ignored: _partition_layers uses `parts`
        activation_checkpoint_interval=pipeline["activation_checkpoint_interval"],
        seed_layers=True,  # each layer's initial weights depend on its index only, not on the split
        base_seed=1234,
    )
    built = [module.layer_name for module in model.forward_funcs]
    start, stop = model._local_start, model._local_stop
    print(f"rank {rank} stage {model.stage_id} layers [{start}, {stop}) {built}", flush=True)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                           if p.requires_grad], config=config)
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    # A fixed, learnable task: predict the next token of a repeating sequence (same batches every step).
    generator = torch.Generator().manual_seed(1234 + engine.grid.get_data_parallel_rank())
    batches = []
    for _ in range(accum):
        begin = torch.randint(0, VOCAB, (micro, 1), generator=generator)
        tokens = (begin + torch.arange(SEQ + 1)) % VOCAB
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    losses = []
    for _ in range(3):
        loss = engine.train_batch(data_iter=iter(batches))
        losses.append(float(loss.float().mean().item()))
    out = {
        "rank": rank,
        "world_size": world,
        "stage": engine.stage_id,
        "num_stages": engine.num_stages,
        "is_last_stage": engine.is_last_stage(),
        "start": start,
        "stop": stop,
        "layers": built,
        "parts": model.parts,
        "micro_batches": engine.micro_batches,
        "gradient_accumulation_steps": accum,
        "zero_stage": engine.zero_optimization_stage(),
        "bf16": engine.bfloat16_enabled(),
    }
    if engine.is_last_stage():
        out["losses"] = losses
        print(f"rank {rank} (last stage) losses {losses}", flush=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    # barrier, destroy the groups, and leave without racing gloo's worker threads (planner/runtime/shutdown.py)
    run_then_finish(main)
