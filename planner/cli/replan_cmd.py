"""`planner replan`: a new plan for a changed allocation, the state migration, and the resume commands."""

from __future__ import annotations

import json
from pathlib import Path

import click

from planner import api
from planner.cli import render
from planner.cli.compile_cmd import _parse_fixed as parse_fixed
from planner.cli.options import (Infeasible, InputError, finite_number, finite_seconds, json_option, launch_options,
                                 output_dir_path, user_errors)
from planner.emit import DEFAULT_TARGETS, TARGETS, available_targets
from planner.emit.inputs import LaunchInputs, checkpoints_inside
from planner.errors import InfeasibleError
from planner.plan.output import check_output_dir, write_outputs

DEFAULT_STEPS_LEFT = api.DEFAULT_STEPS_LEFT


def _lost_nodes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """Callback of --lost-nodes: comma-separated old node numbers."""
    if value is None:
        return None
    try:
        return tuple(sorted({int(part) for part in value.split(",") if part.strip()}))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated node numbers, e.g. 3,7", ctx=ctx,
                                 param=param) from None


def _targets(plan_path: Path) -> tuple[str, ...]:
    """The targets whose folders sit beside the old plan.json (default: compile's default targets)."""
    found = tuple(t for t in TARGETS if (plan_path.parent / t).is_dir() and t in available_targets())
    return found or tuple(t for t in DEFAULT_TARGETS if t in available_targets())


def _summary(choice, migration, spec: str) -> str:
    rows = [[("* " if c.strategy_spec == choice.chosen else "  ") + c.strategy_spec, c.source, c.nodes,
             f"{c.step_time_s:.4f}", f"{c.migration_s:.2f}", f"{c.moved_bytes / 1e9:.2f}", f"{c.total_s:.1f}"]
            for c in choice.candidates]
    table = render.table(["strategy", "from", "nodes", "step s", "migration s", "moved GB", "total s"], rows,
                         right=(2, 3, 4, 5, 6))
    chosen = next(c for c in choice.candidates if c.strategy_spec == choice.chosen)
    return (f"chosen       {spec}\n"
            f"step time    {chosen.step_time_s:.4f} s "
            f"(fastest plan {choice.step_optimum_s:.4f} s, {choice.step_status})\n"
            f"migration    {migration.moved.bytes / 1e9:.2f} GB in {migration.moved.seconds:.2f} s "
            f"(route {migration.route}; restart from the checkpoint: {migration.restart.seconds:.2f} s)\n"
            f"total        {choice.total_s:.1f} s for {choice.steps_left} steps left; "
            f"bound {choice.total_bound_s:.1f} s, "
            f"gap {100 * choice.gap:.2f}%\n"
            f"batch        {choice.batch_policy}\n\n{table}")


@click.command(name="replan")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("cluster", metavar="NEW_CLUSTER")
@click.option("-o", "--output", "out_dir", type=click.UNPROCESSED, callback=output_dir_path, default=None,
              metavar="DIR", help="Write plan.json, migration.json, report.md (+ figures) and launch folders into DIR.")
@click.option("--force", is_flag=True, help="Replace DIR when it holds only an earlier planner output (the files its "
              "planner-manifest.json lists, unchanged).")
@click.option("--steps-left", type=click.IntRange(min=1), default=DEFAULT_STEPS_LEFT, show_default=True,
              metavar="N", help="Optimizer steps still to train: the choice weighs N x step time against the "
              "migration time.")
@click.option("--checkpoint-bandwidth", type=click.FloatRange(min=1e6, max=1e15), default=None, metavar="B",
              callback=finite_number,
              help="Aggregate read rate of the checkpoint storage, bytes/s, 1e6..1e15 (e.g. 4e10); default: "
              "checkpoint_read_bandwidth_per_node in hardware/data/constants.yaml per node that reads.")
@click.option("--lost-nodes", callback=_lost_nodes, default=None, metavar="LIST",
              help="Old nodes that left, e.g. 3,7 (plan.json's node numbers); default: the last nodes of each "
              "pool that shrank.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True, max=86400), default=None, metavar="SEC",
              callback=finite_seconds,
              help="Search budget of each compile (default: the old plan's).")
