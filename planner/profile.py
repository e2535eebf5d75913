"""Runtime profiles: how a training framework stores, overlaps and schedules a strategy.

Megatron-LM, DeepSpeed, torchtitan and our own runtime (`planner.runtime`) run
the same strategy differently: Megatron's distributed optimizer shards the
optimizer but keeps fp32 gradients whole, DeepSpeed keeps an fp32 gradient
partition for its optimizer, FSDP2 keeps fp32 shards and gathers bf16 copies,
and under pipeline parallelism torchtitan does not reshard after forward.  A
`RuntimeProfile` states those facts for one framework; the cost model
(`planner.cost.evaluate(job, strategy, runtime)`), the search space and the
emitters' re-check all read it.

Profiles are data: `hardware/data/runtimes/<name>.yaml`, every value with its
source; a profile may `extends:` another and override some sections (a
framework's older release, or its eager mode).  docs/cost-model.md describes
how each field enters the cost model.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.graph import LayerKind
from planner.chunks import accounted_split, split_chunks
from planner.errors import PlannerInputError
from planner.strategy import Offload, OffloadDevice, Schedule, ShardScope, Strategy

_FIELD = ConfigDict(extra="forbid", frozen=True)
StateKind = Literal["weights", "grads", "optimizer"]
# what stays gathered of ZeRO-3/FSDP-sharded weights: the running and prefetched layer (re-gathered for
# backward), a micro-batch's worth (gathered in forward, kept through its backward), or the whole stage
# for the step (gathered once, gradients accumulated unsharded and reduce-scattered once)
Gather = Literal["layers", "microbatch", "step"]
# how the blocks each stage fully recomputes may be chosen: a count per stage; one count k for every stage
# (stage i recomputes min(k, its blocks per chunk)); or all blocks of every stage, or none
RecomputeCounts = Literal["per_stage", "uniform", "all"]


class StateTerm(BaseModel):
    """One per-parameter state a framework keeps in HBM (a weight copy, a gradient buffer, optimizer moments)."""

    model_config = _FIELD
    name: str = Field(description="What it is, e.g. 'fp32 main gradients'.")
    kind: StateKind = Field(description="Report column it counts under.")
    bytes_per_param: float = Field(ge=0, description="Bytes per parameter.")
    sharded_from_zero: int | None = Field(
        description="Lowest ZeRO stage at which this term is sharded over the sharding group; null: never sharded."
    )
    moves_with: Literal["optimizer", "params"] | None = Field(
        None, description="Offloaded with the optimizer states (DeepSpeed's fp32 gradient partition) or with the "
        "parameters (FSDP2's CPUOffloadPolicy moves gradient shards too); null: stays in HBM.")
    whole_embedding_under_tp: bool = Field(
        False, description="The vocab-parallel embedding's share of this term is held whole on every tensor-"
        "parallel rank while ZeRO does not shard the term (a gradient the embedding's backward produces at the "
        "whole table's size).")
    source: str = Field(description="Where the framework allocates it.")

    def whole_embedding_extra(self, embedding_params: float, zero: int, tp: int) -> float:
        """Bytes this term holds beyond `bytes` for an embedding of `embedding_params` per rank kept whole."""
        sharded = self.sharded_from_zero is not None and zero >= self.sharded_from_zero
        if not self.whole_embedding_under_tp or sharded or tp == 1:
            return 0.0
        return embedding_params * (tp - 1) * self.bytes_per_param

    def bytes(self, params: float, zero: int, shard: int) -> float:
        """Bytes of this term for `params` parameters under ZeRO stage `zero` over `shard` ranks."""
        sharded = self.sharded_from_zero is not None and zero >= self.sharded_from_zero
        return params * self.bytes_per_param / (shard if sharded else 1)


class GatherCalls(BaseModel):
    """How a framework issues the collectives of sharded weights: how many per layer, how far ahead of the
    compute, and what each costs the host.  At hundreds of ranks a ring collective pays n - 1 latency steps,
    so the count of collectives, not their bytes, sets the time (planner.cost.comm.data_parallel_comm)."""

    model_config = _FIELD
    prefetch: int = Field(1, ge=0, description="Gather units issued ahead of the compute that needs them; 0: "
                          "every gather waits on the critical path and nothing hides it.")
    gathers: dict[LayerKind, float] = Field(
        default_factory=dict, description="All-gather collectives per gather of one layer, by layer kind; a kind "
        "not listed: 1.")
    reduces: dict[LayerKind, float] = Field(
        default_factory=dict, description="Gradient reduce-scatter collectives per layer, by layer kind; a kind not "
        "listed: 1.")
    regather_for_recompute: bool = Field(
        False, description="A fully recomputed layer is gathered again for its recomputed forward (module hooks) "
        "besides the backward's gather.")
    per_rank_copies: bool = Field(
        False, description="Each collective copies one chunk per rank on the host path (list-based all_gather / "
        "reduce_scatter of torch.distributed before all_gather_into_tensor): group size x "
        "`collective_per_rank_copy_seconds` per collective, not hidden.")
    source: str = Field("default: one collective per layer, prefetched (FSDP)", description="Where the framework "
                        "issues them.")

    def per_layer(self, kind: LayerKind, reduce: bool = False) -> float:
        """Collectives one layer of `kind` issues per gather (or per gradient reduction)."""
        return (self.reduces if reduce else self.gathers).get(kind, 1.0)


class GatherUnits(BaseModel):
    """FSDP units as a runtime wraps them: one per transformer block and a root unit holding the rest of the
    stage (embedding, final norm, head), which is gathered once for the step and reduce-scatters its gradients
    after the stage's whole backward.  Without it a unit is one layer (`Gathering.held`'s `layers`: the running
    and the prefetched layer)."""

    model_config = _FIELD
    blocks_gathered: int = Field(ge=1, description="Blocks whose weights are gathered at once under the `layers` "
                                 "policy, besides the root unit.")
    whole_embedding_grad_under_tp: bool = Field(
        False, description="The vocab-parallel embedding's unsharded gradient is the whole table on every tensor-"
        "parallel rank (the `whole_embedding_under_tp` of a state term, seen before FSDP reduce-scatters it).")
    source: str = Field(description="Where the runtime wraps them, and what was measured.")


class Gathering(BaseModel):
    """How sharded weights are brought back for compute (ZeRO-3 / FSDP, and FSDP-backed ZeRO-1/2)."""

    model_config = _FIELD
    sharded_weights_from_zero: int = Field(
        3, ge=1, le=4, description="Lowest ZeRO stage whose weights are sharded at rest and gathered for compute "
        "(4: never)."
    )
    bytes_per_param: float = Field(2.0, gt=0, description="Bytes per parameter of the gathered copy (bf16: 2).")
    grad_bytes_per_param: float = Field(
        2.0, ge=0, description="Bytes per parameter of unsharded gradients held before they are reduce-scattered.")
    accumulated_grad_bytes_per_param: float | None = Field(
        None, ge=0, description="Bytes per parameter of the unsharded gradients a `step` policy accumulates over "
        "the micro-batches before its one reduce-scatter (FSDP2 upcasts them to its reduce dtype while gradient "
        "sync is off); null: grad_bytes_per_param.")
    held: dict[int, Gather] = Field(description="What stays gathered, per ZeRO stage whose weights are gathered.")
    held_pipelined: dict[int, Gather] = Field(
        default_factory=dict, description="Overrides of `held` when pp > 1 (torchtitan: no reshard after forward).")
    calls: GatherCalls = Field(default_factory=GatherCalls, description="How the gathers and reductions are issued.")
    units: GatherUnits | None = Field(
        None, description="Block and root FSDP units; null: every layer is its own unit.")
    source: str = Field(description="Where the framework decides it.")

    @property
    def accumulated_grad_bytes(self) -> float:
        """Bytes per parameter of the unsharded gradients held for a whole step."""
        if self.accumulated_grad_bytes_per_param is None:
            return self.grad_bytes_per_param
        return self.accumulated_grad_bytes_per_param

    def policy(self, zero: int, pipelined: bool) -> Gather | None:
        """What stays gathered under `zero` (None: weights are not sharded at rest)."""
        if zero < self.sharded_weights_from_zero:
            return None
        if pipelined and zero in self.held_pipelined:
            return self.held_pipelined[zero]
        return self.held.get(zero, "layers")


class Overlap(BaseModel):
    """What data-parallel communication hides behind compute."""

    model_config = _FIELD
    grad_reduce: bool = Field(description="The step-end gradient reduction overlaps the last backward "
                              "(Megatron --overlap-grad-reduce, DeepSpeed overlap_comm, FSDP2/DDP buckets).")
    param_gather: bool = Field(description="The distributed optimizer's parameter all-gather overlaps the next "
                               "forward (Megatron --overlap-param-gather).")
    grad_reduce_bytes: dict[str, float] = Field(
        description="Bytes per gradient element on the wire, per job precision (bf16, fp16, fp8; mxfp8 runs reduce "
        "as fp8).")
    source: str = Field(description="Where the framework does it.")


class Kernels(BaseModel):
    """Kernel facts that change time and activation memory."""

    model_config = _FIELD
    flash_attention: bool = Field(description="Fused flash attention (no s^2 score tensors).")
    attention_kernel: Literal["flash2", "flash3", "cudnn"] = Field(
        "flash2", description="The flash-attention kernel it runs where the device has it "
        "(hardware/data/attention.yaml): flash2 (FlashAttention-2, PyTorch's scaled_dot_product_attention), flash3, "
        "cudnn (Transformer Engine's fused attention on Hopper).")
    fused_elementwise: bool = Field(description="Element-wise work in fused kernels (Transformer Engine, apex "
                                    "fusions or torch.compile); False: eager PyTorch kernels.")
    autocast_weight_copy_bytes: float = Field(
        0.0, ge=0, description="Bytes per parameter of the 16-bit copies native AMP (torch.autocast) casts from "
        "fp32 weights for each matmul and autograd saves for its backward, per micro-batch in flight; 0 where the "
        "weights are already held in the compute dtype (FSDP's gathered copies, Megatron's 16-bit weights).")
    fp8_gemm_speedup: float | None = Field(
        None, ge=1.0, description="Realised FP8 over BF16 GEMM speedup of the framework's FP8 recipe (casts and "
        "scaling included); null: constants.yaml's fp8_gemm_speedup_cap.")
    cuda_graphs: bool = Field(
        False, description="The step's kernels are replayed from captured CUDA graphs (Megatron's "
        "--cuda-graph-impl, torch.compile mode='reduce-overhead'), so each costs constants.yaml's "
        "graph_kernel_launch_seconds instead of kernel_launch_seconds (planner.cost.launches).")
    source: str = Field(description="Which kernels the framework runs.")


class LossBytes(BaseModel):
    """Bytes per logit (token x vocabulary entry of one micro-batch on one rank) of a loss implementation."""

    model_config = _FIELD
    saved: float = Field(ge=0, description="Bytes per logit kept from the loss's forward until its backward.")
    peak: float = Field(ge=0, description="Bytes per logit alive at the loss's peak, in its forward or its backward "
                        "(the logits, their copies and gradients; the saved ones included).")

    @property
    def transient(self) -> float:
        """Bytes per logit the loss's peak adds to what it keeps."""
        return max(0.0, self.peak - self.saved)


