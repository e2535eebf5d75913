"""The command line: parses arguments, calls the library, prints (see app.py)."""

from planner.cli.app import cli, main

__all__ = ["cli", "main"]
