"""Replica-group search: how to split the batch over the pools, and each pool's best strategy.

The space (planner.cost.replica_groups): every pool either idles or runs one replica
group on its share of the global batch B.  Shares are multiples of a grain
g = B / N sequences (N the largest power of two up to 16 dividing B), and a
group may use any strategy of its pool's space whose data-parallel width times
micro-batch divides g (for interleaving, g / (dp * mbs) a multiple of pp too).
So tensor-parallel degree, pipeline depth, micro-batch and ZeRO stage are
chosen per pool, and faster pools take more samples.

That grain rule makes T[p, n], the best step time of pool p on n * g
sequences, nondecreasing in n: a strategy legal for n shares is legal for
fewer, with fewer micro-batches, no more memory and less time.  T[p, n] is a
certified compile of the pool's sub-job (`compile_job`'s branch and bound
with CP-SAT inside), asked only as "is T[p, n] <= tau?" with tau as the
compile's step-time cap, so a share that cannot matter costs one pruned
search.  Then:

1. the incumbent U: the best single-strategy plan (planner.search.compile walks the
   configurations first), or, without one, water-filling: shares in proportion to each
   pool's measured speed (shares per second), three rounds;
2. proof: for every set S of active pools, a split with max T < U - sync(S)
   exists iff the pools' largest shares under that limit add up to N
   (`_Shares.fitting`, by bisection over n under monotonicity, each question one
   compile that may stop at its first plan within the limit: `first`); if one
   does, its shares are compiled to their optimum, it becomes the incumbent and
   the check restarts.  When no set improves, U is optimal over the space.

Past the time limit only the shares of a first split are still compiled (no
cap: the search has no plan yet); then the search returns what it has, with
`stopped` set, and the bound falls back to what the table knows (`split_floor`)
for what it never asked.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from hardware import Catalog
from planner.cost.replica_groups import ReplicaGroup, group_job, sync_seconds
from planner.job import Job
from planner.search.result import CompileResult

MAX_SHARES = 16
WATER_FILL_ROUNDS = 3


@dataclass
class Entry:
    """What is known of T[p, n]: a plan no slower than `below` (its compile in `result`) and a proof that none is
    faster than `above`."""

    below: float = float("inf")  # the fastest plan found so far
    above: float = 0.0  # T >= above: a compile's bound, or the pool's compute floor
    result: CompileResult | None = None  # the compile that found the plan at `below`
    unproven: bool = False  # once answered "no plan within the cap" by a compile the time limit cut short

    @property
    def exact(self) -> bool:
        """Whether `below` is T itself (a compile certified it optimal)."""
        return self.below <= self.above * (1 + 1e-9)

    @property
    def compiled(self) -> CompileResult:
        """The pool sub-job's result of an entry with a plan; ValueError for one only bounded."""
        if self.result is None:
            raise ValueError("the entry has no plan, only a bound")
        return self.result


@dataclass
class GroupSearch:
    """Result of the replica-group search."""

    groups: list[ReplicaGroup] | None = None  # compile_job re-checks them with evaluate_groups
    objective: float = float("inf")
    bound: float = 0.0
    results: dict = field(default_factory=dict)  # pool -> its group's CompileResult
    compiled: int = 0  # pool sub-jobs compiled
    stopped: bool = False  # the time limit cut the search short (what it found depends on the machine)


def share_grid(batch: int) -> int:
    """N: the number of batch shares (the largest power of two up to MAX_SHARES dividing `batch`)."""
    n = 1
    while n * 2 <= MAX_SHARES and batch % (n * 2) == 0:
        n *= 2
    return n


def compute_floor(job: Job, pool: str, batch: int, catalog: Catalog) -> float:
    """Seconds no plan of `batch` sequences on `pool` beats: its FLOPs at the best GEMM rate of every GPU."""
    node = job.cluster.pool(pool)
    device = catalog.node_device(node.node)
    rate = (max(device.peak_flops.values()) * device.throughput_scale
            * max(s.efficiency for s in device.matmul_efficiency))
    if job.fp8:  # the larger realised speedup keeps this a floor
        rate *= max(catalog.constant("fp8_gemm_speedup_cap"), catalog.constant("mxfp8_gemm_speedup"))
    flops = batch * job.seq_len * job.model.model_flops_per_token(job.seq_len)
    return flops / (node.gpus * rate)


def cluster_floor(job: Job, catalog: Catalog) -> float:
    """Seconds no plan of the whole job beats, replica groups or one strategy: its FLOPs at the best GEMM
    rate of every GPU of the cluster (the pools' compute_floor rates added)."""
    floors = [compute_floor(job, pool.name, job.global_batch, catalog) for pool in job.cluster.pools]
    return 0.0 if min(floors) <= 0 else 1.0 / sum(1.0 / f for f in floors)


