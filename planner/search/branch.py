"""Branch and bound over the global configurations: which configurations a compile visits, in which order, and
which its bounds prune.

1. `legal_configs` lists every legal configuration (`planner.search.space.global_configs`) some pool holds.
2. `bounded_configs` gives each a lower bound from the cost model (perfectly balanced stages, nothing
   recomputed, no stage-level terms) and sorts them by it.
3. `branch_and_bound` walks them in bound order: a configuration whose bound is not below the incumbent is
   pruned, and so is every later one; the rest get a memory-aware bound and, if that keeps them,
   `planner.search.config_solve.solve_config`.  A configuration's every-k-th-block families join the queue
   when it is reached; where its bounds bound them too (one kind of block, one chunk per stage:
   `planner.search.space.families_bounded_by_base`) only once its memory-aware bound and its tables keep it,
   each at no less than the bound they prove; where nothing of it fits, not at all
   (`families_fit_only_where_base_fits`).
   Once the budget is spent the rest is paused (`Search.pause`: its bounds stay open), and `resume_configs`
   takes it up again where time is found (a mixed cluster's replica groups finishing early).
4. `solve_closest_runners_up` solves the closest closed configurations for the report.
"""

from __future__ import annotations

import heapq

from planner.job import Job
from planner.search.config_solve import RUNNER_UP_SOLVES, solve_config
from planner.search.replica_groups import cluster_floor
from planner.search.space import (SpaceOptions, every_kth_ks, families_bounded_by_base,
                                  families_fit_only_where_base_fits, global_configs, placement_variants)
from planner.search.state import Search, pools_of, rate_floor
from planner.search.warm import routed_share, state_share, warm_start
from planner.strategy import Strategy


def warm(search: Search, configs: list[Strategy]) -> None:
    """A first incumbent from strategies scored directly (planner.search.warm), for the time objective without a
    surcharge (the programs' objective is then the step time evaluate gives), on one pool (on several the
    programs choose each stage's pool, and the replica groups give a first plan)."""
    if (search.options.objective != "time" or search.surcharge is not None or search.options.max_step_time
            or len(search.job.cluster.pools) > 1):
        return
    found = warm_start(search.job, configs, search.options.space, search.catalog)
    if found is not None and found[1] < search.incumbent:
        search.best, search.best_step, search.best_peak = found
        search.incumbent = search.best_step
        search.say(f"[{search.elapsed():6.2f}s] incumbent {search.incumbent:.6g}  (warm start)  {search.best.spec()}")


def solve_closest_runners_up(search: Search) -> None:
    """Values of the configurations the incumbent closed, for the report's runners-up: in bound order until the
    next bound cannot beat the k-th best value found (k = runners_up), at most RUNNER_UP_SOLVES x k solves."""
    k = search.options.runners_up
    seen = {spec for _, spec, _ in search.solved}
    solves = 0
    for bound, spec, config, m, variants in sorted(search.near, key=lambda item: item[:2]):
        values = sorted(v for v, s, _ in search.solved if s != (search.best and search.best.spec()))
        if k == 0 or len(values) >= k and bound >= values[k - 1] or solves >= RUNNER_UP_SOLVES * k:
            return
        if spec in seen:
            continue
        if search.remaining() <= 0:  # the budget binds the report's extras too
            search.stopped = True
            return
        seen.add(spec)
        solves += 1
        solve_config(search, config, m, bound, variants, runner_up=True)


def search_configs(search: Search, legal: list[tuple[int, Strategy]], retry_offload: bool = True) -> list:
    """Branch and bound over the configurations, then with offload if nothing was found; the configurations."""
    space = search.options.space
    configs = bounded_configs(search, legal)
    branch_and_bound(search, configs, offload=space.offload_search == "always")
    if search.best is None and retry_offload and space.offload_search == "fallback":
        # nothing fits: retry with offload among each stage's placements, which trades time for memory
        # (offload adds no lower-bound term, so the bounds stand)
        branch_and_bound(search, configs, offload=True)
    return configs


