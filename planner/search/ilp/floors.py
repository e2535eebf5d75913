"""Lower bounds of a configuration from the cost model alone, before (or instead of) its tables.

`TableBuilder` (planner.search.ilp.tables) inherits these; they share its caches (layer sums, a layer's
busy time, transfers, stage sums), keyed by what each computation reads (planner.fields):

* `lower_bound`: balanced stages, nothing recomputed, no stage-level terms (every configuration);
* `refined_bound`: memory-aware, each stage at the fewest recomputed blocks its best placement allows
  (the configurations the cheap bound keeps, once an incumbent exists);
* `sum_floor`: the least sum of stage times (the pipeline's bubble term).
"""

from __future__ import annotations

import bisect

from hardware import Catalog, Pool
from models.graph import Layer, RecomputeMode
from planner.cost.comm import P2P_READS, p2p_seconds
from planner.cost.layout import StageGroups, StageSite
from planner.cost.compute import layer_time
from planner.cost.memory import stage_memory
from planner.cost.stage import EXPERT_TIMES_READS, LAYER_TIMES_READS, compose_stage, layer_busy
from planner.cost.sums import StageSums
from planner.fields import Reader, reads
from planner.job import Job
from planner.search.ilp.bounds import (even_pipeline_bound, pipeline_fill_bound, pipeline_floor, slots_limit,
                                       smallest_sufficient)
from planner.search.ilp.segments import Segment, offloads, stage_contents, variants_key
from planner.strategy import Strategy, strategy_key

WORK_READS = reads(Reader.WORK)  # cheapest block's busy seconds
LOWER_READS = reads(Reader.LOWER)  # lower_bound
PROFILE_READS = reads(Reader.PROFILE)  # _slot_profile (placements: variants)


def last_stage_view(strategy: Strategy) -> Strategy:
    """The strategy whose last stage is this one's last stage, with the fewest stages: under a
    non-interleaved schedule the last of any number of stages holds one micro-batch in flight and
    exchanges one direction with one neighbour, so configurations that differ only in pp share its
    profile (interleaved chunks keep their pp: it sets their warm-up)."""
    if strategy.pp <= 2 or strategy.vpp > 1:
        return strategy
    return strategy.model_copy(update={"pp": 2})


