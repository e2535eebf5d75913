"""Lower bounds of a configuration from the cost model alone, before (or instead of) its tables.

`TableBuilder` (planner.search.ilp.tables) inherits these; they share its caches (layer sums, a layer's
busy time, transfers, stage sums), keyed by what each computation reads (planner.fields):

* `lower_bound`: balanced stages, nothing recomputed, no stage-level terms (every configuration);
* `refined_bound`: memory-aware, each stage at the fewest recomputed blocks its best placement allows at
  its pipeline position (the first stage holds the most micro-batches in flight and the embedding, the last
  the head), with the split shape the runtime allows (Megatron's equal middle stages); one stage is the
  whole model m times (the configurations the cheap bound keeps, once an incumbent exists);
* `sum_floor`: the least sum of stage times (the pipeline's bubble term).
"""

from __future__ import annotations

import bisect

from hardware import Catalog, Pool
from models.graph import Layer, RecomputeMode
from planner.cost.comm import P2P_READS, p2p_seconds
from planner.cost.layout import StageComms, StageSite
from planner.cost.compute import layer_time
from planner.cost.memory import stage_memory
from planner.cost.stage import EXPERT_TIMES_READS, LAYER_TIMES_READS, compose_stage, layer_busy
from planner.cost.sums import StageSums
from planner.fields import Reader, reads
from planner.job import Job
from planner.search.ilp.bounds import (capacity, even_pipeline_bound, pipeline_fill_bound, pipeline_floor,
                                       slots_limit, smallest_sufficient)
from planner.search.ilp.segments import Segment, offloads, stage_contents, variants_key
from planner.strategy import Strategy, strategy_key

WORK_READS = reads(Reader.WORK)  # cheapest block's busy seconds
LOWER_READS = reads(Reader.LOWER)  # lower_bound
PROFILE_READS = reads(Reader.PROFILE)  # _slot_profile (placements: variants)
BALANCED_READS = reads(Reader.PROFILE, Reader.LOWER)  # balanced_bound: a stage's floor and sum_floor
PROFILED_STAGE_BLOCKS = 8  # one pool: stage profiles by position only where an even stage holds at most this many


def last_stage_view(strategy: Strategy) -> Strategy:
    """The strategy whose last stage is this one's last stage, with the fewest stages: under a
    non-interleaved schedule the last of any number of stages holds one micro-batch in flight and
    exchanges one direction with one neighbour, so configurations that differ only in pp share its
    profile (interleaved chunks keep their pp: it sets their warm-up)."""
    if strategy.pp <= 2 or strategy.vpp > 1:
        return strategy
    return strategy.model_copy(update={"pp": 2})


def contents_at(segment_bounds: tuple[tuple[int, int], ...], length: int, starts) -> tuple[tuple[int, ...], ...]:
    """Distinct per-segment counts of a run of `length` blocks starting at each of `starts`."""
    seen: dict[tuple[int, ...], None] = {}
    for start in starts:
        end = start + length
        seen.setdefault(tuple(max(0, min(end, hi) - max(start, lo)) for lo, hi in segment_bounds), None)
    return tuple(seen)


