"""Atomic output directories (docs/design.md principle 7: no half-written plan on error).

`write_outputs` writes every file, and the folder's manifest (planner/plan/manifest.py: each file's
size and SHA-256), into a fresh temporary directory beside the target, then renames it into place.  An
existing target is replaced only with `force`, only when everything in it is a file its manifest lists,
unchanged, and then by a rename too: the old directory is moved aside, checked again there (nothing can
change it under that name), the new one moved in, and the old one removed; if the check or the swap
fails the old one is put back.  Either the complete new output is there, or what was there before.

Paths whose replacement would cost the user data are refused outright: the
filesystem root, the home directory, the current directory or one of its
parents, and the root of a git repository.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from planner.errors import PlannerInputError
from planner.plan.manifest import MANIFEST, foreign_entry, manifest_text


def _check_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or name.endswith("/"):
        raise ValueError(f"output file name {name!r} must be a relative path inside the output directory")
    return path


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def refuse_unsafe_path(out_dir: Path | str) -> None:
    """Raise PlannerInputError for an output path that must never be written or replaced."""
    if str(out_dir).strip() == "":
        raise PlannerInputError("output directory: empty path; name a new folder, e.g. -o out/plan")
    target = Path(out_dir).expanduser().resolve()
    cwd = Path.cwd().resolve()
    why = None
    if target == Path(target.anchor):
        why = "is the filesystem root"
    elif target == Path.home().resolve():
        why = "is the home directory"
    elif target == cwd or target in cwd.parents:
        why = "is the current directory" if target == cwd else "holds the current directory"
    elif (target / ".git").exists():
        why = "is the root of a git repository"
    if why is not None:
        raise PlannerInputError(f"output directory {out_dir}: {why}; name a new folder, e.g. -o out/plan")


def _not_planners(out_dir: Path, problem: str) -> PlannerInputError:
    return PlannerInputError(f"{out_dir}: --force replaces only what planner wrote: {problem}; nothing was "
                             "replaced (move it out of the folder, or choose another folder)")


def check_output_dir(out_dir: Path, force: bool = False) -> None:
    """Raise PlannerInputError unless `out_dir` may be written.

    It may when it is absent or an empty directory, or, with `force`, a directory that holds only what planner
    wrote there (its manifest's files, unchanged).
    """
    refuse_unsafe_path(out_dir)
    out_dir = Path(out_dir)
    if out_dir.is_symlink():  # the folder is renamed into place: a link would be replaced, not written through
        raise PlannerInputError(f"{out_dir} is a symbolic link (to {os.readlink(out_dir)}); name the folder itself")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise PlannerInputError(f"{out_dir} exists and is not a directory")
        if not any(out_dir.iterdir()):
            return
        if not force:
            raise PlannerInputError(f"{out_dir} exists; use --force to replace planner's earlier output there")
        problem = foreign_entry(out_dir)
        if problem is not None:
            raise _not_planners(out_dir, problem)


def write_outputs(out_dir: Path, files: dict[str, str | bytes], force: bool = False) -> None:
    """Write `files` (relative path -> text or bytes) as the directory `out_dir`, atomically.

    Raises PlannerInputError when `out_dir` may not be written (see `check_output_dir`), also when a
    directory appeared there while planner was working (two runs racing for one folder: one wins).
    """
    out_dir = Path(out_dir)
    names = {name: _check_name(name) for name in files}
    if MANIFEST in files:
        raise ValueError(f"{MANIFEST} is written by write_outputs itself")
    data = {name: content.encode("utf-8") if isinstance(content, str) else content for name, content in files.items()}
    data[MANIFEST] = manifest_text(data).encode("utf-8")
    names[MANIFEST] = PurePosixPath(MANIFEST)
    check_output_dir(out_dir, force)
    parent = out_dir.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlannerInputError(f"{out_dir}: cannot create the parent directory ({err.strerror})") from None
    with signals_held():  # an interrupt waits until the folder is whole, or gone, and nothing is left beside it
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
        except OSError as err:
            raise PlannerInputError(f"{out_dir}: cannot write beside it ({err.strerror})") from None
        try:
            os.chmod(staging, _umask_mode())
            for name, content in sorted(data.items()):
                _write_file(staging.joinpath(*names[name].parts), content)
            _swap_in(staging, out_dir.absolute(), force)
        except OSError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise PlannerInputError(f"{out_dir}: cannot write ({err.strerror or err})") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs; a signal that came meanwhile is delivered after it
    (the command line does the same while its modules import: planner/cli/__init__.py)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs handlers in the main thread only; another thread has nothing to hold back
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _write_file(target: Path, content: str | bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8") if isinstance(content, str) else content
    with open(target, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    if target.suffix == ".sh":
        target.chmod(0o755)  # launch scripts run as they are


def _appeared(out_dir: Path) -> PlannerInputError:
    return PlannerInputError(f"{out_dir} appeared while planner was working (another run?); nothing was replaced")


def _swap_in(staging: Path, out_dir: Path, force: bool) -> None:
    """Rename `staging` to `out_dir`; with `force`, replace planner's earlier output (moved aside, then removed).

    rename(2) onto a non-empty directory fails, so a folder that another run filled since the
    check is never replaced silently; the existing folder is re-checked here, not trusted, once it is
    moved aside, where nothing writes into it by its name any more.
    """
    if out_dir.exists() and any(out_dir.iterdir()):
        if not force:
            raise _appeared(out_dir)
        backup = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rmdir(backup)  # only its unique name is wanted
        os.rename(out_dir, backup)
        problem = foreign_entry(backup)
        if problem is not None:
            os.rename(backup, out_dir)
            raise _not_planners(out_dir, problem)
        try:
            _rename_into(staging, out_dir)
        except BaseException:
            os.rename(backup, out_dir)
            raise
        shutil.rmtree(backup, ignore_errors=True)
        return
    _rename_into(staging, out_dir)


def _rename_into(staging: Path, out_dir: Path) -> None:
    try:
        os.rename(staging, out_dir)  # succeeds onto nothing or an empty directory only
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise _appeared(out_dir) from None
        raise


def _through_links(path: Path) -> Path:
    """Where writing `path` lands, as cp writes it: through a symbolic link (a dangling one too) to its target."""
    return Path(os.path.realpath(path))


def _existing_file(path: Path, shown: Path) -> os.stat_result | None:
    """The status of the file at `path` (links followed), None when there is none; PlannerInputError naming
    `shown` when it is no regular file planner may replace (a directory, FIFO, socket or device; read-only)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise PlannerInputError(f"{shown}: cannot write ({err.strerror or err})") from None
    if stat.S_ISDIR(info.st_mode):
        raise PlannerInputError(f"{shown}: is a directory; name a file")
    if not stat.S_ISREG(info.st_mode):
        raise PlannerInputError(f"{shown}: is not a regular file (a FIFO, socket or device); name a file")
    if not info.st_mode & stat.S_IWUSR or not os.access(path, os.W_OK):
        raise PlannerInputError(f"{shown}: is read-only; planner does not overwrite it (make it writable, or "
                                "name another file)")
    return info


def check_file_target(path: Path) -> None:
    """Raise PlannerInputError now, before any work, when the file `path` could not be written later."""
    path = Path(path)
    target = _through_links(path)
    if _existing_file(target, path) is not None:
        return
    folder = next((p for p in (target.parent, *target.parents) if p.exists()), None)
    if folder is None or not folder.is_dir():
        raise PlannerInputError(f"{path}: cannot create its folder")
    if not os.access(folder, os.W_OK):
        raise PlannerInputError(f"{path}: cannot write (permission denied)")


def write_file(path: Path, content: str | bytes) -> None:
    """Write one file as `cp` would, but whole or not at all: through a symbolic link to its target, keeping an
    existing file's permissions (and, as root, its owner); a directory, FIFO, device or read-only file is
    refused.  The bytes go to a temporary file beside the target, renamed over it."""
    path = Path(path)
    target = _through_links(path)
    data = content.encode("utf-8") if isinstance(content, str) else content
    info = _existing_file(target, path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    except OSError as err:
        raise PlannerInputError(f"{path}: cannot write ({err.strerror or err})") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(tmp_name, stat.S_IMODE(info.st_mode) if info is not None else 0o666 & _umask_mode())
        if info is not None and os.geteuid() == 0:
            os.chown(tmp_name, info.st_uid, info.st_gid)
        os.replace(tmp_name, target)
    except OSError as err:
        Path(tmp_name).unlink(missing_ok=True)
        raise PlannerInputError(f"{path}: cannot write ({err.strerror or err})") from None
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
