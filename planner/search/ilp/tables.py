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

import bisect
from dataclasses import dataclass
from functools import lru_cache

from hardware import Catalog, Pool
from models.graph import Layer, ModelGraph
from planner.cost.comm import P2P_READS, p2p_seconds
from planner.cost.layout import GROUPS_READS, StageGroups, StageSite, make_site, stage_groups
from planner.cost.memory import RankMemory, stage_memory
from planner.cost.stage import (EXPERT_TIMES_READS, LAYER_SUMS_READS, LAYER_TIMES_READS, StageCost, compose_stage,
                                 layer_busy, sum_layers)
from planner.cost.sums import StageSums
from planner.job import Job
from planner.search.ilp.bounds import (NS, bottleneck_bound, even_pipeline_bound, pipeline_fill_bound, slots_limit,
                                       smallest_sufficient)
from planner.fields import Reader, reads
from planner.strategy import Strategy, strategy_key

# Cache keys of the builder's own quantities: what they and the cost code they run read (planner.fields)
WORK_READS = reads(Reader.WORK)  # cheapest block's busy seconds
LOWER_READS = reads(Reader.LOWER)  # lower_bound
STAGE_SUMS_READS = reads(Reader.STAGE_SUMS)  # stage_sums
PROFILE_READS = reads(Reader.PROFILE)  # _slot_profile (placements: variants)



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
    """One feasible content and placement of a stage on a pool, with its costs in integer nanoseconds."""

    counts: tuple[int, ...]  # blocks per segment
    recompute: int  # blocks fully recomputed (per chunk when vpp > 1), from the start of the stage
    time: int  # critical-path time of one micro-batch
    dp_end: int  # step-end data-parallel sync not hidden
    optimizer: int
    offload: int
    cost: StageCost  # the full cost, for reports
    variant: int = 0  # index of the stage's placement in ConfigTables.variants

    @property
    def update(self) -> int:
        """optimizer + offload: the stage's update after the step's barrier."""
        return self.optimizer + self.offload


def pareto(options: list[StageOption]) -> tuple[StageOption, ...]:
    """The options no other beats on the micro-batch time, the step-end sync and the update (placements of
    one content)."""
    kept: list[StageOption] = []
    for option in sorted(options, key=lambda o: (o.time, o.dp_end, o.update, o.variant)):
        if not any(k.dp_end <= option.dp_end and k.update <= option.update for k in kept):
            kept.append(option)
    return tuple(kept)


def variants_key(variants: tuple[dict, ...]) -> tuple:
    """A hashable form of placement variants (cache keys)."""
    return tuple(tuple(sorted(v.items())) for v in variants)


@dataclass
class ConfigTables:
    """Every stage's options under one global configuration."""

    strategy: Strategy  # the global configuration (split and per-stage choices open)
    micro_batches: int
    segments: list[Segment]
    pools: list[Pool]
    # options[s][pool index] maps stage content -> its Pareto-optimal placements
    options: list[list[dict[tuple[int, ...], tuple[StageOption, ...]]]]
    variants: tuple[dict, ...] = ({},)  # placements a stage may take (planner.search.space.placement_variants)

    @property
    def blocks(self) -> int:
        return sum(seg.size for seg in self.segments)

    def bottleneck_bound(self) -> float:
        """Seconds no split in these tables beats (`bounds.bottleneck_bound` on their entries)."""
        entries = [sorted((o.time, sum(c)) for options in per_pool for c, placed in options.items() for o in placed)
                   for per_pool in self.options]  # per stage: (time, blocks) pairs
        return bottleneck_bound(entries, self.blocks, self.micro_batches, self.strategy.vpp)


