"""The order of forward and backward passes on each pipeline stage.

Orders follow Megatron-LM's `pipeline_parallel/schedules.py`:

* 1F1B (`forward_backward_pipelining_without_interleaving`): stage r of p
  runs min(p - r - 1, m) warm-up forwards, then alternates one forward and
  one backward, then drains the remaining backwards (Narayanan et al. 2021,
  arXiv 2104.04473, Fig. 3; PipeDream-Flush).
* interleaved 1F1B (`forward_backward_pipelining_with_interleaving`):
  virtual micro-batch k runs micro-batch and chunk from the schedule table
  that walks groups of p micro-batches through the chunks in order (chunks
  reversed for backward); warm-up (p - r - 1) * 2 + (v - 1) * p forwards.
* GPipe (Huang et al. 2019, arXiv 1811.06965; torch.distributed.pipelining
  `ScheduleGPipe`): all forwards, then all backwards.
* zero-bubble V (torch.distributed.pipelining `ScheduleZBVZeroBubble`, torch 2.13; Qi et al. 2023,
  arXiv 2401.10241 Sec. 6) and DualPipeV (`ScheduleDualPipeV`, from github.com/deepseek-ai/DualPipe): two
  chunks per stage in a V, local chunk 0 = model chunk r, chunk 1 = model chunk 2p - 1 - r; backwards split
  into I (input gradient) and W (weight gradient) passes or run whole (B); DualPipeV's overlapped F&B pairs
  run as F then B, as torch runs them when no overlap callback is registered.  The orders are
  `_calculate_single_rank_operations` of each (tests/test_schedules_zero_bubble.py compares them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["F", "B", "I", "W"]  # forward, whole backward, input-gradient backward, weight-gradient backward


@dataclass(frozen=True)
class Op:
    """One chunk's forward or backward of one micro-batch on one stage."""

    phase: Phase
    micro_batch: int
    chunk: int  # local chunk index on the stage (model chunk chunk * p + stage)


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """Megatron's non-interleaved 1F1B order for `stage`."""
    warmup = min(stages - stage - 1, micro_batches)
    ops = [Op("F", j, 0) for j in range(warmup)]
    for i in range(micro_batches - warmup):
        ops += [Op("F", warmup + i, 0), Op("B", i, 0)]
    ops += [Op("B", j, 0) for j in range(micro_batches - warmup, micro_batches)]
    return ops


def gpipe(micro_batches: int) -> list[Op]:
    """All forwards, then all backwards."""
    return [Op("F", j, 0) for j in range(micro_batches)] + [Op("B", j, 0) for j in range(micro_batches)]


def schedule_table(micro_batches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch: groups of `group` micro-batches through every chunk
    (Megatron `get_schedule_table`; a last, shorter group takes the remainder)."""
    table: list[tuple[int, int]] = []
    for first in range(0, micro_batches, group):
        last = min(first + group, micro_batches)
        table += [(mb, chunk) for chunk in range(chunks) for mb in range(first, last)]
    return table


def interleaved(stage: int, stages: int, micro_batches: int, chunks: int) -> list[Op]:
    """Megatron's interleaved 1F1B order for `stage` with `chunks` model chunks per stage."""
    table = schedule_table(micro_batches, chunks, stages)
    total = len(table)
    warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)

    def forward(k: int) -> Op:
        mb, chunk = table[k]
        return Op("F", mb, chunk)

    def backward(k: int) -> Op:
        mb, chunk = table[k]
        return Op("B", mb, chunks - 1 - chunk)

    ops = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [forward(warmup + k), backward(k)]
    ops += [backward(k) for k in range(total - warmup, total)]
    return ops


