"""planner: a constraint-optimization plan compiler for distributed deep-learning training.

`planner.cost.evaluate(job, strategy)` scores a strategy; the command line
(`planner.cli`, also `python -m planner`) wraps the library.
"""

__version__ = "0.1.0"
