"""A free TCP port for the end-to-end launches (torchrun / DeepSpeed rendezvous), and the mark that
runs those launches one at a time.

Fixed ports collide with a port still in TIME_WAIT from an earlier run, or with
another test session on the same machine; asking the kernel for one does not.
"""

from __future__ import annotations

import socket

import pytest


def MULTIPROCESS(test):  # noqa: N802 (reads as a mark)
    """Mark a test that starts several processes (torchrun, DeepSpeed, Ray).

    One launch already keeps 2 cores busy; two at once only slow each other towards their
    rendezvous and subprocess timeouts.  `tests/conftest.py` holds a lock file around every test
    marked `multiprocess`, so they run one after another whatever the pytest-xdist worker (the
    xdist_group mark alone does not: pytest-xdist 3.8 names the group through `item._nodeid`,
    which pytest 9 no longer reads, so `--dist loadgroup` spread them over the workers).
    `python -m pytest -m multiprocess` selects them (tests/repeat_runs.sh).
    """
    return pytest.mark.multiprocess(pytest.mark.xdist_group("multiprocess")(test))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
