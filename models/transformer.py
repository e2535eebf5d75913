"""Transformer builder: one documented config, one function that lays out the IR.

`build_transformer(cfg)` turns a `TransformerConfig` into a `ModelGraph` whose
layers follow the naming the cost model relies on::

    embedding, block.{i}.attention, block.{i}.mlp | block.{i}.moe, ..., final_norm, head

Counting rules (see models/graph.py for what each coefficient means):

* params are exact: every matmul weight, bias and norm weight (RMSNorm h,
  LayerNorm 2h).  Each attention / mlp / moe layer owns its own norm.
* flops_per_token = 2 x (matmul weights a token multiplies through); MoE counts
  only the top_k routed + shared experts and the router.
* flops_per_token_per_seq = 4 x heads x head_dim (QK^T and AV, no causal halving).
* activation bytes per token at 16 bit follow Korthikanti et al. 2022
  (arXiv 2205.05198, Sec. 4.1), generalised to GQA, gated MLPs, MoE and MLA.

Named variants (`gpt`, `llama`, `bert`) are the same config with family
defaults, so a zoo entry is a family plus sizes (STYLE.md, torchtitan).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.graph import (AttentionShape, Layer, LayerCount, LayerKind, ModelGraph, ModelName, MoEShape, VocabSize,
                          Width, check_router_groups)

_CONFIG = ConfigDict(extra="forbid")
GATED = ("swiglu", "geglu")


class MoEConfig(BaseModel):
    """Mixture-of-experts feed-forward (Mixtral, DeepSeek)."""

    model_config = _CONFIG
    num_experts: Width = Field(gt=0, description="Routed experts per MoE block.")
    top_k: Width = Field(gt=0, description="Routed experts each token visits.")
    expert_ffn: Width = Field(gt=0, description="Hidden width of one expert's feed-forward.")
    shared_experts: Width = Field(0, ge=0, description="Always-active experts of width expert_ffn (DeepSeek).")
    router_groups: Width = Field(
        1, gt=0, description="Expert groups of group-limited routing (Megatron --moe-router-num-groups, HF "
        "n_group): a token picks router_group_topk groups, then its top_k experts inside them; 1: no limit.")
    router_group_topk: Width = Field(
        1, gt=0, description="Groups a token's experts may come from (Megatron --moe-router-group-topk, HF "
        "topk_group; DeepSeek-V3 routes to at most 4 of 8).")
    first_dense_layers: LayerCount = Field(
        0, ge=0, description="Leading blocks that keep a dense MLP of width `ffn` (DeepSeek first_k_dense_replace)."
    )
    every: LayerCount = Field(
        1, gt=0, description="Block i >= first_dense_layers is MoE when i % every == 0 (HF moe_layer_freq)."
    )

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        check_router_groups(self.num_experts, self.top_k, self.router_groups, self.router_group_topk)
        return self


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434)."""

    model_config = _CONFIG
    q_lora_rank: Width | None = Field(None, gt=0, description="Query down-projection rank; None: full-rank wq.")
    kv_lora_rank: Width = Field(gt=0, description="Compressed key/value latent width.")
    qk_nope_head_dim: Width = Field(gt=0, description="Per-head query/key width without rotary embedding.")
    qk_rope_head_dim: Width = Field(gt=0, description="Per-head query/key width carrying rotary embedding.")
    v_head_dim: Width = Field(gt=0, description="Per-head value width.")


