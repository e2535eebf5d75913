"""What each launch folder asks its framework to run, costed under that framework's runtime profile.

A target's files do not always say what the plan says: Megatron has one
recompute count for every stage, DeepSpeed's PipelineEngine refuses ZeRO-2/3,
torchtitan checkpoints every n-th block.  `planner.emit.check` rebuilds the
strategy a target's files ask for (its *written strategy*), costs it under the
target's runtime profile, and records the outcome here as a `TargetCheck`:
written (the folder is produced), refused (it would not fit, or would run more
than the tolerance slower than the plan's strategy does under that runtime) or
unsupported (the framework cannot express it at all).  report.md lists them;
the CLI prints `line` for refusals and notes.

This module is the plan layer's record only (no emit imports): the emit layer
fills it in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_FIELD = ConfigDict(extra="forbid", frozen=True)
GB = 1e9

TargetStatus = Literal["written", "refused", "unsupported"]


class StageFit(BaseModel):
    """Peak HBM of one pipeline stage under the target's runtime."""

    model_config = _FIELD
    stage: int = Field(description="Stage index.")
    peak_bytes: float = Field(description="Per-GPU HBM peak of the written strategy on this stage.")
    capacity_bytes: float = Field(description="HBM of the stage's device.")
    fits: bool = Field(description="peak_bytes <= capacity_bytes.")


class TargetCheck(BaseModel):
    """One target's written strategy, its cost under the target's runtime, and the verdict."""

    model_config = _FIELD
    target: str = Field(description="Target name (deepspeed, torch, torchtitan, megatron, slurm, k8s).")
    runtime: str = Field(description="Runtime profile the target's files run under (hardware/data/runtimes).")
    status: TargetStatus = Field(
        description="written: the folder holds the plan; refused: the written strategy does not fit or is too "
        "slow under the runtime; unsupported: the framework cannot express the plan.")
    reasons: tuple[str, ...] = Field(
        (), description="Why it is refused or unsupported, one clause each (empty when written).")
    written_spec: str | None = Field(
        None, description="SPEC of the strategy the files ask for; None when there is none (unsupported).")
    changed: tuple[str, ...] = Field(
        (), description="SPEC items of the written strategy that differ from the plan's ('key=value').")
    planned: tuple[str, ...] = Field(
        (), description="The plan's values of the same keys, in the same order.")
    step_time_s: float | None = Field(None, description="Step time of the written strategy under the runtime.")
    tokens_per_s_per_gpu: float | None = Field(None, description="Its tokens per second per GPU.")
    fits: bool | None = Field(None, description="It fits HBM on every stage and the host tiers of every node.")
    stages: tuple[StageFit, ...] = Field((), description="Per-stage peak HBM against capacity under the runtime.")
    reference_step_time_s: float | None = Field(
        None, description="Step time of the plan's own strategy under the same runtime (the plan's estimate when "
        "the runtime is the plan's).")
    plan_step_time_s: float = Field(description="The plan's step time (under the plan's runtime).")
    tolerance: float = Field(description="Largest slowdown against the reference that is still written (0.005).")

    @property
    def slower(self) -> float | None:
        """(written - reference) / reference step time; None when not costed."""
        if self.step_time_s is None or not self.reference_step_time_s:
            return None
        return self.step_time_s / self.reference_step_time_s - 1.0

    @property
    def vs_plan(self) -> float | None:
        """(written - plan) / plan step time; None when not costed."""
        if self.step_time_s is None or not self.plan_step_time_s:
            return None
        return self.step_time_s / self.plan_step_time_s - 1.0

    @property
    def what(self) -> str:
        """'the written strategy (...)': what the translation changed, or 'as planned'."""
        if not self.changed:
            return "the written strategy (as planned)"
        return f"the written strategy ({','.join(self.changed)}; plan: {','.join(self.planned)})"

    @property
    def why(self) -> str:
        """The verdict in one clause, without the target's name."""
        if self.status == "written":
            return f"{self.what} runs as planned under the {self.runtime} runtime"
        if self.status == "unsupported":
            return "; ".join(self.reasons)
        return "; ".join(self.reasons) + f" ({self.runtime} runtime)"

    @property
    def line(self) -> str:
        """One line for the command line: 'target: why'."""
        return f"{self.target}: {self.why}"


def memory_reason(what: str, stages: tuple[StageFit, ...], host_reasons: list[str]) -> str:
    """'<what> needs X GB per GPU on stage i, Y GB available', for the stage most over its capacity (or the
    host tier that does not fit)."""
    over = [s for s in stages if not s.fits]
    if not over:
        return f"{what} does not fit: {'; '.join(host_reasons)}"
    worst = max(over, key=lambda s: (s.peak_bytes / s.capacity_bytes, -s.stage))
    return (f"{what} needs {worst.peak_bytes / GB:.1f} GB per GPU on stage {worst.stage}, "
            f"{worst.capacity_bytes / GB:.1f} GB available")


def slower_reason(what: str, step: float, reference: float, same_runtime: bool) -> str:
    """'<what> runs X s per step, P% slower than the plan's Y s' (the plan's strategy under the target's runtime
    when that is not the plan's)."""
    than = (f"the plan's {reference:.4g} s" if same_runtime
            else f"the plan's strategy under the same runtime, {reference:.4g} s")
    return f"{what} runs {step:.4g} s per step, {100 * (step / reference - 1):.1f}% slower than {than}"
