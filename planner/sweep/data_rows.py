"""A sweep over length distributions: `data_profiles` in the sweep file.

For every scenario of the sweep (a sequence model) and every profile, the compile's plan and the best plan at
each other context-parallel degree are laid out on the profile's data (clipped at the scenario's seq_len: a
run at that context cuts longer samples), and the data plan is compared with the best static layout
(planner.compare.data_candidates).  Written as data.csv, data.md and data.png (the speed-up per scenario and
profile).  Every step time is a prediction of the cost model.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from planner.compare.data_candidates import data_plan_over_degrees
from planner.data.profile import DataProfile
from planner.errors import InfeasibleError
from planner.job import Job
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.sweep.results import number

DATA_FIELDS = ("scenario", "model", "cluster", "batch", "seq_len", "profile", "layout", "best_static",
               "static_step_s", "plan_step_s", "speedup", "gap", "bucket_cp", "strategy")


def data_records(jobs: dict[int, Job], labels: dict[int, dict[str, Any]], profiles: Sequence[DataProfile],
                 time_limit: float) -> list[dict[str, Any]]:
    """One record per (scenario, profile), scenarios in order; a scenario nothing fits is left out."""
    out = []
    for index in sorted(jobs):
        job = jobs[index]
        if job.model.family == "recsys":
            continue  # a recommendation model's samples have no length
        options = CompileOptions(time_limit=time_limit, runners_up=0)
        try:
            result = compile_job(job, options)
        except InfeasibleError:
            continue
        if result.strategy is None:  # replica groups over mixed pools: not planned for data
            continue
        for profile in profiles:
            data, _ = data_plan_over_degrees(job, options, result, profile.clipped(job.seq_len))
            out.append({"scenario": index, **labels[index], "profile": profile.name, "layout": data.layout,
                        "best_static": data.baseline, "static_step_s": data.baseline_step_time_s,
                        "plan_step_s": data.step_time_s, "speedup": data.speedup, "gap": data.gap,
                        "bucket_cp": "/".join(str(b.cp) for b in data.buckets), "strategy": data.strategy})
    return out


def data_csv(records: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=DATA_FIELDS, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: number(v) if isinstance(v, float) else v for k, v in record.items()})
    return buffer.getvalue()


def data_md(title: str, records: Sequence[dict[str, Any]]) -> str:
    lines = [f"# {title}: data profiles", "",
             "The data plan (packing, per-bucket context parallelism, balancing) against the best static layout "
             "on the same data, per scenario and profile. Predictions of the cost model, not measurements.", "",
             "| model | cluster | batch | seq_len | profile | best static | static s | plan | plan s | speed-up |",
             "| --- | --- | ---: | ---: | --- | --- | ---: | --- | ---: | ---: |"]
    for r in records:
        static = r["best_static"].split(" ", 1)[0] + " cp=" + r["best_static"].split("cp=")[1].split(",")[0]
        plan = f"{r['layout']} [{r['bucket_cp'] or '-'}]"
        lines.append(f"| {r['model']} | {r['cluster']} | {r['batch']} | {r['seq_len']} | {r['profile']} | {static} "
                     f"| {r['static_step_s']:.4g} | {plan} | {r['plan_step_s']:.4g} | {r['speedup']:.3f}x |")
    return "\n".join(lines) + "\n"


def data_png(records: Sequence[dict[str, Any]]) -> bytes:
    """Grouped bars: the speed-up of the data plan per scenario (x) and profile (bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(dict.fromkeys(r["profile"] for r in records))
    scenarios = list(dict.fromkeys((r["scenario"], f"{r['model']}\n{r['cluster']}\nb{r['batch']} s{r['seq_len']}")
                                   for r in records))
    width = 0.8 / max(1, len(profiles))
    fig, axis = plt.subplots(figsize=(max(6.0, 1.6 * len(scenarios) * max(1, len(profiles)) / 2), 4.5),
                             constrained_layout=True)
    for k, profile in enumerate(profiles):
        values = {r["scenario"]: r["speedup"] for r in records if r["profile"] == profile}
        xs = [i + k * width for i in range(len(scenarios))]
        bars = axis.bar(xs, [values.get(s, 0.0) for s, _ in scenarios], width, label=profile)
        axis.bar_label(bars, labels=[f"{values[s]:.2f}x" if s in values else "" for s, _ in scenarios], fontsize=7)
    axis.axhline(1.0, color="gray", linewidth=1, linestyle="--")
    axis.set_xticks([i + width * (len(profiles) - 1) / 2 for i in range(len(scenarios))],
                    [label for _, label in scenarios], fontsize=7)
    axis.set_ylabel("speed-up over the best static plan (cost model)")
    axis.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def data_files(title: str, jobs: dict[int, Job], labels: dict[int, dict[str, Any]],
               profiles: Sequence[DataProfile], time_limit: float) -> dict[str, str | bytes]:
    """data.csv, data.md and data.png of the sweep's scenarios and profiles (none without profiles)."""
    if not profiles:
        return {}
    records = data_records(jobs, labels, profiles, time_limit)
    if not records:
        return {"data.md": data_md(title, records)}
    return {"data.csv": data_csv(records), "data.md": data_md(title, records), "data.png": data_png(records)}
