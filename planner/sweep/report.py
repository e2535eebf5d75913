"""report.md of a sweep: per scenario, every strategy side by side, a bar chart, and the simulator's check.

For each scenario the table holds what `planner compare` prints (step time,
tokens/s per GPU, MFU, peak HBM, host memory, fit or why not, the plan) and
`plots/compare-<n>.png` draws the step time and peak HBM per strategy.  With
`simulate: true` in the sweep file the planner row's strategy is also run
through the discrete-event simulator (`planner.simulate`): its step time
against the analytic one, and a timeline PNG for pipelines small enough to
draw.  A large sweep draws the figures of its first scenarios only, at most
`MAX_REPORT_FIGURES` PNGs, and says at the top how many it left out.
Everything here is deterministic: the same results give the same bytes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.compare.table import CompareRow
from planner.job import Job
from planner.compare.plots import compare_figure

TIMELINE_MAX_TASKS = 20_000  # larger simulations are summarised, not drawn (the PNG would be a smear)
# Per-scenario figures (bar charts, timelines) report.md draws at most: a figure costs about a third of a
# second, and a thousand-scenario sweep would otherwise spend minutes drawing pictures nobody scrolls to.
MAX_REPORT_FIGURES = 24
_HEADERS = ("strategy", "runtime", "step s", "tok/s/GPU", "MFU %", "HBM GB", "host GB", "fits", "plan / why not")


def _row(record: dict[str, Any]) -> CompareRow:
    fields = {k: record[k] for k in ("strategy", "runtime", "spec", "fits", "why", "step_time_s",
                                     "tokens_per_s_per_gpu", "mfu", "peak_hbm_bytes", "host_bytes", "nvme_bytes",
                                     "applicable", "hbm_capacity_bytes")}
    return CompareRow(**fields, planning_s=0.0)


def _cells(r: dict[str, Any]) -> list[str]:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    plan = f"`{r['spec']}`" if r["fits"] else r["why"]
    return [r["strategy"], r["runtime"], num(r["step_time_s"], ".4g"), num(r["tokens_per_s_per_gpu"], ",.0f"),
            num(r["mfu"] and 100 * r["mfu"], ".1f"), num(r["peak_hbm_bytes"] and r["peak_hbm_bytes"] / 1e9, ".1f"),
            num(r["host_bytes"] and r["host_bytes"] / 1e9, ".1f"), "yes" if r["fits"] else "no",
            plan.replace("|", "/")]


def _margin(rows: Sequence[dict[str, Any]]) -> str:
    """How the planner row compares with the best baseline that fits."""
    planner = next((r for r in rows if r["strategy"] == "planner" and r["fits"]), None)
    others = sorted((r for r in rows if r["strategy"] != "planner" and r["fits"] and r["step_time_s"]),
                    key=lambda r: (r["step_time_s"], r["strategy"]))
    if planner is None:
        return "Nothing fits." if not others else "The planner row does not fit."
    if not others:
        return "No baseline fits; the planner's plan does."
    best = others[0]
    ratio = best["step_time_s"] / planner["step_time_s"]
    if ratio < 0.9995:  # a baseline costed under its own framework's runtime can beat the planner's runtime
        return (f"The best baseline, {best['strategy']} ({best['runtime']} runtime), is faster than the planner's "
                f"plan ({planner['runtime']} runtime): {best['step_time_s']:.4g} s against "
                f"{planner['step_time_s']:.4g} s.")
    if ratio <= 1.0005:
        return f"The planner's plan ties with the best baseline, {best['strategy']} ({planner['step_time_s']:.4g} s)."
    faster = f"{ratio:.2f}x" if ratio >= 1.1 else f"{100 * (ratio - 1):.1f}%"
    return (f"The planner's step is {faster} faster than the best baseline, {best['strategy']} "
            f"({best['step_time_s']:.4g} s against {planner['step_time_s']:.4g} s).")


def _simulated(job: Job, spec: str, index: int, draw: bool = True) -> tuple[list[str], dict[str, bytes], bool]:
    """Lines on the simulator's check of the planner's strategy, its timeline PNG when small enough (and
    `draw`), and whether a timeline was left out only because `draw` was False."""
    from planner.simulate import simulate, summarize
    from planner.simulate.plots import plot_timeline
    from planner.strategy import parse_strategy

    run = simulate(job, parse_strategy(spec))
    result = summarize(run)
    lines = [f"Simulated (`planner simulate`, {result.tasks:,} events): {result.simulated_step_s:.4g} s against the "
             f"analytic {result.analytic_step_s:.4g} s ({100 * result.difference:+.2f}%)."]
    lines += [f"- {t.term}: {t.difference_s:+.4g} s. {t.why}" for t in result.terms if t.why]
    files: dict[str, bytes] = {}
    if result.tasks <= TIMELINE_MAX_TASKS and draw:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "timeline.png"
            plot_timeline([("", run)], f"{job.model.name}: {spec}", path)
            files[f"plots/timeline-{index}.png"] = path.read_bytes()
        lines += ["", f"![simulated timeline](plots/timeline-{index}.png)"]
    return lines, files, result.tasks <= TIMELINE_MAX_TASKS and not draw


def report_md(title: str, records: Sequence[dict[str, Any]], jobs: dict[int, Job],
              simulate: bool) -> dict[str, str | bytes]:
    """report.md and its PNGs (`plots/compare-<n>.png`, `plots/timeline-<n>.png`, at most MAX_REPORT_FIGURES);
    `jobs` (scenario -> Job) is read only with `simulate`."""
    scenarios: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        scenarios.setdefault(record["scenario"], []).append(record)
    lines = [f"# {title}", "", "Every strategy of every scenario, costed by `planner.cost.evaluate` under the runtime "
             "profile in its runtime column (a baseline named after a framework under that framework's; the "
             "embedding cost model for recommendation models). Regenerate with the command in the sweep file.",
             ""]
    files: dict[str, str | bytes] = {}
    drawn = left_out = 0
    for index, rows in sorted(scenarios.items()):
        first = rows[0]
        name = (f"{index + 1}. {first['model']} on {first['cluster']} ({first['gpus']:,} GPUs), "
                f"batch {first['batch']} x {first['seq_len']}")
        lines += [f"## {name}", "", "| " + " | ".join(_HEADERS) + " |", "|" + "---|" * len(_HEADERS)]
        lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
        lines += ["", _margin(rows), ""]
        if drawn < MAX_REPORT_FIGURES:
            files[f"plots/compare-{index}.png"] = compare_figure([_row(r) for r in rows], name.split(". ", 1)[1])
            lines += [f"![step time and peak HBM per strategy](plots/compare-{index}.png)", ""]
            drawn += 1
        else:
            left_out += 1
        planner = next((r for r in rows if r["strategy"] == "planner" and r["fits"]), None)
        if simulate and planner is not None and jobs[index].model.family != "recsys" and ";" not in planner["spec"]:
            sim_lines, sim_files, undrawn = _simulated(jobs[index], planner["spec"], index,
                                                       draw=drawn < MAX_REPORT_FIGURES)
            lines += sim_lines + [""]
            files.update(sim_files)
            drawn, left_out = drawn + len(sim_files), left_out + undrawn
    if left_out:
        lines[4:4] = [f"Figures: the first {MAX_REPORT_FIGURES} are drawn; {left_out:,} more (bar charts and "
                      "timelines of the later scenarios) were left out (`MAX_REPORT_FIGURES` in "
                      "planner/sweep/report.py). Every number is in the tables below and in results.csv.", ""]
    files["report.md"] = "\n".join(lines).rstrip() + "\n"
    return files
