"""Bounds on the step time of one configuration, from its cost tables or from pool speeds alone.

Pure functions of numbers (no cost model calls), shared by the table
builder's configuration bounds and the solver's pruning.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tables.py imports this module; the type is only named
    from planner.ilp.tables import ConfigTables

NS = 1e9  # table units: nanoseconds (integer scaling lives only in the program builder)


def bottleneck_bound(tables: "ConfigTables") -> float:
    """Seconds no split in these tables beats: the smallest T such that the stages, each holding
    the most blocks it can within T (any pool), hold every block; then the pipeline formula with
    each stage at its fastest entry for the sum."""
    strategy = tables.strategy
    v, m = strategy.vpp, tables.micro_batches
    entries = []  # per stage: (time, blocks) pairs
    for per_pool in tables.options:
        entries.append(sorted((o.time, sum(c)) for options in per_pool for c, placed in options.items()
                              for o in placed))
    blocks = tables.blocks

    def held(limit: int) -> int:
        return sum(max((n for t, n in stage if t <= limit), default=-1) for stage in entries)

    limit = smallest_sufficient(sorted({t for stage in entries for t, _ in stage}), held, blocks)
    fastest = sum(stage[0][0] for stage in entries)
    return ((m - 1 / v) * limit + fastest / v) / NS


def slots_limit(pools: list[tuple[float, float, int]], stages: int, need: float) -> float:
    """Smallest T at which `stages` stage slots hold `need` blocks within T seconds each.

    A slot of pool (w, c, k) holds max(0, (T - c) / w) blocks and the pool has k slots.  The best
    slots at T are taken greedily by that gain, so capacity(T) is the largest, over the orders of
    the pools, of filling the slots in that order: T = min over orders of the T solving that
    order's piecewise-linear equation (exact; bisection beyond 6 pools).
    """
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
