"""A free TCP port for the end-to-end launches (torchrun / DeepSpeed rendezvous), and the mark that
runs those launches one at a time.

Fixed ports collide with a port still in TIME_WAIT from an earlier run, or with
another test session on the same machine; asking the kernel for one does not.
"""

from __future__ import annotations

import fcntl
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def MULTIPROCESS(test):  # noqa: N802 (reads as a mark)
    """Mark a test that starts several processes (torchrun, DeepSpeed, Ray).

    One launch already keeps 2 cores busy; two at once only slow each other towards their
    rendezvous and subprocess timeouts.  The xdist_group mark sends them all to one pytest-xdist worker
    under the suite's `--dist loadgroup`, where they run one after another while the other workers run
    the rest (pytest-xdist 3.8 names the group through `item._nodeid`, which pytest 9 no longer reads, so
    tests/conftest.py's scheduler reads the mark itself).  `tests/conftest.py` also holds a lock file
    around each, so that any other mode (`--dist load`) runs them one at a time too.
    `python -m pytest -m multiprocess` selects them (tests/repeat_runs.sh).
    """
    return pytest.mark.multiprocess(pytest.mark.xdist_group("multiprocess")(test))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_held = 0  # this process's depth in one_launch_at_a_time


@contextmanager
def one_launch_at_a_time(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hold the session's launch lock (a file every pytest-xdist worker opens): around each MULTIPROCESS
    test (tests/conftest.py), and around a shared fixture's launch.  Re-entrant within a process: a shared
    fixture may be set up inside a test that already holds it (request.getfixturevalue), and flock on a
    second open of the file would wait for the first forever."""
    global _held
    if _held:
        _held += 1
        try:
            yield
        finally:
            _held -= 1
        return
    # every worker's basetemp (…/popen-gwN) sits in the session's shared folder
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if root.name.startswith("popen-gw") else root
    with open(shared / "multiprocess.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _held = 1
        try:
            yield
        finally:
            _held = 0
            fcntl.flock(lock, fcntl.LOCK_UN)
