"""What a runtime can express (its `space` section), how its pipeline holds the exchanged tensors, and how
its MoE layer pads experts to a capacity."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from planner.chunks import accounted_split, split_chunks
from planner.profile.sections import _FIELD
from planner.strategy import Dispatcher, Offload, OffloadDevice, Schedule, ShardScope, Strategy

# how the blocks each stage fully recomputes may be chosen: a count per stage; one count k for every stage
# (stage i recomputes min(k, its blocks per chunk)); or all blocks of every stage, or none
RecomputeCounts = Literal["per_stage", "uniform", "all"]



class Space(BaseModel):
    """The strategies the framework can express (what its launch files can ask for)."""

    model_config = _FIELD
    tensor_parallel: bool = Field(description="tp > 1.")
    context_parallel: bool = Field(description="cp > 1.")
    context_parallel_needs_flash: bool = Field(description="cp > 1 only with fused (flash) attention.")
    expert_parallel: bool = Field(description="ep > 1.")
    moe: bool = Field(description="Mixture-of-experts models at all.")
    zero_stages: tuple[int, ...] = Field(description="ZeRO stages it runs without pipeline parallelism.")
    zero_stages_pipelined: tuple[int, ...] = Field(description="ZeRO stages it runs with pp > 1.")
    shard_scopes: tuple[ShardScope, ...] = Field(description="Sharding scopes (node: HSDP).")
    offloads: tuple[Offload, ...] = Field(description="Offload settings.")
    offload_devices: tuple[OffloadDevice, ...] = Field(description="Offload targets.")
    partial_offload: bool = Field(description="offload_ratio < 1.")
    per_stage_placement: bool = Field(description="Stages may offload differently.")
    host_regather: bool = Field(description="regather=host (the FCDP host cache).")
    schedules: tuple[Schedule, ...] = Field(description="Pipeline schedules.")
    one_f_one_b_needs_stages: bool = Field(
        False, description="1F1B needs at least as many micro-batches per replica as pipeline stages "
        "(torch.distributed.pipelining's Schedule1F1B raises otherwise; Megatron's 1F1B runs fewer).")
    split: Literal["any", "ends", "even"] = Field(
        description="Pipeline splits: any; ends (only the first and last stage may differ from the others); even.")
    recompute_layers: RecomputeCounts = Field(
        description="Full recompute of the first k blocks: k per stage (per_stage), one k for every stage "
        "(uniform), or every block or none (all).")
    selective_recompute: bool = Field(description="recompute=selective.")
    recompute_every: bool = Field(
        False, description="recompute_every=k: full recompute of every k-th block (torchtitan's layer SAC, an "
        "FSDP check_fn).")
    tp_overlap: bool = Field(description="Overlap of TP collectives with GEMMs.")
    dp_overlap_off: bool = Field(
        False, description="dp_overlap=grad or off: the data-parallel sync left (partly) exposed, as a run "
        "without the framework's overlap flags does (Megatron-LM's defaults); elsewhere it always overlaps.")
    moe_zero_stages: tuple[int, ...] | None = Field(
        None, description="ZeRO stages it runs for a mixture-of-experts model (null: zero_stages): DeepSpeed's "
        "own MoE layer is refused under ZeRO-3.")
    moe_pipelined: bool = Field(True, description="Mixture-of-experts models with pp > 1.")
    shared_experts: bool = Field(True, description="Mixture-of-experts models with always-active shared experts.")
    expert_tensor_parallel: bool = Field(
        True, description="etp apart from tp (experts split over other ranks than the dense layers).")
    ep_overlap: bool = Field(True, description="ep_overlap (the expert all-to-alls hidden behind another "
                             "micro-batch's compute).")
    dispatchers: tuple[Dispatcher, ...] = Field(
        ("alltoall",), description="MoE token dispatchers (Strategy.dispatcher) it runs: alltoall everywhere; deepep "
        "and hybridep where the framework has Megatron-Core's flex dispatcher.")
    source: str = Field(description="Where the framework's arguments and checks are.")

    def default_split(self, blocks: int, pp: int, vpp: int = 1) -> tuple[int, ...] | None:
        """The split this framework runs when none is given and `blocks` does not divide over `pp` stages, or
        None for the even split with the extra blocks on the earlier stages (planner.cost.layout.split_blocks).

        ends (Megatron: --decoder-first/last-pipeline-num-layers): the middle stages hold ceil(blocks / pp)
        each and the first and last share the rest, the first taking the odd one (the last also holds the
        head and the loss).  With an interleaved schedule whose chunks the blocks do not fill evenly, the
        embedding and the loss count as a layer each (planner.chunks.accounted_split: Megatron-Core's
        --account-for-embedding/loss-in-pipeline-split, or the recipes' explicit layouts).  even: no split
        runs, and the default is refused too."""
        if self.split != "ends" or blocks < pp:
            return None
        if vpp > 1:
            return accounted_split(blocks, pp, vpp) if blocks % (pp * vpp) else None
        if pp < 3 or blocks % pp == 0:
            return None
        middle = -(-blocks // pp)
        rest = blocks - (pp - 2) * middle
        if rest < 2:
            middle = blocks // pp
            rest = blocks - (pp - 2) * middle
        return (rest - rest // 2, *([middle] * (pp - 2)), rest // 2)


class Pipelining(BaseModel):
    """How the runtime's pipeline schedule holds the tensors its stages exchange."""

    model_config = _FIELD
    receive_buffers: Literal["per_transfer", "per_microbatch"] = Field(
        "per_transfer", description="per_transfer: a received activation or gradient is allocated when it "
        "arrives and freed with the micro-batch (counted in the activations in flight); per_microbatch: one "
        "receive buffer per micro-batch, per direction and model chunk, allocated when the schedule starts and "
        "held for the job (torch.distributed.pipelining).")
    source: str = Field("", description="Where this was read.")


class ExpertCapacity(BaseModel):
    """A runtime whose MoE layer pads every expert's tokens to a fixed capacity and drops the overflow (GShard's
    dispatch, DeepSpeed-MoE): each of a rank's `tokens` routes to top_k experts; every expert takes
    C = max(ceil(tokens * top_k * capacity_factor / experts), min_capacity) of them from each rank, padded when
    fewer come; the all-to-alls move the padded (experts, C, hidden) buffer and the experts compute on all of it.
    So every rank's expert work and traffic is C * experts / (tokens * top_k) times the mean, whatever the
    routing: the busiest rank's load (`Job.moe_imbalance`) does not apply, and the tokens past C are dropped."""

    model_config = _FIELD
    capacity_factor: float = Field(gt=0, description="Capacity per expert over the mean routed tokens.")
    min_capacity: int = Field(ge=0, description="Least capacity per expert, however few the tokens.")
    aux_loss_coeff: float = Field(ge=0, description="Weight of the load-balancing loss the trainer adds (not "
                                  "priced: it changes routing, not the padded work).")
    source: str = Field(description="Where the dispatch and the defaults are.")

    def load_ratio(self, tokens: float, top_k: int, experts: int) -> float:
        """Expert tokens a rank computes and sends over the mean routed ones (tokens * top_k), for `tokens` per
        rank and micro-batch."""
        capacity = max(math.ceil(tokens * top_k * self.capacity_factor / experts - 1e-9), self.min_capacity)
        return capacity * experts / (tokens * top_k)


def recompute_counts_allowed(strategy: Strategy, split_blocks: tuple[int, ...] | None,
                             rule: RecomputeCounts) -> bool:
    """Whether the strategy's recomputed blocks follow `rule`.  uniform: one count k gives every stage its
    blocks, stage i recomputing min(k, its blocks per chunk) (Megatron's --recompute-num-layers), so (4, 2, 4)
    on stages of 4/2/4 blocks is one count; all: every block of every stage (or none)."""
    counts = strategy.recompute_layers
    if rule == "per_stage" or counts is None:
        return True
    if split_blocks is None:
        return rule == "uniform" and len(set(counts)) == 1
    per_stage = counts * len(split_blocks) if len(counts) == 1 else counts
    chunks = split_chunks(split_blocks, strategy.vpp)
    done = [[min(k, c) for c in stage] for k, stage in zip(per_stage, chunks)]
    if rule == "all":
        return done == [list(stage) for stage in chunks] or not any(map(any, done))
    top = max(max(stage) for stage in done)
    return all(d == min(top, c) for stage_done, stage in zip(done, chunks) for d, c in zip(stage_done, stage))
