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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["F", "B"]


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


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int, chunks: int) -> list[Op]:
    """The op order of `stage` under `schedule` (gpipe, 1f1b or interleaved)."""
    if schedule == "gpipe":
        return gpipe(micro_batches)
    if schedule == "interleaved":
        return interleaved(stage, stages, micro_batches, chunks)
    return one_f_one_b(stage, stages, micro_batches)
