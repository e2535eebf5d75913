"""What the table builder shares between configurations and between stage lengths changes no entry.

`TableBuilder.placed_options` shares a stage's options among configurations that differ only in pp where the
stage reads the same of its position (1F1B: first or last, micro-batches in flight, which sends cross the
fabric): a middle stage of pp 8 at index 3 holds what one of pp 12 at index 7 does.  `build_tables` starts each
stage length's search for its fewest recomputed blocks at what one block fewer needed.  Here one builder walks
every pipeline degree of a configuration (so later ones hit the earlier ones' entries) and each table is held
against the reference: a fresh builder per configuration, every content asked for on its own (no floors).  A
cost term that read more of a stage's position than its key, or a recompute count that fell as a stage grew,
would show as a differing entry.
"""

from __future__ import annotations

import pytest

from hardware import load_catalog, load_cluster
from models import load_model
from planner.job import Job
from planner.profile import load_runtime
from planner.search.ilp.build import build_tables, stage_pools_for
from planner.search.ilp.segments import stage_contents
from planner.search.ilp.tables import TableBuilder
from planner.strategy import Strategy
from test_compile import _cluster

MIXED = _cluster("l4-h100", ("l4", "pcie-l4", 8), ("h100", "dgx-h100", 8))


def _reference(job: Job, config: Strategy, m: int, cap: float) -> list | None:
    """Every stage's options, each content from a fresh builder's placed_options with no floors (None: a stage
    has none), in build_tables' own stage, pool and length order."""
    builder = TableBuilder(job, load_catalog())
    pools = stage_pools_for(job, config) if len(job.cluster.pools) > 1 else list(job.cluster.pools)
    bounds = tuple((seg.start - builder.segments[0].start, seg.end - builder.segments[0].start)
                   for seg in builder.segments)
    blocks = sum(seg.size for seg in builder.segments)
    out = []
    for stage in range(config.pp):
        per_pool = []
        for pool in pools:
            site = builder.site(stage, (pool,))
            found = {}
            for length in range(1, blocks - config.pp + 2):
                fresh = 0
                for counts in stage_contents(bounds, length):
                    placed = builder.placed_options(stage, counts, config, ({},), site, m, cap)
                    if placed:
                        found[counts], fresh = placed, fresh + 1
                if not fresh:
                    break
            per_pool.append(found)
        if not any(per_pool):
            return None
        out.append(per_pool)
    return out


def _entries(options: list | None) -> list | None:
    """The numbers of every option (and its composed peak memory), stage by stage."""
    if options is None:
        return None
    return [[{counts: [(o.recompute, o.time, o.fill, o.dp_end, o.optimizer, o.offload, o.variant,
                        o.cost.memory.total) for o in placed] for counts, placed in per_pool.items()}
             for per_pool in stage] for stage in options]


@pytest.mark.parametrize("model, cluster, batch, seq, runtime, base", [
    # memory binds on the L4s: the early stages recompute, more of them the more micro-batches they hold
    ("llama3-8b", MIXED, 64, 4096, "planner", {"tp": 2, "dp": 2, "mbs": 1, "zero": 1}),
    # one node, ranks per stage below a node: which boundary crosses the fabric depends on the stage
    ("llama3-8b", load_cluster("dgx-a100-80g:2"), 32, 8192, "megatron", {"tp": 1, "dp": 1, "mbs": 1, "zero": 1}),
], ids=["mixed-pools", "one-pool"])
def test_shared_and_floored_options_equal_the_reference(model, cluster, batch, seq, runtime, base):
    job = Job(model=load_model(model), cluster=cluster, global_batch=batch, seq_len=seq, memory_margin=0.1,
              runtime=load_runtime(runtime))
    shared = TableBuilder(job, load_catalog())
    checked = hits = 0
    for pp in (4, 8, 2, 16, 6):
        config = Strategy(pp=pp, **base)
        m = batch // (config.data_parallel * config.mbs)
        for cap in (float("inf"), 0.4):
            before = len(shared._placed_cache)
            tables = build_tables(shared, config, m, cap)
            assert _entries(tables.options if tables else None) == _entries(_reference(job, config, m, cap)), (
                f"pp={pp} cap={cap}")
            checked += 1
            hits += len(shared._placed_cache) == before
    assert checked == 10
    # the check saw sharing: the second cap re-reads every content the first computed
    assert hits >= 5


def test_an_earlier_middle_stage_is_never_faster_on_a_mixed_cluster():
    """build_tables' prune_at stands the earlier middle stages in with the last one's options: that is a bound only
    if no earlier middle stage holds a content the last one does not, or runs one faster (on a pool where memory
    binds, with a placement that offloads as well)."""
    from planner.search.space import SpaceOptions, placement_variants
    job = Job(model=load_model("llama3-8b"), cluster=MIXED, global_batch=64, seq_len=4096, memory_margin=0.1,
              runtime=load_runtime("planner"))
    builder = TableBuilder(job, load_catalog())
    compared = slower = relaxed_seen = 0
    for pp, mbs, zero in ((4, 2, 0), (6, 4, 1), (8, 4, 3), (8, 1, 1), (6, 2, 3)):
        config = Strategy(pp=pp, tp=1, dp=2, mbs=mbs, zero=zero)
        m = 64 // (config.data_parallel * mbs)
        variants = placement_variants(job, config, SpaceOptions(), offload=True)
        tables = build_tables(builder, config, m, float("inf"), variants)
        assert tables is not None and not tables.relaxed
        last = tables.options[pp - 2]
        for stage in range(1, pp - 2):
            for pool, (earlier, later) in enumerate(zip(tables.options[stage], last)):
                assert set(earlier) <= set(later), (pp, stage, pool)
                for counts, placed in earlier.items():
                    fastest, stand_in = min(o.time for o in placed), min(o.time for o in later[counts])
                    assert fastest >= stand_in, (pp, stage, counts)
                    compared, slower = compared + 1, slower + (fastest > stand_in)
        # asked to settle at the relaxed bound, the build stops with the relaxed tables; just above, it builds all
        relaxed = build_tables(builder, config, m, float("inf"), variants, prune_at=0.0)
        assert relaxed is not None and relaxed.relaxed
        bound = relaxed.bottleneck_bound()
        assert bound <= tables.bottleneck_bound() * (1 + 1e-12)
        if bound < float("inf"):  # (no split at all fits the relaxed tables, nor the whole ones, under ZeRO-0)
            assert build_tables(builder, config, m, float("inf"), variants, prune_at=bound).relaxed
            assert not build_tables(builder, config, m, float("inf"), variants, prune_at=bound * 1.000001).relaxed
            relaxed_seen += 1
    # memory binds: earlier middle stages recompute more of the same contents (and run slower) on some pool
    assert compared > 100 and slower > 50 and relaxed_seen == 5
