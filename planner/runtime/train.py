"""Train the reference model under a compiled plan: `python -m planner.runtime.train --plan plan.json ...`.

Run under torchrun with the plan's rank count (the torch target's launch.sh does this, with the launch
inputs: `--data PREFIX --tokenizer T --checkpoint-dir DIR --train-steps N --save-every K`).  Each rank

1. builds the reference model under `torch.device("meta")` and applies the plan (pipeline split, tensor
   and context parallel, activation checkpointing, FSDP2), then materializes only its own shards with
   layout-independent initial values (planner/runtime/materialize.py);
2. trains in the plan's precision: bf16 mixed precision (FSDP2 MixedPrecisionPolicy: fp32 master
   weights, gradients and AdamW state, bf16 compute, fp32 gradient reduction), or fp32 with
   `--precision fp32`;
3. reads its data-parallel slice of every global batch from memory-mapped token shards
   (planner/runtime/data.py; without `--data` it trains on synthetic sequences that follow a fixed
   permutation of the vocabulary, and says so);
4. steps AdamW with linear warmup and cosine decay after clipping the gradients to a global norm over
   every shard (planner/runtime/optim.py);
5. saves a distributed checkpoint (torch.distributed.checkpoint) every `--save-every` steps and at the
   end, and on start resumes from the latest one in `--checkpoint-dir` (planner/runtime/checkpoint.py).

Rank 0 prints `step <i> loss <x> lr <lr> grad_norm <g>` per step and the save / resume lines; at the
end every rank prints `param_bytes <rank> <bytes>` (its local fp32 parameter shards) and
`init_peak_bytes <rank> <bytes>` (the most tensor bytes it held while building and materializing the
model).  With `--measure-memory` the last step runs under planner.runtime.memory_probe.MemoryProbe and
every rank also prints `memory <rank> <json>`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from models.transformer import TransformerConfig
from models.zoo import get_entry
from models import ModelInputError
from models import yamlio
from planner.errors import PlannerInputError
from planner.plan.consistency import plan_from_text, stage_problem
from planner.plan.manifest import MANIFEST, output_folder_holding
from planner.plan.schema import Plan
from planner.runtime import checkpoint
from planner.runtime.data import DataError, SampleReader, TokenShards
from planner.runtime.materialize import InitMemory
from planner.runtime.memory_probe import MemoryProbe
from planner.runtime.model import Transformer
from planner.runtime.optim import OptimConfig, build_optimizer, clip_grads, global_grad_norm, lr_factor
from planner.runtime.parallelize import Parallelized, apply_plan, local_param_bytes
from planner.runtime.data_train import check_data_plan, data_sampler, run_data_plan
from planner.runtime.shutdown import run_then_finish

PROG = "python -m planner.runtime.train"
DTYPES = {"bf16": torch.bfloat16, "fp32": None}  # --precision -> FSDP2 / autocast compute dtype (None: fp32)


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


def synthetic_batch(step: int, *, batch: int, seq_len: int, vocab: int,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) of the global batch of `step`: sequences that follow a fixed permutation."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1 + step)
    seq = torch.empty(batch, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab, (batch,), generator=gen)
    for i in range(seq_len):
        seq[:, i + 1] = perm[seq[:, i]]
    return seq[:, :-1], seq[:, 1:]


class SyntheticReader:
    """SampleReader's interface over synthetic_batch: this data-parallel rank's rows of each global batch."""

    def __init__(self, *, seq_len: int, global_batch: int, dp_rank: int, dp_size: int, vocab: int, seed: int):
        self.seq_len, self.global_batch, self.vocab, self.seed = seq_len, global_batch, vocab, seed
        per = global_batch // dp_size
        self.rows = slice(dp_rank * per, (dp_rank + 1) * per)
        self.position = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, labels = synthetic_batch(self.position // self.global_batch, batch=self.global_batch,
                                         seq_len=self.seq_len, vocab=self.vocab, seed=self.seed)
        self.position += self.global_batch
        return tokens[self.rows], labels[self.rows]


def say(line: str) -> None:
    # One write per line: ranks share stdout, and a pipe keeps writes under PIPE_BUF whole.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fail(message: str) -> None:
    """A user error: one line on stderr (from rank 0 only: every rank finds it), exit status 2."""
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write(f"{PROG}: error: {message}\n")
    raise SystemExit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--plan", type=Path, required=True, help="plan.json written by `planner compile`.")
    add("--data", default=None, metavar="PREFIX",
        help="Token shards PREFIX.bin + PREFIX.idx (python -m planner.runtime.data write); without it the "
        "run trains on synthetic sequences.")
    add("--tokenizer", default=None, help="The tokenizer the data was written with (checked against PREFIX.idx).")
    add("--checkpoint-dir", type=Path, default=None,
        help="Save distributed checkpoints here and resume from the latest one (none without it).")
    add("--train-steps", "--steps", dest="train_steps", type=int, default=10,
        help="Optimizer steps of the whole run (default 10); the cosine schedule ends here.")
    add("--save-every", type=int, default=1000, help="Steps between checkpoints (default 1000; also at the end).")
    add("--stop-at-step", type=int, default=None,
        help="Leave after this step, checkpointing it, as a preempted job would; a later run resumes.")
    add("--lr", type=float, default=3e-4, help="Peak AdamW learning rate (default 3e-4).")
    add("--min-lr-ratio", type=float, default=0.1, help="Final learning rate / peak (default 0.1).")
    add("--warmup-steps", type=int, default=None,
        help="Linear warmup steps (default 1%% of --train-steps, at least 1).")
    add("--weight-decay", type=float, default=0.1, help="AdamW weight decay of matrices (default 0.1).")
    add("--grad-clip", type=float, default=1.0, help="Clip gradients to this global norm (default 1.0; 0: off).")
    add("--precision", choices=("plan", "bf16", "fp32"), default="plan",
        help="Compute precision: the plan's (default; bf16 mixed precision), bf16, or fp32 throughout.")
    add("--seed", type=int, default=0, help="Seed of the model init and the data order (default 0).")
    add("--report", type=Path, default=None, help="Write losses and bytes per rank as JSON.")
    add("--model-spec", type=Path, default=None,
        help="Model spec file (builder: llama ...) of a model the zoo does not have; its name must be the "
        "plan's model.")
    add("--unbalanced", action="store_true",
        help="With a plan's data section: deal the packed micro-batches to the data-parallel ranks in order "
        "instead of balancing them (the same samples and loss; for comparison).")
    add("--measure-memory", action="store_true",
        help="Measure the last step's memory on every rank (planner/runtime/memory_probe.py): prints "
        "`memory <rank> <json>` and adds `memory` to the report.")
    return parser.parse_args(argv)


def optim_config(args: argparse.Namespace) -> OptimConfig:
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.train_steps // 100)
    return OptimConfig(lr=args.lr, min_lr_ratio=args.min_lr_ratio, warmup_steps=warmup,
                       train_steps=args.train_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip)


def compute_dtype(plan: Plan, choice: str, path: Path) -> torch.dtype | None:
    """The compute dtype of --precision (`plan`: the precision of the plan at `path`, which must be bf16)."""
    precision = plan.job.precision if choice == "plan" else choice
    if precision not in DTYPES:
        fail(f"{path}: job.precision: {precision}: the planner torch runtime trains in bf16 mixed precision "
             "(or fp32 with --precision fp32)")
    return DTYPES[precision]


def open_data(args: argparse.Namespace, plan: Plan, vocab: int) -> TokenShards | None:
    """The token shards of --data, checked against --tokenizer and the model's vocabulary (None: synthetic)."""
    if args.data is None:
        return None
    try:
        shards = TokenShards(args.data)
    except DataError as err:
        fail(str(err))
    header = shards.header
    if args.tokenizer is not None and args.tokenizer != header.tokenizer:
        fail(f"{args.data}.idx: tokenizer: written with {header.tokenizer!r}, --tokenizer is {args.tokenizer!r}")
    if header.vocab_size > vocab:
        fail(f"{args.data}.idx: vocab_size: {header.vocab_size} token ids, the model {plan.job.model} "
             f"embeds {vocab}")
    if header.tokens <= plan.job.seq_len:
        fail(f"{args.data}.idx: tokens: {header.tokens} tokens hold no sample of {plan.job.seq_len + 1}")
    return shards


