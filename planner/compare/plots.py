"""Plots of comparisons (matplotlib, Agg backend: no display needed; deterministic PNG metadata)."""

from __future__ import annotations

import io
from pathlib import Path

from planner.compare.table import CompareRow
from planner.plan.output import write_file


# A fitting row this many times slower than the median one would squash the others' bars: the step-time panel
# switches to a log axis (and says so) instead of hiding the 1-3% differences that matter
OUTLIER_RATIO = 3.0


def _step_label(value: float) -> str:
    return f"{value:.4g}"  # four digits: the 1-3% differences between strategies must show


def needs_log_axis(values: list[float]) -> bool:
    """Whether the largest positive value is more than OUTLIER_RATIO times the median positive one."""
    positive = sorted(v for v in values if v > 0)
    return bool(positive) and positive[-1] > OUTLIER_RATIO * positive[len(positive) // 2]


def compare_figure(rows: list[CompareRow], title: str) -> bytes:
    """PNG bytes: bars per strategy (and its runtime) of the step time (lower is better: a strategy that leaves
    GPUs idle can look better per GPU) and the peak HBM per GPU, each bar labelled with its value, the HBM
    capacity drawn as a line; strategies that do not fit or do not apply are left empty and say why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # each bar is labelled with the runtime it was costed under: rows of different runtimes are different
    # cost models, not only different strategies
    names = [f"{r.strategy}\n({r.runtime})" if r.runtime else r.strategy for r in rows]
    step = [r.step_time_s if r.fits and r.step_time_s is not None else 0.0 for r in rows]
    hbm = [(r.peak_hbm_bytes or 0.0) / 1e9 if r.fits else 0.0 for r in rows]
    colors = ["tab:green" if r.strategy == "planner" else "tab:blue" for r in rows]
    log_step = needs_log_axis(step)
    # wide enough for every bar's label: ten strategies and their runtimes do not fit twelve inches
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(12.0, 1.3 * len(rows)), 5), constrained_layout=True)
    panels = ((left, step, "step time (s), lower is better" + (" (log scale)" if log_step else ""), _step_label),
              (right, hbm, "peak HBM per GPU (GB)", lambda v: f"{v:.1f}"))
    for axis, values, label, fmt in panels:
        bars = axis.bar(names, values, color=colors)
        axis.bar_label(bars, labels=[fmt(v) if v > 0 else "" for v in values], fontsize=7, padding=2)
        for bar, row in zip(bars, rows):
            if not row.fits:
                axis.annotate("does not fit" if row.applicable else "not applicable",
                              (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom",
                              rotation=90, fontsize=8, color="gray")
        axis.set_ylabel(label)
        axis.tick_params(axis="x", labelsize=8)
        for label in axis.get_xticklabels():  # slanted and anchored at their end, so neighbours never overlap
            label.set_rotation(40)
            label.set_horizontalalignment("right")
    if log_step:
        left.set_yscale("log")
    capacities = sorted({r.hbm_capacity_bytes for r in rows if r.fits and r.hbm_capacity_bytes})
    for i, capacity in enumerate(capacities):  # one line per capacity (mixed clusters have several)
        right.axhline(capacity / 1e9, color="tab:red", linestyle="--", linewidth=1,
                      label="HBM a plan may use" if i == 0 else None)
    if capacities:
        right.set_ylim(top=max(capacities) / 1e9 * 1.12)
        right.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)  # above, off the bars
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def plot_compare(rows: list[CompareRow], title: str, path: Path) -> None:
    """Write `compare_figure` to `path` (whole or not at all)."""
    write_file(path, compare_figure(rows, title))
