"""The SCENARIOS.yaml schema of `planner sweep`, and its expansion into tasks.

A sweep file is a grid, optionally plus explicit scenarios::

    models: [tiny-llama, llama3-8b]          # zoo names, spec files or HF config.json
    clusters: [dgx-h100:1, dgx-h100:2]       # PRESET:NODES or cluster files
    batches: [64, 128]                       # global batch in sequences
    seq_lens: [4096]                         # tokens per sequence
    precision: bf16                          # bf16 | fp16 | fp8 | mxfp8
    strategies: [zero3, megatron, planner]   # default: every one that applies; also user strategies:
      # {name: my-tp4, spec: "tp=4,pp=2"} or {name: recipe, module: "pkg.mod:function"}
      # (planner/compare/plugins.py)
    time_limit: 30                           # seconds per compiled strategy
    scenarios:                               # optional extra points
      - {model: gpt3-175b, cluster: dgx-a100-80g:16, batch: 256, seq_len: 2048}

The grid expands models x clusters x batches x seq_lens x strategies in that
nesting order (the order the lists are written), then the extra scenarios in
file order; a point listed twice runs once.  File paths are resolved against
the sweep file's directory first.  Every model and cluster is loaded here, in
the driver, so that a bad name is one error line (`FILE: models[1]: ...`)
before any solve starts, and workers receive ready `Job`s (no file access).

The scenarios are counted from the axes first (`scenario_count`): above
`MAX_SCENARIOS` the sweep is refused unless the user says `--yes`.  The tasks
(`SweepTasks`) are then made one grid point at a time as the executor takes
them, never as one list.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from hardware import Cluster, HardwareInputError, load_catalog, load_cluster
from models import ModelInputError, load_model
from models.graph import ModelGraph
from models.spec import read_mapping
from planner.compare.plugins import UserStrategy, check_names, parse_entries, with_search_path
from planner.compare.table import NAMED, baselines_for
from planner.errors import PlannerInputError
from planner.job import Job, Precision
from planner.emit import primary_runtime
from planner.profile import CLI_RUNTIME, RuntimeProfile, load_runtime, runtime_names
from planner.sweep.tasks import SweepTask

if TYPE_CHECKING:  # the names are data (the baselines' tables): the Literal is built from them at run time
    StrategyName = str
else:
    StrategyName = Literal[NAMED]
PositiveInt = Annotated[StrictInt, Field(gt=0)]  # strict: YAML "64" or true is a mistake, not 64 or 1
# Scenarios (grid points plus extra scenarios) a sweep runs without `--yes`: beyond it the grid is most
# likely a typo, and its rows, tables and figures would take hours and gigabytes (docs/cli.md, planner sweep).
MAX_SCENARIOS = 10_000


def _as_list(value: Any) -> Any:
    """A scalar where a list is expected means a list of one (`seq_lens: 4096`)."""
    return value if isinstance(value, list) or value is None else [value]


class ExtraScenario(BaseModel):
    """One explicit scenario outside the grid."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = Field(min_length=1, description="Zoo name, model spec file or HF config.json.")
    cluster: str = Field(min_length=1, description="PRESET:NODES or a cluster file.")
    batch: PositiveInt = Field(description="Global batch in sequences (samples for recsys models).")
    seq_len: PositiveInt = Field(description="Tokens per sequence (1 for recsys models).")
    precision: Precision | None = Field(None, description="Compute precision; default: the file's `precision`.")
    strategies: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, min_length=1, description="Strategies to score (built-in names, or names of the file's user "
        "strategies); default: the file's `strategies`."
    )