def read_plan(path: Path) -> Plan:
    try:
        return plan_from_text(yamlio.read_text(path, f"{path}: --plan", ModelInputError, "plan file"), str(path))
    except (ModelInputError, PlannerInputError) as err:
        fail(str(err))


def resume(root: Path, state: checkpoint.TrainerState, progress: dict, rank: int) -> None:
    """Resume from the newest checkpoint under `root` that loads, saying which newer ones were passed over; one
    line and exit 2 when checkpoints exist and none loads (starting over would silently drop them)."""
    found, skipped = checkpoint.resume(root, state)
    if rank == 0:
        for line in skipped:
            sys.stderr.write(f"{PROG}: warning: passed over checkpoint {line}\n")
    if found is None and any("does not load" in line for line in skipped):
        fail(f"{root}: --checkpoint-dir: no checkpoint there loads ({skipped[0]})")
    if found is not None and rank == 0:
        say(f"resumed from {found} (step {progress['step']}, data position {progress['data_position']})")


def watch_compute_dtype(par: Parallelized) -> dict[str, str]:
    """The dtype the first Linear of this rank computes in, filled by its first forward."""
    seen: dict[str, str] = {}
    linear = next((m for m in par.chunks()[0].modules() if isinstance(m, torch.nn.Linear)), None)
    def record(_module, _args, out) -> None:  # returns None: the output stays as it is
        seen.setdefault("dtype", str(out.dtype).removeprefix("torch."))

    if linear is not None:
        linear.register_forward_hook(record)
    return seen