class Floors:
    """The bounds of a TableBuilder (a mixin: it reads the builder's job, segments, caches and stage options)."""

    # What the builder holds: the job, its blocks' segments and the layers before and after them, and the
    # caches the bounds share with its tables, keyed by what each computation reads
    job: Job
    catalog: Catalog
    segments: list[Segment]
    before: tuple[Layer, ...]
    after: tuple[Layer, ...]
    _work_cache: dict[tuple, float]  # seconds: lower bounds, a layer's busy time, a stage's transfers
    _pair_cache: dict[tuple, tuple[float, float]]  # (fixed layers', cheapest block's) seconds on a pool
    _profile_cache: dict[tuple, tuple[list[float], float]]  # (a pool's slot profile, the cap it is complete to)

    # What the builder computes (planner.search.ilp.tables.TableBuilder)
    def site(self, stage: int, pools: tuple[Pool, ...]) -> StageSite:
        raise NotImplementedError

    def groups(self, strategy: Strategy, site: StageSite) -> StageGroups:
        raise NotImplementedError

    def stage_sums(self, stage: int, counts: tuple[int, ...], recompute: int, strategy: Strategy,
                   site: StageSite, with_fixed: bool = True) -> StageSums:
        raise NotImplementedError

    def fewest_recompute(self, stage: int, counts: tuple[int, ...], strategy: Strategy, site: StageSite,
                         micro_batches: int, with_fixed: bool = True, min_recompute: int = 0) -> int | None:
        raise NotImplementedError

    def lower_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int) -> float:
        """Seconds no split of this configuration beats (with every k-th block recomputed over pp > 1 stages: no
        split that recomputes a block; the others are its configuration without recomputation's plans).

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
        ranks = strategy.tp * strategy.cp * strategy.data_parallel
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

        extra = 0.0  # seconds the stages recompute at the least, all together
        if len(per_pool) == 1:
            w, c, _, _ = per_pool[0]
            extra = self._every_kth_floor(strategy, pools[0], blocks)
            lo = max((need * w + extra) / p + c,  # balanced stages
                     self._every_kth_stage_floor(strategy, pools[0], blocks, w, c))
        else:
            lo = slots_limit([(w, c, k) for w, c, _, k in per_pool], p, need)
        stage_sum = self.sum_floor(strategy, pools) + (0.0 if strategy.v_shape else extra)
        return pipeline_floor(lo, stage_sum, m, v)

    def _every_kth_floor(self, strategy: Strategy, pool: Pool, blocks: int) -> float:
        """With every k-th block recomputed: seconds the recomputed blocks add over all stages at the least.  A
        stage of n blocks recomputes n // k >= (n - k + 1) / k of them, so the pp stages recompute at least
        ceil((B - pp (k - 1)) / k), each costing at least the cheapest full block's busy time less the cheapest
        plain block's (a block's full busy time is at least its own plain one)."""
        every = strategy.recompute_every
        if every is None or not self.segments:
            return 0.0
        recomputed = max(0, -(-(blocks - strategy.pp * (every - 1)) // every))
        return recomputed * self._recompute_floor(strategy, pool) if recomputed else 0.0

    def _every_kth_stage_floor(self, strategy: Strategy, pool: Pool, blocks: int, work: float,
                               transfer: float) -> float:
        """With every k-th block recomputed over pp > 1 stages: a split whose stages all hold fewer than k blocks
        recomputes nothing and is a plan of the configuration without recomputation (the compiler reaches it
        first: search.space.every_kth_families), so some stage holds n >= max(k, ceil(B / pp)) blocks, n // k of
        them recomputed (inf when no stage can hold n)."""
        every = strategy.recompute_every
        if every is None or strategy.pp == 1 or not self.segments:
            return 0.0
        n = max(every, -(-blocks // strategy.pp))
        if n > (blocks // strategy.pp if strategy.vpp > 1 else blocks - strategy.pp + 1):
            return float("inf")
        return n * work + n // every * self._recompute_floor(strategy, pool) + transfer

    def _recompute_floor(self, strategy: Strategy, pool: Pool) -> float:
        """Seconds a fully recomputed block adds at the least: the cheapest full block's busy time less the
        cheapest plain block's (a block's full busy time is at least its own plain one)."""
        site = self.site(0, (pool,))
        plain = min(self._busy(f"seg{k}", seg.layers, "none", strategy, site) for k, seg in enumerate(self.segments))
        full = min(self._busy(f"seg{k}", seg.layers, "full", strategy, site) for k, seg in enumerate(self.segments))
        return max(0.0, full - plain)

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
        ranks = strategy.tp * strategy.cp * strategy.data_parallel
        blocks = sum(seg.size for seg in self.segments)
        if len(pools) == 1:
            # one pool: some stage holds at least ceil(B / pp) blocks; with every k-th block recomputed, at least
            # k too, or no block recomputes and the plan is one of the configuration without recomputation
            # (the compiler reaches it first: search.space.every_kth_families)
            most = max(-(-blocks // p), strategy.recompute_every or 0)
            fastest = self._stage_floor(strategy, pools[0], m, most, variants) if blocks else 0.0
            return pipeline_floor(fastest, self.sum_floor(strategy, pools), m, v)
        sum_term = self.sum_floor(strategy, pools) / v
        steady = m - 1 / v
        # the slowest stage a step under `enough` allows: (m - 1/v) T + sum / v < enough
        cap = (enough - sum_term) / steady if enough < float("inf") and m * v > 1 else float("inf")
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
        bound = steady * limit + sum_term
        if strategy.v_shape:  # the fills of a V are not the stage times the profiles bound
            return bound
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
        floors = [self.floor_time(strategy.pp - 1, counts, strategy, variants, site, micro_batches)
                  for counts in stage_contents(bounds, blocks)]
        return min((f[0] for f in floors if f is not None), default=float("inf"))

    def _slot_profile(self, strategy: Strategy, pool: Pool, micro_batches: int,
                      cap: float = float("inf"), variants: tuple[dict, ...] = ({},)) -> list[float]:
        """time[n-1]: fastest seconds per micro-batch of a stage of n blocks on `pool` (see refined_bound),
        for every n whose time is at most `cap`."""
        strategy = last_stage_view(strategy)
        key = ("profile", strategy_key(strategy, PROFILE_READS), variants_key(variants), micro_batches, pool.name)
        cached = self._profile_cache.get(key)
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
            fits = [f for counts in stage_contents(bounds, n)
                    if (f := self.floor_time(strategy.pp - 1, counts, strategy, variants, site, micro_batches,
                                             min_recompute=floor)) is not None]
            if not fits:
                break  # n blocks do not fit even fully recomputed; more never will
            if len(bounds) == 1:
                floor = min(r for _, r in fits)  # the least any placement needs
            times.append(max(min(t for t, _ in fits), times[-1] if times else 0.0))
            if times[-1] > cap:
                complete = cap  # longer stages are slower still: the rest cannot be within the cap
                break
        self._profile_cache[key] = (times, complete)
        return times

    def sum_floor(self, strategy: Strategy, pools: list[Pool]) -> float:
        """A lower bound on the sum of the stages' fills (planner.cost.pipeline): on sum_s t_s, the cheapest
        pool's work plus pp of the cheapest transfers; on a mixed cluster also every stage's first block on
        the pp cheapest slots (pool capacities) and the other blocks at the cheapest pool's work.  Under a
        zero-bubble V a fill is at least the stage's forward compute: every block's and the fixed layers'
        forward on the cheapest pool."""
        blocks = sum(seg.size for seg in self.segments)
        if strategy.v_shape:
            return min(self._forward_floor(strategy, pool, blocks) for pool in pools)
        works = [self._work_by_layer_group(strategy, pool) for pool in pools]
        transfers = [self._transfer(strategy, pool) for pool in pools]
        cheapest = min(w for _, w in works)
        fixed = min(f for f, _ in works)
        total = blocks * cheapest + fixed + strategy.pp * min(transfers)
        p = strategy.pp
        if len(pools) > 1 and blocks >= p:
            ranks = strategy.tp * strategy.cp * strategy.data_parallel
            firsts = sorted(w + c for (_, w), c, pool in zip(works, transfers, pools)
                            for _ in range(min(pool.gpus // ranks, p)))
            if len(firsts) >= p:
                total = max(total, sum(firsts[:p]) + (blocks - p) * cheapest + fixed)
        return total

    def _forward_floor(self, strategy: Strategy, pool: Pool, blocks: int) -> float:
        """Forward compute seconds per micro-batch of every block (each at the cheapest segment's) and of the fixed
        layers on `pool` (`StageSums.forward`: recompute and collectives apart)."""
        key = ("forward", strategy_key(strategy, WORK_READS), pool.name, blocks)
        if key not in self._work_cache:
            site = self.site(0, (pool,))
            fixed = self._forward("fixed", self.before + self.after, strategy, site)
            segments = enumerate(self.segments)
            cheapest = min((self._forward(f"seg{k}", seg.layers, strategy, site) for k, seg in segments), default=0.0)
            self._work_cache[key] = fixed + blocks * cheapest
        return self._work_cache[key]

    def _forward(self, name: str, layers: tuple[Layer, ...], strategy: Strategy, site: StageSite) -> float:
        """Forward compute seconds per micro-batch of the layers `name`, cached as `_busy` caches their busy time."""
        pools = tuple(p.name for p in site.pools)
        total = 0.0
        for index, layer in enumerate(layers):
            reads = EXPERT_TIMES_READS if layer.moe is not None else LAYER_TIMES_READS
            key = ("forward", name, index, strategy_key(strategy, reads), pools)
            if key not in self._work_cache:
                self._work_cache[key] = layer_time(layer, self.job, strategy, site.device, self.catalog, "none").forward
            total += self._work_cache[key]
        return total

    def _work_by_layer_group(self, strategy: Strategy, pool: Pool) -> tuple[float, float]:
        """(fixed layers' seconds, cheapest block's seconds) per micro-batch on `pool`, linear part only."""
        key = ("work", strategy_key(strategy, WORK_READS), pool.name)
        if key not in self._pair_cache:
            site = self.site(0, (pool,))
            fixed = self._busy("fixed", self.before + self.after, "none", strategy, site)  # on one stage or two
            # with every k-th block recomputed, some blocks are not: the cheapest block recomputes nothing
            mode: RecomputeMode = "none" if strategy.recompute_every is not None else strategy.recompute
            blocks = [self._busy(f"seg{k}", seg.layers, mode, strategy, site)
                      for k, seg in enumerate(self.segments)]
            self._pair_cache[key] = (fixed, min(blocks, default=0.0))
        return self._pair_cache[key]

    def _busy(self, name: str, layers: tuple[Layer, ...], mode: RecomputeMode, strategy: Strategy,
              site: StageSite) -> float:
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

    def floor_time(self, stage: int, counts: tuple[int, ...], config: Strategy, variants: tuple[dict, ...],
                   site: StageSite, micro_batches: int, min_recompute: int = 0) -> tuple[float, int] | None:
        """(seconds per micro-batch no placement of this content beats, the fewest recomputed blocks any of them
        needs), without the embedding and head; None when none fits.  The placement that keeps the least in HBM
        needs the fewest recomputed blocks (offload and the host cache move states, not activations, so their
        order does not change with recomputation), and at that count a placement without offload is the fastest
        (offload only adds time; _offload_pays): one bisection and a few compositions instead of each
        placement's own (the bounds' floors; placed_options builds the tables)."""
        least = self.stage_sums(stage, counts, min_recompute, config, site, False)  # placements share the sums
        placed = [(v, stage_memory(self.job, config.model_copy(update=v) if v else config, site, least,
                                   micro_batches, self.catalog)) for v in variants]
        placed = [(v, memory) for v, memory in placed if memory.fits_host]
        if not placed:
            return None
        lightest = min(placed, key=lambda item: item[1].total)[0]
        strategy = config.model_copy(update=lightest) if lightest else config
        recompute = self.fewest_recompute(stage, counts, strategy, site, micro_batches, False, min_recompute)
        if recompute is None:
            return None
        fastest = [v for v, _ in placed if not offloads(v)] or [v for v, _ in placed]
        sums = self.stage_sums(stage, counts, recompute, config, site, False)
        times = [compose_stage(self.job, config.model_copy(update=v) if v else config, site,
                               self.groups(config, site), sums, micro_batches, self.catalog,
                               cheapest_transfers=True).microbatch for v in fastest]
        return min(times), recompute
