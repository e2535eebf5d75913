"""Plots of comparisons (matplotlib, Agg backend: no display needed; deterministic PNG metadata)."""

from __future__ import annotations

from pathlib import Path

from planner.compare import CompareRow


def plot_compare(rows: list[CompareRow], title: str, path: Path) -> None:
    """Bars per strategy: throughput per GPU, and peak HBM per GPU; strategies that do not fit are hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.strategy for r in rows]
    speed = [r.tokens_per_s_per_gpu or 0.0 for r in rows]
    hbm = [(r.peak_hbm_bytes or 0.0) / 1e9 for r in rows]
    colors = ["tab:green" if r.strategy == "planner" else "tab:blue" for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for axis, values, label in ((left, speed, "tokens (samples) / s per GPU"), (right, hbm, "peak HBM per GPU (GB)")):
        bars = axis.bar(names, values, color=colors)
        for bar, row in zip(bars, rows):
            if not row.fits:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
        axis.set_ylabel(label)
        axis.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
