"""Train the reference model under the DeepSpeed engine, as the deepspeed target's launch.sh runs it:

    python -m planner.runtime.deepspeed_train --ds-config ds_config.json [--pipeline pipeline.json] \\
        --plan ../plan.json --data PREFIX --tokenizer T --checkpoint-dir DIR --train-steps N --save-every K

(under the `deepspeed` launcher, or torchrun).  The model is the torch runtime's (planner/runtime/model.py)
with the same layout-independent initial values (planner/runtime/materialize.py), and the data path is
the torch runtime's token shards (planner/runtime/data.py: each data-parallel rank its slice of every
global batch, resumable from the position).  DeepSpeed runs the rest as ds_config.json says: batch
sizes and gradient accumulation, bf16, ZeRO stage and offload, AdamW, gradient clipping.

* Pipeline plans (pipeline.json with stages > 1) run through `deepspeed.pipe.PipelineModule`: one
  LayerSpec per entry of pipeline.json's `layers` (embedding, one per transformer block, final norm,
  head) split at its `parts`, the plan's stage boundaries (DeepSpeed's own partition methods cannot
  express an arbitrary split, so PlannedPipelineModule sets them), with its activation checkpoint
  interval; DeepSpeed's PipelineEngine runs 1F1B over the micro-batches.
* Other plans train the whole Transformer under the engine; with ZeRO-3 it is built inside
  `deepspeed.zero.Init`, so each rank keeps only its partition, and each parameter is gathered once,
  on its own, to receive its initial values.
* Learning rate: ds_config.json's `scheduler` when it has one (its `total_num_steps` filled from
  --train-steps when absent), else linear warmup and cosine decay to --min-lr-ratio of the
  config's learning rate (planner/runtime/optim.py), stepped by the engine.
* Checkpoints: DeepSpeed's own (`engine.save_checkpoint(DIR, tag="step-N")`, with the step and the
  data position as client state) every --save-every steps and at the end; a run resumes from the
  checkpoint DIR/latest names.

* Mixture-of-experts models (pipeline.json's `moe`): each MoE block's feed-forward is DeepSpeed's own
  `deepspeed.moe.layer.MoE` with the plan's ep_size (planner/runtime/deepspeed_moe.py), the loss adds the
  layers' load-balancing losses; DeepSpeed builds the expert groups and reduces expert gradients over
  the expert-data-parallel group.  Not with pipeline parallelism or ZeRO-3 (DeepSpeed refuses the latter).

Tensor and context parallelism need model code DeepSpeed does not have (Megatron-DeepSpeed): plans with
tp > 1 or cp > 1 are refused with a one-line error.  Rank 0 prints `step <i> loss <x> lr <lr>
grad_norm <g>` and the save / resume lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from models.transformer import TransformerConfig
from planner.plan.schema import Plan
from planner.runtime import deepspeed_moe
from planner.runtime.data import DataError, SampleReader
from planner.runtime.materialize import init_weights
from planner.runtime.model import TransformerBlock, Transformer, rope_tables
from planner.runtime.optim import OptimConfig, build_scheduler
from planner.runtime.parallelize import loss_fn
from planner.runtime.shutdown import run_then_finish
from planner.runtime.train import (check_checkpoint_dir, check_plan_stages, fail, model_config, open_data, read_plan,
                                   say)

PROG = "python -m planner.runtime.deepspeed_train"


# ---------------------------------------------------------------- pipeline layers


class EmbeddingPipe(nn.Module):
    """pipeline.json's `embedding`: token ids -> hidden states."""

    def __init__(self, cfg: TransformerConfig, seed: int):
        super().__init__()
        self.layer_name = "embedding"
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        init_weights(self, seed=seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings(tokens)


class BlockPipe(nn.Module):
    """pipeline.json's `block.<i>`: one transformer block with its own rotary tables."""

    def __init__(self, cfg: TransformerConfig, index: int, seed: int):
        super().__init__()
        self.layer_name = f"block.{index}"
        self.block = TransformerBlock(cfg)
        cos, sin = rope_tables(cfg.kv_channels, cfg.max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        init_weights(self.block, seed=seed, prefix=f"layers.{index}.")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block(h, self.rope_cos, self.rope_sin)


class NormPipe(nn.Module):
    """pipeline.json's `final_norm`."""

    def __init__(self, cfg: TransformerConfig, seed: int):
        super().__init__()
        self.layer_name = "final_norm"
        self.norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        init_weights(self, seed=seed)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)


class HeadPipe(nn.Module):
    """pipeline.json's `head`: hidden states -> logits."""

    def __init__(self, cfg: TransformerConfig, seed: int):
        super().__init__()
        self.layer_name = "head"
        self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        init_weights(self, seed=seed)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(h)


def layer_spec(name: str, cfg: TransformerConfig, seed: int, path: Path):
    """The LayerSpec of one pipeline.json `layers` entry (built only on the stage that owns it)."""
    from deepspeed.pipe import LayerSpec

    if name == "embedding":
        return LayerSpec(EmbeddingPipe, cfg, seed)
    if name.startswith("block.") and name[6:].isdigit():
        return LayerSpec(BlockPipe, cfg, int(name[6:]), seed)
    if name == "final_norm":
        return LayerSpec(NormPipe, cfg, seed)
    if name == "head":
        return LayerSpec(HeadPipe, cfg, seed)
    fail(f"{path}: layers: {name!r} is not a layer of the reference model (embedding, block.<i>, final_norm, head)")


def planned_pipeline(pipeline: dict, cfg: TransformerConfig, *, seed: int, path: Path, world: int):
    """A PipelineModule of pipeline.json's layers split at its `parts`."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    parts, stages = list(pipeline["parts"]), pipeline["stages"]

    class PlannedPipelineModule(PipelineModule):
        def _partition_layers(self, method="uniform"):
            # the plan's boundaries instead of DeepSpeed's partition_method
            self.parts = parts
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    specs = [layer_spec(name, cfg, seed, path) for name in pipeline["layers"]]
    if len(parts) != stages + 1 or parts[0] != 0 or parts[-1] != len(specs):
        fail(f"{path}: parts: {parts} does not split {len(specs)} layers into {stages} stages")
    topology = PipeDataParallelTopology(num_pp=stages, num_dp=world // stages)
    return PlannedPipelineModule(specs, topology=topology, loss_fn=loss_fn, partition_method="uniform",
                                 activation_checkpoint_interval=pipeline.get("activation_checkpoint_interval", 0))


def zero3_model(cfg: TransformerConfig, config: dict, seed: int) -> Transformer:
    """The Transformer built partitioned (deepspeed.zero.Init), each parameter then gathered alone to take
    its initial value on rank 0 (DeepSpeed re-partitions it from there)."""
    import deepspeed

    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Transformer(cfg, seed=seed)  # partitioned: init_weights finds no local values to fill
    for name, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        if params:
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if dist.get_rank() == 0:
                    init_weights(module, seed=seed, prefix=f"{name}.")
    return model


# ---------------------------------------------------------------- setup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--ds-config", type=Path, required=True, help="ds_config.json written by `planner compile --target deepspeed`.")
    add("--pipeline", type=Path, default=None, help="pipeline.json (stage boundaries) of a pipeline plan.")
    add("--plan", type=Path, required=True, help="plan.json written by `planner compile`.")
    add("--data", default=None, metavar="PREFIX", help="Token shards PREFIX.bin + PREFIX.idx (planner.runtime.data).")
    add("--tokenizer", default=None, help="The tokenizer the data was written with (checked against PREFIX.idx).")
    add("--checkpoint-dir", type=Path, default=None, help="Save DeepSpeed checkpoints here and resume from its latest.")
    add("--train-steps", type=int, default=10, help="Optimizer steps of the whole run (default 10).")
    add("--save-every", type=int, default=1000, help="Steps between checkpoints (default 1000; also at the end).")
    add("--stop-at-step", type=int, default=None, help="Leave after this step, checkpointing it.")
    add("--lr", type=float, default=None, help="Peak learning rate (default: ds_config.json's optimizer lr).")
    add("--warmup-steps", type=int, default=None, help="Warmup steps (default 1%% of --train-steps, at least 1).")
    add("--min-lr-ratio", type=float, default=0.1, help="Final learning rate / peak (default 0.1).")
    add("--seed", type=int, default=0, help="Seed of the model init and the data order (default 0).")
    add("--report", type=Path, default=None, help="Write the losses as JSON (rank 0).")
    add("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    return parser.parse_args(argv)


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        fail(f"{path}: {what}: {err.strerror}")
    except json.JSONDecodeError as err:
        fail(f"{path}: line {err.lineno}: not JSON ({err.msg})")
    if not isinstance(data, dict):
        fail(f"{path}: {what}: not a JSON object")
    return data


def check_plan(plan: Plan, pipeline: dict | None, path: Path | None) -> None:
    s = plan.single_strategy
    moe = pipeline.get("moe") if pipeline is not None else None
    if s.ep > 1 and moe is None:
        fail(f"{path or 'plan.json'}: moe: the plan has ep={s.ep}; pass --pipeline pipeline.json, whose `moe` "
             "section builds DeepSpeed's MoE layers")
    if moe is not None and s.pp > 1:
        fail(f"{path}: moe: {PROG} runs DeepSpeed's MoE layer without pipeline parallelism (pp={s.pp})")
    for name, size in (("tensor_model_parallel_size", s.tp), ("context_parallel_size", s.cp)):
        if size > 1:
            fail(f"{path or 'plan.json'}: {name}: {size}: {PROG} runs the reference model without tensor or "
                 "context parallelism (compile with --target torch, or use Megatron-DeepSpeed)")
    stages = pipeline["stages"] if pipeline is not None else 1
    if stages != s.pp:
        fail(f"{path or 'plan.json'}: stages: {stages}, the plan has pp={s.pp}"
             + ("" if pipeline is not None else " (pass --pipeline pipeline.json)"))


def prepare_config(config: dict, args: argparse.Namespace, on_gpu: bool) -> OptimConfig:
    """Fill in what ds_config.json leaves to the script; the schedule of a run without a DeepSpeed scheduler."""
    optimizer = config.get("optimizer", {})
    params = optimizer.setdefault("params", {})
    if args.lr is not None:
        params["lr"] = args.lr
    if not on_gpu and optimizer.get("type", "").lower() in ("adam", "adamw"):
        params.setdefault("torch_adam", True)  # DeepSpeed's fused Adam is a CUDA/C++ extension
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.train_steps // 100)
    scheduler = config.get("scheduler")
    if scheduler is not None and scheduler.get("type") in ("WarmupCosineLR", "WarmupDecayLR"):
        steps = scheduler.setdefault("params", {})
        steps.setdefault("total_num_steps", args.train_steps)
        if args.warmup_steps is not None or "warmup_num_steps" not in steps:
            steps["warmup_num_steps"] = warmup
    return OptimConfig(lr=params.get("lr", 3e-4), min_lr_ratio=args.min_lr_ratio, warmup_steps=warmup,
                       train_steps=args.train_steps)


def init_deepspeed(on_gpu: bool):
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce at init (minutes, needs a C++
        # toolchain); gloo's collectives serve a CPU run
        setattr(sys.modules["deepspeed.comm.torch"], "build_shm_op", lambda: None)
    if on_gpu:  # before zero.Init places partitions on "the current device"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    return deepspeed


# ---------------------------------------------------------------- training


def load_checkpoint(engine, folder: Path):
    """engine.load_checkpoint of the latest checkpoint in `folder`: (its path, the client state)."""
    optimizer = engine.optimizer
    if not engine.zero_optimization() and type(optimizer).__name__ == "BF16_Optimizer":
        # DeepSpeed 0.19.8 saves a ZeRO-0 bf16 optimizer's state as one dict (every data-parallel rank holds
        # all of it) but BF16_Optimizer.load_state_dict indexes what it reads by the data-parallel rank: hand
        # it the dict under every rank's index
        original = optimizer.load_state_dict

        def load_state_dict(state_dict_list, *args, **kwargs):
            if isinstance(state_dict_list, dict) and "base_optimizer_state" in state_dict_list:
                state_dict_list = [state_dict_list] * engine.dp_world_size
            return original(state_dict_list, *args, **kwargs)

        optimizer.load_state_dict = load_state_dict
    return engine.load_checkpoint(str(folder))


def micro_batches(tokens: torch.Tensor, labels: torch.Tensor, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(tokens.chunk(count), labels.chunk(count)))


def run_step(engine, batches: list, pipelined: bool, extra=lambda: 0.0) -> float:
    """One optimizer step over this rank's micro-batches; the loss averaged over every data-parallel rank.
    `extra()`: what the last forward adds to the loss it trains on (the MoE layers' load-balancing loss), not
    reported."""
    if pipelined:
        return float(engine.train_batch(data_iter=iter(batches)).float().mean())
    total = torch.zeros((), device=engine.device)
    for tokens, labels in batches:
        loss = loss_fn(engine(tokens.to(engine.device)), labels.to(engine.device))
        engine.backward(loss + extra())
        engine.step()
        total += loss.detach().float() / len(batches)
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_checkpoint_dir(args.checkpoint_dir)
    plan = read_plan(args.plan)
    config = read_json(args.ds_config, "--ds-config")
    pipeline = read_json(args.pipeline, "--pipeline") if args.pipeline is not None else None
    check_plan(plan, pipeline, args.pipeline)
    cfg = model_config(plan)
    moe = pipeline.get("moe") if pipeline is not None else None
    if cfg.moe is not None and moe is None:
        fail(f"{args.plan}: model {plan.job.model} has experts: pass --pipeline pipeline.json (its `moe` section)")
    check_plan_stages(plan, args.plan, cfg.num_layers)
    shards = open_data(args, plan, cfg.vocab)
    if shards is None:
        fail("--data: required (token shards written by `python -m planner.runtime.data write`)")
    on_gpu = torch.cuda.is_available()
    ocfg = prepare_config(config, args, on_gpu)
    deepspeed = init_deepspeed(on_gpu)
    pipelined = pipeline is not None and pipeline["stages"] > 1
    if pipeline is not None and pipelined:
        model = planned_pipeline(pipeline, cfg, seed=args.seed, path=args.pipeline, world=dist.get_world_size())
    elif config.get("zero_optimization", {}).get("stage", 0) == 3:
        if moe is not None:
            fail(f"{args.ds_config}: zero_optimization.stage: 3: DeepSpeed's MoE layer does not run under ZeRO-3")
        model = zero3_model(cfg, config, args.seed)
    else:
        model = Transformer(cfg.model_copy(update={"moe": None}), seed=args.seed)  # the MoE blocks' FFN below
    experts = deepspeed_moe.install(model, moe, seed=args.seed) if moe is not None else []
    scheduler = None if "scheduler" in config else (lambda optimizer: build_scheduler(optimizer, ocfg))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                           if p.requires_grad],
                                           config=config, lr_scheduler=scheduler)
    rank = dist.get_rank()
    if pipelined:
        dp_rank, dp_size = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()
    else:
        dp_rank, dp_size = rank, dist.get_world_size()
    reader = SampleReader(shards, seq_len=plan.job.seq_len, global_batch=engine.train_batch_size(),
                          dp_rank=dp_rank, dp_size=dp_size, seed=args.seed)
    step = 0
    if args.checkpoint_dir is not None and (args.checkpoint_dir / "latest").is_file():
        path, client = load_checkpoint(engine, args.checkpoint_dir)
        step, reader.position = int(client["step"]), int(client["data_position"])
        if rank == 0:
            say(f"resumed from {path} (step {step}, data position {reader.position})")
    first, last = step, args.stop_at_step or args.train_steps
    losses = []
    for step in range(first, last):
        lr = engine.get_lr()[0]
        try:
            tokens, labels = reader.next_batch()
        except DataError as err:  # every rank checks the whole global batch: all stop alike
            fail(str(err))
        loss = run_step(engine, micro_batches(tokens, labels, engine.gradient_accumulation_steps()), pipelined,
                        lambda: deepspeed_moe.aux_loss(experts, moe["aux_loss_coeff"]) if moe else 0.0)
        losses.append(loss)
        norm = engine.get_global_grad_norm()
        if rank == 0:
            say(f"step {step} loss {loss:.6f} lr {lr:.6g} grad_norm {float(norm or 0.0):.6g}")
        if args.checkpoint_dir is not None and ((step + 1) % args.save_every == 0 or step + 1 == last):
            engine.save_checkpoint(str(args.checkpoint_dir), tag=f"step-{step + 1:08d}",
                                   client_state={"step": step + 1, "data_position": reader.position})
            if rank == 0:
                say(f"saved checkpoint {args.checkpoint_dir / f'step-{step + 1:08d}'} (step {step + 1}, "
                     f"data position {reader.position})")
    write_report(args, engine, model, pipelined, losses=losses, first=first)


def rank_summary(engine, model: nn.Module, pipelined: bool) -> dict:
    """What this rank holds: its pipeline stage and the layers it built, and its local parameter count (a
    ZeRO-3 rank's partition, `ds_tensor`)."""
    local = sum((p.ds_tensor if hasattr(p, "ds_tensor") else p).numel() for p in model.parameters())
    # a pipelined model is DeepSpeed's PipelineModule: its layers are forward_funcs
    layers = ([getattr(f, "layer_name", type(f).__name__) for f in getattr(model, "forward_funcs")] if pipelined
              else ["all"])
    return {"stage": engine.stage_id if pipelined else 0, "layers": layers, "local_params": local,
            **deepspeed_moe.rank_summary(model)}


def write_report(args: argparse.Namespace, engine, model: nn.Module, pipelined: bool, *, losses: list[float],
                 first: int) -> None:
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rank_summary(engine, model, pipelined))
    if dist.get_rank() == 0 and args.report is not None:
        report = {"losses": losses, "first_step": first, "zero_stage": engine.zero_optimization_stage(),
                  "bf16": engine.bfloat16_enabled(),
                  "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
                  "ranks": {str(r): summary for r, summary in enumerate(everyone)}}
        args.report.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    run_then_finish(main)  # barrier, destroy the groups, leave without racing gloo's threads (shutdown.py)
