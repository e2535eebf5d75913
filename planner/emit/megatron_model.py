"""The model Megatron-LM must build for a plan: its architecture, read off the plan's model graph.

The graph records sizes (parameters, FLOPs, saved bytes per layer), not the switches that produced them.
`architecture(model)` finds the `models.transformer.TransformerConfig` whose graph *is* the plan's graph,
layer by layer: the zoo entry of the same name when it rebuilds to the same layers, else one read off the
graph (norm, biases, gating, positions, tying, dropout, experts) and checked the same way.  A model no
config rebuilds (multi-latent attention outside the zoo, a post-norm encoder with overrides) gets
`UnsupportedPlan`: no flag set would make Megatron build what the plan costs.

`ModelFacts` are what no parameter count shows: rotary base, partial rotary, norm epsilon, attention
window, initialisation and the router's recipe.  Zoo models have theirs (`FACTS`, with sources); any other
model gets Megatron's defaults, and `Architecture.notes` says so for README.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.graph import AttentionShape, Layer, LayerKind, ModelGraph
from models.transformer import MoEConfig, TransformerConfig, build_transformer
from models.yamlio import as_name
from models.zoo import ZOO
from planner.emit import UnsupportedPlan

_FROZEN = ConfigDict(extra="forbid", frozen=True)
_HF = "https://huggingface.co/"


class RouterRecipe(BaseModel):
    """How a mixture-of-experts model routes and balances (no parameters depend on it)."""

    model_config = _FROZEN
    score_function: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="Router score (--moe-router-score-function).")
    load_balancing: Literal["aux_loss", "seq_aux_loss", "none"] = Field(
        "aux_loss", description="Balancing loss (--moe-router-load-balancing-type).")
    aux_loss_coeff: float = Field(ge=0, description="Weight of the balancing loss (--moe-aux-loss-coeff).")
    expert_bias: bool = Field(
        False, description="Auxiliary-loss-free balancing bias (--moe-router-enable-expert-bias).")
    topk_scaling: float | None = Field(
        None, gt=0, description="Routed-weight scale (--moe-router-topk-scaling-factor).")
    groups: int | None = Field(
        None, gt=0, description="Expert groups of group-limited routing (--moe-router-num-groups).")
    group_topk: int | None = Field(None, gt=0, description="Groups each token may use (--moe-router-group-topk).")
    source: str = Field(description="Where the recipe comes from.")


class ModelFacts(BaseModel):
    """What Megatron needs to build a model that its parameter counts do not show."""

    model_config = _FROZEN
    rotary_base: int = Field(10000, gt=0, description="RoPE theta (--rotary-base).")
    rotary_percent: float = Field(
        1.0, gt=0, le=1, description="Share of each head that is rotated (--rotary-percent).")
    rope_scaling: bool = Field(False, description="Llama 3.1 frequency scaling, factor 8 (--use-rope-scaling).")
    norm_epsilon: float = Field(1e-5, gt=0, description="Normalization epsilon (--norm-epsilon).")
    zero_centered_gamma: bool = Field(False, description="LayerNorm with weight 1 + gamma (--apply-layernorm-1p).")
    window: tuple[int, int] | None = Field(None, description="Sliding attention window (left, right) (--window-size).")
    init_std: float = Field(0.02, gt=0, description="Weight initialisation std (--init-method-std).")
    router: RouterRecipe | None = Field(None, description="Routing recipe of a mixture-of-experts model.")
    parallel_residual: bool = Field(False, description="Attention and MLP read the same input (GPT-NeoX); Megatron "
                                                       "GPT has no such switch (same parameters and activations).")
    source: str = Field(description="Where these values come from.")


def _hf(repo: str, keys: str) -> str:
    return f"{_HF}{repo} config.json ({keys})"


_LLAMA2 = ModelFacts(source=_hf("meta-llama/Llama-2-7b-hf", "rms_norm_eps 1e-05; rope_theta 10000"))
_LLAMA3 = ModelFacts(rotary_base=500000,
                     source=_hf("meta-llama/Meta-Llama-3-8B", "rope_theta 500000; rms_norm_eps 1e-05"))
_MIXTRAL = "rope_theta 1e6; rms_norm_eps 1e-05; router_aux_loss_coef {}; softmax over the top-2 logits"
_QWEN3 = "rope_theta 1e6; rms_norm_eps 1e-06; router_aux_loss_coef 0.001; norm_topk_prob true"
FACTS: dict[str, ModelFacts] = {
    "llama2-7b": _LLAMA2, "llama2-13b": _LLAMA2, "llama2-70b": _LLAMA2,
    "llama3-8b": _LLAMA3, "llama3-70b": _LLAMA3,
    "llama3-405b": ModelFacts(rotary_base=500000, rope_scaling=True, source=_hf(
        "meta-llama/Llama-3.1-405B", "rope_theta 500000; rope_scaling llama3, factor 8; rms_norm_eps 1e-05")),
    "mistral-7b": ModelFacts(window=(4096, 0), source=_hf(
        "mistralai/Mistral-7B-v0.1", "rope_theta 10000; rms_norm_eps 1e-05; sliding_window 4096")
        + "; NeMo MistralConfig7B window_size [4096, 0]"),
    "mixtral-8x7b": ModelFacts(rotary_base=1000000, router=RouterRecipe(aux_loss_coeff=0.02, source=_hf(
        "mistralai/Mixtral-8x7B-v0.1", "router_aux_loss_coef 0.02")),
        source=_hf("mistralai/Mixtral-8x7B-v0.1", _MIXTRAL.format(0.02))),
    "mixtral-8x22b": ModelFacts(rotary_base=1000000, router=RouterRecipe(aux_loss_coeff=0.001, source=_hf(
        "mistralai/Mixtral-8x22B-v0.1", "router_aux_loss_coef 0.001")),
        source=_hf("mistralai/Mixtral-8x22B-v0.1", _MIXTRAL.format(0.001))),
    "qwen2-7b": ModelFacts(rotary_base=1000000, norm_epsilon=1e-6,
                           source=_hf("Qwen/Qwen2-7B", "rope_theta 1e6; rms_norm_eps 1e-06")),
    "qwen3-30b-a3b": ModelFacts(rotary_base=1000000, norm_epsilon=1e-6, router=RouterRecipe(
        aux_loss_coeff=0.001, source=_hf("Qwen/Qwen3-30B-A3B", "router_aux_loss_coef 0.001")),
        source=_hf("Qwen/Qwen3-30B-A3B", _QWEN3)),
    "qwen3-235b-a22b": ModelFacts(rotary_base=1000000, norm_epsilon=1e-6, router=RouterRecipe(
        aux_loss_coeff=0.001, source=_hf("Qwen/Qwen3-235B-A22B", "router_aux_loss_coef 0.001")),
        source=_hf("Qwen/Qwen3-235B-A22B", _QWEN3)),
    "gpt2-xl": ModelFacts(source=_hf("openai-community/gpt2-xl", "layer_norm_epsilon 1e-05; n_positions 1024")),
    "gpt3-175b": ModelFacts(init_std=0.006, source="Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh "
                                                   "(--init-method-std 0.006; Megatron's LayerNorm epsilon)"),
    "gpt-neox-20b": ModelFacts(rotary_percent=0.25, parallel_residual=True, source=_hf(
        "EleutherAI/gpt-neox-20b", "rotary_pct 0.25; rotary_emb_base 10000; layer_norm_eps 1e-05; "
        "use_parallel_residual true")),
    "nemotron-4-340b": ModelFacts(rotary_percent=0.5, zero_centered_gamma=True, init_std=0.0063,
                                  source="NVIDIA NeMo nemo/collections/llm/gpt/model/nemotron.py (NemotronConfig: "
                                  "rotary_percent 0.5, layernorm_zero_centered_gamma; Nemotron4Config340B: "
                                  "init_method_std 0.0063)"),
    "deepseek-v3": ModelFacts(norm_epsilon=1e-6, init_std=0.006, router=RouterRecipe(
        score_function="sigmoid", load_balancing="seq_aux_loss", aux_loss_coeff=0.0001, expert_bias=True,
        topk_scaling=2.5, groups=8, group_topk=4,
        source="arXiv 2412.19437 Sec. 2.1.2 and 4.2 (sigmoid affinities, auxiliary-loss-free bias, "
               "sequence-wise balance loss alpha 0.0001, 8 groups of which 4 per token); " + _hf(
                   "deepseek-ai/DeepSeek-V3", "scoring_func sigmoid; routed_scaling_factor 2.5; n_group 8; "
                   "topk_group 4")),
        source=_hf("deepseek-ai/DeepSeek-V3", "rope_theta 10000; rms_norm_eps 1e-06") + "; arXiv 2412.19437 "
        "Sec. 4.2 (initialisation std 0.006)"),
    "tiny-llama": ModelFacts(source="planner's CPU test model (Megatron's defaults)"),
    "tiny-mixtral": ModelFacts(router=RouterRecipe(aux_loss_coeff=0.01, source="planner's CPU test model: the "
                                                   "deepspeed profile's aux_loss_coeff (DeepSpeed-MoE's examples)"),
                               source="planner's CPU test model (Megatron's defaults)"),
    "bert-large": ModelFacts(norm_epsilon=1e-12, source=_hf("google-bert/bert-large-uncased", "layer_norm_eps 1e-12")),
}
DEFAULT_FACTS = ModelFacts(source="Megatron-LM's defaults: the model file does not record them")
DEFAULT_ROUTER = RouterRecipe(aux_loss_coeff=0.01, source="Megatron-LM's MoE examples (--moe-aux-loss-coeff 1e-2): "
                                                          "the model file does not record a routing recipe")


class Architecture(BaseModel):
    """The config whose graph is the plan's model, the facts its flags need, and what was assumed."""

    model_config = _FROZEN
    config: TransformerConfig = Field(description="Builder config that rebuilds the plan's graph exactly.")
    facts: ModelFacts = Field(description="Rotary base, epsilon, window, init, router recipe.")
    notes: tuple[str, ...] = Field((), description="What was assumed, for README.md.")


