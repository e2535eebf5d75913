"""A per-step surcharge that depends on where the blocks go: the term a re-plan adds to the step time.

A re-plan minimises migration + steps_left x step (planner.replan).  Divided by steps_left, that is the step
time plus an *amortised* migration, so the compile's branch and bound, its bounds and its cutoffs stay in
seconds per step: every configuration's lower bound on the step time is still a lower bound (the surcharge
is never negative), and the program of a configuration minimises

    step + max_port sum_{s, b} x[s, b] * load[port][s, b] + constant[port]

where x[s, b] = 1 when block b sits on stage s (cut[s] <= b < cut[s+1]) and load[port][s, b] is what block
b on stage s puts on the port, in the program's units (nanoseconds of amortised surcharge x the program's
scale).  The caller (a `Surcharge`) builds these tables per configuration; a configuration it cannot
tabulate (None) is solved without the term (its surcharge counts as 0: still a lower bound).

With x written through the cuts (y[s, b] = [b >= cut[s]], x[s, b] = y[s, b] - y[s+1, b]), the term needs
pp x blocks booleans and one linear constraint per distinct port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ortools.sat.python import cp_model

from planner.strategy import Strategy


@dataclass(frozen=True)
class SurchargeTable:
    """The surcharge of one configuration: the max over ports of each port's load (program units)."""

    ports: tuple[dict[tuple[int, int], int], ...]  # per port: (stage, block index) -> load; absent = 0
    constants: tuple[int, ...]  # per port: load that does not depend on the split (embedding, head)

    def value(self, stage_blocks: list[range]) -> int:
        """The surcharge of a split given as each stage's block range (tests; the program's own value)."""
        where = {b: s for s, blocks in enumerate(stage_blocks) for b in blocks}
        return max((c + sum(v for (s, b), v in port.items() if where.get(b) == s)
                    for port, c in zip(self.ports, self.constants)), default=0)


class Surcharge(Protocol):
    """What a compile asks of a surcharge."""

    def table(self, config: Strategy, scale: int) -> SurchargeTable | None:
        """The configuration's table in units of 1 / scale nanoseconds of amortised surcharge (None: no term)."""


def add_surcharge(model: cp_model.CpModel, table: SurchargeTable, cut: list, blocks: int) -> cp_model.IntVar:
    """The surcharge variable: at least every port's load under the split the cuts make."""
    top = max((c + sum(port.values()) for port, c in zip(table.ports, table.constants)), default=0)
    surcharge = model.new_int_var(0, max(1, top), "surcharge")
    if not cut:  # one stage holds everything: every load is constant
        for port, constant in zip(table.ports, table.constants):
            model.add(surcharge >= constant + sum(port.values()))
        return surcharge
    pp = len(cut) - 1
    on_or_after: dict[tuple[int, int], cp_model.LinearExpr | int] = {}  # y[s, b] = [b >= cut[s]]
    for s in range(pp + 1):
        for b in range(blocks):
            if s == 0:
                on_or_after[s, b] = 1
            elif s == pp:
                on_or_after[s, b] = 0
            else:
                y = model.new_bool_var(f"after_cut[{s},{b}]")
                model.add(cut[s] <= b).only_enforce_if(y)
                model.add(cut[s] > b).only_enforce_if(~y)
                on_or_after[s, b] = y
    for port, constant in zip(table.ports, table.constants):
        load = sum(value * (on_or_after[s, b] - on_or_after[s + 1, b]) for (s, b), value in port.items())
        model.add(surcharge >= constant + load)
    return surcharge
