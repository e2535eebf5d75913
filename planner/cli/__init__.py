"""The command line: parses arguments, calls the library, prints (see app.py).

`main` imports the commands inside its interrupt guard, with the signals held
back until the imports are done, so that Ctrl-C while the heavy libraries load
prints one line, not a traceback.
"""

from __future__ import annotations

from typing import Any

from planner.cli.signals import guarded
from planner.plan.output import signals_held


def main(*args: Any, **kwargs: Any) -> Any:
    """Console-script entry point (`planner`, `python -m planner`)."""

    def run() -> Any:
        # A signal during the imports waits until they are done: raised inside importlib's own callbacks,
        # KeyboardInterrupt is swallowed ("Exception ignored in ... _get_module_lock") and the run goes on.
        with signals_held():
            from planner.cli.app import cli
        return cli.main(*args, **kwargs)

    return guarded(run)


def __getattr__(name: str) -> Any:
    # `from planner.cli import cli` for tests and embedders, without importing click at package import.
    if name == "cli":
        from planner.cli.app import cli

        return cli
    raise AttributeError(name)


__all__ = ["cli", "main"]