# ---------------------------------------------------------------- graph -> config

_COMPARED = ("name", "kind", "params", "tied_params", "flops_per_token", "flops_per_token_per_seq",
             "act_replicated", "act_tp_split", "act_attn_scores")


def graph_difference(built: ModelGraph, model: ModelGraph) -> str | None:
    """The first layer field where `built` differs from `model` ('layer.field a != b'), None when equal."""
    if len(built.layers) != len(model.layers):
        return f"{len(built.layers)} layers != {len(model.layers)}"
    for mine, theirs in zip(built.layers, model.layers):
        for field in _COMPARED:
            if getattr(mine, field) != getattr(theirs, field):
                return f"{theirs.name}.{field} {getattr(mine, field)} != {getattr(theirs, field)}"
    return None


def _first(model: ModelGraph, kind: LayerKind) -> Layer | None:
    return next((layer for layer in model.layers if layer.kind == kind), None)


def _named(model: ModelGraph, name: str) -> Layer:
    layer = next((layer for layer in model.layers if layer.name == name), None)
    if layer is None:
        raise UnsupportedPlan(f"{model.name}: no '{name}' layer: Megatron needs a transformer built by "
                              "models.transformer")
    return layer


def _biases(model: ModelGraph, attention: Layer, shape: AttentionShape, norm: int) -> tuple[bool, bool]:
    """(all linear biases, Q/K/V biases) from what the attention layer (of head structure `shape`) holds beyond
    its weights and norm."""
    h = model.hidden
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    extra = attention.params - 2 * h * (shape.heads + shape.kv_heads) * shape.head_dim - norm
    if extra not in (0, h, qkv, qkv + h):
        raise UnsupportedPlan(f"{model.name}: {attention.name} is not multi-head or grouped-query attention "
                              f"({extra} parameters beyond its projections and norm; multi-latent attention "
                              "is known for zoo models only)")
    return extra in (h, qkv + h), extra in (qkv, qkv + h)


