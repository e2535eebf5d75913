"""Apply a compiled Plan to the reference model: mesh, then PP, TP, CP, AC and FSDP passes.

`apply_plan(model, plan)` reads the plan's resolved strategy and stages and
applies, in this order (torchtitan's `models/llama3/parallelize.py` order):

1. pipeline split: keep this rank's stage's blocks (the plan's uneven split),
   the embedding on the first stage and norm + head on the last, and wrap the
   stage in `torch.distributed.pipelining.PipelineStage` with a schedule
   (1f1b: Schedule1F1B, gpipe: ScheduleGPipe) over the plan's micro-batches;
   with vpp > 1 the rank builds one module per chunk of `stage.chunks`
   (model chunk j * pp + i, Megatron's interleaved layout) and runs them with
   ScheduleInterleaved1F1B; zbv and dualpipev place chunks i and 2 pp - 1 - i
   in a V (the first stage holds the embedding and the head) and run
   ScheduleZBVZeroBubble / ScheduleDualPipeV;
2. tensor parallel (DTensor `parallelize_module`): vocab-parallel embedding
   (RowwiseParallel) and head (ColwiseParallel), as the cost model splits them;
   ColwiseParallel for wq/wk/wv and w1/w3, RowwiseParallel for wo and w2;
   SequenceParallel on the norms when the plan has sp;
3. context parallel: each cp rank takes one contiguous chunk of every
   sequence and its attention all-gathers K and V over the cp group
   (planner/runtime/model.py); gradients then reduce over dp x cp, as the
   cost model charges them (torchtitan's dp_shard_cp);
4. activation checkpointing (`checkpoint_wrapper`) on the first
   `recompute_blocks / vpp` blocks of each chunk when recompute=full;
5. data parallel: FSDP2 `fully_shard` per block, then the chunk root, when
   zero >= 1, over dp_shard x cp; zero 0 replicates (DDP semantics: gradients
   all-reduced over dp x cp).

ZeRO -> FSDP2 mapping.  FSDP2 always keeps parameters sharded at rest; what
ZeRO stage changes is whether the gathered weights are freed after forward:
zero 3 -> `reshard_after_forward=True`; zero 1/2 -> `reshard_after_forward=False`
(gathered weights stay through backward, as ZeRO-1/2 keep full weights; the
sharded fp32 parameters are the sharded master copy of ZeRO-1/2).  So with
zero >= 1 each rank holds params / (dp_shard x cp) parameters between steps.
shard=node is HSDP: dp = dp_replicate x dp_shard with dp_shard the data-parallel
ranks inside one node.  offload of params/optimizer to cpu uses
`CPUOffloadPolicy` (only on CUDA; on a CPU run everything already is in host memory).

Mixed precision (`param_dtype=torch.bfloat16`): FSDP2's `MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)` on every fully_shard-ed module: the sharded parameters, their gradients and AdamW's
state stay fp32 (the master copy), forward and backward compute with bf16 gathered weights and gradients
are reduce-scattered in fp32.  Chunks without FSDP2 (zero 0, or no data parallelism) run their forward
under `torch.autocast(bf16)` instead (torchtitan does the same), with fp32 parameters and gradients.

Meta-device models: `apply_plan` takes the model built under `torch.device("meta")`, applies the
passes to the shapes, then materializes this rank's shards (planner/runtime/materialize.py) before it
builds the pipeline stages: no rank allocates more than its own part.

Not supported (clear ValueError): ep > 1 (the reference model is dense) and
offload to nvme (FSDP2 offloads to CPU only).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from planner.plan.runnable import strategy_problem
from planner.plan.schema import Plan
from planner.runtime.materialize import materialize
from planner.runtime.model import Transformer

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    from torch.distributed.pipelining.stage import _PipelineStageBase  # what the schedules take

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class Parallelized:
    """What `apply_plan` returns: this rank's module and how to run a step with it."""

    model: nn.Module = field(metadata={"doc": "This rank's module: its stage (an nn.ModuleList of chunks when "
                                              "vpp > 1), TP-, CP-, AC- and FSDP-wrapped."})
    mesh: DeviceMesh = field(metadata={"doc": "The device mesh (dims of MESH_DIMS with size > 1)."})
    stage_index: int = 0
    num_stages: int = 1
    micro_batches: int = 1
    stages: list = field(default_factory=list)  # PipelineStage per chunk when pp > 1
    schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None  # their schedule
    replicate_group: dist.ProcessGroup | None = None  # zero 0 with dp x cp > 1: all-reduce gradients here
    replicate_size: int = 1
    stage_ranks: int = 1  # ranks of one pipeline stage (tp x cp x dp): they hold its parameters between them
    init_block_bytes: int = 0  # the largest temporary block materialization drew (0: the model was not meta)

    v_shape: bool = False  # zbv, dualpipev: the first stage runs the first and the last model chunk

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank computes the loss: the last stage, or in a V the first."""
        return self.stage_index == (0 if self.v_shape else self.num_stages - 1)

    def chunks(self) -> list[nn.Module]:
        """The model chunks this rank runs (one unless vpp > 1)."""
        return list(self.model) if isinstance(self.model, nn.ModuleList) else [self.model]

    def train_step(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Forward + backward of this rank's share of the batch; the mean loss on the last stage, else None."""
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            if self.is_first:
                self.schedule.step(tokens, target=labels if self.is_last else None, losses=losses)
            elif self.is_last:
                self.schedule.step(target=labels, losses=losses)
            else:
                self.schedule.step()
            loss = torch.stack([x.detach() for x in losses]).mean() if self.is_last else None
        else:
            total = torch.zeros((), device=tokens.device)
            for tok, lab in zip(tokens.chunk(self.micro_batches), labels.chunk(self.micro_batches)):
                micro = loss_fn(self.model(tok), lab) / self.micro_batches
                micro.backward()
                total += micro.detach()
            loss = total
        self.sync_replicated_grads()
        return loss

    def sync_replicated_grads(self) -> None:
        # zero 0: DDP semantics without buckets: average every gradient over dp x cp.
        if self.replicate_group is None:
            return
        for param in self.model.parameters():
            if param.grad is None:
                continue
            grad = param.grad._local_tensor if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=self.replicate_group)
            grad.div_(self.replicate_size)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


