"""The package's version: in plan.json, report.md and `planner --version` (a module of its own, so that the layers
that write it need not import the package, whose entry points sit above them)."""

__version__ = "0.1.0"
