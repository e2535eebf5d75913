"""report.md of a re-plan: what was optimised, the candidates, the old and new layouts side by side, what
moves, the migration against the steps it takes to pay back, and how each target resumes; then the new
plan's own report (planner.plan.report), its headings one level down."""

from __future__ import annotations

import math

from planner.plan.report import md_table
from planner.plan.schema import Plan, PlanStage
from planner.replan.candidates import ReplanChoice
from planner.replan.migration import LINKS, Migration
from planner.replan.nodes import NodeMap

GB = 1e9


def _gb(n: float) -> str:
    """Bytes in GB, with enough digits for small models."""
    return f"{n / GB:,.2f}" if n >= 1e8 or n == 0 else f"{n / GB:.3g}"


def _s(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:,.0f}"
    return f"{seconds:.2f}" if seconds >= 1 or seconds == 0 else f"{seconds:.3g}"


def _nodes(stage: PlanStage) -> str:
    first, last = stage.ranks.nodes
    return f"{first}" if first == last else f"{first}-{last}"


def _blocks(stage: PlanStage) -> str:
    return ", ".join(f"{a}-{b}" for a, b in stage.chunks) or "-"


def _optimised(choice: ReplanChoice, migration: Migration) -> list[str]:
    return [
        "## What was optimised",
        "",
        f"Minimised: **{choice.objective}**, with {choice.steps_left:,} steps left.",
        "",
        f"1. Step time: the job was compiled for the new cluster as `planner compile` would "
        f"({choice.step_status}: fastest plan {choice.step_optimum_s:.4f} s per step, no plan faster than "
        f"{choice.step_bound_s:.4f} s).",
        ("2. Migration in the programs: the job was compiled again with each split's migration (its busiest "
         "receiving port: each GPU's NVLink in, each node's NICs in and checkpoint reads) / steps left added to "
         "every program's step time, so splits that keep blocks where their state is win where that pays "
         "(planner/replan/program_term.py)." if choice.migration_in_programs else
         "2. Migration in the programs: left out on this mixed cluster (the programs choose each stage's pool, so "
         "its GPUs are unknown before solving); only the candidates weigh it."),
        "3. Candidates: those optima and the first's runners-up, the best plan keeping the old tp, pp and cp (a "
        "compile with them fixed), and the old strategy with dp re-derived (its stage boundaries and "
        "shard layout) on the most nodes where that divides the global batch, each re-costed and required "
        "to fit.",
        f"4. Migration per candidate, exactly: the bytes each new rank needs, from a surviving GPU (same GPU: kept; "
        f"same node: NVLink; another node: the fabric) or the checkpoint (route here: {migration.route}); the time "
        "is the busiest port's bytes / rate, senders' ports included (planner/replan/migration.py).",
        f"5. Choice: least total. Certificate: no plan on the {choice.nodes_compiled} compiled nodes totals less "
        f"than {_s(choice.total_bound_s)} s "
        + (f"(steps left x the migration-aware compile's bound: {_s(choice.program_bound_s)} s; " if
           choice.program_bound_s is not None else "(")
        + f"steps left x step bound + the least migration any layout needs: {_s(choice.migration_floor_s)} s for the "
        f"{_gb(choice.unrecoverable_bytes)} GB no surviving GPU holds); the chosen plan totals "
        f"{_s(choice.total_s)} s, gap {100 * choice.gap:.2f}%.",
        "",
    ]


def _candidates(choice: ReplanChoice) -> list[str]:
    rows = []
    for i, c in enumerate(choice.candidates):
        mark = " (chosen)" if c.strategy_spec == choice.chosen else ""
        rows.append([str(i + 1), f"`{c.strategy_spec}`{mark}", c.source, str(c.nodes), f"{c.step_time_s:.4f}",
                     _s(c.migration_s), _gb(c.moved_bytes), _gb(c.kept_bytes), _s(c.total_s)])
    return ["## Candidates", "",
            md_table(["#", "strategy", "from", "nodes", "step s", "migration s", "moved GB", "kept GB", "total s"],
                     rows, right=(0, 3, 4, 5, 6, 7, 8)), ""]


def _layouts(old: Plan, new: Plan, nodes: NodeMap) -> list[str]:
    keys = ("tp", "pp", "dp", "cp", "ep", "mbs", "vpp", "zero", "shard", "recompute", "offload")
    rows = [[key, str(getattr(old.strategy, key)), str(getattr(new.strategy, key))] for key in keys]
    rows += [["GPUs", str(old.job.num_gpus), str(new.job.num_gpus)],
             ["step s", f"{old.time.step_time_s:.4f}", f"{new.time.step_time_s:.4f}"],
             ["cluster", old.job.cluster_description, new.job.cluster_description]]
    stages = []
    for i in range(max(len(old.stages), len(new.stages))):
        o = old.stages[i] if i < len(old.stages) else None
        n = new.stages[i] if i < len(new.stages) else None
        stages.append([str(i), _blocks(o) if o else "", _nodes(o) if o else "", _blocks(n) if n else "",
                       _nodes(n) if n else ""])
    lost = ", ".join(str(n) for n in nodes.lost) or "none"
    fresh = ", ".join(str(n) for n in nodes.fresh) or "none"
    return ["## Old and new layout", "",
            md_table(["", "old", "new"], rows), "",
            md_table(["stage", "old blocks", "old nodes", "new blocks", "new nodes"], stages, right=(0,)), "",
            f"Old nodes gone: {lost}. New nodes that held nothing: {fresh}. Surviving nodes keep their numbers' "
            "order (planner/replan/nodes.py; `--lost-nodes` names the ones that left).", ""]


