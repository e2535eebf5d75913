"""Cost tables of one global configuration, computed by the cost model itself.

For every stage s, pool p and stage content (blocks per segment), the table
holds the critical-path seconds of a micro-batch and the step-end terms, at
the fewest fully recomputed blocks that make the stage fit its HBM.  Every
entry is `compose_stage` applied to layer sums from `layer_sums`: the same
functions `evaluate` runs, so the program's objective is the evaluation of
the plan it returns.

Runs of identical transformer blocks form *segments* (a dense model is one
segment; DeepSeek-V3 is three dense blocks then 58 MoE blocks): a stage's
content is its count of blocks per segment, so identical blocks share one
choice (no symmetric per-block variables).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hardware import Catalog, Pool
from models.graph import Layer, ModelGraph
from planner.cost.layout import StageGroups, StageSite, make_site, stage_groups
from planner.cost.stage import StageCost, StageSums, compose_stage, sum_layers
from planner.job import Job
from planner.strategy import Strategy

NS = 1e9  # table units: nanoseconds (integer scaling lives only in the program builder)


@dataclass(frozen=True)
class Segment:
    """A run of identical transformer blocks."""

    start: int  # first block index
    size: int  # blocks in the run
    layers: tuple[Layer, ...]  # the layers of one block (a sample)

    @property
    def end(self) -> int:
        return self.start + self.size


def block_segments(model: ModelGraph) -> list[Segment]:
    """Consecutive identical blocks, in order."""
    segments: list[Segment] = []
    for index, layers in sorted(model.blocks().items()):
        key = tuple(layer.model_dump_json(exclude={"name", "block"}) for layer in layers)
        if segments and _segment_key(segments[-1]) == key:
            last = segments[-1]
            segments[-1] = Segment(start=last.start, size=last.size + 1, layers=last.layers)
        else:
            segments.append(Segment(start=index, size=1, layers=tuple(layers)))
    return segments


def _segment_key(segment: Segment) -> tuple:
    return tuple(layer.model_dump_json(exclude={"name", "block"}) for layer in segment.layers)


def fixed_layers(model: ModelGraph) -> tuple[tuple[Layer, ...], tuple[Layer, ...]]:
    """(layers before the first block, layers after the last block)."""
    head: list[Layer] = []
    tail: list[Layer] = []
    seen_block = False
    for layer in model.layers:
        if layer.block is not None:
            seen_block = True
        elif seen_block:
            tail.append(layer)
        else:
            head.append(layer)
    return tuple(head), tuple(tail)


@dataclass(frozen=True)
class StageOption:
    """One feasible content of a stage on a pool, with its costs in integer nanoseconds."""

    counts: tuple[int, ...]  # blocks per segment
    recompute: int  # blocks fully recomputed (per chunk when vpp > 1), from the start of the stage
    time: int  # critical-path time of one micro-batch
    dp_end: int  # step-end data-parallel sync not hidden
    optimizer: int
    offload: int
    cost: StageCost  # the full cost, for reports


@dataclass
class ConfigTables:
    """Every stage's options under one global configuration."""

    strategy: Strategy  # the global configuration (split and per-stage choices open)
    micro_batches: int
    segments: list[Segment]
    pools: list[Pool]
    # options[s][pool index] maps stage content -> option
    options: list[list[dict[tuple[int, ...], StageOption]]]

    @property
    def blocks(self) -> int:
        return sum(seg.size for seg in self.segments)