class _Shares:
    """The lazily compiled table T[p, n] and the questions asked of it."""

    def __init__(self, job: Job, compile_pool, catalog: Catalog, remaining) -> None:
        self.job, self.compile_pool, self.catalog, self.remaining = job, compile_pool, catalog, remaining
        self.pools = [p.name for p in job.cluster.pools]
        self.shares = share_grid(job.global_batch)
        self.grain = job.global_batch // self.shares
        self.entries: dict[tuple[str, int], Entry] = {}
        self.compiled = 0
        self.stopped = False  # a share went uncompiled for want of time

    def entry(self, pool: str, n: int) -> Entry:
        if (pool, n) not in self.entries:
            self.entries[pool, n] = Entry(above=compute_floor(self.job, pool, n * self.grain, self.catalog))
        return self.entries[pool, n]

    def value(self, pool: str, n: int, cap: float = float("inf"), first: bool = False) -> float:
        """T[p, n] if it is at most `cap`, else inf.  `first`: the time of any plan within `cap` will do (the
        question is whether one exists), which a compile answers at its first such plan."""
        if n == 0:
            return 0.0
        e = self.entry(pool, n)
        if e.below <= cap and (first or e.exact):
            return e.below
        if e.above >= cap:
            return float("inf")
        if self.remaining() <= 0:
            self.stopped = True
            if cap < float("inf"):  # past the budget only the first plan is still sought (uncapped)
                return e.below if e.below <= cap else float("inf")
        ask = min(cap, e.below)  # a plan at `below` is known: only faster ones are news
        value, bound, result = self.compile_pool(group_job(self.job, pool, n * self.grain), ask, first)
        self.compiled += 1
        e.above = max(e.above, bound)
        if result is not None and value <= e.below:  # on a tie the later compile is the certified one
            e.below, e.result = value, result
        if e.below <= cap:
            return e.below
        e.unproven = e.unproven or e.above < cap  # the compile stopped before it proved "none within the cap"
        return float("inf")

    def step(self, split: dict[str, int], cap: float = float("inf")) -> float:
        """max T + sync of a split (inf when some share has no plan, or none under `cap`)."""
        active = [p for p in self.pools if split.get(p, 0) > 0]
        sync = sync_seconds(self.job, active, self.catalog)
        times = [self.value(p, split[p], cap - sync) for p in active]
        return max(times) + sync if active else float("inf")

    def fitting(self, active: tuple[str, ...], limit: float) -> dict[str, int] | None:
        """Shares per pool of `active` (each at least one, N in all) with every T[p, n] <= limit, or None when no
        such split exists.  Bisects each pool's most shares within the limit (T is nondecreasing in n), the
        widest interval first, and stops as soon as the pools' ceilings fall short of N or their floors reach it:
        only the answer is wanted, not each pool's exact most."""
        lo = {p: 0 for p in active}  # T[p, lo] <= limit: a plan is known
        hi = {p: bisect.bisect_left(share_floors(self, p), limit) for p in active}  # T[p, hi + 1] > limit
        for (p, n), e in self.entries.items():
            if p in lo and n <= hi[p] and e.below <= limit:
                lo[p] = max(lo[p], n)
        # the slowest pool first, at one share: where the limit is too tight for it, one compile settles the set
        slowest = max(active, key=lambda p: compute_floor(self.job, p, 1, self.catalog))
        if len(active) > 1 and lo[slowest] == 0 < hi[slowest]:
            if self.value(slowest, 1, limit, first=True) > limit:
                return None
            lo[slowest] = 1
        while True:
            if min(hi.values()) == 0 or sum(hi.values()) < self.shares:
                return None
            if min(lo.values()) >= 1 and sum(lo.values()) >= self.shares:
                return _trim(lo, self.shares)
            pool = max(active, key=lambda p: hi[p] - lo[p])
            mid = (lo[pool] + hi[pool] + 1) // 2
            if self.value(pool, mid, limit, first=True) <= limit:
                lo[pool] = mid
            else:
                hi[pool] = mid - 1


def proportional(total: int, weights: dict[str, float]) -> dict[str, int]:
    """`total` shares in proportion to `weights` (every pool at least one), largest remainders first."""
    pools = list(weights)
    if total < len(pools):
        return {}
    spare = total - len(pools)
    exact = {p: spare * w / sum(weights.values()) for p, w in weights.items()}
    out = {p: 1 + int(v) for p, v in exact.items()}
    for p in sorted(pools, key=lambda p: (int(exact[p]) - exact[p], pools.index(p)))[: total - sum(out.values())]:
        out[p] += 1
    return out


