"""Train a DLRM under an embedding sharding plan: `python -m planner.runtime.dlrm --plan plan.json`.

Run under torchrun with the plan's world size (the torch target's launch.sh
does this).  Every rank builds the same initial weights from the seed, keeps
only the table shards the plan puts on it (plain `F.embedding_bag`, so
TorchRec is not needed), and the dense part as a replica:

* sharded tables (table/column/row/table-row-wise): the ids of the whole
  global batch are all-gathered; each rank pools its shards for every sample
  (row shards pool only the ids in their row block: partial sums); the
  per-table outputs are summed over ranks with a differentiable all-reduce
  (gloo stand-in for TorchRec's all-to-all / reduce-scatter: the same numbers,
  more bytes) and each rank keeps its own samples' rows.  Its backward gives
  every shard the gradient of all ranks' losses.
* data-parallel tables and the MLPs: local replicas; gradients all-reduced.

Each rank's loss is the sum over its samples divided by the global batch, and
every gradient is summed over ranks, so the step equals single-process
training on the global batch (`--reference` runs that, in one process).
Prints `step <i> loss <x>` on rank 0 and `table_bytes <rank> <bytes>`: bytes
of the table weights the rank holds (fp32).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F
from torch import nn

from models.graph import EmbeddingTable
from models.recsys import DLRMConfig
from models.zoo import get_entry
from planner.embedding.sharding_plan import ParameterSharding, ShardingPlanFile, table_names
from planner.runtime.dlrm_layers import dot_interaction, mlp
from planner.runtime.shutdown import run_then_finish


def table_weight(table: EmbeddingTable, index: int, seed: int) -> torch.Tensor:
    """The initial weights of table `index` (same on every rank)."""
    gen = torch.Generator().manual_seed(seed * 1000 + index)
    return torch.randn(table.rows, table.dim, generator=gen) * 0.05


def synthetic_batch(step: int, cfg: DLRMConfig, batch: int, seed: int = 0
                    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """(dense features, ids per table [batch, pooling], labels) of the global batch of `step`.
    The label is a fixed function of a dense feature and the first table's ids, so the loss can fall."""
    gen = torch.Generator().manual_seed(seed + 1 + step)
    dense = torch.randn(batch, cfg.dense_features, generator=gen)
    ids = [torch.randint(t.rows, (batch, max(1, round(t.pooling_factor))), generator=gen) for t in cfg.tables]
    labels = (dense[:, 0] + 0.5 * (ids[0][:, 0] % 2) > 0.25).float()
    return dense, ids, labels


def _placement_rank(placement: str) -> int:
    """The rank of a TorchRec placement string 'rank:R/cuda:L'."""
    return int(placement.split("/")[0].split(":")[1])


class ShardedTables(nn.Module):
    """The shards of every table this rank holds, and the replicas of data-parallel tables."""

    def __init__(self, cfg: DLRMConfig, names: list[str], plan: ShardingPlanFile | None, rank: int, seed: int):
        super().__init__()
        self.cfg, self.rank = cfg, rank
        self.entries: list[ParameterSharding | None] = [plan.tables[n] if plan else None for n in names]
        self.shards = nn.ParameterList()
        self.shard_index: list[list[tuple[int, int, int, int, int]]] = []  # (param, row0, rows, col0, cols)
        for t, table in enumerate(cfg.tables):
            weight, entry, mine = table_weight(table, t, seed), self.entries[t], []
            if entry is None or entry.sharding_spec is None:  # reference run, or a data-parallel replica
                blocks = [(0, table.rows, 0, table.dim)]
            else:
                blocks = [(s.shard_offsets[0], s.shard_sizes[0], s.shard_offsets[1], s.shard_sizes[1])
                          for s in entry.sharding_spec if _placement_rank(s.placement) == rank]
            for r0, rs, c0, cs in blocks:
                self.shards.append(nn.Parameter(weight[r0:r0 + rs, c0:c0 + cs].clone()))
                mine.append((len(self.shards) - 1, r0, rs, c0, cs))
            self.shard_index.append(mine)

    def is_replica(self, t: int) -> bool:
        """Table t is whole on every rank (data parallel, or the single-process reference)."""
        entry = self.entries[t]
        return entry is None or entry.sharding_spec is None

    def forward(self, local_ids: list[torch.Tensor], global_ids: list[torch.Tensor] | None, local_slice: slice
                ) -> list[torch.Tensor]:
        """Pooled vectors [local batch, dim] of every table for this rank's samples."""
        out = []
        for t, table in enumerate(self.cfg.tables):
            if self.is_replica(t):
                (p, *_), = self.shard_index[t]
                out.append(F.embedding_bag(local_ids[t], self.shards[p], mode="sum"))
                continue
            if global_ids is None:  # only the single-process reference goes without, and its tables are whole
                raise ValueError(f"table {t} is sharded: its lookups need every rank's ids (global_ids)")
            ids = global_ids[t]
            # a leaf that requires grad: ranks without a shard of this table still run the all-reduce's
            # backward, so every rank issues the same collectives in the same order
            pooled = torch.zeros(ids.shape[0], table.dim, requires_grad=True)
            for p, r0, rs, c0, cs in self.shard_index[t]:
                inside = (ids >= r0) & (ids < r0 + rs)
                local = torch.where(inside, ids - r0, torch.zeros_like(ids))
                part = F.embedding_bag(local, self.shards[p], mode="sum", per_sample_weights=inside.float())
                pooled = pooled + F.pad(part, (c0, table.dim - c0 - cs))
            summed = dist_fn.all_reduce(pooled) if dist.is_initialized() else pooled
            out.append(summed[local_slice])
        return out

    def held_bytes(self) -> int:
        """Bytes of table weights on this rank (fp32)."""
        return sum(p.numel() * p.element_size() for p in self.shards)


