"""Interrupts: Ctrl-C and SIGTERM end a command with one line and a conventional exit code.

SIGTERM is turned into an exception as SIGINT is (KeyboardInterrupt), so that the
same unwinding runs for both: `planner.plan.output.write_outputs` removes its staging
folder on any BaseException, and nothing half-written is left beside the output.
OR-Tools must not replace the SIGINT handler for this to hold: the solvers set
`catch_sigint_signal = False` (CP-SAT otherwise restores SIG_DFL after a solve,
and a later Ctrl-C kills the process without any cleanup).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived.

    A BaseException, like KeyboardInterrupt, so `except Exception` does not swallow it, and not a
    KeyboardInterrupt, so click passes it through instead of printing its own "Aborted!".
    """

    def __init__(self, signal_name: str, exit_code: int) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_code = exit_code


def interrupted_by_sigint() -> Interrupted:
    return Interrupted("Ctrl-C", 130)


def _on_sigterm(signum: int, frame: Any) -> NoReturn:
    raise Interrupted("SIGTERM", 143)


def guarded(run: Callable[[], Any]) -> Any:
    """Call `run` with SIGTERM raising Interrupted; an interrupt prints one line and exits 130 or 143."""
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding application): leave its handlers alone
        pass
    try:
        try:
            return run()
        finally:
            # the command is done (or failing): a signal from here on must not turn a finished run into a
            # death by SIGINT during interpreter shutdown; one that lands before this line is caught below
            _ignore_signals()
    except KeyboardInterrupt:  # while the modules load, before click runs
        _leave(interrupted_by_sigint())
    except Interrupted as err:
        _leave(err)
    except Exception as err:
        found = _interrupt_inside(err)
        if found is None:
            raise
        _leave(found)


def _interrupt_inside(err: BaseException) -> Interrupted | None:
    """The interrupt a library turned into its own error, or None.  pydantic-core's serializer wraps an
    exception raised while it runs (the signal handler's) into a PydanticSerializationError that keeps only its
    text, so the chain and the text are both read."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, Interrupted):
            return seen
        if isinstance(seen, KeyboardInterrupt):
            return interrupted_by_sigint()
        seen = seen.__cause__ or seen.__context__
    text = str(err)
    if type(err).__name__ == "PydanticSerializationError":
        if "KeyboardInterrupt" in text:
            return interrupted_by_sigint()
        if "Interrupted" in text:
            return Interrupted("SIGTERM", 143)
    return None


def _ignore_signals() -> None:
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: its handlers are not ours to change
        pass


def _leave(err: Interrupted) -> NoReturn:
    _ignore_signals()  # further signals while exiting must not print a traceback either
    try:
        sys.stderr.write(f"Error: interrupted ({err.signal_name}); no output folder was left half-written\n")
        sys.stderr.flush()
    finally:
        sys.exit(err.exit_code)