def _moves(migration: Migration) -> list[str]:
    rows = [[t.link, _gb(t.bytes), str(t.moves), _s(t.seconds), t.busiest or "-"] for t in migration.links]
    kinds = {kind: sum(m.bytes for m in migration.moves if m.kind == kind and m.link != "local")
             for kind in ("weights", "optimizer")}
    heavy = sorted(migration.ranks, key=lambda r: (-(r.state_bytes - r.by_link.get("local", 0.0)), r.rank))[:8]
    rank_rows = [[str(r.rank), f"{r.gpu[0]}:{r.gpu[1]}", _gb(r.state_bytes)] + [_gb(r.by_link.get(link, 0.0))
                                                                                 for link in LINKS]
                 for r in heavy]
    return ["## What moves", "",
            f"State of the new layout: {_gb(migration.state_bytes)} GB ({', '.join(migration.terms)}); "
            f"{_gb(migration.kept_bytes)} GB are already on the GPU that needs them; {_gb(migration.moved.bytes)} GB "
            f"travel ({_gb(kinds['weights'])} GB weights, {_gb(kinds['optimizer'])} GB optimizer state), in "
            f"{_s(migration.moved.seconds)} s (busiest: {migration.moved.bottleneck or 'nothing'}).", "",
            md_table(["link", "GB", "moves", "seconds", "busiest port"], rows, right=(1, 2, 3)), "",
            "Ranks that receive the most (migration.json lists every move):", "",
            md_table(["rank", "GPU", "state GB", *[f"{link} GB" for link in LINKS]], rank_rows,
                     right=(0, 2, 3, 4, 5, 6)), "",
            f"A restart that reads every rank's whole state from the checkpoint (what the launch files below do) "
            f"reads {_gb(migration.restart.bytes)} GB in {_s(migration.restart.seconds)} s (busiest: "
            f"{migration.restart.bottleneck}).", ""]


def _pays_back(gain: float, extra: float) -> str:
    return "never" if gain <= 0 else f"{math.ceil(extra / gain):,} steps"


def _payback(choice: ReplanChoice) -> list[str]:
    chosen = next(c for c in choice.candidates if c.strategy_spec == choice.chosen)
    ranked = list(enumerate(choice.candidates))  # ties: the better-ranked candidate
    least = min(ranked, key=lambda ic: (ic[1].migration_s, ic[1].step_time_s, ic[0]))[1]
    fastest = min(ranked, key=lambda ic: (ic[1].step_time_s, ic[1].migration_s, ic[0]))[1]
    lines = ["## Migration against the steps left", ""]
    lines.append(f"The chosen plan's migration takes {_s(chosen.migration_s)} s, "
                 f"{chosen.migration_s / chosen.step_time_s:,.1f} of its steps.")
    if least.strategy_spec != chosen.strategy_spec:
        gain = least.step_time_s - chosen.step_time_s
        lines.append(f"The runner-up that moves least, `{least.strategy_spec}` ({least.source}), migrates in "
                     f"{_s(least.migration_s)} s ({_gb(least.moved_bytes)} GB) but steps in {least.step_time_s:.4f} s: "
                     f"the chosen plan's extra {_s(chosen.migration_s - least.migration_s)} s of migration pays back "
                     f"after {_pays_back(gain, chosen.migration_s - least.migration_s)} of the "
                     f"{choice.steps_left:,} left.")
    else:
        lines.append("No candidate moves less than the chosen plan.")
    if fastest.strategy_spec != chosen.strategy_spec:
        gain = chosen.step_time_s - fastest.step_time_s
        lines.append(f"The fastest plan, `{fastest.strategy_spec}`, would save {gain:.4f} s per step but migrate "
                     f"{_s(fastest.migration_s - chosen.migration_s)} s longer: it would pay back after "
                     f"{_pays_back(gain, fastest.migration_s - chosen.migration_s)}, more than the "
                     f"{choice.steps_left:,} left.")
    return lines + [""]


def _demoted(report: str) -> list[str]:
    return [("#" + line) if line.startswith("#") else line for line in report.splitlines()]


def render_replan_report(old: Plan, new: Plan, choice: ReplanChoice, migration: Migration, nodes: NodeMap,
                         resume: list[str], plan_report: str) -> str:
    """report.md of a re-plan; `resume`: one bullet per written target; `plan_report`: the new plan's report."""
    lines = [f"# Re-plan: {new.job.model} from {old.job.cluster} to {new.job.cluster}", "",
             f"The old plan `{old.strategy_spec}` ran on {old.job.cluster_description}. The new allocation is "
             f"{new.job.cluster_description}; {choice.batch_policy}. Chosen: `{new.strategy_spec}`, "
             f"{new.time.step_time_s:.4f} s per step (the fastest plan: {choice.step_optimum_s:.4f} s), after a "
             f"migration of {_s(migration.moved.seconds)} s.", "",
             *_optimised(choice, migration), *_candidates(choice), *_layouts(old, new, nodes), *_moves(migration),
             *_payback(choice), "## Resuming", "",
             *(resume or ["- no launch files were written (see the notes on stderr)."]), "", "---", "",
             *_demoted(plan_report)]
    return "\n".join(lines).rstrip("\n") + "\n"
