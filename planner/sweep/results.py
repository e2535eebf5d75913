"""The sweep's tables: results.csv (deterministic), timings.csv (wall clock) and summary.md.

results.csv holds only what the cost model and the solver decide: rows in
task order (scenario order of the sweep file, whatever the completion order),
floats with one fixed format, so the same sweep gives byte-identical files on
every executor.  Wall-clock numbers (planning time, task time, which worker)
vary from run to run and go to timings.csv.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

from planner.compare.table import BREAKDOWN_TERMS
from planner.sweep.tasks import SweepTask, TaskResult

# runtime: the profile a row was costed under (a baseline named after a framework is costed as that framework runs it)
# gpus: the cluster's; gpus_used: what the row's plan runs on.  The breakdown terms, solver status and gap, and
# the confidence flag say why a row is what it is (planner.compare.table.CompareRow documents each); torchrec_model_s:
# a recommendation plan's seconds in TorchRec's own estimators, beside step_time_s in planner's model.
RESULT_FIELDS = ("scenario", "model", "cluster", "nodes", "gpus", "batch", "seq_len", "precision", "strategy",
                 "runtime", "gpus_used", "applicable", "fits", "step_time_s", "torchrec_model_s",
                 "tokens_per_s_per_gpu", "unit", "mfu", "peak_hbm_bytes", "hbm_capacity_bytes", "host_bytes",
                 "nvme_bytes", *BREAKDOWN_TERMS, "solver_status", "gap", "extrapolated", "confidence", "spec", "why",
                 "source")
TIMING_FIELDS = ("scenario", "model", "cluster", "batch", "seq_len", "strategy", "planning_s", "task_s", "worker")


def number(value: float | None, digits: int = 9) -> str:
    """A float with `digits` significant digits ('' for None): stable text for equal values."""
    return "" if value is None else format(value, f".{digits}g")


def result_record(task: SweepTask, result: TaskResult) -> dict[str, Any]:
    """One results.csv row as typed values (also the `--json` output)."""
    flat = result.row.flat()
    return {"scenario": task.scenario, "model": task.model, "cluster": task.cluster,
            "nodes": task.job.cluster.num_nodes, "gpus": task.job.cluster.num_gpus, "batch": task.batch,
            "seq_len": task.seq_len, "precision": task.precision, "strategy": task.strategy,
            **{k: flat[k] for k in RESULT_FIELDS if k in flat and k != "strategy"}}


def _csv(fields: Sequence[str], records: Iterable[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: number(v) if isinstance(v, float) else ("" if v is None else v)
                         for k, v in record.items() if k in fields})
    return buffer.getvalue()


def timing_record(task: SweepTask, result: TaskResult) -> dict[str, Any]:
    """One timings.csv row: planning and task wall time, and the worker that ran it."""
    return {"scenario": task.scenario, "model": task.model, "cluster": task.cluster, "batch": task.batch,
            "seq_len": task.seq_len, "strategy": task.strategy, "planning_s": f"{result.row.planning_s:.3f}",
            "task_s": f"{result.wall_s:.3f}", "worker": result.worker}


def results_csv(records: Iterable[dict[str, Any]]) -> str:
    """results.csv text of `result_record` rows (given in task order)."""
    return _csv(RESULT_FIELDS, records)


def timings_csv(records: Iterable[dict[str, Any]]) -> str:
    """timings.csv text of `timing_record` rows (given in task order)."""
    return _csv(TIMING_FIELDS, records)


def best_per_scenario(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario (in order): the fastest fitting strategy, the runner-up, and how many fit."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record["scenario"], []).append(record)
    out = []
    for scenario, rows in sorted(groups.items()):
        fitting = sorted((r for r in rows if r["fits"] and r["step_time_s"] is not None),
                         key=lambda r: (r["step_time_s"], r["strategy"]))
        first = rows[0]
        out.append({"scenario": scenario, "model": first["model"], "cluster": first["cluster"],
                    "gpus": first["gpus"], "batch": first["batch"], "seq_len": first["seq_len"],
                    "precision": first["precision"], "best": fitting[0] if fitting else None,
                    "runner_up": fitting[1] if len(fitting) > 1 else None, "fits": len(fitting), "scored": len(rows),
                    "planner_margin": planner_margin(rows)})
    return out


def summary_table(best: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows of the best-strategy table (shared by summary.md and the terminal)."""
    body = []
    for b in best:
        top, second = b["best"], b["runner_up"]
        margin = f"{second['step_time_s'] / top['step_time_s']:.3f}x {second['strategy']}" if second else "-"
        body.append([b["model"], b["cluster"], str(top["gpus_used"]) if top else "-", str(b["batch"]),
                     str(b["seq_len"]), top["strategy"] if top else "none fits",
                     f"{top['tokens_per_s_per_gpu']:,.0f}" if top else "-",
                     f"{100 * top['mfu']:.1f}" if top and top["mfu"] is not None else "-",
                     number(top["step_time_s"], 4) if top else "-", margin, b["planner_margin"],
                     f"{b['fits']}/{b['scored']}"])
    return body


SUMMARY_HEADERS = ("model", "cluster", "GPUs used", "batch", "seq", "best", "per GPU/s", "MFU %", "step s",
                   "runner-up (its step time / best)", "planner vs best baseline", "fit")


def planner_margin(rows: Sequence[dict[str, Any]]) -> str:
    """The best fitting baseline's step time over the planner row's ('1.031x zero3': planner is 3.1% faster;
    below 1: the baseline, costed under its own runtime, is faster), or why there is no ratio."""
    planner = next((r for r in rows if r["strategy"] == "planner"), None)
    others = sorted((r for r in rows if r["strategy"] != "planner" and r["fits"] and r["step_time_s"]),
                    key=lambda r: (r["step_time_s"], r["strategy"]))
    if planner is None:
        return "-"
    if not planner.get("applicable", True):
        return f"planner n/a ({planner['runtime']} runtime)"
    if not planner["fits"]:
        return "planner does not fit"
    if not others:
        return "no baseline fits"
    return f"{others[0]['step_time_s'] / planner['step_time_s']:.3f}x {others[0]['strategy']}"


def summary_md(title: str, best: Sequence[dict[str, Any]], plots: Sequence[str], plots_left_out: int = 0,
               plot_limit: int = 0) -> str:
    """summary.md: the best strategy per scenario, and the list of files (and how many scaling plots a
    large sweep left out: `plots_left_out` beyond the first `plot_limit`)."""
    lines = [f"# {title}", "", "Best strategy per scenario: the fastest step time among the strategies that fit "
             "(every number from `planner.cost.evaluate`).", "",
             "| " + " | ".join(SUMMARY_HEADERS) + " |", "|" + "---|" * len(SUMMARY_HEADERS)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in summary_table(best)]
    lines += ["", "Files:", "", "- `results.csv`: one row per scenario and strategy (deterministic)",
              "- `timings.csv`: planning and task wall time per row, and the worker that ran it"]
    lines += [f"- `{name}`" for name in plots]
    if plots_left_out:
        lines += ["", f"{plots_left_out:,} more scaling plots were left out: a sweep draws at most {plot_limit:,} "
                  "(`MAX_SCALING_PLOTS` in planner/sweep/plots.py); results.csv has every row."]
    return "\n".join(lines) + "\n"
