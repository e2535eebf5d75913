"""Which torchtitan model builds a planner model: `[model] name` and `flavor` in train.toml.

torchtitan 0.2.2 registers models by name (torchtitan/models/__init__.py `_supported_models`: deepseek_v3,
flux, gpt_oss, llama3, llama3_ft, llama4, qwen3). Each model has flavors, which are model-argument tables
in torchtitan/models/<name>/__init__.py. A zoo model whose sizes torchtitan ships gets that (name, flavor),
listed in FLAVORS. tests/test_emit_torchtitan.py checks each entry against the installed release's own
tables. Any other dense Llama-layout model gets name "llama3" and a flavor named after the model. The
README then says which model arguments to register under that name. Models of another layout are refused
(UnsupportedPlan): GPT, BERT and Nemotron blocks, QKV biases, tied heads, and Mixtral's MoE. torchtitan's
MoE models (deepseek_v3, llama4, qwen3's MoE flavors, gpt_oss) route and shape their experts otherwise,
so running them would train another model.
"""

from __future__ import annotations

from planner.emit import UnsupportedPlan
from planner.emit.megatron_model import model_shape
from models.graph import ModelGraph

RELEASE = "torchtitan 0.2.2"

# zoo name -> (torchtitan model name, flavor) with the same sizes
FLAVORS: dict[str, tuple[str, str]] = {
    "llama3-8b": ("llama3", "8B"),
    "llama3-70b": ("llama3", "70B"),
    "llama3-405b": ("llama3", "405B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
}

# zoo name -> (model, flavor) of the same sizes with variable-length attention under a document mask
# (attn_type "varlen", attn_mask_type "block_causal": a document ends at the tokenizer's eos id), what a data
# plan's packed rows need
DOCUMENT_FLAVORS: dict[str, tuple[str, str]] = {
    "llama3-8b": ("llama3", "8B_varlen"),
}

MOE_MODELS = "deepseek_v3, llama4, qwen3 (its 30B-A3B and 235B-A22B flavors) and gpt_oss"


def _zoo_config(model: ModelGraph):
    """The zoo's TransformerConfig of `model` when it is an unmodified zoo model, else None."""
    from models.transformer import TransformerConfig
    from models.zoo import ZOO

    entry = ZOO.get(model.name)
    if entry is None or not isinstance(entry.config, TransformerConfig):
        return None
    config = entry.config
    if (config.num_layers, config.hidden, config.heads) != (model.num_blocks, model.hidden, model.heads):
        return None
    return config


def _layout_problems(config) -> list[str]:
    """How a zoo model's layout differs from torchtitan's llama3 model (RoPE, pre-RMSNorm, SwiGLU, no biases,
    untied head, causal, standard attention)."""
    wants = {"activation": "swiglu", "norm": "rmsnorm", "norm_position": "pre", "position": "rope"}
    problems = [f"{key}={getattr(config, key)}" for key, value in wants.items() if getattr(config, key) != value]
    for flag in ("bias", "qkv_bias", "tied_embeddings", "dropout"):
        if getattr(config, flag):
            problems.append(flag)
    if not config.causal:
        problems.append("bidirectional encoder")
    if config.mla is not None:
        problems.append("multi-head latent attention")
    return problems


def torchtitan_model(model: ModelGraph) -> tuple[str, str, list[str]]:
    """(model name, flavor, README notes) for train.toml; UnsupportedPlan when torchtitan cannot build the model."""
    shape = model_shape(model)  # UnsupportedPlan for a model that is not a transformer
    if model.name in FLAVORS and _zoo_config(model) is not None:
        name, flavor = FLAVORS[model.name]
        return name, flavor, []
    if model.num_experts:
        raise UnsupportedPlan(f"torchtitan: {RELEASE} has no model that builds {model.name}'s mixture of experts; "
                              f"its MoE models are {MOE_MODELS}, with their own router and expert layouts")
    config = _zoo_config(model)
    problems = _layout_problems(config) if config is not None else (
        [] if shape["gated"] and not shape["tied"] else ["not a gated, untied Llama layout"])
    if problems:
        raise UnsupportedPlan(f"torchtitan: {RELEASE}'s llama3 model cannot build {model.name} "
                              f"({', '.join(problems)})")
    note = (f"{RELEASE} ships no flavor with the sizes of {model.name}: register flavor \"{model.name}\" in "
            f"torchtitan/models/llama3/__init__.py (`llama3_args`) as TransformerModelArgs(dim={shape['hidden']}, "
            f"n_layers={shape['num_layers']}, n_heads={shape['heads']}, n_kv_heads={shape['kv_heads']}, "
            f"vocab_size={shape['vocab']}), with ffn_dim_multiplier and multiple_of giving a feed-forward width "
            f"of {shape['ffn']}.")
    return "llama3", model.name, [note]
