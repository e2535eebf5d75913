"""Where sweep tasks run: local worker processes (default) or a Ray cluster.

Both take the tasks and a callback called once per finished task (in
completion order) and return the results in task order, so the output does
not depend on the executor or on scheduling.

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

import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from planner.errors import PlannerInputError
from planner.sweep.tasks import SweepTask, TaskResult, run_task

OnDone = Callable[[SweepTask, TaskResult], None]
EXECUTORS = ("local", "ray")


def run_local(tasks: Sequence[SweepTask], workers: int, on_done: OnDone) -> list[TaskResult]:
    """Run every task in `workers` processes (inline when 1); results in task order."""
    results: dict[int, TaskResult] = {}
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            results[task.index] = run_task(task)
            on_done(task, results[task.index])
    else:
        pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)))
        try:
            futures = {pool.submit(run_task, task): task for task in tasks}
            for future in as_completed(futures):
                task = futures[future]
                results[task.index] = future.result()
                on_done(task, results[task.index])
        finally:
            # on Ctrl-C or a failed task, drop the queued tasks instead of running them all first
            pool.shutdown(wait=True, cancel_futures=True)
    return [results[task.index] for task in tasks]


def _import_ray():
    try:
        import ray
    except ImportError:
        raise PlannerInputError("--executor ray: ray is not installed; pip install 'planner[ray]'") from None
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


def run_ray(tasks: Sequence[SweepTask], address: str | None, workers: int, on_done: OnDone) -> list[TaskResult]:
    """Run every task as a Ray task (see the module docstring); results in task order."""
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
        pending = {remote.remote(task): task for task in tasks}
        results: dict[int, TaskResult] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                results[task.index] = ray.get(ref)
                on_done(task, results[task.index])
        return [results[task.index] for task in tasks]
    finally:
        if started:
            ray.shutdown()


def run_tasks(tasks: Sequence[SweepTask], executor: str, workers: int, on_done: OnDone,
              address: str | None = None) -> list[TaskResult]:
    """Dispatch to `run_local` or `run_ray`."""
    if executor == "local":
        if address:
            raise PlannerInputError("--address applies to --executor ray only")
        return run_local(tasks, workers, on_done)
    if executor == "ray":
        return run_ray(tasks, address, workers, on_done)
    raise PlannerInputError(f"--executor: unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