class SweepSpec(BaseModel):
    """A sweep file: the grid, the solve settings and optional extra scenarios."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    models: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Models of the grid: zoo names, model spec files or HF config.json."
    )
    clusters: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Clusters of the grid: PRESET:NODES shorthands or cluster files."
    )
    batches: list[PositiveInt] = Field(default_factory=list, description="Global batch sizes of the grid.")
    seq_lens: list[PositiveInt] = Field(default_factory=list, description="Sequence lengths of the grid.")
    precision: Precision = Field("bf16", description="Compute precision of every scenario (bf16, fp16, fp8, mxfp8).")
    flash_attention: bool = Field(True, description="Fused flash attention (no s^2 score tensors).")
    memory_margin: float | None = Field(
        None, ge=0.0, lt=1.0, description="Share of HBM every plan leaves free; default: memory_margin_default "
        "in hardware/data/constants.yaml (the cost model's measured memory error), as compile and compare.")
    runtime: str = Field(CLI_RUNTIME, description="Runtime profile of the planner row and the non-framework "
                         "baselines (hardware/data/runtimes/<runtime>.yaml); framework baselines use their own. When "
                         "not given, mixture-of-experts models run under the first runtime that can (as compare).")
    strategies: list[StrategyName | UserStrategy] | None = Field(
        None, min_length=1, description="Strategies scored per scenario: built-in names, and user strategies "
        "{name, spec} or {name, module: 'pkg.mod:function'} (planner/compare/plugins.py); default: every "
        "built-in one that applies."
    )
    time_limit: float = Field(60.0, gt=0, strict=True, allow_inf_nan=False,
                              description="Search budget in seconds of each compiled strategy (finite: plan.json "
                              "records it).")
    scenarios: list[ExtraScenario] = Field(default_factory=list, description="Explicit scenarios outside the grid.")
    title: str | None = Field(None, description="Heading of summary.md and report.md; default: the file name.")
    simulate: bool = Field(False, strict=True, description="Also simulate each scenario's planner plan "
                           "(`planner simulate`) and report the agreement with the analytic step in report.md.")
    data_profiles: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Data profiles (planner.data.profile files, resolved against the sweep "
        "file's folder): each scenario is also planned for each profile's data, clipped at its seq_len, against "
        "the best static plan on it (data.csv, data.md, data.png).")

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, runtime: str) -> str:
        if runtime not in runtime_names():
            raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(runtime_names())}")
        return runtime

    @field_validator("models", "clusters", "batches", "seq_lens", mode="before")
    @classmethod
    def _scalar_is_a_list_of_one(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("strategies", mode="before")
    @classmethod
    def _user_strategies(cls, value: Any) -> Any:
        return parse_entries(value)

    @model_validator(mode="after")
    def _grid_complete(self) -> SweepSpec:
        axes = {"models": self.models, "clusters": self.clusters, "batches": self.batches,
                "seq_lens": self.seq_lens}
        missing = [name for name, values in axes.items() if not values]
        if len(missing) < len(axes) and missing:
            raise ValueError(f"the grid needs every axis; missing or empty: {', '.join(missing)}")
        if len(missing) == len(axes) and not self.scenarios:
            raise ValueError("no scenarios: give models, clusters, batches and seq_lens, or a `scenarios` list")
        known = set(NAMED) | {p.name for p in self.plugins}
        for k, extra in enumerate(self.scenarios):
            for name in extra.strategies or ():
                if name not in known:
                    raise ValueError(f"scenarios[{k}].strategies: {name!r} is neither a built-in strategy nor one "
                                     "of the file's user strategies")
        return self

    @property
    def plugins(self) -> list[UserStrategy]:
        """The user strategies of `strategies`, in file order."""
        return [s for s in self.strategies or () if isinstance(s, UserStrategy)]

    @property
    def names(self) -> list[str] | None:
        """Every strategy's name (built-in or user), in file order; None when the file names none."""
        if self.strategies is None:
            return None
        return [s.name if isinstance(s, UserStrategy) else s for s in self.strategies]