class TableBuilder:
    """Builds ConfigTables for many configurations of one job, caching layer sums."""

    def __init__(self, job: Job, catalog: Catalog):
        self.job = job
        self.catalog = catalog
        self.segments = block_segments(job.model)
        self.before, self.after = fixed_layers(job.model)
        self._sums_cache: dict[tuple, StageSums] = {}
        self._groups_cache: dict[tuple, StageGroups] = {}
        self._work_cache: dict[tuple, list[float]] = {}
        self._site_cache: dict[tuple, StageSite] = {}

    def site(self, stage: int, pools: tuple[Pool, ...]) -> StageSite:
        """The site of `stage` on `pools`, cached."""
        key = (stage, tuple(p.name for p in pools))
        if key not in self._site_cache:
            self._site_cache[key] = make_site(stage, pools, self.catalog)
        return self._site_cache[key]

    def groups(self, strategy: Strategy, site: StageSite) -> StageGroups:
        """Communicator shapes, cached: they depend on degrees and pools only."""
        key = (strategy.tp, strategy.cp, strategy.dp, strategy.ep, strategy.pp > 1, strategy.shard,
               tuple(p.name for p in site.pools))
        if key not in self._groups_cache:
            self._groups_cache[key] = stage_groups(self.job, strategy, site)
        return self._groups_cache[key]

    # ------------------------------------------------------------------ sums

    def _sums(self, layers: tuple[Layer, ...], mode: str, strategy: Strategy, site: StageSite, key: str) -> StageSums:
        # layer sums depend on these fields only (not on dp, zero or the split)
        cache_key = (key, mode, strategy.tp, strategy.cp, strategy.ep, strategy.mbs, strategy.sequence_parallel,
                     strategy.tp_overlap, strategy.pp > 1, tuple(p.name for p in site.pools))
        if cache_key not in self._sums_cache:
            groups = self.groups(strategy, site)
            self._sums_cache[cache_key] = sum_layers([(layer, mode) for layer in layers], self.job, strategy, site,
                                                     groups, self.catalog)
        return self._sums_cache[cache_key]

    def block_sums(self, segment: int, mode: str, strategy: Strategy, site: StageSite) -> StageSums:
        """Sums of one block of `segment` under `mode` (none, selective or full)."""
        return self._sums(self.segments[segment].layers, mode, strategy, site, f"seg{segment}")

    def fixed_sums(self, stage: int, strategy: Strategy, site: StageSite) -> StageSums:
        """Sums of the non-block layers a stage carries (embedding on the first, head on the last)."""
        total = StageSums()
        if stage == 0:
            total = total + self._sums(self.before, "none", strategy, site, "before")
        if stage == strategy.pp - 1:
            total = total + self._sums(self.after, "none", strategy, site, "after")
        return total

    def lower_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int) -> float:
        """Seconds no split of this configuration beats.

        Work is counted without recomputation or stage-level terms.  On one pool:
        perfectly balanced stages.  On several: every layer runs at most rho_p
        times faster on pool p than on the reference pool (rho_p the best
        per-layer speed-up), so max_s t_s >= W / (sum of the pp largest rho over
        the stage slots the pools offer) and sum_s t_s >= W / max rho.
        """
        p, v, m = strategy.pp, strategy.vpp, micro_batches
        per_pool = [self._work_by_layer_group(strategy, pool) for pool in pools]
        reference = per_pool[0]
        total = sum(reference)
        if len(pools) == 1:
            return total * (m + (p - 1) / v) / p
        rho = [max(ref / other for ref, other in zip(reference, work) if other > 0) for work in per_pool]
        ranks = strategy.tp * strategy.cp * strategy.dp
        slots = sorted((r for pool, r in zip(pools, rho) for _ in range(pool.gpus // ranks)), reverse=True)
        bottleneck = total / sum(slots[:p])
        return (m - 1 / v) * bottleneck + total / (v * max(rho))

    def _work_by_layer_group(self, strategy: Strategy, pool: Pool) -> list[float]:
        """Per-micro-batch seconds of the fixed layers and each segment on `pool` (linear part only)."""
        key = (strategy.tp, strategy.cp, strategy.ep, strategy.mbs, strategy.sequence_parallel, strategy.tp_overlap,
               strategy.pp > 1, strategy.dp, strategy.shard, strategy.recompute, pool.name)
        if key not in self._work_cache:
            self._work_cache[key] = self._work(strategy, pool)
        return self._work_cache[key]

    def _work(self, strategy: Strategy, pool: Pool) -> list[float]:
        site = self.site(0, (pool,))
        groups = [self.fixed_sums(0, strategy, site)]
        if strategy.pp > 1:
            groups.append(self.fixed_sums(strategy.pp - 1, strategy, site))
        groups += [self.block_sums(k, strategy.recompute, strategy, site).times(seg.size)
                   for k, seg in enumerate(self.segments)]
        return [g.compute + g.recompute + g.tp + g.cp + g.ep for g in groups]

    # ------------------------------------------------------------------ options

    def stage_sums(self, stage: int, counts: tuple[int, ...], recompute: int, strategy: Strategy,
                   site: StageSite) -> StageSums:
        """Sums of a stage holding `counts` blocks per segment, the first `recompute` of them
        (per chunk with vpp > 1) fully recomputed."""
        total = self.fixed_sums(stage, strategy, site)
        full_left = recompute * strategy.vpp
        for k, count in enumerate(counts):
            full = min(full_left, count)
            full_left -= full
            base = strategy.recompute
            if full:
                total = total + self.block_sums(k, "full", strategy, site).times(full)
            if count - full:
                total = total + self.block_sums(k, base, strategy, site).times(count - full)
        return total

    def option(self, stage: int, counts: tuple[int, ...], strategy: Strategy, site: StageSite,
               micro_batches: int, time_cap: float) -> StageOption | None:
        """The cheapest feasible recompute for this content, or None (does not fit, or slower than time_cap)."""
        groups = self.groups(strategy, site)
        blocks = sum(counts)
        chunk = blocks // strategy.vpp
        can_recompute = strategy.recompute == "none"

        def cost_at(r: int) -> StageCost:
            sums = self.stage_sums(stage, counts, r, strategy, site)
            return compose_stage(self.job, strategy, site, groups, sums, micro_batches, self.catalog)

        cost = cost_at(0)
        recompute = 0
        if not cost.memory.fits:
            if not can_recompute or chunk == 0:
                return None
            # memory falls as more blocks recompute (r >= 1): the fewest that fit, by bisection
            if not cost_at(chunk).memory.fits:
                return None
            lo, hi = 1, chunk
            while lo < hi:
                mid = (lo + hi) // 2
                if cost_at(mid).memory.fits:
                    hi = mid
                else:
                    lo = mid + 1
            recompute, cost = lo, cost_at(lo)
        if cost.microbatch > time_cap:
            return None
        return StageOption(counts=counts, recompute=recompute, time=round(cost.microbatch * NS),
                           dp_end=round(cost.dp_exposed_end * NS), optimizer=round(cost.optimizer * NS),
                           offload=round(cost.offload * NS), cost=cost)


@lru_cache(maxsize=None)
def stage_contents(segment_bounds: tuple[tuple[int, int], ...], length: int) -> tuple[tuple[int, ...], ...]:
    """Distinct per-segment counts of a contiguous run of `length` blocks, over every start."""
    total = segment_bounds[-1][1]
    seen: dict[tuple[int, ...], None] = {}
    for start in range(0, total - length + 1):
        end = start + length
        counts = tuple(max(0, min(end, hi) - max(start, lo)) for lo, hi in segment_bounds)
        seen.setdefault(counts, None)
    return tuple(seen)


def stage_pools_for(job: Job, strategy: Strategy) -> list[Pool]:
    """Pools a stage of this configuration can occupy whole."""
    ranks = strategy.tp * strategy.cp * strategy.dp
    return [pool for pool in job.cluster.pools if pool.gpus >= ranks]


def build_tables(builder: TableBuilder, strategy: Strategy, micro_batches: int, time_cap: float) -> ConfigTables | None:
    """Every stage's feasible options no slower than `time_cap` seconds per micro-batch.

    Stage lengths grow until every content of a length is over the time cap or
    cannot fit even fully recomputed (both only get worse with more blocks).
    Returns None when some stage has no option at all.
    """
    job = builder.job
    pools = stage_pools_for(job, strategy) if len(job.cluster.pools) > 1 else list(job.cluster.pools)
    segments = builder.segments
    blocks = sum(seg.size for seg in segments)
    bounds = tuple((seg.start - segments[0].start, seg.end - segments[0].start) for seg in segments)
    pp = strategy.pp
    if pp == 1:
        lengths = [blocks]
    elif strategy.vpp > 1:
        lengths = [blocks // pp]  # interleaved chunks stay even
    else:
        lengths = list(range(1, blocks - pp + 2))
    options: list[list[dict[tuple[int, ...], StageOption]]] = []
    for stage in range(pp):
        per_pool = []
        for pool in pools:
            site = builder.site(stage, (pool,))
            found: dict[tuple[int, ...], StageOption] = {}
            for length in lengths:
                fresh = 0
                for counts in stage_contents(bounds, length):
                    option = builder.option(stage, counts, strategy, site, micro_batches, time_cap)
                    if option is not None:
                        found[counts] = option
                        fresh += 1
                if fresh == 0:
                    break  # a longer stage is slower and needs more memory still
            per_pool.append(found)
        if not any(per_pool):
            return None
        options.append(per_pool)
    return ConfigTables(strategy=strategy, micro_batches=micro_batches, segments=segments, pools=pools,
                        options=options)