def search_groups(job: Job, compile_pool, catalog: Catalog, *, remaining,
                  incumbent: float = float("inf")) -> GroupSearch:
    """The best replica-group plan faster than `incumbent` (a plan found elsewhere), and a bound over the group
    space (objective time): at least the incumbent when no split beats it.

    compile_pool(sub_job, cap, first) -> (value, bound, CompileResult | None): a certified compile of one
    pool's sub-job restricted to the grain rule, only plans no slower than `cap` (None: none is); `first`:
    it may stop at its first plan within the cap.  remaining() -> seconds left; past it, unasked shares
    stay unknown and the bound says so.
    """
    table = _Shares(job, compile_pool, catalog, remaining)
    best, best_split = incumbent, {}

    def consider(split: dict[str, int]) -> None:
        nonlocal best, best_split
        step = table.step(split, best) if split else float("inf")
        if step < best:
            best, best_split = step, dict(split)

    if incumbent == float("inf"):
        _water_fill(table, consider, lambda: best)
    # 2. proof: no set of active pools has a split faster than the incumbent
    improved = True
    while improved:
        if remaining() <= 0:
            table.stopped = True
            break
        improved = False
        for size in range(1, len(table.pools) + 1):
            for active in itertools.combinations(table.pools, size):
                limit = (best - sync_seconds(job, list(active), catalog)) * (1 - 1e-9)
                if limit <= 0:
                    continue
                split = table.fitting(active, limit)
                if split is not None:  # each of its shares runs within the limit: at their best, it beats `best`
                    before = best
                    consider(split)
                    improved = improved or best < before
    result = GroupSearch(compiled=table.compiled, stopped=table.stopped)
    if best_split:
        chosen = [(p, best_split[p]) for p in table.pools if best_split.get(p, 0) > 0]  # cluster pool order
        result.groups = [ReplicaGroup(pool=p, batch=n * table.grain,
                                      strategy=table.entry(p, n).compiled.single_strategy) for p, n in chosen]
        result.results = {p: table.entry(p, n).compiled for p, n in chosen}
        result.objective = best
    # a "no" the time limit cut short caps the bound (a better split needs that share: its T is at least the
    # compile's bound), and so, past the time limit, do the shares never asked (the compute floor of the whole
    # cluster); the floor of the splits over what the table knows (split_floor) is a bound too: the better is kept
    unproven = [e.above for e in table.entries.values() if e.unproven]
    if table.stopped:
        unproven.append(cluster_floor(job, catalog))
    result.bound = min([best, *unproven])
    if unproven:
        result.bound = max(result.bound, min(best, split_floor(table)))
    return result


def _water_fill(table: _Shares, consider, best) -> None:
    """A first split: shares in proportion to each pool's speed, re-split on the speeds the previous split
    measured (WATER_FILL_ROUNDS rounds), on all pools and then without the slowest ones."""
    job, catalog = table.job, table.catalog
    subset = sorted(table.pools, key=lambda p: compute_floor(job, p, 1, catalog))
    while subset:
        split = proportional(table.shares, {p: 1.0 / compute_floor(job, p, 1, catalog) for p in subset})
        for _ in range(WATER_FILL_ROUNDS):
            consider(split)
            times = {p: table.value(p, n, best()) for p, n in split.items()}
            if not split or any(t == float("inf") for t in times.values()):
                break
            split = proportional(table.shares, {p: split[p] / times[p] for p in subset})
        subset = subset[:-1]


def share_floors(table: _Shares, pool: str) -> list[float]:
    """floors[n-1] <= T[pool, n] for n = 1..N: what is known below it (a certified value, a compile's bound,
    or the pool's compute floor), raised to the floor of fewer shares (T is nondecreasing in n)."""
    floors: list[float] = []
    for n in range(1, table.shares + 1):
        e = table.entries.get((pool, n))
        if e is None:
            known = compute_floor(table.job, pool, n * table.grain, table.catalog)
        else:
            known = e.below if e.exact else e.above
        floors.append(max(known, floors[-1] if floors else 0.0))
    return floors


def split_floor(table: _Shares) -> float:
    """Seconds no replica-group split beats, from what the table knows: for each set S of active pools, the least
    limit L at which every pool of S can take a share and S all N shares with each share's floor within L, plus
    S's sync (a split's step is its slowest group's T plus the sync, and each T is at least its floor)."""
    floors = {pool: share_floors(table, pool) for pool in table.pools}
    best = float("inf")
    for size in range(1, len(table.pools) + 1):
        for active in itertools.combinations(table.pools, size):
            sync = sync_seconds(table.job, list(active), table.catalog)
            for limit in sorted({f for pool in active for f in floors[pool]}):
                most = [bisect.bisect_right(floors[pool], limit) for pool in active]
                if min(most) >= 1 and sum(most) >= table.shares:
                    best = min(best, limit + sync)
                    break
    return best


def _trim(most: dict[str, int], total: int) -> dict[str, int]:
    """A split taking at most most[p] shares per pool and `total` in all (largest first, >= 1 each)."""
    split = {p: 1 for p in most}
    left = total - len(most)
    for p in sorted(most, key=lambda p: -most[p]):
        take = min(left, most[p] - 1)
        split[p] += take
        left -= take
    return split
