"""The pure bounds of planner.search.ilp.bounds on hand-worked pipelines (their validity on real jobs is the
compile-equals-oracle property of tests/test_compile.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.ilp.bounds import (NS, bottleneck_bound, even_pipeline_bound, pipeline_fill_bound, slots_limit,
                                      stage_sum_bound)

# pool A: 1 s per block, pool B: 5 s per block, one stage slot each
A, B = [1.0, 2.0, 3.0], [5.0, 10.0]


def _best_two_stage(micro: float, blocks: int) -> float:
    """Brute force over the splits of `blocks` between a stage on A and one on B: (m - 1) max + sum."""
    best = float("inf")
    for on_a in range(1, blocks):
        t = (A[on_a - 1], B[blocks - on_a - 1]) if blocks - on_a <= len(B) and on_a <= len(A) else None
        if t:
            best = min(best, (micro - 1) * max(t) + sum(t))
    return best


def test_fill_bound_counts_the_slow_slot_every_stage_must_take():
    # both slots are stages: the best split is 2 blocks on A (2 s) and 1 on B (5 s): 3 x 5 + 7 = 22
    bound = pipeline_fill_bound([(A, 1), (B, 1)], stages=2, blocks=3, micro=4, chunks=1, start=0.0,
                                enough=float("inf"))
    assert bound == pytest.approx(22.0) == pytest.approx(_best_two_stage(4, 3))


def test_fill_bound_never_exceeds_the_optimum():
    for micro, blocks in itertools.product([1, 2, 8], [2, 3]):
        bound = pipeline_fill_bound([(A, 1), (B, 1)], 2, blocks, micro, 1, 0.0, float("inf"))
        assert bound <= _best_two_stage(micro, blocks) + 1e-12


def test_fill_bound_chooses_the_cheapest_slots_when_stages_are_fewer():
    # one stage of 3 blocks: the A slot alone, 3 s; (m - 1) x 3 + 3 with m = 4
    assert pipeline_fill_bound([(A, 1), (B, 1)], 1, 3, 4, 1, 0.0, float("inf")) == pytest.approx(12.0)
    # no limit reaches a feasible fill: the bound is `enough`
    assert pipeline_fill_bound([(A, 1), (B, 1)], 2, 6, 4, 1, 0.0, 99.0) == 99.0


def test_even_bound_and_one_block_per_slot():
    # two stages of one block each: bottleneck 5 (the B slot), sum 6, with two chunks: 3.5 x 5 + 6 / 2
    assert even_pipeline_bound([(A, 1), (B, 1)], 2, 1, 4, 2, float("inf")) == pytest.approx(20.5)
    assert even_pipeline_bound([(A, 1), (B, 1)], 2, 3, 4, 2, 77.0) == 77.0  # B cannot hold 3 blocks
    # the fluid limit alone would be 2.5 s (A holds T, B T / 5 blocks); every stage needs a block: 5 s
    assert slots_limit([(1.0, 0.0, 1), (5.0, 0.0, 1)], 2, 3) == pytest.approx(5.0)


def test_fill_bound_skips_a_pool_where_no_stage_fits():
    # a pool whose GPUs hold not even one block has no times: its slots take no stage, and the bound is the
    # other pools' (regression: the gallery's mixed cluster once raised IndexError here)
    assert pipeline_fill_bound([(A, 1), ([], 4)], 1, 3, 4, 1, 0.0, float("inf")) == pytest.approx(12.0)
    assert pipeline_fill_bound([([], 2), (B, 1)], 2, 3, 4, 1, 0.0, 99.0) == 99.0


def _best_split(profiles: list[list[float]], blocks: int, micro: int) -> tuple[float, float]:
    """Brute force over every split of `blocks` into one run per stage: (the least (m - 1) max + sum, the least
    bottleneck among the splits), each inf where no split has every stage within its profile."""
    best = least_max = float("inf")
    for cuts in itertools.combinations(range(1, blocks), len(profiles) - 1):
        sizes = [b - a for a, b in zip((0, *cuts), (*cuts, blocks))]
        if any(n > len(times) for n, times in zip(sizes, profiles)):
            continue
        t = [times[n - 1] for n, times in zip(sizes, profiles)]
        if max(t) < float("inf"):
            best, least_max = min(best, (micro - 1) * max(t) + sum(t)), min(least_max, max(t))
    return best, least_max


PROFILE = st.lists(st.one_of(st.integers(1, 60).map(float), st.just(float("inf"))), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(profiles=st.lists(PROFILE, min_size=1, max_size=4), blocks=st.integers(1, 10), micro=st.integers(1, 8))
def test_stage_sum_bound_never_exceeds_the_best_split(profiles, blocks, micro):
    best, least_max = _best_split(profiles, blocks, micro)
    if best == float("inf"):
        return  # no split: bottleneck_bound's limit is inf there and this bound is not asked
    # from the least bottleneck a split reaches (or any start below it: a pool's slots may set a higher one)
    assert stage_sum_bound(profiles, blocks, micro, least_max) <= best + 1e-9
    assert stage_sum_bound(profiles, blocks, micro, 0.0) <= best + 1e-9


def test_stage_sum_bound_counts_every_block_not_only_the_first():
    # three stages of 1 s per block holding 9 blocks: at best 3 s each, (4 - 1) x 3 + 9; the one-block floor
    # (bottleneck_bound alone) would give 3 x 3 + 3
    linear = [float(n) for n in range(1, 8)]
    assert stage_sum_bound([linear] * 3, 9, 4, 3.0) == pytest.approx(18.0) == pytest.approx(
        _best_split([linear] * 3, 9, 4)[0])
    # a bottleneck set above every stage's own times (the pools' slots): still a bound, from that limit
    assert stage_sum_bound([linear] * 3, 9, 4, 10.0) == pytest.approx(3 * 10.0 + 9)


def test_tables_bound_charges_the_slow_slot_in_the_sum():
    # two stages, each on pool A (1 s a block, one slot) or B (5 s a block, one slot): one stage must take B.  The
    # best split is 2 blocks on A and 1 on B: 3 x 5 + 7 = 22.  The bottleneck alone gives 3 x 5 plus the stages'
    # fastest single blocks (17); per stage (any pool) the sum is 3 blocks at A's 1 s (18); per pool slot, 22.
    a = [(int(t * NS), n) for n, t in enumerate(A, start=1)]
    b = [(int(t * NS), n) for n, t in enumerate(B, start=1)]
    stage = sorted(a + b)
    bound = bottleneck_bound([stage, stage], 3, 4, 1, None, [(a + a, 1), (b + b, 1)])
    assert bound == pytest.approx(22.0) == pytest.approx(_best_two_stage(4, 3))
    # without the pools' slots both stages may sit on A: 2 + 1 blocks, 3 x 2 + 3
    assert bottleneck_bound([stage, stage], 3, 4, 1, None, None) == pytest.approx(3 * 2.0 + 3)
