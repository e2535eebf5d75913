"""DeepSpeed target, mixture-of-experts models: the `moe` section of pipeline.json.

planner.runtime.deepspeed_train replaces the feed-forward of each MoE block with DeepSpeed's own layer,
`deepspeed.moe.layer.MoE(hidden_size, expert, **layer)` (DeepSpeed-MoE, as Megatron-DeepSpeed's
--num-experts / --moe-expert-parallel-size build it): `layer` holds that constructor's keyword arguments
(num_experts, ep_size, k, capacity_factor, min_capacity, drop_tokens, ...), the expert is a SwiGLU MLP of
`expert_ffn`, and the trainer adds `aux_loss_coeff` x the layers' load-balancing losses to the loss.  The
capacity and loss settings are the deepspeed runtime profile's (hardware/data/runtimes/deepspeed.yaml
`expert_capacity`), the ones the cost model priced.  DeepSpeed creates the expert-parallel groups itself
(deepspeed.utils.groups: ep_size consecutive ranks; the expert-data-parallel groups stride over them).
"""

from __future__ import annotations

from models.graph import Layer, MoEShape
from planner.emit import UnsupportedPlan
from planner.job import Job
from planner.profile import ExpertCapacity, load_runtime
from planner.strategy import Strategy


def _moe_layers(job: Job) -> list[Layer]:
    return [layer for layer in job.model.layers if layer.moe is not None]


def runtime_capacity() -> ExpertCapacity:
    """The deepspeed profile's capacity settings (the ones its cost model priced)."""
    capacity = load_runtime("deepspeed").expert_capacity
    if capacity is None:
        raise UnsupportedPlan("deepspeed: runtimes/deepspeed.yaml has no expert_capacity for its MoE layer")
    return capacity


def _shape(job: Job) -> MoEShape:
    shapes = {layer.moe_shape for layer in _moe_layers(job)}
    if len(shapes) != 1:
        raise UnsupportedPlan(f"deepspeed: {job.model.name}'s MoE layers differ in shape; the trainer builds one "
                              "deepspeed.moe.layer.MoE shape for every MoE block")
    return shapes.pop()


def moe_problem(job: Job, strategy: Strategy) -> str | None:
    """Why the trainer cannot build the plan's MoE layers with DeepSpeed's MoE, or None (a dense model)."""
    if not job.model.num_experts:
        return None
    shape = _shape(job)
    if shape.shared_experts:
        return (f"deepspeed: {job.model.name} has {shape.shared_experts} shared expert(s); DeepSpeed's MoE layer "
                "has none (its use_residual is Residual-MoE, a learned mix, not an always-added expert)")
    if strategy.pp > 1:
        return (f"deepspeed: pipeline parallelism (pp={strategy.pp}) with mixture-of-experts layers: DeepSpeed's "
                "MoE returns its load-balancing loss beside the output, which a PipelineModule cannot pass on; "
                "compile with `--target deepspeed` for a plan it can run")
    if shape.num_experts % strategy.ep:
        return f"deepspeed: ep={strategy.ep} does not divide the {shape.num_experts} experts (MoE asserts it)"
    return None


def moe_section(job: Job, strategy: Strategy) -> dict | None:
    """pipeline.json's `moe` (None for a dense model)."""
    if not job.model.num_experts:
        return None
    shape, capacity = _shape(job), runtime_capacity()
    return {
        "layer": {  # deepspeed.moe.layer.MoE's keyword arguments, as its signature names them
            "num_experts": shape.num_experts, "ep_size": strategy.ep, "k": shape.top_k,
            "capacity_factor": capacity.capacity_factor, "eval_capacity_factor": capacity.capacity_factor,
            "min_capacity": capacity.min_capacity, "drop_tokens": True, "use_residual": False,
            # the model's router takes its top k (Mixtral); DeepSpeed's default samples the 2nd expert
            "top2_2nd_expert_sampling": False,
        },
        "expert_ffn": shape.expert_ffn,
        "blocks": sorted({layer.block for layer in _moe_layers(job) if layer.block is not None}),
        "aux_loss_coeff": capacity.aux_loss_coeff,
    }


def moe_readme(section: dict | None) -> list[str]:
    """README.md's mixture-of-experts section."""
    if section is None:
        return []
    layer = section["layer"]
    return [
        "## Mixture of experts", "",
        f"Blocks {section['blocks'][0]}-{section['blocks'][-1]} run `deepspeed.moe.layer.MoE` (pipeline.json "
        f"`moe.layer`): {layer['num_experts']} experts of width {section['expert_ffn']}, top-{layer['k']}, "
        f"spread over ep_size {layer['ep_size']} ranks ({layer['num_experts'] // layer['ep_size']} per rank). "
        f"Each expert takes at most capacity_factor {layer['capacity_factor']:g} x its mean share of a rank's "
        f"routed tokens (at least {layer['min_capacity']}); the rest are dropped (drop_tokens) and the buffer is "
        "padded to that capacity, which the plan's step time assumes. The loss adds "
        f"{section['aux_loss_coeff']:g} x the layers' load-balancing losses. DeepSpeed refuses its MoE layer "
        "under ZeRO-3 and the trainer under pipeline parallelism; expert parameters are ZeRO-partitioned over "
        "the expert-data-parallel group (data-parallel ranks / ep_size).", "",
    ]
