"""Launch files: one module per target, each turning a Plan into files.

Every emitter is a function `emit(plan: Plan, job: Job) -> dict[str, str]`
returning paths relative to its own folder (e.g. "ds_config.json",
"launch.sh") and their text.  Output is deterministic: sorted keys, no
timestamps, no absolute paths.  `emit_targets` prefixes each path with the
target's folder name, as `compile -o DIR` writes them.

A module may also declare `SPACE_LIMITS`: SpaceOptions fields that keep the
search to plans the target can run.  `compile --target T` applies them (the
compiler then never picks what T refuses); default targets do not narrow the
search, and a target that cannot run the plan is skipped with a note.
"""

from __future__ import annotations

from importlib import import_module
from typing import Callable

from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import PLACEMENT_KEYS


class UnsupportedPlan(ValueError):
    """A target cannot express this plan's model (e.g. a recommendation model for Megatron)."""


TARGETS = ("deepspeed", "torch", "torchtitan", "megatron", "slurm", "k8s")
DEFAULT_TARGETS = ("deepspeed", "torch")

Emitter = Callable[[Plan, Job], dict[str, str]]


def emitter(target: str) -> Emitter:
    """The emit function of `target`."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    return import_module(f"planner.emit.{target}").emit


def available_targets() -> tuple[str, ...]:
    """Targets whose emitter module exists in this build."""
    out = []
    for target in TARGETS:
        try:
            import_module(f"planner.emit.{target}")
        except ModuleNotFoundError:
            continue
        out.append(target)
    return tuple(out)


def emit_targets(plan: Plan, job: Job, targets: tuple[str, ...]) -> dict[str, str]:
    """Files of every target, keyed by "target/relative/path"."""
    files: dict[str, str] = {}
    if plan.groups and targets:
        # every framework here runs one strategy over all its ranks
        raise UnsupportedPlan(f"a replica-group plan (a strategy per pool) has no {targets[0]} form; plan.json "
                              "lists each group's plan")
    per_stage = [key for key in PLACEMENT_KEYS if getattr(plan.strategy, f"stage_{key}")]
    for target in targets:
        limits = getattr(import_module(f"planner.emit.{target}"), "SPACE_LIMITS", {})
        if per_stage and limits.get("stage_placement") is False:
            key = per_stage[0]
            values = "/".join(map(str, getattr(plan.strategy, f"stage_{key}")))
            raise UnsupportedPlan(f"{target} applies one {key} setting to every rank; the plan's stages differ "
                                  f"({key}={values})")
        for path, text in sorted(emitter(target)(plan, job).items()):
            files[f"{target}/{path}"] = text
    return files


def space_limits(targets: tuple[str, ...]) -> dict:
    """SpaceOptions updates under which every plan runs on all of `targets` (their SPACE_LIMITS combined)."""
    # every framework here runs one strategy over all its ranks (no replica groups) and re-gathers
    # ZeRO-3 weights over the network (none has a host-memory parameter cache, FCDP)
    limits: dict = {"replica_groups": False, "regathers": ("network",)} if targets else {}
    for target in targets:
        for key, value in getattr(import_module(f"planner.emit.{target}"), "SPACE_LIMITS", {}).items():
            if key in limits:  # the narrower of two limits: fewer devices, a smaller maximum, False over True
                old = limits[key]
                value = (tuple(v for v in old if v in value) if isinstance(value, tuple)
                         else value and old if isinstance(value, bool) else min(old, value))
            limits[key] = value
    return limits