# ---------------------------------------------------------------- mesh


def mesh_shape(plan: Plan) -> dict[str, int]:
    """Mesh dims and sizes (order of MESH_DIMS, every size, 1 included) of the plan.

    shard=node (HSDP): dp_shard is the data-parallel ranks inside one node,
    dp_replicate the rest; zero 0 replicates over all of dp.
    """
    s = plan.single_strategy
    tp, cp, dp, pp = s.tp, s.cp, s.data_parallel, s.pp
    if s.zero == 0:
        replicate, shard = dp, 1
    elif s.shard == "node":
        per_node = plan.stages[0].ranks.spans[0].gpus_per_node
        shard = max(1, min(dp, per_node // (tp * cp)))
        if dp % shard:
            raise ValueError(f"shard=node: dp ({dp}) is not a multiple of the data-parallel ranks per node ({shard})")
        replicate = dp // shard
    else:
        replicate, shard = 1, dp
    return {"pp": pp, "dp_replicate": replicate, "dp_shard": shard, "cp": cp, "tp": tp}


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """DeviceMesh over every rank of the plan: dims of size > 1 in the order pp, dp_replicate, dp_shard, cp, tp.

    Row-major order of these dims is the plan's rank order (tp fastest, then cp, dp, pp).
    """
    shape = {name: size for name, size in mesh_shape(plan).items() if size > 1} or {"dp_shard": 1}
    world = dist.get_world_size()
    total = 1
    for size in shape.values():
        total *= size
    if total != world:
        factors = " * ".join(f"{name}({size})" for name, size in shape.items())
        raise ValueError(f"{factors} != world_size({world}): launch with the plan's {plan.job.num_gpus} ranks")
    return init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape))


def _check_supported(plan: Plan) -> None:
    problem = strategy_problem(plan.strategy)
    if problem is not None:
        raise ValueError(problem)


# ---------------------------------------------------------------- passes


def model_chunk_index(plan: Plan, stage_index: int, local: int) -> int:
    """The model chunk a stage runs as its `local`-th: j * pp + i interleaved, i and 2 pp - 1 - i in a V
    (torch.distributed.pipelining's stage_index_to_group_rank, style "loop" or "v")."""
    pp = len(plan.stages)
    if plan.single_strategy.v_shape:
        return stage_index if local == 0 else 2 * pp - 1 - stage_index
    return local * pp + stage_index


