"""Cost tables of one global configuration, computed by the cost model itself.

For every stage s, pool p and stage content (blocks per segment), the table
holds the critical-path seconds of a micro-batch and the step-end terms, at
the fewest fully recomputed blocks that make the stage fit its HBM.  Every
entry is `compose_stage` applied to layer sums from `layer_sums`: the same
functions `evaluate` runs, so the program's objective is the evaluation of
the plan it returns.

Runs of identical transformer blocks form *segments* (a dense model is one
segment; DeepSeek-V3 is three dense blocks then 58 MoE blocks;
planner.search.ilp.segments): a stage's content is its count of blocks per
segment, so identical blocks share one choice (no symmetric per-block
variables).  The builder's lower bounds, on the same caches, are in
planner.search.ilp.floors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Callable

from hardware import Catalog, Pool
from models.graph import Layer, RecomputeMode
from planner.cost.comm import boundary_crossings
from planner.cost.layout import COMMS_READS, StageComms, StageSite, make_site, nvlink_domain_gpus, stage_comms
from planner.cost.memory import RankMemory, in_flight_microbatches, saved_bytes, stage_memory
from planner.cost.pipeline import fill_seconds
from planner.cost.stage import LAYER_SUMS_READS, StageCost, compose_stage, sum_layers
from planner.cost.sums import StageSums
from planner.fields import Reader, reads
from planner.job import Job
from planner.search.ilp.bounds import NS, bottleneck_bound
from planner.search.ilp.floors import Floors
from planner.search.ilp.segments import (Segment, block_segments, fixed_layers, offload_pays, offloads,
                                         variants_key)
from planner.strategy import Strategy, strategy_key

STAGE_SUMS_READS = reads(Reader.STAGE_SUMS)  # stage_sums' cache key (planner.fields)
_ALL_BUT_PP = tuple(name for name in Strategy.model_fields if name != "pp")  # with the position: a stage's reads


@dataclass(frozen=True)
class StageOption:
    """One feasible content and placement of a stage on a pool, with its costs in integer nanoseconds."""

    counts: tuple[int, ...]  # blocks per segment
    recompute: int  # blocks fully recomputed (per chunk when vpp > 1), from the start of the stage
    time: int  # critical-path time of one micro-batch
    fill: int  # of `time`, what the schedule's warm-up and drain leave idle elsewhere (planner.cost.pipeline)
    dp_end: int  # step-end data-parallel sync not hidden
    optimizer: int
    offload: int
    composed: Callable[[], StageCost] = field(compare=False, repr=False)  # the full cost, when asked for
    variant: int = 0  # index of the stage's placement in ConfigTables.variants

    @cached_property
    def cost(self) -> StageCost:
        """The full cost, for reports and the memory tie-break (composed once, when first asked for)."""
        return self.composed()

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
    # the earlier middle stages hold a later one's options (build_tables' prune_at): a bound, never a program
    relaxed: bool = False

    @property
    def blocks(self) -> int:
        return sum(seg.size for seg in self.segments)

    def bottleneck_bound(self) -> float:
        """Seconds no split in these tables beats (`bounds.bottleneck_bound` on their entries)."""
        entries = [sorted((o.time, sum(c)) for options in per_pool for c, placed in options.items() for o in placed)
                   for per_pool in self.options]  # per stage: (time, blocks) pairs
        fills = None  # a V's fills are not its stage times: the sum of each stage's least
        if self.strategy.v_shape:
            fills = sum(min((o.fill for options in per_pool for placed in options.values() for o in placed),
                            default=0) for per_pool in self.options)
        pool_entries = None
        if len(self.pools) > 1:  # a pool hosts no more stages than it has slots (the program's add_pool_capacity)
            ranks = self.strategy.tp * self.strategy.cp * self.strategy.data_parallel
            pool_entries = [([(o.time, sum(c)) for per_pool in self.options for c, placed in per_pool[i].items()
                              for o in placed], pool.gpus // ranks) for i, pool in enumerate(self.pools)]
        return bottleneck_bound(entries, self.blocks, self.micro_batches, self.strategy.vpp, fills, pool_entries)


class TableBuilder(Floors):
    """Builds ConfigTables for many configurations of one job, caching layer sums."""

    def __init__(self, job: Job, catalog: Catalog):
        self.job = job
        self.catalog = catalog
        self.segments = block_segments(job.model)
        self.before, self.after = fixed_layers(job.model)
        self._sums_cache: dict[tuple, StageSums] = {}
        self._comms_cache: dict[tuple, StageComms] = {}
        # bound ingredients (planner.search.ilp.floors), by the fields they depend on
        self._work_cache: dict[tuple, float] = {}
        self._pair_cache: dict[tuple, tuple[float, float]] = {}
        self._profile_cache: dict[tuple, tuple[list[float], float]] = {}
        self._site_cache: dict[tuple, StageSite] = {}
        self._stage_sums_cache: dict[tuple, StageSums] = {}
        self._saves_cache: dict[tuple, float] = {}  # a plain block's saved bytes, per segment
        # per content at a pipeline position, shared by configurations that differ in pp: each option's numbers
        # (seconds per micro-batch, then StageOption's recompute, time, fill, dp_end, optimizer, offload, variant)
        # and each placement's fewest recomputed blocks there
        self._placed_cache: dict[tuple, tuple[tuple[tuple, ...], tuple[tuple[tuple, int], ...]]] = {}
        self._configurations: dict[tuple, int] = {}  # what the shared options read of a configuration, numbered

    def site(self, stage: int, pools: tuple[Pool, ...]) -> StageSite:
        """The site of `stage` on `pools`, cached."""
        key = (stage, tuple(p.name for p in pools))
        if key not in self._site_cache:
            self._site_cache[key] = make_site(stage, pools, self.catalog)
        return self._site_cache[key]

    def comms(self, strategy: Strategy, site: StageSite) -> StageComms:
        """Communicator shapes, cached: they depend on degrees and pools only."""
        key = (strategy_key(strategy, COMMS_READS), tuple(p.name for p in site.pools))
        if key not in self._comms_cache:
            self._comms_cache[key] = stage_comms(self.job, strategy, site)
        return self._comms_cache[key]

    # ------------------------------------------------------------------ sums

    def _sums(self, layers: tuple[Layer, ...], mode: RecomputeMode, strategy: Strategy, site: StageSite,
              key: str) -> StageSums:
        cache_key = (key, mode, strategy_key(strategy, LAYER_SUMS_READS), tuple(p.name for p in site.pools))
        if cache_key not in self._sums_cache:
            groups = self.comms(strategy, site)
            self._sums_cache[cache_key] = sum_layers([(layer, mode) for layer in layers], self.job, strategy, site,
                                                     groups, self.catalog)
        return self._sums_cache[cache_key]

    def block_sums(self, segment: int, mode: RecomputeMode, strategy: Strategy, site: StageSite) -> StageSums:
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

    # ------------------------------------------------------------------ options

    def stage_sums(self, stage: int, counts: tuple[int, ...], recompute: int, strategy: Strategy,
                   site: StageSite, with_fixed: bool = True) -> StageSums:
        """Sums of a stage holding `counts` blocks per segment, the first `recompute` of them
        (per chunk with vpp > 1) fully recomputed; `with_fixed=False` leaves out embedding and head.

        Cached: configurations that differ in dp, ZeRO or placement share them."""
        # the head: on the last stage, or in a V (zbv, dualpipev) on the first, beside the embedding
        first, last = with_fixed and stage == 0, with_fixed and stage == (0 if strategy.v_shape else strategy.pp - 1)
        key = (first, last, counts, recompute, strategy_key(strategy, STAGE_SUMS_READS),
               tuple(p.name for p in site.pools))
        cached = self._stage_sums_cache.get(key)
        if cached is None:
            cached = self._stage_sums_cache[key] = self._stage_sums(first, last, counts, recompute, strategy, site)
        return cached

    def _stage_sums(self, first: bool, last: bool, counts: tuple[int, ...], recompute: int, strategy: Strategy,
                    site: StageSite) -> StageSums:
        total = self.fixed_sums(first, last, strategy, site)
        if strategy.recompute_every is not None:
            return total + self._every_kth_sums(counts, strategy, site)
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

    def _every_kth_sums(self, counts: tuple[int, ...], strategy: Strategy, site: StageSite) -> StageSums:
        """Sums of a stage's blocks with every k-th of them fully recomputed (Strategy.recompute_every: positions
        k, 2k, ... over the stage's blocks in order), with the bytes that the blocks kept before the last
        recomputed one still hold when its backward recomputes it (planner.cost.stage.kept_before_last_recompute,
        block by block)."""
        every = strategy.recompute_every or 1
        last = sum(counts) // every * every  # position of the last recomputed block (0: none)
        total = StageSums()
        kept_before = 0.0
        position = 0  # blocks of the stage before this segment's
        for k, count in enumerate(counts):
            full = (position + count) // every - position // every  # multiples of k among its positions
            if full:
                total = total + self.block_sums(k, "full", strategy, site).times(full)
            if count - full:
                total = total + self.block_sums(k, "none", strategy, site).times(count - full)
            ahead = max(0, min(position + count, last - 1) - position)  # its positions before the last recomputed
            plain = ahead - ((position + ahead) // every - position // every)
            if plain:
                kept_before += plain * self.block_saves(k, strategy)
            position += count
        return replace(total, kept_before_recompute=kept_before)

    def block_saves(self, segment: int, strategy: Strategy) -> float:
        """Saved bytes of one block of `segment` that keeps its activations (planner.cost.memory.saved_bytes)."""
        key = (segment, strategy_key(strategy, LAYER_SUMS_READS))
        if key not in self._saves_cache:
            self._saves_cache[key] = sum(saved_bytes(layer, self.job, strategy, "none")
                                         for layer in self.segments[segment].layers if layer.block is not None)
        return self._saves_cache[key]

    def placed_options(self, stage: int, counts: tuple[int, ...], config: Strategy, variants: tuple[dict, ...],
                       site: StageSite, micro_batches: int, time_cap: float, with_fixed: bool = True,
                       prune: bool = True, every_recompute: bool = False, floors: dict[tuple, int] | None = None
                       ) -> tuple[StageOption, ...]:
        """The content's option under each placement variant that fits, Pareto-pruned unless `prune` is off.
        `every_recompute`: also every larger recompute count than the fewest that fits (pruned per count),
        for programs that tie the stages' counts together (SpaceOptions.recompute_counts).  `floors`: each
        placement's fewest recomputed blocks in a stage of one block fewer at this position (one kind of block:
        no fewer fit here), read and updated."""
        if every_recompute:
            return self._every_recompute_options(stage, counts, config, variants, site, micro_batches, time_cap,
                                                 prune)
        floors = {} if floors is None else floors
        position = self.position_key(stage, config, site, micro_batches)
        if position is None:
            timed, fewest = self._placed(stage, counts, config, variants, site, micro_batches, with_fixed, floors)
            floors.update((hbm, r) for hbm, r in fewest.items() if r is not None)
        else:
            # a stage's options read its position only through `position`: configurations that differ in pp share
            # them (a middle stage of pp 8 at index 3 is one of pp 12 at index 7), computed without the time cap
            configuration = self._configurations.setdefault(
                (strategy_key(config, _ALL_BUT_PP), variants_key(variants), micro_batches), len(self._configurations))
            key = (configuration, position, counts, tuple(p.name for p in site.pools), with_fixed)
            shared = self._placed_cache.get(key)
            if shared is None:
                placed, fewest = self._placed(stage, counts, config, variants, site, micro_batches, with_fixed,
                                              floors)
                # kept as numbers (a compile holds hundreds of thousands): each use composes its own cost when asked
                shared = self._placed_cache[key] = (
                    tuple((seconds, o.recompute, o.time, o.fill, o.dp_end, o.optimizer, o.offload, o.variant)
                          for seconds, o in placed),
                    tuple((hbm, r) for hbm, r in fewest.items() if r is not None))
            timed = [(row[0], StageOption(counts=counts, recompute=row[1], time=row[2], fill=row[3], dp_end=row[4],
                                          optimizer=row[5], offload=row[6], variant=row[7],
                                          composed=partial(self._recompose, stage, counts, row[1], row[7], config,
                                                           variants, site, micro_batches, with_fixed)))
                     for row in shared[0]]
            floors.update(shared[1])
        # pareto keeps an option only where none as fast is as good: it commutes with the cap
        found = [option for seconds, option in timed if seconds <= time_cap]
        return pareto(found) if prune else tuple(found)

    def position_key(self, stage: int, config: Strategy, site: StageSite, micro_batches: int) -> tuple | None:
        """What a stage's options read of its pipeline position under 1F1B (first, last, micro-batches in flight,
        which sends cross the fabric), or None where they read more (interleaved, V and other schedules)."""
        if config.pipeline_schedule != "1f1b" or config.vpp != 1:
            return None
        crossings = boundary_crossings(config, stage, nvlink_domain_gpus(site.pools), len(self.job.cluster.pools) > 1)
        return (config.pipelined, stage == 0, stage == config.pp - 1,
                in_flight_microbatches(config, stage, micro_batches), crossings)

    def _recompose(self, stage: int, counts: tuple[int, ...], recompute: int, index: int, config: Strategy,
                   variants: tuple[dict, ...], site: StageSite, micro_batches: int, with_fixed: bool) -> StageCost:
        """The full cost of a shared option (placement variants[index]) at this stage."""
        variant = variants[index]
        strategy = config.model_copy(update=variant) if variant else config
        return self.compose(stage, counts, recompute, strategy, site, micro_batches, with_fixed)

    def _placed(self, stage: int, counts: tuple[int, ...], config: Strategy, variants: tuple[dict, ...],
                site: StageSite, micro_batches: int, with_fixed: bool, floors: dict[tuple, int]
                ) -> tuple[list[tuple[float, StageOption]], dict[tuple, int | None]]:
        """(seconds per micro-batch, option) of the content under each placement variant that fits, any time; and
        each placement's fewest recomputed blocks (by its HBM-relevant keys; None: it does not fit)."""
        found = []
        fewest: dict[tuple, int | None] = {}  # by the placement's HBM-relevant keys (the FCDP cache is host-only)
        for index, variant in enumerate(variants):  # the variants without offload come first
            if offloads(variant) and fewest.get(()) == 0:
                continue  # nothing to buy: see _offload_pays
            strategy = config.model_copy(update=variant) if variant else config
            hbm_key = tuple(sorted((k, v) for k, v in variant.items() if k != "regather"))
            if hbm_key not in fewest:
                fewest[hbm_key] = self.fewest_recompute(stage, counts, strategy, site, micro_batches, with_fixed,
                                                        floors.get(hbm_key, 0), near=hbm_key in floors)
            recompute = fewest[hbm_key]
            if recompute is None or not offload_pays(variant, recompute, fewest.get(())):
                continue  # does not fit (the cache only adds host bytes: neither does its variant)
            option = self.option(stage, counts, strategy, site, micro_batches, float("inf"), recompute, with_fixed,
                                 variant=index)
            if option is not None:
                found.append((option.cost.microbatch, option))
        return found, fewest

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
            if not offloads(variant):
                plain = fewest if plain is None else min(plain, fewest)
            top = chunk if strategy.blocks_recomputable else fewest
            counts_of = [r for r in range(fewest, top + 1) if offload_pays(variant, r, plain)]
            for option in self._affine_options(stage, counts, strategy, site, micro_batches, time_cap, counts_of,
                                               index):
                by_count.setdefault(option.recompute, []).append(option)
        kept = [o for r in sorted(by_count) for o in (pareto(by_count[r]) if prune else by_count[r])]
        return tuple(kept)

    def _affine_options(self, stage: int, counts: tuple[int, ...], strategy: Strategy, site: StageSite,
                        micro_batches: int, time_cap: float, recomputes: list[int], variant: int) -> list[StageOption]:
        """The content's options at consecutive recompute counts from its fewest that fit, up to the time cap.

        A stage's time is affine in its recomputed blocks (each adds its forward and, under tensor parallelism,
        its collectives; the overlap windows are the compute without recomputation), and its step-end terms do
        not depend on them: two compositions give every count's time, and each option composes its full cost
        only when a report asks for it.  More recomputation only lowers HBM, so every count fits."""
        out: list[StageOption] = []
        for recompute in recomputes[:2]:
            option = self.option(stage, counts, strategy, site, micro_batches, time_cap, recompute, variant=variant)
            if option is None:
                return out  # over the time cap: more recomputation is slower still
            out.append(option)
        if len(out) < 2:
            return out
        first, slope = out[0].cost.microbatch, out[1].cost.microbatch - out[0].cost.microbatch
        for recompute in recomputes[2:]:
            seconds = first + (recompute - recomputes[0]) * slope
            if seconds > time_cap:
                break
            out.append(replace(out[0], recompute=recompute, time=round(seconds * NS),
                               composed=partial(self.compose, stage, counts, recompute, strategy, site,
                                                micro_batches)))
        return out

    def fewest_recompute(self, stage: int, counts: tuple[int, ...], strategy: Strategy, site: StageSite,
                         micro_batches: int, with_fixed: bool = True, min_recompute: int = 0,
                         near: bool = False) -> int | None:
        """The fewest fully recomputed blocks (per chunk) with which the stage fits, or None.

        Only memory is evaluated: the host tiers do not depend on recomputation, HBM falls as more
        blocks recompute (bisection).  min_recompute: a known lower bound (e.g. what a stage of one
        block fewer of the same kind needed), where the search starts; `near`: the answer is likely close to it."""
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
        if not can_recompute or chunk == 0:
            return None
        lo, hi = recompute + 1, chunk
        if near:
            # a close lower bound (a stage of one block fewer needed it): the fewest is a block or two above it, so
            # gallop up from it, then bisect the last step
            step = 1
            while True:
                hi = min(recompute + step, chunk)
                if memory_at(hi).fits_hbm:
                    break
                if hi == chunk:
                    return None
                lo, step = hi + 1, 2 * step
        elif not memory_at(chunk).fits_hbm:
            return None
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
        cost = self.compose(stage, counts, recompute, strategy, site, micro_batches, with_fixed)
        if not cost.memory.fits or cost.microbatch > time_cap:
            return None
        dp_end, optimizer, offload = (round(x * NS) for x in (cost.dp_exposed_end, cost.optimizer, cost.offload))
        return StageOption(counts=counts, recompute=recompute, time=round(cost.microbatch * NS),
                           fill=round(fill_seconds(strategy, cost) * NS), dp_end=dp_end,
                           optimizer=optimizer, offload=offload, composed=lambda: cost, variant=variant)

    def compose(self, stage: int, counts: tuple[int, ...], recompute: int, strategy: Strategy, site: StageSite,
                micro_batches: int, with_fixed: bool = True) -> StageCost:
        """The cost of a stage holding `counts` with `recompute` blocks recomputed (planner.cost.compose_stage)."""
        sums = self.stage_sums(stage, counts, recompute, strategy, site, with_fixed)
        return compose_stage(self.job, strategy, site, self.comms(strategy, site), sums, micro_batches,
                             self.catalog, cheapest_transfers=not with_fixed)