class Loss(BaseModel):
    """What the cross-entropy loss holds in HBM per logit.  The default is the fused, in-place loss Megatron-LM's
    memory formula counts: fp32 logits, nothing more (megatron/training/theoretical_memory_usage.py, 4sbv/t)."""

    model_config = _FIELD
    whole_vocab: LossBytes = Field(
        default_factory=lambda: LossBytes(saved=4.0, peak=4.0),
        description="Each rank's loss over the whole vocabulary (tp = 1).")
    vocab_parallel: LossBytes | None = Field(
        None, description="The vocab-parallel loss over tensor-parallel ranks (tp > 1: each rank holds its share of "
        "the vocabulary); null: as whole_vocab.")
    gathers_vocab: bool = Field(
        False, description="The head's logits are all-gathered to the whole vocabulary on every tensor-parallel "
        "rank before the loss (its bytes are whole_vocab's over every logit of the vocabulary).")
    pipeline_outputs: float = Field(
        0.0, ge=0, description="Bytes per logit of every micro-batch's logits the last pipeline stage keeps until the "
        "step ends (torch.distributed.pipelining's output_chunks, kept while the schedule returns its outputs); 0: "
        "none kept.")
    source: str = Field(
        "Megatron-LM megatron/training/theoretical_memory_usage.py: the output layer's fp32 logits, 4sbv/t; "
        "megatron/core/tensor_parallel/cross_entropy.py computes softmax and its gradient in place on them",
        description="Where the framework computes its loss and what was measured.")

    def bytes(self, tp: int) -> LossBytes:
        """The loss's bytes per logit at tensor-parallel degree `tp`."""
        return self.vocab_parallel if tp > 1 and self.vocab_parallel is not None else self.whole_vocab