def _ffn(model: ModelGraph, norm: int, bias: bool, like: TransformerConfig | None) -> tuple[int, bool]:
    """(MLP width, gated) of the first MLP layer (of an expert where every block is MoE); gating from the
    biases, else the zoo's or Llama's."""
    h = model.hidden
    mlp, moe = _first(model, LayerKind.MLP), _first(model, LayerKind.MOE)
    if mlp is None:  # every block is MoE: gating from one expert's size
        if moe is None or moe.moe is None:
            raise UnsupportedPlan(f"{model.name}: no MLP or mixture-of-experts layer")
        m = moe.moe
        expert = (moe.params - h * m.num_experts - norm) / (m.num_experts + m.shared_experts)
        return m.expert_ffn, expert == 3 * h * m.expert_ffn + ((2 * m.expert_ffn + h) if bias else 0)
    weights = round(mlp.flops_per_token / 2)  # 2 FLOPs per weight per token
    if bias:  # gated: 2f + h biases with f = weights / 3h; plain: f + h with f = weights / 2h
        gated = weights % (3 * h) == 0 and mlp.params - weights - norm == 2 * weights // (3 * h) + h
    else:  # the sizes cannot tell a gated MLP from a wider plain one
        gated = like.gated if like is not None else True
    return weights // ((3 if gated else 2) * h), gated


