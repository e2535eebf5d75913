"""`planner sweep` on large grids: counted from the axes and refused above MAX_SCENARIOS without --yes
(fast, without building the grid), tasks made lazily and submitted a few at a time, and a bounded
number of figures with a note on how many were left out."""

from __future__ import annotations

import csv
import io
import itertools
import textwrap
import tracemalloc

import pytest
from click.testing import CliRunner
from pydantic import field_validator

import planner.sweep.plots as sweep_plots
import planner.sweep.report as sweep_report
import planner.sweep.scenarios as sweep_scenarios
from planner.cli import cli
from planner.job import Job
from planner.sweep import executors
from planner.sweep.run import plan_sweep, run_sweep
from planner.sweep.scenarios import MAX_SCENARIOS, expand, load_sweep, scenario_count
from ports import MULTIPROCESS


def write(tmp_path, text: str, name: str = "sweep.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def grid(clusters: int, batches: int, seq_lens: int, extra: str = "") -> str:
    """A grid of tiny-llama on `clusters` cpu:N sizes x `batches` x `seq_lens` (zero3 only)."""
    return (f"models: [tiny-llama]\nclusters: [{', '.join(f'cpu:{n}' for n in range(1, clusters + 1))}]\n"
            f"batches: {list(range(8, 8 + batches))}\nseq_lens: {list(range(64, 64 + seq_lens))}\n"
            f"strategies: [zero3]\ntime_limit: 5\n{extra}")


def test_the_limit_is_documented():
    assert MAX_SCENARIOS == 10_000
    result = CliRunner().invoke(cli, ["sweep", "--help"])
    assert "--yes" in result.output and "10,000" in result.output


@pytest.mark.parametrize("clusters, batches, seq_lens, count", [
    (20, 100, 10, "20,000"),
    (100, 150, 100, "1,500,000"),  # the grid that once took 12 GB before writing anything
])
def test_a_large_grid_is_refused_fast_without_yes(tmp_path, clusters, batches, seq_lens, count):
    path = write(tmp_path, grid(clusters, batches, seq_lens))
    tracemalloc.start()
    result = CliRunner().invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "out")])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    axes = f"models 1 x clusters {clusters} x batches {batches} x seq_lens {seq_lens}"
    assert lines[0].startswith(f"Error: {path}: {count} scenarios ({axes}) exceed the limit of 10,000; "
                               "pass --yes"), lines[0]
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()
    assert peak < 50e6, peak  # nothing was expanded (memory, not seconds: the machine may be loaded)


def test_yes_counts_the_tasks_without_building_them(tmp_path):
    path = write(tmp_path, grid(20, 100, 10))
    tracemalloc.start()
    tasks = plan_sweep(path, yes=True)
    first = list(itertools.islice(tasks, 3))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(tasks) == 20_000 and tasks.scenarios == 20_000
    assert [(t.index, t.scenario, t.cluster, t.batch, t.seq_len) for t in first] == [
        (0, 0, "cpu:1", 8, 64), (1, 1, "cpu:1", 8, 65), (2, 2, "cpu:1", 8, 66)]
    assert peak < 100e6, peak


def test_scenario_count_multiplies_distinct_axis_values_and_adds_points_off_the_grid(tmp_path):
    path = write(tmp_path, """\
        models: [tiny-llama, tiny-llama, tiny-dlrm]
        clusters: [cpu:1, cpu:2]
        batches: [8, 16, 8]
        seq_lens: [1]
        scenarios:
          - {model: tiny-llama, cluster: cpu:1, batch: 8, seq_len: 1}
          - {model: tiny-llama, cluster: cpu:1, batch: 8, seq_len: 1, precision: fp16}
          - {model: tiny-llama, cluster: cpu:4, batch: 8, seq_len: 1}
          - {model: tiny-llama, cluster: cpu:4, batch: 8, seq_len: 1, strategies: [zero3]}
        """)
    spec = load_sweep(path)
    assert scenario_count(spec) == 2 * 2 * 2 * 1 + 2  # the first extra is on the grid, the last repeats one
    tasks = expand(spec, path)
    assert len({t.scenario for t in tasks}) == 10 and len(plan_sweep(path)) == len(tasks)


class PickyJob(Job):
    """A job with one more rule (batch 13 is refused): the grid checks every point's axes up front."""

    @field_validator("global_batch")
    @classmethod
    def _not_13(cls, batch: int) -> int:
        if batch == 13:
            raise ValueError("13 is refused")
        return batch