class TableBuilder:
    """Builds ConfigTables for many configurations of one job, caching layer sums."""

    def __init__(self, job: Job, catalog: Catalog):
        self.job = job
        self.catalog = catalog
        self.segments = block_segments(job.model)
        self.before, self.after = fixed_layers(job.model)
        self._sums_cache: dict[tuple, StageSums] = {}
        self._groups_cache: dict[tuple, StageGroups] = {}
        self._work_cache: dict[tuple, object] = {}  # bound ingredients, by the fields they depend on
        self._site_cache: dict[tuple, StageSite] = {}
        self._stage_sums_cache: dict[tuple, StageSums] = {}

    def site(self, stage: int, pools: tuple[Pool, ...]) -> StageSite:
        """The site of `stage` on `pools`, cached."""
        key = (stage, tuple(p.name for p in pools))
        if key not in self._site_cache:
            self._site_cache[key] = make_site(stage, pools, self.catalog)
        return self._site_cache[key]

    def groups(self, strategy: Strategy, site: StageSite) -> StageGroups:
        """Communicator shapes, cached: they depend on degrees and pools only."""
        key = (strategy_key(strategy, GROUPS_READS), tuple(p.name for p in site.pools))
        if key not in self._groups_cache:
            self._groups_cache[key] = stage_groups(self.job, strategy, site)
        return self._groups_cache[key]

    # ------------------------------------------------------------------ sums

    def _sums(self, layers: tuple[Layer, ...], mode: str, strategy: Strategy, site: StageSite, key: str) -> StageSums:
        cache_key = (key, mode, strategy_key(strategy, LAYER_SUMS_READS), tuple(p.name for p in site.pools))
        if cache_key not in self._sums_cache:
            groups = self.groups(strategy, site)
            self._sums_cache[cache_key] = sum_layers([(layer, mode) for layer in layers], self.job, strategy, site,
                                                     groups, self.catalog)
        return self._sums_cache[cache_key]

    def block_sums(self, segment: int, mode: str, strategy: Strategy, site: StageSite) -> StageSums:
        """Sums of one block of `segment` under `mode` (none, selective or full)."""
        return self._sums(self.segments[segment].layers, mode, strategy, site, f"seg{segment}")

    def fixed_sums(self, first: bool, last: bool, strategy: Strategy, site: StageSite) -> StageSums:
        """Sums of the non-block layers a stage carries: the embedding on the first, the head on the last."""
        total = StageSums()
        if first:
            total = total + self._sums(self.before, "none", strategy, site, "before")
        if last:
            total = total + self._sums(self.after, "none", strategy, site, "after")
        return total

    def lower_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int) -> float:
        """Seconds no split of this configuration beats.

        The objective is (m - 1/v) max_s t_s + sum_s t_s / v.  A stage on pool
        p holding n blocks takes at least n * w_p + c_p: w_p the cheapest
        block's work there (no recomputation, no stage-level terms), c_p its
        pipeline transfers.  The fixed layers (embedding, head) take at least
        F_p wherever they land.  So max_s t_s <= T forces
        sum over the stage slots of (T - c_s) / w_s >= B + min_p F_p / w_p:
        the smallest such T (bisection over the pp best slots) bounds the
        bottleneck, and sum_s t_s >= B min w + min F + pp min c.
        """
        # ZeRO stage does not enter any term here: configurations differing only in it share the bound
        key = ("lower", strategy_key(strategy, LOWER_READS), micro_batches, tuple(pool.name for pool in pools))
        if key not in self._work_cache:
            self._work_cache[key] = self._lower_bound(strategy, pools, micro_batches)
        return self._work_cache[key]

    def _lower_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int) -> float:
        p, v, m = strategy.pp, strategy.vpp, micro_batches
        ranks = strategy.tp * strategy.cp * strategy.dp
        blocks = sum(seg.size for seg in self.segments)
        per_pool = []
        for pool in pools:
            fixed, block = self._work_by_layer_group(strategy, pool)
            slots = pool.gpus // ranks if len(pools) > 1 else p
            per_pool.append((block, self._transfer(strategy, pool), fixed, slots))
        if blocks == 0:
            fixed = min(f for _, _, f, _ in per_pool)
            return m * fixed  # one stage of fixed layers (recsys)
        need = blocks + min(fixed / block for block, _, fixed, _ in per_pool)

        if len(per_pool) == 1:
            w, c, _, _ = per_pool[0]
            lo = need * w / p + c  # balanced stages
        else:
            lo = slots_limit([(w, c, k) for w, c, _, k in per_pool], p, need)
        return (m - 1 / v) * lo + self.sum_floor(strategy, pools) / v

    def refined_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int,
                      enough: float = float("inf"), variants: tuple[dict, ...] = ({},)) -> float:
        """A memory-aware bound (inf when the blocks cannot be placed at all).

        For each pool, time[n] is the fastest a stage of n blocks can run there:
        the fewest recomputed blocks its HBM allows (under its best placement),
        at the pipeline position with the least in flight, without embedding or
        head (each only makes a stage slower).  The bottleneck is at least the smallest T at which the
        pp best stage slots hold all B blocks within T each.

        `enough`: a value that settles the question (the incumbent).  Profiles
        then stop at the stage time that step would allow, and when the blocks
        do not fit within it the bound returned is `enough` itself (the true
        bound is no smaller).
        """
        p, v, m = strategy.pp, strategy.vpp, micro_batches
        ranks = strategy.tp * strategy.cp * strategy.dp
        blocks = sum(seg.size for seg in self.segments)
        if len(pools) == 1:
            # one pool: some stage holds at least ceil(B / pp) blocks
            fastest = self._stage_floor(strategy, pools[0], m, -(-blocks // p), variants) if blocks else 0.0
            return (m - 1 / v) * fastest + self.sum_floor(strategy, pools) / v
        sum_term = self.sum_floor(strategy, pools) / v
        # the slowest stage a step under `enough` allows: (m - 1/v) T + sum / v < enough
        cap = (enough - sum_term) / (m - 1 / v) if enough < float("inf") and m * v > 1 else float("inf")
        profiles = [(self._slot_profile(strategy, pool, m, cap, variants), pool.gpus // ranks) for pool in pools]

        def held(limit: float) -> int:
            fits = sorted(((bisect.bisect_right(times, limit), slots) for times, slots in profiles), reverse=True)
            left, total = p, 0
            for most, slots in fits:
                take = min(left, slots)
                if take and most == 0:
                    return -1  # every stage holds a block: pp stages do not all run within the limit
                total += take * most
                left -= take
            return total

        limit = smallest_sufficient(sorted({t for times, _ in profiles for t in times}), held, blocks)
        if limit > cap:
            # profiles are complete only up to the cap: all we know is that no placement fits within it,
            # so the bound is at least `enough`
            return enough
        bound = (m - 1 / v) * limit + sum_term
        if blocks and v > 1:  # interleaved chunks: every stage holds blocks / pp
            return max(bound, even_pipeline_bound(profiles, p, blocks // p, m, v, enough))
        if blocks:  # the stages fill the slots they take: their sum bounds the bubble
            bound = max(bound, pipeline_fill_bound(profiles, p, blocks, m, v, limit, enough))
        return bound

    def _stage_floor(self, strategy: Strategy, pool: Pool, micro_batches: int, blocks: int,
                     variants: tuple[dict, ...]) -> float:
        """Fastest seconds per micro-batch of any stage of `blocks` blocks on `pool` (inf if none fits)."""
        site = self.site(strategy.pp - 1, (pool,))
        bounds = tuple((seg.start - self.segments[0].start, seg.end - self.segments[0].start)
                       for seg in self.segments)
        options = [o for counts in stage_contents(bounds, blocks)
                   for o in self.placed_options(strategy.pp - 1, counts, strategy, variants, site, micro_batches,
                                                float("inf"), with_fixed=False)]
        return min((o.cost.microbatch for o in options), default=float("inf"))

    def _slot_profile(self, strategy: Strategy, pool: Pool, micro_batches: int,
                      cap: float = float("inf"), variants: tuple[dict, ...] = ({},)) -> list[float]:
        """time[n-1]: fastest seconds per micro-batch of a stage of n blocks on `pool` (see refined_bound),
        for every n whose time is at most `cap`."""
        strategy = last_stage_view(strategy)
        key = ("profile", strategy_key(strategy, PROFILE_READS), variants_key(variants), micro_batches, pool.name)
        cached = self._work_cache.get(key)
        if cached is not None and cached[1] >= cap:
            return cached[0]
        site = self.site(strategy.pp - 1, (pool,))
        bounds = tuple((seg.start - self.segments[0].start, seg.end - self.segments[0].start)
                       for seg in self.segments)
        times: list[float] = []
        # one kind of block: a stage of n blocks recomputes at least what one of n - 1 needed
        floor = 0
        complete = float("inf")  # the profile holds every n (it stopped where nothing fits)
        for n in range(1, bounds[-1][1] + 1):
            fits = [o for counts in stage_contents(bounds, n)
                    for o in self.placed_options(strategy.pp - 1, counts, strategy, variants, site, micro_batches,
                                                 float("inf"), with_fixed=False, min_recompute=floor, prune=False)]
            if not fits:
                break  # n blocks do not fit even fully recomputed; more never will
            if len(bounds) == 1:
                floor = min(o.recompute for o in fits)  # the least any placement needs
            times.append(max(min(o.cost.microbatch for o in fits), times[-1] if times else 0.0))
            if times[-1] > cap:
                complete = cap  # longer stages are slower still: the rest cannot be within the cap
                break
        self._work_cache[key] = (times, complete)
        return times

    def sum_floor(self, strategy: Strategy, pools: list[Pool]) -> float:
        """A lower bound on sum_s t_s: the cheapest pool's work plus pp of the cheapest transfers; on a
        mixed cluster also every stage's first block on the pp cheapest slots (pool capacities) and the
        other blocks at the cheapest pool's work."""
        blocks = sum(seg.size for seg in self.segments)
        works = [self._work_by_layer_group(strategy, pool) for pool in pools]
        transfers = [self._transfer(strategy, pool) for pool in pools]
        cheapest = min(w for _, w in works)
        fixed = min(f for f, _ in works)
        total = blocks * cheapest + fixed + strategy.pp * min(transfers)
        p = strategy.pp
        if len(pools) > 1 and blocks >= p:
            ranks = strategy.tp * strategy.cp * strategy.dp
            firsts = sorted(w + c for (_, w), c, pool in zip(works, transfers, pools)
                            for _ in range(min(pool.gpus // ranks, p)))
            if len(firsts) >= p:
                total = max(total, sum(firsts[:p]) + (blocks - p) * cheapest + fixed)
        return total

    def _work_by_layer_group(self, strategy: Strategy, pool: Pool) -> tuple[float, float]:
        """(fixed layers' seconds, cheapest block's seconds) per micro-batch on `pool`, linear part only."""
        key = ("work", strategy_key(strategy, WORK_READS), pool.name)
        if key not in self._work_cache:
            site = self.site(0, (pool,))
            fixed = self._busy("fixed", self.before + self.after, "none", strategy, site)  # on one stage or two
            blocks = [self._busy(f"seg{k}", seg.layers, strategy.recompute, strategy, site)
                      for k, seg in enumerate(self.segments)]
            self._work_cache[key] = (fixed, min(blocks, default=0.0))
        return self._work_cache[key]

    def _busy(self, name: str, layers: tuple[Layer, ...], mode: str, strategy: Strategy, site: StageSite) -> float:
        """Busy seconds per micro-batch of the layers `name` (a segment's block, or the fixed layers) under
        `mode` (planner.cost.stage.layer_busy), cached by what the time terms read: configurations that differ
        only in what the bytes read share it."""
        pools = tuple(p.name for p in site.pools)
        total = 0.0
        for index, layer in enumerate(layers):  # one entry per layer: an attention layer's serves every ep
            reads = EXPERT_TIMES_READS if layer.moe is not None else LAYER_TIMES_READS
            key = ("busy", name, index, mode, strategy_key(strategy, reads), pools)
            if key not in self._work_cache:
                groups = self.groups(strategy, site)
                self._work_cache[key] = layer_busy(layer, self.job, strategy, site, groups, self.catalog, mode)
            total += self._work_cache[key]
        return total

    def _transfer(self, strategy: Strategy, pool: Pool) -> float:
        """Pipeline transfer seconds per micro-batch of a stage on `pool`."""
        key = ("p2p", strategy_key(strategy, P2P_READS), pool.name)
        if key not in self._work_cache:
            site = self.site(0, (pool,))
            groups = self.groups(strategy, site)
            self._work_cache[key] = p2p_seconds(float(self.job.model.hidden), self.job, strategy, groups, self.catalog)
        return self._work_cache[key]

    # ------------------------------------------------------------------ options

    def stage_sums(self, stage: int, counts: tuple[int, ...], recompute: int, strategy: Strategy,
                   site: StageSite, with_fixed: bool = True) -> StageSums:
        """Sums of a stage holding `counts` blocks per segment, the first `recompute` of them
        (per chunk with vpp > 1) fully recomputed; `with_fixed=False` leaves out embedding and head.

        Cached: configurations that differ in dp, ZeRO or placement share them."""
        first, last = with_fixed and stage == 0, with_fixed and stage == strategy.pp - 1
        key = (first, last, counts, recompute, strategy_key(strategy, STAGE_SUMS_READS),
               tuple(p.name for p in site.pools))
        cached = self._stage_sums_cache.get(key)
        if cached is None:
            cached = self._stage_sums_cache[key] = self._stage_sums(first, last, counts, recompute, strategy, site)
        return cached

    def _stage_sums(self, first: bool, last: bool, counts: tuple[int, ...], recompute: int, strategy: Strategy,
                    site: StageSite) -> StageSums:
        total = self.fixed_sums(first, last, strategy, site)
        # the positions Strategy.layer_recompute recomputes: the first `recompute` of each chunk
        chunk = max(1, sum(counts) // strategy.vpp)
        position = 0
        for k, count in enumerate(counts):
            full = sum(1 for i in range(position, position + count) if i % chunk < recompute)
            position += count
            if full:
                total = total + self.block_sums(k, "full", strategy, site).times(full)
            if count - full:
                total = total + self.block_sums(k, strategy.recompute, strategy, site).times(count - full)
        return total

    def placed_options(self, stage: int, counts: tuple[int, ...], config: Strategy, variants: tuple[dict, ...],
                       site: StageSite, micro_batches: int, time_cap: float, with_fixed: bool = True,
                       min_recompute: int = 0, prune: bool = True, every_recompute: bool = False
                       ) -> tuple[StageOption, ...]:
        """The content's option under each placement variant that fits, Pareto-pruned unless `prune` is off.
        `every_recompute`: also every larger recompute count than the fewest that fits (pruned per count),
        for programs that tie the stages' counts together (SpaceOptions.recompute_counts)."""
        if every_recompute:
            return self._every_recompute_options(stage, counts, config, variants, site, micro_batches, time_cap,
                                                 prune)
        found = []
        fewest: dict[tuple, int | None] = {}  # by the placement's HBM-relevant keys (the FCDP cache is host-only)
        for index, variant in enumerate(variants):  # the variants without offload come first
            if _offloads(variant) and fewest.get(()) == 0:
                continue  # nothing to buy: see _offload_pays
            strategy = config.model_copy(update=variant) if variant else config
            hbm_key = tuple(sorted((k, v) for k, v in variant.items() if k != "regather"))
            if hbm_key not in fewest:
                fewest[hbm_key] = self.fewest_recompute(stage, counts, strategy, site, micro_batches, with_fixed,
                                                        min_recompute)
            recompute = fewest[hbm_key]
            if recompute is None or not _offload_pays(variant, recompute, fewest.get(())):
                continue  # does not fit (the cache only adds host bytes: neither does its variant)
            option = self.option(stage, counts, strategy, site, micro_batches, time_cap, recompute, with_fixed,
                                 variant=index)
            if option is not None:
                found.append(option)
        return pareto(found) if prune else tuple(found)

    def _every_recompute_options(self, stage: int, counts: tuple[int, ...], config: Strategy,
                                 variants: tuple[dict, ...], site: StageSite, micro_batches: int, time_cap: float,
                                 prune: bool) -> tuple[StageOption, ...]:
        """placed_options at each recompute count from the fewest that fits up to the whole chunk."""
        chunk = sum(counts) // config.vpp
        by_count: dict[int, list[StageOption]] = {}
        plain: int | None = None  # the fewest without offload (the variants without offload come first)
        for index, variant in enumerate(variants):
            strategy = config.model_copy(update=variant) if variant else config
            fewest = self.fewest_recompute(stage, counts, strategy, site, micro_batches)
            if fewest is None:
                continue
            if not _offloads(variant):
                plain = fewest if plain is None else min(plain, fewest)
            top = chunk if strategy.blocks_recomputable else fewest
            for recompute in range(fewest, top + 1):
                if not _offload_pays(variant, recompute, plain):
                    break
                option = self.option(stage, counts, strategy, site, micro_batches, time_cap, recompute,
                                     variant=index)
                if option is None:
                    break  # over the time cap: more recomputation is slower still (it fits: HBM only falls)
                by_count.setdefault(recompute, []).append(option)
        kept = [o for r in sorted(by_count) for o in (pareto(by_count[r]) if prune else by_count[r])]
        return tuple(kept)

    def fewest_recompute(self, stage: int, counts: tuple[int, ...], strategy: Strategy, site: StageSite,
                         micro_batches: int, with_fixed: bool = True, min_recompute: int = 0) -> int | None:
        """The fewest fully recomputed blocks (per chunk) with which the stage fits, or None.

        Only memory is evaluated: the host tiers do not depend on recomputation, HBM falls as more
        blocks recompute (bisection).  min_recompute: a known lower bound (e.g. what a stage of one
        block fewer of the same kind needed), where the search starts."""
        chunk = sum(counts) // strategy.vpp
        can_recompute = strategy.blocks_recomputable

        def memory_at(r: int) -> RankMemory:
            sums = self.stage_sums(stage, counts, r, strategy, site, with_fixed)
            return stage_memory(self.job, strategy, site, sums, micro_batches, self.catalog)

        recompute = min(min_recompute, chunk) if can_recompute else 0
        memory = memory_at(recompute)
        if not memory.fits_host:
            return None  # host DRAM or NVMe: no recomputation helps
        if memory.fits_hbm:
            return recompute
        if not can_recompute or chunk == 0 or not memory_at(chunk).fits_hbm:
            return None
        lo, hi = recompute + 1, chunk
        while lo < hi:
            mid = (lo + hi) // 2
            if memory_at(mid).fits_hbm:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def option(self, stage: int, counts: tuple[int, ...], strategy: Strategy, site: StageSite,
               micro_batches: int, time_cap: float, recompute: int, with_fixed: bool = True,
               variant: int = 0) -> StageOption | None:
        """The stage with `recompute` blocks recomputed (its fewest that fit HBM), or None (host tiers
        do not fit, or slower than time_cap).  Without the fixed layers (the bounds' floors) its pipeline
        sends take the cheapest link of the layout, so a floor holds for every stage."""
        sums = self.stage_sums(stage, counts, recompute, strategy, site, with_fixed)
        cost = compose_stage(self.job, strategy, site, self.groups(strategy, site), sums, micro_batches,
                             self.catalog, cheapest_transfers=not with_fixed)
        if not cost.memory.fits or cost.microbatch > time_cap:
            return None
        dp_end, optimizer, offload = (round(x * NS) for x in (cost.dp_exposed_end, cost.optimizer, cost.offload))
        return StageOption(counts=counts, recompute=recompute, time=round(cost.microbatch * NS), dp_end=dp_end,
                           optimizer=optimizer, offload=offload, cost=cost, variant=variant)


def last_stage_view(strategy: Strategy) -> Strategy:
    """The strategy whose last stage is this one's last stage, with the fewest stages: under a
    non-interleaved schedule the last of any number of stages holds one micro-batch in flight and
    exchanges one direction with one neighbour, so configurations that differ only in pp share its
    profile (interleaved chunks keep their pp: it sets their warm-up)."""
    if strategy.pp <= 2 or strategy.vpp > 1:
        return strategy
    return strategy.model_copy(update={"pp": 2})


def _offloads(variant: dict) -> bool:
    """Whether a placement variant moves state off the GPU (optimizer or weights)."""
    return variant.get("offload", "none") != "none"


def _offload_pays(variant: dict, recompute: int, plain: int | None) -> bool:
    """Whether a variant's option at `recompute` blocks can be on the Pareto front: one with offload only where
    the same content without offload needs more recomputation (`plain`: its fewest, None when it does not fit).
    At equal recomputation offload only adds time: a weight fetch per micro-batch, and PCIe transfers and CPU
    Adam for what HBM would update (tests/test_certificate_oracle.py holds the search to every runtime's whole
    space, offload included)."""
    return not _offloads(variant) or plain is None or recompute < plain


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
