"""The manifest of an output folder: which files planner wrote there, with their sizes and SHA-256.

Every folder planner writes (compile, replan, sweep) holds `planner-manifest.json`.  `--force` replaces a
folder only when everything in it is in its manifest, unchanged: a file a user added (notes, checkpoints a
launch wrote into the folder) or edited, a link, an empty folder, or no manifest at all stops the replace,
and the message names the first such entry (docs/design.md principle 7: `--force` only ever replaces what
planner wrote).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

MANIFEST = "planner-manifest.json"
SCHEMA = "planner.manifest/1"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_text(files: dict[str, bytes]) -> str:
    """planner-manifest.json of `files` (relative path -> content): sorted, one file a line (deterministic)."""
    entries = {name: {"bytes": len(data), "sha256": _digest(data)} for name, data in sorted(files.items())}
    return json.dumps({"schema": SCHEMA, "files": entries}, indent=1, sort_keys=True) + "\n"


def _read_manifest(folder: Path) -> dict[str, dict] | str:
    """The manifest's entries, or why there are none."""
    path = folder / MANIFEST
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"the folder holds no {MANIFEST} (planner did not write it, or an older planner did)"
    if not stat.S_ISREG(info.st_mode):
        return f"its {MANIFEST} is not a regular file"
    try:
        data = json.loads(path.read_bytes())
        files = data["files"] if data.get("schema") == SCHEMA else None
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        files = None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return f"its {MANIFEST} is not one planner wrote"
    return files


def _file_matches(path: Path, entry: dict) -> bool:
    """Whether the regular file at `path` is the one the manifest entry describes (size first: a big file
    that replaced a small one is not read)."""
    if os.lstat(path).st_size != entry.get("bytes"):
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == entry.get("sha256")


def _entry_problem(folder: Path, relative: str, files: dict[str, dict], parents: set[str]) -> str | None:
    """Why the entry `relative` of `folder` is not planner's own, or None."""
    info = os.lstat(folder / relative)
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link planner did not write"
    if stat.S_ISDIR(info.st_mode):
        return None if relative in parents else "a folder planner did not write"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if relative == MANIFEST:
        return None
    if relative not in files:
        return "not written by planner"
    if not _file_matches(folder / relative, files[relative]):
        return "changed since planner wrote it"
    return None


def output_folder_holding(path: Path) -> Path | None:
    """The planner output folder (one with a manifest) that `path` is, or lies inside; None when there is none."""
    where = Path(path).absolute().resolve()
    return next((p for p in (where, *where.parents) if (p / MANIFEST).is_file()), None)


def foreign_entry(folder: Path) -> str | None:
    """None when everything in `folder` is a file its manifest lists, unchanged (or a folder holding one);
    else one line naming the first entry that is not (in sorted order), or the missing manifest."""
    files = _read_manifest(folder)
    if isinstance(files, str):
        return files
    parents = {str(Path(name).parents[i]) for name in files for i in range(len(Path(name).parents) - 1)}
    unreadable: list[OSError] = []  # a folder os.walk cannot list: its contents are unknown
    for root, dirs, names in os.walk(folder, onerror=unreadable.append):
        dirs.sort()
        base = Path(root).relative_to(folder)
        for name in sorted(dirs + names):
            relative = (base / name).as_posix()
            try:
                problem = _entry_problem(folder, relative, files, parents)
            except OSError as err:  # unreadable, or gone meanwhile: not provably planner's
                problem = f"not readable ({err.strerror or err})"
            if problem is not None:
                return f"{relative} is {problem}"
    if unreadable:
        return f"{Path(unreadable[0].filename).relative_to(folder).as_posix()} is not readable"
    return None
