"""The architecture holds: no import cycles, and packages import only the layers beneath them; ruff is clean and
mypy finds no error.

The layers, lowest first (a module may import its own layer's package and any lower layer; packages
that share a layer know nothing of each other, except the core's modules, and hardware reads its files with
models.yamlio), as pyproject.toml's import-linter contract states them (`lint-imports`):

    models | hardware        the workload and the machine, independent of each other and of planner
    planner core             errors, job, profile, strategy, validation (and planner.__version__)
    planner.cost             evaluate(job, strategy): the one cost model
    planner.search           space, cost tables, CP-SAT programs, branch and bound, certificate
    planner.plan             plan.json, report.md and its figures, the atomic output folder
    planner.embedding        recommendation models: sharding and caching search, sharding plan files
    planner.emit             launch files per target
    planner.compare | planner.simulate | planner.runtime
    planner.sweep            grids of compare (and simulate) runs
    planner.replan           re-planning a compiled plan for a changed allocation (beside sweep)
    planner.cli              parse, call the library, print
    planner.__main__         `python -m planner`

Every import counts, also those inside functions and under TYPE_CHECKING: a cycle deferred to run
time is still a cycle in the design.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "hardware", "planner")
def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> module for every import between the project's own modules."""
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from((name, {"path": path}) for name, path in modules.items())
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                # `from pkg import module` names a module; `from module import name` the module itself
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


def test_the_layers_contract_holds():
    # pyproject.toml [tool.importlinter]: the layers above, checked by import-linter over every import (inside
    # functions and under TYPE_CHECKING too); models and hardware share only models.yamlio
    run = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--config", str(ROOT / "pyproject.toml"),
                          "--no-cache"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in run.stdout, run.stdout[-2000:]


def test_every_package_is_in_a_layer():
    # a module outside every layer would be constrained by nothing (import-linter's own exhaustive check
    # needs containers)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    named = {name.strip() for layer in config["layers"] for name in layer.replace(":", "|").split("|")}
    present = {f"planner.{p.stem}" for p in (ROOT / "planner").iterdir()
               if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert present - named == set(), "add these to pyproject.toml's layers"
    assert named - present - {"models", "hardware"} == set()


def test_no_import_cycles():
    cycles = sorted(sorted(c) for c in nx.simple_cycles(import_graph()))
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_ruff_is_clean():
    # pyproject.toml [tool.ruff]: the style card (lines within 120 characters) and pyflakes, over the whole tree
    run = subprocess.run([str(Path(sys.executable).with_name("ruff")), "check", "--no-cache", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_mypy_is_clean():
    # pyproject.toml [tool.mypy]: planner/, models/ and hardware/ type-check under pydantic's plugin; mypy's cache
    # (.mypy_cache, git-ignored) makes a rerun incremental
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--cache-dir", str(ROOT / ".mypy_cache")],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "Success: no issues found" in run.stdout, run.stdout[-2000:]
