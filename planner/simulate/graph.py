"""The task graph of one training step: every stage's passes, transfers and collectives.

* Compute stream, per stage, in schedule order: each op (a chunk's forward or
  backward of one micro-batch) is one task, or one task per layer when
  data-parallel collectives interleave with it layer by layer.  A send keeps
  the sender's stream for `send_block` seconds (Megatron's blocking
  `send_forward_recv_backward`); the receiver's op waits for the transfer on
  the sender's link (`send-next` downstream, `send-prev` upstream).
* Data-parallel stream, per stage, FIFO in issue order (FSDP2 /
  DeepSpeed ZeRO-3 with one layer of prefetch): a forward gathers its first
  layer when it is issued and layer k + 1 when layer k starts; a backward
  re-gathers layer k - 1 when layer k starts (its first layer too, unless the
  stage ran that chunk's forward just before: torchtitan keeps it) and
  reduce-scatters layer k's gradients when layer k ends.  In the last
  backward of each chunk the step-end gradient sync follows each layer's
  gradients (DDP buckets / Megatron's overlapped grad reduce).
* The step ends with a barrier (Megatron's global grad-norm all-reduce), then
  each stage's optimizer step and its offload transfers / CPU Adam.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.simulate.engine import Task
from planner.simulate.schedule import Op, stage_order
from planner.simulate.tasks import LayerWork, StageWork


@dataclass(frozen=True)
class OpTasks:
    """Where one op landed in the task list."""

    stage: int
    op: Op
    first: int  # its first compute task
    last: int  # its last compute task
    entries: tuple[int, ...]  # tasks that wait for its input (first compute, first gather)
    delivery: int  # the task whose end delivers its output downstream (-1: none)


class _StageBuilder:
    """Appends one stage's tasks, tracking the last task of each stream."""

    def __init__(self, tasks: list[Task], work: StageWork, params: float):
        self.tasks, self.work, self.params = tasks, work, params
        self.last_compute = -1

    def add(self, task: Task) -> int:
        self.tasks.append(task)
        if task.stream == "compute":
            self.last_compute = len(self.tasks) - 1
        return len(self.tasks) - 1

    def share(self, layer: LayerWork, total: float) -> float:
        """A stage-level per-micro-batch collective's share for one layer (by parameters)."""
        return total * layer.params / self.params if self.params > 0 else 0.0

    def comm(self, kind: str, label: str, work: float, op: Op, **deps) -> int | None:
        if work <= 0.0:
            return None
        return self.add(Task(self.work.index, "dp", kind, label, work, shared=True, micro_batch=op.micro_batch,
                             chunk=op.chunk, **deps))

    def compute(self, kind: str, label: str, work: float, op: Op, after: list[int]) -> int:
        return self.add(Task(self.work.index, "compute", kind, label, work, after_end=after, computes=True,
                             micro_batch=op.micro_batch, chunk=op.chunk))


def _forward(b: _StageBuilder, op: Op, layers: tuple[LayerWork, ...], tag: str) -> tuple[int, int, list[int]]:
    if b.work.dp_gather <= 0.0:
        index = b.compute("forward", tag, sum(layer.forward for layer in layers), op, [])
        return index, index, [index]
    first, entries = -1, []
    gather = b.comm("gather", f"{tag} gather {layers[0].name}", b.share(layers[0], b.work.dp_gather), op,
                    after_end=[b.last_compute] if b.last_compute >= 0 else [])
    if gather is not None:
        entries.append(gather)
    for k, layer in enumerate(layers):
        index = b.compute("forward", f"{tag} {layer.name}", layer.forward, op, [gather] if gather is not None else [])
        first = index if k == 0 else first
        if k + 1 < len(layers):
            gather = b.comm("gather", f"{tag} gather {layers[k + 1].name}", b.share(layers[k + 1], b.work.dp_gather),
                            op, after_start=[index])
    return first, b.last_compute, [first, *entries]


def _backward(b: _StageBuilder, op: Op, layers: tuple[LayerWork, ...], tag: str, resident: bool,
              sync: bool) -> tuple[int, int, list[int]]:
    w = b.work
    if w.dp_regather <= 0.0 and w.dp_reduce <= 0.0 and not (sync and w.step_end > 0.0):
        index = b.compute("backward", tag, sum(layer.backward for layer in layers), op, [])
        return index, index, [index]
    order = list(reversed(layers))
    entries: list[int] = []
    gather = None
    if not resident:
        gather = b.comm("regather", f"{tag} regather {order[0].name}", b.share(order[0], w.dp_regather), op,
                        after_end=[b.last_compute] if b.last_compute >= 0 else [])
        entries += [gather] if gather is not None else []
    first = -1
    for k, layer in enumerate(order):
        index = b.compute("backward", f"{tag} {layer.name}", layer.backward, op, [gather] if gather is not None else [])
        first = index if k == 0 else first
        gather = None
        if k + 1 < len(order):
            gather = b.comm("regather", f"{tag} regather {order[k + 1].name}", b.share(order[k + 1], w.dp_regather),
                            op, after_start=[index])
        b.comm("reduce", f"{tag} reduce-scatter {layer.name}", b.share(layer, w.dp_reduce), op, after_end=[index])
        if sync:
            b.comm("sync", f"grad sync {layer.name}", b.share(layer, w.step_end), op, after_end=[index])
    return first, b.last_compute, [first, *entries]


