"""The figures beside a compiled plan's report.md: memory per stage and the step-time breakdown (PNG).

* memory.png: per pipeline stage, the HBM one GPU holds at its peak as stacked
  bars (weights, gradients, optimizer, activations, buffers, reserve: the
  breakdown of `planner.cost.memory.stage_memory`), the device's HBM capacity
  as a line over each bar; when the plan offloads, a second panel with the
  host DRAM and NVMe each stage's node holds (every GPU of a node parks as
  much as its rank, as `planner.cost.evaluate` counts it) against the node's
  usable capacity.
* time.png: the step time as one stacked horizontal bar of the cost model's
  breakdown terms (they add up to the step: `planner.cost.evaluate`).

Replica-group plans draw one bar group per group (memory) and one bar per
group plus the whole step (time).  Recommendation-model plans get ranks.png:
per rank, the HBM in use against its capacity and the embedding work
(lookups, all-to-all as sender and receiver) of `planner.embedding.evaluate`.  Every number comes from the Plan, i.e.
from `evaluate`; nothing is recomputed here.

Matplotlib runs on its Agg backend (no display), imported when a figure is
drawn so that the rest of the planner does not pay for it.  PNGs carry no
Software/date metadata, so the same plan gives byte-identical files.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Sequence

from planner.plan.schema import Plan

GB = 1e9
MEMORY_PNG = "memory.png"
TIME_PNG = "time.png"
RANKS_PNG = "ranks.png"  # recommendation models

# HbmBreakdown field -> legend label, bottom to top of a bar
_HBM_PARTS = [("weights_bytes", "weights"), ("grads_bytes", "gradients"), ("optimizer_bytes", "optimizer"),
              ("activations_bytes", "activations"), ("buffers_bytes", "buffers"), ("reserve_bytes", "reserve")]
# Breakdown field -> legend label, in the order of report.md's time table
_TIME_PARTS = [("compute_s", "compute"), ("recompute_s", "recompute"), ("tp_comm_s", "tp comm"),
               ("cp_comm_s", "cp comm"), ("ep_comm_s", "ep comm"), ("pp_comm_s", "pp p2p"),
               ("dp_comm_s", "dp comm (exposed)"), ("bubble_s", "bubble"), ("optimizer_s", "optimizer"),
               ("offload_s", "offload (exposed)")]


@dataclass(frozen=True)
class _StageBar:
    """One memory bar: a stage of the plan (or of one replica group)."""

    label: str
    hbm: dict[str, float]  # HbmBreakdown fields, bytes per GPU
    dram_per_node: float
    nvme_per_node: float
    dram_capacity: float  # usable host DRAM per node (the plan's busiest-node record)
    nvme_capacity: float


def _stage_bars(plan: Plan, prefix: str = "") -> list[_StageBar]:
    bars = []
    host = plan.memory.host
    for stage in plan.stages:
        gpn = stage.ranks.spans[0].gpus_per_node
        bars.append(_StageBar(
            label=f"{prefix}stage {stage.index}\n{stage.device}", hbm=stage.memory.hbm.model_dump(),
            dram_per_node=stage.memory.host_dram_bytes * gpn, nvme_per_node=stage.memory.nvme_bytes * gpn,
            dram_capacity=host.dram_capacity_bytes, nvme_capacity=host.nvme_capacity_bytes))
    return bars


def _all_stage_bars(plan: Plan) -> list[_StageBar]:
    if not plan.groups:
        return _stage_bars(plan)
    return [bar for g in plan.groups for bar in _stage_bars(g.plan, prefix=f"{g.pool}: ")]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    """The figure as PNG bytes without Software/date metadata (reproducible)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def _capacity_marks(axis, xs: Sequence[float], capacities: Sequence[float], width: float, label: str) -> None:
    """A short horizontal line at each bar's capacity (capacities differ per stage on mixed clusters)."""
    for i, (x, cap) in enumerate(zip(xs, capacities)):
        axis.hlines(cap, x - width / 2, x + width / 2, colors="black", linestyles="--", linewidth=1.5,
                    label=label if i == 0 else None)


def _host_panel(axis, bars: list[_StageBar], colors) -> None:
    """Host DRAM (and NVMe, when used) per node of each stage, with the capacity of each tier.

    A capacity far above what is used (NVMe: terabytes) would flatten the bars,
    so it is drawn as a line only when within 3x of the tallest bar, and
    written above the bars always.
    """
    tiers = [("host DRAM", "dram_per_node", "dram_capacity", colors[6])]
    if any(b.nvme_per_node for b in bars):
        tiers.append(("NVMe", "nvme_per_node", "nvme_capacity", colors[7]))
    width = 0.8 / len(tiers)
    tallest = max(getattr(b, used) for b in bars for _, used, _, _ in tiers) / GB
    for t, (label, used, capacity, color) in enumerate(tiers):
        xs = [i - 0.4 + width * (t + 0.5) for i in range(len(bars))]
        values = [getattr(b, used) / GB for b in bars]
        caps = [getattr(b, capacity) / GB for b in bars]
        axis.bar(xs, values, width, label=label, color=color)
        if max(caps) <= 3 * tallest:
            _capacity_marks(axis, xs, caps, width, f"{label} capacity")
        for x, value, cap in zip(xs, values, caps):
            axis.text(x, value, f"of {cap:,.0f}", ha="center", va="bottom", fontsize=7)
    axis.set_xticks(list(range(len(bars))), [b.label for b in bars], fontsize=8,
                    rotation=90 if len(bars) > 12 else 0)
    axis.set_ylabel("offloaded per node (GB)")
    axis.set_title("Host tiers per node")
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def memory_png(plan: Plan) -> bytes:
    """memory.png: stacked HBM per stage with capacity lines, and host tiers per node when the plan offloads."""
    plt = _pyplot()
    bars = _all_stage_bars(plan)
    offloads = any(b.dram_per_node or b.nvme_per_node for b in bars)
    width = min(18.0, max(6.0, 0.9 * len(bars) + 2.5))
    fig, axes = plt.subplots(1, 2 if offloads else 1, figsize=(width * (1.6 if offloads else 1.0), 4.5),
                             constrained_layout=True, squeeze=False)
    hbm_axis = axes[0][0]
    xs = list(range(len(bars)))
    colors = plt.get_cmap("tab10").colors
    bottom = [0.0] * len(bars)
    for (key, label), color in zip(_HBM_PARTS, colors):
        values = [b.hbm[key] / GB for b in bars]
        hbm_axis.bar(xs, values, 0.7, bottom=bottom, label=label, color=color)
        bottom = [lo + v for lo, v in zip(bottom, values)]
    _capacity_marks(hbm_axis, xs, [b.hbm["capacity_bytes"] / GB for b in bars], 0.8, "HBM capacity")
    hbm_axis.set_xticks(xs, [b.label for b in bars], fontsize=8, rotation=90 if len(bars) > 12 else 0)
    hbm_axis.set_ylabel("HBM per GPU (GB)")
    hbm_axis.set_title("HBM per GPU at the peak, per pipeline stage")
    hbm_axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if offloads:
        _host_panel(axes[0][1], bars, colors)
    fig.suptitle(f"{plan.job.model} on {plan.job.cluster}: memory")
    data = _png(fig)
    plt.close(fig)
    return data


