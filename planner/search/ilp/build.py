"""Build one configuration's cost tables: every stage's feasible contents and placements per pool.

The contents grow stage length by stage length until none is left that fits
or beats the time cap (a longer stage is only slower and needs more memory);
each entry comes from `TableBuilder.placed_options`, the cost model itself.
"""

from __future__ import annotations

from hardware import Pool
from planner.search.ilp.segments import stage_contents
from planner.search.ilp.tables import ConfigTables, StageOption, TableBuilder
from planner.job import Job
from planner.strategy import Strategy


def stage_pools_for(job: Job, strategy: Strategy) -> list[Pool]:
    """Pools a stage of this configuration can occupy whole."""
    ranks = strategy.tp * strategy.cp * strategy.data_parallel
    return [pool for pool in job.cluster.pools if pool.gpus >= ranks]


def build_tables(builder: TableBuilder, strategy: Strategy, micro_batches: int, time_cap: float,
                 variants: tuple[dict, ...] = ({},), prune: bool = True, even: bool = False,
                 every_recompute: bool = False, prune_at: float = float("inf")) -> ConfigTables | None:
    """Every stage's feasible options, under each placement variant, no slower than `time_cap` seconds
    per micro-batch.  `prune`: keep only each content's Pareto-optimal placements (off when every stage
    must take the same placement: one stage's dominated placement may be the only one all share).
    `even`: every stage holds blocks / pp blocks (SpaceOptions.split_shape "even").  `every_recompute`: each
    content at every recompute count that fits, not only its fewest (one count for every stage must be
    choosable: SpaceOptions.recompute_counts).

    Stage lengths grow until every content of a length is over the time cap or
    cannot fit even fully recomputed (both only get worse with more blocks).
    Returns None when some stage has no option at all.

    `prune_at`: a bottleneck bound that settles the configuration (the incumbent's).  On a mixed cluster under
    1F1B, once the ends and the last middle stage are built, the earlier middle stages take its options (they
    hold more micro-batches in flight, so none of theirs is faster: `relaxed_middle`); tables whose bound then
    reaches `prune_at` are returned as they are, marked `relaxed`, and no program may be built from them.
    """
    job = builder.job
    pools = stage_pools_for(job, strategy) if len(job.cluster.pools) > 1 else list(job.cluster.pools)
    segments = builder.segments
    blocks = sum(seg.size for seg in segments)
    bounds = tuple((seg.start - segments[0].start, seg.end - segments[0].start) for seg in segments)
    pp = strategy.pp
    if not segments:
        lengths = [0]  # no transformer blocks: the single stage holds the fixed layers only
    elif pp == 1:
        lengths = [blocks]
    elif strategy.vpp > 1 or even:
        lengths = [blocks // pp]  # interleaved chunks stay even
    else:
        lengths = list(range(1, blocks - pp + 2))
    options: dict[int, list[dict[tuple[int, ...], tuple[StageOption, ...]]]] = {}
    # the ends first: the embedding's and the head's stages are the likeliest to have no option within the cap,
    # and a stage without one ends the build; then the middle ones from the last (see prune_at)
    relax = prune_at < float("inf") and pp >= 4 and relaxed_middle(builder, strategy, micro_batches)
    for stage in sorted(range(pp), key=lambda s: (0 < s < pp - 1, -s)):
        per_pool = []
        for pool in pools:
            site = builder.site(stage, (pool,))
            found: dict[tuple[int, ...], tuple[StageOption, ...]] = {}
            floors: dict[tuple, int] = {}  # one kind of block: a longer stage recomputes at least what this one did
            for length in lengths:
                fresh = 0
                for counts in (stage_contents(bounds, length) if segments else [()]):
                    placed = builder.placed_options(stage, counts, strategy, variants, site, micro_batches, time_cap,
                                                    prune=prune, every_recompute=every_recompute,
                                                    floors=floors if len(bounds) == 1 else None)
                    if placed:
                        found[counts] = placed
                        fresh += 1
                if fresh == 0:
                    break  # a longer stage is slower and needs more memory still
            per_pool.append(found)
        if not any(per_pool):
            return None
        options[stage] = per_pool
        if relax and stage == pp - 2:
            relaxed = ConfigTables(strategy=strategy, micro_batches=micro_batches, segments=segments, pools=pools,
                                   options=[options.get(s, per_pool) for s in range(pp)], variants=variants,
                                   relaxed=True)
            if relaxed.bottleneck_bound() >= prune_at:
                return relaxed
    return ConfigTables(strategy=strategy, micro_batches=micro_batches, segments=segments, pools=pools,
                        options=[options[stage] for stage in range(pp)], variants=variants)


def relaxed_middle(builder: TableBuilder, strategy: Strategy, micro_batches: int) -> bool:
    """Whether an earlier middle stage's options are never better than a later one's: under 1F1B a stage's options
    read its position only through TableBuilder.position_key, which for two middle stages differs in the
    micro-batches in flight (more on the earlier one: more HBM, no fewer recomputed blocks, no faster) and in
    which sends cross the fabric, the same on a mixed cluster (every boundary crosses it)."""
    if len(builder.job.cluster.pools) == 1:
        return False
    site = builder.site(strategy.pp - 2, (builder.job.cluster.pools[0],))
    return builder.position_key(strategy.pp - 2, strategy, site, micro_batches) is not None
