"""The command line: parses arguments, calls the library, prints (see app.py).

`main` imports the commands inside its interrupt guard, so that Ctrl-C while
the heavy libraries load prints one line, not a traceback.
"""

from __future__ import annotations

from typing import Any

from planner.cli.signals import guarded


def main(*args: Any, **kwargs: Any) -> Any:
    """Console-script entry point (`planner`, `python -m planner`)."""

    def run() -> Any:
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
