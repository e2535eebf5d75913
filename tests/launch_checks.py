"""What every launch file must hold whatever values it carries: each file parses in its own language to
exactly the commands and objects meant, and comments stay comments.  tests/test_hostile_inputs.py and the
fuzz test (tests/test_fuzz_cli.py) run these on files written with hostile names and inputs.

* shell (`*.sh`, `job.sbatch`): `bash -n` accepts it, and every comment line is printable ASCII (a value's
  line break would end the comment and run the rest);
* `job.sbatch`: the #SBATCH directives as Slurm reads them (it stops at the first line that is not a
  comment) are exactly the ones named, and no directive line hides below that point;
* YAML: one document per file, and `#` lines printable ASCII (YAML also breaks lines at U+0085, U+2028, U+2029);
* TOML: it loads, to exactly the sections named;
* JSON: it loads.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import PurePosixPath

import yaml


def comment_lines(text: str) -> list[str]:
    """Lines of a shell, YAML or TOML file that start a comment (the shebang included)."""
    return [line for line in text.split("\n") if line.lstrip().startswith("#")]


def printable_ascii(line: str) -> bool:
    return all(" " <= c <= "~" for c in line)


def bash_syntax_error(path: str) -> str | None:
    """bash -n's complaint about the script at `path` (None: it parses)."""
    proc = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=60)
    return None if proc.returncode == 0 and not proc.stderr else proc.stderr or f"exit {proc.returncode}"


def sbatch_directives(text: str) -> tuple[list[str], list[str]]:
    """(the directives Slurm reads, #SBATCH lines below where it stops): sbatch takes `#SBATCH` lines from the
    top of the script and stops at the first line that is neither blank nor a comment."""
    read, rest = [], []
    stopped = False
    for line in text.split("\n")[1:]:
        if not stopped and (not line.strip() or line.startswith("#")):
            if line.startswith("#SBATCH"):
                read.append(line.removeprefix("#SBATCH").strip())
            continue
        stopped = True
        if line.lstrip().startswith("#SBATCH"):
            rest.append(line)
    return read, rest


def sbatch_keys(directives: list[str]) -> list[str]:
    """The option names of #SBATCH directives (`--nodes=2` -> `--nodes`)."""
    return [d.split("=", 1)[0].split()[0] for d in directives]


def check_files(files: dict[str, str], folder: str, toml_sections: set[str] | None = None,
                sbatch: set[str] | None = None) -> list[str]:
    """Problems of `files` (relative path -> text) as written to `folder` on disk; [] when they hold."""
    problems = []
    for name, text in sorted(files.items()):
        path = str(PurePosixPath(folder) / name)
        suffix = PurePosixPath(name).suffix
        if suffix in (".sh", ".sbatch", ".yaml", ".toml"):
            bad = [line for line in comment_lines(text) if not printable_ascii(line)]
            if bad:
                problems.append(f"{name}: comment carries raw text: {bad[0]!r}")
        if suffix in (".sh", ".sbatch"):
            error = bash_syntax_error(path)
            if error:
                problems.append(f"{name}: bash -n: {error}")
        if suffix == ".sbatch":
            read, rest = sbatch_directives(text)
            if rest:
                problems.append(f"{name}: #SBATCH lines Slurm does not read: {rest}")
            if sbatch is not None and sorted(sbatch_keys(read)) != sorted(sbatch):
                problems.append(f"{name}: directives {sbatch_keys(read)}, expected {sorted(sbatch)}")
        if suffix == ".yaml":
            documents = list(yaml.safe_load_all(text))
            if len(documents) != 1:
                problems.append(f"{name}: {len(documents)} YAML documents")
        if suffix == ".toml":
            sections = set(tomllib.loads(text))
            if toml_sections is not None and sections != toml_sections:
                problems.append(f"{name}: sections {sorted(sections)}, expected {sorted(toml_sections)}")
        if suffix == ".json":
            json.loads(text)
    return problems
