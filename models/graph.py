"""Model graph IR: an ordered list of layers with their sizes and costs.

Every layer carries the coefficients the cost model needs, so the planner never
looks inside a builder:

* parameters (total, and active per token for MoE);
* forward FLOPs per token: a sequence-independent part (2 FLOP per multiply-
  accumulate of every matmul) and an attention part linear in the sequence
  length (QK^T and AV: 4*s*h per token for full, non-causal-skipping kernels);
* saved-activation bytes per token at 16-bit, split into the part tensor
  parallelism replicates (layer-norm inputs, dropout masks, linear inputs),
  the part it splits, and the attention-score part (b*a*s^2) that flash
  attention and selective recompute remove.  This is the decomposition of
  Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.1): per transformer layer
  sbh(10 + 24/t) + 5abs^2/t, generalised to GQA and gated MLPs by the builders.

Units are SI: bytes, FLOP, counts.  Nothing here knows about hardware.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from models.yamlio import name_problem

if TYPE_CHECKING:  # networkx costs a sixth of a second to import; only to_networkx needs it
    import networkx as nx


class LayerKind(StrEnum):
    """What a layer is; the cost model derives its communication from this."""

    EMBEDDING = "embedding"  # token (and position) embedding, vocab-parallel under TP
    ATTENTION = "attention"  # pre-norm + self-attention block (column then row parallel)
    MLP = "mlp"  # pre-norm + feed-forward block (column then row parallel)
    MOE = "moe"  # pre-norm + router + experts (expert parallel)
    NORM = "norm"  # a stand-alone normalisation (final norm)
    HEAD = "head"  # output projection + loss, vocab-parallel under TP
    DENSE = "dense"  # a generic fully connected layer (MLPs of non-transformer models)
    EMBEDDING_BAG = "embedding_bag"  # a pooled lookup table of a recommendation model
    INTERACTION = "interaction"  # feature interaction of a recommendation model


RecomputeMode = Literal["none", "selective", "full"]

# Upper bounds on the sizes a user writes (spec files, config.json).  Generous (hidden 2**20 is 64x
# llama3-405b's), yet they keep every parameter, FLOP and byte count a finite float.  Strict: true, 4.0
# and "4" are refused, not read as 1 and 4.
MAX_WIDTH = 2**20  # hidden, ffn, head widths, heads, experts, MLP widths, embedding dims
MAX_VOCAB = 2**31  # vocabulary, context length, token types
MAX_LAYERS = 100_000  # transformer blocks
MAX_ROWS = 2**40  # rows of one recommendation table
MAX_PARAMS = 2**53  # parameters of one layer (exact as a float; 5000x llama3-405b)
Width = Annotated[int, Field(strict=True, le=MAX_WIDTH)]
VocabSize = Annotated[int, Field(strict=True, le=MAX_VOCAB)]
LayerCount = Annotated[int, Field(strict=True, le=MAX_LAYERS)]
RowCount = Annotated[int, Field(strict=True, le=MAX_ROWS)]
ParamCount = Annotated[int, Field(strict=True, le=MAX_PARAMS)]

_FIELD = ConfigDict(extra="forbid", frozen=True)


def _name(value: str) -> str:
    problem = name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# a model's name: it reaches plan.json, reports, job names and launch-file comments (models/yamlio.py)
ModelName = Annotated[str, AfterValidator(_name)]


class AttentionShape(BaseModel):
    """Head structure of an attention layer (MHA: kv_heads == heads; MQA: 1)."""

    model_config = _FIELD
    heads: Width = Field(gt=0, description="Number of query heads.")
    kv_heads: Width = Field(gt=0, description="Number of key/value heads (GQA groups).")
    head_dim: Width = Field(gt=0, description="Width of one head.")
    causal: bool = Field(True, description="Decoder (causal) or encoder (bidirectional) attention.")

    @model_validator(mode="after")
    def _kv_divides(self) -> "AttentionShape":
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self


class MoEShape(BaseModel):
    """Mixture-of-experts structure of a MoE layer."""

    model_config = _FIELD
    num_experts: Width = Field(gt=0, description="Routed experts.")
    top_k: Width = Field(gt=0, description="Routed experts each token visits.")
    shared_experts: Width = Field(0, ge=0, description="Always-active experts (DeepSeek style).")
    expert_ffn: Width = Field(gt=0, description="Hidden width of one expert's feed-forward.")
    router_groups: Width = Field(1, gt=0, description="Expert groups of group-limited routing (1: no limit).")
    router_group_topk: Width = Field(1, gt=0, description="Groups a token's top_k experts may come from.")

    @model_validator(mode="after")
    def _k_le_e(self) -> "MoEShape":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        check_router_groups(self.num_experts, self.top_k, self.router_groups, self.router_group_topk)
        return self


def check_router_groups(experts: int, top_k: int, groups: int, group_topk: int) -> None:
    """Megatron-Core's group-limited routing checks (moe/router.py group_limited_topk): the groups split the
    experts evenly, at most all of them are chosen, and the chosen groups hold at least top_k experts."""
    if experts % groups:
        raise ValueError(f"router_groups ({groups}) must divide num_experts ({experts})")
    if group_topk > groups:
        raise ValueError(f"router_group_topk ({group_topk}) exceeds router_groups ({groups})")
    if group_topk * experts // groups < top_k:
        raise ValueError(f"router_group_topk ({group_topk}) groups of {experts // groups} experts hold fewer "
                         f"than top_k ({top_k})")


class EmbeddingTable(BaseModel):
    """One categorical feature table of a recommendation model."""

    model_config = _FIELD
    rows: RowCount = Field(gt=0, description="Number of rows (distinct categories).")
    dim: Width = Field(gt=0, description="Embedding width.")
    pooling_factor: float = Field(
        1.0, gt=0, le=MAX_WIDTH, description="Mean lookups per sample (multi-hot size)."
    )
    zipf_alpha: float = Field(1.05, ge=0, description="Access skew: row r is read with probability ~ r^-alpha.")
    access_histogram: list[float] | None = Field(
        None, min_length=1,
        description="Measured access counts of equal-size row buckets (any order; caching keeps the hottest); "
        "overrides zipf_alpha for the hit rate of an HBM cache.",
    )
    bytes_per_element: Annotated[int, Field(strict=True, le=64)] = Field(
        4, gt=0, description="Storage bytes per element (fp32 tables: 4)."
    )


    @model_validator(mode="after")
    def _histogram(self) -> "EmbeddingTable":
        if self.access_histogram is not None and (min(self.access_histogram) < 0 or sum(self.access_histogram) <= 0):
            raise ValueError("access_histogram needs non-negative counts with a positive sum")
        return self


class Layer(BaseModel):
    """One node of the model graph with everything the cost model reads."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = Field(description="Unique layer name, e.g. 'block.3.attention'.")
    kind: LayerKind = Field(description="Layer kind; decides communication and sharding rules.")
    block: LayerCount | None = Field(
        None, description="Transformer block index; pipeline stages cut only between blocks."
    )
    params: ParamCount = Field(ge=0, description="Parameter count (all experts included).")
    active_params: ParamCount | None = Field(
        None, ge=0, description="Parameters touched per token (MoE); defaults to params."
    )
    tp_replicated_params: ParamCount = Field(
        0, ge=0,
        description="Parameters every tensor-parallel rank keeps whole (norm weights, row-parallel biases, "
        "position tables, MoE routers); the rest of a tp_splittable layer is split.",
    )
    tied_params: ParamCount = Field(
        0, ge=0,
        description="Parameters counted in another layer but held again here when the two sit on "
        "different pipeline stages (a head tied to the input embedding).",
    )
    hidden: Width = Field(gt=0, description="Width of the activation this layer outputs per token.")
    flops_per_token: float = Field(
        ge=0, description="Forward FLOPs per token that do not depend on the sequence length."
    )
    flops_per_token_per_seq: float = Field(
        0.0, ge=0, description="Forward attention FLOPs per token per token of context (x s)."
    )
    act_replicated: float = Field(
        0.0, ge=0, description="Saved bytes per token that tensor parallelism replicates (SP splits them)."
    )
    act_tp_split: float = Field(0.0, ge=0, description="Saved bytes per token that tensor parallelism splits.")
    act_fp8_replicated: float = Field(
        0.0, description="Change of act_replicated, bytes per token, under a runtime that keeps GEMM inputs in FP8 "
        "in FP8 runs (Kernels.fp8_saved_inputs): the norms' outputs the QKV and fc1 GEMMs keep, 2 bytes -> 1.")
    act_fp8_split: float = Field(
        0.0, description="Change of act_tp_split, bytes per token, under such a runtime: the fc2 input, 2 bytes -> 1, "
        "and the attention projection's FP8 copy of its input beside the core's 16-bit output, +1.")
    act_attn_scores: float = Field(
        0.0, ge=0,
        description="Saved bytes per token per token of context for softmax/dropout of attention "
        "scores (5*a per token in Korthikanti's count); zero under flash attention.",
    )
    tp_splittable: bool = Field(
        False, description="Tensor parallelism may split this layer's weights (heads, ffn or vocab)."
    )
    attention: AttentionShape | None = Field(None, description="Head structure (attention layers).")
    moe: MoEShape | None = Field(None, description="Expert structure (MoE layers).")
    table: EmbeddingTable | None = Field(None, description="Table (embedding_bag layers).")

    @property
    def touched_params(self) -> int:
        """Parameters whose weights each token's computation reads."""
        return self.params if self.active_params is None else self.active_params

    @property
    def moe_shape(self) -> MoEShape:
        """The expert structure of a mixture-of-experts layer; ValueError for any other layer (code that reads
        it has chosen MoE layers)."""
        if self.moe is None:
            raise ValueError(f"{self.name}: not a mixture-of-experts layer")
        return self.moe

    @property
    def attention_shape(self) -> AttentionShape:
        """The head structure of an attention layer; ValueError for any other layer."""
        if self.attention is None:
            raise ValueError(f"{self.name}: not an attention layer")
        return self.attention

    @property
    def routed_params(self) -> float:
        """Parameters of the routed experts (MoE layers; 0 otherwise): all experts but the top_k a token
        visits are untouched, so one expert holds (params - touched) / (num_experts - top_k)."""
        if self.kind != LayerKind.MOE or self.moe is None:
            return 0.0
        per_expert = (self.params - self.touched_params) / max(1, self.moe.num_experts - self.moe.top_k)
        return per_expert * self.moe.num_experts

    def forward_flops(self, micro_batch: int, seq_len: float) -> float:
        """Forward FLOPs for one micro-batch of `micro_batch` sequences of `seq_len` tokens."""
        tokens = micro_batch * seq_len
        return tokens * (self.flops_per_token + self.flops_per_token_per_seq * seq_len)

    def saved_activation_bytes(
        self,
        micro_batch: int,
        seq_len: int,
        *,
        tp: int = 1,
        sequence_parallel: bool = False,
        recompute: RecomputeMode = "none",
        flash_attention: bool = True,
        fp8_inputs: bool = False,
    ) -> float:
        """Bytes this layer keeps for backward for one micro-batch on one TP rank.

        Korthikanti et al. 2022, eq. 1-6: replicated parts are split only by
        sequence parallelism; selective recompute and flash attention drop the
        s^2 score term; full recompute keeps only the layer input (2 bytes per
        element, split by SP).  `fp8_inputs`: the GEMM inputs are kept in FP8
        (act_fp8_replicated, act_fp8_split).
        """
        tokens = micro_batch * seq_len
        if recompute == "full":
            # a recomputed block keeps only its input: the attention (or MoE/MLP
            # block entry) layer holds it, the rest of the block holds nothing
            if self.kind not in (LayerKind.ATTENTION, LayerKind.EMBEDDING_BAG, LayerKind.DENSE):
                return 0.0
            input_bytes = 2.0 * self.hidden
            return tokens * input_bytes / (tp if sequence_parallel else 1)
        replicated = (self.act_replicated + (self.act_fp8_replicated if fp8_inputs else 0.0)) / (
            tp if sequence_parallel else 1)
        split = (self.act_tp_split + (self.act_fp8_split if fp8_inputs else 0.0)) / tp
        scores = 0.0
        if not flash_attention and recompute == "none":
            scores = self.act_attn_scores * seq_len / tp
        return tokens * (replicated + split + scores)

    def boundary_bytes(self, micro_batch: int, seq_len: int, bytes_per_element: int = 2) -> float:
        """Bytes of this layer's output activation (what a pipeline boundary sends)."""
        return float(micro_batch * seq_len * self.hidden * bytes_per_element)