def _experts(model: ModelGraph) -> MoEConfig | None:
    experts = [(layer.block, layer.moe) for layer in model.layers
               if layer.kind == LayerKind.MOE and layer.block is not None and layer.moe is not None]
    if not experts:
        return None
    blocks, m = [block for block, _ in experts], experts[0][1]
    every = blocks[1] - blocks[0] if len(blocks) > 1 else 1
    return MoEConfig(num_experts=m.num_experts, top_k=m.top_k, expert_ffn=m.expert_ffn,
                     shared_experts=m.shared_experts, first_dense_layers=blocks[0], every=every)


def read_config(model: ModelGraph, like: TransformerConfig | None = None) -> TransformerConfig:
    """A config read off a pre-norm transformer graph; what sizes cannot tell (the activation of a
    plain MLP, a gated MLP without biases) comes from `like` (the zoo entry of the same name), else
    GELU / SwiGLU."""
    h = model.hidden
    attention, final = _first(model, LayerKind.ATTENTION), _named(model, "final_norm")
    embedding, head = _named(model, "embedding"), _named(model, "head")
    if attention is None or attention.attention is None:
        raise UnsupportedPlan(f"{model.name}: no attention layer with a head structure")
    if final.params not in (h, 2 * h):
        raise UnsupportedPlan(f"{model.name}: final_norm holds {final.params} parameters (RMSNorm {h}, "
                              f"LayerNorm {2 * h}); post-norm encoders are known for zoo models only")
    norm = final.params
    bias, qkv_bias = _biases(model, attention, attention.attention, norm)
    ffn, gated = _ffn(model, norm, bias, like)
    moe = _experts(model)
    if like is not None and like.gated == gated:
        activation = like.activation
    else:
        activation = "swiglu" if gated else "gelu"
    positions = (embedding.params - model.vocab * h) // h
    shape = attention.attention
    values = dict(
        # the config's name only labels it (a model's name is checked where it enters; emitters quote their own)
        name=as_name(model.name, "model"), num_layers=model.num_blocks, hidden=h, heads=shape.heads,
        kv_heads=shape.kv_heads, head_dim=shape.head_dim, ffn=ffn,
        vocab=model.vocab,
        activation=activation, norm="rmsnorm" if norm == h else "layernorm", bias=bias, qkv_bias=qkv_bias,
        position="learned" if positions > 0 else "rope",
        max_positions=positions if positions > 0 else (like.max_positions if like else 4096),
        tied_embeddings=head.tied_params > 0, dropout=attention.act_replicated > 4 * h,
        causal=shape.causal, moe=moe,
    )
    try:
        return TransformerConfig.model_validate(values)
    except ValidationError as err:
        message = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise UnsupportedPlan(f"{model.name}: the graph reads as no valid transformer: {message}") from None