def chunk_modules(model: Transformer, plan: Plan, *, stage_index: int) -> list[Transformer]:
    """One copy of `model` per chunk of the stage, each keeping its blocks; the embedding stays on
    model chunk 0 (stage 0's first) and norm + head on the last model chunk (stage pp-1's last, or in a V
    stage 0's second)."""
    chunks = plan.stages[stage_index].chunks or [[0, -1]]
    pp, out = len(plan.stages), []
    for j, (first, last) in enumerate(chunks):
        piece = model if j == len(chunks) - 1 else copy.deepcopy(model)
        model_chunk = model_chunk_index(plan, stage_index, j)
        piece.keep_blocks(first, last, first_stage=model_chunk == 0, last_stage=model_chunk == pp * len(chunks) - 1)
        out.append(piece)
    return out


def build_schedule(chunks: Sequence[nn.Module], plan: Plan, *, stage_index: int, pp_mesh: DeviceMesh,
                   device: torch.device):
    """PipelineStage per chunk and their schedule (1f1b, gpipe, interleaved, zbv or dualpipev) over the plan's
    micro-batches."""
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                              ScheduleInterleaved1F1B, ScheduleZBVZeroBubble)

    pp, kind = len(plan.stages), plan.single_strategy.pipeline_schedule
    stages: list[_PipelineStageBase] = [
        PipelineStage(chunk, model_chunk_index(plan, stage_index, j), pp * len(chunks), device,
                      group=pp_mesh.get_group())
        for j, chunk in enumerate(chunks)]
    m = plan.time.micro_batches
    looped = {"interleaved": ScheduleInterleaved1F1B, "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
    if kind in looped:
        return stages, looped[kind](stages, n_microbatches=m, loss_fn=loss_fn)
    schedule_cls = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}.get(kind)
    if schedule_cls is None:
        raise ValueError(f"schedule={kind}: not supported by the planner torch runtime (1f1b, gpipe, interleaved, "
                         "zbv, dualpipev)")
    return stages, schedule_cls(stages[0], n_microbatches=m, loss_fn=loss_fn)