class ModelGraph(BaseModel):
    """A model: an ordered list of layers plus the sizes users recognise it by."""

    model_config = _FIELD
    name: ModelName = Field(description="Model name (letters, digits and ._+:-/).")
    family: Literal["decoder", "encoder", "recsys", "generic"] = Field(description="Model family.")
    layers: list[Layer] = Field(min_length=1, description="Layers in execution order.")
    hidden: Width = Field(gt=0, description="Model width (d_model, or the dense width for recsys).")
    num_blocks: LayerCount = Field(ge=0, description="Transformer blocks (0 for non-transformer models).")
    heads: Width = Field(1, gt=0, description="Attention heads (1 when there is no attention).")
    kv_heads: Width = Field(1, gt=0, description="Key/value heads.")
    vocab: VocabSize = Field(0, ge=0, description="Vocabulary size (0 when there is none).")
    num_experts: Width = Field(0, ge=0, description="Routed experts per MoE layer (0 for dense models).")
    source: str = Field("", description="Where the sizes come from (paper, model card, config).")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base from the source config (None: not "
                                     "recorded); launch files carry it, nothing is sized by it.")
    norm_eps: float | None = Field(None, gt=0, description="Normalization epsilon from the source config (None: not "
                                   "recorded); launch files carry it, nothing is sized by it.")
    edges: list[tuple[str, str]] = Field(
        default_factory=list,
        description="Extra data-flow edges for graphs that are not chains (e.g. DLRM tables -> "
        "interaction); the implicit chain of `layers` is always present.",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> "ModelGraph":
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"layer names must be unique; repeated: {', '.join(dup)}")
        known = set(names)
        for src, dst in self.edges:
            if src not in known or dst not in known:
                raise ValueError(f"edge ({src}, {dst}) names an unknown layer")
        return self

    @property
    def params(self) -> int:
        """Total parameter count."""
        return sum(layer.params for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Parameters touched per token (differs from params for MoE)."""
        return sum(layer.touched_params for layer in self.layers)

    def forward_flops(self, micro_batch: int, seq_len: float) -> float:
        """Forward FLOPs of the whole model for one micro-batch."""
        return sum(layer.forward_flops(micro_batch, seq_len) for layer in self.layers)

    def model_flops_per_token(self, seq_len: float) -> float:
        """Training FLOPs per token (forward + 2x backward), no recompute: ~6N + attention."""
        return 3.0 * self.forward_flops(1, seq_len) / seq_len

    def blocks(self) -> dict[int, list[Layer]]:
        """Layers grouped by transformer block index."""
        grouped: dict[int, list[Layer]] = {}
        for layer in self.layers:
            if layer.block is not None:
                grouped.setdefault(layer.block, []).append(layer)
        return grouped

    def to_networkx(self) -> nx.DiGraph:
        """A directed graph view: the execution chain plus any extra edges."""
        import networkx as nx

        graph: nx.DiGraph[str] = nx.DiGraph()
        for layer in self.layers:
            graph.add_node(layer.name, kind=str(layer.kind), params=layer.params)
        for prev, nxt in zip(self.layers, self.layers[1:]):
            if not any(src == prev.name for src, _ in self.edges):
                graph.add_edge(prev.name, nxt.name)
        graph.add_edges_from(self.edges)
        return graph
