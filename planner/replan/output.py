"""The files of a re-plan: plan.json (the new plan, recording the re-plan's question in its options),
migration.json, report.md with its figures, and each target's launch files with the commands that resume
the old run's checkpoint (planner.replan.convert)."""

from __future__ import annotations

import json

from planner.emit.check import emit_checked
from planner.emit.inputs import LaunchInputs, inputs_section
from planner.plan.build import inputs_digest
from planner.plan.assemble import build_plan
from planner.plan.plots import report_plots
from planner.plan.report import render_report
from planner.plan.schema import Plan, plan_json
from planner.replan.candidates import ReplanOptions, ReplanResult
from planner.emit.megatron import checkpoint_format
from planner.replan.convert import (deepspeed_convert_sh, deepspeed_universal_config, megatron_format_change,
                                    megatron_reshard_sh, resume_lines)
from planner.replan.migration import Migration
from planner.replan.report import render_replan_report


def migration_json(migration: Migration) -> str:
    """migration.json text: field order as declared, indent 2, one move per line (a big job has tens of
    thousands), trailing newline."""
    head = json.dumps(migration.model_dump(mode="json", exclude={"moves"}), indent=2, allow_nan=False)
    moves = ",\n".join("    " + json.dumps(m.model_dump(mode="json"), separators=(", ", ": "), allow_nan=False)
                       for m in migration.moves)
    return head[:-2] + (f',\n  "moves": [\n{moves}\n  ]\n}}\n' if moves else ',\n  "moves": []\n}\n')


def new_plan(old: Plan, result: ReplanResult, ask: ReplanOptions) -> Plan:
    """The new plan; its options carry `replan` (what was asked), and inputs_digest covers them."""
    plan = build_plan(result.job, result.result, result.options)
    record = {**result.options.model_dump(mode="json"), "replan": {
        "objective": result.choice.objective, "steps_left": ask.steps_left,
        "checkpoint_bandwidth": ask.checkpoint_bandwidth,
        "lost_nodes": list(ask.lost_nodes) if ask.lost_nodes is not None else None,
        "old_plan_digest": old.inputs_digest, "old_strategy": old.strategy_spec, "old_cluster": old.job.cluster}}
    return plan.model_copy(update={"options": record, "inputs_digest": inputs_digest(result.job, record)})


def replan_files(old: Plan, result: ReplanResult, ask: ReplanOptions, targets: tuple[str, ...],
                 inputs: LaunchInputs) -> tuple[Plan, dict[str, str | bytes], list[str]]:
    """(the new plan, every file keyed by its path in the output folder, notes for targets not written)."""
    plan = new_plan(old, result, ask)
    files: dict[str, str | bytes] = {"plan.json": plan_json(plan), "migration.json": migration_json(result.migration)}
    checks, notes = [], []
    for target in targets:
        check, produced = emit_checked(plan, result.job, target, inputs)
        checks.append(check)
        if check.status != "written":
            notes.append(f"no {target}/ files: {check.why}")
            continue
        if target == "megatron" and checkpoint_format(old.single_strategy) != checkpoint_format(plan.single_strategy):
            # the new files could not resume the old run's checkpoint: none are written
            checks[-1] = check.model_copy(update={"status": "unsupported",
                                                  "reasons": (megatron_format_change(old.single_strategy,
                                                                                     plan.single_strategy),)})
            notes.append(f"no {target}/ files: {checks[-1].why}")
            continue
        files.update(produced)
        if target == "deepspeed":
            files["deepspeed/ds_config.json"] = deepspeed_universal_config(produced["deepspeed/ds_config.json"])
            files["deepspeed/convert.sh"] = deepspeed_convert_sh(old.single_strategy, plan.single_strategy, inputs)
        elif target == "megatron":
            files["megatron/reshard.sh"] = megatron_reshard_sh(old.single_strategy, plan.single_strategy)
    written = tuple(c.target for c in checks if c.status == "written")
    plan_report = render_report(plan, written, plots=True, checks=tuple(checks),
                                launch_inputs=inputs_section(inputs, written))
    files["report.md"] = render_replan_report(old, plan, result.choice, result.migration, result.nodes,
                                              resume_lines(written, old.single_strategy, plan.single_strategy, inputs),
                                              plan_report)
    files.update(report_plots(plan))
    return plan, files, notes
