"""Atomic output directories (DESIGN.md principle 7: no half-written plan on error).

`write_outputs` writes every file into a fresh temporary directory beside the
target, then renames it into place.  An existing target is replaced only with
`force`, and then by a rename too: the old directory is moved aside, the new
one moved in, and the old one removed; if the swap fails the old one is put
back.  Either the complete new output is there, or what was there before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from planner.errors import PlannerInputError


def _check_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or name.endswith("/"):
        raise ValueError(f"output file name {name!r} must be a relative path inside the output directory")
    return path


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def check_output_dir(out_dir: Path, force: bool = False) -> None:
    """Raise PlannerInputError unless `out_dir` may be written: absent, empty, or `force` (a directory)."""
    out_dir = Path(out_dir)
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir():
            raise PlannerInputError(f"{out_dir} exists and is not a directory")
        if not force and any(out_dir.iterdir()):
            raise PlannerInputError(f"{out_dir} exists; use --force")


def write_outputs(out_dir: Path, files: dict[str, str | bytes], force: bool = False) -> None:
    """Write `files` (relative path -> text or bytes) as the directory `out_dir`, atomically.

    Raises PlannerInputError when `out_dir` exists and is not empty (unless
    `force`), or is not a directory.
    """
    out_dir = Path(out_dir)
    names = {name: _check_name(name) for name in files}
    check_output_dir(out_dir, force)
    parent = out_dir.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlannerInputError(f"{out_dir}: cannot create the parent directory ({err.strerror})") from None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    except OSError as err:
        raise PlannerInputError(f"{out_dir}: cannot write beside it ({err.strerror})") from None
    try:
        os.chmod(staging, _umask_mode())
        for name, content in sorted(files.items()):
            target = staging.joinpath(*names[name].parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode("utf-8") if isinstance(content, str) else content
            with open(target, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if target.suffix == ".sh":
                target.chmod(0o755)  # launch scripts run as they are
        _swap_in(staging, out_dir.absolute())
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise PlannerInputError(f"{out_dir}: cannot write ({err.strerror or err})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Rename `staging` to `out_dir`, replacing an existing `out_dir` (moved aside, then removed)."""
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    backup = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rmdir(backup)  # only its unique name is wanted
    os.rename(out_dir, backup)
    try:
        os.rename(staging, out_dir)
    except BaseException:
        os.rename(backup, out_dir)
        raise
    shutil.rmtree(backup, ignore_errors=True)
