"""The task graph of one training step: every stage's passes, transfers and collectives.

* Compute stream, per stage, in schedule order: each op (a chunk's forward or
  backward of one micro-batch) is one task, or one task per layer when
  data-parallel collectives interleave with it layer by layer.  A send keeps
  the sender's stream for `send_block` seconds (Megatron's blocking
  `send_forward_recv_backward`); the receiver's op waits for the transfer on
  the sender's link (`send-next` downstream, `send-prev` upstream).
* Data-parallel stream, per stage, FIFO in issue order, each gather unit's
  collectives priced as the runtime issues them (tasks.py): with a prefetch
  depth d >= 1 (FSDP2, DeepSpeed ZeRO-3 with its prefetcher) a forward
  gathers its first d units when it is issued and unit k + d when unit k
  starts; a backward re-gathers the same way in reverse order (its first unit
  too, unless the stage ran that chunk's forward just before: torchtitan keeps
  it) and reduce-scatters unit k's gradients when unit k ends.  With d = 0
  (DeepSpeed 0.3.x) a unit is gathered only once the previous one has ended;
  its per-parameter reduce-scatters run beside its own backward (after its
  recomputed forward), and the next gather, which synchronises the device
  first, waits for them.  Host copies of list-based collectives run on the
  compute stream (the Python thread issues them; the GPU waits).  In the
  last backward of each chunk the step-end gradient sync follows each unit's
  gradients (DDP buckets / Megatron's overlapped grad reduce).
* Zero-bubble V schedules (zbv, dualpipev): a stage runs model chunks r and
  2p - 1 - r; an I pass is a backward without its weight-gradient GEMMs
  (`StageSums.weight_grad`), a W pass those GEMMs alone (no transfer, no
  collective: the unit's reduce-scatters and sync go with its I pass); the
  turn of the V (model chunks p - 1 and p on the last stage) hands over
  without a transfer.
* The step ends with a barrier (Megatron's global grad-norm all-reduce), then
  each stage's optimizer step and its offload transfers / CPU Adam.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.simulate.engine import Task
from planner.simulate.schedule import Op, stage_order
from planner.simulate.tasks import LayerWork, StageWork
from planner.strategy import V_SCHEDULES


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
    """Appends one stage's tasks, tracking the last task of its compute stream."""

    def __init__(self, tasks: list[Task], work: StageWork):
        self.tasks, self.work = tasks, work
        self.last_compute = -1

    def add(self, task: Task) -> int:
        self.tasks.append(task)
        if task.stream == "compute":
            self.last_compute = len(self.tasks) - 1
        return len(self.tasks) - 1

    def after_last(self) -> list[int]:
        """Waiting for the compute stream's last task so far (nothing at the stage's start)."""
        return [self.last_compute] if self.last_compute >= 0 else []

    def comm(self, kind: str, label: str, work: float, op: Op, **deps) -> int | None:
        if work <= 0.0:
            return None
        return self.add(Task(self.work.index, "dp", kind, label, work, shared=True, micro_batch=op.micro_batch,
                             chunk=op.chunk, **deps))

    def compute(self, kind: str, label: str, work: float, op: Op, after: list[int]) -> int:
        return self.add(Task(self.work.index, "compute", kind, label, work, after_end=after, computes=True,
                             micro_batch=op.micro_batch, chunk=op.chunk))

    def copy(self, label: str, work: float, op: Op, after: list[int]) -> list[int]:
        """Host copies of list-based collectives on the compute stream; what the next task waits for."""
        if work <= 0.0:
            return after
        return [self.add(Task(self.work.index, "compute", "copy", label, work, after_end=after,
                              micro_batch=op.micro_batch, chunk=op.chunk))]


def _forward(b: _StageBuilder, op: Op, units: tuple[LayerWork, ...], tag: str) -> tuple[int, int, list[int]]:
    if not any(u.dp.gather + u.dp.gather_copies > 0.0 for u in units):
        index = b.compute("forward", tag, sum(u.forward for u in units), op, [])
        return index, index, [index]
    depth = b.work.prefetch
    gathers: dict[int, list[int]] = {}

    def issue(k: int, **deps) -> None:
        task = b.comm("gather", f"{tag} gather {units[k].name}", units[k].dp.gather, op, **deps)
        gathers[k] = [task] if task is not None else []

    for k in range(min(max(1, depth), len(units))):  # issued with the op (the first one even without prefetch)
        issue(k, after_end=b.after_last())
    entries = [task for k in sorted(gathers) for task in gathers[k]]
    first = -1
    for k, unit in enumerate(units):
        wait = b.copy(f"{tag} gather copies {unit.name}", unit.dp.gather_copies, op, gathers[k])
        index = b.compute("forward", f"{tag} {unit.name}", unit.forward, op, wait)
        first = index if k == 0 else first
        if k + max(1, depth) < len(units):
            if depth:
                issue(k + depth, after_start=[index])
            else:
                issue(k + 1, after_end=[index])
    return first, b.last_compute, [first, *entries]


