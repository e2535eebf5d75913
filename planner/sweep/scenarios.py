"""The SCENARIOS.yaml schema of `planner sweep`, and its expansion into tasks.

A sweep file is a grid, optionally plus explicit scenarios::

    models: [tiny-llama, llama3-8b]          # zoo names, spec files or HF config.json
    clusters: [dgx-h100:1, dgx-h100:2]       # PRESET:NODES or cluster files
    batches: [64, 128]                       # global batch in sequences
    seq_lens: [4096]                         # tokens per sequence
    precision: bf16                          # bf16 | fp16 | fp8
    strategies: [zero3, megatron, planner]   # default: every one that applies
    time_limit: 30                           # seconds per compiled strategy
    scenarios:                               # optional extra points
      - {model: gpt3-175b, cluster: dgx-a100-80g:16, batch: 256, seq_len: 2048}

The grid expands models x clusters x batches x seq_lens x strategies in that
nesting order (the order the lists are written), then the extra scenarios in
file order; a point listed twice runs once.  File paths are resolved against
the sweep file's directory first.  Every model and cluster is loaded here, in
the driver, so that a bad name is one error line (`FILE: models[1]: ...`)
before any solve starts, and workers receive ready `Job`s (no file access).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from hardware import Cluster, HardwareInputError, load_cluster
from models import ModelInputError, load_model
from models.graph import ModelGraph
from planner.compare import DENSE_BASELINES, RECSYS_BASELINES, baselines_for
from planner.errors import PlannerInputError
from planner.job import Job, Precision
from planner.sweep.tasks import SweepTask

StrategyName = Literal[tuple(dict.fromkeys(DENSE_BASELINES + RECSYS_BASELINES))]  # type: ignore[valid-type]
PositiveInt = Annotated[StrictInt, Field(gt=0)]  # strict: YAML "64" or true is a mistake, not 64 or 1


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
    strategies: list[StrategyName] | None = Field(
        None, min_length=1, description="Strategies to score; default: the file's `strategies`."
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
    precision: Precision = Field("bf16", description="Compute precision of every scenario (bf16, fp16, fp8).")
    flash_attention: bool = Field(True, description="Fused flash attention (no s^2 score tensors).")
    strategies: list[StrategyName] | None = Field(
        None, min_length=1, description="Strategies scored per scenario; default: every one that applies."
    )
    time_limit: float = Field(60.0, gt=0, description="Search budget in seconds of each compiled strategy.")
    scenarios: list[ExtraScenario] = Field(default_factory=list, description="Explicit scenarios outside the grid.")
    title: str | None = Field(None, description="Heading of summary.md and report.md; default: the file name.")
    simulate: bool = Field(False, description="Also simulate each scenario's planner plan (`planner simulate`) "
                           "and report the agreement with the analytic step in report.md.")

    @field_validator("models", "clusters", "batches", "seq_lens", mode="before")
    @classmethod
    def _scalar_is_a_list_of_one(cls, value: Any) -> Any:
        return _as_list(value)

    @model_validator(mode="after")
    def _grid_complete(self) -> SweepSpec:
        axes = {"models": self.models, "clusters": self.clusters, "batches": self.batches,
                "seq_lens": self.seq_lens}
        missing = [name for name, values in axes.items() if not values]
        if len(missing) < len(axes) and missing:
            raise ValueError(f"the grid needs every axis; missing or empty: {', '.join(missing)}")
        if len(missing) == len(axes) and not self.scenarios:
            raise ValueError("no scenarios: give models, clusters, batches and seq_lens, or a `scenarios` list")
        return self


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
        items.append(f"{where}: {message}" if where else message)
    return "; ".join(items)


def load_sweep(path: str | Path) -> SweepSpec:
    """Parse and validate a sweep file; PlannerInputError `FILE: field: message` on any problem."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise PlannerInputError(f"{path}: cannot read ({getattr(err, 'strerror', None) or err})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise PlannerInputError(f"{path}: not valid YAML: {problem}{where}") from None
    if not isinstance(data, dict):
        raise PlannerInputError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as err:
        raise PlannerInputError(f"{path}: {_render(err)}") from None


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


def expand(spec: SweepSpec, path: str | Path) -> list[SweepTask]:
    """The sweep's tasks in scenario order (see the module docstring); `path` names the file in errors."""
    path = Path(path)
    loader = _Loader(str(path), path.parent)
    points: list[tuple[str, str, str, str, int, int, Precision, tuple[str, ...] | None]] = []
    for i, model in enumerate(spec.models):
        for j, cluster in enumerate(spec.clusters):
            for batch in spec.batches:
                for seq_len in spec.seq_lens:
                    points.append((model, f"models[{i}]", cluster, f"clusters[{j}]", batch, seq_len,
                                   spec.precision, None))
    for k, extra in enumerate(spec.scenarios):
        chosen = tuple(extra.strategies) if extra.strategies else None
        points.append((extra.model, f"scenarios[{k}].model", extra.cluster, f"scenarios[{k}].cluster",
                       extra.batch, extra.seq_len, extra.precision or spec.precision, chosen))

    tasks: list[SweepTask] = []
    seen: set[tuple] = set()
    scenario_ids: dict[tuple, int] = {}
    used: set[str] = set()
    for model, model_at, cluster, cluster_at, batch, seq_len, precision, chosen in points:
        graph, topology = loader.model(model, model_at), loader.cluster(cluster, cluster_at)
        job = Job(model=graph, cluster=topology, global_batch=batch, seq_len=seq_len, precision=precision,
                  flash_attention=spec.flash_attention)
        applicable = baselines_for(job)
        wanted = chosen or (tuple(spec.strategies) if spec.strategies else applicable)
        key = (model, cluster, batch, seq_len, precision)
        for strategy in (s for s in wanted if s in applicable):
            if key + (strategy,) in seen:
                continue
            seen.add(key + (strategy,))
            used.add(strategy)
            scenario = scenario_ids.setdefault(key, len(scenario_ids))
            tasks.append(SweepTask(index=len(tasks), scenario=scenario, model=model, cluster=cluster, batch=batch,
                                   seq_len=seq_len, precision=precision, strategy=strategy,
                                   time_limit=spec.time_limit, job=job))
    for i, strategy in enumerate(spec.strategies or ()):
        if strategy not in used:
            raise PlannerInputError(f"{path}: strategies[{i}]: {strategy!r} applies to none of the models")
    if not tasks:
        raise PlannerInputError(f"{path}: no strategy applies to any scenario")
    return tasks
