"""The sweep pipeline: sweep file -> tasks -> executor -> the output directory's files.

`run_sweep` returns the files (name -> text or bytes) for
`planner.output.write_outputs`, so that the CLI writes them atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from planner.sweep.executors import run_tasks
from planner.sweep.plots import scaling_plots
from planner.sweep.progress import ProgressBar
from planner.sweep.report import report_md
from planner.sweep.results import best_per_scenario, result_record, results_csv, summary_md, timings_csv
from planner.sweep.scenarios import expand, load_sweep
from planner.sweep.tasks import SweepTask, TaskResult


@dataclass(frozen=True)
class SweepOutput:
    """A finished sweep: its rows, the best strategy per scenario and the files to write."""

    records: list[dict[str, Any]]  # results.csv rows, typed
    best: list[dict[str, Any]]  # best_per_scenario(records)
    files: dict[str, str | bytes]  # relative path -> content
    scenarios: int
    wall_s: float  # sum of task wall times (CPU-seconds of work, roughly)
    time_limited: list[str]  # tasks that used their whole time limit: their rows may vary with machine speed


def plan_sweep(path: str | Path) -> list[SweepTask]:
    """Validate the sweep file and expand it (PlannerInputError naming the file and field)."""
    return expand(load_sweep(path), path)


def sweep_files(path: str | Path, tasks: list[SweepTask], results: list[TaskResult]) -> SweepOutput:
    """The output directory's files for finished `results`."""
    spec = load_sweep(path)
    title = spec.title or f"planner sweep {Path(path).name}"
    records = [result_record(t, r) for t, r in zip(tasks, results)]
    best = best_per_scenario(records)
    plots = scaling_plots(records)
    jobs = {t.scenario: t.job for t in tasks}
    report = report_md(title, records, jobs, spec.simulate)
    files: dict[str, str | bytes] = {"results.csv": results_csv(tasks, results),
                                     "timings.csv": timings_csv(tasks, results),
                                     "summary.md": summary_md(title, best, list(plots) + ["report.md"]),
                                     **plots, **report}
    # uniform-pp and an unproven compile stop at the time limit, so what they found depends on the machine.
    limited = [f"{t.model} {t.cluster} b{t.batch} s{t.seq_len} {t.strategy}" for t, r in zip(tasks, results)
               if r.row.planning_s >= t.time_limit]
    return SweepOutput(records, best, files, len(best), sum(r.wall_s for r in results), limited)


def run_sweep(path: str | Path, executor: str = "local", workers: int = 1, address: str | None = None,
              progress: TextIO | None = None, tasks: list[SweepTask] | None = None) -> SweepOutput:
    """Run every task of the sweep file on `executor`; progress bar on `progress` (None: stderr)."""
    tasks = tasks if tasks is not None else plan_sweep(path)
    bar = ProgressBar(len(tasks), progress)

    def done(task: SweepTask, result: TaskResult) -> None:
        bar.advance(f"{task.model} {task.cluster} b{task.batch} s{task.seq_len} {task.strategy}")

    try:
        results = run_tasks(tasks, executor, workers, done, address)
    finally:
        bar.close()
    return sweep_files(path, tasks, results)
