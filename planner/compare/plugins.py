"""Strategies of the user's own, scored by `compare` and `sweep` like the built-in baselines.

A sweep file's (or `compare --strategies FILE`'s) `strategies` list takes, beside the built-in names:

    strategies:
      - planner
      - {name: my-tp4, spec: "tp=4,pp=2,mbs=1,zero=1,recompute=selective"}
      - {name: paper-recipe, module: "recipes:llama_recipe", runtime: megatron}

`spec` is a fixed SPEC string; `module` is `package.module:function`, a Python callable taking the `Job`
and returning a `Strategy` (or None when the recipe has nothing for that job).  Modules are imported with
the strategies file's folder first on `sys.path`, in the driver (a bad name is one error line before any
solve) and again in each worker.  Each is costed by `evaluate` under `runtime` (a profile name), or the
job's runtime, exactly as a built-in fixed-strategy row; the row's runtime column names it.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.errors import PlannerInputError
from planner.job import Job
from planner.profile import load_runtime, runtime_names
from planner.strategy import Strategy, parse_strategy

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class UserStrategy(BaseModel):
    """One strategy of the user's own: a fixed SPEC, or a callable that returns a Strategy for a job."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="Row name (letters, digits, _.+-); must not be a built-in strategy's name.")
    spec: str | None = Field(None, description="A SPEC string, e.g. 'tp=4,pp=2,mbs=1,zero=1'.")
    module: str | None = Field(None, description="'package.module:function'; function(job) returns a Strategy "
                               "or None.")
    runtime: str | None = Field(None, description="Runtime profile it is costed under; default: the job's.")
    search_path: str | None = Field(None, description="Folder put first on sys.path to import `module` (set to the "
                                    "strategies file's folder when loaded).")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"{name!r}: use letters, digits and _.+- (it names a CSV row and a file)")
        return name

    @field_validator("module")
    @classmethod
    def _module_target(cls, module: str | None) -> str | None:
        if module is not None and not _TARGET.match(module):
            raise ValueError(f"{module!r}: expected 'package.module:function'")
        return module

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, runtime: str | None) -> str | None:
        if runtime is not None and runtime not in runtime_names():
            raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(runtime_names())}")
        return runtime

    @field_validator("spec")
    @classmethod
    def _valid_spec(cls, spec: str | None) -> str | None:
        if spec is not None:
            try:
                parse_strategy(spec)
            except PlannerInputError as err:
                raise ValueError(str(err)) from None
        return spec

    @model_validator(mode="after")
    def _one_source(self) -> UserStrategy:
        if (self.spec is None) == (self.module is None):
            raise ValueError("give exactly one of `spec` and `module`")
        return self