# what one saved tensor's size per token is a multiple of (planner.cost.memory.layer_width reads it off a layer)
SaveWidth = Literal["one", "hidden", "gated_ffn", "heads", "head_dim", "q_width", "kv_width", "seq_len"]


class SavedTensor(BaseModel):
    """One tensor a layer's forward saves for its backward, per token (or per local sequence row) of a
    micro-batch: `elements` x the layer's `width`, in `dtype`, divided as the strategy splits it."""

    model_config = _FIELD
    name: str = Field(description="What it is and which op saves it.")
    elements: float = Field(gt=0, description="Elements per token (or row) as a multiple of `width`.")
    width: SaveWidth = Field(
        description="one; hidden; gated_ffn (the feed-forward width of a gated, bias-free MLP: its matmul "
        "parameters over 3 x hidden); heads, head_dim, q_width (heads x head_dim), kv_width (kv_heads x head_dim) "
        "of the attention; seq_len (the whole sequence: a row of a mask).")
    dtype: Literal["compute", "fp32"] = Field(
        description="compute: the job's activation dtype (`Activations.compute_bytes`); fp32: 4 bytes whatever "
        "the precision (an op that upcasts: RMSNorm's statistics, SDPA's logsumexp).")
    split: Literal["none", "tp", "sp"] = Field(
        description="none: every tensor-parallel rank keeps it whole (all-gathered inputs); tp: split over the "
        "tensor-parallel ranks (heads, ffn columns); sp: split over them only under sequence parallelism (the "
        "residual stream).")
    cp_gathered: bool = Field(
        False, description="Covers the whole sequence, all-gathered over the context-parallel ranks (x cp).")
    cp_only: bool = Field(False, description="Saved only when cp > 1.")
    sp_only: bool = Field(False, description="Held only under sequence parallelism.")
    per: Literal["token", "row"] = Field(
        "token", description="token: per token of the micro-batch on this rank (mbs x seq_len / cp); row: per "
        "local sequence position, once per micro-batch (seq_len / cp; a mask broadcast over the batch).")
    resaved: Literal["same", "upcast"] = Field(
        "same", description="For a checkpointed tensor (a block's input): what the block's recomputed forward "
        "saves of it.  same: that very storage (a norm that saves its input as it is; counted once); upcast: an "
        "fp32 copy, the same storage only when the compute dtype is fp32 already.")
    source: str = Field(description="The code line that saves it.")