class TransformerConfig(BaseModel):
    """Sizes and architecture switches of a decoder or encoder transformer."""

    model_config = _CONFIG
    name: ModelName = Field(description="Model name shown in plans and reports (letters, digits and ._+:-/).")
    num_layers: LayerCount = Field(gt=0, description="Transformer blocks.")
    hidden: Width = Field(gt=0, description="Model width d_model.")
    heads: Width = Field(gt=0, description="Query heads.")
    kv_heads: Width | None = Field(None, gt=0, description="Key/value heads (GQA); default: heads (MHA).")
    head_dim: Width | None = Field(None, gt=0, description="Width of one head; default: hidden // heads.")
    ffn: Width = Field(gt=0, description="Dense MLP hidden width (for gated MLPs: width of gate and up).")
    vocab: VocabSize = Field(gt=0, description="Vocabulary size.")
    activation: Literal["gelu", "swiglu", "geglu", "squared_relu", "relu"] = Field(
        "gelu", description="MLP activation; swiglu/geglu are gated (three matrices)."
    )
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="LayerNorm (2h params) or RMSNorm (h).")
    norm_position: Literal["pre", "post"] = Field(
        "pre",
        description="pre: norm before each sublayer plus a final norm (GPT-2 onward); post: norm after "
        "each sublayer plus one after the embedding, no final norm (BERT).",
    )
    bias: bool = Field(False, description="Biases on every linear layer except the output head.")
    qkv_bias: bool | None = Field(
        None, description="Biases on the Q, K, V projections; default: `bias` (Qwen2 has only these)."
    )
    position: Literal["rope", "learned"] = Field("rope", description="Rotary (no params) or learned position table.")
    max_positions: VocabSize = Field(4096, gt=0, description="Context length; sizes the learned position table.")
    tied_embeddings: bool = Field(False, description="Output head shares the input embedding matrix.")
    rope_theta: float | None = Field(
        None, gt=0, description="RoPE base the model trains with, from its source config (HF rope_theta, "
        "rotary_emb_base); None: not recorded there.  Sizes nothing; launch files carry it.")
    norm_eps: float | None = Field(
        None, gt=0, description="Normalization epsilon from the source config (HF rms_norm_eps, layer_norm_eps, "
        "layer_norm_epsilon); None: not recorded there.  Sizes nothing; launch files carry it.")
    dropout: bool = Field(False, description="Training uses dropout (adds masks to saved activations).")
    causal: bool = Field(True, description="Causal decoder; False builds a bidirectional encoder.")
    moe: MoEConfig | None = Field(None, description="Mixture-of-experts feed-forward; None: dense.")
    mla: MLAConfig | None = Field(None, description="Multi-head latent attention; None: standard MHA/GQA.")
    mtp_layers: LayerCount = Field(
        0, ge=0,
        description="Multi-token-prediction modules trained beside the model (DeepSeek-V3 Sec. 2.2, Megatron "
        "--mtp-num-layers): each adds a projection of [norm(h); norm(embedding)] to h, one more block and a "
        "pass through the shared output head, all on the last pipeline stage.",
    )
    type_vocab: VocabSize = Field(0, ge=0, description="Token-type (segment) embeddings (BERT: 2).")
    encoder_heads: bool = Field(
        False,
        description="Add BERT pre-training heads to `head`: pooler (h^2+h), MLM transform (h^2+h + norm), "
        "MLM decoder bias (vocab) and NSP classifier (2h+2).",
    )
    source: str = Field("", description="Paper, model card or config the sizes come from (URL or arXiv id).")

    @model_validator(mode="after")
    def _derive_and_check(self) -> "TransformerConfig":
        # Fill defaults that depend on other fields, then check the relations.
        if self.kv_heads is None:
            self.kv_heads = self.heads
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise ValueError(f"hidden ({self.hidden}) is not a multiple of heads ({self.heads}); set head_dim")
            self.head_dim = self.hidden // self.heads
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.qkv_bias is None:
            self.qkv_bias = self.bias
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) exceeds num_layers ({self.num_layers})"
            )
        if self.mla and self.kv_heads != self.heads:
            raise ValueError("mla: kv_heads must equal heads (MLA expands the latent to every head)")
        return self

    @property
    def query_groups(self) -> int:
        """kv_heads resolved (heads when omitted, as the validator fills it); Megatron's num_query_groups."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def kv_channels(self) -> int:
        """head_dim resolved (hidden // heads when omitted, as the validator fills it); Megatron's kv_channels."""
        return self.hidden // self.heads if self.head_dim is None else self.head_dim

    @property
    def gated(self) -> bool:
        """Gated MLP (three matrices: gate, up, down)."""
        return self.activation in GATED

    def to_spec(self) -> dict:
        """The fields as a spec dict, leaving out derived values that equal their default.

        Overriding `hidden` or `heads` of a zoo entry then re-derives head_dim
        and kv_heads instead of keeping the old model's.
        """
        data = self.model_dump()
        if self.kv_heads == self.heads:
            del data["kv_heads"]
        if self.hidden % self.heads == 0 and self.head_dim == self.hidden // self.heads:
            del data["head_dim"]
        if self.qkv_bias == self.bias:
            del data["qkv_bias"]
        return data

    def is_moe_block(self, i: int) -> bool:
        """Whether block i uses the MoE feed-forward."""
        return self.moe is not None and i >= self.moe.first_dense_layers and i % self.moe.every == 0


# --------------------------------------------------------------------------- layers


def _norm_params(cfg: TransformerConfig) -> int:
    return cfg.hidden * (2 if cfg.norm == "layernorm" else 1)


def _dropout_bytes(cfg: TransformerConfig) -> int:
    # A dropout mask is one byte per element (Korthikanti: "sbh" for each mask).
    return cfg.hidden if cfg.dropout else 0


def _embedding(cfg: TransformerConfig) -> Layer:
    h = cfg.hidden
    params = cfg.vocab * h + cfg.type_vocab * h
    if cfg.position == "learned":
        params += cfg.max_positions * h
    if cfg.norm_position == "post":  # BERT normalises the summed embeddings
        params += _norm_params(cfg)
    return Layer(
        name="embedding", kind=LayerKind.EMBEDDING, params=params, hidden=h, flops_per_token=0.0,
        tp_replicated_params=params - cfg.vocab * h,  # only the token table is vocab-parallel
        act_replicated=float(_dropout_bytes(cfg)), tp_splittable=True,
    )


def _attention(cfg: TransformerConfig, i: int) -> Layer:
    h, a, kv, d = cfg.hidden, cfg.heads, cfg.query_groups, cfg.kv_channels
    if cfg.mla is not None:
        return _mla_attention(cfg, cfg.mla, i)
    qw, kvw = a * d, kv * d
    weights = h * qw + 2 * h * kvw + qw * h
    biases = (qw + 2 * kvw if cfg.qkv_bias else 0) + (h if cfg.bias else 0)
    return Layer(
        name=f"block.{i}.attention", kind=LayerKind.ATTENTION, block=i,
        params=weights + biases + _norm_params(cfg), hidden=h,
        tp_replicated_params=_norm_params(cfg) + (h if cfg.bias else 0),  # norm, output-projection bias
        flops_per_token=2.0 * weights, flops_per_token_per_seq=4.0 * a * d,
        # norm input 2h + QKV input 2h (+ dropout mask after the output projection)
        act_replicated=float(4 * h + _dropout_bytes(cfg)),
        # Q, K, V (2 bytes each) and the attention output that feeds the projection
        act_tp_split=float(2 * qw + 4 * kvw + 2 * qw),
        # FP8 under Transformer Engine: the QKV input kept as FP8, the projection's FP8 copy of its input
        act_fp8_replicated=float(-h), act_fp8_split=float(qw),
        # softmax output 2as (+ dropout mask as + dropout output 2as): Korthikanti 5as
        act_attn_scores=float((5 if cfg.dropout else 2) * a),
        tp_splittable=True, attention=AttentionShape(heads=a, kv_heads=kv, head_dim=d, causal=cfg.causal),
    )


def _mla_attention(cfg: TransformerConfig, m: MLAConfig, i: int) -> Layer:
    """MLA: low-rank Q and joint KV latent, expanded per head (DeepSeek-V2 Sec. 2.1).

    Activation approximation: the latents (q after its down-projection and norm,
    the kv latent) are inputs of the up-projections; Megatron keeps the
    down-projections unsplit, so they count as replicated (2 bytes x rank).
    The per-head Q, K (qk_nope + qk_rope wide), V and output count like MHA.
    AttentionShape.head_dim is the q/k head width (nope + rope).
    """
    h, a = cfg.hidden, cfg.heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank:
        q_weights, q_norm, q_latent = h * m.q_lora_rank + m.q_lora_rank * a * qk, m.q_lora_rank, m.q_lora_rank
    else:
        q_weights, q_norm, q_latent = h * a * qk, 0, 0
    kv_weights = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
    o_weights = a * m.v_head_dim * h
    weights = q_weights + kv_weights + o_weights
    latent_norms = q_norm + m.kv_lora_rank  # RMSNorm on each latent
    biases = h if cfg.bias else 0
    return Layer(
        name=f"block.{i}.attention", kind=LayerKind.ATTENTION, block=i,
        params=weights + latent_norms + biases + _norm_params(cfg), hidden=h,
        flops_per_token=2.0 * weights,
        flops_per_token_per_seq=2.0 * a * qk + 2.0 * a * m.v_head_dim,
        act_replicated=float(4 * h + _dropout_bytes(cfg) + 2 * q_latent + 2 * m.kv_lora_rank),
        act_tp_split=float(2 * a * qk + 2 * a * qk + 2 * a * m.v_head_dim + 2 * a * m.v_head_dim),
        act_attn_scores=float((5 if cfg.dropout else 2) * a),
        tp_splittable=True, attention=AttentionShape(heads=a, kv_heads=a, head_dim=qk, causal=cfg.causal),
    )


def _ffn_weights(cfg: TransformerConfig, f: int) -> tuple[int, int]:
    """(matmul weights, biases) of one feed-forward of width f."""
    h = cfg.hidden
    if cfg.gated:
        return 3 * h * f, (2 * f + h if cfg.bias else 0)
    return 2 * h * f, (f + h if cfg.bias else 0)


def _ffn_act_split(cfg: TransformerConfig, f: int) -> int:
    # non-gated: activation input 2f + fc2 input 2f; gated: gate 2f + up 2f + product 2f
    return (6 if cfg.gated else 4) * f


def _mlp(cfg: TransformerConfig, i: int) -> Layer:
    h = cfg.hidden
    weights, biases = _ffn_weights(cfg, cfg.ffn)
    return Layer(
        name=f"block.{i}.mlp", kind=LayerKind.MLP, block=i,
        params=weights + biases + _norm_params(cfg), hidden=h, flops_per_token=2.0 * weights,
        tp_replicated_params=_norm_params(cfg) + (h if cfg.bias else 0),  # norm, down-projection bias
        act_replicated=float(4 * h + _dropout_bytes(cfg)),  # norm input 2h + fc1 input 2h (+ mask)
        act_tp_split=float(_ffn_act_split(cfg, cfg.ffn)), tp_splittable=True,
        # FP8 under Transformer Engine: the fc1 input and the fc2 input (the activation's output) kept as FP8
        act_fp8_replicated=float(-h), act_fp8_split=float(-cfg.ffn),
    )


def _feed_forward(cfg: TransformerConfig, i: int) -> Layer:
    """Block i's MoE layer where it is a MoE block, else its MLP."""
    return _moe(cfg, cfg.moe, i) if cfg.moe is not None and cfg.is_moe_block(i) else _mlp(cfg, i)


def _moe(cfg: TransformerConfig, m: MoEConfig, i: int) -> Layer:
    h = cfg.hidden
    weights, biases = _ffn_weights(cfg, m.expert_ffn)
    expert = weights + biases
    router = h * m.num_experts
    norm = _norm_params(cfg)
    used = m.top_k + m.shared_experts
    return Layer(
        name=f"block.{i}.moe", kind=LayerKind.MOE, block=i,
        params=(m.num_experts + m.shared_experts) * expert + router + norm,
        tp_replicated_params=router + norm,
        active_params=used * expert + router + norm, hidden=h,
        flops_per_token=2.0 * (used * weights + router),
        act_replicated=float(4 * h + _dropout_bytes(cfg)),
        # every visited expert saves its own MLP activations; router logits in fp32
        act_tp_split=float(used * _ffn_act_split(cfg, m.expert_ffn) + 4 * m.num_experts),
        tp_splittable=True,
        moe=MoEShape(num_experts=m.num_experts, top_k=m.top_k, shared_experts=m.shared_experts,
                     expert_ffn=m.expert_ffn, router_groups=m.router_groups, router_group_topk=m.router_group_topk),
    )


def _final_norm(cfg: TransformerConfig) -> Layer:
    # Post-norm encoders end on a sublayer norm: the layer is kept (the cost model
    # expects it) as an identity with no params and nothing saved.
    pre = cfg.norm_position == "pre"
    return Layer(
        name="final_norm", kind=LayerKind.NORM, params=_norm_params(cfg) if pre else 0,
        hidden=cfg.hidden, flops_per_token=0.0, act_replicated=float(2 * cfg.hidden if pre else 0),
    )


def _head(cfg: TransformerConfig) -> Layer:
    h, v = cfg.hidden, cfg.vocab
    params = 0 if cfg.tied_embeddings else v * h
    flops = 2.0 * h * v
    if cfg.encoder_heads:
        # pooler + MLM transform (dense, norm) + MLM decoder bias + NSP classifier
        params += (h * h + h) + (h * h + h + _norm_params(cfg)) + v + (2 * h + 2)
        flops += 2.0 * h * h  # the MLM transform runs on every token; pooler/NSP on one
    return Layer(
        name="head", kind=LayerKind.HEAD, params=params, tied_params=v * h if cfg.tied_embeddings else 0,
        hidden=h, flops_per_token=flops,
        act_replicated=float(2 * h), act_tp_split=float(4 * v),  # input; fp32 logits for the loss
        tp_splittable=True,
    )


def _mtp(cfg: TransformerConfig, j: int) -> list[Layer]:
    """Multi-token-prediction module j (DeepSeek-V3, arXiv 2412.19437 Sec. 2.2): two RMSNorms and a 2h -> h
    projection, a transformer block like the last one, and the output head again (its weights are the main
    head's, so it holds no parameters of its own).  The layers carry no block index: they sit after the
    blocks, on the last pipeline stage, and are never recomputed."""
    h, last = cfg.hidden, cfg.num_layers - 1
    # the last stage keeps its own copy of the (vocab-parallel) word embedding for the shifted tokens
    proj = Layer(
        name=f"mtp.{j}.proj", kind=LayerKind.NORM, params=2 * _norm_params(cfg) + 2 * h * h, hidden=h,
        tp_replicated_params=2 * _norm_params(cfg), tied_params=cfg.vocab * h, tp_splittable=True,
        flops_per_token=2.0 * 2 * h * h, act_replicated=float(2 * 2 * h + 2 * 2 * h),  # norm inputs, proj input
    )
    block = [layer.model_copy(update={"name": f"mtp.{j}.{layer.kind.value}", "block": None})
             for layer in (_attention(cfg, last), _feed_forward(cfg, last))]
    head = _head(cfg)
    head = head.model_copy(update={"name": f"mtp.{j}.head", "params": 0, "tied_params": 0})
    return [proj, *block, head]


def build_transformer(cfg: TransformerConfig) -> ModelGraph:
    """Lay out the layers of `cfg` in execution order (see the module docstring)."""
    layers = [_embedding(cfg)]
    for i in range(cfg.num_layers):
        layers.append(_attention(cfg, i))
        layers.append(_feed_forward(cfg, i))
    layers += [_final_norm(cfg), _head(cfg)]
    for j in range(cfg.mtp_layers):
        layers += _mtp(cfg, j)
    return ModelGraph(
        name=cfg.name, family="decoder" if cfg.causal else "encoder", layers=layers,
        hidden=cfg.hidden, num_blocks=cfg.num_layers, heads=cfg.heads, kv_heads=cfg.query_groups,
        vocab=cfg.vocab, num_experts=cfg.moe.num_experts if cfg.moe else 0, source=cfg.source,
        rope_theta=cfg.rope_theta, norm_eps=cfg.norm_eps,
    )


# --------------------------------------------------------------------------- families


def gpt(**sizes) -> TransformerConfig:
    """GPT-2/3 family (Radford et al. 2019; Brown et al. 2020, arXiv 2005.14165).

    Learned positions, LayerNorm, biases, GELU MLP of 4h, tied embeddings, dropout.
    """
    defaults = dict(activation="gelu", norm="layernorm", bias=True, position="learned",
                    tied_embeddings=True, dropout=True, max_positions=2048, vocab=50257)
    if isinstance(sizes.get("hidden"), int) and "ffn" not in sizes:
        defaults["ffn"] = 4 * sizes["hidden"]
    return TransformerConfig(**{**defaults, **sizes})


def llama(**sizes) -> TransformerConfig:
    """Llama family (Touvron et al. 2023, arXiv 2302.13971 / 2307.09288; Dubey et al. 2024, arXiv 2407.21783).

    RoPE, RMSNorm, SwiGLU, no biases, untied head, no dropout.  Mistral,
    Mixtral and Qwen2 share this layout (Qwen2 adds QKV biases).
    """
    defaults = dict(activation="swiglu", norm="rmsnorm", bias=False, position="rope",
                    tied_embeddings=False, dropout=False)
    return TransformerConfig(**{**defaults, **sizes})


def bert(**sizes) -> TransformerConfig:
    """BERT family (Devlin et al. 2019, arXiv 1810.04805): post-norm encoder with pre-training heads."""
    defaults = dict(activation="gelu", norm="layernorm", norm_position="post", bias=True,
                    position="learned", max_positions=512, type_vocab=2, tied_embeddings=True,
                    dropout=True, causal=False, encoder_heads=True, vocab=30522)
    if isinstance(sizes.get("hidden"), int) and "ffn" not in sizes:
        defaults["ffn"] = 4 * sizes["hidden"]
    return TransformerConfig(**{**defaults, **sizes})
