"""Plots of comparisons (matplotlib, Agg backend: no display needed; deterministic PNG metadata)."""

from __future__ import annotations

import io
from pathlib import Path

from planner.compare.table import CompareRow
from planner.plan.output import write_file


def compare_figure(rows: list[CompareRow], title: str) -> bytes:
    """PNG bytes: bars per strategy (and its runtime) of the step time (lower is better: a strategy that leaves
    GPUs idle can look better per GPU) and the peak HBM per GPU; strategies that do not fit or do not apply are
    left empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # each bar is labelled with the runtime it was costed under: rows of different runtimes are different
    # cost models, not only different strategies
    names = [f"{r.strategy}\n({r.runtime})" if r.runtime else r.strategy for r in rows]
    step = [r.step_time_s if r.fits and r.step_time_s is not None else 0.0 for r in rows]
    hbm = [(r.peak_hbm_bytes or 0.0) / 1e9 if r.fits else 0.0 for r in rows]
    colors = ["tab:green" if r.strategy == "planner" else "tab:blue" for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for axis, values, label in ((left, step, "step time (s), lower is better"), (right, hbm, "peak HBM per GPU (GB)")):
        bars = axis.bar(names, values, color=colors)
        for bar, row in zip(bars, rows):
            if not row.fits:
                axis.annotate("does not fit" if row.applicable else "not applicable",
                              (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom",
                              rotation=90, fontsize=8, color="gray")
        axis.set_ylabel(label)
        axis.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def plot_compare(rows: list[CompareRow], title: str, path: Path) -> None:
    """Write `compare_figure` to `path` (whole or not at all)."""
    write_file(path, compare_figure(rows, title))
