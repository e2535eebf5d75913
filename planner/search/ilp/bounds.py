"""Bounds on the step time of one configuration, from its cost tables or from pool speeds alone.

Pure functions of numbers (no cost model calls), shared by the table
builder's configuration bounds and the solver's pruning.
"""

from __future__ import annotations

import bisect
import itertools
NS = 1e9  # table units: nanoseconds (integer scaling lives only in the program builder)


def pipeline_floor(bottleneck: float, stage_sum: float, micro_batches: int, vpp: int) -> float:
    """The pipeline formula's floor from a bottleneck floor T and a floor S on the sum of the stages' fills:
    (m - 1/v) T + S / v.  m max t + (sum u - max u) / v is at least that, as max u <= max t: the fills u are
    the stage times, or under a zero-bubble V at least the stages' forward compute and at most their times
    (planner.cost.pipeline), so S is a floor on the sum of those (Floors.sum_floor)."""
    return (micro_batches - 1 / vpp) * bottleneck + stage_sum / vpp


def bottleneck_bound(entries: list[list[tuple[int, int]]], blocks: int, micro_batches: int, vpp: int,
                     fill_floor: int | None = None,
                     pool_entries: list[tuple[list[tuple[int, int]], int]] | None = None) -> float:
    """Seconds no split beats, from each stage's sorted (time in NS, blocks) table entries: the smallest
    T such that the stages, each holding the most blocks it can within T (any pool), hold every block;
    then the pipeline formula with each stage at its fastest entry for the sum (`fill_floor`: the sum of the
    stages' least fills instead, where fills are not the stage times: zero-bubble V schedules).

    `pool_entries` (mixed clusters): per pool, every stage's (time, blocks) entries there and the stages the
    pool can host.  The stages then also hold no more than the pools' slots do, each slot at the most any stage
    holds on that pool within T (`capacity`): both counts are at least what any assignment holds."""
    m = micro_batches
    stages = len(entries)

    def held(limit: int) -> int:
        by_stage = sum(max((n for t, n in stage if t <= limit), default=-1) for stage in entries)
        if pool_entries is None:
            return by_stage
        by_pool = capacity([(max((n for t, n in pool if t <= limit), default=0), min(slots, stages))
                            for pool, slots in pool_entries], stages)
        return min(by_stage, by_pool)

    limit = smallest_sufficient(sorted({t for stage in entries for t, _ in stage}), held, blocks)
    fastest = sum(stage[0][0] for stage in entries) if fill_floor is None else fill_floor
    bound = pipeline_floor(limit, fastest, m, vpp)
    if fill_floor is None and vpp == 1 and limit < float("inf"):
        bound = max(bound, stage_sum_bound([_profile(stage) for stage in entries], blocks, m, limit))
        if pool_entries is not None:
            # the same by pools: the stages take the pools' slots, each at no less than the pool's fastest stage
            profiles = [(_floor_profile(_profile(pool)), min(slots, stages)) for pool, slots in pool_entries]
            bound = max(bound, pipeline_fill_bound(profiles, stages, blocks, m, 1, limit, float("inf")))
    return bound / NS


def _floor_profile(times: list[float]) -> list[float]:
    """The largest non-decreasing profile under `times` (pipeline_fill_bound reads its profiles sorted): each n at
    the least time of any stage of n or more blocks, no more than its own; without the trailing lengths no stage
    runs."""
    out, least = [], float("inf")
    for t in reversed(times):
        least = min(least, t)
        out.append(least)
    out.reverse()
    while out and out[-1] == float("inf"):
        out.pop()
    return out


def _profile(entries: list[tuple[int, int]]) -> list[float]:
    """times[n-1]: a stage's fastest entry of n blocks, from its (time, blocks) entries (inf where it has none)."""
    most = max((n for _, n in entries), default=0)
    times = [float("inf")] * most
    for t, n in entries:
        if n and t < times[n - 1]:
            times[n - 1] = t
    return times


def stage_sum_bound(profiles: list[list[float]], blocks: int, micro: int, start: float) -> float:
    """A bound on (m - 1) max_s t_s + sum_s t_s, one profile per stage (times[n-1]: the fastest stage s holding n
    blocks runs; 1F1B, v = 1): pipeline_fill_bound with each stage a pool of one slot, at its profile's
    non-decreasing floor.  At a bottleneck T from `start` (bottleneck_bound's limit) on, the stages' sum is at least
    their one-block times plus the B - pp cheapest increments of their profiles' convex hulls within T; inf when no
    limit holds every block."""
    return pipeline_fill_bound([(_floor_profile(times), 1) for times in profiles], len(profiles), blocks, micro, 1,
                               start, float("inf"))


def capacity(slots: list[tuple[int, int]], stages: int) -> int:
    """The most blocks `stages` stages hold when a slot kind (n, k) offers k stages of at most n blocks each, the
    kinds that hold most taken first; -1 when the stages cannot all hold a block (too few slots of n >= 1)."""
    left, total = stages, 0
    for most, count in sorted(slots, reverse=True):
        take = min(left, count)
        if take and most == 0:
            return -1  # every stage holds a block: pp stages do not all run within the limit
        total += take * most
        left -= take
    return total if left == 0 else -1


def slots_limit(pools: list[tuple[float, float, int]], stages: int, need: float) -> float:
    """Smallest T at which `stages` stage slots hold `need` blocks within T seconds each.

    A slot of pool (w, c, k) holds max(0, (T - c) / w) blocks and the pool has k slots.  The best
    slots at T are taken greedily by that gain, so capacity(T) is the largest, over the orders of
    the pools, of filling the slots in that order: T = min over orders of the T solving that
    order's piecewise-linear equation (exact; bisection beyond 6 pools).  Every stage holds at
    least one block, so T is also at least w + c of the `stages`-th fastest slot.
    """
    return max(_fluid_limit(pools, stages, need), _one_block_each(pools, stages))


