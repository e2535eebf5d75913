"""`planner simulate`: replay a compiled plan event by event and check the analytic step time."""

from __future__ import annotations

from pathlib import Path

import click

from planner.cli import render
from planner.cli.options import emit_json, json_option, user_errors
from planner.plan.output import check_file_target, write_file
from planner import api
from planner.simulate.plan_input import PlanSimulation
from planner.simulate.result import TOLERANCE, SimulationResult


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _result_text(result: SimulationResult) -> str:
    stages = render.table(
        ["stage", "device", "compute ms", "p2p ms", "dp wait ms", "bubble ms", "util %", "peak GB", "analytic GB",
         "HBM GB"],
        [[s.stage, s.device, _ms(s.compute_s), _ms(s.p2p_s), _ms(s.dp_wait_s), _ms(s.bubble_s),
          f"{100 * s.utilisation:.1f}", f"{s.peak_bytes / 1e9:.2f}", f"{s.analytic_peak_bytes / 1e9:.2f}",
          f"{s.capacity_bytes / 1e9:.1f}"] for s in result.stages],
        right=range(2, 10))
    terms = render.table(
        ["term", "analytic ms", "simulated ms", "diff ms"],
        [[t.term, _ms(t.analytic_s), _ms(t.simulated_s), f"{t.difference_s * 1e3:+.3f}"] for t in result.terms],
        right=(1, 2, 3))
    reasons = "\n".join(f"  {t.term}: {t.why}" for t in result.terms if t.why)
    head = (f"{result.strategy_spec}\n{result.micro_batches} micro-batches, {result.tasks} tasks; simulated "
            f"{_ms(result.simulated_step_s)} ms, analytic {_ms(result.analytic_step_s)} ms "
            f"({100 * result.difference:+.2f}%)")
    why = f"\nwhy they differ\n{reasons}" if reasons else "\nno term differs by more than 0.5% of the step"
    return f"{head}\n\n{stages}\n\nterms on stage {result.bottleneck_stage} (the analytic bottleneck)\n{terms}\n{why}"


def _text(summary: PlanSimulation, title: str) -> str:
    verdict = "agrees within" if summary.agrees else "differs by more than"
    lines = [title,
             f"step time    simulated {summary.simulated_step_s:.4f} s, analytic {summary.analytic_step_s:.4f} s: "
             f"{100 * summary.difference:+.2f}% ({verdict} {TOLERANCE:.0%})"]
    if abs(summary.recorded_step_s - summary.analytic_step_s) > 0.005 * summary.analytic_step_s:
        lines.append(f"note: plan.json records {summary.recorded_step_s:.4f} s per step; its strategy re-evaluates "
                     f"to {summary.analytic_step_s:.4f} s on these inputs (planner version or catalog changed?)")
    if summary.sync_s:
        lines.append(f"cross-group gradient sync {_ms(summary.sync_s)} ms after the slowest group")
    for group in summary.groups:
        name = f"group {group.pool} (batch {group.batch}): " if group.pool else ""
        lines += ["", name + _result_text(group.result)]
    return "\n".join(lines)


@click.command(name="simulate")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--model", "model", default=None, metavar="MODEL",
              help="The model file the plan was compiled from (when plan.job.model is not a zoo name).")
@click.option("--cluster", "cluster", default=None, metavar="CLUSTER",
              help="The cluster file the plan was compiled for (when plan.job.cluster is not PRESET:NODES).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE.json", help="Write a Chrome/Perfetto trace (one process per stage, one thread per stream).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE.png", help="Draw the timeline: one row per stage and stream.")
@click.option("--memory-plot", "memory_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE.png", help="Draw HBM per GPU over the step, one panel per stage.")
@json_option
@user_errors
def simulate_(plan_path: Path, model: str | None, cluster: str | None, trace_path: Path | None,
              plot_path: Path | None, memory_path: Path | None, as_json: bool) -> None:
    """Simulate one training step of a compiled plan, event by event, and compare it with the analytic model.

    Every forward and backward per stage and micro-batch in the plan's
    schedule (gpipe, 1f1b, interleaved), pipeline transfers, ZeRO gathers and
    reduce-scatters overlapping compute, the step-end gradient sync, the
    optimizer step and offload.  Prints the simulated and analytic step
    times, per-stage utilisation and memory, and each term where they differ
    with the reason.

    \b
    Examples:
        planner compile llama3-8b dgx-h100:2 -b 64 -s 4096 -o out/llama3-8b-2n
        planner simulate out/llama3-8b-2n/plan.json --trace out/trace.json --plot out/timeline.png
        planner simulate out/tiny/plan.json --memory-plot out/hbm.png --json
    """
    for path in (trace_path, plot_path, memory_path):
        if path is not None:
            check_file_target(path)
    plan, job = api.load_plan(plan_path, model=model, cluster=cluster)
    simulated = api.simulate_plan(plan, job)
    summary, runs = simulated.summary, simulated.runs
    if as_json:
        emit_json(summary.model_dump(mode="json"))
    else:
        click.echo(_text(summary, f"{job.model.name} on {job.cluster.describe()}, batch {job.global_batch} x "
                                  f"{job.seq_len}"))
    named = [(pool or "", run) for pool, _, run in runs]
    title = f"{job.model.name} on {job.cluster.name}: {plan.strategy_spec}"
    if trace_path is not None:
        from planner.simulate.trace import trace_json

        write_file(trace_path, trace_json(named))
    if plot_path is not None:
        from planner.simulate.plots import plot_timeline

        plot_timeline(named, title, plot_path)
    if memory_path is not None:
        from planner.simulate.plots import plot_memory

        plot_memory(named, title, memory_path)
