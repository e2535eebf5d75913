"""How a distributed run ends: every rank past its last collective, the groups destroyed, then the
process leaves without finalizing the interpreter.

Why not a plain return.  The process groups that DeviceMesh, FSDP2, the pipeline stages and DTensor's
sharding-propagation caches hold outlive `destroy_process_group()` (it only unregisters them), and so do
their gloo worker threads (`pt_gloo_runloop`, two per group, and `gloo_tcp_loop`): after
`destroy_process_group()` and `gc.collect()` a pp=2 x cp=2 rank still runs all ten of its threads.  A
worker drops its finished work (and the work's tensors) only after the rank waiting on it has moved on;
when that happens while the main thread finalizes the interpreter, freeing the tensors' Python objects
takes the GIL, CPython ends the thread with pthread_exit, and the forced unwind through a noexcept C++
destructor calls std::terminate: "terminate called without an active exception", SIGABRT, after the run
has finished and printed its losses.  Loaded machines make the worker late (two torchrun launches on two
cores: the test suite's case).

Once every rank is past the final barrier no collective is left, so each rank flushes its output and
leaves with `os._exit`: no interpreter finalization races those threads.  A rank that fails prints its
traceback and leaves the same way, with exit status 1, without waiting for the others (they fail on
their next collective, and torchrun stops the job).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

import torch.distributed as dist


def finish(exit_code: int = 0) -> NoReturn:
    """Barrier, destroy the process groups, flush, and leave the process with `exit_code`."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank done with its collectives before any leaves
        dist.destroy_process_group()
    _leave(exit_code)


def run_then_finish(main: Callable[[], object]) -> NoReturn:
    """Run a rank's `main()`, then `finish()`; an exception prints its traceback and leaves with status 1."""
    try:
        main()
    except SystemExit as err:  # argparse errors and the like keep their status
        _leave(err.code if isinstance(err.code, int) else (0 if err.code is None else 1))
    except BaseException:  # noqa: BLE001 (a rank that fails must still leave without finalizing)
        traceback.print_exc()
        _leave(1)
    finish(0)


def _leave(exit_code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
