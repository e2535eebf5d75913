"""Re-planning the published 70B and 405B jobs after losing 1, 2 and 8 nodes.

    python tests/bench/replan.py                  # both jobs, markdown table on stdout
    python tests/bench/replan.py --only 405b      # jobs whose name contains "405b"
    python tests/bench/replan.py --steps-left 100
    python tests/bench/replan.py --time-limit 60   # each compile's budget (default 300 s)

Jobs (tests/data/published_runs.csv, on their published clusters of H100 96GB nodes, h100-96g-8):

* llama3-70b, row 66 (torchtitan FSDP32 x TP8 on 256 GPUs): batch 512 x 8192, 32 nodes;
* llama3-405b, row 305 (torchtitan 4D on 512 GPUs): batch 64 x 32768, 64 nodes.

Each job is compiled as `planner compile` would (planner's runtime, default options), then re-planned
(`planner.replan.candidates.replan`, what `planner replan` runs) onto the same cluster less its last 1,
2 and 8 nodes, with `--steps-left` steps to go (default 1000).  One row per re-plan: the chosen plan
and where it came from; its step time against the from-scratch optimum on the smaller cluster (the
compile's); the fastest candidate that keeps the old layout (the best plan with the old tp/pp/cp, or
the old strategy itself on the most nodes where its dp divides the batch), its nodes and its step time
over the optimum; the migration (bytes that travel, seconds) against a restart from the checkpoint;
the step-time search's status; the total's gap to its bound; the wall time of the re-plan.  Timings
are single runs on a shared machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.plan.assemble import build_plan  # noqa: E402
from planner.profile import CLI_RUNTIME, load_runtime  # noqa: E402
from planner.replan.candidates import ReplanOptions, replan  # noqa: E402
from planner.replan.layout import plan_layout  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import CompileOptions  # noqa: E402
from planner.strategy import parse_strategy  # noqa: E402

GB = 1e9
LOST = (1, 2, 8)
KEEPS = ("keeps layout", "keeps tp/pp/cp")


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    preset: str
    nodes: int
    batch: int
    seq: int
    row: int


SCENARIOS = (
    Scenario("llama3-70b", "llama3-70b", "h100-96g-8", 32, 512, 8192, 66),
    Scenario("llama3-405b", "llama3-405b", "h100-96g-8", 64, 64, 32768, 305),
)


@dataclass
class Row:
    scenario: str
    old: str
    nodes: str
    chosen: str
    source: str
    step_s: float
    optimum_s: float
    keep: tuple[float, int] | None  # the fastest layout-keeping candidate's step time and nodes
    moved_gb: float
    migration_s: float
    restart_s: float
    gap: float
    status: str
    wall_s: float
    note: str = ""


def short(spec: str) -> str:
    """The degrees and sharding of a SPEC: tp, pp, dp, cp, zero (and shard=node, offload when set)."""
    s = parse_strategy(spec)
    parts = [f"tp{s.tp}", f"pp{s.pp}", f"dp{s.dp}", f"cp{s.cp}", f"z{s.zero}"]
    if s.shard == "node":
        parts.append("hsdp")
    if s.offload != "none" or s.stage_offload:
        parts.append("offload")
    return " ".join(parts)


def old_plan(scenario: Scenario, time_limit: float):
    """The job's plan on its full cluster (as `planner compile` builds it)."""
    job = Job(model=load_model(scenario.model), cluster=load_cluster(f"{scenario.preset}:{scenario.nodes}"),
              global_batch=scenario.batch, seq_len=scenario.seq).on(load_runtime(CLI_RUNTIME))
    options = CompileOptions(time_limit=time_limit)
    return job, options, build_plan(job, compile_job(job, options), options)


def run(scenario: Scenario, lost: tuple[int, ...], steps_left: int, time_limit: float) -> list[Row]:
    job, options, plan = old_plan(scenario, time_limit)
    layout = plan_layout(plan, job.model)
    rows = []
    for gone in lost:
        nodes = scenario.nodes - gone
        start = time.perf_counter()
        try:
            result = replan(layout, job, options, load_cluster(f"{scenario.preset}:{nodes}"),
                            ReplanOptions(steps_left=steps_left, time_limit=time_limit))
        except InfeasibleError as err:
            rows.append(Row(scenario.name, short(plan.strategy_spec), f"{scenario.nodes} -> {nodes}", "-", "-",
                            float("nan"), float("nan"), None, float("nan"), float("nan"), float("nan"),
                            float("nan"), "-", time.perf_counter() - start, note=str(err).splitlines()[0][:80]))
            continue
        wall = time.perf_counter() - start
        choice, migration = result.choice, result.migration
        chosen = next(c for c in choice.candidates if c.strategy_spec == choice.chosen)
        keeps = sorted((c.step_time_s, c.nodes) for c in choice.candidates if c.source in KEEPS)
        used = f" (uses {choice.nodes_used})" if choice.nodes_used != nodes else ""
        rows.append(Row(scenario.name, short(plan.strategy_spec), f"{scenario.nodes} -> {nodes}{used}",
                        short(chosen.strategy_spec), chosen.source, chosen.step_time_s, choice.step_optimum_s,
                        keeps[0] if keeps else None, migration.moved.bytes / GB, migration.moved.seconds,
                        migration.restart.seconds, choice.gap, choice.step_status, wall))
    return rows


def _f(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.{digits}f}"


def render(rows: list[Row], steps_left: int) -> str:
    head = ["job", "old plan", "nodes", "chosen plan", "from", "step s", "optimum s", "chosen / optimum",
            "best layout-keeping s", "moved GB", "migration s", "restart s", "step search", "gap", "re-plan s"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * 5 + ["---:"] * 10) + " |"]
    for r in rows:
        ratio = r.step_s / r.optimum_s if r.optimum_s == r.optimum_s and r.optimum_s else float("nan")
        keep = "none fits" if r.keep is None else f"{_f(r.keep[0])} ({r.keep[1]} nodes, {r.keep[0] / r.optimum_s:.2f}x)"
        lines.append("| " + " | ".join([
            r.scenario, r.old, r.nodes, r.chosen or "-", r.source, _f(r.step_s), _f(r.optimum_s), _f(ratio, 3), keep,
            _f(r.moved_gb, 0), _f(r.migration_s), _f(r.restart_s), r.status,
            f"{100 * r.gap:.2f}%" if r.gap == r.gap else "-",
            _f(r.wall_s, 1)]) + " |" + (f" {r.note}" if r.note else ""))
    return "\n".join(lines) + f"\n\n{steps_left:,} steps left in every re-plan.\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Only jobs whose name contains this.")
    parser.add_argument("--steps-left", type=int, default=1000, help="Steps left after the change (default 1000).")
    parser.add_argument("--time-limit", type=float, default=300.0,
                        help="Budget of each compile, seconds (default 300: long enough that no compile is cut "
                        "short on a loaded machine, so the table is reproducible).")
    args = parser.parse_args(argv)
    rows = []
    for scenario in SCENARIOS:
        if args.only in scenario.name:
            rows += run(scenario, LOST, args.steps_left, args.time_limit)
    print(render(rows, args.steps_left))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
