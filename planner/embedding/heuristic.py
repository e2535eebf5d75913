"""A price-directed start for the relaxed program: per-table choices under caps and an HBM price.

CP-SAT finds the relaxed program's bound quickly (its LP is tight) but, with
hundreds of tables and tens of options each, is slow to find good plans.  This
heuristic gives it one: for caps U (one unit's lookup seconds) and V (one
unit's send seconds) and a price on HBM bytes, every table independently takes
the option of least (lookup work + send work) / ranks + receive + sync + price
x HBM bytes among those within the caps.  Caps run over quantiles of the
options' unit times, the price is bisected until the tables fit the summed HBM
(and host DRAM), and the choice with the least relaxed objective wins.  Pure
numpy over a [tables x options] table, deterministic.
"""

from __future__ import annotations

import numpy as np

from planner.embedding.options import TableOption
from planner.embedding.relaxed import RelaxedCoefficients

CAP_STEPS = 10
PRICE_STEPS = 12


def price_directed_choice(table: RelaxedCoefficients, space: list[list[TableOption]]
                          ) -> dict[int, TableOption] | None:
    """The best choice the caps-and-price sweep over `table` (the coefficients of `space`) finds that fits
    the summed capacities, or None."""
    caps_l = np.unique(np.quantile(table.unit_lookup[table.valid], np.linspace(0.5, 1.0, CAP_STEPS)))
    caps_s = np.unique(np.quantile(table.unit_send[table.valid], np.linspace(0.5, 1.0, CAP_STEPS)))
    best: tuple[float, np.ndarray] | None = None
    scale = table.hbm[table.valid].max() / table.world or 1.0
    for cap_l in caps_l:
        for cap_s in caps_s:
            pick = table.pick(cap_l, cap_s, 0.0)
            value, fits = table.evaluate(pick)
            if not fits:
                # bisect the HBM price (seconds per byte) until the choice fits
                low, high = 0.0, 1.0 / scale
                fitting = None
                for _ in range(PRICE_STEPS):
                    trial = table.pick(cap_l, cap_s, high)
                    if table.evaluate(trial)[1]:
                        fitting = trial
                        break
                    high *= 10.0
                if fitting is None:
                    continue
                for _ in range(PRICE_STEPS):
                    mid = (low + high) / 2
                    trial = table.pick(cap_l, cap_s, mid)
                    if table.evaluate(trial)[1]:
                        high, fitting = mid, trial
                    else:
                        low = mid
                pick = fitting
                value, fits = table.evaluate(pick)
            if best is None or value < best[0]:
                best = (value, pick)
    if best is None:
        return None
    return {t: space[t][int(i)] for t, i in enumerate(best[1])}
