"""Typed errors of the planner library; the CLI maps them to exit codes."""


class PlannerInputError(ValueError):
    """Bad user input (strategy spec, job parameters): exit code 2."""


class InfeasibleError(RuntimeError):
    """The job cannot run as asked (does not fit, no legal strategy): exit code 1."""
