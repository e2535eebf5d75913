"""The trainer's loop under a plan's data section (planner.runtime.sampler): whole documents packed into the
plan's token budget, the micro-batches balanced over the data-parallel ranks, each step's gradients those of
its mean token loss whichever rank ran which document.  `python -m planner.runtime.train` runs it when the
plan has a `data` section."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.plan.schema import Plan
from planner.runtime import checkpoint
from planner.runtime.data import TokenShards
from planner.runtime.optim import OptimConfig, clip_grads, global_grad_norm, lr_factor
from planner.runtime.parallelize import Parallelized
from planner.runtime.sampler import PlanSampler, StepBatch, synthetic_document


def check_data_plan(plan: Plan) -> None:
    """ValueError when this runtime cannot run the plan's data layout: it packs and balances on data-parallel
    strategies only."""
    s = plan.strategy
    if plan.data is not None and (s.tp != 1 or s.cp != 1 or s.pp != 1):
        raise ValueError(f"this runtime runs a data plan on data-parallel strategies (tp=cp=pp=1); the plan's is "
                         f"{plan.strategy_spec}; per-bucket context parallelism needs a framework with dynamic "
                         "context-parallel groups (report.md)")


def data_sampler(plan: Plan, shards: TokenShards | None, vocab: int, dp_rank: int, args: argparse.Namespace,
                 say: Callable[[str], None]) -> PlanSampler:
    """The plan's sampler over the token shards' documents, or over synthetic ones (said on rank 0)."""
    s = plan.strategy
    if shards is not None:
        document, count = shards.document, shards.header.documents
    else:
        document = functools.partial(synthetic_document, seq_len=plan.job.seq_len, vocab=vocab, seed=args.seed)
        count = None
    if dist.get_rank() == 0:
        say(f"data plan: {'in order' if args.unbalanced else 'balanced'} packed micro-batches of at most "
            f"{plan.data.token_budget} tokens from {'--data' if shards is not None else 'synthetic'} documents")
    return PlanSampler(document, count, plan.data, seq_len=plan.job.seq_len, global_batch=plan.job.global_batch,
                       dp_rank=dp_rank, dp_size=s.dp, balance=not args.unbalanced)


def data_step(par: Parallelized, batch: StepBatch, dp: int, device: torch.device) -> torch.Tensor:
    """Forward and backward of this rank's packed micro-batches; the step's summed token loss on this rank.

    Each micro-batch's summed cross entropy is scaled by dp / (the step's label tokens): the gradients that
    the data-parallel reduction averages are then those of the step's mean token loss, whichever rank ran
    which document.  Ranks run the same number of forwards (an idle one runs a one-token forward of weight
    0), since FSDP's gathers and reductions are collectives."""
    count = torch.tensor(len(batch.micro), device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    scale = dp / batch.label_tokens  # the data-parallel reduction averages over dp
    total = torch.zeros((), device=device)
    for j in range(int(count)):
        if j < len(batch.micro):
            m = batch.micro[j]
            logits = par.model(m.tokens.to(device), documents=m.documents.to(device))
            summed = F.cross_entropy(logits.flatten(0, 1).float(), m.labels.to(device).flatten(), reduction="sum")
            (summed * scale).backward()
            total += summed.detach()
        else:
            par.model(torch.zeros(1, 1, dtype=torch.long, device=device)).sum().mul(0.0).backward()
    par.sync_replicated_grads()
    return total


def run_data_plan(par: Parallelized, optimizers: list, sampler: PlanSampler, ocfg: OptimConfig,
                  args: argparse.Namespace, progress: dict, state: checkpoint.TrainerState, device: torch.device,
                  say: Callable[[str], None]) -> tuple[list[float], list[float]]:
    """The training loop under the plan's sampler: (mean token loss per step, gradient norm per step)."""
    sampler.position = int(progress["data_position"])
    first = int(progress["step"])
    last = args.stop_at_step if args.stop_at_step is not None else args.train_steps
    losses, norms = [], []
    for step in range(first, last):
        factor = lr_factor(step, ocfg)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = ocfg.lr * factor
            optimizer.zero_grad()
        batch = sampler.next_step()
        total = data_step(par, batch, sampler.dp_size, device)
        dist.all_reduce(total)
        params = [p for chunk in par.chunks() for p in chunk.parameters()]
        norm = global_grad_norm(params, stage_ranks=par.stage_ranks)
        clip_grads(params, ocfg.grad_clip, norm)
        for optimizer in optimizers:
            optimizer.step()
        losses.append(total.item() / batch.label_tokens)
        norms.append(float(norm))
        progress.update(step=step + 1, data_position=sampler.position)
        if dist.get_rank() == 0:
            loads = batch.rank_seconds
            say(f"step {step} loss {losses[-1]:.6f} lr {ocfg.lr * factor:.6g} grad_norm {norms[-1]:.6g} "
                f"micro_batches {len(batch.micro)} planned_busiest_s {max(loads):.6g} "
                f"planned_mean_s {sum(loads) / len(loads):.6g}")
        if args.checkpoint_dir is not None and ((step + 1) % args.save_every == 0 or step + 1 == last):
            folder = checkpoint.save(args.checkpoint_dir, step + 1, state)
            if dist.get_rank() == 0:
                say(f"saved checkpoint {folder} (step {step + 1}, data position {sampler.position})")
    return losses, norms
