"""Runtime profiles: how a training framework stores, overlaps and schedules a strategy.

Megatron-LM, DeepSpeed, torchtitan and our own runtime (`planner.runtime`) run
the same strategy differently: Megatron's distributed optimizer shards the
optimizer but keeps fp32 gradients whole, DeepSpeed keeps an fp32 gradient
partition for its optimizer, FSDP2 keeps fp32 shards and gathers bf16 copies,
and under pipeline parallelism torchtitan does not reshard after forward.  A
`RuntimeProfile` states those facts for one framework; the cost model
(`planner.cost.evaluate(job, strategy, runtime)`), the search space and the
emitters' re-check all read it.

Profiles are data: `hardware/data/runtimes/<name>.yaml`, every value with its
source; a profile may `extends:` another and override some sections (a
framework's older release, or its eager mode).  docs/cost-model.md describes
how each field enters the cost model.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import PlannerInputError
from planner.profile.sections import (_FIELD, Activations, Autocast, Gather, GatherCalls, Gathering, GatherUnits,
                                      Kernels, LayerSaves, Loss, LossBytes, Overlap, SavedTensor, SaveWidth,
                                      SelectiveRecompute, StateKind, StateTerm)
from planner.profile.space import ExpertCapacity, Pipelining, RecomputeCounts, Space, recompute_counts_allowed
from planner.strategy import Strategy

__all__ = ["Activations", "Autocast", "CLI_RUNTIME", "ExpertCapacity", "Gather", "GatherCalls", "Gathering",
           "GatherUnits", "JOB_RUNTIME", "Kernels", "KnownGap", "LayerSaves", "Loss", "LossBytes", "Overlap",
           "Pipelining", "RecomputeCounts", "RuntimeProfile", "SavedTensor", "SaveWidth", "SelectiveRecompute",
           "Space", "StateKind", "StateTerm", "load_runtime", "recompute_counts_allowed", "runtime_names"]


class KnownGap(BaseModel):
    """A measured error of the cost model under a runtime that it does not model yet."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    summary: str = Field(max_length=80, description="What is off, in one short line (the estimate's text output).")
    detail: str = Field(description="The measurement behind it and its source (report.md, --json).")


class RuntimeProfile(BaseModel):
    """One framework as it runs a strategy."""

    model_config = _FIELD
    name: str = Field(description="Profile name (the data file's stem).")
    description: str = Field(description="What framework and release it describes.")
    version: str = Field(description="The release the profile was read from.")
    states: tuple[StateTerm, ...] = Field(min_length=1, description="Per-parameter states in HBM.")
    gathering: Gathering = Field(description="How sharded weights come back for compute.")
    overlap: Overlap = Field(description="Data-parallel overlap.")
    kernels: Kernels = Field(description="Kernel facts.")
    loss: Loss = Field(default_factory=Loss, description="What the loss holds per logit.")
    pipelining: Pipelining = Field(default_factory=Pipelining, description="What its pipeline schedule holds.")
    activations: Activations | None = Field(
        None, description="What the runtime saves for backward per layer kind; null: the model graph's "
        "Korthikanti count.")
    selective: SelectiveRecompute | None = Field(
        None, description="What its recompute=selective keeps and redoes; null: Megatron's selective recompute "
        "(the attention core, the model graph's saves without score tensors).")
    space: Space = Field(description="What it can express.")
    expert_capacity: ExpertCapacity | None = Field(
        None, description="How its MoE layer pads and drops tokens; null: dropless (every routed token is computed, "
        "the busiest rank waiting on the others: Megatron-Core's default, torch's grouped GEMMs).")
    known_gaps: tuple[KnownGap, ...] = Field(
        (), description="What a measurement showed the cost model gets wrong for this runtime and does not model "
        "yet, with the measurement; every estimate under it names them (planner.cost.confidence).")

    def state_bytes(self, kind: StateKind, params: float, zero: int, shard: int) -> float:
        """HBM bytes of every state term of `kind` for `params` parameters."""
        return sum(t.bytes(params, zero, shard) for t in self.states if t.kind == kind)

    def cannot_express(self, strategy: Strategy, model_has_experts: bool = False,
                       flash_attention: bool = True, split_blocks: tuple[int, ...] | None = None,
                       micro_batches: int | None = None, shared_experts: bool = False) -> list[str]:
        """Why this framework cannot run `strategy` (empty when it can).  `split_blocks`: the blocks per
        stage the strategy puts on each stage (its split, resolved); `micro_batches`: per replica, when known;
        `shared_experts`: the model's MoE layers have always-active experts."""
        s, sp = strategy, self.space
        out: list[str] = []
        refusal = self.model_refusal(int(model_has_experts), shared_experts)
        if refusal is not None:
            out.append(refusal)
        # the reasons are templates, formatted only for the checks that fail: the certificate oracle asks this of
        # about a million candidates per run, most refused
        checks = (
            (s.tp > 1 and not sp.tensor_parallel, "tensor parallelism (tp={s.tp})"),
            (s.cp > 1 and not sp.context_parallel, "context parallelism (cp={s.cp})"),
            (s.cp > 1 and sp.context_parallel and sp.context_parallel_needs_flash and not flash_attention,
             "context parallelism without fused attention"),
            (s.ep > 1 and not sp.expert_parallel, "expert parallelism (ep={s.ep})"),
            (s.expert_tp != s.tp and not (sp.expert_parallel and sp.expert_tensor_parallel),
             "expert tensor parallelism (etp={s.etp}) apart from tp"),
            (s.ep_overlap and s.ep > 1 and not (sp.expert_parallel and sp.ep_overlap), "ep_overlap"),
            (s.dispatcher not in sp.dispatchers, "dispatcher={s.dispatcher}"),
            (s.pp == 1 and s.zero not in sp.zero_stages, "zero={s.zero}"),
            (s.pp > 1 and s.zero not in sp.zero_stages_pipelined, "zero={s.zero} with pipeline parallelism"),
            (s.zero > 0 and s.shard not in sp.shard_scopes, "shard={s.shard}"),
            (s.per_stage_placement and not sp.per_stage_placement, "a different offload setting per stage"),
            (s.regather == "host" and not sp.host_regather, "regather=host (host-memory weight cache)"),
            (s.pp > 1 and s.pipeline_schedule not in sp.schedules, "schedule={s.pipeline_schedule}"),
            (s.recompute == "selective" and not sp.selective_recompute, "recompute=selective"),
            (s.recompute_every is not None and not sp.recompute_every,
             "recompute_every={s.recompute_every} (every k-th block)"),
            (s.tp_overlap and s.tp > 1 and not sp.tp_overlap, "tp_overlap"),
            (s.dp_overlap != "on" and not sp.dp_overlap_off, "dp_overlap={s.dp_overlap}"),
            (micro_batches is not None and s.pp > 1 and s.pipeline_schedule == "1f1b" and sp.one_f_one_b_needs_stages
             and micro_batches < s.pp, "1F1B over {micro_batches} micro-batches on {s.pp} stages (needs >= pp)"),
        )
        out += [what.format(s=s, micro_batches=micro_batches) for bad, what in checks if bad]
        if model_has_experts and sp.moe:
            out += self._moe_refusals(s)
        if sp.recompute_layers != "per_stage" and not recompute_counts_allowed(s, split_blocks, sp.recompute_layers):
            what = "every block or none" if sp.recompute_layers == "all" else "one count for every stage"
            out.append(f"recompute_layers={'/'.join(map(str, s.recompute_layers or ()))} ({what})")
        for stage in range(s.pp):
            view = s.for_stage(stage)
            if view.offload not in sp.offloads:
                out.append(f"offload={view.offload}")
            elif view.offload != "none" and view.offload_device not in sp.offload_devices:
                out.append(f"offload_device={view.offload_device}")
            if view.offload_ratio < 1.0 and not sp.partial_offload:
                out.append(f"offload_ratio={view.offload_ratio:g}")
        if split_blocks is not None and len(split_blocks) > 1:
            middle = split_blocks[1:-1]
            if sp.split == "even" and len(set(split_blocks)) > 1:
                out.append(f"split={'/'.join(map(str, split_blocks))} (even splits only)")
            elif sp.split == "ends" and len(set(middle)) > 1:
                out.append(f"split={'/'.join(map(str, split_blocks))} (only the first and last stage may differ)")
            elif s.vpp > 1 and sp.split != "ends" and (len(set(split_blocks)) > 1 or split_blocks[0] % s.vpp):
                # Megatron lays out uneven chunks (planner.chunks); the looped schedules of torch need even ones
                out.append(f"split={'/'.join(map(str, split_blocks))} with vpp={s.vpp} (chunks must be even)")
        return list(dict.fromkeys(out))

    def model_refusal(self, num_experts: int, shared_experts: bool = False) -> str | None:
        """What this framework cannot run of a model whatever the strategy (None when it can run it): a
        mixture-of-experts model at all, or one with shared experts (DeepSpeed's MoE layer has none)."""
        if num_experts and not self.space.moe:
            return "mixture-of-experts models"
        if num_experts and shared_experts and not self.space.shared_experts:
            return "mixture-of-experts models with shared experts"
        return None

    def _moe_refusals(self, s: Strategy) -> list[str]:
        """What of a mixture-of-experts model's strategy this framework refuses (DeepSpeed's own MoE layer: no
        ZeRO-3, no pipeline)."""
        sp = self.space
        stages = sp.moe_zero_stages
        return [what for bad, what in (
            (stages is not None and s.zero not in stages, f"zero={s.zero} with mixture-of-experts layers"),
            (s.pp > 1 and not sp.moe_pipelined, "pipeline parallelism with mixture-of-experts layers"),
        ) if bad]


# a Job built directly (what planner costed before profiles); planner.load_job, estimate, compile and the command
# line use planner.DEFAULT_RUNTIME, which is CLI_RUNTIME
JOB_RUNTIME = "reference"
CLI_RUNTIME = "planner"


def _data_dir():
    return resources.files("hardware").joinpath("data", "runtimes")


def runtime_names() -> tuple[str, ...]:
    """Every built-in profile name, sorted."""
    return tuple(sorted(p.name.removesuffix(".yaml") for p in _data_dir().iterdir() if p.name.endswith(".yaml")))


def _merge(base: dict, override: dict) -> dict:
    """`override` on top of `base`, section by section (mappings merge, everything else replaces)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _raw(name: str, seen: tuple[str, ...] = ()) -> dict:
    if name not in runtime_names():
        raise PlannerInputError(f"--runtime: unknown runtime {name!r}; known: {', '.join(runtime_names())}")
    if name in seen:
        raise PlannerInputError(f"runtimes/{name}.yaml: extends: cycle {' -> '.join((*seen, name))}")
    data = yaml.safe_load(_data_dir().joinpath(f"{name}.yaml").read_text())
    parent = data.pop("extends", None)
    data["name"] = name
    return _merge(_raw(parent, (*seen, name)), data) if parent else data


@lru_cache(maxsize=None)
def load_runtime(name: str = JOB_RUNTIME) -> RuntimeProfile:
    """The built-in profile `name` (hardware/data/runtimes/<name>.yaml, with what it extends)."""
    try:
        return RuntimeProfile.model_validate(_raw(name))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PlannerInputError(f"runtimes/{name}.yaml: {where}: {first['msg']}") from None