def _unit_backward(b: _StageBuilder, op: Op, unit: LayerWork, tag: str, wait: list[int],
                   split_recompute: bool) -> tuple[int, int]:
    """A unit's backward on the compute stream: (its first task, its backward-proper task).  With
    `split_recompute` its recomputed forward runs as a task of its own first (its gradients, and the
    reduce-scatters that start with them, appear only after it)."""
    if not split_recompute or unit.recompute <= 0.0:
        index = b.compute("backward", f"{tag} {unit.name}", unit.backward, op, wait)
        return index, index
    recompute = b.compute("backward", f"{tag} {unit.name} recompute", unit.recompute, op, wait)
    return recompute, b.compute("backward", f"{tag} {unit.name}", unit.backward - unit.recompute, op, [recompute])


def _backward(b: _StageBuilder, op: Op, units: tuple[LayerWork, ...], tag: str, resident: bool,
              sync: bool) -> tuple[int, int, list[int]]:
    if not any(u.dp.backward_work or (sync and u.dp.sync > 0.0) for u in units):
        index = b.compute("backward", tag, sum(u.backward for u in units), op, [])
        return index, index, [index]
    order = list(reversed(units))
    depth = b.work.prefetch
    gathers: dict[int, list[int]] = {}

    def issue(k: int, **deps) -> None:
        if k == 0 and resident:  # still gathered from the forward that just ran
            gathers[k] = []
            return
        unit = order[k]
        tasks = [b.comm("regather", f"{tag} recompute gather {unit.name}", unit.dp.recompute_gather, op, **deps),
                 b.comm("regather", f"{tag} regather {unit.name}", unit.dp.regather, op, **deps)]
        gathers[k] = [task for task in tasks if task is not None]

    for k in range(min(max(1, depth), len(order))):
        issue(k, after_end=b.after_last())
    entries = [task for k in sorted(gathers) for task in gathers[k]]
    first = -1
    for k, unit in enumerate(order):
        if not depth and k > 0:  # no prefetch: gathered once the previous unit's backward has ended
            issue(k, after_end=b.after_last())
        copies = 0.0 if k == 0 and resident else unit.dp.regather_copies
        wait = b.copy(f"{tag} regather copies {unit.name}", copies, op, gathers[k])
        if not depth:  # the gradient hooks' copies, which the analytic model leaves unhidden
            wait = b.copy(f"{tag} reduce copies {unit.name}", unit.dp.reduce_copies, op, wait)
        start, index = _unit_backward(b, op, unit, tag, wait, split_recompute=not depth)
        first = start if k == 0 else first
        if depth:
            if k + depth < len(order):
                issue(k + depth, after_start=[index])
            after = b.copy(f"{tag} reduce copies {unit.name}", unit.dp.reduce_copies, op, [index])
            b.comm("reduce", f"{tag} reduce-scatter {unit.name}", unit.dp.reduce, op, after_end=after)
        else:
            # per-parameter reduce-scatters run beside the unit's own backward as its gradients appear, and
            # the next gather, which synchronises the device first, waits for them (queued before it)
            b.comm("reduce", f"{tag} reduce-scatter {unit.name}", unit.dp.reduce, op, after_start=[index])
        if sync:
            b.comm("sync", f"grad sync {unit.name}", unit.dp.sync, op, after_end=[index])
    return first, b.last_compute, [first, *entries]


def _send(b: _StageBuilder, op: Op, stream: str, tag: str) -> int:
    """The sender's blocking share and the link transfer; returns the transfer (its end delivers)."""
    last = b.last_compute
    if b.work.send_block > 0.0:
        b.add(Task(b.work.index, "compute", "send", f"{tag} send", b.work.send_block, micro_batch=op.micro_batch,
                   chunk=op.chunk))
    return b.add(Task(b.work.index, stream, "transfer", f"{tag} transfer", b.work.transfer, after_end=[last],
                      micro_batch=op.micro_batch, chunk=op.chunk))


@dataclass(frozen=True)
class Layout:
    """Which model chunk each stage's local chunk is: interleaved (chunk j of stage i is j * p + i) or a V."""

    stages: int
    chunks: int
    v_shape: bool = False

    def model_chunk(self, stage: int, chunk: int) -> int:
        if self.v_shape:
            return stage if chunk == 0 else 2 * self.stages - 1 - stage
        return chunk * self.stages + stage

    def place(self, model_chunk: int) -> tuple[int, int]:
        """(stage, local chunk) of a model chunk."""
        if self.v_shape:
            return (model_chunk, 0) if model_chunk < self.stages else (2 * self.stages - 1 - model_chunk, 1)
        return model_chunk % self.stages, model_chunk // self.stages

    @property
    def last(self) -> int:
        return self.stages * self.chunks - 1


def _weight_grads(b: _StageBuilder, op: Op, units: tuple[LayerWork, ...], tag: str) -> tuple[int, int, list[int]]:
    """A W pass: the weight-gradient GEMMs of the chunk's units, one task."""
    index = b.compute("backward", tag, sum(u.sums.weight_grad for u in units), op, [])
    return index, index, [index]


