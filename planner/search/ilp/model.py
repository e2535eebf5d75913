"""The CP-SAT program of one global configuration: split, recompute and pools per stage.

Sections, as in OR-Tools' samples: variables, constraints (one function per
family), objective, then reading the solution.  Tables come from
`planner.search.ilp.tables` (the cost model), in integer nanoseconds.

    cut[s]        block index where stage s starts (cut[0] = 0, cut[pp] = blocks)
    count[s, k]   blocks of segment k on stage s (overlap of [cut[s], cut[s+1]) with segment k)
    pool_is[s, p] 1 if stage s runs on pool p
    pool[s]       pool of stage s (mixed clusters; any order: the pipeline's ends hold the most
                  in flight and the embedding/head, so which pool sits where matters)
    option[s]     index of stage s's row in its flattened table (content x pool x placement)
    time[s]       critical-path nanoseconds of one micro-batch on stage s
    dp_end[s]     stage s's step-end data-parallel sync not hidden (nanoseconds)
    update[s]     stage s's optimizer step + offload nanoseconds after the barrier (its placement decides)
    variant[s]    placement of stage s (only built when every stage must take the same one)
    bottleneck    max_s time[s]
    fill[s]       of time[s], what the schedule's warm-up and drain leave idle elsewhere (time[s] but under
                  zero-bubble V schedules, planner.cost.pipeline)

Step time (x v to stay integral), the pipeline formula of `evaluate`:
    v * m * bottleneck + (sum_s fill[s] - max_s fill[s]) + v * (max_s dp_end[s] + max_s update[s])
Objective: the step time, or for --objective cost the step time (microseconds) times the
price rate of the pools the stages occupy; with a surcharge table (a re-plan's amortised migration,
planner.search.ilp.surcharge) the step time plus the surcharge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ortools.sat.python import cp_model

from planner.search.ilp.surcharge import SurchargeTable, add_surcharge
from planner.search.ilp.tables import ConfigTables, StageOption

_BIG = 1 << 50  # table filler for contents that are not allowed (their index is excluded from the domain)


class Row(NamedTuple):
    """One row of a stage's flattened table."""

    counts: tuple[int, ...]  # blocks per segment
    pool: int  # index into ConfigTables.pools
    option: StageOption  # its costs and placement


@dataclass
class StageRows:
    """Flattened table of one stage: row r = (content, pool, placement)."""

    rows: list[Row]

    def column(self, name: str) -> list[int]:
        return [getattr(row.option, name) for row in self.rows]


@dataclass
class Program:
    """A built CP-SAT model with the handles needed to read a solution."""

    model: cp_model.CpModel
    tables: ConfigTables
    stage_rows: list[StageRows]
    option: list[cp_model.IntVar]
    objective: cp_model.LinearExpr  # step (time objective) or cost units (cost objective)
    step: cp_model.LinearExpr  # step time in nanoseconds x scale
    scale: int  # step units per nanosecond (= vpp)
    mixed_cluster: bool  # the cluster has several pools: the plan names each stage's pool
    prices: list[int] | None = None  # per pool (cost objective on a mixed cluster): the objective is in price units


def _stage_rows(tables: ConfigTables, stage: int) -> StageRows:
    rows: list[Row] = []
    for pool_index, options in enumerate(tables.options[stage]):
        for counts in sorted(options):
            rows.extend(Row(counts, pool_index, option) for option in options[counts])
    return StageRows(rows=rows)


# ----------------------------------------------------------------------------- constraints


def add_partition(model: cp_model.CpModel, tables: ConfigTables) -> tuple[list, dict]:
    """cut[s] and count[s, k]: contiguous, non-empty stages covering every block in order."""
    blocks, pp = tables.blocks, tables.strategy.pp
    if not tables.segments:
        return [], {}  # no transformer blocks (recsys): one stage holds every layer
    cut = [model.new_constant(0)]
    cut += [model.new_int_var(1, blocks - 1, f"cut[{s}]") for s in range(1, pp)]
    cut.append(model.new_constant(blocks))
    for s in range(pp):
        model.add(cut[s + 1] >= cut[s] + 1)
    count: dict[tuple[int, int], cp_model.IntVar] = {}
    base = tables.segments[0].start
    for s in range(pp):
        for k, seg in enumerate(tables.segments):
            lo, hi = seg.start - base, seg.end - base
            if len(tables.segments) == 1:
                count[s, k] = model.new_int_var(1, blocks, f"count[{s},{k}]")
                model.add(count[s, k] == cut[s + 1] - cut[s])
                continue
            first = model.new_int_var(0, blocks, f"first[{s},{k}]")
            last = model.new_int_var(0, blocks, f"last[{s},{k}]")
            model.add_max_equality(first, [cut[s], model.new_constant(lo)])
            model.add_min_equality(last, [cut[s + 1], model.new_constant(hi)])
            count[s, k] = model.new_int_var(0, seg.size, f"count[{s},{k}]")
            model.add_max_equality(count[s, k], [last - first, model.new_constant(0)])
    return cut, count