def _time_rows(plan: Plan) -> list[tuple[str, dict[str, float], float]]:
    """(label, breakdown, step seconds) per bar, top to bottom."""
    if not plan.groups:
        return [("step", plan.time.breakdown.model_dump(), plan.time.step_time_s)]
    rows = [(f"{g.pool} (batch {g.batch})", g.plan.time.breakdown.model_dump(), g.plan.time.step_time_s)
            for g in plan.groups]
    # the job: the slowest group with the cross-group sync in its data-parallel term (planner.plan.replica_groups)
    rows.append(("step (slowest group + sync)", plan.time.breakdown.model_dump(), plan.time.step_time_s))
    return rows


def time_png(plan: Plan) -> bytes:
    """time.png: the step time as stacked horizontal bars of its breakdown terms."""
    plt = _pyplot()
    rows = _time_rows(plan)
    fig, axis = plt.subplots(figsize=(10, 2.2 + 0.6 * len(rows)), constrained_layout=True)
    ys = list(range(len(rows)))[::-1]  # first row on top
    colors = plt.get_cmap("tab20").colors
    left = [0.0] * len(rows)
    for index, (key, label) in enumerate(_TIME_PARTS):
        values = [breakdown[key] for _, breakdown, _ in rows]
        if not any(values):
            continue  # a term that is zero everywhere stays out of the legend
        if len(rows) == 1:
            label = f"{label} {values[0]:.3g} s ({100 * values[0] / rows[0][2]:.1f}%)"
        axis.barh(ys, values, 0.6, left=left, label=label, color=colors[index % len(colors)])
        left = [lo + v for lo, v in zip(left, values)]
    for y, (_, _, step) in zip(ys, rows):
        axis.text(step, y, f" {step:.4g} s", va="center", fontsize=8)
    axis.set_yticks(ys, [label for label, _, _ in rows], fontsize=8)
    axis.set_xlabel("seconds per step (critical path of the slowest stage)")
    axis.set_xlim(0, 1.15 * max(step for _, _, step in rows))
    axis.set_title(f"{plan.job.model} on {plan.job.cluster}: time per step")
    fig.legend(fontsize=8, ncols=4, loc="outside lower center")
    data = _png(fig)
    plt.close(fig)
    return data


def report_plots(plan: Plan) -> dict[str, bytes]:
    """File name -> PNG bytes of the figures report.md links (`render_report(..., plots=True)`)."""
    return {MEMORY_PNG: memory_png(plan), TIME_PNG: time_png(plan)}


def ranks_png(plan) -> bytes:
    """ranks.png of an embedding plan (planner.embedding.plan_doc.EmbeddingPlan): HBM and embedding seconds per
    rank."""
    plt = _pyplot()
    ranks = plan.estimate.ranks
    xs = [r.rank for r in ranks]
    width = min(18.0, max(7.0, 0.25 * len(ranks) + 3.0))
    fig, (hbm_axis, time_axis) = plt.subplots(2, 1, figsize=(width, 6.5), sharex=True, constrained_layout=True)
    colors = plt.get_cmap("tab10").colors
    hbm_axis.bar(xs, [r.hbm_bytes / GB for r in ranks], 0.7, color=colors[0], label="HBM in use")
    _capacity_marks(hbm_axis, xs, [r.hbm_capacity / GB for r in ranks], 0.8, "HBM capacity")
    hbm_axis.set_ylabel("HBM per GPU (GB)")
    hbm_axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    bottom = [0.0] * len(ranks)
    for (key, label), color in zip((("lookup_s", "lookups"), ("send_s", "all-to-all send"),
                                    ("receive_s", "all-to-all receive")), colors[1:]):
        values = [1e3 * getattr(r, key) for r in ranks]
        time_axis.bar(xs, values, 0.7, bottom=bottom, label=label, color=color)
        bottom = [lo + v for lo, v in zip(bottom, values)]
    time_axis.set_ylabel("ms per step (fwd + bwd)")
    time_axis.set_xlabel("rank")
    time_axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{plan.job.model} on {plan.job.cluster}: embedding memory and work per rank")
    data = _png(fig)
    plt.close(fig)
    return data
