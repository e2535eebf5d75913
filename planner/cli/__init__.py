"""The command line: parses arguments, calls the library, prints (see app.py).

`main` holds SIGINT and SIGTERM back while it imports the commands, inside its
interrupt guard, so that Ctrl-C while the heavy libraries load prints one line,
not a traceback.  Only the standard library loads before the guard.
"""

from __future__ import annotations

import signal
from typing import Any

from planner.cli.signals import guarded

_HELD = {signal.SIGINT, signal.SIGTERM}


def main(*args: Any, **kwargs: Any) -> Any:
    """Console-script entry point (`planner`, `python -m planner`)."""

    def run() -> Any:
        # A signal during the imports waits until they are done (raised inside importlib's own callbacks,
        # KeyboardInterrupt is swallowed: "Exception ignored in ... _get_module_lock", and the run goes on);
        # one that came meanwhile is delivered when the mask is restored, inside the guard.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            from planner.cli.app import cli
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return cli.main(*args, **kwargs)

    return guarded(run)


def __getattr__(name: str) -> Any:
    # `from planner.cli import cli` for tests and embedders, without importing click at package import.
    if name == "cli":
        from planner.cli.app import cli

        return cli
    raise AttributeError(name)


__all__ = ["cli", "main"]
