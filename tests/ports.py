"""A free TCP port for the end-to-end launches (torchrun / DeepSpeed rendezvous), and the mark that
runs those launches one at a time under pytest-xdist.

Fixed ports collide with a port still in TIME_WAIT from an earlier run, or with
another test session on the same machine; asking the kernel for one does not.
"""

from __future__ import annotations

import socket

import pytest

# Tests that start several processes (torchrun, DeepSpeed, Ray) share one xdist group, so that
# `--dist loadgroup` (pyproject.toml addopts) runs them one after another on one worker while the
# other workers take the single-process tests: one launch already keeps 2 cores busy, and two at
# once only slow each other towards their rendezvous and subprocess timeouts.
MULTIPROCESS = pytest.mark.xdist_group("multiprocess")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