class LayerSaves(BaseModel):
    """What one layer kind saves for backward."""

    model_config = _FIELD
    saved: tuple[SavedTensor, ...] = Field(description="Saved without recompute (and under selective "
                                           "recompute: the section is for runtimes whose selective mode saves "
                                           "the same, as flash attention keeps no scores).")
    checkpointed: tuple[SavedTensor, ...] = Field(
        (), description="What the layer keeps under full activation checkpointing (its block's input).")
    backward: tuple[SavedTensor, ...] = Field(
        (), description="The activation gradients its backward holds at once on top of the saves (its transient).")


class SelectiveRecompute(BaseModel):
    """What a runtime's recompute=selective keeps and redoes where it is not Megatron's (which recomputes the
    attention core and keeps the model graph's saves without the score tensors): torchtitan's per-op selective
    activation checkpointing, a policy over the ops of each checkpointed block."""

    model_config = _FIELD
    saved: dict[LayerKind, tuple[SavedTensor, ...]] = Field(
        description="What each block layer kind keeps from its forward to its backward (replaces the model "
        "graph's count); the block's input is listed on its first layer (the attention).")
    recomputed_gemms: dict[LayerKind, tuple[SaveWidth, ...]] = Field(
        description="The GEMMs each layer kind runs again in backward, each hidden x the named width per token "
        "(hidden x q_width: a query or output projection; hidden x kv_width: a key or value projection; hidden "
        "x gated_ffn: one of a gated MLP's three).")
    attention_core: bool = Field(description="Whether the attention core (SDPA) runs again in backward.")
    elementwise: bool = Field(
        description="Whether the element-wise kernels (norms, RoPE, activations, residual adds) and their launches "
        "run again in backward.")
    tp_collectives: float = Field(
        ge=0, le=1, description="Share of a block layer's forward tensor-parallel collectives that run again in "
        "backward under sequence parallelism (without it the forward's all-reduces run again whole).")
    source: str = Field(description="Where the policy is and which op outputs it saves.")


