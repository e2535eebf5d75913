"""Packing sequences into micro-batches and balancing them over the data ranks (hybrid data parallelism).

Pure functions of lengths and per-micro-batch seconds, so the planner (with the cost model's seconds) and the
trainer's sampler (with the plan's fitted seconds, planner.runtime.sampler) share them.

* `pack`: each sequence gets the context-parallel degree of its bucket (the smallest power of two c with
  L <= c x budget, raised by the plan's per-bucket factor); sequences of degree 1 are packed first-fit
  decreasing into micro-batches of at most `budget` tokens, a longer one runs alone on its c ranks.
* `schedule`: the data ranks form aligned groups of c ranks (rank r in group r // c), nested for powers of two.
  Micro-batches are placed by degree, largest first, each phase longest-processing-time first onto the group
  whose ranks are least loaded.  Because groups nest, the ranks of a group carry equal loads whenever a
  phase starts, so a context-parallel micro-batch never waits on one of its ranks: a rank's time is the sum of
  its micro-batches.  LPT is a heuristic (Graham's 4/3 bound for one phase); `lower_bound` is what any
  assignment of the same micro-batches needs, and the plan reports both.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Packed:
    """A micro-batch: the indices of its sequences (into the step's list) and its context-parallel degree."""

    cp: int
    members: tuple[int, ...]


def min_degree(length: int, budget: int) -> int:
    """The smallest power of two c with length <= c x budget."""
    c = 1
    while length > c * budget:
        c *= 2
    return c


def pack(lengths: Sequence[int], budget: int, degree: Callable[[int], int]) -> list[Packed]:
    """Micro-batches of the step's sequences: those of `degree` 1 first-fit decreasing into `budget` tokens,
    every other one alone.  Deterministic: ties keep the step's order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    short = [i for i in order if degree(lengths[i]) == 1]
    out = [Packed(cp=degree(lengths[i]), members=(i,)) for i in order if degree(lengths[i]) > 1]
    shortest = min((lengths[i] for i in short), default=0)
    closed: list[list[int]] = []
    bins: list[list[int]] = []  # open bins, in opening order
    room: list[int] = []
    for i in short:
        for b, left in enumerate(room):
            if lengths[i] <= left:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
        # a bin with less room than the shortest sequence takes nothing more: close it (keeps first fit linear)
        keep = [b for b, left in enumerate(room) if left >= shortest]
        if len(keep) < len(room):
            closed += [bins[b] for b in range(len(bins)) if room[b] < shortest]
            bins, room = [bins[b] for b in keep], [room[b] for b in keep]
    position = {i: k for k, i in enumerate(order)}
    packed = sorted(closed + bins, key=lambda b: position[b[0]])  # opening order: a bin's first member opened it
    return out + [Packed(cp=1, members=tuple(b)) for b in packed]


@dataclass(frozen=True)
class Schedule:
    """Where each micro-batch runs and what every data rank carries."""

    groups: tuple[int, ...]  # per micro-batch (in the order given): the first rank of its group
    loads: tuple[float, ...]  # per data rank: seconds of its micro-batches


def schedule(degrees: Sequence[int], seconds: Sequence[float], ranks: int) -> Schedule:
    """Assign micro-batches (their degree and seconds) to aligned rank groups, phase by degree, LPT."""
    loads = [0.0] * ranks
    groups = [0] * len(degrees)
    for c in sorted(set(degrees), reverse=True):
        # heap of (load of the group's ranks, first rank) for the ranks // c aligned groups
        heap = [(max(loads[g * c:(g + 1) * c]), g * c) for g in range(ranks // c)]
        heapq.heapify(heap)
        items = sorted((j for j, d in enumerate(degrees) if d == c), key=lambda j: (-seconds[j], j))
        for j in items:
            load, first = heapq.heappop(heap)
            load += seconds[j]
            for r in range(first, first + c):
                loads[r] = load
            groups[j] = first
            heapq.heappush(heap, (load, first))
    return Schedule(groups=tuple(groups), loads=tuple(loads))


def lower_bound(degrees: Sequence[int], seconds: Sequence[float], ranks: int) -> float:
    """Seconds the busiest rank needs under any assignment of these micro-batches: their rank-seconds spread
    evenly, and never less than the longest one."""
    if not seconds:
        return 0.0
    return max(sum(c * t for c, t in zip(degrees, seconds)) / ranks, max(seconds))