@contextmanager
def _on_path(folder: str | None) -> Iterator[None]:
    if folder is None:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def _forget_if_elsewhere(module_name: str, folder: str | None) -> None:
    """Drop a cached module (and its package's modules) that `folder` would provide from another file: two
    strategies files may each have their own `recipes.py`."""
    from importlib.machinery import PathFinder

    top = module_name.split(".")[0]
    cached = sys.modules.get(top)
    if folder is None or cached is None:
        return
    found = PathFinder.find_spec(top, [folder])
    spec = getattr(cached, "__spec__", None)
    if found is None or spec is not None and spec.origin == found.origin:
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def recipe_function(plugin: UserStrategy) -> Callable[[Job], Strategy | None]:
    """The callable `plugin.module` names; PlannerInputError naming it when it cannot be imported."""
    assert plugin.module is not None
    module_name, function_name = plugin.module.split(":")
    _forget_if_elsewhere(module_name, plugin.search_path)
    with _on_path(plugin.search_path):
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 (any failure of the user's import is their input's error)
            raise PlannerInputError(f"{plugin.name}: module {module_name!r} cannot be imported: "
                                    f"{type(err).__name__}: {err}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise PlannerInputError(f"{plugin.name}: {module_name} has no function {function_name!r}")
    return function


def with_search_path(plugins: list[UserStrategy], folder: Path) -> list[UserStrategy]:
    """`plugins` importing their modules from `folder` (the strategies file's), checked importable now."""
    out = [p.model_copy(update={"search_path": str(folder.resolve())}) if p.module else p for p in plugins]
    for plugin in out:
        if plugin.module:
            recipe_function(plugin)
    return out


def check_names(plugins: list[UserStrategy], builtin: tuple[str, ...], where: str) -> None:
    """PlannerInputError when a plugin takes a built-in name or two plugins share one."""
    seen: set[str] = set()
    for i, plugin in enumerate(plugins):
        if plugin.name in builtin:
            raise PlannerInputError(f"{where}[{i}].name: {plugin.name!r} is a built-in strategy; choose another name")
        if plugin.name in seen:
            raise PlannerInputError(f"{where}[{i}].name: {plugin.name!r} is given twice")
        seen.add(plugin.name)


def plugin_strategy(plugin: UserStrategy, job: Job) -> tuple[Strategy | None, str]:
    """The strategy `plugin` gives for `job` and, when none, why."""
    if plugin.spec is not None:
        return parse_strategy(plugin.spec), ""
    function = recipe_function(plugin)
    try:
        result = function(job)
    except Exception as err:  # noqa: BLE001 (the user's code: its failure is the row's reason, not a crash)
        return None, f"{plugin.module} raised {type(err).__name__}: {err}"
    if result is None:
        return None, f"{plugin.module} returned no strategy for this job"
    if not isinstance(result, Strategy):
        raise PlannerInputError(f"{plugin.name}: {plugin.module} returned {type(result).__name__}, not a Strategy")
    return result, ""


def plugin_job(plugin: UserStrategy, job: Job) -> Job:
    """`job` under the plugin's runtime (or its own)."""
    return job.on(load_runtime(plugin.runtime)) if plugin.runtime else job


def timed_strategy(plugin: UserStrategy, job: Job) -> tuple[Strategy | None, str, float]:
    """`plugin_strategy` and the seconds it took (the row's planning time)."""
    start = time.perf_counter()
    strategy, why = plugin_strategy(plugin, job)
    return strategy, why, time.perf_counter() - start


def parse_entries(value: object) -> object:
    """A `strategies` list with its mappings made UserStrategy, so an error names the entry and its field
    (a plain union would report the string alternative's error first).  Other values pass unchanged."""
    from pydantic import ValidationError

    if not isinstance(value, list):
        return value
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, dict):
            try:
                entry = UserStrategy.model_validate(entry)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
                raise ValueError(f"[{i}]{'.' + where if where else ''}: "
                                 f"{message.removeprefix('Value error, ')}") from None
        out.append(entry)
    return out


class StrategiesFile(BaseModel):
    """`compare --strategies FILE`: the strategies to score, as a sweep file's `strategies` list."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategies: list[str | UserStrategy] = Field(min_length=1, description="Built-in names and user strategies.")

    @field_validator("strategies", mode="before")
    @classmethod
    def _entries(cls, value: object) -> object:
        return parse_entries(value)


def load_strategies(path: Path, builtin: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[UserStrategy, ...]]:
    """(every name in file order, the user strategies) of a strategies file; PlannerInputError `FILE: field:
    message` on any problem."""
    from pydantic import ValidationError

    from models import ModelInputError
    from models.spec import read_mapping

    try:
        data = read_mapping(path, "strategies file")
        parsed = StrategiesFile.model_validate(data)
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if str(p) not in ("str", "UserStrategy"))
        message = first["msg"].removeprefix("Value error, ")
        sep = "" if message.startswith("[") else ": "
        raise PlannerInputError(f"{path}: {where}{sep}{message}") from None
    plugins = [s for s in parsed.strategies if isinstance(s, UserStrategy)]
    for i, entry in enumerate(parsed.strategies):
        if isinstance(entry, str) and entry not in builtin:
            raise PlannerInputError(f"{path}: strategies[{i}]: unknown strategy {entry!r}; built-in: "
                                    f"{', '.join(builtin)}")
    check_names(plugins, builtin, f"{path}: strategies")
    try:
        plugins = with_search_path(plugins, path.parent)
    except PlannerInputError as err:
        raise PlannerInputError(f"{path}: strategies: {err}") from None
    names = tuple(s.name if isinstance(s, UserStrategy) else s for s in parsed.strategies)
    return names, tuple(plugins)