def _recorded_facts(model: ModelGraph, rope: bool, notes: list[str]) -> tuple[ModelFacts, list[str]]:
    """Facts of a model outside the zoo's table: what its source config records (rope_theta, norm epsilon),
    Megatron's defaults for the rest, and a note naming the defaults taken."""
    recorded = {"rotary_base": model.rope_theta, "norm_epsilon": model.norm_eps}
    given = {key: value for key, value in recorded.items() if value is not None}
    if "rotary_base" in given:
        given["rotary_base"] = round(given["rotary_base"])  # --rotary-base is an integer
    facts = DEFAULT_FACTS.model_copy(update={
        **given, "source": f"{model.name}'s config ({', '.join(given)}); Megatron's defaults for the rest"
        if given else DEFAULT_FACTS.source})
    defaults = [f"rotary base {facts.rotary_base}" if rope and "rotary_base" not in given else "",
                f"norm epsilon {facts.norm_epsilon:g}" if "norm_epsilon" not in given else "",
                f"init std {facts.init_std:g}"]
    named = ", ".join(d for d in defaults if d)
    return facts, [*notes, f"{named[0].upper()}{named[1:]}: Megatron's defaults ({model.name}'s config does not record "
                           "them): edit args.txt if the model differs."]


def architecture(model: ModelGraph) -> Architecture:
    """The config that rebuilds `model` exactly, its facts, and notes on what was assumed."""
    if model.num_blocks == 0 or model.family not in ("decoder", "encoder"):
        raise UnsupportedPlan(f"{model.name}: launch files for Megatron/torchtitan need a transformer "
                              f"(family {model.family}, {model.num_blocks} blocks)")
    entry = ZOO.get(model.name)
    like = entry.config if entry is not None and isinstance(entry.config, TransformerConfig) else None
    facts, notes = FACTS.get(model.name), []
    if like is not None and graph_difference(build_transformer(like), model) is None:
        config = like
    else:
        config = read_config(model, like)
        difference = graph_difference(build_transformer(config), model)
        if difference is not None:
            raise UnsupportedPlan(f"{model.name}: no transformer config rebuilds the plan's model ({difference}); "
                                  "Megatron's arguments cannot describe it")
        what = f"overrides of the zoo's {model.name}" if like is not None else "a model outside the zoo"
        notes.append(f"{model.name} is {what}: its architecture was read off the model graph "
                     f"({config.norm}, {config.activation}, {'' if config.bias else 'no '}biases, "
                     f"{config.position} positions); check the activation, which sizes cannot tell apart.")
    if facts is None:
        facts, notes = _recorded_facts(model, config.position == "rope", notes)
    if config.moe is not None and facts.router is None:
        facts = facts.model_copy(update={"router": DEFAULT_ROUTER})
        notes.append(f"Routing recipe: {DEFAULT_ROUTER.source}.")
    return Architecture(config=config, facts=facts, notes=tuple(notes))


# ---------------------------------------------------------------- config -> pretrain_gpt.py flags