# float options and the values they take (nan and inf never)
FLOAT_RULES = {"lr": ("above 0", lambda v: v > 0), "min_lr_ratio": ("within 0..1", lambda v: 0 <= v <= 1),
               "weight_decay": ("at least 0", lambda v: v >= 0), "grad_clip": ("at least 0", lambda v: v >= 0)}
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets for init_process_group


def check_args(args: argparse.Namespace) -> None:
    for name in ("train_steps", "save_every"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if args.stop_at_step is not None and not 1 <= args.stop_at_step <= args.train_steps:
        fail(f"--stop-at-step: must be within 1..--train-steps ({args.train_steps}), got {args.stop_at_step}")
    for name, (rule, holds) in FLOAT_RULES.items():
        value = getattr(args, name)
        if not (math.isfinite(value) and holds(value)):
            fail(f"--{name.replace('_', '-')}: must be a finite number {rule}, got {value}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        fail(f"--warmup-steps: must be at least 0, got {args.warmup_steps}")
    check_checkpoint_dir(args.checkpoint_dir)


def check_checkpoint_dir(path: Path | None) -> None:
    """Checkpoints never live inside a folder planner may replace (one holding its manifest)."""
    folder = output_folder_holding(path) if path is not None else None
    if folder is not None:
        fail(f"{path}: --checkpoint-dir: inside planner's output folder {folder} ({MANIFEST}), which planner "
             "replaces with --force; keep checkpoints outside it")


def check_plan_stages(plan: Plan, path: Path, num_blocks: int) -> None:
    """The plan's stages are the ones its strategy makes (an edited plan.json is refused, not run)."""
    problem = stage_problem(plan, num_blocks)
    if problem is not None:
        fail(f"{path}: {problem}")


def check_torchrun() -> None:
    """One line, not torch's "RANK expected", when the trainer is started without torchrun."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        fail(f"{', '.join(missing)} not set: start the trainer with torchrun (the plan's torch/launch.sh does), "
             f"e.g. torchrun --nproc_per_node N -m planner.runtime.train --plan plan.json")


def init_distributed() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def build(plan: Plan, config: TransformerConfig, *, device: torch.device, dtype: torch.dtype | None,
          seed: int) -> tuple[Parallelized, int]:
    """The parallelized model of this rank, built on meta and materialized; and its init peak bytes."""
    with InitMemory() as memory:
        with torch.device("meta"):
            model = Transformer(config)
        model.rope_positions = plan.job.seq_len
        par = apply_plan(model, plan, device=device, param_dtype=dtype, seed=seed)
    return par, memory.peak


def train_step(par: Parallelized, optimizers: list, tokens: torch.Tensor, labels: torch.Tensor,
               grad_clip: float) -> tuple[torch.Tensor | None, float]:
    """Forward, backward, gradient clipping and the optimizer steps; (loss on the last stage, grad norm)."""
    loss = par.train_step(tokens, labels)
    params = [p for chunk in par.chunks() for p in chunk.parameters()]
    norm = global_grad_norm(params, stage_ranks=par.stage_ranks)
    clip_grads(params, grad_clip, norm)
    for optimizer in optimizers:
        optimizer.step()
    return loss, float(norm)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_args(args)
    plan = read_plan(args.plan)
    try:
        config = model_config(plan, args.model_spec)
    except (ModelInputError, ValueError) as err:  # a model the runtime cannot build: one line
        fail(f"{args.plan}: job.model: {err}")
    if args.model_spec is not None and config.name != plan.job.model:
        fail(f"{args.model_spec}: name: builds {config.name!r}, the plan is for {plan.job.model!r}")
    check_plan_stages(plan, args.plan, config.num_layers)
    try:
        check_data_plan(plan)
    except ValueError as err:
        fail(f"{args.plan}: data: {err}")
    dtype = compute_dtype(plan, args.precision, args.plan)
    shards = open_data(args, plan, config.vocab)
    ocfg = optim_config(args)

    check_torchrun()
    device = init_distributed()
    rank, s = dist.get_rank(), plan.strategy
    par, init_peak = build(plan, config, device=device, dtype=dtype, seed=args.seed)
    optimizers = [build_optimizer(chunk, ocfg) for chunk in par.chunks()]
    computed = watch_compute_dtype(par)
    progress = {"step": 0, "data_position": 0, "lr": ocfg.lr, "warmup_steps": ocfg.warmup_steps,
                "train_steps": ocfg.train_steps, "min_lr_ratio": ocfg.min_lr_ratio}
    state = checkpoint.TrainerState(par.chunks(), optimizers, progress)
    if args.checkpoint_dir is not None:
        resume(args.checkpoint_dir, state, progress, rank)

    dp_rank = (rank // (s.tp * s.cp)) % s.dp
    if plan.data is not None:  # the plan's packing and balancing of variable-length documents
        sampler = data_sampler(plan, shards, config.vocab, dp_rank, args, say)
        first = int(progress["step"])
        losses, norms = run_data_plan(par, optimizers, sampler, ocfg, args, progress, state, device, say)
        finish_report(args, plan, par, rank, init_peak, None, losses=losses, norms=norms, first=first,
                      compute=computed.get("dtype"))
        return
    cp_index, per_cp = (rank // s.tp) % s.cp, plan.job.seq_len // s.cp
    if shards is not None:
        reader = SampleReader(shards, seq_len=plan.job.seq_len, global_batch=plan.job.global_batch,
                              dp_rank=dp_rank, dp_size=s.dp, seed=args.seed)
    else:
        reader = SyntheticReader(seq_len=plan.job.seq_len, global_batch=plan.job.global_batch, dp_rank=dp_rank,
                                 dp_size=s.dp, vocab=config.vocab, seed=args.seed)
        if rank == 0:
            say("no --data: training on synthetic sequences (a fixed permutation of the vocabulary)")
    reader.position = int(progress["data_position"])
    first = int(progress["step"])
    last = args.stop_at_step if args.stop_at_step is not None else args.train_steps
    if first >= last and rank == 0:
        say(f"nothing to train: the checkpoint is at step {first}, the run ends at step {last}")
    last_stage_ranks = s.tp * s.cp * s.dp
    losses, norms, probe = [], [], None
    for step in range(first, last):
        factor = lr_factor(step, ocfg)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = ocfg.lr * factor
            optimizer.zero_grad()
        try:
            tokens, labels = reader.next_batch()
        except DataError as err:  # every rank checks the whole global batch: all stop alike
            fail(str(err))
        # under cp this rank's contiguous chunk of each sequence
        cols = slice(cp_index * per_cp, (cp_index + 1) * per_cp)
        tokens, labels = tokens[:, cols].to(device), labels[:, cols].to(device)
        if args.measure_memory and step == last - 1:
            with MemoryProbe(par.chunks(), optimizers, inputs=(tokens, labels),
                             micro_batches=plan.time.micro_batches, pipeline_stages=par.stages) as probe:
                loss, norm = train_step(par, optimizers, tokens, labels, ocfg.grad_clip)
        else:
            loss, norm = train_step(par, optimizers, tokens, labels, ocfg.grad_clip)
        # The loss lives on the last stage: average it over that stage's ranks (their dp replicas and
        # cp chunks, equal in size) onto every rank.
        total = torch.zeros((), device=device) if loss is None else loss.detach().float().to(device)
        dist.all_reduce(total)
        losses.append(total.item() / last_stage_ranks)
        norms.append(norm)
        progress.update(step=step + 1, data_position=reader.position)
        if rank == 0:
            say(f"step {step} loss {losses[-1]:.6f} lr {ocfg.lr * factor:.6g} grad_norm {norm:.6g}")
        done = step + 1 == last
        if args.checkpoint_dir is not None and ((step + 1) % args.save_every == 0 or done):
            folder = checkpoint.save(args.checkpoint_dir, step + 1, state)
            if rank == 0:
                say(f"saved checkpoint {folder} (step {step + 1}, data position {reader.position})")
    finish_report(args, plan, par, rank, init_peak, probe, losses=losses, norms=norms, first=first,
                  compute=computed.get("dtype"))


def finish_report(args: argparse.Namespace, plan: Plan, par: Parallelized, rank: int, init_peak: int,
                  probe: MemoryProbe | None, *, losses: list[float], norms: list[float], first: int,
                  compute: str | None) -> None:
    """Print each rank's bytes and write the JSON report (rank 0)."""
    for chunk in par.chunks():
        if hasattr(chunk, "reshard"):  # FSDP2: parameters back to their shards before measuring
            chunk.reshard()
    mine = local_param_bytes(par.model)
    world = dist.get_world_size()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, {"param_bytes": mine, "init_peak_bytes": init_peak,
                                      "init_block_bytes": par.init_block_bytes, "compute_dtype": compute})
    say(f"param_bytes {rank} {mine}")
    say(f"init_peak_bytes {rank} {init_peak}")
    memory: list = [None] * world
    if probe is not None:
        measured = probe.report(par.model)
        dist.all_gather_object(memory, measured)
        say(f"memory {rank} {json.dumps(measured, sort_keys=True, separators=(',', ':'))}")
    if rank == 0 and args.report is not None:
        report = {"losses": losses, "grad_norms": norms, "first_step": first,
                  "param_bytes": {str(r): e["param_bytes"] for r, e in enumerate(everyone)},
                  "init_peak_bytes": {str(r): e["init_peak_bytes"] for r, e in enumerate(everyone)},
                  "init_block_bytes": {str(r): e["init_block_bytes"] for r, e in enumerate(everyone)},
                  "compute_dtype": {str(r): e["compute_dtype"] for r, e in enumerate(everyone)},
                  "precision": args.precision if args.precision != "plan" else plan.job.precision,
                  "strategy": plan.strategy_spec}
        if probe is not None:
            report["memory"] = {str(r): m for r, m in enumerate(memory)}
        args.report.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    run_then_finish(main)  # barrier, destroy the groups, leave without racing gloo's threads (shutdown.py)
