"""The CP-SAT program of embedding sharding and HBM caching.

Two forms over the same option tables (cost.py):

* exact: every table picks one option and every unit a rank (table/column-wise)
  or a node (table-row-wise); per-rank lookup, send, receive and HBM, per-node
  host DRAM.  Objective: slowest lookup + slowest all-to-all side + data-
  parallel table syncs.  Its optimum is the optimum of the cost model.
* relaxed (many tables on many ranks): options only, with the per-rank maxima
  replaced by what any placement must pay: total work over the ranks at the
  fastest pool's rate, and each single unit; capacities summed.  Its bound is a
  valid lower bound of every plan, and its options are then placed greedily.

Times are integer nanoseconds, memory integer bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement
from planner.embedding.options import ALL_RANKS, ShardingType, TableOption
from planner.embedding.relaxed import RelaxedCoefficients

NS = 1e9
SEED = 7
# Deterministic work of the relaxed form's tie-break solve (least total work at the proven objective).
TIE_BREAK_WORK = 2.0


def _ns(seconds: float) -> int:
    return int(round(seconds * NS))


@dataclass(frozen=True)
class ProgramResult:
    """What a solve returned."""

    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE or UNKNOWN
    objective_s: float  # the program's objective (without fixed seconds)
    bound_s: float
    choice: dict[int, TableOption]
    placements: list[TablePlacement] | None  # exact form only


class ShardingProgram:
    """Variables, constraints and objective of one sharding program."""

    def __init__(self, model: EmbeddingCostModel, options: list[list[TableOption]], *, relaxed: bool,
                 coefficients: RelaxedCoefficients | None = None):
        self.model, self.options, self.relaxed = model, options, relaxed
        self.cp = cp_model.CpModel()
        self.work = 0.0  # CP-SAT deterministic time spent so far
        self.sites = model.sites
        self.pools = range(len(model.job.cluster.pools))
        self._variables()
        if relaxed:
            self._relaxed_constraints(coefficients or RelaxedCoefficients(model, options))
        else:
            self._exact_constraints()
        self._objective()

    # ---- variables -------------------------------------------------------------------------------
    def _variables(self) -> None:
        cp, sites = self.cp, self.sites
        # x[t, i]: table t takes its option i (exactly one per table)
        self.x = {(t, i): cp.new_bool_var(f"x_{t}_{i}") for t, opts in enumerate(self.options)
                  for i in range(len(opts))}
        for t, opts in enumerate(self.options):
            cp.add_exactly_one(self.x[t, i] for i in range(len(opts)))
        # the slowest rank's lookups and the slowest all-to-all side (sender or receiver), ns
        horizon = _ns(sum(max(self._unit_time(t, i, p) for i in range(len(o)) for p in self.pools)
                          for t, o in enumerate(self.options)) * sites.world + 1.0)
        self.lookup_max = cp.new_int_var(0, horizon, "lookup_max")
        self.comm_max = cp.new_int_var(0, horizon, "comm_max")
        self.z: dict[tuple[int, int, int], cp_model.IntVar] = {}
        self.v: dict[tuple[int, int, int], cp_model.IntVar] = {}
        if self.relaxed:
            return
        for t, opts in enumerate(self.options):
            for i, option in enumerate(opts):
                if option.kind in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
                    # z[t, i, r]: a unit of table t under option i sits on rank r (column shards on distinct ranks)
                    for r in range(sites.world):
                        self.z[t, i, r] = cp.new_bool_var(f"z_{t}_{i}_{r}")
                    cp.add(sum(self.z[t, i, r] for r in range(sites.world)) == option.shards * self.x[t, i])
                elif option.kind == ShardingType.TABLE_ROW_WISE:
                    # v[t, i, n]: table t under option i is row-split over the GPUs of node n
                    for n in range(sites.num_nodes):
                        self.v[t, i, n] = cp.new_bool_var(f"v_{t}_{i}_{n}")
                    cp.add(sum(self.v[t, i, n] for n in range(sites.num_nodes)) == self.x[t, i])

    def _unit_time(self, t: int, i: int, pool: int) -> float:
        unit = self.model.costs.unit(t, self.options[t][i], pool)
        return unit.lookup_s + unit.send_s + self.model.costs.receive_s(t, self.options[t][i], pool)

    # ---- constraints -----------------------------------------------------------------------------
    def _rank_terms(self, rank: int):
        """(variable, option) pairs whose units land on `rank`."""
        site = self.sites.ranks[rank]
        for t, opts in enumerate(self.options):
            for i, option in enumerate(opts):
                if option.kind in ALL_RANKS:
                    yield self.x[t, i], t, option
                elif (t, i, rank) in self.z:
                    yield self.z[t, i, rank], t, option
                elif (t, i, site.node) in self.v:
                    yield self.v[t, i, site.node], t, option

    def _exact_constraints(self) -> None:
        cp, costs, model = self.cp, self.model.costs, self.model
        host: dict[int, list] = {n: [] for n in range(self.sites.num_nodes)}
        rank_lookup = []
        for site in self.sites.ranks:
            lookup, send, hbm = [], [], []
            for var, t, option in self._rank_terms(site.rank):
                unit = costs.unit(t, option, site.pool)
                lookup.append(_ns(unit.lookup_s) * var)
                send.append(_ns(unit.send_s) * var)
                hbm.append(math.ceil(unit.hbm_bytes) * var)
                host[site.node].append(math.ceil(unit.host_bytes) * var)
            # the slowest rank bounds both phases
            cp.add(self.lookup_max >= sum(lookup))
            rank_lookup.append(sum(lookup))
            cp.add(self.comm_max >= sum(send))
            # HBM per rank, host DRAM per node (tiers)
            cp.add(sum(hbm) <= math.floor(model.hbm_budget(site.pool)))
        for n, terms in host.items():
            cp.add(sum(terms) <= math.floor(self.sites.host_capacity(n)))
        self._receive_constraints()
        self._break_symmetry(rank_lookup)

    def _break_symmetry(self, rank_lookup: list) -> None:
        """Ranks of one node are interchangeable, and so are whole nodes of one pool: order them by lookup
        load (any plan can be permuted into this order without changing its cost)."""
        sites = self.sites
        for ranks in sites.node_ranks:
            for a, b in zip(ranks, ranks[1:]):
                self.cp.add(rank_lookup[a] >= rank_lookup[b])
        for n in range(sites.num_nodes - 1):
            if sites.node_pool[n] == sites.node_pool[n + 1]:
                self.cp.add(rank_lookup[sites.node_ranks[n][0]] >= rank_lookup[sites.node_ranks[n + 1][0]])

    def _receive_constraints(self) -> None:
        costs = self.model.costs
        for p in self.pools:
            # every rank of a pool receives the same: its samples of every non-replicated table
            receive = [_ns(costs.receive_s(t, self.options[t][i], p)) * self.x[t, i] for t, i in self.x]
            self.cp.add(self.comm_max >= sum(receive))

    def _relaxed_constraints(self, c: RelaxedCoefficients) -> None:
        cp, world = self.cp, self.sites.world
        lookup_work, send_work, hbm_total, host_total, hbm_everywhere = [], [], [], [], []
        for (t, i), var in self.x.items():
            lookup_work.append(_ns(c.lookup[t, i]) * var)
            send_work.append(_ns(c.send[t, i]) * var)
            hbm_total.append(math.ceil(c.hbm[t, i]) * var)
            host_total.append(math.ceil(c.host[t, i]) * var)
            hbm_everywhere.append(math.ceil(c.everywhere[t, i]) * var)
            if self.options[t][i].kind not in ALL_RANKS:
                # a single unit sits on one rank whole (one row per option: CP-SAT's LP is tighter this way)
                cp.add(self.lookup_max >= _ns(c.unit_lookup[t, i]) * var)
                cp.add(self.comm_max >= _ns(c.unit_send[t, i]) * var)
        # the busiest rank carries at least the average
        cp.add(world * self.lookup_max >= sum(lookup_work))
        cp.add(world * self.comm_max >= sum(send_work))
        # among equally fast option sets, the one with the least total work partitions best
        self.total_work = sum(lookup_work) + sum(send_work)
        cp.add(sum(hbm_total) <= math.floor(c.hbm_budget))
        cp.add(sum(hbm_everywhere) <= math.floor(c.everywhere_budget))
        cp.add(sum(host_total) <= math.floor(c.host_budget))
        self._receive_constraints()

    # ---- objective -------------------------------------------------------------------------------
    def _objective(self) -> None:
        costs = self.model.costs
        sync = [_ns(costs.dp_sync_s(t)) * self.x[t, i] for (t, i) in self.x
                if self.options[t][i].kind == ShardingType.DATA_PARALLEL]
        self.primary = self.lookup_max + self.comm_max + sum(sync)
        self.cp.minimize(self.primary)

    # ---- hint and solve --------------------------------------------------------------------------
    def hint(self, placements: list[TablePlacement]) -> None:
        """Start from a known plan (the greedy one)."""
        chosen = {p.table: p for p in placements}
        for (t, i), var in self.x.items():
            self.cp.add_hint(var, self.options[t][i] == chosen[t].option)
        for (t, i, r), var in self.z.items():
            self.cp.add_hint(var, self.options[t][i] == chosen[t].option and r in chosen[t].ranks)
        for (t, i, n), var in self.v.items():
            ranks = self.sites.node_ranks[n]
            self.cp.add_hint(var, self.options[t][i] == chosen[t].option and chosen[t].ranks == tuple(ranks))

    def solve(self, work_limit: float) -> ProgramResult:
        """Solve with one worker, a fixed seed and a deterministic work limit (same inputs, same plan);
        the relaxed form then breaks ties by least total work at the proven objective."""
        solver = self._solver(work_limit)
        code = solver.solve(self.cp)
        self.work += solver.deterministic_time
        status = solver.status_name(code)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            bound = solver.best_objective_bound / NS if code == cp_model.UNKNOWN else math.inf
            return ProgramResult(status, math.inf, bound, {}, None)
        objective, bound = solver.objective_value / NS, solver.best_objective_bound / NS
        values = {key: solver.value(var) for key, var in self.x.items()}
        if self.relaxed and code == cp_model.OPTIMAL:
            self.cp.clear_hints()
            for key, var in self.x.items():
                self.cp.add_hint(var, values[key])
            self.cp.add(self.primary <= int(round(solver.objective_value)))
            self.cp.minimize(self.total_work)
            second = self._solver(min(work_limit, TIE_BREAK_WORK))
            tie_code = second.solve(self.cp)
            self.work += second.deterministic_time
            if tie_code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                values = {key: second.value(var) for key, var in self.x.items()}
        choice = {t: self.options[t][i] for (t, i), value in values.items() if value}
        placements = None if self.relaxed else self._placements(solver, choice)
        return ProgramResult(status, objective, bound, choice, placements)

    @staticmethod
    def _solver(work_limit: float) -> cp_model.CpSolver:
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = SEED
        solver.parameters.catch_sigint_signal = False  # keep Python's handler (planner/cli/signals.py)
        solver.parameters.max_deterministic_time = max(0.1, work_limit)
        return solver

    def _placements(self, solver: cp_model.CpSolver, choice: dict[int, TableOption]) -> list[TablePlacement]:
        placements = []
        for t, option in sorted(choice.items()):
            i = self.options[t].index(option)
            if option.kind in ALL_RANKS:
                ranks = tuple(range(self.sites.world))
            elif option.kind == ShardingType.TABLE_ROW_WISE:
                node = next(n for n in range(self.sites.num_nodes) if solver.value(self.v[t, i, n]))
                ranks = tuple(self.sites.node_ranks[node])
            else:
                ranks = tuple(r for r in range(self.sites.world) if solver.value(self.z[t, i, r]))
            placements.append(TablePlacement(t, option, ranks))
        return placements
