"""Import a Hugging Face `config.json` as a model graph.

Supported `model_type`s map onto TransformerConfig (keys as in the
transformers configuration classes):

* llama, mistral, qwen2, mixtral: RMSNorm, RoPE, gated MLP (silu -> swiglu,
  gelu -> geglu); head_dim when given; Qwen2 always has Q/K/V biases; Llama
  `attention_bias` sets Q/K/V biases and, with `mlp_bias`, all biases (an
  attention-only o_proj bias is not represented: h params per layer).
  Mixtral: num_local_experts, num_experts_per_tok, experts of intermediate_size.
* gpt2: n_layer, n_embd, n_head, n_inner (default 4 n_embd), n_positions;
  learned positions, tied head, biases, dropout when resid_pdrop > 0.
* gpt_neox: LayerNorm, biases, rotary (rotary_pct has no params), untied
  embed_out; the parallel residual has the same params and activations.
* deepseek_v3: MLA (q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim,
  v_head_dim) and MoE (n_routed_experts, num_experts_per_tok,
  n_shared_experts, moe_intermediate_size, first_k_dense_replace,
  moe_layer_freq).  The multi-token-prediction layers
  (num_nextn_predict_layers) are not built: they are a training auxiliary
  outside the published 671B.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from models.errors import ModelInputError
from models.graph import ModelGraph
from models.spec import format_validation_error, parse_json, read_text
from models.transformer import TransformerConfig, build_transformer
from models.yamlio import as_name

_COMMON = {
    "num_layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn": "intermediate_size",
    "vocab": "vocab_size", "max_positions": "max_position_embeddings",
}


class _Config:
    """Key access to a config dict that reports missing keys as `where: key: missing`."""

    def __init__(self, data: Mapping[str, Any], where: str):
        self.data, self.where = data, where

    def req(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise ModelInputError(f"{self.where}: {key}: missing")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def dropout(self, *keys: str) -> bool:
        return any(isinstance(self.get(k, 0), (int, float)) and self.get(k, 0) > 0 for k in keys)


def _activation(name: str, gated: bool) -> str:
    name = str(name).lower()
    if "relu" in name:
        return "squared_relu" if "relu2" in name or "squared" in name else "relu"
    if gated:
        return "geglu" if name.startswith("gelu") else "swiglu"
    return "gelu"


def _llama_like(c: _Config) -> tuple[dict, dict]:
    model_type = c.get("model_type")
    attention_bias = bool(c.get("attention_bias", False))
    kw = dict(
        num_layers=c.req("num_hidden_layers"), hidden=c.req("hidden_size"), heads=c.req("num_attention_heads"),
        kv_heads=c.get("num_key_value_heads"), head_dim=c.get("head_dim"), ffn=c.req("intermediate_size"),
        vocab=c.req("vocab_size"), max_positions=c.get("max_position_embeddings", 4096),
        activation=_activation(c.get("hidden_act", "silu"), gated=True), norm="rmsnorm", position="rope",
        tied_embeddings=bool(c.get("tie_word_embeddings", False)), dropout=c.dropout("attention_dropout"),
        bias=attention_bias and bool(c.get("mlp_bias", False)),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
    )
    rename = dict(_COMMON)
    if model_type == "mixtral":
        kw["moe"] = dict(num_experts=c.req("num_local_experts"), top_k=c.req("num_experts_per_tok"),
                         expert_ffn=c.req("intermediate_size"))
        rename.update({"moe.num_experts": "num_local_experts", "moe.top_k": "num_experts_per_tok",
                       "moe.expert_ffn": "intermediate_size"})
    return kw, rename


def _gpt2(c: _Config) -> tuple[dict, dict]:
    hidden = c.req("n_embd")
    kw = dict(
        num_layers=c.req("n_layer"), hidden=hidden, heads=c.req("n_head"),
        ffn=c.get("n_inner") or (4 * hidden if isinstance(hidden, int) else hidden),
        vocab=c.req("vocab_size"), max_positions=c.get("n_positions", 1024),
        activation=_activation(c.get("activation_function", "gelu_new"), gated=False), norm="layernorm",
        bias=True, position="learned", tied_embeddings=bool(c.get("tie_word_embeddings", True)),
        dropout=c.dropout("resid_pdrop", "attn_pdrop", "embd_pdrop") if "resid_pdrop" in c.data else True,
    )
    rename = {"num_layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn": "n_inner",
              "vocab": "vocab_size", "max_positions": "n_positions"}
    return kw, rename


def _gpt_neox(c: _Config) -> tuple[dict, dict]:
    kw = dict(
        num_layers=c.req("num_hidden_layers"), hidden=c.req("hidden_size"), heads=c.req("num_attention_heads"),
        ffn=c.req("intermediate_size"), vocab=c.req("vocab_size"),
        max_positions=c.get("max_position_embeddings", 2048),
        activation=_activation(c.get("hidden_act", "gelu"), gated=False), norm="layernorm",
        bias=bool(c.get("attention_bias", True)), position="rope",
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        dropout=c.dropout("attention_dropout", "hidden_dropout"),
    )
    return kw, dict(_COMMON)


def _deepseek_v3(c: _Config) -> tuple[dict, dict]:
    heads = c.req("num_attention_heads")
    kw = dict(
        num_layers=c.req("num_hidden_layers"), hidden=c.req("hidden_size"), heads=heads,
        kv_heads=heads,  # MLA expands the latent to every head; num_key_value_heads equals heads
        ffn=c.req("intermediate_size"), vocab=c.req("vocab_size"),
        max_positions=c.get("max_position_embeddings", 4096),
        activation=_activation(c.get("hidden_act", "silu"), gated=True), norm="rmsnorm", position="rope",
        bias=bool(c.get("attention_bias", False)), tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        dropout=c.dropout("attention_dropout"),
        mla=dict(q_lora_rank=c.get("q_lora_rank"), kv_lora_rank=c.req("kv_lora_rank"),
                 qk_nope_head_dim=c.req("qk_nope_head_dim"), qk_rope_head_dim=c.req("qk_rope_head_dim"),
                 v_head_dim=c.req("v_head_dim")),
    )
    if c.get("n_routed_experts"):
        kw["moe"] = dict(num_experts=c.req("n_routed_experts"), top_k=c.req("num_experts_per_tok"),
                         shared_experts=c.get("n_shared_experts", 0), expert_ffn=c.req("moe_intermediate_size"),
                         first_dense_layers=c.get("first_k_dense_replace", 0), every=c.get("moe_layer_freq", 1),
                         router_groups=c.get("n_group") or 1, router_group_topk=c.get("topk_group") or 1)
    rename = dict(_COMMON)
    rename.update({f"mla.{k}": k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                           "qk_rope_head_dim", "v_head_dim")})
    rename.update({"moe.num_experts": "n_routed_experts", "moe.top_k": "num_experts_per_tok",
                   "moe.shared_experts": "n_shared_experts", "moe.expert_ffn": "moe_intermediate_size",
                   "moe.first_dense_layers": "first_k_dense_replace", "moe.every": "moe_layer_freq",
                   "moe.router_groups": "n_group", "moe.router_group_topk": "topk_group"})
    return kw, rename


_MAPPERS = {
    "llama": _llama_like, "mistral": _llama_like, "mixtral": _llama_like, "qwen2": _llama_like,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "deepseek_v3": _deepseek_v3,
}
SUPPORTED = tuple(sorted(_MAPPERS))


def _default_name(data: Mapping[str, Any], path: Path | None) -> str:
    # read off the config or its file name, which may hold any character: made a name, not refused
    return as_name(_raw_name(data, path), "hf-model")


def _raw_name(data: Mapping[str, Any], path: Path | None) -> str:
    if data.get("_name_or_path"):
        return str(data["_name_or_path"]).rstrip("/").split("/")[-1]
    if path is None:
        return str(data.get("model_type", "hf-model"))
    if path.name == "config.json":
        return path.parent.name or "hf-model"
    return path.name.removesuffix(".json").removesuffix(".config")


# values launch files need that size nothing: TransformerConfig field -> the HF keys that record it, first found
_FACTS = {"rope_theta": ("rope_theta", "rotary_emb_base"),
          "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")}


def _training_facts(c: _Config) -> tuple[dict[str, Any], dict[str, str]]:
    """(rope_theta and norm_eps where the config records them, e.g. Llama 3.1's 500000 and 1e-5 or Qwen2.5's
    1e-6; the HF key each came from, for error messages)."""
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for field, names in _FACTS.items():
        found = next((name for name in names if c.get(name) is not None), None)
        if found is not None:
            values[field], keys[field] = c.get(found), found
    return values, keys


def hf_config_to_transformer(data: Mapping[str, Any], where: str = "config.json", name: str | None = None,
                             path: Path | None = None) -> TransformerConfig:
    """Map a parsed config.json onto a TransformerConfig (errors name `where` and the HF key)."""
    c = _Config(data, where)
    model_type = c.req("model_type")
    if not isinstance(model_type, str) or model_type not in _MAPPERS:  # a list is unhashable
        raise ModelInputError(f"{where}: model_type: unsupported '{model_type}'; supported: {', '.join(SUPPORTED)}")
    kw, rename = _MAPPERS[model_type](c)
    facts, keys = _training_facts(c)
    kw.update(facts)
    rename = {**rename, **keys}
    kw = {k: v for k, v in kw.items() if v is not None}
    model_name = name or _default_name(data, path)
    kw.update(name=model_name, source=f"Hugging Face config.json ({where}, model_type {model_type})")
    try:
        return TransformerConfig(**kw)
    except ValidationError as err:
        raise ModelInputError(format_validation_error(where, err, rename=rename)) from None


def load_hf_config(source: str | Path | Mapping[str, Any], name: str | None = None) -> ModelGraph:
    """Build a graph from a Hugging Face config.json file (or its parsed dict)."""
    if isinstance(source, Mapping):
        return build_transformer(hf_config_to_transformer(source, "config.json", name))
    path = Path(source)
    data = parse_json(read_text(path, "Hugging Face config.json"), str(source))
    if not isinstance(data, dict):
        raise ModelInputError(f"{source}: expected a JSON object, got {type(data).__name__}")
    return build_transformer(hf_config_to_transformer(data, str(source), name, path))
