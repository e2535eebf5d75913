"""The configuration bounds hold on mixed clusters: every strategy of a configuration, on any pools, is no faster
than the bounds that prune it.

On a cluster of several pools a stage runs on one pool, at one pipeline position; the memory-aware bound
(`refined_bound`) and the tables' bottleneck bound (`ConfigTables.bottleneck_bound`) stand each stage at the
fastest its pool and position allow, and limit how many stages a pool hosts (and the former how many stages a
position class holds: planner.search.ilp.bounds.capacity).  Here the brute force
(`planner.search.exhaustive.configuration_strategies`: every split, recomputed blocks, pool per stage and
placement) scores every strategy of every configuration with `evaluate`, and each one that fits is held against
its configuration's bounds.  The jobs are chosen so that memory binds on the small pool (a 24 GB L4 or a 40 GB
A100 beside H100s): which stages fit where is what the bounds must get right.
"""

from __future__ import annotations

import pytest

from hardware import load_catalog
from planner.cost import evaluate
from planner.search.exhaustive import configuration_strategies
from planner.search.ilp.build import build_tables, stage_pools_for
from planner.search.ilp.tables import TableBuilder
from planner.search.space import SpaceOptions, global_configs, narrow_to_runtime
from test_compile import _cluster, _job, _model

# (slow pool preset, its GPUs, fast pool GPUs, layers, hidden, batch, seq): the default run's case scores about
# 5,000 strategies; the `long` ones about 20,000 each (about 40 CPU-s apiece)
CASES = [("pcie-l4", 2, 2, 4, 2048, 8, 4096)]
LONG_CASES = [("pcie-l4", 2, 2, 6, 2048, 8, 4096), ("pcie-l4", 4, 2, 5, 3072, 8, 2048),
              ("dgx-a100-40g", 2, 2, 6, 4096, 4, 4096)]


def assert_mixed_bounds_hold(job, space: SpaceOptions) -> tuple[int, int]:
    """(strategies that fit and were checked, configurations with a stage on each pool among them)."""
    catalog = load_catalog()
    builder = TableBuilder(job, catalog)
    checked, mixed = 0, set()
    for config in global_configs(job, space):
        pools = stage_pools_for(job, config)
        m = job.global_batch // (config.data_parallel * config.mbs)
        bound = None
        for strategy in configuration_strategies(job, config, space, offload=False):
            estimate = evaluate(job, strategy, catalog=catalog)
            if not estimate.memory.fits:
                continue
            if bound is None:
                # the tables without a time cap hold every stage's fastest fitting option on every pool
                tables = build_tables(builder, config, m, float("inf"))
                assert tables is not None, f"{strategy.spec()} fits, yet a stage of {config.spec()} has no option"
                bound = max(builder.lower_bound(config, pools, m), tables.bottleneck_bound(),
                            builder.refined_bound(config, pools, m, variants=({},), split=space.split_shape))
            assert bound <= estimate.step_time_s * (1 + 1e-9), (
                f"bound {bound!r} s of {config.spec()} above {strategy.spec()} at {estimate.step_time_s!r} s")
            checked += 1
            if strategy.stage_pools and len(set(strategy.stage_pools)) > 1:
                mixed.add(config.spec())
    return checked, len(mixed)


def _ids(cases: list[tuple]) -> list[str]:
    return [f"{c[0]}x{c[1]}-h100x{c[2]}-{c[3]}L-h{c[4]}" for c in cases]


@pytest.mark.parametrize("case", CASES + [pytest.param(c, marks=pytest.mark.long) for c in LONG_CASES],
                         ids=_ids(CASES + LONG_CASES))
def test_mixed_cluster_bounds_never_exceed_evaluate(case):
    slow, slow_gpus, fast_gpus, layers, hidden, batch, seq = case
    model = _model(layers, hidden, hidden // 128, hidden // 256, 3 * hidden, 32000)
    cluster = _cluster("mix", ("slow", slow, slow_gpus), ("fast", "dgx-h100", fast_gpus))
    job = _job(model, cluster, batch=batch, seq=seq)
    # no replica groups here (their shares are single-pool compiles); the configurations' own space, with
    # the memory-freeing options that change where a stage fits (ZeRO, micro-batch size) and no offload
    space = narrow_to_runtime(SpaceOptions(max_mbs=2, max_vpp=2, max_cp=1, zero_stages=(0, 1, 3),
                                           recompute_every=False, replica_groups=False), job.runtime, job)
    checked, mixed = assert_mixed_bounds_hold(job, space)
    assert checked > 0 and mixed > 0  # strategies fit, some of them with stages on both pools: the check ran