def test_an_invalid_point_is_named_before_any_task_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_scenarios, "Job", PickyJob)
    path = write(tmp_path, grid(2, 1, 2).replace("batches: [8]", "batches: [8, 16, 13]"))
    result = CliRunner().invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (f"Error: {path}: tiny-llama on cpu:1, batch 13 x 64 (models[0], clusters[0], "
                                     "batches[2], seq_lens[0]): 13 is refused")
    assert "sweep [" not in result.output and not (tmp_path / "out").exists()  # no task ran


def test_yes_runs_a_sweep_above_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_scenarios, "MAX_SCENARIOS", 3)
    path = write(tmp_path, grid(1, 2, 2))  # 4 scenarios
    runner = CliRunner()
    refused = runner.invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "out"), "--workers", "1"])
    assert refused.exit_code == 2 and "4 scenarios" in refused.stderr and "limit of 3; pass --yes" in refused.stderr
    done = runner.invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "out"), "--workers", "1", "--yes"])
    assert done.exit_code == 0, done.output
    assert "4 tasks, 4 scenarios" in done.stdout


def test_figures_are_bounded_and_the_report_says_how_many_were_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_report, "MAX_REPORT_FIGURES", 3)
    monkeypatch.setattr(sweep_plots, "MAX_SCALING_PLOTS", 1)
    # 2 clusters x 2 batches x 1 seq_len of tiny-llama (zero3 and megatron), simulated: 4 bar charts and
    # (for lack of a planner row) no timelines; 2 scaling-plot groups (one per batch)
    path = write(tmp_path, grid(2, 2, 1).replace("[zero3]", "[zero3, megatron]") + "simulate: true\n")
    result = run_sweep(path, workers=1, progress=io.StringIO())
    pngs = sorted(name for name in result.files if name.endswith(".png"))
    assert pngs == ["plots/compare-0.png", "plots/compare-1.png", "plots/compare-2.png",
                    "plots/tiny-llama-b8-s64-bf16.png"]
    report = result.files["report.md"]
    assert "Figures: the first 3 are drawn; 1 more" in report and "](plots/compare-3.png)" not in report
    assert report.count("\n## ") == 4  # every scenario keeps its table
    summary = result.files["summary.md"]
    assert "1 more scaling plots were left out: a sweep draws at most 1" in summary
    assert "plots/tiny-llama-b9-s64-bf16.png" not in summary
    rows = list(csv.DictReader(io.StringIO(result.files["results.csv"])))
    assert len(rows) == 8  # every row, whatever was drawn


def test_timelines_count_against_the_figure_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_report, "MAX_REPORT_FIGURES", 3)
    path = write(tmp_path, grid(1, 2, 1).replace("[zero3]", "[zero3, planner]") + "simulate: true\n")
    result = run_sweep(path, workers=1, progress=io.StringIO())
    pngs = sorted(name for name in result.files if name.startswith("plots/compare") or "timeline" in name)
    assert pngs == ["plots/compare-0.png", "plots/compare-1.png", "plots/timeline-0.png"]
    report = result.files["report.md"]
    assert "Figures: the first 3 are drawn; 1 more" in report
    assert report.count("Simulated (`planner simulate`") == 2  # the check itself is never left out


def test_small_sweeps_draw_every_figure_without_a_note(tmp_path):
    path = write(tmp_path, grid(1, 2, 1))
    result = run_sweep(path, workers=1, progress=io.StringIO())
    assert "left out" not in result.files["report.md"] and "left out" not in result.files["summary.md"]
    assert {"plots/compare-0.png", "plots/compare-1.png"} <= set(result.files)


def _counting(tasks, pulled: list[int]):
    for task in tasks:
        pulled[0] += 1
        yield task


def test_inline_executor_takes_one_task_at_a_time(tmp_path):
    tasks = plan_sweep(write(tmp_path, grid(1, 3, 2)))
    pulled, ahead = [0], []
    executors.run_tasks(_counting(tasks, pulled), "local", 1, lambda task, result: ahead.append(pulled[0] - task.index))
    assert len(ahead) == 6 and set(ahead) == {1}


@MULTIPROCESS
def test_process_pool_submits_a_bounded_window(tmp_path, monkeypatch):
    monkeypatch.setattr(executors, "IN_FLIGHT_PER_WORKER", 2)
    tasks = plan_sweep(write(tmp_path, grid(1, 10, 3)))  # 30 quick tasks
    pulled, ahead, done = [0], [], []

    def on_done(task, result):
        done.append(task.index)
        ahead.append(pulled[0] - len(done))

    executors.run_tasks(_counting(tasks, pulled), "local", 2, on_done)
    assert sorted(done) == list(range(30))
    assert max(ahead) <= 2 * 2  # never more than workers x IN_FLIGHT_PER_WORKER pulled and unfinished