class Autocast(BaseModel):
    """What changes where the runtime mixes precision under torch.autocast (fp32 parameters and residual stream,
    each matmul casting its operands) instead of casting the parameters (FSDP2's MixedPrecisionPolicy)."""

    model_config = _FIELD
    below_zero: int = Field(ge=0, le=4, description="ZeRO stages below this one run under torch.autocast.")
    weight_copy_bytes: float = Field(
        ge=0, description="Bytes per parameter of the 16-bit weight copies autocast caches for each matmul and "
        "autograd saves for its backward, per micro-batch in flight.")
    saved: dict[LayerKind, tuple[SavedTensor, ...]] = Field(
        description="Saved on top of the layer kind's `saved` list (casts autocast makes per op).")
    checkpointed: dict[LayerKind, tuple[SavedTensor, ...]] = Field(
        description="Replaces the layer kind's `checkpointed` list (the block's input is the fp32 residual).")
    source: str = Field(description="Where the saves were read and measured.")


class Activations(BaseModel):
    """What a runtime saves for backward per layer kind, tensor by tensor.  A profile without this section
    (every runtime but planner's) keeps the model graph's count: Korthikanti et al. 2022's 16-bit saves
    (models/graph.py `Layer.saved_activation_bytes`)."""

    model_config = _FIELD
    layers: dict[LayerKind, LayerSaves] = Field(
        description="Per layer kind; a kind not listed keeps the model graph's count.  The head lists its "
        "input only: the loss's logits are `RuntimeProfile.loss`'s.")
    compute_bytes: float = Field(
        2.0, gt=0, description="Bytes of a `compute` save: 2 for the bf16 mixed precision a plan runs in "
        "(tests/bench/memory_fidelity.py runs --precision fp32 and sets 4).")
    autocast: Autocast | None = Field(
        None, description="The saves under torch.autocast, where the runtime uses it (16-bit compute only).")
    source: str = Field(description="Where the saves were read and measured.")


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
    moe_zero_stages: tuple[int, ...] | None = Field(
        None, description="ZeRO stages it runs for a mixture-of-experts model (null: zero_stages): DeepSpeed's "
        "own MoE layer is refused under ZeRO-3.")
    moe_pipelined: bool = Field(True, description="Mixture-of-experts models with pp > 1.")
    shared_experts: bool = Field(True, description="Mixture-of-experts models with always-active shared experts.")
    expert_tensor_parallel: bool = Field(
        True, description="etp apart from tp (experts split over other ranks than the dense layers).")
    ep_overlap: bool = Field(True, description="ep_overlap (the expert all-to-alls hidden behind another "
                             "micro-batch's compute).")
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


