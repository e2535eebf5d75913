"""Discrete-event simulation of a training step, an independent check of `planner.cost.evaluate`.

`simulate(job, strategy)` builds every stage's passes, transfers and
collectives from the same cost functions (tasks.py), orders them by the
pipeline schedule (schedule.py), runs them on per-stage streams (graph.py,
engine.py) and `summarize` compares the result with the analytic step,
term by term (result.py).  trace.py and plots.py draw it.
"""

from planner.simulate.result import SimulationResult, summarize
from planner.simulate.simulator import SimulationRun, simulate

__all__ = ["SimulationResult", "SimulationRun", "simulate", "summarize"]
