"""Launch files: one module per target, each turning a Plan into files.

Each target is one `Target` of `REGISTRY` (its folder name, the runtime profile its files run under, its module);
every target module has `emit(plan: Plan, job: Job, inputs: LaunchInputs) -> dict[str, str]`
returning paths relative to its own folder (e.g. "ds_config.json",
"launch.sh") and their text, and `written_strategy(plan, job) -> Strategy`:
the strategy those files ask the framework to run, read off the same
decisions the files are written from (a framework may substitute: DeepSpeed's
PipelineEngine runs ZeRO-1 where the plan says ZeRO-2).  Output is
deterministic: sorted keys, no timestamps, no absolute paths.  What the plan does not decide (data,
tokenizer, checkpoints, image, partition) comes in `inputs` (`planner.emit.inputs`): given values, or
environment variables read at launch, never silent defaults.

Before any file of a target is produced, `planner.emit.check` costs its
written strategy under the target's runtime profile (TARGET_RUNTIMES) and
refuses files that would not fit or would run slower than the plan's strategy
does there; `planner.emit.check.emit_targets` prefixes each path with the
target's folder name, as `compile -o DIR` writes them.  What a target's framework can express at all
is its profile's `space` section (`compile --target T` searches only that:
`planner.search.space.narrow_to_runtime`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Callable, Protocol

from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import PLACEMENT_KEYS, Strategy

if TYPE_CHECKING:
    from planner.emit.inputs import LaunchInputs


class UnsupportedPlan(ValueError):
    """A target cannot express this plan (e.g. a recommendation model for Megatron, experts for DeepSpeed)."""


class RefusedPlan(ValueError):
    """A target's files would not hold the plan: its written strategy does not fit, or runs slower than the
    plan's strategy, under the target's runtime."""


class TargetModule(Protocol):
    """What a target's module (planner/emit/<module>.py) provides."""

    def emit(self, plan: Plan, job: Job, inputs: "LaunchInputs") -> dict[str, str]: ...

    def written_strategy(self, plan: Plan, job: Job) -> Strategy: ...


@dataclass(frozen=True)
class Target:
    """One launch target: its folder name in an output folder, the runtime profile (hardware/data/runtimes) its
    files run under, and the module that writes them (imported when first used)."""

    name: str
    runtime: str
    module: str

    @property
    def code(self) -> TargetModule:
        return import_module(f"planner.emit.{self.module}")


# Slurm and Kubernetes wrap the torch target's launcher, which runs planner's own runtime.
REGISTRY: dict[str, Target] = {t.name: t for t in (
    Target("deepspeed", runtime="deepspeed", module="deepspeed"),
    Target("torch", runtime="planner", module="torch"),
    Target("torchtitan", runtime="torchtitan", module="torchtitan"),
    Target("megatron", runtime="megatron", module="megatron"),
    Target("slurm", runtime="planner", module="slurm"),
    Target("k8s", runtime="planner", module="k8s"),
)}
TARGETS = tuple(REGISTRY)
DEFAULT_TARGETS = ("deepspeed", "torch")
TARGET_RUNTIMES = {name: target.runtime for name, target in REGISTRY.items()}  # a view of REGISTRY

def primary_runtime(targets: tuple[str, ...], model_has_experts: bool,
                    shared_experts: bool = False) -> tuple[str, str | None]:
    """The runtime a compile searches under when none is named, and a note when it is not the obvious one:
    the first named target's, else planner's own runtime; for a mixture-of-experts model that runtime
    cannot run, the first target runtime (or Megatron) that can."""
    from planner.profile import CLI_RUNTIME, load_runtime

    first = TARGET_RUNTIMES[targets[0]] if targets else CLI_RUNTIME
    experts = int(model_has_experts)
    refusal = load_runtime(first).model_refusal(experts, shared_experts)
    if refusal is None:
        return first, None
    for name in [TARGET_RUNTIMES[t] for t in targets] + ["megatron"]:
        if load_runtime(name).model_refusal(experts, shared_experts) is None:
            return name, (f"searched under the {name} runtime: {first} cannot run {refusal}")
    return first, None

Emitter = Callable[..., dict[str, str]]  # (plan, job, inputs: planner.emit.inputs.LaunchInputs)


def target(name: str) -> Target:
    """The registered target `name`; ValueError naming the known ones."""
    if name not in REGISTRY:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return REGISTRY[name]


def emitter(name: str) -> Emitter:
    """The emit function of target `name`."""
    return target(name).code.emit


def strategy_writer(name: str) -> Callable[[Plan, Job], Strategy]:
    """The `written_strategy` function of target `name`."""
    return target(name).code.written_strategy

def one_placement(plan: Plan, target: str) -> None:
    """UnsupportedPlan when the plan's stages keep their state differently: `target` writes one offload
    setting for every rank."""
    per_stage = [key for key in PLACEMENT_KEYS if getattr(plan.single_strategy, f"stage_{key}")]
    if per_stage:
        key = per_stage[0]
        values = "/".join(map(str, getattr(plan.single_strategy, f"stage_{key}")))
        raise UnsupportedPlan(f"{target} applies one {key} setting to every rank; the plan's stages differ "
                              f"({key}={values})")


def available_targets() -> tuple[str, ...]:
    """Targets whose emitter module exists in this build."""
    out = []
    for name, registered in REGISTRY.items():
        try:
            import_module(f"planner.emit.{registered.module}")
        except ModuleNotFoundError:
            continue
        out.append(name)
    return tuple(out)
