"""The accessors that read an optional field as its resolved type (docs/design.md, Types): the value once it is
resolved, a clear error where code asks for one that is not there."""

from __future__ import annotations

import pytest

from models.graph import LayerKind
from models.transformer import TransformerConfig, build_transformer
from planner.strategy import parse_strategy


def test_data_parallel_is_dp_once_resolved():
    strategy = parse_strategy("tp=2,pp=2")
    assert strategy.dp is None
    with pytest.raises(ValueError, match="dp is not resolved"):
        strategy.data_parallel
    assert strategy.with_dp(16).data_parallel == 4  # 16 GPUs / (tp 2 x pp 2)
    assert parse_strategy("tp=2,dp=3").data_parallel == 3


def _config(**sizes) -> TransformerConfig:
    return TransformerConfig(name="t", num_layers=2, hidden=512, heads=8, ffn=1024, vocab=1000, **sizes)


def test_query_groups_and_kv_channels_resolve_the_defaults():
    plain = _config()
    assert (plain.query_groups, plain.kv_channels) == (8, 64)  # MHA; 512 / 8
    gqa = _config(kv_heads=2, head_dim=128)
    assert (gqa.query_groups, gqa.kv_channels) == (2, 128)


def test_layer_shapes_only_on_their_layers():
    graph = build_transformer(_config())
    attention = next(layer for layer in graph.layers if layer.kind == LayerKind.ATTENTION)
    mlp = next(layer for layer in graph.layers if layer.kind == LayerKind.MLP)
    assert (attention.attention_shape.heads, attention.attention_shape.kv_heads) == (8, 8)
    with pytest.raises(ValueError, match="not an attention layer"):
        mlp.attention_shape
    with pytest.raises(ValueError, match="not a mixture-of-experts layer"):
        attention.moe_shape
