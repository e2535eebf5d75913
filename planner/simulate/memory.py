"""HBM over time per stage: model states plus the activations of the micro-batches in flight.

A chunk's forward saves its units' activations from its first unit's start;
its backward frees them at its end, and holds the chunk's backward extra
(`StageSums.backward_extra`: a recomputed block, the loss's transient) while it runs; the logits
a pipeline schedule keeps stay to the step's end (planner.cost.memory's terms).  Reserve and fragmentation scale as in
`stage_memory`: reserve + (1 + fragmentation) * allocated bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.sums import StageSums
from planner.simulate.simulator import SimulationRun


@dataclass(frozen=True)
class MemoryCurve:
    """Bytes of one GPU of a stage, a step function: bytes[k] holds from times[k] to times[k + 1]."""

    stage: int
    times: list[float]
    bytes: list[float]
    capacity: float
    analytic_peak: float

    @property
    def peak(self) -> float:
        return max(self.bytes)


def memory_curves(sim: SimulationRun) -> list[MemoryCurve]:
    """One curve per stage over the simulated step."""
    tl = sim.timeline
    deltas: dict[int, list[tuple[float, float]]] = {w.index: [] for w in sim.works}
    for record in sim.ops:
        work = sim.works[record.stage]
        units = work.chunks[record.op.chunk]
        kept = sum(u.kept_bytes for u in units)
        events = deltas[record.stage]
        if record.op.phase == "F":
            # the logits a pipeline keeps for the step stay until its end
            events.append((tl.start[record.first], kept + sum(u.output_bytes for u in units)))
        elif record.op.phase == "W":  # the weight gradients free what the forward kept (their GEMMs' inputs)
            events.append((tl.end[record.last], -kept))
        elif record.op.phase == "I":  # the input gradient holds the working set; W frees the saves
            working = sum((u.sums for u in units), StageSums()).backward_extra
            events += [(tl.start[record.first], working), (tl.end[record.last], -working)]
        else:
            working = sum((u.sums for u in units), StageSums()).backward_extra
            events += [(tl.start[record.first], working), (tl.end[record.last], -kept - working)]
    curves = []
    for work in sim.works:
        static = work.static_bytes
        times, values, live = [0.0], [static], 0.0
        # frees before allocations at the same instant: a backward ending as the next forward starts
        for time, delta in sorted(deltas[work.index], key=lambda e: (e[0], e[1])):
            live += delta
            if time == times[-1]:
                values[-1] = static + live
            else:
                times.append(time)
                values.append(static + live)
        times.append(sim.step_time)
        values.append(static + live)  # the step's end: what is still held (nothing, when every backward freed)
        scale = 1.0 + sim.fragmentation
        curves.append(MemoryCurve(stage=work.index, times=times, bytes=[sim.reserve_bytes + scale * v for v in values],
                                  capacity=work.capacity, analytic_peak=work.cost.memory.total))
    return curves
