"""Model IR builders, zoo, spec files and HF import."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
import yaml

import models
from models import (
    DLRMConfig, LayerKind, ModelInputError, TransformerConfig, build_dlrm, build_transformer, get_model,
    list_models, load_hf_config, load_model, load_model_file,
)
from models.transformer import gpt, llama
from models.zoo import ZOO
from models.zoo.recsys import criteo_rows, meta_2021_csv, meta_2021_synthetic_tables

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "fixtures" / "hf"
EXAMPLES = ROOT / "examples" / "models"


# --------------------------------------------------------------------------- zoo counts


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_params_match_published(name):
    entry = ZOO[name]
    graph = entry.builder()
    assert graph.name == name
    assert graph.source
    assert entry.source
    assert graph.params == pytest.approx(entry.published_params, rel=0.01)


@pytest.mark.parametrize(
    "name, active", [("mixtral-8x7b", 12.9e9), ("mixtral-8x22b", 39e9), ("deepseek-v3", 37e9)]
)
def test_moe_active_params(name, active):
    graph = get_model(name)
    assert graph.active_params == pytest.approx(active, rel=0.03)
    assert graph.active_params < graph.params
    assert ZOO[name].published_active_params == active


def test_list_models_sorted_and_complete():
    names = [entry.name for entry in list_models()]
    assert names == sorted(names)
    required = {"gpt2-xl", "gpt3-175b", "bert-large", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                "llama3-70b", "llama3-405b", "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "nemotron-4-340b",
                "deepseek-v3", "dlrm-criteo-kaggle", "dlrm-criteo-terabyte", "tiny-llama"}
    assert required <= set(names)


@pytest.mark.parametrize("name", [n for n in sorted(ZOO) if get_model(n).family != "recsys"])
def test_decoder_layer_naming(name):
    graph = get_model(name)
    layers = graph.layers
    assert layers[0].name == "embedding" and layers[0].kind == LayerKind.EMBEDDING and layers[0].block is None
    assert [layer.name for layer in layers[-2:]] == ["final_norm", "head"]
    assert layers[-2].kind == LayerKind.NORM and layers[-1].kind == LayerKind.HEAD
    body = layers[1:-2]
    assert len(body) == 2 * graph.num_blocks
    for i in range(graph.num_blocks):
        att, ff = body[2 * i], body[2 * i + 1]
        assert att.name == f"block.{i}.attention" and att.kind == LayerKind.ATTENTION and att.block == i
        assert att.attention is not None and att.tp_splittable
        assert ff.name in (f"block.{i}.mlp", f"block.{i}.moe") and ff.block == i
        assert (ff.kind == LayerKind.MOE) == (ff.moe is not None)
    assert all(layer.hidden == graph.hidden for layer in layers)


def test_tied_head():
    graph = get_model("gpt2-xl")
    head = graph.layers[-1]
    assert head.params == 0 and head.tied_params == 50257 * 1600
    untied = get_model("llama3-8b").layers[-1]
    assert untied.params == 128256 * 4096 and untied.tied_params == 0
    assert untied.flops_per_token == 2 * 4096 * 128256


def test_matmul_flops_are_twice_the_weights():
    # No biases: every non-embedding, non-norm weight is a matmul weight a token uses.
    graph = get_model("llama3-8b")
    h = graph.hidden
    norms = (2 * graph.num_blocks + 1) * h
    embedding = graph.layers[0].params
    fwd = sum(layer.flops_per_token for layer in graph.layers)
    assert fwd == 2 * (graph.params - embedding - norms)
    att = graph.layers[1]
    assert att.flops_per_token_per_seq == 4 * 32 * 128


def test_deepseek_structure():
    graph = get_model("deepseek-v3")
    kinds = [layer.kind for layer in graph.layers if layer.name.endswith((".mlp", ".moe"))]
    assert kinds[:3] == [LayerKind.MLP] * 3 and set(kinds[3:]) == {LayerKind.MOE} and len(kinds) == 61
    att = graph.layers[1]
    assert att.attention.head_dim == 192 and att.attention.kv_heads == 128
    assert att.flops_per_token_per_seq == 2 * 128 * 192 + 2 * 128 * 128
    moe = graph.layers[8]
    assert moe.moe.num_experts == 256 and moe.moe.top_k == 8 and moe.moe.shared_experts == 1
    assert moe.flops_per_token == 2 * (9 * 3 * 7168 * 2048 + 7168 * 256)
    assert graph.num_experts == 256


def test_bert_is_encoder():
    graph = get_model("bert-large")
    assert graph.family == "encoder"
    assert graph.layers[1].attention.causal is False
    assert graph.layers[-2].params == 0  # post-norm: no final norm


# --------------------------------------------------------------------------- activations


H, A, S, B = 1024, 16, 2048, 2


def _gpt_block():
    cfg = gpt(name="g", num_layers=1, hidden=H, heads=A, vocab=50257)
    graph = build_transformer(cfg)
    return graph.blocks()[0]


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_tensor_parallel(t):
    block = _gpt_block()
    got = sum(layer.saved_activation_bytes(B, S, tp=t, flash_attention=False) for layer in block)
    assert got == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)), rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_sequence_parallel(t):
    block = _gpt_block()
    got = sum(
        layer.saved_activation_bytes(B, S, tp=t, sequence_parallel=True, flash_attention=False) for layer in block
    )
    assert got == pytest.approx(S * B * H * (34 + 5 * A * S / H) / t, rel=1e-12)
    selective = sum(
        layer.saved_activation_bytes(B, S, tp=t, sequence_parallel=True, recompute="selective", flash_attention=False)
        for layer in block
    )
    assert selective == pytest.approx(34 * S * B * H / t, rel=1e-12)


def test_full_recompute_keeps_layer_input():
    att, mlp = _gpt_block()
    assert att.saved_activation_bytes(B, S, recompute="full") == 2 * S * B * H
    assert mlp.saved_activation_bytes(B, S, recompute="full") == 0  # the block input is held once, by attention


def test_gqa_swiglu_activation_terms():
    graph = get_model("llama3-8b")
    att, mlp = graph.layers[1], graph.layers[2]
    assert att.act_tp_split == 2 * 4096 + 4 * 1024 + 2 * 4096
    assert att.act_replicated == 4 * 4096 and att.act_attn_scores == 2 * 32
    assert mlp.act_tp_split == 6 * 14336


# --------------------------------------------------------------------------- DLRM


def test_dlrm_networkx_fan_in():
    graph = get_model("dlrm-criteo-kaggle")
    g = graph.to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    preds = set(g.predecessors("interaction"))
    assert preds == {f"table.{j}" for j in range(26)} | {"bottom_mlp.3"}
    assert list(g.successors("interaction")) == ["top_mlp.0"]
    assert g.in_degree("table.0") == 0
    top0 = next(layer for layer in graph.layers if layer.name == "top_mlp.0")
    assert top0.params == (27 * 26 // 2 + 16) * 512 + 512


def test_dlrm_tables_from_csv():
    rows = criteo_rows()
    assert len(rows) == 26
    tb = get_model("dlrm-criteo-terabyte")
    tables = [layer for layer in tb.layers if layer.kind == LayerKind.EMBEDDING_BAG]
    assert [t.table.rows for t in tables] == [int(r["terabyte_rows_full"]) for r in rows]
    assert [t.table.pooling_factor for t in tables] == [float(r["mlperf_dcnv2_multi_hot_size"]) for r in rows]
    assert all(t.table.dim == 128 and t.params == t.table.rows * 128 for t in tables)
    kaggle = get_model("dlrm-criteo-kaggle")
    assert sum(layer.table.rows for layer in kaggle.layers if layer.table) == sum(int(r["kaggle_rows"]) for r in rows)


def test_meta_2021_tables_file_is_what_the_seeded_draw_gives():
    # the zoo reads the file (no numpy at start-up); the draw (numpy, seed 2021) is the source of truth
    drawn = meta_2021_synthetic_tables()
    written = (Path(models.__file__).parent / "data" / "meta_2021_synthetic_tables.csv").read_text()
    assert written == meta_2021_csv(drawn)
    tables = [layer.table for layer in get_model("dlrm-meta-2021-synthetic").layers if layer.table is not None]
    assert tables == drawn and len(tables) == 856


def test_dlrm_dot_needs_matching_dims():
    with pytest.raises(ValueError, match="bottom_mlp"):
        DLRMConfig(name="x", bottom_mlp=[8], top_mlp=[1], tables=[{"rows": 10, "dim": 4}])
    graph = build_dlrm(DLRMConfig(name="x", bottom_mlp=[8], top_mlp=[1], tables=[{"rows": 10, "dim": 4}],
                                  interaction="cat"))
    assert graph.family == "recsys" and graph.params == 13 * 8 + 8 + 40 + 12 + 1


# --------------------------------------------------------------------------- HF import


@pytest.mark.parametrize(
    "fixture, zoo",
    [("llama3-8b", "llama3-8b"), ("mistral-7b", "mistral-7b"), ("mixtral-8x7b", "mixtral-8x7b"),
     ("qwen2-7b", "qwen2-7b"), ("gpt2-xl", "gpt2-xl"), ("gpt-neox-20b", "gpt-neox-20b"),
     ("deepseek-v3", "deepseek-v3")],
)
def test_hf_import_matches_zoo(fixture, zoo):
    path = HF / f"{fixture}.config.json"
    graph = load_model(str(path))  # recognised by model_type
    ref = get_model(zoo)
    assert graph.name == fixture
    assert graph.params == pytest.approx(ref.params, rel=0.01)
    assert graph.params == pytest.approx(ZOO[zoo].published_params, rel=0.01)
    assert graph.active_params == pytest.approx(ref.active_params, rel=0.01)
    assert [layer.name for layer in graph.layers] == [layer.name for layer in ref.layers]


def test_hf_dict_and_name():
    data = json.loads((HF / "llama3-8b.config.json").read_text())
    graph = load_hf_config(data, name="mine")
    assert graph.name == "mine" and graph.params == get_model("llama3-8b").params


def test_gpt_neox_published():
    assert load_hf_config(HF / "gpt-neox-20b.config.json").params == pytest.approx(20.55e9, rel=0.01)


# --------------------------------------------------------------------------- spec files


def test_examples_load():
    tiny = load_model_file(EXAMPLES / "tiny-llama.yaml")
    assert tiny.model_dump(exclude={"source"}) == get_model("tiny-llama").model_dump(exclude={"source"})
    custom = load_model(str(EXAMPLES / "gpt-custom.yaml"))
    assert custom.params == pytest.approx(1.3e9, rel=0.02)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_spec_round_trip_from_zoo_config(tmp_path, name):
    cfg = ZOO[name].config
    if isinstance(cfg, TransformerConfig):
        spec = {"builder": "transformer", **cfg.to_spec()}
    else:
        spec = {"builder": "dlrm", **cfg.model_dump()}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_model_file(path) == get_model(name)


def test_spec_raw_ir_round_trip(tmp_path):
    for name in ("tiny-llama", "dlrm-criteo-kaggle"):
        graph = get_model(name)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(graph.model_dump(mode="json")))
        assert load_model(str(path)) == graph


def test_spec_zoo_overrides(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text("zoo: llama3-8b\noverrides: {name: small, num_layers: 4, hidden: 2048}\n")
    graph = load_model_file(path)
    assert graph.name == "small" and graph.num_blocks == 4 and graph.hidden == 2048
    assert graph.layers[1].attention.head_dim == 64  # re-derived from the new hidden
    path.write_text("zoo: deepseek-v3\noverrides: {num_layers: 5, moe: {top_k: 2}}\n")
    graph = load_model_file(path)
    assert graph.layers[-3].moe.top_k == 2 and graph.layers[-3].moe.num_experts == 256


# --------------------------------------------------------------------------- errors


def _error(fn, *args) -> str:
    with pytest.raises(ModelInputError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def _spec(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_error_unknown_zoo_name():
    msg = _error(get_model, "llama3-8")
    assert "unknown model 'llama3-8'" in msg and "llama3-8b" in msg and "known:" in msg
    msg = _error(load_model, "no-such-model")
    assert "not a zoo name nor an existing file" in msg


def test_error_bad_yaml(tmp_path):
    path = _spec(tmp_path, "builder: llama\nname: [unclosed\n")
    msg = _error(load_model_file, path)
    assert msg.startswith(f"{path}: not valid YAML:") and "line" in msg


def test_error_bad_json(tmp_path):
    path = _spec(tmp_path, '{"builder": "llama",', name="spec.json")
    assert _error(load_model, str(path)).startswith(f"{path}: not valid JSON:")


def test_error_negative_hidden(tmp_path):
    path = _spec(tmp_path, "builder: llama\nname: x\nnum_layers: 2\nhidden: -1\nheads: 4\nffn: 8\nvocab: 10\n")
    assert _error(load_model_file, path) == f"{path}: hidden: Input should be greater than 0"


def test_error_unknown_key(tmp_path):
    path = _spec(tmp_path, "builder: transformer\nname: x\nnum_layers: 2\nhiden: 64\nhidden: 64\n"
                           "heads: 4\nffn: 8\nvocab: 10\n")
    assert _error(load_model_file, path) == f"{path}: hiden: Extra inputs are not permitted"


def test_error_nested_and_cross_field(tmp_path):
    path = _spec(tmp_path, "builder: dlrm\nname: x\nbottom_mlp: [4]\ntop_mlp: [1]\ntables: [{rows: 0, dim: 4}]\n")
    assert _error(load_model_file, path) == f"{path}: tables.0.rows: Input should be greater than 0"
    path = _spec(tmp_path, "builder: llama\nname: x\nnum_layers: 2\nhidden: 64\nheads: 4\nkv_heads: 3\n"
                           "ffn: 8\nvocab: 10\n")
    assert "kv_heads" in _error(load_model_file, path)
    path = _spec(tmp_path, "zoo: tiny-llama\noverrides: {num_layers: 0}\n")
    assert _error(load_model_file, path) == f"{path}: overrides.num_layers: Input should be greater than 0"


def test_error_unknown_builder_and_shape(tmp_path):
    msg = _error(load_model_file, _spec(tmp_path, "builder: lama\nname: x\n"))
    assert "builder: unknown 'lama'" in msg and "llama" in msg
    assert "expected 'builder'" in _error(load_model_file, _spec(tmp_path, "name: x\n"))
    assert "mapping" in _error(load_model_file, _spec(tmp_path, "- 1\n- 2\n"))
    assert "zoo: unknown model" in _error(load_model_file, _spec(tmp_path, "zoo: gpt5\n"))
    assert "cannot read" in _error(load_model_file, tmp_path / "missing.yaml")


def test_error_unsupported_model_type(tmp_path):
    msg = _error(load_hf_config, {"model_type": "xyz"})
    assert msg.startswith("config.json: model_type: unsupported 'xyz'; supported:") and "deepseek_v3" in msg
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "xyz"}))
    assert _error(load_model, str(path)).startswith(f"{path}: model_type: unsupported 'xyz'")


def test_error_hf_missing_and_invalid(tmp_path):
    data = json.loads((HF / "llama3-8b.config.json").read_text())
    del data["hidden_size"]
    assert _error(load_hf_config, data) == "config.json: hidden_size: missing"
    data = json.loads((HF / "mixtral-8x7b.config.json").read_text())
    data["num_experts_per_tok"] = 0
    assert _error(load_hf_config, data) == "config.json: num_experts_per_tok: Input should be greater than 0"


def test_config_validation_names_field():
    with pytest.raises(ValueError, match="kv_heads"):
        llama(name="x", num_layers=1, hidden=64, heads=4, kv_heads=3, ffn=8, vocab=10)
    with pytest.raises(ValueError, match="head_dim"):
        llama(name="x", num_layers=1, hidden=65, heads=4, ffn=8, vocab=10)
    with pytest.raises(ValueError, match="top_k"):
        llama(name="x", num_layers=1, hidden=64, heads=4, ffn=8, vocab=10,
              moe={"num_experts": 2, "top_k": 3, "expert_ffn": 8})


def test_exports():
    # every name in __all__ imports (a stale entry fails the star import) and is the models package's own object
    namespace: dict = {}
    exec("from models import *", namespace)
    exported = {name: obj for name, obj in namespace.items() if name != "__builtins__"}
    assert set(exported) == set(models.__all__)
    for name, obj in exported.items():
        owner = getattr(obj, "__module__", None) or type(obj).__module__
        assert name == "ZOO" or owner.split(".")[0] == "models", (name, owner)
    assert exported["ZOO"] is ZOO and exported["get_model"] is get_model


@pytest.mark.parametrize("fixture", ["llama3-8b", "mistral-7b", "mixtral-8x7b", "qwen2-7b", "gpt2-xl", "gpt-neox-20b",
                                     "deepseek-v3"])
def test_hf_import_keeps_rope_theta_and_norm_epsilon_for_the_launch_files(fixture):
    # issue #27: values that size nothing but a framework's model config reads; Megatron's arguments for the
    # imported model (its own name, so no zoo table applies) carry the config's values, which are the zoo's
    from planner.emit.megatron_model import architecture, architecture_args

    data = json.loads((HF / f"{fixture}.config.json").read_text())
    graph = load_hf_config(data, name=f"imported-{fixture}")
    theta = data.get("rope_theta", data.get("rotary_emb_base"))
    eps = data.get("rms_norm_eps", data.get("layer_norm_eps", data.get("layer_norm_epsilon")))
    assert (graph.rope_theta, graph.norm_eps) == (theta, eps)
    if fixture == "deepseek-v3":
        return  # multi-latent attention is read off zoo models only (Megatron's arguments need the zoo's config)
    args, notes = architecture_args(architecture(graph), 1024)
    zoo_args, _ = architecture_args(architecture(get_model(fixture)), 1024)
    assert args["norm-epsilon"] == eps == zoo_args["norm-epsilon"]
    if "rotary-base" in zoo_args:
        assert args["rotary-base"] == theta == zoo_args["rotary-base"]
    assert not any("rotary base" in n.lower() or "norm epsilon" in n.lower() for n in notes), notes