def position_classes(pp: int) -> list[tuple[int, int]]:
    """(pipeline position, stages it bounds) covering the pp stages: the first alone (it holds the most
    micro-batches in flight and the embedding), then positions pp-1-(2^j - 1) (pp-1, pp-2, pp-4, ...) each
    standing for the stages after the previous one up to it.  A later position holds no more in flight and
    the same receive buffers (the middle stages) or fewer (the last), so its floor bounds the earlier stages
    of its class: about log2(pp) profiles bound every stage by a position at most twice as close to the end."""
    positions = sorted({0} | {max(0, pp - 1 - (2 ** j - 1)) for j in range(pp.bit_length() + 1)})
    return [(q, q - previous) for previous, q in zip([-1, *positions], positions)]


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

    def comms(self, strategy: Strategy, site: StageSite) -> StageComms:
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
        first: search.space.every_kth_ks), so some stage holds n >= max(k, ceil(B / pp)) blocks, n // k of
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
                      enough: float = float("inf"), variants: tuple[dict, ...] = ({},), split: str = "any") -> float:
        """A memory-aware bound (inf when the blocks cannot be placed at all).

        A stage's time profile, time[n-1], is the fastest a stage of n blocks can run at its pipeline position
        on a pool: the fewest recomputed blocks its HBM allows there (under its best placement), with the
        embedding on the first stage and the head on the last (planner.search.ilp.floors.position_classes
        groups the middle stages, each bounded by a later position: fewer micro-batches in flight need no
        more memory).  The bottleneck is at least the smallest T at which the stages, each on a slot of a
        pool and within T, hold all B blocks; the sum of stage times at least their fill
        (bounds.pipeline_fill_bound).  For one stage this is the stage itself: m x its time.

        `enough`: a value that settles the question (the incumbent).  Profiles
        then stop at the stage time that step would allow, and when the blocks
        do not fit within it the bound returned is `enough` itself (the true
        bound is no smaller).  `split`: the space's split shape (SpaceOptions.split_shape); under "ends" (Megatron's
        uneven first and last stages) the middle stages hold equal blocks (_ends_bound).
        """
        p, v, m = strategy.pp, strategy.vpp, micro_batches
        blocks = sum(seg.size for seg in self.segments)
        sum_term = self.sum_floor(strategy, pools) / v
        if not blocks:
            return sum_term  # recsys: one stage of fixed layers (its time is in the sum)
        # the slowest stage a step under `enough` allows: (m - 1/v) T + sum / v < enough
        cap = (enough - sum_term) / (m - 1 / v) if enough < float("inf") and m * v > 1 else float("inf")
        if p == 1:  # one stage holds everything: m x its floor
            return max(sum_term, m * min(self._stage_floor(strategy, pool, m, 0, blocks, variants, with_fixed=True)
                                         for pool in pools))
        quick = self.balanced_bound(strategy, pools, m, variants) if len(pools) == 1 else 0.0
        if quick >= enough:
            return quick
        if strategy.v_shape:
            # a V's fills are not its stage times and its head sits on the first stage (planner.cost.pipeline):
            # the position profiles and the fill bounds do not hold, the balanced bound and lower_bound do
            return max(quick, self.lower_bound(strategy, pools, m))
        if split == "ends" and p > 2 and v == 1 and len(pools) == 1:
            return max(quick, self._ends_bound(strategy, pools[0], m, cap, variants, sum_term, enough))
        if len(pools) == 1 and -(-blocks // p) > PROFILED_STAGE_BLOCKS:
            return quick  # long stages: the profiles would cost more than the tables they spare
        return max(quick, self._positional_bound(strategy, pools, m, cap, variants, position_classes(p), sum_term,
                                                 enough))

    def _positional_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int, cap: float,
                          variants: tuple[dict, ...], classes: list[tuple[int, int]], sum_term: float,
                          enough: float) -> float:
        """refined_bound over stage profiles at the positions of `classes` ((position, stages it bounds))."""
        p, v, m = strategy.pp, strategy.vpp, micro_batches
        ranks = strategy.tp * strategy.cp * strategy.data_parallel
        blocks = sum(seg.size for seg in self.segments)
        profiles = []
        pool_slots = [pool.gpus // ranks if len(pools) > 1 else p for pool in pools]
        for pool, slots in zip(pools, pool_slots):
            profiles += [(self._slot_profile(strategy, pool, m, cap, variants, position, most=blocks - p + 1,
                                             after=position - stages + 1), min(slots, stages))
                         for position, stages in classes]

        def held(limit: float) -> int:
            most = [bisect.bisect_right(times, limit) for times, _ in profiles]  # [pool x classes + class]
            per_entry = capacity([(n, slots) for n, (_, slots) in zip(most, profiles)], p)
            if len(pools) == 1:
                return per_entry
            # the stages of a class (on any pool) and the stages on a pool (at any position) are limited too:
            # each bound drops one of the two limits, so each is at least the true capacity
            by_pool = [max(most[i * len(classes):(i + 1) * len(classes)]) for i in range(len(pools))]
            by_class = [max(most[c::len(classes)]) for c in range(len(classes))]
            return min(per_entry, capacity(list(zip(by_pool, pool_slots)), p),
                       capacity([(n, stages) for n, (_, stages) in zip(by_class, classes)], p))

        limit = smallest_sufficient(sorted({t for times, _ in profiles for t in times}), held, blocks)
        if limit > cap:
            # profiles are complete only up to the cap: all we know is that no placement fits within it,
            # so the bound is at least `enough`
            return enough
        if limit == float("inf"):
            return limit  # complete profiles and no split fits
        bound = (m - 1 / v) * limit + sum_term
        if v > 1:  # interleaved chunks: every stage holds blocks / pp
            return max(bound, even_pipeline_bound(profiles, p, blocks // p, m, v, enough))
        # the stages fill the slots they take: their sum bounds the bubble
        return max(bound, pipeline_fill_bound(profiles, p, blocks, m, v, limit, enough))

    def _ends_bound(self, strategy: Strategy, pool: Pool, micro_batches: int, cap: float,
                    variants: tuple[dict, ...], sum_term: float, enough: float) -> float:
        """refined_bound when the pp - 2 middle stages hold n blocks each and the first and last a and b, a + b =
        B - (pp - 2) n (SpaceOptions.split_shape "ends").  For each n the bottleneck is at least the second
        stage's time for n blocks (the middle stage with the most in flight; also a later one past the first
        segment, which starts after that many blocks) and the better of the ends' splits;
        the sum at least the ends' cheapest pair plus pp - 2 times the last middle position's time.  The least
        over n; `enough` when no n runs within the cap (the profiles stop there)."""
        p, m = strategy.pp, micro_batches
        blocks = sum(seg.size for seg in self.segments)
        most = blocks - p + 1

        def profile(position: int) -> list[float]:
            return self._slot_profile(strategy, pool, m, cap, variants, position, most=most, after=position)

        # the middle stage with the most in flight, and the first past the first segment (on DeepSeek-V3 the
        # first middle stage that holds only MoE blocks)
        deep = min(p - 2, self.segments[0].size) if len(self.segments) > 1 else 1
        first, second, third, middle, last = profile(0), profile(1), profile(deep), profile(p - 2), profile(p - 1)
        best = float("inf")
        for n in range(1, min(len(second), len(third), (blocks - 2) // (p - 2)) + 1):
            rest = blocks - (p - 2) * n  # the ends' blocks, at least one each
            pairs = [(first[a - 1], last[rest - a - 1])
                     for a in range(max(1, rest - len(last)), min(len(first), rest - 1) + 1)]
            if not pairs:
                continue
            bottleneck = max(second[n - 1], third[n - 1], min(max(pair) for pair in pairs))
            ends = min(sum(pair) for pair in pairs)
            total = max(sum_term, ends + (p - 2) * (middle[n - 1] if n <= len(middle) else 0.0))
            best = min(best, (m - 1) * bottleneck + total)
        if best == float("inf"):
            return enough if cap < float("inf") else best
        return best

    def balanced_bound(self, strategy: Strategy, pools: list[Pool], micro_batches: int,
                       variants: tuple[dict, ...] = ({},)) -> float:
        """The cheap memory-aware test on one pool: some stage holds ceil(B / pp) blocks, no faster than at the
        last position (without embedding and head).  Weaker than refined_bound, but never capped at an
        incumbent: it orders the runners-up the incumbent closed."""
        p, v, m = strategy.pp, strategy.vpp, micro_batches
        blocks = sum(seg.size for seg in self.segments)
        key = ("balanced", strategy_key(strategy, BALANCED_READS), variants_key(variants), m, pools[0].name)
        if key not in self._work_cache:
            fastest = self._stage_floor(strategy, pools[0], m, p - 1, -(-blocks // p), variants) if blocks else 0.0
            self._work_cache[key] = (m - 1 / v) * fastest + self.sum_floor(strategy, pools) / v
        return self._work_cache[key]

    def _stage_floor(self, strategy: Strategy, pool: Pool, micro_batches: int, position: int, blocks: int,
                     variants: tuple[dict, ...], with_fixed: bool = False) -> float:
        """Fastest seconds per micro-batch of any stage of `blocks` blocks at `position` on `pool` (inf if none
        fits)."""
        site = self.site(position, (pool,))
        bounds = tuple((seg.start - self.segments[0].start, seg.end - self.segments[0].start)
                       for seg in self.segments)
        floors = [self.floor_time(position, counts, strategy, variants, site, micro_batches, with_fixed=with_fixed)
                  for counts in stage_contents(bounds, blocks)]
        return min((f[0] for f in floors if f is not None), default=float("inf"))

    def _slot_profile(self, strategy: Strategy, pool: Pool, micro_batches: int,
                      cap: float = float("inf"), variants: tuple[dict, ...] = ({},),
                      position: int | None = None, most: int | None = None, after: int = 0) -> list[float]:
        """time[n-1]: fastest seconds per micro-batch of a stage of n blocks at pipeline `position` (default the
        last) on `pool` (see refined_bound), for every n whose time is at most `cap`.  The first stage starts at
        the first block and carries the embedding, the last ends at the last block and carries the head; a
        middle one starts at block `after` or later (the stages before it hold a block each) and leaves a block
        to each stage after `position`.  `most`: the longest stage asked for."""
        p = strategy.pp
        position = p - 1 if position is None else position
        blocks = sum(seg.size for seg in self.segments)
        last = position == p - 1
        # the blocks a stage of this position may start at and end by
        first, end = (0, blocks) if position == 0 else (after, blocks - (p - 1 - position))
        if last:
            strategy = last_stage_view(strategy)
            position, first = strategy.pp - 1, -1  # -1: it ends at the last block
        with_fixed = position == 0 or last
        key = ("profile", strategy_key(strategy, PROFILE_READS), variants_key(variants), micro_batches, pool.name,
               position, last, most, first, end)
        cached = self._profile_cache.get(key)
        if cached is not None and cached[1] >= cap:
            return cached[0]
        site = self.site(position, (pool,))
        bounds = tuple((seg.start - self.segments[0].start, seg.end - self.segments[0].start)
                       for seg in self.segments)
        times: list[float] = []
        # one kind of block: a stage of n blocks recomputes at least what one of n - 1 needed
        floor = 0
        complete = float("inf")  # the profile holds every n (it stopped where nothing fits)
        # interleaved: a stage of fewer blocks than chunks has a chunk of none, so it cannot recompute (per chunk)
        # and may not fit where a longer one does; no plan has one (every chunk holds a block), so those lengths
        # take the first longer stage's time, no more than any stage of a plan at this position
        short = 0
        for n in range(1, min(blocks, most or blocks) + 1):
            starts = [blocks - n] if first < 0 else [0] if position == 0 else range(first, end - n + 1)
            fits = [f for counts in contents_at(bounds, n, starts)
                    if (f := self.floor_time(position, counts, strategy, variants, site, micro_batches,
                                             min_recompute=floor, with_fixed=with_fixed)) is not None]
            if not fits and n < strategy.vpp:
                short += 1
                continue
            if not fits:
                break  # n blocks do not fit even fully recomputed (or leave no block to a later stage)
            if len(bounds) == 1:
                floor = min(r for _, r in fits)  # the least any placement needs
            times += [max(min(t for t, _ in fits), times[-1] if times else 0.0)] * (short + 1)
            short = 0
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
                groups = self.comms(strategy, site)
                self._work_cache[key] = layer_busy(layer, self.job, strategy, site, groups, self.catalog, mode)
            total += self._work_cache[key]
        return total

    def _transfer(self, strategy: Strategy, pool: Pool) -> float:
        """Pipeline transfer seconds per micro-batch of a stage on `pool`."""
        key = ("p2p", strategy_key(strategy, P2P_READS), pool.name)
        if key not in self._work_cache:
            site = self.site(0, (pool,))
            groups = self.comms(strategy, site)
            self._work_cache[key] = p2p_seconds(float(self.job.model.hidden), self.job, strategy, groups, self.catalog)
        return self._work_cache[key]

    def floor_time(self, stage: int, counts: tuple[int, ...], config: Strategy, variants: tuple[dict, ...],
                   site: StageSite, micro_batches: int, min_recompute: int = 0,
                   with_fixed: bool = False) -> tuple[float, int] | None:
        """(seconds per micro-batch no placement of this content beats, the fewest recomputed blocks any of them
        needs), with the embedding and head only where `with_fixed` (at the first and last position); None when
        none fits.  The placement that keeps the least in HBM
        needs the fewest recomputed blocks (offload and the host cache move states, not activations, so their
        order does not change with recomputation), and at that count a placement without offload is the fastest
        (offload only adds time; _offload_pays): one bisection and a few compositions instead of each
        placement's own (the bounds' floors; placed_options builds the tables)."""
        least = self.stage_sums(stage, counts, min_recompute, config, site, with_fixed)  # placements share the sums
        placed = [(v, stage_memory(self.job, config.model_copy(update=v) if v else config, site, least,
                                   micro_batches, self.catalog)) for v in variants]
        placed = [(v, memory) for v, memory in placed if memory.fits_host]
        if not placed:
            return None
        lightest = min(placed, key=lambda item: item[1].total)[0]
        strategy = config.model_copy(update=lightest) if lightest else config
        recompute = self.fewest_recompute(stage, counts, strategy, site, micro_batches, with_fixed, min_recompute)
        if recompute is None:
            return None
        fastest = [v for v, _ in placed if not offloads(v)] or [v for v, _ in placed]
        sums = self.stage_sums(stage, counts, recompute, config, site, with_fixed)
        times = [compose_stage(self.job, config.model_copy(update=v) if v else config, site,
                               self.comms(config, site), sums, micro_batches, self.catalog,
                               cheapest_transfers=True).microbatch for v in fastest]
        return min(times), recompute