@click.option("--fix", "fixed", default="", metavar="SPEC",
              help="Global choices the new plan must keep, e.g. 'tp=2,dp=2' (as compile --fix; the old plan's "
              "--fix is not carried over).")
@click.option("--model", "model", default=None, metavar="MODEL",
              help="The model file the old plan was compiled from (when plan.job.model is not a zoo name).")
@click.option("--old-cluster", "old_cluster", default=None, metavar="CLUSTER",
              help="The cluster file the old plan was compiled for (when plan.job.cluster is not PRESET:NODES).")
@launch_options
@json_option
@user_errors
def replan_(plan_path: Path, cluster: str, out_dir: Path | None, force: bool, steps_left: int,
            checkpoint_bandwidth: float | None, lost_nodes: tuple[int, ...] | None, time_limit: float | None,
            fixed: str, model: str | None, old_cluster: str | None, inputs: LaunchInputs, as_json: bool) -> None:
    """Re-plan a compiled job for a changed allocation (lost nodes, a new pool).

    Compiles the same job (model, global batch, precision, runtime, options)
    for NEW_CLUSTER, then picks among the fastest plans, their runners-up and
    the plans that keep the old layout the one with the least migration time
    + steps left x step time.  The migration: which state each new rank needs,
    from which surviving GPU (kept, NVLink, fabric) or the checkpoint.  With
    -o DIR writes plan.json, migration.json, report.md and the launch folders
    of the targets beside PLAN.json, resuming the old run's checkpoint
    (--checkpoint-dir): torch reshards its DCP checkpoint on load, DeepSpeed
    gets deepspeed/convert.sh (universal checkpoint), Megatron megatron/reshard.sh.
    Exits 1 with what does not fit when the new cluster is too small.

    \b
    Examples:
        planner compile llama3-70b dgx-h100:8 -b 128 -s 8192 -o out/70b
        planner replan out/70b/plan.json dgx-h100:7 --steps-left 5000 -o out/70b-7
        planner replan out/70b/plan.json dgx-h100:6 --lost-nodes 2,5 --checkpoint-bandwidth 4e10
        planner replan out/tiny/plan.json cpu:1 --checkpoint-dir ../checkpoints -o out/tiny-2
    """
    if out_dir is not None:
        check_output_dir(out_dir, force)
        inside = checkpoints_inside(inputs, out_dir, _targets(plan_path))
        if inside is not None:
            raise InputError(inside)
    old, old_job = api.load_plan(plan_path, model=model, cluster=old_cluster)
    if old.groups:
        raise InputError(f"{plan_path}: strategy: a replica-group plan (a strategy per pool); replan re-plans "
                         "single-strategy plans")
    try:
        done = api.replan_for(old, old_job, cluster, targets=_targets(plan_path), steps_left=steps_left,
                          checkpoint_bandwidth=checkpoint_bandwidth, lost_nodes=lost_nodes, time_limit=time_limit,
                          fixed=parse_fixed(fixed), inputs=inputs)
    except InfeasibleError as err:
        raise Infeasible(str(err)) from None  # keeps the explanation's lines
    plan, result, files, notes = done.plan, done.result, done.files, done.notes
    if as_json:
        migration = result.migration.model_dump(mode="json", exclude={"moves"})
        click.echo(json.dumps({"choice": result.choice.model_dump(mode="json"), "migration": migration,
                               "plan": plan.model_dump(mode="json")}, indent=2))
    else:
        click.echo(_summary(result.choice, result.migration, plan.strategy_spec))
    if out_dir is not None:
        for note in notes:
            click.echo(f"note: {note}", err=True)
        write_outputs(out_dir, files, force=force)
        folders = sorted({name.split("/")[0] + "/" for name in files if "/" in name})
        click.echo(f"wrote {out_dir}: plan.json, migration.json, report.md{''.join(', ' + f for f in folders)}",
                   err=True)