class KnownGap(BaseModel):
    """A measured error of the cost model under a runtime that it does not model yet."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    summary: str = Field(max_length=80, description="What is off, in one short line (the estimate's text output).")
    detail: str = Field(description="The measurement behind it and its source (report.md, --json).")


class RuntimeProfile(BaseModel):
    """One framework as it runs a strategy."""

    model_config = _FIELD
    name: str = Field(description="Profile name (the data file's stem).")
    description: str = Field(description="What framework and release it describes.")
    version: str = Field(description="The release the profile was read from.")
    states: tuple[StateTerm, ...] = Field(min_length=1, description="Per-parameter states in HBM.")
    gathering: Gathering = Field(description="How sharded weights come back for compute.")
    overlap: Overlap = Field(description="Data-parallel overlap.")
    kernels: Kernels = Field(description="Kernel facts.")
    loss: Loss = Field(default_factory=Loss, description="What the loss holds per logit.")
    pipelining: Pipelining = Field(default_factory=Pipelining, description="What its pipeline schedule holds.")
    activations: Activations | None = Field(
        None, description="What the runtime saves for backward per layer kind; null: the model graph's "
        "Korthikanti count.")
    selective: SelectiveRecompute | None = Field(
        None, description="What its recompute=selective keeps and redoes; null: Megatron's selective recompute "
        "(the attention core, the model graph's saves without score tensors).")
    space: Space = Field(description="What it can express.")
    expert_capacity: ExpertCapacity | None = Field(
        None, description="How its MoE layer pads and drops tokens; null: dropless (every routed token is computed, "
        "the busiest rank waiting on the others: Megatron-Core's default, torch's grouped GEMMs).")
    known_gaps: tuple[KnownGap, ...] = Field(
        (), description="What a measurement showed the cost model gets wrong for this runtime and does not model "
        "yet, with the measurement; every estimate under it names them (planner.cost.confidence).")

    def state_bytes(self, kind: StateKind, params: float, zero: int, shard: int) -> float:
        """HBM bytes of every state term of `kind` for `params` parameters."""
        return sum(t.bytes(params, zero, shard) for t in self.states if t.kind == kind)

    def cannot_express(self, strategy: Strategy, model_has_experts: bool = False,
                       flash_attention: bool = True, split_blocks: tuple[int, ...] | None = None,
                       micro_batches: int | None = None, shared_experts: bool = False) -> list[str]:
        """Why this framework cannot run `strategy` (empty when it can).  `split_blocks`: the blocks per
        stage the strategy puts on each stage (its split, resolved); `micro_batches`: per replica, when known;
        `shared_experts`: the model's MoE layers have always-active experts."""
        s, sp = strategy, self.space
        out: list[str] = []
        refusal = self.model_refusal(int(model_has_experts), shared_experts)
        if refusal is not None:
            out.append(refusal)
        checks = [
            (s.tp > 1 and not sp.tensor_parallel, f"tensor parallelism (tp={s.tp})"),
            (s.cp > 1 and not sp.context_parallel, f"context parallelism (cp={s.cp})"),
            (s.cp > 1 and sp.context_parallel and sp.context_parallel_needs_flash and not flash_attention,
             "context parallelism without fused attention"),
            (s.ep > 1 and not sp.expert_parallel, f"expert parallelism (ep={s.ep})"),
            (s.expert_tp != s.tp and not (sp.expert_parallel and sp.expert_tensor_parallel),
             f"expert tensor parallelism (etp={s.etp}) apart from tp"),
            (s.ep_overlap and s.ep > 1 and not (sp.expert_parallel and sp.ep_overlap), "ep_overlap"),
            (s.pp == 1 and s.zero not in sp.zero_stages, f"zero={s.zero}"),
            (s.pp > 1 and s.zero not in sp.zero_stages_pipelined, f"zero={s.zero} with pipeline parallelism"),
            (s.zero > 0 and s.shard not in sp.shard_scopes, f"shard={s.shard}"),
            (s.per_stage_placement and not sp.per_stage_placement, "a different offload setting per stage"),
            (s.regather == "host" and not sp.host_regather, "regather=host (host-memory weight cache)"),
            (s.pp > 1 and s.pipeline_schedule not in sp.schedules, f"schedule={s.pipeline_schedule}"),
            (s.recompute == "selective" and not sp.selective_recompute, "recompute=selective"),
            (s.recompute_every is not None and not sp.recompute_every,
             f"recompute_every={s.recompute_every} (every k-th block)"),
            (s.tp_overlap and s.tp > 1 and not sp.tp_overlap, "tp_overlap"),
            (micro_batches is not None and s.pp > 1 and s.pipeline_schedule == "1f1b" and sp.one_f_one_b_needs_stages
             and micro_batches < s.pp, f"1F1B over {micro_batches} micro-batches on {s.pp} stages (needs >= pp)"),
        ]
        out += [what for bad, what in checks if bad]
        if model_has_experts and sp.moe:
            out += self._moe_refusals(s)
        if sp.recompute_layers != "per_stage" and not recompute_counts_allowed(s, split_blocks, sp.recompute_layers):
            what = "every block or none" if sp.recompute_layers == "all" else "one count for every stage"
            out.append(f"recompute_layers={'/'.join(map(str, s.recompute_layers or ()))} ({what})")
        for stage in range(s.pp):
            view = s.for_stage(stage)
            if view.offload not in sp.offloads:
                out.append(f"offload={view.offload}")
            elif view.offload != "none" and view.offload_device not in sp.offload_devices:
                out.append(f"offload_device={view.offload_device}")
            if view.offload_ratio < 1.0 and not sp.partial_offload:
                out.append(f"offload_ratio={view.offload_ratio:g}")
        if split_blocks is not None and len(split_blocks) > 1:
            middle = split_blocks[1:-1]
            if sp.split == "even" and len(set(split_blocks)) > 1:
                out.append(f"split={'/'.join(map(str, split_blocks))} (even splits only)")
            elif sp.split == "ends" and len(set(middle)) > 1:
                out.append(f"split={'/'.join(map(str, split_blocks))} (only the first and last stage may differ)")
            elif s.vpp > 1 and sp.split != "ends" and (len(set(split_blocks)) > 1 or split_blocks[0] % s.vpp):
                # Megatron lays out uneven chunks (planner.chunks); the looped schedules of torch need even ones
                out.append(f"split={'/'.join(map(str, split_blocks))} with vpp={s.vpp} (chunks must be even)")
        return list(dict.fromkeys(out))

    def model_refusal(self, num_experts: int, shared_experts: bool = False) -> str | None:
        """What this framework cannot run of a model whatever the strategy (None when it can run it): a
        mixture-of-experts model at all, or one with shared experts (DeepSpeed's MoE layer has none)."""
        if num_experts and not self.space.moe:
            return "mixture-of-experts models"
        if num_experts and shared_experts and not self.space.shared_experts:
            return "mixture-of-experts models with shared experts"
        return None

    def _moe_refusals(self, s: Strategy) -> list[str]:
        """What of a mixture-of-experts model's strategy this framework refuses (DeepSpeed's own MoE layer: no
        ZeRO-3, no pipeline)."""
        sp = self.space
        stages = sp.moe_zero_stages
        return [what for bad, what in (
            (stages is not None and s.zero not in stages, f"zero={s.zero} with mixture-of-experts layers"),
            (s.pp > 1 and not sp.moe_pipelined, "pipeline parallelism with mixture-of-experts layers"),
        ) if bad]


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


