"""StageSums' arithmetic is derived from each field's declared role (planner/cost/sums.py): sums add and scale with
a count of copies, maxima take the larger and stay."""

from __future__ import annotations

from dataclasses import fields

from planner.cost.sums import StageSums

# The quantities that are maxima over a stage's layers, not totals: the transients a backward holds at once
# (only one layer's at a time), the largest units gathered or re-materialised, and the widest boundary.
MAXIMA = {"working_set", "recompute_resaved", "recompute_attention", "recompute_ffn", "block_transient",
          "largest_layer_params", "largest_attention_params", "largest_ffn_params", "max_hidden"}


def test_every_field_declares_a_role():
    declared = {f.name: f.metadata.get("role") for f in fields(StageSums)}
    assert set(declared.values()) <= {"sum", "max"}, {k: v for k, v in declared.items() if v not in ("sum", "max")}
    assert {name for name, role in declared.items() if role == "max"} == MAXIMA


def test_addition_and_copies_by_hand():
    one = StageSums(forward=1.5, params=1e9, kept_activations=2e6, working_set=7e6, max_hidden=4096.0, layers=2,
                    largest_attention_params=3e7)
    two = StageSums(forward=0.25, params=5e8, kept_activations=1e6, working_set=3e6, max_hidden=8192.0, layers=3,
                    largest_attention_params=1e7, gather_calls=4.0)
    both = one + two
    assert (both.forward, both.params, both.kept_activations, both.layers, both.gather_calls) == (
        1.75, 1.5e9, 3e6, 5, 4.0)
    assert (both.working_set, both.max_hidden, both.largest_attention_params) == (7e6, 8192.0, 3e7)
    three = one.times(3)
    assert (three.forward, three.params, three.kept_activations, three.layers) == (4.5, 3e9, 6e6, 6)
    assert (three.working_set, three.max_hidden, three.largest_attention_params) == (7e6, 4096.0, 3e7)
    assert one.times(0) == StageSums() and one.times(-1) == StageSums()
    assert isinstance(both.layers, int) and isinstance(three.layers, int)


def test_every_field_combines_by_its_role():
    # distinct powers of two per field, the larger on alternating sides, so a sum can never equal a max
    names = [f.name for f in fields(StageSums)]
    left = {name: float(2 ** (2 * i)) if i % 2 else float(2 ** (2 * i + 1)) for i, name in enumerate(names)}
    right = {name: float(2 ** (2 * i + 1)) if i % 2 else float(2 ** (2 * i)) for i, name in enumerate(names)}
    left["layers"], right["layers"] = 4, 9
    both = StageSums(**left) + StageSums(**right)
    five = StageSums(**left).times(5)
    for name in names:
        if name in MAXIMA:
            assert getattr(both, name) == max(left[name], right[name]), name
            assert getattr(five, name) == left[name], name
        else:
            assert getattr(both, name) == left[name] + right[name], name
            assert getattr(five, name) == 5 * left[name], name
    assert sum((StageSums(**left), StageSums(**right), StageSums()), StageSums()) == both