def zbv(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """torch's ScheduleZBVZeroBubble order for `stage`: warm-up forwards down the V, a steady F-I-W on each
    chunk, then the input gradients and the deferred weight gradients (micro-batches padded to 2p - 1, the
    padding dropped)."""
    p, padded = stages, max(2 * stages - 1, micro_batches)
    ops: list[Op] = []
    count = {("F", 0): 0, ("F", 1): 0, ("I", 0): 0, ("I", 1): 0, ("W", 0): 0, ("W", 1): 0}

    def emit(phase: Phase, chunk: int) -> None:
        ops.append(Op(phase, count[phase, chunk], chunk))
        count[phase, chunk] += 1

    for _ in range(2 * (p - stage) - 1):
        emit("F", 0)
    for _ in range(stage):
        emit("F", 1)
        emit("F", 0)
    for _ in range(p - stage):
        emit("F", 1)
        emit("I", 1)
        emit("W", 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < padded:
        if count["F", 0] < padded:
            emit("F", 0)
        emit("I", 0)
        emit("W", 0)
        emit("F", 1)
        emit("I", 1)
        emit("W", 1)
    for _ in range(stage):
        emit("I", 0)
        emit("I", 1)
    for _ in range(p - stage):
        emit("I", 0)
        emit("W", 0)
    for chunk in (1, 0):
        while count["W", chunk] < count["I", chunk]:
            emit("W", chunk)
    return [op for op in ops if op.micro_batch < micro_batches]


def dualpipev(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """torch's ScheduleDualPipeV order for `stage` (needs micro_batches >= 2p): the V's warm-up, input
    gradients with their weight gradients queued, the main F&B pairs (each as its F then its whole B), and the
    cool-down that runs zero-bubble on its second half."""
    p, m = stages, micro_batches
    ops: list[Op] = []
    forward = [0, 0]
    backward = [0, 0]  # I and whole B share the counter (torch's BACKWARD_INPUT key)
    queued: list[tuple[int, int]] = []  # (chunk, micro-batch) of input gradients whose W waits

    def emit(phase: Phase, chunk: int) -> None:
        if phase == "F":
            ops.append(Op("F", forward[chunk], chunk))
            forward[chunk] += 1
            return
        ops.append(Op(phase, backward[chunk], chunk))
        if phase == "I":
            queued.append((chunk, backward[chunk]))
        backward[chunk] += 1

    def weight() -> None:
        if queued:
            chunk, micro = queued.pop(0)
            ops.append(Op("W", micro, chunk))

    for _ in range((p - stage - 1) * 2):
        emit("F", 0)
    for _ in range(stage + 1):
        emit("F", 0)
        emit("F", 1)
    for _ in range(p - stage - 1):
        emit("I", 1)
        weight()
        emit("F", 1)
    for i in range(m - 2 * p + stage + 1):
        # each pair: the forward of one chunk and the whole backward of the other
        emit("F", 0)
        emit("B", 1)
        emit("F", 1)
        emit("B", 0)
    for _ in range(p - stage - 1):
        emit("B", 1)
        emit("F", 1)
        emit("B", 0)
    zero_bubble = False
    steps = stage + 1
    for i in range(steps):
        if i == steps // 2 and stage % 2 == 1:
            zero_bubble = True
        emit("I" if zero_bubble else "B", 1)
        if i == steps // 2 and stage % 2 == 0:
            zero_bubble = True
        emit("I" if zero_bubble else "B", 0)
    for _ in range(p - stage - 1):
        weight()
        emit("I" if zero_bubble else "B", 0)
    for _ in range(stage + 1):
        weight()
    return ops


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int, chunks: int) -> list[Op]:
    """The op order of `stage` under `schedule` (gpipe, 1f1b, interleaved, zbv or dualpipev)."""
    if schedule == "zbv":
        return zbv(stage, stages, micro_batches)
    if schedule == "dualpipev":
        return dualpipev(stage, stages, micro_batches)
    if schedule == "gpipe":
        return gpipe(micro_batches)
    if schedule == "interleaved":
        return interleaved(stage, stages, micro_batches, chunks)
    return one_f_one_b(stage, stages, micro_batches)