def add_stage_choice(model: cp_model.CpModel, tables: ConfigTables, rows: list[StageRows], count: dict
                     ) -> tuple[list, list, dict]:
    """option[s]: exactly one allowed (content, pool) row per stage, consistent with the counts."""
    option, pool, pool_is = [], [], {}
    pools = len(tables.pools)
    for s, stage_rows in enumerate(rows):
        option.append(model.new_int_var(0, len(stage_rows.rows) - 1, f"option[{s}]"))
        # the row's content must equal the counts the cuts imply
        tuples = [(r, *counts, pool) for r, (counts, pool, _) in enumerate(stage_rows.rows)]
        pool_var = model.new_int_var(0, pools - 1, f"pool[{s}]")
        pool.append(pool_var)
        model.add_allowed_assignments(
            [option[s], *[count[s, k] for k in range(len(tables.segments))], pool_var], tuples)
        for p in range(pools):
            pool_is[s, p] = model.new_bool_var(f"pool_is[{s},{p}]")
            model.add(pool_var == p).only_enforce_if(pool_is[s, p])
            model.add(pool_var != p).only_enforce_if(~pool_is[s, p])
    return option, pool, pool_is


def add_pool_capacity(model: cp_model.CpModel, tables: ConfigTables, pool_is: dict) -> None:
    """Each pool holds whole stages only as far as its GPUs go."""
    s_ = tables.strategy
    ranks = s_.tp * s_.cp * s_.data_parallel
    for p, pool in enumerate(tables.pools):
        model.add(sum(pool_is[s, p] for s in range(s_.pp)) <= pool.gpus // ranks)


def add_stage_costs(model: cp_model.CpModel, rows: list[StageRows], option: list, name: str) -> list:
    """cost[s] = table[s][option[s]] for one column of the tables."""
    values = []
    for s, stage_rows in enumerate(rows):
        column = stage_rows.column(name)
        var = model.new_int_var(min(column), max(column), f"{name}[{s}]")
        model.add_element(option[s], column, var)
        values.append(var)
    return values


def _lower_hull(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Vertices of the lower convex hull of (x, y) points sorted by x (monotone chain)."""
    hull: list[tuple[int, int]] = []
    for x, y in points:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) <= 0:  # hull[-1] is not below the chord
                hull.pop()
            else:
                break
        hull.append((x, y))
    return hull


def add_time_envelopes(model: cp_model.CpModel, tables: ConfigTables, rows: list[StageRows], count: dict,
                       time: list) -> None:
    """Redundant cuts for the LP relaxation: time[s] lies above every edge of the lower convex hull
    of stage s's (blocks, time) table, so the relaxation knows what blocks cost wherever they go."""
    if not tables.segments or len(tables.pools) > 1:
        return
    for s, stage_rows in enumerate(rows):
        best: dict[int, int] = {}
        for counts, _, option in stage_rows.rows:
            n = sum(counts)
            best[n] = min(best.get(n, option.time), option.time)
        hull = _lower_hull(sorted(best.items()))
        blocks = sum(count[s, k] for k in range(len(tables.segments)))
        for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
            # y >= y1 + (y2 - y1) / (x2 - x1) * (n - x1), scaled by (x2 - x1) to stay integral
            model.add((x2 - x1) * time[s] >= (x2 - x1) * y1 + (y2 - y1) * (blocks - x1))


def add_middle_stages_equal(model: cp_model.CpModel, cut: list) -> None:
    """Every stage but the first and last holds the same number of blocks (SpaceOptions.split_shape "ends":
    Megatron's --decoder-first/last-pipeline-num-layers are its only uneven stages)."""
    for s in range(2, len(cut) - 2):
        model.add(cut[s + 1] - cut[s] == cut[2] - cut[1])


def add_uniform_recompute(model: cp_model.CpModel, tables: ConfigTables, rows: list[StageRows], option: list,
                          cut: list, all_or_none: bool = False) -> None:
    """One recompute count k for every stage: stage s recomputes min(k, its blocks per chunk) (Megatron's
    --recompute-num-layers with the block method); `all_or_none`: k is 0 or every block (torchtitan's full
    activation checkpointing)."""
    if not tables.segments:
        return
    recomputed = add_stage_costs(model, rows, option, "recompute")
    values = [0, tables.blocks] if all_or_none else list(range(tables.blocks + 1))
    k = model.new_int_var_from_domain(cp_model.Domain.from_values(values), "recompute_count")
    v = tables.strategy.vpp
    for s, var in enumerate(recomputed):
        per_chunk = tables.blocks // (tables.strategy.pp * v) if v > 1 else cut[s + 1] - cut[s]
        model.add_min_equality(var, [k, per_chunk])


def add_uniform_placement(model: cp_model.CpModel, rows: list[StageRows], option: list) -> None:
    """Every stage takes the same placement (SpaceOptions.stage_placement off)."""
    variants = add_stage_costs(model, rows, option, "variant")
    for var in variants[1:]:
        model.add(var == variants[0])


def add_max(model: cp_model.CpModel, values: list, name: str) -> cp_model.IntVar:
    """max over stages (the bottleneck stage, or the slowest step-end term)."""
    top = model.new_int_var(0, max(list(v.proto.domain)[-1] for v in values), name)
    model.add_max_equality(top, values)
    return top


# ----------------------------------------------------------------------------- build


def add_cost_objective(model: cp_model.CpModel, tables: ConfigTables, pool_is: dict, step: cp_model.LinearExpr,
                       scale: int, prices: list[int]) -> cp_model.IntVar:
    """cost = step (microseconds) x price rate of the GPUs the stages occupy (1e-4 USD per hour units)."""
    s_ = tables.strategy
    ranks = s_.tp * s_.cp * s_.data_parallel
    top_rate = s_.pp * ranks * max(prices)
    rate = model.new_int_var(0, top_rate, "rate")
    model.add(rate == sum(pool_is[s, p] * ranks * prices[p] for s in range(s_.pp) for p in range(len(prices))))
    step_us = model.new_int_var(0, 1 << 40, "step_us")
    model.add_division_equality(step_us, step, scale * 1000)
    cost = model.new_int_var(0, (1 << 40) * top_rate, "cost")
    model.add_multiplication_equality(cost, [step_us, rate])
    return cost


def build_program(tables: ConfigTables, max_step_ns: int | None = None, prices: list[int] | None = None,
                  mixed_cluster: bool = False, cutoff_ns: int | None = None, uniform_placement: bool = False,
                  middle_stages_equal: bool = False, recompute_counts: str = "per_stage",
                  surcharge: SurchargeTable | None = None) -> Program:
    """The CP-SAT model of `tables`: minimise step time, or with `prices` (per pool, 1e-4 USD per
    GPU-hour) the cost per step.  `cutoff_ns`: only plans with a step time at most this (the
    incumbent's), so a configuration that cannot beat it ends INFEASIBLE, usually long before
    its own optimum would be proved.  `uniform_placement`: one placement for every stage;
    `middle_stages_equal`: only the first and last stage may differ in blocks; `recompute_counts`: per_stage,
    one count for every stage (uniform), or every block or none (all); `surcharge`: added to the step time
    (time objective only), and the cutoff applies to the sum."""
    model = cp_model.CpModel()
    rows = [_stage_rows(tables, s) for s in range(tables.strategy.pp)]

    # variables and structural constraints
    cut, count = add_partition(model, tables)
    option, pool, pool_is = add_stage_choice(model, tables, rows, count)
    if middle_stages_equal and cut:
        add_middle_stages_equal(model, cut)
    if recompute_counts != "per_stage":
        add_uniform_recompute(model, tables, rows, option, cut, all_or_none=recompute_counts == "all")
    if len(tables.pools) > 1:
        add_pool_capacity(model, tables, pool_is)
    if uniform_placement and len(tables.variants) > 1:
        add_uniform_placement(model, rows, option)

    # stage costs from the tables
    time = add_stage_costs(model, rows, option, "time")
    add_time_envelopes(model, tables, rows, count, time)
    tails = [add_max(model, add_stage_costs(model, rows, option, column), f"max_{column}")
             for column in ("dp_end", "update")]
    bottleneck = add_max(model, time, "bottleneck")

    # step time: the pipeline formula, scaled by v to stay integral
    v, m = tables.strategy.vpp, tables.micro_batches
    if tables.strategy.v_shape:  # the bubble is the fills' (planner.cost.pipeline), not the stage times'
        fill = add_stage_costs(model, rows, option, "fill")
        bubble = sum(fill) - add_max(model, fill, "max_fill")
    else:
        bubble = sum(time) - bottleneck
    step = v * m * bottleneck + bubble + v * sum(tails)
    if max_step_ns is not None:
        model.add(step <= v * max_step_ns)
    timed = step if surcharge is None or prices is not None else step + add_surcharge(model, surcharge, cut,
                                                                                       tables.blocks)
    if cutoff_ns is not None:
        model.add(timed <= v * cutoff_ns)

    # objective
    if prices is None:
        objective = timed
    else:
        objective = add_cost_objective(model, tables, pool_is, step, v, prices)
    model.minimize(objective)
    return Program(model=model, tables=tables, stage_rows=rows, option=option, objective=objective, step=step,
                   scale=v, mixed_cluster=mixed_cluster, prices=prices)
