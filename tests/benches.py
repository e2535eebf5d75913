"""Load a benchmark script of tests/bench as a module, once per process (the tests that run or check them).

The scripts are not a package (they run as `python tests/bench/NAME.py`); their dataclasses resolve
annotations through sys.modules, so the module is registered under its name before it runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent / "bench"


def load_bench(name: str) -> ModuleType:
    """tests/bench/NAME.py as module NAME (the one already loaded, if any)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
