"""The state of one compile's branch and bound: its clock, its budget and what it has found so far.

Shared by the search's steps (`planner.search.config_solve` solves one configuration,
`planner.search.branch` walks the configurations, `planner.search.compile` drives them and assembles
the result); kept apart so that each imports it and none imports another's driver.
"""

from __future__ import annotations

import time as clock
from dataclasses import dataclass, field
from typing import Callable

from hardware import Catalog
from planner.cost.layout import place_stages
from planner.job import Job
from planner.search.ilp.build import stage_pools_for
from planner.search.ilp.surcharge import Surcharge
from planner.search.ilp.tables import TableBuilder
from planner.search.result import CompileOptions
from planner.strategy import Strategy


def now() -> float:
    """The search's clock: monotonic seconds (tests replace it to drive the budget)."""
    return clock.perf_counter()


FIRST_PLAN_SECONDS = 1.0  # wall seconds a CP-SAT solve may take while the search has no plan yet
SOLVE_WORK_SHARE = 0.25  # deterministic time of one solve: this share of the time limit ...
MIN_SOLVE_WORK = 1.0  # ... but at least this much (short limits)


def solve_work(options: CompileOptions) -> float:
    """CP-SAT deterministic time one configuration's program may spend: a function of the inputs only, so
    a program it stops stops at the same point on every machine (the wall clock caps it too: see
    Search.solve_seconds)."""
    if options.work_limit is not None:
        return options.work_limit
    return max(MIN_SOLVE_WORK, SOLVE_WORK_SHARE * options.time_limit)


@dataclass
class Search:
    """Mutable state of one compile."""

    job: Job
    options: CompileOptions
    catalog: Catalog
    builder: TableBuilder
    progress: Callable[[str], None] | None
    start: float = field(default_factory=lambda: now())
    incumbent: float = float("inf")
    best: Strategy | None = None
    best_peak: float = float("inf")  # peak HBM of the best plan (tie-break)
    solved: list[tuple[float, str, Strategy]] = field(default_factory=list)
    open_bounds: list[float] = field(default_factory=list)
    pruned: int = 0
    near: list = field(default_factory=list)  # (bound, spec, config, m, variants) the incumbent cap closed
    stopped: bool = False  # the wall-clock budget cut something short: the result depends on the machine
    need_plan: bool = True  # go on past the budget until a first plan exists (a replica group's compile does not)
    surcharge: Surcharge | None = None  # a per-step term added to the step time (a re-plan's amortised migration)
    best_step: float = float("inf")  # step time of the best plan (its objective without the surcharge)
    limit: float | None = None  # wall seconds from `start` this search may spend (None: the options' time limit)
    # digests of the CP-SAT programs proved infeasible: configurations whose tables agree number for number (ZeRO
    # stages that change no time and no fit) build the same program, and the proof holds for each
    infeasible: set[bytes] = field(default_factory=set)
    first_plan: bool = False  # stop at the first plan under the incumbent (a replica group asks whether one exists)
    # configurations the budget left unvisited, (bound, micro-batches, configuration): their bounds are open
    # (bounds_left) until `resume` hands them back to the walk
    paused: list = field(default_factory=list)
    paused_offload: bool = False  # whether the paused walk was the offload pass

    def elapsed(self) -> float:
        return now() - self.start

    def remaining(self, limit: float | None = None) -> float:
        """Wall seconds left of the budget, or of `limit` seconds from the start (<= 0 once it is spent; inf
        under a deterministic work limit)."""
        if self.options.work_limit is not None:
            return float("inf")
        limit = limit if limit is not None else self.limit if self.limit is not None else self.options.time_limit
        return limit - self.elapsed()

    def spent(self) -> bool:
        """Stop searching: the budget is spent and a plan (or a cap) exists.  Without one the search
        goes on to a first plan (a time limit returns the best plan found, so it finds one if the
        space has one), unless need_plan is off."""
        return (self.incumbent < float("inf") or not self.need_plan) and self.remaining() <= 0

    @property
    def cut_short(self) -> bool:
        """Whether the wall clock cut something short (a solve, a compile, configurations left unvisited)."""
        return self.stopped or bool(self.paused)

    @property
    def bounds_left(self) -> list[float]:
        """The bounds of what the search has not settled: programs stopped early, configurations paused."""
        return [*self.open_bounds, *(bound for bound, _, _ in self.paused)]

    def pause(self, items: list, offload: bool) -> None:
        """Leave the configurations `items` of the walk (`offload`: the offload pass) unvisited for now (the budget
        is spent): their bounds stay open."""
        if not self.paused:
            self.paused_offload = offload
        self.paused.extend(items)

    def resume(self) -> list:
        """The paused configurations, in bound order: the walk takes them up again."""
        items = sorted(self.paused, key=lambda item: (item[0], item[2].spec()))
        self.paused = []
        return items

    def solve_seconds(self) -> float:
        """Wall-clock cap of the next CP-SAT solve: the time left (while a first plan is still
        needed, at least FIRST_PLAN_SECONDS)."""
        if self.incumbent == float("inf") and self.need_plan:
            return max(FIRST_PLAN_SECONDS, self.remaining())
        return max(0.0, self.remaining())

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)


def price_rate(job: Job, strategy: Strategy, catalog: Catalog) -> float:
    """USD per second of the GPUs a (resolved) strategy uses (cost objective)."""
    ranks = strategy.tp * strategy.cp * strategy.data_parallel
    return sum(ranks * stage.device.price_per_hour for stage in place_stages(job, strategy, catalog)) / 3600.0


def pools_of(job: Job, config: Strategy) -> list:
    """Pools a stage of the configuration can occupy (all of a one-pool cluster)."""
    return stage_pools_for(job, config) if len(job.cluster.pools) > 1 else list(job.cluster.pools)


def rate_floor(search: Search, config: Strategy, pools: list) -> float:
    """1 for the time objective; for cost, the cheapest USD/s the configuration's GPUs can cost."""
    if search.options.objective != "cost":
        return 1.0
    per_gpu = min(search.catalog.device(pool.node.device).price_per_hour for pool in pools) / 3600.0
    return per_gpu * config.tp * config.cp * config.data_parallel * config.pp
