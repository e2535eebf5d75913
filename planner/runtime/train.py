"""Train the reference model under a compiled plan: `python -m planner.runtime.train --plan plan.json`.

Run under torchrun with the plan's rank count (the torch target's launch.sh
does this).  Every rank builds the whole reference model with the same seed,
`apply_plan` keeps and parallelizes its part, and the ranks train on
synthetic data: each sequence follows a fixed random permutation of the
vocabulary (token t is followed by perm[t]), so next-token loss can fall to
zero and a few steps show it falling.

Prints `step <i> loss <x>` on rank 0 and, at the end, `param_bytes <rank> <bytes>`
for every rank: bytes of the parameters the rank holds locally (local shards
of DTensor / FSDP2 parameters).  The runtime keeps fp32 parameters (4 bytes
each; mixed precision is not applied), so the plan's prediction is
stages[i].params_per_gpu * 4, divided by the FSDP shard degree when zero >= 1.

With `--measure-memory` the last step runs under `planner.runtime.memory_probe.MemoryProbe` and every
rank also prints `memory <rank> <json>`: its parameter, gradient and optimizer-state bytes, the bytes
saved for backward per micro-batch (by layer) and at their peak, the peak of live tensor bytes during
the step and FSDP2's gathered parameters at their peak (the report's `memory` section, per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from models.transformer import TransformerConfig
from models.zoo import get_entry
from planner.plan.schema import Plan
from planner.runtime.memory_probe import MemoryProbe
from planner.runtime.model import Transformer
from planner.runtime.parallelize import apply_plan, local_param_bytes
from planner.runtime.shutdown import run_then_finish


def model_config(plan: Plan, spec: Path | None = None) -> TransformerConfig:
    """The TransformerConfig of the plan's model (zoo entries built from a TransformerConfig), or of the
    model spec file `spec` (a builder and its fields, models/spec.py's first shape) when given."""
    config = get_entry(plan.job.model).config if spec is None else spec_config(spec)
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"model {plan.job.model}: the runtime builds TransformerConfig models only")
    return config


def spec_config(path: Path) -> TransformerConfig:
    """The TransformerConfig of a spec file `builder: llama|gpt|bert|transformer` plus config fields."""
    from models.spec import BUILDERS, read_mapping

    data = dict(read_mapping(path))
    builder = BUILDERS.get(data.pop("builder", None))
    config = builder(**data) if builder is not None else None
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"{path}: --model-spec takes a transformer spec (builder: llama, gpt, bert or transformer)")
    return config


def synthetic_batch(step: int, *, batch: int, seq_len: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) of the global batch of `step`: sequences that follow a fixed permutation."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1 + step)
    seq = torch.empty(batch, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab, (batch,), generator=gen)
    for i in range(seq_len):
        seq[:, i + 1] = perm[seq[:, i]]
    return seq[:, :-1], seq[:, 1:]


def _say(line: str) -> None:
    # One write per line: ranks share stdout, and a pipe keeps writes under PIPE_BUF whole.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m planner.runtime.train", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan.json written by `planner compile`.")
    parser.add_argument("--steps", type=int, default=10, help="Optimizer steps (default 10).")
    parser.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the model init and the data (default 0).")
    parser.add_argument("--report", type=Path, default=None, help="Write losses and param_bytes per rank as JSON.")
    parser.add_argument("--model-spec", type=Path, default=None,
                        help="Model spec file (builder: llama ...) of a model the zoo does not have; its name must "
                        "be the plan's model.")
    parser.add_argument("--measure-memory", action="store_true",
                        help="Measure the last step's memory on every rank (planner/runtime/memory_probe.py): "
                        "prints `memory <rank> <json>` and adds `memory` to the report.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = Plan.model_validate_json(args.plan.read_text(encoding="utf-8"))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    s = plan.strategy
    torch.manual_seed(args.seed)
    config = model_config(plan, args.model_spec)
    if args.model_spec is not None and config.name != plan.job.model:
        raise ValueError(f"--model-spec builds {config.name!r}, the plan is for {plan.job.model!r}")
    model = Transformer(config).to(device)
    par = apply_plan(model, plan, device=device)
    optimizer = torch.optim.AdamW(par.model.parameters(), lr=args.lr)
    dp_index = (rank // (s.tp * s.cp)) % s.dp
    cp_index = (rank // s.tp) % s.cp
    per_replica = plan.job.global_batch // s.dp
    per_cp_rank = plan.job.seq_len // s.cp
    last_stage_ranks = s.tp * s.cp * s.dp
    losses = []
    probe = None
    for step in range(args.steps):
        tokens, labels = synthetic_batch(step, batch=plan.job.global_batch, seq_len=plan.job.seq_len,
                                         vocab=config.vocab, seed=args.seed)
        # this replica's sequences; under cp this rank's contiguous chunk of each
        rows = slice(dp_index * per_replica, (dp_index + 1) * per_replica)
        cols = slice(cp_index * per_cp_rank, (cp_index + 1) * per_cp_rank)
        optimizer.zero_grad()
        tokens_here, labels_here = tokens[rows, cols].to(device), labels[rows, cols].to(device)
        if args.measure_memory and step == args.steps - 1:
            with MemoryProbe(par.chunks(), optimizer, inputs=(tokens_here, labels_here),
                             micro_batches=plan.time.micro_batches, pipeline_stages=par.stages) as probe:
                loss = par.train_step(tokens_here, labels_here)
                optimizer.step()
        else:
            loss = par.train_step(tokens_here, labels_here)
            optimizer.step()
        # The loss lives on the last stage: average it over that stage's ranks (their dp replicas and
        # cp chunks, equal in size) onto every rank.
        total = torch.zeros((), device=device) if loss is None else loss.detach().float().to(device)
        dist.all_reduce(total)
        losses.append(total.item() / last_stage_ranks)
        if rank == 0:
            _say(f"step {step} loss {losses[-1]:.6f}")
    for chunk in par.chunks():
        if hasattr(chunk, "reshard"):  # FSDP2: parameters back to their shards before measuring
            chunk.reshard()
    mine = local_param_bytes(par.model)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    _say(f"param_bytes {rank} {mine}")
    memory: list = [None] * dist.get_world_size()
    if probe is not None:
        measured = probe.report(par.model)
        dist.all_gather_object(memory, measured)
        _say(f"memory {rank} {json.dumps(measured, sort_keys=True, separators=(',', ':'))}")
    if rank == 0 and args.report is not None:
        report = {"losses": losses, "param_bytes": {str(r): b for r, b in enumerate(everyone)},
                  "strategy": plan.strategy_spec}
        if probe is not None:
            report["memory"] = {str(r): m for r, m in enumerate(memory)}
        args.report.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    run_then_finish(main)  # barrier, destroy the groups, leave without racing gloo's threads (shutdown.py)
