"""`planner compare --data-profile`: the data plan beside every static layout on the same data.

Rows: each static layout of each candidate strategy (pad, pack-unmasked, pack at its fixed context-parallel
degree) and the data plan, with the step time (a prediction of the cost model), the speed-up of the plan over
the row and whether it fits.  A bar chart draws them on a log axis (padding is often ten times slower).
"""

from __future__ import annotations

import io
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from planner.data.result import DataPlan
from planner.plan.output import write_file


class LayoutRow(BaseModel):
    """One layout of the step's data."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    layout: str = Field(description="pad, pack-unmasked, pack (static), or the plan's layout (plan: ...).")
    cp: str = Field(description="The context-parallel degree (the plan's buckets' degrees, e.g. 1/2/4).")
    step_time_s: float = Field(description="Predicted seconds per step on the profile's data.")
    plan_speedup: float = Field(description="This row's step over the plan's (the plan's row: 1).")
    fits: bool = Field(description="Every micro-batch fits in HBM.")
    strategy: str = Field(description="The strategy (SPEC).")


def layout_rows(data: DataPlan) -> list[LayoutRow]:
    """The static layouts, fastest first, then the plan."""
    rows = [LayoutRow(layout=x.layout, cp=str(x.cp), step_time_s=x.step_time_s,
                      plan_speedup=x.step_time_s / data.step_time_s, fits=x.fits, strategy=x.strategy)
            for x in sorted(data.static, key=lambda x: (x.step_time_s, x.layout, x.cp))]
    degrees = "/".join(str(b.cp) for b in data.buckets) or data.strategy.split("cp=")[1].split(",")[0]
    return rows + [LayoutRow(layout=f"plan: {data.layout}", cp=degrees, step_time_s=data.step_time_s,
                             plan_speedup=1.0, fits=True, strategy=data.strategy)]


def layouts_figure(rows: list[LayoutRow], title: str) -> bytes:
    """PNG bytes: one bar per layout (step time, log axis), the plan's in green."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r.layout}\ncp={r.cp}" for r in rows]
    values = [r.step_time_s if r.fits else 0.0 for r in rows]
    colors = ["tab:green" if r.layout.startswith("plan") else "tab:blue" for r in rows]
    fig, axis = plt.subplots(figsize=(max(8.0, 0.9 * len(rows)), 5), constrained_layout=True)
    bars = axis.bar(names, values, color=colors)
    axis.bar_label(bars, labels=[f"{v:.4g}" if v > 0 else "does not fit" for v in values], fontsize=7, padding=2)
    axis.set_yscale("log")
    axis.set_ylabel("step time (s, cost-model prediction, log scale), lower is better")
    axis.tick_params(axis="x", labelsize=7)
    for label in axis.get_xticklabels():
        label.set_rotation(40)
        label.set_horizontalalignment("right")
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def plot_layouts(rows: list[LayoutRow], title: str, path: Path) -> None:
    """Write `layouts_figure` to `path` (whole or not at all)."""
    write_file(path, layouts_figure(rows, title))
