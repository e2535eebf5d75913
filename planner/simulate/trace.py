"""Chrome / Perfetto trace of simulated steps (the Trace Event Format).

One process per stage (`pid`), one thread per stream (`tid`: compute, data
parallel, sends downstream, sends upstream, host), complete events (`ph: "X"`)
in microseconds, and an HBM counter per stage (`ph: "C"`).  Open the file in
https://ui.perfetto.dev or chrome://tracing.  Format: "Trace Event Format",
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json

from planner.simulate.memory import memory_curves
from planner.simulate.simulator import SimulationRun

STREAMS = ("compute", "dp", "send-next", "send-prev", "host", "step")
_STREAM_NAMES = {"compute": "compute", "dp": "data-parallel comm", "send-next": "p2p to next stage",
                 "send-prev": "p2p to previous stage", "host": "host / offload", "step": "step barrier"}
PIDS_PER_RUN = 1000  # replica groups: group g's stage s is pid g * 1000 + s


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _slices(starts: list[float], ends: list[float], lanes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) in integer nanoseconds per task, properly nested: on each lane (pid, tid) a slice starts no
    earlier than the one before it ends.  The simulator's float times can overlap by a rounding error (1e-16 s);
    rounding ts and dur apart made 100-228 such overlaps per thread, which Perfetto flags as improperly nested."""
    out: list[tuple[int, int]] = [(0, 0)] * len(starts)
    last_end: dict[tuple[int, int], int] = {}
    for index in sorted(range(len(starts)), key=lambda i: (starts[i], ends[i], i)):
        start = max(_ns(starts[index]), last_end.get(lanes[index], 0))
        end = max(start, _ns(ends[index]))
        out[index] = (start, end)
        last_end[lanes[index]] = end
    return out


def trace_events(runs: list[tuple[str, SimulationRun]]) -> list[dict]:
    """Trace events of every (name, run): a name prefixes the process names (replica groups)."""
    events: list[dict] = []
    for group, (name, sim) in enumerate(runs):
        prefix = f"{name} " if name else ""
        stages = len(sim.works)
        tl = sim.timeline
        for work in sim.works:
            pid = group * PIDS_PER_RUN + work.index
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": f"{prefix}stage {work.index} ({work.device})"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        step_pid = group * PIDS_PER_RUN + stages
        events.append({"ph": "M", "name": "process_name", "pid": step_pid, "tid": 0, "args": {"name": f"{prefix}step"}})
        used = sorted({(t.stage, t.stream) for t in tl.tasks}, key=lambda k: (k[0], STREAMS.index(k[1])))
        for stage, stream in used:
            pid = group * PIDS_PER_RUN + (stage if stage >= 0 else stages)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": STREAMS.index(stream),
                           "args": {"name": _STREAM_NAMES[stream]}})
        lanes = [(group * PIDS_PER_RUN + (t.stage if t.stage >= 0 else stages), STREAMS.index(t.stream))
                 for t in tl.tasks]
        slices = _slices(list(tl.start), list(tl.end), lanes)
        for index, task in enumerate(tl.tasks):
            (pid, tid), (start, end) = lanes[index], slices[index]
            args = {"micro_batch": task.micro_batch, "chunk": task.chunk} if task.micro_batch >= 0 else {}
            # microseconds with three decimals: whole nanoseconds, as start and end were rounded (not ts and dur)
            events.append({"ph": "X", "name": task.label, "cat": task.kind, "pid": pid, "tid": tid,
                           "ts": start / 1000, "dur": (end - start) / 1000, "args": args})
        for curve in memory_curves(sim):
            pid = group * PIDS_PER_RUN + curve.stage
            for time, value in zip(curve.times, curve.bytes):
                events.append({"ph": "C", "name": "HBM", "pid": pid, "ts": _us(time),
                               "args": {"GB": round(value / 1e9, 6)}})
    return events


def trace_json(runs: list[tuple[str, SimulationRun]]) -> str:
    """The trace file's text: deterministic (sorted keys, rounded microseconds)."""
    document = {"traceEvents": trace_events(runs), "displayTimeUnit": "ms",
                "otherData": {"source": "planner simulate", "time_unit": "microseconds"}}
    return json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n"
