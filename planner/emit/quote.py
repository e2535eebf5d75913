"""Values written into launch files, quoted for each file's language.

Names and launch inputs are validated where they enter (models/yamlio.py `name_problem`, LaunchInputs), but
an emitter may be handed anything (a library caller, an edited plan.json): every value goes through one of
these, so that a value is always data, never code, in every language the launch files speak:

* `comment`: text for a `#` comment line (shell, YAML, TOML): printable ASCII only, every other character
  escaped, so nothing ends the comment (YAML also breaks lines at U+0085, U+2028 and U+2029);
* `sh`: one bash word (launch.sh and job.sbatch are bash scripts); `argument`: one argument of an argv;
* `toml_string`: a TOML basic string;
* `sbatch_value`: a value of an `#SBATCH --key=value` directive, which Slurm splits at white space and
  `#` with no escape at all: only a conservative character set passes.

YAML and JSON files are written by their libraries' dumpers, which quote by themselves.
"""

from __future__ import annotations

import re
import shlex

from planner.errors import PlannerInputError

_SBATCH_SAFE = re.compile(r"[A-Za-z0-9._,:%@/+=-]+")


def _escaped(char: str) -> str:
    """A character as Python writes it in a string literal: \\n, \\x1b, \\u2028."""
    return char.encode("unicode_escape").decode("ascii")


def comment(text: str) -> str:
    """`text` as the body of a one-line comment: printable ASCII as it is, every other character escaped."""
    return "".join(c if " " <= c <= "~" else _escaped(c) for c in str(text))


def argument(value: object) -> str:
    """`value` as one argument of an argv with no shell (Kubernetes' `command`): PlannerInputError for a NUL,
    which ends an argument wherever the kernel reads one."""
    text = str(value)
    if "\x00" in text:
        raise PlannerInputError(f"launch input '{comment(text)}': holds a NUL character, which no command line "
                                "can carry")
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise PlannerInputError(f"launch input '{comment(text)}': holds a lone surrogate, no Unicode character")
    return text


def sh(value: object) -> str:
    """`value` as one bash word: shlex's single quotes for printable text, ANSI-C `$'...'` when it holds a
    control character (a line break stays inside the word, and the script stays one line per command).
    A NUL cannot be part of any command-line argument: PlannerInputError."""
    text = argument(value)
    if all(c >= " " and c != "\x7f" for c in text):
        return shlex.quote(text)
    body = "".join(
        "\\\\" if c == "\\" else "\\'" if c == "'" else f"\\x{ord(c):02x}" if c < " " or c == "\x7f" else c
        for c in text)
    return f"$'{body}'"


def toml_string(value: str) -> str:
    """`value` as a TOML basic string: printable ASCII as it is, every other character as \\uXXXX or
    \\UXXXXXXXX (JSON's surrogate pairs are no TOML escape)."""
    text = str(value)
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise PlannerInputError(f"'{comment(text)}': holds a lone surrogate, no Unicode character")
    return '"' + "".join(
        "\\" + c if c in '"\\' else c if " " <= c <= "~" else f"\\u{ord(c):04x}" if ord(c) < 0x10000
        else f"\\U{ord(c):08x}" for c in text) + '"'


def sbatch_value(value: str, field: str) -> str:
    """`value` for an #SBATCH directive, or PlannerInputError naming `field` when Slurm would split or cut it."""
    if not _SBATCH_SAFE.fullmatch(value):
        raise PlannerInputError(f"{field} '{comment(value)}': an #SBATCH directive takes letters, digits and "
                                "._,:%@/+=- only")
    return value