def _location(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _render(err: ValidationError) -> str:
    items = []
    for e in err.errors():
        message = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        where = _location(tuple(p for p in e["loc"] if not str(p).startswith("literal[")))
        sep = "" if message.startswith("[") else ": "  # an entry's own path: strategies[1].spec
        items.append(f"{where}{sep}{message}" if where else message)
    return "; ".join(items)


def load_sweep(path: str | Path) -> SweepSpec:
    """Parse and validate a sweep file; PlannerInputError `FILE: field: message` on any problem."""
    path = Path(path)
    try:
        data = read_mapping(path, "sweep file")  # the model spec reader: size cap, UTF-8 only, repeated keys refused
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise PlannerInputError(f"{path}: {_render(err)}") from None
    load_profiles(spec, path)  # every profile readable before any solve starts
    if not spec.plugins:
        return spec
    check_names(spec.plugins, NAMED, f"{path}: strategies")
    try:
        plugins = iter(with_search_path(spec.plugins, path.parent))
    except PlannerInputError as err:
        raise PlannerInputError(f"{path}: strategies: {err}") from None
    entries = [next(plugins) if isinstance(s, UserStrategy) else s for s in spec.strategies or ()]
    return spec.model_copy(update={"strategies": entries})


def load_profiles(spec: SweepSpec, path: str | Path) -> list:
    """The sweep's data profiles (planner.data.profile.DataProfile), read beside the sweep file first;
    PlannerInputError `FILE: data_profiles[i]: message`."""
    from planner.data.profile import load_data_profile

    out = []
    for i, name in enumerate(spec.data_profiles):
        beside = Path(path).parent / name
        try:
            out.append(load_data_profile(beside if beside.is_file() else name))
        except PlannerInputError as err:
            raise PlannerInputError(f"{path}: data_profiles[{i}]: {err}") from None
    return out


class _Loader:
    """Loads each model and cluster once, naming the file and field on failure."""

    def __init__(self, label: str, base_dir: Path):
        self.label, self.base_dir = label, base_dir
        self.models: dict[str, ModelGraph] = {}
        self.clusters: dict[str, Cluster] = {}

    def _resolve(self, arg: str) -> str:
        candidate = self.base_dir / arg
        return str(candidate) if not Path(arg).is_absolute() and candidate.exists() else arg

    def model(self, arg: str, where: str) -> ModelGraph:
        if arg not in self.models:
            try:
                self.models[arg] = load_model(self._resolve(arg))
            except ModelInputError as err:
                raise PlannerInputError(f"{self.label}: {where}: {err}") from None
        return self.models[arg]

    def cluster(self, arg: str, where: str) -> Cluster:
        if arg not in self.clusters:
            try:
                self.clusters[arg] = load_cluster(self._resolve(arg))
            except HardwareInputError as err:
                raise PlannerInputError(f"{self.label}: {where}: {err}") from None
        return self.clusters[arg]


def scenario_count(spec: SweepSpec) -> int:
    """Scenarios of the sweep file, counted without expanding it: the grid's axes multiplied (a value listed
    twice counts once), plus the extra scenarios off the grid.  A point no strategy applies to still counts."""
    grid = math.prod(len(dict.fromkeys(axis)) for axis in (spec.models, spec.clusters, spec.batches, spec.seq_lens))
    on_grid = _GridIndex(spec)
    extras = {_extra_key(spec, e) for e in spec.scenarios}
    return grid + sum(1 for key in extras if not on_grid.holds(key))


def check_scenario_limit(spec: SweepSpec, path: str | Path, yes: bool = False) -> int:
    """The scenario count; PlannerInputError above MAX_SCENARIOS unless `yes` (before anything is loaded)."""
    count = scenario_count(spec)
    if count > MAX_SCENARIOS and not yes:
        axes = " x ".join(f"{name} {len(dict.fromkeys(values)):,}" for name, values in (
            ("models", spec.models), ("clusters", spec.clusters), ("batches", spec.batches),
            ("seq_lens", spec.seq_lens)))
        extra = f" plus {len(spec.scenarios):,} listed" if spec.scenarios else ""
        raise PlannerInputError(f"{path}: {count:,} scenarios ({axes}{extra}) exceed the limit of "
                                f"{MAX_SCENARIOS:,}; pass --yes to run them all")
    return count


def _extra_key(spec: SweepSpec, extra: ExtraScenario) -> tuple:
    return (extra.model, extra.cluster, extra.batch, extra.seq_len, extra.precision or spec.precision)


class _GridIndex:
    """Positions of the grid's distinct axis values (first occurrence), to place a point on the grid."""

    def __init__(self, spec: SweepSpec):
        self.precision = spec.precision
        self.models = {v: k for k, v in enumerate(dict.fromkeys(spec.models))}
        self.clusters = {v: k for k, v in enumerate(dict.fromkeys(spec.clusters))}
        self.batches = {v: k for k, v in enumerate(dict.fromkeys(spec.batches))}
        self.seq_lens = {v: k for k, v in enumerate(dict.fromkeys(spec.seq_lens))}

    def holds(self, key: tuple) -> bool:
        model, cluster, batch, seq_len, precision = key
        return (model in self.models and cluster in self.clusters and batch in self.batches
                and seq_len in self.seq_lens and precision == self.precision)


class SweepTasks:
    """The sweep's tasks in scenario order (see the module docstring), produced lazily.

    Checked up front, before any solve: every model and cluster is loaded (once per axis value), the
    job of every (model, cluster) pair with each batch and each sequence length is valid, and every
    named strategy applies somewhere.  The grid's tasks are then made one point at a time as they are
    iterated, so a large grid never sits in memory; `len()` and `scenarios` are counted from the axes.
    `baselines_for` reads only the model and the cluster, so the strategies of a point are those of
    its (model, cluster) pair.
    """

    def __init__(self, spec: SweepSpec, path: str | Path):
        self.spec, self.path = spec, Path(path)
        self._plugins = {p.name: p for p in spec.plugins}
        loader = _Loader(str(self.path), self.path.parent)
        self._grid = _GridIndex(spec)
        self._batches, self._seq_lens = list(self._grid.batches), list(self._grid.seq_lens)
        self._at = (_first_positions(spec.models), _first_positions(spec.clusters), _first_positions(spec.batches),
                    _first_positions(spec.seq_lens))  # value -> its position in the file, per axis
        points = len(self._batches) * len(self._seq_lens)
        # pairs[(m, c)] = (model, cluster, graph, topology, strategies) of distinct models x clusters, row-major
        self._pairs: dict[tuple[int, int], tuple[str, str, ModelGraph, Cluster, tuple[str, ...]]] = {}
        self._first_id: dict[tuple[int, int], int] = {}  # scenario id of the pair's first point
        used: set[str] = set()
        scenario = 0
        for m, (model, i) in enumerate(_first_positions(spec.models).items()):
            for c, (cluster, j) in enumerate(_first_positions(spec.clusters).items()):
                graph, topology = loader.model(model, f"models[{i}]"), loader.cluster(cluster, f"clusters[{j}]")
                self._check_axes(model, cluster, graph, topology)
                applicable = self._applicable(self._grid_job(model, cluster, graph, topology, self._batches[0],
                                                             self._seq_lens[0]))
                wanted = tuple(spec.names) if spec.names else applicable
                strategies = tuple(dict.fromkeys(s for s in wanted if s in applicable))
                self._pairs[m, c] = (model, cluster, graph, topology, strategies)
                if strategies:
                    self._first_id[m, c] = scenario
                    scenario += points
                used.update(strategies)
        self._grid_tasks = sum(len(p[4]) for p in self._pairs.values()) * points
        self._extras = self._extra_tasks(loader, scenario, used)
        self.scenarios = scenario + len({t[0] for t in self._extras if t[0] >= scenario})
        for i, strategy in enumerate(spec.names or ()):
            if strategy not in used:
                raise PlannerInputError(f"{self.path}: strategies[{i}]: {strategy!r} applies to none of the models")
        if not len(self):
            raise PlannerInputError(f"{self.path}: no strategy applies to any scenario")

    def _runtime(self, graph: ModelGraph) -> RuntimeProfile:
        """The file's runtime; when the file names none and the default cannot run the model's experts, the one
        `planner compare` takes for a mixture-of-experts model (planner.emit.primary_runtime)."""
        if "runtime" in self.spec.model_fields_set or not graph.num_experts:
            return load_runtime(self.spec.runtime)
        return load_runtime(primary_runtime((), True)[0])

    def _applicable(self, job: Job) -> tuple[str, ...]:
        """The built-in strategies that apply to the job, then the user strategies (dense models only)."""
        users = () if job.model.family == "recsys" else tuple(self._plugins)
        return baselines_for(job) + users

    def _job(self, graph: ModelGraph, topology: Cluster, batch: int, seq_len: int, precision: Precision,
             where: str) -> Job:
        try:
            return Job(model=graph, cluster=topology, global_batch=batch, seq_len=seq_len, precision=precision,
                       flash_attention=self.spec.flash_attention, runtime=self._runtime(graph),
                       memory_margin=(load_catalog().constant("memory_margin_default")
                                      if self.spec.memory_margin is None else self.spec.memory_margin))
        except ValidationError as err:
            why = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
            raise PlannerInputError(f"{self.path}: {where}: {why}") from None

    def _grid_job(self, model: str, cluster: str, graph: ModelGraph, topology: Cluster, batch: int,
                  seq_len: int) -> Job:
        models, clusters, batches, seq_lens = self._at
        where = (f"{model} on {cluster}, batch {batch} x {seq_len} (models[{models[model]}], "
                 f"clusters[{clusters[cluster]}], batches[{batches[batch]}], seq_lens[{seq_lens[seq_len]}])")
        return self._job(graph, topology, batch, seq_len, self.spec.precision, where)

    def _check_axes(self, model: str, cluster: str, graph: ModelGraph, topology: Cluster) -> None:
        """A job of the pair with every sequence length, then every batch, is valid (a point's job is checked
        again when its tasks are made; a rule that couples batch and sequence length would stop there)."""
        for seq_len in self._seq_lens:
            self._grid_job(model, cluster, graph, topology, self._batches[0], seq_len)
        for batch in self._batches[1:]:
            self._grid_job(model, cluster, graph, topology, batch, self._seq_lens[0])

    def _grid_scenario(self, key: tuple) -> tuple[int, tuple[str, ...]] | None:
        """The scenario id and the strategies of grid point `key`, when the grid scores it."""
        if not self._grid.holds(key):
            return None
        model, cluster, batch, seq_len, _ = key
        pair = (self._grid.models[model], self._grid.clusters[cluster])
        if pair not in self._first_id:
            return None  # no strategy of the grid applies there
        offset = self._grid.batches[batch] * len(self._seq_lens) + self._grid.seq_lens[seq_len]
        return self._first_id[pair] + offset, self._pairs[pair][4]

    def _extra_tasks(self, loader: _Loader, next_id: int, used: set[str]) -> list[tuple]:
        """(scenario, model, cluster, batch, seq_len, precision, strategy, job) of the extra scenarios'
        strategies that the grid (or an earlier extra) does not already score; a point off the grid takes
        the next scenario id at its first task."""
        out: list[tuple] = []
        seen: set[tuple] = set()
        ids: dict[tuple, int] = {}
        for k, extra in enumerate(self.spec.scenarios):
            key = _extra_key(self.spec, extra)
            graph = loader.model(extra.model, f"scenarios[{k}].model")
            topology = loader.cluster(extra.cluster, f"scenarios[{k}].cluster")
            job = self._job(graph, topology, extra.batch, extra.seq_len, key[4], f"scenarios[{k}]")
            applicable = self._applicable(job)
            wanted = tuple(extra.strategies) if extra.strategies else (
                tuple(self.spec.names) if self.spec.names else applicable)
            grid = self._grid_scenario(key)
            for strategy in (s for s in wanted if s in applicable):
                if (grid is not None and strategy in grid[1]) or key + (strategy,) in seen:
                    continue
                seen.add(key + (strategy,))
                used.add(strategy)
                if key not in ids:
                    ids[key] = grid[0] if grid is not None else next_id
                    next_id += grid is None
                out.append((ids[key], *key, strategy, job))
        return out

    def __len__(self) -> int:
        return self._grid_tasks + len(self._extras)

    def __iter__(self) -> Iterator[SweepTask]:
        index, limit = 0, self.spec.time_limit
        for (m, c), (model, cluster, graph, topology, strategies) in self._pairs.items():
            if not strategies:
                continue
            scenario = self._first_id[m, c]
            for batch in self._batches:
                for seq_len in self._seq_lens:
                    job = self._grid_job(model, cluster, graph, topology, batch, seq_len)
                    for strategy in strategies:
                        yield SweepTask(index=index, scenario=scenario, model=model, cluster=cluster, batch=batch,
                                        seq_len=seq_len, precision=self.spec.precision, strategy=strategy,
                                        time_limit=limit, job=job, plugin=self._plugins.get(strategy))
                        index += 1
                    scenario += 1
        for scenario, model, cluster, batch, seq_len, precision, strategy, job in self._extras:
            yield SweepTask(index=index, scenario=scenario, model=model, cluster=cluster, batch=batch,
                            seq_len=seq_len, precision=precision, strategy=strategy, time_limit=limit, job=job,
                            plugin=self._plugins.get(strategy))
            index += 1


def _first_positions(values: list) -> dict:
    """Each distinct value with the position of its first occurrence (a repeat runs once)."""
    out: dict = {}
    for i, value in enumerate(values):
        out.setdefault(value, i)
    return out


def expand(spec: SweepSpec, path: str | Path) -> list[SweepTask]:
    """Every task of the sweep, in scenario order (`path` names the file in errors): `list(SweepTasks(...))`."""
    return list(SweepTasks(spec, path))