def resume_configs(search: Search) -> None:
    """Walk on over the configurations the budget paused (the replica groups left time)."""
    offload = search.paused_offload
    branch_and_bound(search, search.resume(), offload)


def legal_configs(job: Job, space: SpaceOptions) -> list[tuple[int, Strategy]]:
    """(micro-batches, configuration) of every legal configuration some pool can hold, in space order."""
    return [(job.global_batch // (config.data_parallel * config.mbs), config)
            for config in global_configs(job, space, families=False) if pools_of(job, config)]


def bounded_configs(search: Search, legal: list[tuple[int, Strategy]]) -> list[tuple[float, int, Strategy]]:
    """The configurations with their lower bounds, in bound order.  Once the budget is spent (a plan or
    not) the rest get the cheap compute floor instead, the most sharded first: without a plan yet the
    search then tries the configurations likeliest to fit before the rest (issue #26: a first plan of a
    big job within seconds of the limit, not after every configuration that does not fit)."""
    out = []
    job = search.job
    for index, (m, config) in enumerate(legal):
        if search.spent() or search.remaining() <= 0:
            floor = cluster_floor(job, search.catalog)
            # the least state per GPU first; sorted is stable: space order among ties
            routed = routed_share(job)
            rest = sorted(legal[index:], key=lambda item: state_share(item[1], routed))
            if search.options.objective == "cost":
                out += [(floor * rate_floor(search, c, pools_of(job, c)), n, c) for n, c in rest]
            else:
                out += [(floor, n, c) for n, c in rest]
            out.sort(key=lambda item: item[0])
            return out
        pools = pools_of(job, config)
        out.append((search.builder.lower_bound(config, pools, m) * rate_floor(search, config, pools), m, config))
    out.sort(key=lambda item: (item[0], item[2].spec()))
    return out



def branch_and_bound(search: Search, configs: list[tuple[float, int, Strategy]], offload: bool) -> None:
    """The configurations in bound order, each pruned by its bounds or solved; a configuration's every-k-th-block
    families join the queue when it is reached (their bounds are at least its: space.every_kth_ks), after its
    memory-aware bound and its tables where those bound them too (space.families_bounded_by_base)."""
    queue = BoundQueue(configs)
    while queue:
        bound, m, config = queue.pop()
        if bound >= search.incumbent * (1 - 1e-9):
            rest = [(bound, m, config), *queue.drain()]
            search.pruned += len(rest)
            # the closest of the rest are runner-up candidates (their programs are solved for the report only)
            search.near += [(b, c.spec(), c, n, placement_variants(search.job, c, search.options.space, offload))
                            for b, n, c in rest[:search.options.runners_up]]
            return
        if search.first_plan and search.best is not None:  # a plan within the cap was all that was asked
            search.open_bounds.extend([bound, *(b for b, _, _ in queue.drain())])
            return
        if search.spent():
            search.pause([(bound, m, config), *queue.drain()], offload)
            return
        pools = pools_of(search.job, config)
        identical = len(search.builder.segments) == 1
        ks = every_kth_ks(search.job, config, search.options.space, identical)
        # the families' plans are plans of this configuration in its bounds' eyes (one kind of block, one chunk
        # per stage): its memory-aware bound and its tables prune them with it, or floor theirs
        follow = families_bounded_by_base(config, identical)
        variants = placement_variants(search.job, config, search.options.space, offload)
        if search.incumbent < float("inf") and len(search.job.cluster.pools) == 1:
            # a memory-aware bound, dearer to compute: only for configurations the cheap bound keeps.  Not on a
            # mixed cluster: there it needs a profile per pool and position class, which cost more than the tables
            # they spare (the tables, built within the stage cap, bound the same stage positions and pool slots:
            # ConfigTables.bottleneck_bound); on hetero-3pool from a 20.78 s incumbent, 60 s walk 4,513
            # configurations without it against 3,082 with it (tests/bench/search_phases.py --incumbent 20.78)
            pools = pools_of(search.job, config)
            floor = rate_floor(search, config, pools)
            refined = search.builder.refined_bound(config, pools, m, enough=search.incumbent / floor,
                                                   variants=variants, split=search.options.space.split_shape) * floor
            if refined >= search.incumbent * (1 - 1e-9):
                search.pruned += 1
                closes = follow or refined == float("inf") and families_fit_only_where_base_fits(identical)
                _families(search, queue, config, ks, pools, m, floor=0.0, closed=closes)
                if refined < float("inf"):  # it fits somewhere: a runner-up candidate, closest bound first
                    search.near.append((_order(search, config, pools, m, variants, bound), config.spec(),
                                        config, m, variants))
                continue
            order = _order(search, config, pools, m, variants, bound)
            bound = max(bound, refined)
        else:
            order = bound
        if not follow:
            _families(search, queue, config, ks, pools, m, floor=0.0, closed=False)
        bound = solve_config(search, config, m, bound, variants, order=order, offload=offload)
        if follow:  # what its tables proved bounds its families too
            _families(search, queue, config, ks, pools, m, floor=bound,
                      closed=bound >= search.incumbent * (1 - 1e-9))


def _families(search: Search, queue: "BoundQueue", config: Strategy, ks: list[int], pools: list, m: int,
              floor: float, closed: bool) -> None:
    """The every-k-th-block families of `config` (ks): pruned with it where `closed` (a bound of it that closes
    them: space.families_bounded_by_base, families_fit_only_where_base_fits), else queued, each at its own lower
    bound or `floor` if higher (a bound of `config` that also bounds them)."""
    if closed:
        search.pruned += len(ks)
        return
    for k in ks:
        family = config.model_copy(update={"recompute": "full", "recompute_every": k})
        own = search.builder.lower_bound(family, pools, m) * rate_floor(search, family, pools)
        queue.push((max(own, floor), m, family))


def _order(search: Search, config: Strategy, pools: list, m: int, variants: tuple[dict, ...], cheap: float) -> float:
    """The key that orders a runner-up candidate (one pool): the balanced bound (the refined one stops at the
    incumbent, where every closed configuration would tie)."""
    if config.v_shape:
        # a V's bound counts only forward compute in its fill, which would sort every V ahead of the nearest
        # configurations: it is ordered by the interleaved pipeline over the same chunks, whose work it runs
        interleaved = config.model_copy(update={"schedule": "interleaved"})
        return search.builder.balanced_bound(interleaved, pools, m, variants) * rate_floor(search, config, pools)
    return max(cheap, search.builder.balanced_bound(config, pools, m, variants) * rate_floor(search, config, pools))


class BoundQueue:
    """Configurations in bound order: a sorted list, and a heap of those added while it is walked (ties: the
    list's first, then the order they were added)."""

    def __init__(self, configs: list[tuple[float, int, Strategy]]):
        self.configs, self.index = configs, 0
        self.added: list[tuple[float, int, int, Strategy]] = []  # (bound, arrival, micro-batches, configuration)
        self.arrivals = 0

    def __bool__(self) -> bool:
        return self.index < len(self.configs) or bool(self.added)

    def push(self, item: tuple[float, int, Strategy]) -> None:
        bound, m, config = item
        self.arrivals += 1
        heapq.heappush(self.added, (bound, self.arrivals, m, config))

    def pop(self) -> tuple[float, int, Strategy]:
        if self.added and (self.index == len(self.configs) or self.added[0][0] < self.configs[self.index][0]):
            bound, _, m, config = heapq.heappop(self.added)
            return bound, m, config
        self.index += 1
        return self.configs[self.index - 1]

    def drain(self) -> list[tuple[float, int, Strategy]]:
        """Everything left, in bound order."""
        out = []
        while self:
            out.append(self.pop())
        return out

