"""Per-rank, per-micro-batch totals of a set of layers: what a stage's cost is composed from.

A leaf of the cost model: memory (`stage_memory`) and stage time (`compose_stage`) both read it, so it
sits beneath both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageSums:
    """Per-rank, per-micro-batch totals of a set of layers (the fields marked max are maxima)."""

    forward: float = 0.0  # forward compute seconds
    compute: float = 0.0  # forward + backward compute seconds
    recompute: float = 0.0  # recomputed forward seconds
    tp: float = 0.0  # exposed tensor-parallel seconds
    cp: float = 0.0  # exposed context-parallel seconds
    ep: float = 0.0  # expert all-to-all seconds
    params: float = 0.0  # parameters held before ZeRO sharding
    expert_params: float = 0.0  # the routed experts' share of params (sharded over the expert data-parallel group)
    kept_activations: float = 0.0  # saved bytes per micro-batch in flight
    head_activations: float = 0.0  # the loss head's saved bytes per micro-batch (its own in-flight count)
    pipeline_outputs: float = 0.0  # bytes of one micro-batch's logits a pipeline schedule keeps for the step
    working_set: float = 0.0  # the loss's transient in its backward, on top of everything kept (max)
    recomputed_kept: float = 0.0  # saved bytes of the layers under full recompute: their blocks' checkpoints
    recompute_resaved: float = 0.0  # a recomputed block's checkpoint that its recompute saves again (max)
    recompute_attention: float = 0.0  # a recomputed block's first layer, re-materialised whole (max)
    recompute_ffn: float = 0.0  # the rest of a recomputed block (its MLP or MoE), re-materialised (max)
    block_transient: float = 0.0  # activation gradients a block layer's backward holds at once (max)
    # saved bytes of blocks that keep theirs yet run before the last recomputed block (every k-th block
    # recomputed; set by planner.cost.evaluate, 0 when recomputed blocks come first)
    kept_before_recompute: float = 0.0
    root_kept: float = 0.0  # saved bytes of the layers outside blocks but the head (the final norm)
    largest_layer_params: float = 0.0  # largest layer's parameters (max; FSDP gather unit)
    root_params: float = 0.0  # parameters of the layers outside blocks (embedding, final norm, head)
    embedding_params: float = 0.0  # the embedding's parameters (the root unit's last gradient)
    largest_attention_params: float = 0.0  # a block's attention (max): with the next field, one block's parameters
    largest_ffn_params: float = 0.0  # a block's MLP or MoE (max)
    max_hidden: float = 0.0  # widest boundary activation (max)
    layers: int = 0
    gather_calls: float = 0.0  # all-gather collectives of one gather of these layers' sharded weights
    reduce_calls: float = 0.0  # gradient reduce-scatter collectives of these layers
    regather_params: float = 0.0  # parameters gathered once more for a recomputed forward (module hooks)
    regather_calls: float = 0.0  # the collectives of that extra gather

    def __add__(self, other: "StageSums") -> "StageSums":
        return StageSums(
            forward=self.forward + other.forward, compute=self.compute + other.compute,
            recompute=self.recompute + other.recompute, tp=self.tp + other.tp, cp=self.cp + other.cp,
            ep=self.ep + other.ep, params=self.params + other.params,
            expert_params=self.expert_params + other.expert_params,
            kept_activations=self.kept_activations + other.kept_activations,
            head_activations=self.head_activations + other.head_activations,
            pipeline_outputs=self.pipeline_outputs + other.pipeline_outputs,
            working_set=max(self.working_set, other.working_set),
            recomputed_kept=self.recomputed_kept + other.recomputed_kept,
            recompute_resaved=max(self.recompute_resaved, other.recompute_resaved),
            recompute_attention=max(self.recompute_attention, other.recompute_attention),
            recompute_ffn=max(self.recompute_ffn, other.recompute_ffn),
            block_transient=max(self.block_transient, other.block_transient),
            kept_before_recompute=self.kept_before_recompute + other.kept_before_recompute,
            root_kept=self.root_kept + other.root_kept,
            largest_layer_params=max(self.largest_layer_params, other.largest_layer_params),
            root_params=self.root_params + other.root_params,
            embedding_params=self.embedding_params + other.embedding_params,
            largest_attention_params=max(self.largest_attention_params, other.largest_attention_params),
            largest_ffn_params=max(self.largest_ffn_params, other.largest_ffn_params),
            max_hidden=max(self.max_hidden, other.max_hidden), layers=self.layers + other.layers,
            gather_calls=self.gather_calls + other.gather_calls, reduce_calls=self.reduce_calls + other.reduce_calls,
            regather_params=self.regather_params + other.regather_params,
            regather_calls=self.regather_calls + other.regather_calls,
        )

    def times(self, count: int) -> "StageSums":
        """`count` copies of these layers (maxima stay, sums scale)."""
        if count <= 0:
            return StageSums()
        return StageSums(
            forward=self.forward * count, compute=self.compute * count, recompute=self.recompute * count,
            tp=self.tp * count, cp=self.cp * count, ep=self.ep * count, params=self.params * count,
            expert_params=self.expert_params * count,
            kept_activations=self.kept_activations * count, head_activations=self.head_activations * count,
            pipeline_outputs=self.pipeline_outputs * count, working_set=self.working_set,
            recomputed_kept=self.recomputed_kept * count, recompute_resaved=self.recompute_resaved,
            recompute_attention=self.recompute_attention, recompute_ffn=self.recompute_ffn,
            block_transient=self.block_transient, kept_before_recompute=self.kept_before_recompute * count,
            root_kept=self.root_kept * count,
            largest_layer_params=self.largest_layer_params, root_params=self.root_params * count,
            embedding_params=self.embedding_params * count, largest_attention_params=self.largest_attention_params,
            largest_ffn_params=self.largest_ffn_params, max_hidden=self.max_hidden, layers=self.layers * count,
            gather_calls=self.gather_calls * count, reduce_calls=self.reduce_calls * count,
            regather_params=self.regather_params * count, regather_calls=self.regather_calls * count,
        )

    @property
    def largest_block_params(self) -> float:
        """Parameters of the largest block: its attention and its MLP (or MoE)."""
        return self.largest_attention_params + self.largest_ffn_params

    @property
    def backward_extra(self) -> float:
        """Bytes one micro-batch's backward holds at its peak beyond what its forward kept: the loss's transient,
        with everything kept, or the last block's backward: its activation gradients on top of the blocks'
        saves (the loss's and the final norm's freed) or of a recomputed block (`recompute_extra`)."""
        kept = self.kept_activations + self.head_activations
        blocks = -self.root_kept - self.head_activations
        if self.recompute_attention + self.recompute_ffn:
            blocks = max(blocks, self.recompute_peak - kept)
        return max(self.working_set, self.recompute_extra, blocks + self.block_transient)

    @property
    def recompute_extra(self) -> float:
        """Saved bytes a micro-batch's backward holds beyond what its forward kept while it recomputes (0 without).

        Recomputation runs a whole
        block (attention and MLP) when its backward starts (torch.utils.checkpoint, Megatron's and DeepSpeed's
        per-layer checkpointing alike), after the loss, the final norm and every later block of the micro-batch
        freed theirs.  The last recomputed block (recomputed blocks come first in a stage) then holds the
        earlier blocks' checkpoints and its own re-materialised saves (its checkpoint once where the recompute
        saves that very storage again).  The embedding before the blocks keeps only the token ids.
        Measured: tests/bench/memory_fidelity.py (the recompute=full plans' saved-for-backward peak)."""
        if not self.recompute_attention + self.recompute_ffn:
            return 0.0
        return max(0.0, self.recompute_peak - self.kept_activations - self.head_activations)

    @property
    def recompute_peak(self) -> float:
        """Saved bytes of one micro-batch while its last recomputed block is re-materialised."""
        return (self.recomputed_kept - self.recompute_resaved + self.recompute_attention + self.recompute_ffn
                + self.kept_before_recompute)
