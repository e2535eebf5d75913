"""Reading a user's file (model spec, config.json, cluster, sweep or sharding file): a size cap, UTF-8 text,
JSON or YAML (a key given twice is an error, not a silent overwrite), each failure one line naming the file;
and the names such files give (models, clusters, pools), which reach plan.json, reports and launch files.

`models` and `hardware` import nothing else from each other: hardware reads its cluster and catalog files with
this module too (the one exception in pyproject.toml's import-linter contract).  Each package passes its own
error class.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

# Model specs, config.json, cluster, sweep and sharding files are kilobytes; refusing bigger ones before
# parsing bounds memory (a 58 MB spec used to reach 3.4 GB).
MAX_INPUT_BYTES = 8 * 2**20

# A model, cluster or pool name is shown in reports and launch-file comments and becomes part of job names and
# strategy specs: a conservative set, one line, nothing a shell, YAML or Slurm reads specially.  '/' joins a
# cluster's name and a pool's (a replica group's cluster), so a pool name has none (stage_pools=a/b splits there).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@/-]{0,127}")
NAME_RULE = "letters, digits and . _ + : @ - / only, starting with a letter or digit, at most 128 characters"


def shown(value: object, limit: int = 60) -> str:
    """`value` quoted for a one-line message: printable ASCII as it is, everything else escaped (a terminal never
    sees a raw escape sequence or line break), cut after `limit` characters."""
    text = str(value)
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return "'" + "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in cut) + "'"


def name_problem(value: object, slash: bool = True) -> str | None:
    """Why `value` is not a name (None when it is one); `slash`: whether it may hold '/' (a pool's may not)."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if not NAME.fullmatch(value):
        return f"{shown(value)} is not a name: use {NAME_RULE}"
    if not slash and "/" in value:
        return f"{shown(value)}: a pool name has no '/' (stage_pools=a/b separates pools with it)"
    return None


def as_name(text: str, fallback: str) -> str:
    """A name made from `text` that need not be one (a file or folder name): each run of other characters
    becomes '-'; `fallback` when nothing is left."""
    name = re.sub(r"[^A-Za-z0-9._+:@-]+", "-", text).lstrip("._+:@-")[:128].rstrip("-")  # no '/': one part
    return name or fallback


class _UniqueKeys(yaml.constructor.SafeConstructor):
    """construct_mapping refusing a key given twice in one mapping (PyYAML silently keeps the last); mixed in
    before a loader (whose SafeConstructor it extends)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        lines: dict = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if isinstance(key_node, yaml.ScalarNode) and not key_node.tag.endswith(":merge"):
                key = self.construct_object(key_node)
                if key in lines:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {lines[key]})", key_node.start_mark)
                lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


class UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """SafeLoader refusing a key given twice in one mapping: user files (its errors quote the offending line)."""


class DataLoader(_UniqueKeys, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """UniqueKeyLoader on libyaml's parser where PyYAML has it: the project's own data files (the catalog, read
    at every start, parses five times faster; its errors need no quoted line)."""


def read_text(path: str | Path, where: str, error: type[Exception], what: str = "file") -> str:
    """The text of a user file: a regular file of at most MAX_INPUT_BYTES of UTF-8, else `error` naming `where`."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{where}: is a directory, not a {what}")
    if p.exists() and not p.is_file():  # a FIFO or device: opening it would block, reading it might never end
        raise error(f"{where}: is not a regular file (a FIFO, socket or device), not a {what}")
    try:
        with p.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            # read one byte past the cap: a pipe or device file has no size to check beforehand
            data = handle.read(MAX_INPUT_BYTES + 1) if size <= MAX_INPUT_BYTES else b""
    except OSError as exc:
        raise error(f"{where}: cannot read: {exc.strerror or exc}") from None
    if size > MAX_INPUT_BYTES or len(data) > MAX_INPUT_BYTES:
        raise error(f"{where}: file too large ({max(size, len(data)) / 2**20:.1f} MiB or more); "
                    f"input files are limited to {MAX_INPUT_BYTES // 2**20} MiB")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark is harmless; any other non-UTF-8 byte is not
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                    "save the file as UTF-8") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (json keeps the last of a repeated key silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {shown(key)}")
        out[key] = value
    return out


def parse_json(text: str, where: str, error: type[Exception]) -> Any:
    """json.loads (a repeated key refused) with every failure as one `error` line naming `where`."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise error(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON: nested too deeply") from None


def parse_yaml(text: str, where: str, error: type[Exception]) -> Any:
    """YAML (repeated keys refused) with every failure as one `error` line naming `where`."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        # PyYAML messages span lines; keep the problem and its position on one
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise error(f"{where}: not valid YAML: {problem}{at}") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise error(f"{where}: not valid YAML: {exc}") from None
    except RecursionError:
        raise error(f"{where}: not valid YAML: nested too deeply") from None


def read_mapping(path: str | Path, where: str, error: type[Exception], what: str = "file") -> dict[str, Any]:
    """A YAML or JSON (by suffix) user file that must hold one mapping."""
    text = read_text(path, where, error, what)
    data = parse_json(text, where, error) if Path(path).suffix.lower() == ".json" else parse_yaml(text, where, error)
    if not isinstance(data, dict):
        raise error(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
    return data