# a Job built directly (what planner costed before profiles); planner.load_job, estimate, compile and the command
# line use planner.DEFAULT_RUNTIME, which is CLI_RUNTIME
JOB_RUNTIME = "reference"
CLI_RUNTIME = "planner"


def _data_dir():
    return resources.files("hardware").joinpath("data", "runtimes")


def runtime_names() -> tuple[str, ...]:
    """Every built-in profile name, sorted."""
    return tuple(sorted(p.name.removesuffix(".yaml") for p in _data_dir().iterdir() if p.name.endswith(".yaml")))


def _merge(base: dict, override: dict) -> dict:
    """`override` on top of `base`, section by section (mappings merge, everything else replaces)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _raw(name: str, seen: tuple[str, ...] = ()) -> dict:
    if name not in runtime_names():
        raise PlannerInputError(f"--runtime: unknown runtime {name!r}; known: {', '.join(runtime_names())}")
    if name in seen:
        raise PlannerInputError(f"runtimes/{name}.yaml: extends: cycle {' -> '.join((*seen, name))}")
    data = yaml.safe_load(_data_dir().joinpath(f"{name}.yaml").read_text())
    parent = data.pop("extends", None)
    data["name"] = name
    return _merge(_raw(parent, (*seen, name)), data) if parent else data


@lru_cache(maxsize=None)
def load_runtime(name: str = JOB_RUNTIME) -> RuntimeProfile:
    """The built-in profile `name` (hardware/data/runtimes/<name>.yaml, with what it extends)."""
    try:
        return RuntimeProfile.model_validate(_raw(name))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PlannerInputError(f"runtimes/{name}.yaml: {where}: {first['msg']}") from None
