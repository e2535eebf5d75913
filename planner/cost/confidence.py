"""Which terms of an estimate lean on a regime no validated published run covers.

`hardware/data/validated.yaml` lists what the published runs of
tests/data/published_runs.csv validate: the runtimes, devices and precisions of the
tier-A rows the cost model predicts within `tolerance`, and the largest context- and
expert-parallel degree, GPU count and ZeRO-3 sharding group among them, and the fewest tokens
per context-parallel rank.  It is written
by `python tests/bench/coverage.py` (tests/test_confidence.py checks it is current);
nobody edits it by hand.  `assess` compares a job and a strategy with it: an estimate
outside it is marked extrapolated, with one reason per term.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from planner.job import Job
from planner.strategy import Strategy

_FIELD = ConfigDict(extra="forbid", frozen=True)


class Coverage(BaseModel):
    """What the published runs validate (hardware/data/validated.yaml)."""

    model_config = _FIELD
    tolerance: float = Field(description="A row validates its regime when predicted within this |error|.")
    rows: list[int] = Field(description="Ids of the validating rows.")
    runtimes: dict[str, list[int]] = Field(description="Runtime profile -> validating row ids.")
    devices: dict[str, list[int]] = Field(description="Device -> validating row ids.")
    precisions: dict[str, list[int]] = Field(description="Precision -> validating row ids.")
    max_gpus: int = Field(description="Largest GPU count of a validating row.")
    max_cp: int = Field(description="Largest context-parallel degree of a validating row.")
    min_cp_tokens: int = Field(description="Fewest tokens of a sequence per context-parallel rank (seq_len / cp) "
                               "among the validating rows with cp > 1 (0: none has cp > 1).")
    max_ep: int = Field(description="Largest expert-parallel degree of a validating row.")
    moe: bool = Field(description="Whether a validating row trains a mixture-of-experts model.")
    moe_routings: list[str] = Field(
        default_factory=list,
        description="Job.moe_routing of the validating mixture-of-experts rows (balanced: forced or capacity-padded "
        "routing; learned: the routing imbalance constant is in play).")
    max_zero3_group: int = Field(description="Largest ZeRO-3/FSDP sharding group (dp x cp) of a validating row.")


class Confidence(BaseModel):
    """Whether an estimate stays inside what published runs validate, and why not."""

    model_config = _FIELD
    extrapolated: bool = Field(description="Some term leans on a regime no validated published run covers.")
    reasons: list[str] = Field(description="One short line (at most about 100 characters) per such term (empty "
                               "when not extrapolated).")
    details: list[str] = Field(default_factory=list, description="Per reason, in the same order, what was measured "
                               "or what validates the nearest regime (report.md prints them).")


@lru_cache(maxsize=1)
def load_coverage() -> Coverage:
    """hardware/data/validated.yaml."""
    text = resources.files("hardware").joinpath("data", "validated.yaml").read_text()
    return Coverage.model_validate(yaml.safe_load(text))


def assess(job: Job, strategy: Strategy, devices: list[str], coverage: Coverage | None = None) -> Confidence:
    """The terms of `strategy` on `job` (its stages on `devices`) that no validated published run covers."""
    c = coverage or load_coverage()
    s, found = strategy, []
    for gap in job.runtime.known_gaps:
        found.append((f"runtime {job.runtime.name}: {gap.summary}", gap.detail))
    if job.runtime.name not in c.runtimes:
        found.append((f"runtime {job.runtime.name}: no published run validates it",
                      f"validated runtimes: {_names(c.runtimes)}"))
    for device in sorted(set(devices) - set(c.devices)):
        found.append((f"device {device}: no validated run", f"validated devices: {_names(c.devices)}"))
    if job.precision not in c.precisions:
        found.append((f"precision {job.precision}: no validated run", f"validated: {_names(c.precisions)}"))
    found += _parallel(job, s, c)
    return Confidence(extrapolated=bool(found), reasons=[r for r, _ in found], details=[d for _, d in found])


def _names(table: dict[str, list[int]]) -> str:
    return ", ".join(sorted(table))


def _parallel(job: Job, s: Strategy, c: Coverage) -> list[tuple[str, str]]:
    """(reason, detail) per degree or scale beyond the validated runs'."""
    found = []
    if s.cp > c.max_cp:
        found.append((f"context parallelism cp={s.cp}: validated runs reach cp={c.max_cp}",
                      "ring steps and small-chunk attention beyond that degree are unvalidated"))
    elif s.cp > 1 and job.seq_len // s.cp < c.min_cp_tokens:
        found.append((f"context parallelism cp={s.cp} at {job.seq_len // s.cp} tokens per rank: validated runs hold "
                      f">= {c.min_cp_tokens}", "ring-step latency and small-chunk attention are unvalidated there"))
    if job.model.num_experts and not c.moe:
        found.append((f"mixture of experts (ep={s.ep}): no validated MoE run",
                      "all-to-all, routing imbalance and grouped GEMMs are unvalidated"))
    elif s.ep > c.max_ep:
        found.append((f"expert parallelism ep={s.ep}: validated MoE runs reach ep={c.max_ep}", ""))
    if job.model.num_experts and c.moe and job.routing is not None:
        found.append((f"MoE routing statistics: validated MoE runs use {', '.join(c.moe_routings)}",
                      "the expert placement's busiest rank and its replicas' cost are predictions no published run "
                      "checks"))
    elif job.model.num_experts and c.moe and job.moe_routing not in c.moe_routings:
        used = ", ".join(c.moe_routings)
        found.append((f"mixture of experts with {job.moe_routing} routing: validated runs use {used}",
                      "moe_routing_imbalance is an estimate no published run checks"))
    gpus = s.tp * s.cp * (s.dp or 1) * s.pp
    if gpus > c.max_gpus:
        found.append((f"{gpus} GPUs: validated runs reach {c.max_gpus}", ""))
    group = (s.dp or 1) * s.cp
    if s.zero == 3 and group > c.max_zero3_group:
        found.append((f"ZeRO-3/FSDP over {group} ranks: validated runs shard over <= {c.max_zero3_group}",
                      "the latency of parameter gathers at that scale is not validated"))
    return found
