"""`simulate(job, strategy)`: build the step's task graph and run it."""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog, load_catalog
from planner.cost.estimate import Estimate
from planner.cost.evaluate import evaluate, micro_batches
from planner.job import Job
from planner.simulate.engine import Timeline, run
from planner.simulate.graph import OpTasks, build_graph
from planner.simulate.tasks import StageWork, build_work
from planner.strategy import Strategy
from planner.validation import check_strategy


@dataclass(frozen=True)
class SimulationRun:
    """A simulated step with what it was built from."""

    job: Job
    strategy: Strategy  # resolved (dp set)
    micro_batches: int
    works: list[StageWork]
    ops: list[OpTasks]
    timeline: Timeline
    analytic: Estimate  # evaluate() of the same job and strategy
    reserve_bytes: float  # memory_reserve_bytes
    fragmentation: float  # memory_fragmentation

    @property
    def step_time(self) -> float:
        return max(self.timeline.end)


def simulate(job: Job, strategy: Strategy, catalog: Catalog | None = None) -> SimulationRun:
    """Simulate one training step of `strategy` on `job`, event by event."""
    catalog = catalog or load_catalog()
    s = check_strategy(job, strategy)
    m = micro_batches(job, s)
    works = build_work(job, s, catalog)
    tasks, ops = build_graph(works, s.pipeline_schedule, m, s.vpp)
    timeline = run(tasks, catalog.constant("comm_overlap_efficiency"))
    return SimulationRun(job=job, strategy=s, micro_batches=m, works=works, ops=ops, timeline=timeline,
                         analytic=evaluate(job, s, catalog=catalog),
                         reserve_bytes=catalog.constant("memory_reserve_bytes"),
                         fragmentation=catalog.constant("memory_fragmentation"))
