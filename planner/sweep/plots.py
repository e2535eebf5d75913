"""Scaling plots of a sweep: tokens/s per GPU and MFU against cluster size (GPUs), one line per strategy.

One PNG per (model, batch, seq_len, precision), for the first
`MAX_SCALING_PLOTS` of them (summary.md says how many more there were);
points that do not fit are left out, so a line starts where the strategy first
fits.  matplotlib's Agg
backend, no timestamps or software tag in the PNG: same results, same bytes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

# Scaling plots a sweep draws at most (each costs about a third of a second; a grid of thousands of
# (model, batch, seq_len) groups would spend many minutes drawing what nobody opens).
MAX_SCALING_PLOTS = 24
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
ZERO_BASED = 0.5  # the y axis starts at zero unless every value is above this share of the largest
LINE_OFFSET = 0.04  # sideways shift between neighbouring lines, in doublings of the GPU count (about 3%)


def _family(cluster: str) -> str:
    """The cluster without its node count (`dgx-h100:4` -> `dgx-h100`): one line spans its sizes."""
    head, _, count = cluster.rpartition(":")
    return head if head and count.isdigit() else cluster


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.rsplit("/", 1)[-1]).strip("_") or "model"


def plot_groups(records: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Records grouped per plot: (model, batch, seq_len, precision) -> records, in first-seen order; only groups
    with at least two cluster sizes (one size is no scaling line: report.md's bar charts show it)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["model"], record["batch"], record["seq_len"], record["precision"]), []).append(record)
    return {key: rows for key, rows in groups.items() if len({r["gpus"] for r in rows}) > 1}


def _figure(key: tuple, records: Sequence[dict[str, Any]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, batch, seq_len, precision = key
    families = list(dict.fromkeys(_family(r["cluster"]) for r in records))
    lines: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        label = r["strategy"] if len(families) == 1 else f"{r['strategy']} @ {_family(r['cluster'])}"
        lines.setdefault(label, []).append(r)
    fig, (speed, mfu) = plt.subplots(1, 2, figsize=(12.5, 4.2), constrained_layout=True)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    count = len(lines)
    for i, (label, rows) in enumerate(lines.items()):
        points = sorted((r["gpus"], r["tokens_per_s_per_gpu"], r["mfu"]) for r in rows
                        if r["fits"] and r["tokens_per_s_per_gpu"] is not None)
        # tied strategies (planner and uniform-pp often are) would hide each other: each line gets its own
        # marker and a small sideways offset on the log axis, which moves no value
        shift = 2 ** (LINE_OFFSET * (i - (count - 1) / 2))
        style = {"color": cycle[i % len(cycle)], "marker": MARKERS[i % len(MARKERS)],
                 "linestyle": "--" if i >= len(cycle) else "-", "markersize": 6,
                 "linewidth": 2.5 if label.startswith("planner") else 1.5}
        shown = label if points else f"{label} (does not fit)"
        speed.plot([p[0] * shift for p in points], [p[1] for p in points], label=shown, **style)
        mfu.plot([p[0] * shift for p in points if p[2] is not None],
                 [100 * p[2] for p in points if p[2] is not None], **style)
    gpus = sorted({r["gpus"] for r in records})
    unit = "samples" if any(r.get("unit") == "samples" for r in records) else "tokens"
    for axis, ylabel in ((speed, f"{unit} / s per GPU"), (mfu, "MFU (%)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(gpus, [str(g) for g in gpus])
        axis.minorticks_off()
        axis.set_xlabel("GPUs in the cluster")
        axis.set_ylabel(ylabel)
        low, high = axis.get_ylim()
        if low < ZERO_BASED * high:  # otherwise start above zero: the few-percent differences must show
            axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
    fig.legend(*speed.get_legend_handles_labels(), fontsize=8, loc="outside right center")  # off the data
    fig.suptitle(f"{model}, batch {batch} x {seq_len}, {precision}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def scaling_plots(records: Sequence[dict[str, Any]]) -> dict[str, bytes]:
    """`plots/<model>-b<batch>-s<seq_len>-<precision>.png` -> PNG bytes, one per plot group, for the first
    MAX_SCALING_PLOTS groups."""
    files: dict[str, bytes] = {}
    for key, rows in list(plot_groups(records).items())[:MAX_SCALING_PLOTS]:
        model, batch, seq_len, precision = key
        name = f"plots/{_slug(model)}-b{batch}-s{seq_len}-{precision}.png"
        stem, n = name.removesuffix(".png"), 2
        while name in files:  # two model files with the same stem
            name, n = f"{stem}-{n}.png", n + 1
        files[name] = _figure(key, rows)
    return files
