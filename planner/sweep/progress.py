"""A small text progress bar on stderr: done/total, elapsed, ETA (no dependency).

On a terminal the bar redraws in place (carriage return); elsewhere (a log
file, CI) each update is its own line, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """`advance(label)` once per finished task; `close()` ends the line."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24, prefix: str = "sweep"):
        self.total, self.width, self.prefix = total, width, prefix
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.start = time.monotonic()
        self.inline = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self, label: str = "") -> str:
        """The bar as text (no newline)."""
        elapsed = time.monotonic() - self.start
        filled = self.width * self.done // max(1, self.total)
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        text = (f"{self.prefix} [{'#' * filled}{'-' * (self.width - filled)}] {self.done}/{self.total} "
                f"elapsed {_clock(elapsed)} ETA {'?' if eta is None else _clock(eta)}")
        return f"{text}  {label}" if label else text

    def advance(self, label: str = "") -> None:
        """One more task done; redraw."""
        self.done += 1
        if self.inline:
            self.stream.write("\r\033[K" + self.line(label))
        else:
            self.stream.write(self.line(label) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Finish the in-place line."""
        if self.inline:
            self.stream.write("\n")
            self.stream.flush()
