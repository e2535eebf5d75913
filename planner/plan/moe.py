"""The expert placement section of a plan (`moe` in plan.json and in `compile --json`): the placement the plan
was costed with, and the same strategy costed under the baselines' placements (EPLB on the same redundant
slots, Megatron's contiguous order) by the one cost model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.cost import evaluate
from planner.job import Job
from planner.routing.placement import LayerPlacement
from planner.strategy import Strategy


class MoePlacementPlan(BaseModel):
    """Expert placement of a plan under routing statistics, with the baselines on the same strategy."""

    model_config = ConfigDict(extra="forbid")
    ep: int = Field(description="Expert-parallel degree of the plan.")
    slots_per_rank: int = Field(description="Expert slots per expert-parallel rank (experts / ep + redundant).")
    redundant_slots: int = Field(description="Redundant expert slots per MoE layer used at this degree.")
    replicated_slots_per_rank: int = Field(description="Most slots of one rank holding replicated experts.")
    eplb_policy: str = Field(description="EPLB's policy at this degree (hierarchical or global).")
    max_load_ratio: float = Field(description="Busiest rank's routed tokens over the mean, planner's placement "
                                  "(mean over MoE layers): what the plan's step time is costed with.")
    eplb_max_load_ratio: float = Field(description="The same under DeepSeek's EPLB (re-implemented) on the same "
                                       "loads and slots.")
    contiguous_max_load_ratio: float = Field(description="The same under Megatron's contiguous placement.")
    step_time_s: float = Field(description="Predicted step time with planner's placement.")
    eplb_step_time_s: float = Field(description="Predicted step time of the same strategy with EPLB's placement.")
    contiguous_step_time_s: float = Field(description="Predicted step time of the same strategy, contiguous.")
    replica_memory_bytes: float = Field(description="Peak HBM per GPU the replicas add (planner's placement against "
                                        "the contiguous one on the same strategy: weights, gradients, optimizer "
                                        "states as the strategy shards them).")
    layers: list[LayerPlacement] = Field(description="Per traced MoE layer: expert ids on each rank, rank by rank.")


def moe_placement_plan(job: Job, strategy: Strategy) -> MoePlacementPlan | None:
    """The plan's `moe` section (None without routing statistics or experts)."""
    placed = job.expert_placement(strategy.ep)
    if placed is None:
        return None
    ours = evaluate(job, strategy)
    eplb = evaluate(job.model_copy(update={"expert_placement_policy": "eplb"}), strategy)
    contiguous = evaluate(job.model_copy(update={"expert_placement_policy": "contiguous"}), strategy)
    return MoePlacementPlan(
        ep=placed.ep, slots_per_rank=placed.slots_per_rank, redundant_slots=placed.redundant_slots,
        replicated_slots_per_rank=placed.replicated_slots_per_rank, eplb_policy=placed.eplb_policy,
        max_load_ratio=placed.max_load_ratio, eplb_max_load_ratio=placed.eplb_max_load_ratio,
        contiguous_max_load_ratio=placed.contiguous_max_load_ratio, step_time_s=ours.step_time_s,
        eplb_step_time_s=eplb.step_time_s, contiguous_step_time_s=contiguous.step_time_s,
        replica_memory_bytes=ours.memory.peak_bytes - contiguous.memory.peak_bytes, layers=placed.layers,
    )
