"""Messages as the terminal shows them: control characters escaped, one line (standard library only: the
command group reports usage errors with these before any command module loads)."""

from __future__ import annotations

import unicodedata

__all__ = ["one_line", "printable"]


def printable(message: str) -> str:
    """`message` with every control or format character but the line break escaped: a name or path quoted in
    an error never reaches the terminal as an escape sequence."""
    return "".join(c if c == "\n" or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp")
                   else c.encode("unicode_escape").decode("ascii") for c in str(message))


def one_line(message: str) -> str:
    """Collapse a message to one printable line (library messages should already be one)."""
    return printable(" ".join(str(message).split()))