def moe_layer_pattern(config: TransformerConfig) -> str | None:
    """--moe-layer-freq as Megatron's list expression (1: MoE block, 0: dense), None when every block is MoE."""
    kinds = [1 if config.is_moe_block(i) else 0 for i in range(config.num_layers)]
    if all(kinds):
        return None
    runs: list[list[int]] = []
    for kind in kinds:
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    return "(" + "+".join(f"[{kind}]*{count}" for kind, count in runs) + ")"


def _attention_args(cfg: TransformerConfig) -> dict:
    if cfg.mla is not None:
        m = cfg.mla
        args: dict = {"multi-latent-attention": True}
        if m.q_lora_rank:
            args["q-lora-rank"] = m.q_lora_rank
        # the latent RMSNorms (q after its down-projection, kv) are Megatron's q/kv layernorms
        return {**args, "kv-lora-rank": m.kv_lora_rank, "qk-head-dim": m.qk_nope_head_dim,
                "qk-pos-emb-head-dim": m.qk_rope_head_dim, "v-head-dim": m.v_head_dim, "qk-layernorm": True,
                # plain RoPE for pretraining (MLATransformerConfig defaults to YaRN, a context-extension
                # stage), which megatron-core fuses for YaRN only (MLATransformerConfig.__post_init__)
                "rope-type": "rope", "no-rope-fusion": True}
    args = {}
    if cfg.kv_channels * cfg.heads != cfg.hidden:
        args["kv-channels"] = cfg.kv_channels
    if cfg.query_groups != cfg.heads:
        args.update({"group-query-attention": True, "num-query-groups": cfg.query_groups})
    return args


def _position_args(cfg: TransformerConfig, facts: ModelFacts, seq_len: int) -> dict:
    if cfg.position == "learned":
        if seq_len > cfg.max_positions:
            raise UnsupportedPlan(f"{cfg.name}: sequences of {seq_len} tokens exceed its learned position table "
                                  f"({cfg.max_positions} rows)")
        return {"seq-length": seq_len, "max-position-embeddings": cfg.max_positions,
                "position-embedding-type": "learned_absolute"}
    args = {"seq-length": seq_len, "max-position-embeddings": max(seq_len, cfg.max_positions),
            "position-embedding-type": "rope", "rotary-base": facts.rotary_base}
    if facts.rotary_percent != 1.0:
        args["rotary-percent"] = facts.rotary_percent
    if facts.rope_scaling:
        args["use-rope-scaling"] = True
    if facts.window is not None:
        args["window-size"] = f"{facts.window[0]},{facts.window[1]}"
    return args


def _layer_args(cfg: TransformerConfig, facts: ModelFacts) -> dict:
    """Normalization, biases, activation, tying, dropout and initialisation."""
    args: dict = {"normalization": "RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm",
                  "norm-epsilon": facts.norm_epsilon}
    if facts.zero_centered_gamma:
        args["apply-layernorm-1p"] = True
    if not cfg.bias:
        args["disable-bias-linear"] = True
        if cfg.qkv_bias:
            args["add-qkv-bias"] = True
    elif not cfg.qkv_bias:
        raise UnsupportedPlan(f"{cfg.name}: biases on every linear layer but Q/K/V; Megatron adds Q/K/V biases "
                              "whenever it adds the others")
    if cfg.activation == "swiglu":
        args["swiglu"] = True
    elif cfg.activation == "squared_relu":
        args["squared-relu"] = True
    elif cfg.activation != "gelu":
        raise UnsupportedPlan(f"{cfg.name}: activation {cfg.activation} has no pretrain_gpt.py flag "
                              "(gelu, --swiglu, --squared-relu)")
    if not cfg.tied_embeddings:
        args["untie-embeddings-and-output-weights"] = True
    dropout = 0.1 if cfg.dropout else 0.0  # Megatron's default is 0.1 for both
    return {**args, "attention-dropout": dropout, "hidden-dropout": dropout, "init-method-std": facts.init_std}


