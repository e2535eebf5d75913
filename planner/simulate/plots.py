"""PNG pictures of simulated steps: a timeline per stage and stream, and HBM over time per stage.

matplotlib with the Agg backend (no display) and no software/date metadata
in the PNG, so the same simulation gives byte-identical files.
"""

from __future__ import annotations

import io
from pathlib import Path

from planner.plan.output import write_file
from planner.simulate.memory import memory_curves
from planner.simulate.simulator import SimulationRun
from planner.simulate.trace import STREAMS

COLOURS = {"forward": "tab:blue", "backward": "tab:green", "send": "dimgray", "transfer": "darkgray",
           "gather": "tab:orange", "regather": "gold", "reduce": "tab:red", "sync": "tab:purple",
           "copy": "tab:olive", "optimizer": "tab:brown", "offload": "tab:pink"}
_ROW = {"compute": "compute", "dp": "dp comm", "send-next": "p2p ->", "send-prev": "p2p <-", "host": "host"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _wrap(title: str) -> str:
    """Long SPEC strings over several lines, broken at commas."""
    lines, line = [], ""
    for part in title.split(","):
        if line and len(line) + len(part) > 110:
            lines.append(line + ",")
            line = part
        else:
            line = f"{line},{part}" if line else part
    return "\n".join(lines + [line])


def _save(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    _pyplot().close(fig)
    write_file(path, buffer.getvalue())


def plot_timeline(runs: list[tuple[str, SimulationRun]], title: str, path: Path) -> None:
    """One row per stage and stream, a bar per task coloured by kind (forward, backward, collectives, ...)."""
    plt = _pyplot()
    rows: list[tuple[str, list[tuple[str, float, float]]]] = []
    for name, sim in runs:
        tl = sim.timeline
        keys = sorted({(t.stage, t.stream) for t in tl.tasks if t.stage >= 0},
                      key=lambda k: (k[0], STREAMS.index(k[1])))
        for stage, stream in keys:
            bars = [(t.kind, tl.start[i], tl.end[i] - tl.start[i]) for i, t in enumerate(tl.tasks)
                    if t.stage == stage and t.stream == stream and tl.end[i] > tl.start[i]]
            rows.append((f"{name + ' ' if name else ''}s{stage} {_ROW[stream]}", bars))
    fig, axis = plt.subplots(figsize=(12, 1.0 + 0.35 * len(rows)), constrained_layout=True)
    seen: set[str] = set()
    for y, (_, bars) in enumerate(rows):
        for kind in COLOURS:
            spans = [(start * 1e3, duration * 1e3) for k, start, duration in bars if k == kind]
            if spans:
                axis.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLOURS[kind],
                                 label=kind if kind not in seen else None)
                seen.add(kind)
    axis.set_yticks(range(len(rows)), [label for label, _ in rows])
    axis.invert_yaxis()
    axis.set_xlabel("time (ms)")
    fig.legend(loc="outside lower center", ncol=len(seen), fontsize="small", frameon=False)
    axis.set_title(_wrap(title), fontsize="medium")
    _save(fig, path)


def plot_memory(runs: list[tuple[str, SimulationRun]], title: str, path: Path) -> None:
    """HBM per GPU over the step, one panel per stage: the simulated curve, the analytic peak, the capacity."""
    plt = _pyplot()
    panels = [(name, curve) for name, sim in runs for curve in memory_curves(sim)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.0 + 1.8 * len(panels)), sharex=True,
                             constrained_layout=True, squeeze=False)
    for axis, (name, curve) in zip(axes[:, 0], panels):
        times = [t * 1e3 for t in curve.times]
        axis.step(times, [b / 1e9 for b in curve.bytes], where="post", color="tab:blue", label="simulated")
        axis.axhline(curve.analytic_peak / 1e9, color="tab:orange", linestyle=":", label="analytic peak")
        axis.axhline(curve.capacity / 1e9, color="tab:red", linestyle="--", label="HBM capacity")
        axis.set_ylabel(f"{name + ' ' if name else ''}stage {curve.stage}\nGB")
        axis.set_ylim(0, 1.05 * max(curve.capacity, curve.peak) / 1e9)
    axes[0, 0].legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel("time (ms)")
    fig.suptitle(_wrap(title), fontsize="medium")
    _save(fig, path)