class DLRM(nn.Module):
    """Bottom MLP, sharded tables, dot interaction, top MLP (Naumov et al. 2019)."""

    def __init__(self, cfg: DLRMConfig, names: list[str], plan: ShardingPlanFile | None, rank: int, seed: int):
        super().__init__()
        if cfg.interaction != "dot":
            raise ValueError("the runtime implements the dot interaction")
        torch.manual_seed(seed)
        self.bottom = mlp(cfg.bottom_mlp, cfg.dense_features, last_relu=True)
        self.top = mlp(cfg.top_mlp, cfg.interaction_width, last_relu=False)
        self.tables = ShardedTables(cfg, names, plan, rank, seed)

    def forward(self, dense, local_ids, global_ids, local_slice) -> torch.Tensor:
        x = self.bottom(dense)
        return self.top(dot_interaction(x, self.tables(local_ids, global_ids, local_slice))).squeeze(1)



def _gather_ids(ids: list[torch.Tensor]) -> list[torch.Tensor]:
    gathered = []
    for tensor in ids:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor)
        gathered.append(torch.cat(parts))
    return gathered


def train(plan_path: Path | None, model_name: str, batch: int, steps: int, lr: float, seed: int,
          reference: bool) -> dict:
    """Run `steps` SGD steps; return losses and per-rank table bytes."""
    cfg = get_entry(model_name).config
    if not isinstance(cfg, DLRMConfig):
        raise SystemExit(f"{model_name}: not a DLRM recommendation model (planner.runtime.train runs transformers)")
    names = table_names(len(cfg.tables))  # sharding_plan.json keys tables by their TorchRec names
    distributed = not reference
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    plan = None
    if distributed:
        if plan_path is None:
            raise SystemExit("a distributed run needs --plan (--reference runs one process with whole tables)")
        document = json.loads(plan_path.read_text())
        plan = ShardingPlanFile.model_validate(document.get("sharding", document))
        if plan.world_size != world:
            raise SystemExit(f"{plan_path}: world_size {plan.world_size}, but torchrun started {world} ranks")
    model = DLRM(cfg, names, plan, rank, seed)
    local = batch // world
    mine = slice(rank * local, (rank + 1) * local)
    losses = []
    for step in range(steps):
        dense, ids, labels = synthetic_batch(step, cfg, batch, seed)
        local_ids = [t[mine] for t in ids]
        global_ids = _gather_ids(local_ids) if distributed else None
        logits = model(dense[mine], local_ids, global_ids, mine)
        loss = F.binary_cross_entropy_with_logits(logits, labels[mine], reduction="sum") / batch
        model.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        if distributed:
            dist.all_reduce(total)
            for t in range(len(cfg.tables)):
                if model.tables.is_replica(t):
                    for p, *_ in model.tables.shard_index[t]:
                        dist.all_reduce(model.tables.shards[p].grad)
            for param in [*model.bottom.parameters(), *model.top.parameters()]:
                dist.all_reduce(param.grad)
        with torch.no_grad():
            for param in model.parameters():
                if param.grad is not None:
                    param.sub_(lr * param.grad)  # in place, as -= on a tensor
        losses.append(float(total))
        if rank == 0:
            _say(f"step {step} loss {float(total):.6f}")
    held = torch.tensor([model.tables.held_bytes()])
    if distributed:
        everyone = [torch.zeros_like(held) for _ in range(world)]
        dist.all_gather(everyone, held)
        held_all = [int(h) for h in everyone]
    else:
        held_all = [int(held)]
    if rank == 0:
        for r, size in enumerate(held_all):
            _say(f"table_bytes {r} {size}")
    return {"losses": losses, "table_bytes": held_all, "rank": rank}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", type=Path, help="plan.json or sharding_plan.json of `planner compile`")
    parser.add_argument("--model", help="zoo model (default: the plan's)")
    parser.add_argument("--batch", type=int, help="global batch (default: the plan's)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference", action="store_true", help="single process, whole tables (no plan)")
    parser.add_argument("--report", type=Path, help="rank 0 writes losses and table bytes here (JSON)")
    args = parser.parse_args(argv)
    model, batch = args.model, args.batch
    if args.plan is not None:
        document = json.loads(args.plan.read_text())
        model = model or document.get("job", {}).get("model") or document.get("model")
        batch = batch or document.get("job", {}).get("global_batch")
    if model is None or batch is None:
        parser.error("give --plan (plan.json) or --model and --batch")
    result = train(args.plan, model, batch, args.steps, args.lr, args.seed, args.reference)
    if args.report is not None and result["rank"] == 0:
        args.report.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    run_then_finish(main)  # barrier and destroy the groups (when distributed), leave without racing gloo's threads