def _moe_args(cfg: TransformerConfig, m: MoEConfig, router: RouterRecipe) -> dict:
    args: dict = {"num-experts": m.num_experts, "moe-ffn-hidden-size": m.expert_ffn, "moe-router-topk": m.top_k}
    if m.shared_experts:
        args["moe-shared-expert-intermediate-size"] = m.shared_experts * m.expert_ffn
    pattern = moe_layer_pattern(cfg)
    if pattern is not None:
        args["moe-layer-freq"] = pattern
    # the plan costs all-to-all token exchange, grouped expert GEMMs and fp32 router logits
    args.update({"moe-token-dispatcher-type": "alltoall", "moe-grouped-gemm": True, "moe-router-dtype": "fp32",
                 "moe-router-load-balancing-type": router.load_balancing, "moe-aux-loss-coeff": router.aux_loss_coeff})
    if router.score_function != "softmax":
        args["moe-router-score-function"] = router.score_function
    elif m.top_k == 1:
        args["moe-router-pre-softmax"] = True  # Megatron refuses a softmax over one logit
    if router.expert_bias:
        args["moe-router-enable-expert-bias"] = True
    if router.topk_scaling is not None:
        args["moe-router-topk-scaling-factor"] = router.topk_scaling
    if router.groups is not None:
        args.update({"moe-router-num-groups": router.groups, "moe-router-group-topk": router.group_topk})
    return args


def model_shape(model: ModelGraph) -> dict[str, Any]:
    """Layers, hidden, heads, query groups, FFN width, gating, experts, tying and vocabulary of a transformer
    graph (the torchtitan emitter's model args), read off the config that rebuilds the graph exactly
    (`architecture`): UnsupportedPlan when none does, never a guess from parameter counts."""
    config = architecture(model).config
    moe = next((layer.moe for layer in model.layers if layer.moe is not None), None)
    return {"num_layers": config.num_layers, "hidden": model.hidden, "heads": model.heads,
            "kv_heads": model.kv_heads, "ffn": config.ffn, "gated": config.gated, "moe": moe,
            "tied": config.tied_embeddings, "vocab": model.vocab}


def architecture_args(arch: Architecture, seq_len: int) -> tuple[dict, list[str]]:
    """pretrain_gpt.py flags that make Megatron build `arch` (flag without dashes -> value, True for
    store-true), and README notes."""
    cfg, facts = arch.config, arch.facts
    args = {"num-layers": cfg.num_layers, "hidden-size": cfg.hidden, "ffn-hidden-size": cfg.ffn,
            "num-attention-heads": cfg.heads, **_attention_args(cfg), **_position_args(cfg, facts, seq_len),
            **_layer_args(cfg, facts)}
    if cfg.moe is not None:  # `architecture` gives every mixture-of-experts model a router recipe
        args.update(_moe_args(cfg, cfg.moe, facts.router or DEFAULT_ROUTER))
    notes = list(arch.notes)
    if facts.parallel_residual:
        notes.append(f"{cfg.name}'s parallel residual (attention and MLP read the same input) has no Megatron GPT "
                     "flag: Megatron builds the sequential residual (same parameters and activation memory).")
    return args, notes


def vocab_args(vocab: int, tp: int, hidden: int, tied: bool) -> tuple[dict, list[str]]:
    """--make-vocab-size-divisible-by D with D x tp the model's vocabulary (rounded up to a multiple of tp):
    Megatron pads any tokenizer of at most that many tokens to exactly D x tp rows."""
    divisor = -(-vocab // tp)
    padded = divisor * tp
    notes = []
    if padded != vocab:
        extra = (padded - vocab) * hidden * (1 if tied else 2)
        notes.append(f"Megatron's vocabulary-parallel embedding needs a multiple of tp={tp}: it builds {padded} "
                     f"vocabulary rows, {padded - vocab} more than the plan costs ({extra:,} parameters).")
    return {"make-vocab-size-divisible-by": divisor}, notes
