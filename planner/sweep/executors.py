"""Where sweep tasks run: local worker processes (default) or a Ray cluster.

Both take the tasks (any iterable: a sweep's tasks are made as they are
taken) and call a callback once per finished task, in completion order; the
caller files the results by task index, so the output does not depend on the
executor or on scheduling.  At most `IN_FLIGHT_PER_WORKER` tasks per worker
are submitted ahead, so a large sweep is never queued (and held) at once.

* local: `concurrent.futures.ProcessPoolExecutor` with `workers` processes
  (each CP-SAT solve uses one thread, so one process per core); one worker
  runs inline.
* ray: `ray.init(address=ADDR)` joins an existing cluster (`auto`, or
  `ray://head:10001` through Ray Client); without an address a local Ray
  instance with `workers` CPUs is started; an already initialised Ray session
  is used as it is.  Each task is a Ray task of one CPU.  The planner package
  (and its dependencies) must be importable on the cluster's nodes.  Ray is an
  optional extra, imported only here.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from planner.errors import PlannerInputError
from planner.sweep.tasks import SweepTask, TaskResult, run_task

OnDone = Callable[[SweepTask, TaskResult], None]
EXECUTORS = ("local", "ray")
# Tasks submitted ahead per worker (process or Ray CPU): enough to keep every worker busy, few enough that
# a sweep of a million tasks holds a few thousand at a time.
IN_FLIGHT_PER_WORKER = 4


def _size(tasks: Iterable[SweepTask]) -> int | None:
    try:
        return len(tasks)  # type: ignore[arg-type]
    except TypeError:
        return None


def _take(source: Iterator[SweepTask], count: int) -> list[SweepTask]:
    return list(itertools.islice(source, max(0, count)))


def run_local(tasks: Iterable[SweepTask], workers: int, on_done: OnDone) -> None:
    """Run every task in `workers` processes (inline when 1, or for a single task)."""
    size = _size(tasks)
    if workers <= 1 or (size is not None and size <= 1):
        for task in tasks:
            on_done(task, run_task(task))
        return
    pool = ProcessPoolExecutor(max_workers=min(workers, size or workers))
    try:
        source, window = iter(tasks), workers * IN_FLIGHT_PER_WORKER
        pending: dict[Future, SweepTask] = {}
        while True:
            for task in _take(source, window - len(pending)):
                pending[pool.submit(run_task, task)] = task
            if not pending:
                break
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                on_done(pending.pop(future), future.result())
    finally:
        # on Ctrl-C or a failed task, drop the queued tasks instead of running them all first
        pool.shutdown(wait=True, cancel_futures=True)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise PlannerInputError("--executor ray: ray is not installed; pip install -e '.[ray]' in planner's "
                                "checkout") from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT (or ray://HOST:PORT) nobody listens on: ray.init retries for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return  # `auto` reads the local cluster's address file; Ray reports its own errors
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise PlannerInputError(f"--address {address}: cannot connect ({err.strerror or err})") from None


def _ray_cpus(ray, workers: int) -> int:
    """CPUs the Ray cluster offers (at least `workers`): the width of the submission window."""
    try:
        return max(workers, int(ray.cluster_resources().get("CPU", 0)))
    except Exception:  # noqa: BLE001 (an old or remote Ray without the call: the local count will do)
        return workers


def run_ray(tasks: Iterable[SweepTask], address: str | None, workers: int, on_done: OnDone) -> None:
    """Run every task as a Ray task (see the module docstring)."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        if address:
            _check_reachable(address)
        try:
            if address:
                ray.init(address=address, logging_level="WARNING")
            else:
                ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="WARNING")
        except (ConnectionError, ValueError, RuntimeError) as err:
            where = f"--address {address}" if address else "local Ray instance"
            raise PlannerInputError(f"{where}: cannot start or reach Ray: {' '.join(str(err).split())}") from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
        source, window = iter(tasks), _ray_cpus(ray, workers) * IN_FLIGHT_PER_WORKER
        pending: dict = {}
        while True:
            for task in _take(source, window - len(pending)):
                pending[remote.remote(task)] = task
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                on_done(task, ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def run_tasks(tasks: Iterable[SweepTask], executor: str, workers: int, on_done: OnDone,
              address: str | None = None) -> None:
    """Dispatch to `run_local` or `run_ray`."""
    if executor == "local":
        if address:
            raise PlannerInputError("--address applies to --executor ray only")
        run_local(tasks, workers, on_done)
        return
    if executor == "ray":
        run_ray(tasks, address, workers, on_done)
        return
    raise PlannerInputError(f"--executor: unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
