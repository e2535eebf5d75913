"""The sections of a runtime profile that say what a strategy holds in HBM and how long its kernels take:
per-parameter states, the gathering of sharded weights, data-parallel overlap, kernel facts, the loss's
and the saved activations' bytes (planner.profile.RuntimeProfile reads them; docs/cost-model.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from models.graph import LayerKind

_FIELD = ConfigDict(extra="forbid", frozen=True)
StateKind = Literal["weights", "grads", "optimizer"]
# what stays gathered of ZeRO-3/FSDP-sharded weights: the running and prefetched layer (re-gathered for
# backward), a micro-batch's worth (gathered in forward, kept through its backward), or the whole stage
# for the step (gathered once, gradients accumulated unsharded and reduce-scattered once)
Gather = Literal["layers", "microbatch", "step"]

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
    tp_hidden: float | None = Field(
        None, ge=0, le=1, description="Fraction of the tensor-parallel communication hidden behind the GEMMs when "
        "tp_overlap is on (torchtitan's AsyncTP, Megatron --tp-comm-overlap), as the framework's own A/B "
        "measurements imply it (tests/bench/terms/async_tp.py); null: constants.yaml tp_overlap_hidden_fraction.")
    source: str = Field(description="Where the framework does it.")


class Kernels(BaseModel):
    """Kernel facts that change time and activation memory."""

    model_config = _FIELD
    flash_attention: bool = Field(description="Fused flash attention (no s^2 score tensors).")
    attention_kernel: Literal["flash2", "flash3", "cudnn", "flash_triton"] = Field(
        "flash2", description="The flash-attention kernel it runs where the device has it "
        "(hardware/data/attention.yaml): flash2 (FlashAttention-2, PyTorch's scaled_dot_product_attention in its "
        "default order), flash3, cudnn (cuDNN's fused attention: Transformer Engine on Hopper and Blackwell, "
        "torchtitan 0.2's sdpa_kernel priority), flash_triton (flash-attn's Triton FlashAttention, Megatron-DeepSpeed "
        "--use-flash-attn-triton).")
    grouped_gemm: Literal["torch_grouped_mm", "te_grouped_linear", "per_expert"] = Field(
        "per_expert", description="The kernel the routed experts' GEMMs run as (hardware/data/grouped_gemm.yaml): "
        "torch_grouped_mm (torch._grouped_mm, torchtitan's GroupedExperts), te_grouped_linear (Transformer Engine's "
        "GroupedLinear, Megatron-Core --moe-grouped-gemm), per_expert (one GEMM per expert: DeepSpeed-MoE).")
    fused_elementwise: bool = Field(description="Element-wise work in fused kernels (Transformer Engine, apex "
                                    "fusions or torch.compile); False: eager PyTorch kernels.")
    autocast_weight_copy_bytes: float = Field(
        0.0, ge=0, description="Bytes per parameter of the 16-bit copies native AMP (torch.autocast) casts from "
        "fp32 weights for each matmul and autograd saves for its backward, per micro-batch in flight; 0 where the "
        "weights are already held in the compute dtype (FSDP's gathered copies, Megatron's 16-bit weights).")
    fp8_gemm_speedup: float | None = Field(
        None, ge=1.0, description="Realised FP8 over BF16 GEMM speedup of the framework's FP8 recipe (casts and "
        "scaling included); null: constants.yaml's fp8_gemm_speedup_cap.")
    fp8_weight_copy_bytes: float = Field(
        0.0, ge=0, description="Bytes per parameter of the FP8 weight copies the framework keeps between micro-batches "
        "in FP8 runs whose parameters are 16-bit (Transformer Engine's is_first_microbatch workspace: data and "
        "transpose, 2; per-tensor FP8 on a device with DeviceSpec.fp8_gemm_any_layout keeps the data only); none "
        "with FP8 parameters (Job.fp8_params), which are those copies.")
    fp8_saved_inputs: bool = Field(
        False, description="In FP8 runs the framework keeps its GEMMs' inputs for the weight gradients as FP8 "
        "(1 byte; Transformer Engine's Linear and LayerNormLinear), and the attention projection an FP8 copy beside "
        "the core's 16-bit output (delayed scaling): Layer.act_fp8_replicated / act_fp8_split.")
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
    chunks: int = Field(
        1, ge=1, description="The output projection and the loss run over a micro-batch's tokens in this many "
        "chunks, each chunk's forward and backward done before the decoder's backward (torchtitan's ChunkedCELoss, "
        "num_chunks): no logits are kept, one chunk's are alive at the peak (the hidden-width chunk copies and "
        "fp32 gradient buffer are not counted); 1: unchunked.")
    chunk_tokens: int | None = Field(
        None, gt=0, description="As chunks, in chunks of at most this many tokens (torchtitan's ChunkedLossWrapper "
        "chunk_len); null: `chunks` decides.")
    source: str = Field(
        "Megatron-LM megatron/training/theoretical_memory_usage.py: the output layer's fp32 logits, 4sbv/t; "
        "megatron/core/tensor_parallel/cross_entropy.py computes softmax and its gradient in place on them",
        description="Where the framework computes its loss and what was measured.")

    def bytes(self, tp: int, tokens: float) -> LossBytes:
        """The loss's bytes per logit at tensor-parallel degree `tp` over a micro-batch of `tokens` tokens on one
        rank: a chunked loss keeps none and is alive for one chunk's share at its peak."""
        unchunked = self.vocab_parallel if tp > 1 and self.vocab_parallel is not None else self.whole_vocab
        alive = min(1.0, self.chunk_tokens / tokens) if self.chunk_tokens else 1.0 / self.chunks
        if alive >= 1.0:
            return unchunked
        return LossBytes(saved=0.0, peak=unchunked.peak * alive)


# what one saved tensor's size per token is a multiple of (planner.cost.memory.layer_width reads it off a layer)
SaveWidth = Literal["one", "hidden", "gated_ffn", "heads", "head_dim", "q_width", "kv_width", "seq_len", "experts",
                    "routed", "routed_hidden", "routed_expert_ffn", "shared_ffn"]


class SavedTensor(BaseModel):
    """One tensor a layer's forward saves for its backward, per token (or per local sequence row) of a
    micro-batch: `elements` x the layer's `width`, in `dtype`, divided as the strategy splits it."""

    model_config = _FIELD
    name: str = Field(description="What it is and which op saves it.")
    elements: float = Field(gt=0, description="Elements per token (or row) as a multiple of `width`.")
    width: SaveWidth = Field(
        description="one; hidden; gated_ffn (the feed-forward width of a gated, bias-free MLP: its matmul "
        "parameters over 3 x hidden); heads, head_dim, q_width (heads x head_dim), kv_width (kv_heads x head_dim) "
        "of the attention; seq_len (the whole sequence: a row of a mask); of a MoE layer: experts (the router's "
        "scores), routed (top_k: one per routed token), routed_hidden (top_k x hidden), routed_expert_ffn (top_k x "
        "one expert's width), shared_ffn (the shared experts' width).")
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
