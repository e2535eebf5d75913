"""Typed errors of the planner library; the CLI maps them to exit codes."""


class PlannerInputError(ValueError):
    """Bad user input (strategy spec, job parameters): exit code 2."""


class InfeasibleError(RuntimeError):
    """The job cannot run as asked (does not fit, no legal strategy): exit code 1."""


class GroupPlanError(ValueError):
    """One strategy was asked of a replica-group plan or compile result (a strategy per pool: each group has
    its own), or replica groups of a single-strategy one."""
