"""The architecture holds: no import cycles, and packages import only the layers beneath them.

The layers, lowest first (a module may import its own layer's package and any lower layer; packages
that share a layer know nothing of each other):

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
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "hardware", "planner")
CORE = ("planner", "planner.errors", "planner.job", "planner.profile", "planner.strategy", "planner.validation")
LAYERS: list[tuple[str, ...]] = [
    ("models", "hardware"),
    CORE,
    ("planner.cost",),
    ("planner.search",),
    ("planner.plan",),
    ("planner.embedding",),
    ("planner.emit",),
    ("planner.compare", "planner.simulate", "planner.runtime"),
    ("planner.sweep", "planner.replan"),
    ("planner.cli",),
    ("planner.__main__",),
]


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
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from pkg import module` names a module; `from module import name` the module itself
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the layer's package the module belongs to)."""
    best = None
    for index, layer in enumerate(LAYERS):
        for package in layer:
            if module == package or module.startswith(package + "."):
                if best is None or len(package) > len(best[1]):
                    best = (index, package)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def test_user_file_readers_are_twins():
    # models and hardware import nothing from each other, so each keeps the one user-file reader; the copies
    # may not drift apart
    assert (ROOT / "models" / "yamlio.py").read_bytes() == (ROOT / "hardware" / "yamlio.py").read_bytes()


def test_no_import_cycles():
    cycles = sorted(sorted(c) for c in nx.simple_cycles(import_graph()))
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_packages_import_only_lower_layers():
    wrong = []
    for source, target in import_graph().edges:
        (low, own), (high, other) = layer_of(target), layer_of(source)
        if own == other:
            continue
        if low > high or (low == high and own not in CORE):
            wrong.append(f"{source} -> {target}")
    assert wrong == [], "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_the_library_never_imports_click():
    clicky = []
    for name, data in import_graph().nodes(data=True):
        tree = ast.parse(data["path"].read_text(encoding="utf-8"))
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        if "click" in imported and not name.startswith("planner.cli"):
            clicky.append(name)
    assert clicky == []