def _stage_tasks(tasks: list[Task], work: StageWork, ops: list[Op], layout: Layout) -> list[OpTasks]:
    b = _StageBuilder(tasks, work)
    last_backward = {op.chunk: k for k, op in enumerate(ops) if op.phase in ("B", "I")}
    out: list[OpTasks] = []
    previous: Op | None = None
    for k, op in enumerate(ops):
        model_chunk = layout.model_chunk(work.index, op.chunk)
        layers = work.chunks[op.chunk]
        tag = f"{op.phase}{op.micro_batch}" + (f".{op.chunk}" if layout.chunks > 1 else "")
        target: int | None = None  # the model chunk its output goes to (None: none)
        if op.phase == "F":
            first, last, entries = _forward(b, op, layers, tag)
            target = model_chunk + 1 if model_chunk < layout.last else None
        elif op.phase == "W":
            first, last, entries = _weight_grads(b, op, layers, tag)
        else:
            resident = previous == Op("F", op.micro_batch, op.chunk)
            if op.phase == "I":  # the input gradient alone: the weight-gradient GEMMs wait for a W pass
                layers = tuple(replace(u, backward=u.backward - u.sums.weight_grad) for u in layers)
            first, last, entries = _backward(b, op, layers, tag, resident, last_backward[op.chunk] == k)
            target = model_chunk - 1 if model_chunk > 0 else None
        delivery = -1
        if target is not None and layout.place(target)[0] != work.index:  # the V's turn stays on the stage
            stream = "send-next" if layout.place(target)[0] > work.index else "send-prev"
            delivery = _send(b, op, stream, tag)
        out.append(OpTasks(work.index, op, first, last, tuple(entries), delivery))
        previous = op
    return out


def _producer(op: Op, stage: int, layout: Layout) -> tuple[int, tuple[Op, ...]] | None:
    """The stage and the ops (one of which it runs) whose output `op` on `stage` consumes (None: the model's
    input or the loss, or a W pass, which its own stage's order already puts after its I)."""
    model_chunk = layout.model_chunk(stage, op.chunk)
    if op.phase == "F":
        if model_chunk == 0:
            return None
        where, chunk = layout.place(model_chunk - 1)
        return where, (Op("F", op.micro_batch, chunk),)
    if op.phase == "W" or model_chunk == layout.last:
        return None
    where, chunk = layout.place(model_chunk + 1)
    return where, (Op("B", op.micro_batch, chunk), Op("I", op.micro_batch, chunk))


def build_graph(works: list[StageWork], schedule: str, micro_batches: int, chunks: int) -> tuple[list[Task],
                                                                                                list[OpTasks]]:
    """Every task of one step, and where each op's tasks are."""
    stages = len(works)
    layout = Layout(stages, chunks, v_shape=schedule in V_SCHEDULES and stages > 1)
    tasks: list[Task] = []
    ops: list[OpTasks] = []
    for work in works:
        ops += _stage_tasks(tasks, work, stage_order(schedule, work.index, stages, micro_batches, chunks), layout)
    where = {(o.stage, o.op): o for o in ops}
    for o in ops:  # cross-stage dependencies: an op waits for its input's arrival
        source = _producer(o.op, o.stage, layout)
        if source is None:
            continue
        producer = next(where[source[0], op] for op in source[1] if (source[0], op) in where)
        arrival = producer.delivery if producer.delivery >= 0 else producer.last
        for entry in o.entries:
            tasks[entry].after_end.append(arrival)
    _step_end(tasks, works)
    return tasks, ops


def _step_end(tasks: list[Task], works: list[StageWork]) -> None:
    """Barrier after every stream drains, then each stage's optimizer step and offload, and the data-parallel
    sync a strategy without its overlap leaves exposed (the gradients' before the step, the gather's after)."""
    lasts: dict[tuple[int, str], int] = {}
    for index, task in enumerate(tasks):
        lasts[(task.stage, task.stream)] = index
    barrier = len(tasks)
    tasks.append(Task(-1, "step", "barrier", "step barrier (grad-norm all-reduce)", 0.0,
                      after_end=sorted(lasts.values())))
    for work in works:
        after = [barrier]
        if work.exposed_sync > 0.0:  # dp_overlap=off: the gradient sync starts once the backward is done
            tasks.append(Task(work.index, "dp", "sync", "grad sync (not overlapped)", work.exposed_sync,
                              after_end=after))
            after = [len(tasks) - 1]
        if work.optimizer > 0.0:
            tasks.append(Task(work.index, "compute", "optimizer", "optimizer step", work.optimizer, after_end=after,
                              computes=True))
            after = [len(tasks) - 1]
        if work.offload > 0.0:
            tasks.append(Task(work.index, "host", "offload", "offload + CPU Adam", work.offload, after_end=after))
            after = [len(tasks) - 1]
        if work.after_step > 0.0:  # dp_overlap grad/off: the updated weights gathered after the step
            tasks.append(Task(work.index, "dp", "gather", "param gather (not overlapped)", work.after_step,
                              after_end=after))
