"""The LP bound of the relaxed sharding program (GLOP): a proven floor in a fraction of a second.

The relaxed program (program.py) is itself a relaxation of every plan; its
linear relaxation, with each table's option choice fractional, is weaker still
and so also a valid lower bound.  CP-SAT reaches about the same number after
seconds of work on hundreds of tables; GLOP solves the LP directly.
"""

from __future__ import annotations

import math

import numpy as np
from ortools.linear_solver import pywraplp

from planner.embedding.relaxed import RelaxedCoefficients


def lp_bound(coefficients: RelaxedCoefficients) -> float:
    """Seconds no sharding beats on the embedding terms (add EmbeddingCostModel.fixed_seconds); -inf if GLOP fails,
    inf if even the fractional choice overflows the summed capacities."""
    return lp_solution(coefficients)[0]


def lp_solution(coefficients: RelaxedCoefficients) -> tuple[float, np.ndarray | None]:
    """`lp_bound`, and per table the option the LP gives the largest share (lowest index on ties; a start for the
    search, not a plan: the choice may not fit); None when there is no LP optimum."""
    c = coefficients
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return -math.inf, None
    tables, options = c.valid.shape
    x = {(t, i): solver.NumVar(0.0, 1.0, f"x_{t}_{i}") for t in range(tables) for i in range(options) if c.valid[t, i]}
    lookup, comm = solver.NumVar(0.0, solver.infinity(), "lookup"), solver.NumVar(0.0, solver.infinity(), "comm")

    def total(array: np.ndarray) -> pywraplp.LinearExpr:
        return solver.Sum([float(array[t, i]) * var for (t, i), var in x.items() if array[t, i]])

    for t in range(tables):
        chosen = [i for i in range(options) if c.valid[t, i]]
        solver.Add(solver.Sum([x[t, i] for i in chosen]) == 1.0)
        # the table's single unit sits on one rank whole (one option is chosen, so the sum is its unit)
        solver.Add(lookup >= solver.Sum([float(c.unit_lookup[t, i]) * x[t, i] for i in chosen]))
        solver.Add(comm >= solver.Sum([float(c.unit_send[t, i]) * x[t, i] for i in chosen]))
    solver.Add(c.world * lookup >= total(c.lookup))
    solver.Add(c.world * comm >= total(c.send))
    solver.Add(comm >= total(c.receive))
    solver.Add(total(c.hbm) <= c.hbm_budget)
    solver.Add(total(c.everywhere) <= c.everywhere_budget)
    solver.Add(total(c.host) <= c.host_budget)
    solver.Minimize(lookup + comm + total(c.sync))
    status = solver.Solve()
    if status == pywraplp.Solver.INFEASIBLE:
        return math.inf, None
    if status != pywraplp.Solver.OPTIMAL:
        return -math.inf, None
    share = np.full(c.valid.shape, -1.0)
    for (t, i), var in x.items():
        share[t, i] = var.solution_value()
    # GLOP's tolerances: step back a hair so the floor stays below the true LP optimum
    return solver.Objective().Value() * (1.0 - 1e-7), np.argmax(share, axis=1)
