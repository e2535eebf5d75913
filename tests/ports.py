"""A free TCP port for the end-to-end launches (torchrun / DeepSpeed rendezvous).

Fixed ports collide with a port still in TIME_WAIT from an earlier run, or with
another test session on the same machine; asking the kernel for one does not.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
