"""A discrete-event engine for task graphs on serial streams.

Each stream (a stage's compute stream, its data-parallel comm stream, its
send links, its host link) runs its tasks one at a time in a fixed order; a
task starts when its stream is free and its dependencies are met (the end,
or for prefetches the start, of other tasks).  Durations are fixed, except
for tasks marked `shared`: collectives that contend with compute on the same
GPU progress at `overlap` (the catalog's `comm_overlap_efficiency`) while
that stage's compute stream runs a compute task, and at full speed while it
idles, so a collective of c seconds hides behind at most overlap * c of
compute, as the analytic model assumes (Wang et al. 2023, arXiv 2305.06942).

Between events every rate is constant, so the engine jumps from event to
event (no time step); ties resolve in stream order, so runs are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Task:
    """One piece of work on one stream."""

    stage: int  # -1 for the step barrier
    stream: str  # compute, dp, send-next, send-prev, host, step
    kind: str  # forward, backward, send, copy, transfer, gather, regather, reduce, sync, optimizer, offload, barrier
    label: str
    work: float  # seconds at full speed
    after_end: list[int] = field(default_factory=list)
    after_start: list[int] = field(default_factory=list)
    shared: bool = False  # slowed to `overlap` while the stage computes
    computes: bool = False  # occupies the stage's SMs (slows shared tasks)
    micro_batch: int = -1
    chunk: int = -1


@dataclass
class Timeline:
    """Start and end of every task (same order as the tasks)."""

    tasks: list[Task]
    start: list[float]
    end: list[float]


def run(tasks: list[Task], overlap: float) -> Timeline:
    """Simulate `tasks`: each stream runs its tasks in list order."""
    queues: dict[tuple[int, str], list[int]] = {}
    for index, task in enumerate(tasks):
        queues.setdefault((task.stage, task.stream), []).append(index)
    streams = sorted(queues)
    pointer = {s: 0 for s in streams}
    running: dict[tuple[int, str], int] = {}
    remaining: dict[tuple[int, str], float] = {}
    n = len(tasks)
    start, end = [-1.0] * n, [-1.0] * n
    now, finished = 0.0, 0

    def ready(task: Task) -> bool:
        return all(end[d] >= 0 for d in task.after_end) and all(start[d] >= 0 for d in task.after_start)

    def computing(stage: int) -> bool:
        busy = running.get((stage, "compute"))
        return busy is not None and tasks[busy].computes

    while finished < n:
        progressed = True
        while progressed:  # start what can start now; zero-work tasks end at once
            progressed = False
            for stream in streams:
                if stream in running or pointer[stream] == len(queues[stream]):
                    continue
                index = queues[stream][pointer[stream]]
                if not ready(tasks[index]):
                    continue
                pointer[stream] += 1
                start[index] = now
                progressed = True
                if tasks[index].work <= 0.0:
                    end[index] = now
                    finished += 1
                else:
                    running[stream], remaining[stream] = index, tasks[index].work
        if finished == n:
            break
        if not running:
            waiting = [tasks[queues[s][pointer[s]]].label for s in streams if pointer[s] < len(queues[s])]
            raise RuntimeError(f"simulation deadlock: nothing can start (waiting: {', '.join(waiting[:4])})")
        rates = {s: overlap if tasks[i].shared and computing(tasks[i].stage) else 1.0 for s, i in running.items()}
        step = min(remaining[s] / rates[s] for s in running)
        now += step
        for stream in list(running):
            left = remaining[stream] - rates[stream] * step
            index = running[stream]
            if left <= 1e-9 * tasks[index].work:
                end[index] = now
                finished += 1
                del running[stream], remaining[stream]
            else:
                remaining[stream] = left
    return Timeline(tasks=tasks, start=start, end=end)
