"""The expert placement section of a plan (`moe` in plan.json and in `compile --json`): the placement the plan
was costed with, and the same strategy costed under the baselines' placements (EPLB on the same redundant
slots, Megatron's contiguous order) by the one cost model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hardware import load_catalog
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
    no_replica_max_load_ratio: float = Field(description="Busiest rank over the mean of planner's placement "
                                             "without redundant slots (a relabelling of the experts: what "
                                             "Megatron-Core can hold).")
    no_replica_step_time_s: float = Field(description="Predicted step time of the same strategy without replicas.")
    replica_memory_bytes: float = Field(description="Peak HBM per GPU the replicas add (planner's placement against "
                                        "the contiguous one on the same strategy: weights, gradients, optimizer "
                                        "states as the strategy shards them).")
    layers: list[LayerPlacement] = Field(description="Per traced MoE layer: expert ids on each rank, rank by rank.")


def without_replicas(job: Job) -> Job:
    """`job` with its routing statistics' redundant slots dropped: planner's placement becomes a relabelling of
    the experts, E/ep a rank (what Megatron-Core can hold); `job` itself without statistics."""
    if job.routing is None or not job.routing.redundant_slots:
        return job
    return job.model_copy(update={"routing": job.routing.without_replicas()})


def moe_placement_plan(job: Job, strategy: Strategy) -> MoePlacementPlan | None:
    """The plan's `moe` section (None without routing statistics or experts)."""
    placed = job.expert_placement(strategy.ep)
    if placed is None:
        return None
    ours = evaluate(job, strategy)
    eplb = evaluate(job.model_copy(update={"expert_placement_policy": "eplb"}), strategy)
    contiguous = evaluate(job.model_copy(update={"expert_placement_policy": "contiguous"}), strategy)
    bare = without_replicas(job)
    alone = evaluate(bare, strategy)
    return MoePlacementPlan(
        ep=placed.ep, slots_per_rank=placed.slots_per_rank, redundant_slots=placed.redundant_slots,
        replicated_slots_per_rank=placed.replicated_slots_per_rank, eplb_policy=placed.eplb_policy,
        max_load_ratio=placed.max_load_ratio, eplb_max_load_ratio=placed.eplb_max_load_ratio,
        contiguous_max_load_ratio=placed.contiguous_max_load_ratio, step_time_s=ours.step_time_s,
        eplb_step_time_s=eplb.step_time_s, contiguous_step_time_s=contiguous.step_time_s,
        no_replica_max_load_ratio=bare.moe_imbalance(load_catalog(), strategy.ep),
        no_replica_step_time_s=alone.step_time_s,
        replica_memory_bytes=ours.memory.peak_bytes - contiguous.memory.peak_bytes, layers=placed.layers,
    )


def _placement_rows(moe: MoePlacementPlan) -> list[list[str]]:
    gb = 1e9
    return [
        ["planner (CP-SAT, warm-started from EPLB)", f"{moe.max_load_ratio:.3f}", f"{moe.step_time_s:.3f}",
         f"{moe.replica_memory_bytes / gb:.2f}"],
        [f"EPLB ({moe.eplb_policy}, re-implemented), same slots", f"{moe.eplb_max_load_ratio:.3f}",
         f"{moe.eplb_step_time_s:.3f}", f"{moe.replica_memory_bytes / gb:.2f}"],
        ["planner without replicas (a relabelling)", f"{moe.no_replica_max_load_ratio:.3f}",
         f"{moe.no_replica_step_time_s:.3f}", "0"],
        ["Megatron contiguous", f"{moe.contiguous_max_load_ratio:.3f}", f"{moe.contiguous_step_time_s:.3f}", "0"],
    ]


def moe_report_lines(plan) -> list[str]:
    """report.md's Expert placement section (empty without routing statistics)."""
    moe, routing = plan.moe, plan.job.routing
    if moe is None or routing is None:
        return []
    header = ["placement", "busiest rank / mean", "step s (this strategy)", "replica HBM GB (approx.)"]
    replicas = moe.redundant_slots > 0
    lines = [
        "## Expert placement",
        "",
        f"Routing statistics: {routing.source}. At ep={moe.ep} each rank holds {moe.slots_per_rank} expert slots "
        f"({moe.redundant_slots} redundant per MoE layer); a replicated expert's tokens split evenly among its "
        "replicas. Ratios are the mean over MoE layers of each layer's busiest expert-parallel rank over the mean; "
        "step times are this plan's strategy costed under each placement (predictions). plan.json `moe.layers` "
        "holds each layer's expert ids per rank.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|--:|--:|--:|",
        *("| " + " | ".join(row) + " |" for row in _placement_rows(moe)),
        "",
        "Megatron-Core places experts contiguously (rank r of the expert-parallel group holds experts "
        "r E/ep .. (r+1) E/ep - 1) and has no redundant experts in training: "
        + ("it cannot express this plan's replicas. A placement without them is a relabelling of the experts "
           "(permute the router's rows and the experts' weights in the checkpoint); its megatron target is "
           "costed that way (the row without replicas)." if replicas else
           "this plan's placement has no replicas, so it is a relabelling of the experts: "
           "megatron/expert_placement.json gives, per MoE layer, the expert id for each of Megatron's "
           "contiguous slots; apply it by permuting the router's rows and the experts' weights in the "
           "checkpoint before training (planner does not convert checkpoints)."),
        "planner's trainer runs a placement map with replicas in planner/runtime/moe.py (PlacedMoE); its "
        "model has no MoE blocks yet, so the torch target does not run MoE plans.",
        "",
    ]
    return lines