def apply_tp(model: Transformer, *, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallel with vocab-parallel embedding and head (torchtitan's llama3 plan)."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    seq = Shard(1) if sequence_parallel else Replicate()
    root: dict = {}
    if model.tok_embeddings is not None:
        root["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.output is not None:
        root["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if model.norm is not None and sequence_parallel:
        root["norm"] = SequenceParallel()
    if root:
        parallelize_module(model, tp_mesh, root)
    for block in model.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)


def apply_cp(model: Transformer, *, cp_mesh: DeviceMesh) -> None:
    """Context parallel attention: every block all-gathers K and V over the cp group."""
    for block in model.blocks():
        block.attention.cp_group = cp_mesh.get_group()


def apply_ac(model: Transformer, *, blocks: int) -> None:
    """Full activation checkpointing of the first `blocks` blocks of the chunk (Megatron's block method)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for key in list(model.layers.keys())[:blocks]:
        model.layers[key] = checkpoint_wrapper(model.layers[key], preserve_rng_state=False)


def apply_fsdp(model: Transformer, *, dp_mesh: DeviceMesh, reshard_after_forward: bool, offload: bool,
               param_dtype: torch.dtype | None = None) -> None:
    """FSDP2 `fully_shard` on each block, then on the stage root; with `param_dtype` (bf16) its
    MixedPrecisionPolicy computes in that dtype and reduces gradients in fp32."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, offload_policy=policy,
                    mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, offload_policy=policy,
                mp_policy=mp)


def apply_autocast(model: nn.Module, *, dtype: torch.dtype, device_type: str) -> None:
    """Run `model`'s forward under torch.autocast(dtype) (mixed precision without FSDP2): hooks enter it
    before forward and leave it after, so backward and the optimizer run outside it."""
    contexts: list = []

    def enter(_module, _args):
        ctx = torch.autocast(device_type, dtype=dtype)
        ctx.__enter__()
        contexts.append(ctx)

    def leave(_module, _args, _out):
        contexts.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


# ---------------------------------------------------------------- entry


def _data_parallel_mesh(mesh: DeviceMesh, shape: dict[str, int]) -> DeviceMesh:
    """FSDP2's mesh: dp_shard x cp flattened (the cost model's shard group), behind dp_replicate for HSDP."""
    names = [n for n in ("dp_shard", "cp") if shape[n] > 1]
    shard = mesh[tuple(names)]._flatten("dp_shard_cp") if len(names) > 1 else mesh[names[0]]
    if shape["dp_replicate"] == 1:
        return shard
    if shard.mesh_dim_names is None:  # every mesh here is built with names (MESH_DIMS)
        raise ValueError("the data-parallel mesh has no dimension names")
    return mesh["dp_replicate", shard.mesh_dim_names[0]]


def apply_plan(model: Transformer, plan: Plan, *, device_mesh: DeviceMesh | None = None,
               device: torch.device | None = None, param_dtype: torch.dtype | None = None,
               seed: int = 0) -> Parallelized:
    """Parallelize `model` for this rank as `plan` says: the whole reference model built under
    torch.device("meta") (materialized here, after the passes, with `seed`'s initial values) or on a
    device (the same init on every rank).  `param_dtype` bf16 turns on mixed precision."""
    _check_supported(plan)
    s = plan.single_strategy
    device = device or torch.device("cpu")
    mesh = device_mesh or build_mesh(plan, device.type)
    rank = dist.get_rank()
    stage_index = rank // (s.tp * s.cp * s.data_parallel)
    out = Parallelized(model=model, mesh=mesh, stage_index=stage_index, num_stages=len(plan.stages),
                       micro_batches=plan.time.micro_batches, stage_ranks=s.tp * s.cp * s.data_parallel,
                       v_shape=s.v_shape)
    on_meta = any(p.device.type == "meta" for p in model.parameters())

    # (1) pipeline split: this rank's stage (its chunks when vpp > 1).
    chunks = chunk_modules(model, plan, stage_index=stage_index) if s.pp > 1 else [model]
    out.model = chunks[0] if len(chunks) == 1 else nn.ModuleList(chunks)
    recompute_per_chunk = plan.stages[stage_index].recompute_blocks // len(chunks)  # the plan counts every block
    shape = mesh_shape(plan)
    fsdp = s.zero >= 1 and shape["dp_shard"] * shape["cp"] > 1
    dp_mesh = _data_parallel_mesh(mesh, shape) if fsdp else None
    # this stage's own placement (stages may differ: plan.json's stage_offload)
    offload = fsdp and s.for_stage(stage_index).offload != "none" and device.type == "cuda"
    for chunk in chunks:
        # (2) tensor parallel (sequence parallel on the norms when sp).
        if s.tp > 1:
            apply_tp(chunk, tp_mesh=mesh["tp"], sequence_parallel=s.sequence_parallel)
        # (3) context parallel attention.
        if s.cp > 1:
            apply_cp(chunk, cp_mesh=mesh["cp"])
        # (4) activation checkpointing on the chunk's first recompute_blocks / vpp blocks.  recompute=selective:
        # SDPA already does not keep the attention scores, which is all selective recomputation
        # (Korthikanti et al. 2022) recomputes.
        if s.recompute == "full":
            apply_ac(chunk, blocks=recompute_per_chunk)
        # (5) data parallel: FSDP2 over dp_shard x cp for zero >= 1 (HSDP with shard=node).
        if dp_mesh is not None:
            apply_fsdp(chunk, dp_mesh=dp_mesh, reshard_after_forward=s.zero == 3, offload=offload,
                       param_dtype=param_dtype)
        elif param_dtype is not None:
            apply_autocast(chunk, dtype=param_dtype, device_type=device.type)
    # (6) materialize: this rank's shards get storage and their layout-independent initial values.
    if on_meta:
        # FSDP2's CPUOffloadPolicy keeps the shards in host memory: they are materialized there
        out.init_block_bytes = materialize(chunks, device=torch.device("cpu") if offload else device, seed=seed,
                                           buffer_device=device)
    if s.pp > 1:
        out.stages, out.schedule = build_schedule(chunks, plan, stage_index=stage_index, pp_mesh=mesh["pp"],
                                                  device=device)
    # Without FSDP (zero 0, or one shard per replica) gradients are all-reduced over dp x cp by hand.
    replicate = [] if fsdp else [n for n in ("dp_replicate", "cp") if shape[n] > 1]
    if replicate:
        group_mesh = mesh[tuple(replicate)]._flatten("replicate_cp") if len(replicate) > 1 else mesh[replicate[0]]
        out.replicate_group, out.replicate_size = group_mesh.get_group(), group_mesh.size()
    return out


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (the local shard of DTensor / FSDP2 parameters)."""
    total = 0
    seen: set[int] = set()
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
    return total
