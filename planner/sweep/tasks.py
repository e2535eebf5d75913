"""One sweep task: one (model, cluster, batch, seq_len, strategy) scored by `planner.compare.compare`.

`run_task` is a plain top-level function of picklable arguments, so the same
code runs inline, in a `ProcessPoolExecutor` worker and as a Ray task.  The
driver builds each task's `Job` (see `planner/sweep/scenarios.py`), so a
worker needs the planner package but none of the sweep's input files.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from planner.compare.plugins import UserStrategy
from planner.compare.table import CompareRow, compare
from planner.job import Job, Precision


class SweepTask(BaseModel):
    """One strategy on one scenario, with the labels the results are written under."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=0, description="Position in the expanded sweep: the row order of results.csv.")
    scenario: int = Field(ge=0, description="Index of the (model, cluster, batch, seq_len, precision) scenario.")
    model: str = Field(description="The model as written in the sweep file.")
    cluster: str = Field(description="The cluster as written in the sweep file.")
    batch: int = Field(gt=0, description="Global batch in sequences (samples for recsys models).")
    seq_len: int = Field(gt=0, description="Tokens per sequence.")
    precision: Precision = Field(description="Compute precision.")
    strategy: str = Field(description="Strategy name of `planner.compare.table` (a baseline, or planner), or of a "
                          "user strategy.")
    plugin: UserStrategy | None = Field(None, description="The user strategy named `strategy`, when it is one.")
    time_limit: float = Field(gt=0, description="Search budget in seconds of a compiled strategy.")
    job: Job = Field(description="The job, built by the driver from model, cluster, batch and seq_len.")


@dataclass(frozen=True)
class TaskResult:
    """What a worker sends back: the compare row plus wall-clock facts (which never enter results.csv)."""

    index: int  # SweepTask.index
    row: CompareRow
    wall_s: float  # the whole task, as seen by the worker
    worker: str  # host:pid that ran it


def run_task(task: SweepTask) -> TaskResult:
    """Score `task.strategy` on `task.job` with the same code path as `planner compare --only STRATEGY`."""
    start = time.perf_counter()
    plugins = (task.plugin,) if task.plugin is not None else ()
    (row,) = compare(task.job, (task.strategy,), task.time_limit, plugins=plugins)
    return TaskResult(task.index, row, time.perf_counter() - start, f"{socket.gethostname()}:{os.getpid()}")
