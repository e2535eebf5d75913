"""The sweep pipeline: sweep file -> tasks -> executor -> the output directory's files.

`run_sweep` returns the files (name -> text or bytes) for
`planner.plan.output.write_outputs`, so that the CLI writes them atomically.  The
tasks are made lazily and each finished one is kept only as its CSV rows;
the files themselves are built in memory, because the output directory is
written whole or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from planner.job import Job
from planner.sweep.executors import run_tasks
from planner.sweep.plots import plot_groups, scaling_plots
from planner.sweep.progress import ProgressBar
from planner.sweep.report import report_md
from planner.sweep.results import (best_per_scenario, result_record, results_csv, summary_md, timing_record,
                                   timings_csv)
from planner.sweep.data_rows import data_files
from planner.sweep.scenarios import SweepTasks, check_scenario_limit, load_profiles, load_sweep
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


@dataclass
class Collected:
    """What the sweep keeps of each finished task: its results.csv and timings.csv rows (not the task, its
    Job or the compare row), filed by task index so that completion order does not matter."""

    keep_jobs: bool = False  # report.md's simulator check needs each scenario's Job
    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    timings: dict[int, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    limited: dict[int, str] = field(default_factory=dict)
    wall_s: float = 0.0

    def add(self, task: SweepTask, result: TaskResult) -> None:
        """File one finished task."""
        self.records[task.index] = result_record(task, result)
        self.timings[task.index] = timing_record(task, result)
        if self.keep_jobs:
            self.jobs[task.scenario] = task.job
        # uniform-pp and an unproven compile stop at the time limit, so what they found depends on the machine.
        if result.row.planning_s >= task.time_limit:
            self.limited[task.index] = f"{task.model} {task.cluster} b{task.batch} s{task.seq_len} {task.strategy}"
        self.wall_s += result.wall_s

    def in_order(self, rows: dict[int, Any]) -> list[Any]:
        return [rows[i] for i in sorted(rows)]


def plan_sweep(path: str | Path, yes: bool = False) -> SweepTasks:
    """Validate the sweep file, refuse more than MAX_SCENARIOS scenarios unless `yes` (counted from the
    axes, before anything is loaded), and load its models and clusters: the tasks, made lazily
    (PlannerInputError naming the file and field)."""
    spec = load_sweep(path)
    check_scenario_limit(spec, path, yes)
    return SweepTasks(spec, path)


def sweep_files(path: str | Path, collected: Collected) -> SweepOutput:
    """The output directory's files for the finished tasks in `collected`."""
    spec = load_sweep(path)
    title = spec.title or f"planner sweep {Path(path).name}"
    records = collected.in_order(collected.records)
    best = best_per_scenario(records)
    plots = scaling_plots(records)
    left_out = len(plot_groups(records)) - len(plots)
    report = report_md(title, records, collected.jobs, spec.simulate)
    labels = {r["scenario"]: {k: r[k] for k in ("model", "cluster", "batch", "seq_len")} for r in records}
    report.update(data_files(title, collected.jobs, labels, load_profiles(spec, path), spec.time_limit))
    files: dict[str, str | bytes] = {"results.csv": results_csv(records),
                                     "timings.csv": timings_csv(collected.in_order(collected.timings)),
                                     "summary.md": summary_md(title, best, list(plots) + ["report.md"], left_out,
                                                              len(plots)),
                                     **plots, **report}
    limited = collected.in_order(collected.limited)
    return SweepOutput(records, best, files, len(best), collected.wall_s, limited)


def run_sweep(path: str | Path, executor: str = "local", workers: int = 1, address: str | None = None,
              progress: TextIO | None = None, tasks: Iterable[SweepTask] | None = None) -> SweepOutput:
    """Run every task of the sweep file on `executor`; progress bar on `progress` (None: stderr)."""
    tasks = tasks if tasks is not None else plan_sweep(path)
    spec = tasks.spec if isinstance(tasks, SweepTasks) else load_sweep(path)
    collected = Collected(keep_jobs=spec.simulate or bool(spec.data_profiles))
    bar = ProgressBar(len(tasks) if hasattr(tasks, "__len__") else 0, progress)

    def done(task: SweepTask, result: TaskResult) -> None:
        collected.add(task, result)
        bar.advance(f"{task.model} {task.cluster} b{task.batch} s{task.seq_len} {task.strategy}")

    try:
        run_tasks(tasks, executor, workers, done, address)
    finally:
        bar.close()
    return sweep_files(path, collected)