def _send(b: _StageBuilder, op: Op, stream: str, tag: str) -> int:
    """The sender's blocking share and the link transfer; returns the transfer (its end delivers)."""
    last = b.last_compute
    if b.work.send_block > 0.0:
        b.add(Task(b.work.index, "compute", "send", f"{tag} send", b.work.send_block, micro_batch=op.micro_batch,
                   chunk=op.chunk))
    return b.add(Task(b.work.index, stream, "transfer", f"{tag} transfer", b.work.transfer, after_end=[last],
                      micro_batch=op.micro_batch, chunk=op.chunk))


def _stage_tasks(tasks: list[Task], work: StageWork, ops: list[Op], stages: int, chunks: int) -> list[OpTasks]:
    b = _StageBuilder(tasks, work, work.params)
    last_backward = {op.chunk: k for k, op in enumerate(ops) if op.phase == "B"}
    out: list[OpTasks] = []
    previous: Op | None = None
    for k, op in enumerate(ops):
        model_chunk = op.chunk * stages + work.index
        layers = work.chunks[op.chunk]
        tag = f"{op.phase}{op.micro_batch}" + (f".{op.chunk}" if chunks > 1 else "")
        if op.phase == "F":
            first, last, entries = _forward(b, op, layers, tag)
            sends = model_chunk < stages * chunks - 1
            stream = "send-next"
        else:
            resident = previous == Op("F", op.micro_batch, op.chunk)
            first, last, entries = _backward(b, op, layers, tag, resident, last_backward[op.chunk] == k)
            sends = model_chunk > 0
            stream = "send-prev"
        delivery = _send(b, op, stream, tag) if sends and stages > 1 else -1
        out.append(OpTasks(work.index, op, first, last, tuple(entries), delivery))
        previous = op
    return out


def _producer(op: Op, stage: int, stages: int, chunks: int) -> tuple[int, Op] | None:
    """The (stage, op) whose output `op` on `stage` consumes (None: the model's input or loss)."""
    if op.phase == "F":
        if stage > 0:
            return stage - 1, op
        return (stages - 1, Op("F", op.micro_batch, op.chunk - 1)) if op.chunk > 0 else None
    if stage < stages - 1:
        return stage + 1, op
    return (0, Op("B", op.micro_batch, op.chunk + 1)) if op.chunk < chunks - 1 else None


def build_graph(works: list[StageWork], schedule: str, micro_batches: int, chunks: int) -> tuple[list[Task],
                                                                                                list[OpTasks]]:
    """Every task of one step, and where each op's tasks are."""
    stages = len(works)
    tasks: list[Task] = []
    ops: list[OpTasks] = []
    for work in works:
        ops += _stage_tasks(tasks, work, stage_order(schedule, work.index, stages, micro_batches, chunks), stages,
                            chunks)
    where = {(o.stage, o.op): o for o in ops}
    for o in ops:  # cross-stage dependencies: an op waits for its input's arrival
        source = _producer(o.op, o.stage, stages, chunks)
        if source is None:
            continue
        producer = where[source]
        arrival = producer.delivery if producer.delivery >= 0 else producer.last
        for entry in o.entries:
            tasks[entry].after_end.append(arrival)
    _step_end(tasks, works)
    return tasks, ops


def _step_end(tasks: list[Task], works: list[StageWork]) -> None:
    """Barrier after every stream drains, then each stage's optimizer step and offload."""
    lasts: dict[tuple[int, str], int] = {}
    for index, task in enumerate(tasks):
        lasts[(task.stage, task.stream)] = index
    barrier = len(tasks)
    tasks.append(Task(-1, "step", "barrier", "step barrier (grad-norm all-reduce)", 0.0,
                      after_end=sorted(lasts.values())))
    for work in works:
        after = [barrier]
        if work.optimizer > 0.0:
            tasks.append(Task(work.index, "compute", "optimizer", "optimizer step", work.optimizer, after_end=after,
                              computes=True))
            after = [len(tasks) - 1]
        if work.offload > 0.0:
            tasks.append(Task(work.index, "host", "offload", "offload + CPU Adam", work.offload, after_end=after))