def _one_block_each(pools: list[tuple[float, float, int]], stages: int) -> float:
    """The least T at which `stages` slots each run one block: the stages-th smallest w + c over the slots."""
    slots = sorted(w + c for w, c, k in pools for _ in range(min(k, stages)))
    return slots[stages - 1] if len(slots) >= stages else float("inf")


def _fluid_limit(pools: list[tuple[float, float, int]], stages: int, need: float) -> float:
    if len(pools) > 6:
        def capacity(limit: float) -> float:
            left, held = stages, 0.0
            for gain, slots in sorted((((limit - c) / w, k) for w, c, k in pools), reverse=True):
                take = min(left, slots)
                held += take * max(0.0, gain)
                left -= take
            return held

        lo, hi = 0.0, max(need * w + c for w, c, _ in pools)
        for _ in range(48):  # lo stays a valid bound at any precision
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if capacity(mid) >= need else (mid, hi)
        return lo
    best = float("inf")
    for order in itertools.permutations(range(len(pools))):
        left, rates = stages, []
        for i in order:
            w, c, k = pools[i]
            take = min(left, k)
            if take:
                rates.append((c, take / w))
            left -= take
        rates.sort()
        slope = offset = 0.0  # held(T) = slope * T - offset between consecutive transfer costs
        for j, (c, rate) in enumerate(rates):
            slope, offset = slope + rate, offset + rate * c
            limit = (need + offset) / slope
            if j + 1 == len(rates) or limit <= rates[j + 1][0]:
                best = min(best, limit)
                break
    return best


def smallest_sufficient(candidates: list, held, need: int) -> float:
    """The smallest candidate time limit at which `held(limit)` blocks reach `need` (inf if none),
    by bisection: held only grows with the limit."""
    lo, hi = 0, len(candidates)
    while lo < hi:
        mid = (lo + hi) // 2
        if held(candidates[mid]) >= need:
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo] if lo < len(candidates) else float("inf")


def _hull_increments(times: list[float]) -> list[float]:
    """Increments of the lower convex hull of (n, times[n-1]), n = 1..len(times): non-decreasing, and
    times[0] + the first j of them <= times[j] (the hull lies below every point)."""
    hull: list[tuple[int, float]] = []
    for n, t in enumerate(times, start=1):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (n - x1) >= (t - y1) * (x2 - x1):  # hull[-1] is not below the chord
                hull.pop()
            else:
                break
        hull.append((n, t))
    out: list[float] = []
    for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
        out += [(y2 - y1) / (x2 - x1)] * (x2 - x1)
    return out


def pipeline_fill_bound(profiles: list[tuple[list[float], int]], stages: int, blocks: int, micro: float,
                        chunks: int, start: float, enough: float) -> float:
    """A bound on (micro - 1/v) max_s t_s + sum_s t_s / v over every choice of `stages` stage slots.

    profiles: per pool (times[n-1] = the fastest a stage of n blocks can run there, complete up to
    the cap, non-decreasing; slots of the pool).  At a bottleneck T a slot runs between 1 and
    n_p(T) = #{times <= T} blocks.  Whichever slots the stages take, their one-block times add up to
    at least the `stages` smallest one-block times within T, and their further blocks cost at least
    the cheapest increments of the pools' convex hulls (non-decreasing), offered once per slot.  The
    step at T is at least (micro - 1/v) T + that sum / v, whose sum part is constant between profile
    breakpoints, so the bound is the least of it over the breakpoints from `start` (the bottleneck
    bound) on; `enough` when none is below it.
    """
    increments = [_hull_increments(times) for times, _ in profiles]
    best = enough
    # the bottleneck itself (a pool's slots may set it above every profile's own times) and the times above it
    for limit in sorted({start} | {t for times, _ in profiles for t in times if t > start}):
        if (micro - 1 / chunks) * limit >= best:
            break  # the sum only adds
        # a pool where no stage fits (no times) offers no slot
        usable = [(times, slots, steps) for (times, slots), steps in zip(profiles, increments)
                  if slots and times and times[0] <= limit]
        firsts = sorted(times[0] for times, slots, _ in usable for _ in range(min(slots, stages)))
        offered = sorted(d for times, slots, steps in usable
                         for d in steps[: bisect.bisect_right(times, limit) - 1] for _ in range(slots))
        extra = blocks - stages
        if len(firsts) < stages or len(offered) < extra:
            continue  # the slots cannot run every stage, or hold every block, within this limit
        best = min(best, (micro - 1 / chunks) * limit + (sum(firsts[:stages]) + sum(offered[:extra])) / chunks)
    return best


def even_pipeline_bound(profiles: list[tuple[list[float], int]], stages: int, per_stage: int, micro: float,
                        chunks: int, enough: float) -> float:
    """The bound when every stage holds `per_stage` blocks (interleaved chunks, even splits): the stages
    take `stages` slots, so the bottleneck is at least the stages-th smallest time of such a stage over
    the slots and the sum at least the `stages` smallest; `enough` when too few slots run one within the
    profiles (complete up to the cap)."""
    one = sorted(times[per_stage - 1] for times, slots in profiles if len(times) >= per_stage
                 for _ in range(min(slots, stages)))
    if len(one) < stages:
        return enough
    return (micro - 1 / chunks) * one[stages - 1] + sum(one[:stages]) / chunks
