"""Per-rank, per-micro-batch totals of a set of layers: what a stage's cost is composed from.

A leaf of the cost model: memory (`stage_memory`) and stage time (`compose_stage`) both read it, so it
sits beneath both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal

Role = Literal["sum", "max"]
# A field's role says how the totals of two sets of layers combine: a sum adds (and scales with a count of
# copies), a max takes the larger (and stays under copies): the transients and the largest units.
SUM = {"role": "sum"}
MAX = {"role": "max"}


@dataclass(frozen=True)
class StageSums:
    """Per-rank, per-micro-batch totals of a set of layers; each field's metadata declares its role (SUM or MAX),
    from which `+` and `times` are derived."""

    forward: float = field(default=0.0, metadata=SUM)  # forward compute seconds
    compute: float = field(default=0.0, metadata=SUM)  # forward + backward compute seconds
    recompute: float = field(default=0.0, metadata=SUM)  # recomputed forward seconds
    weight_grad: float = field(default=0.0, metadata=SUM)  # of `compute`, the weight-gradient GEMMs' seconds
    tp: float = field(default=0.0, metadata=SUM)  # exposed tensor-parallel seconds
    cp: float = field(default=0.0, metadata=SUM)  # exposed context-parallel seconds
    ep: float = field(default=0.0, metadata=SUM)  # expert all-to-all seconds
    params: float = field(default=0.0, metadata=SUM)  # parameters held before ZeRO sharding
    # the routed experts' share of params (sharded over the expert data-parallel group)
    expert_params: float = field(default=0.0, metadata=SUM)
    # parameters in slots of replicated experts (gradients all-reduced among replicas)
    replica_params: float = field(default=0.0, metadata=SUM)
    kept_activations: float = field(default=0.0, metadata=SUM)  # saved bytes per micro-batch in flight
    # the loss head's saved bytes per micro-batch (its own in-flight count)
    head_activations: float = field(default=0.0, metadata=SUM)
    # bytes of one micro-batch's logits a pipeline schedule keeps for the step
    pipeline_outputs: float = field(default=0.0, metadata=SUM)
    working_set: float = field(default=0.0, metadata=MAX)  # the loss's transient in its backward, on top of all kept
    # saved bytes of the layers under full recompute: their blocks' checkpoints
    recomputed_kept: float = field(default=0.0, metadata=SUM)
    # a recomputed block's checkpoint that its recompute saves again
    recompute_resaved: float = field(default=0.0, metadata=MAX)
    recompute_attention: float = field(default=0.0, metadata=MAX)  # a recomputed block's first layer, whole
    recompute_ffn: float = field(default=0.0, metadata=MAX)  # the rest of a recomputed block (its MLP or MoE)
    block_transient: float = field(default=0.0, metadata=MAX)  # activation gradients a block layer's backward holds
    # saved bytes of blocks that keep theirs yet run before the last recomputed block (every k-th block
    # recomputed; set by planner.cost.evaluate, 0 when recomputed blocks come first)
    kept_before_recompute: float = field(default=0.0, metadata=SUM)
    root_kept: float = field(default=0.0, metadata=SUM)  # saved bytes of the layers outside blocks but the head
    largest_layer_params: float = field(default=0.0, metadata=MAX)  # largest layer's parameters (FSDP gather unit)
    # parameters of the layers outside blocks (embedding, final norm, head)
    root_params: float = field(default=0.0, metadata=SUM)
    embedding_params: float = field(default=0.0, metadata=SUM)  # the embedding's (the root unit's last gradient)
    # a block's attention: with the next field, one block's parameters
    largest_attention_params: float = field(default=0.0, metadata=MAX)
    largest_ffn_params: float = field(default=0.0, metadata=MAX)  # a block's MLP or MoE
    max_hidden: float = field(default=0.0, metadata=MAX)  # widest boundary activation
    layers: int = field(default=0, metadata=SUM)
    # all-gather collectives of one gather of these layers' sharded weights
    gather_calls: float = field(default=0.0, metadata=SUM)
    reduce_calls: float = field(default=0.0, metadata=SUM)  # gradient reduce-scatter collectives of these layers
    # parameters gathered once more for a recomputed forward (module hooks)
    regather_params: float = field(default=0.0, metadata=SUM)
    regather_calls: float = field(default=0.0, metadata=SUM)  # the collectives of that extra gather

    def __add__(self, other: "StageSums") -> "StageSums":
        """Both sets of layers: sums add, maxima take the larger."""
        return _add(self, other)

    def times(self, count: int) -> "StageSums":
        """`count` copies of these layers (maxima stay, sums scale)."""
        if count <= 0:
            return StageSums()
        return _times(self, count)

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
        """Saved bytes of one micro-batch while its last recomputed block is re-materialised: with every k-th block
        recomputed, the blocks before it that kept their saves still hold them."""
        return (self.recomputed_kept - self.recompute_resaved + self.recompute_attention + self.recompute_ffn
                + self.kept_before_recompute)


def roles() -> dict[str, Role]:
    """Each StageSums field's declared role, in field order (TypeError for a field that declares none)."""
    out: dict[str, Role] = {}
    for f in fields(StageSums):
        role = f.metadata.get("role")
        if role not in ("sum", "max"):
            raise TypeError(f"StageSums.{f.name}: declare its role (metadata=SUM or MAX), not {role!r}")
        out[f.name] = role
    return out


def _derive(name: str, params: str, value: Callable[[str, Role], str]) -> Callable[..., StageSums]:
    """A function of `params` returning the StageSums whose field f is the expression value(f, role), one per
    declared field.  Generated once from the declarations, as dataclasses generates __init__: the search adds
    and scales stage sums millions of times, and a loop over 32 fields per call was a tenth of its time.  The
    instance takes its field dict in one step (a frozen dataclass' __init__ sets each field through
    object.__setattr__)."""
    items = ", ".join(f"{name!r}: {value(name, role)}" for name, role in roles().items())
    source = f"def {name}({params}):\n    out = _new(_cls)\n    _set(out, '__dict__', {{{items}}})\n    return out\n"
    namespace: dict[str, Any] = {}
    exec(source, {"_new": object.__new__, "_set": object.__setattr__, "_cls": StageSums}, namespace)
    return namespace[name]


# a sum adds; a max keeps the first unless the second is larger (what builtins.max does, NaN included); each
# field keeps its own type (int for layers: sums and maxima of ints stay ints)
_add = _derive("_add", "a, b",
               lambda f, role: f"a.{f} + b.{f}" if role == "sum" else f"b.{f} if b.{f} > a.{f} else a.{f}")
_times = _derive("_times", "a, count", lambda f, role: f"a.{f} * count" if role == "sum" else f"a.{f}")
