"""What planner's own torch runtime (planner/runtime/) can run: the model, the precision and the strategy of a plan.

The torch, Slurm and Kubernetes emitters refuse a plan it cannot run (UnsupportedPlan), and the runtime checks
the same before it builds anything; one check, beneath both (the runtime must not import an emitter).
"""

from __future__ import annotations

from models.transformer import TransformerConfig
from models.zoo import ZOO
from planner.plan.schema import Plan, ReplicaGroupsStrategy
from planner.strategy import Strategy

TRAINED_PRECISIONS = ("bf16",)  # plan precisions planner.runtime.train runs (fp32 too, with --precision fp32)
_LLAMA_STYLE = {  # TransformerConfig field -> the value the reference model needs
    "activation": "swiglu", "norm": "rmsnorm", "norm_position": "pre", "position": "rope", "bias": False,
    "qkv_bias": False, "tied_embeddings": False, "moe": None, "mla": None, "causal": True, "type_vocab": 0,
    "encoder_heads": False,
}


def config_problem(cfg: TransformerConfig) -> str | None:
    """Why the reference runtime model cannot build `cfg` (naming the field), or None."""
    for name, want in _LLAMA_STYLE.items():
        if getattr(cfg, name) != want:
            return f"{cfg.name}: {name} must be {want!r} for the torch runtime model (got {getattr(cfg, name)!r})"
    return None


def strategy_problem(strategy: Strategy | ReplicaGroupsStrategy) -> str | None:
    """Why the torch runtime cannot run this strategy (a plan's), or None."""
    if isinstance(strategy, ReplicaGroupsStrategy):
        return "a replica-group plan (a strategy per pool) has no torch form; plan.json lists each group's plan"
    if strategy.ep != 1:
        return f"ep={strategy.ep}: not supported by the planner torch runtime (its reference model is dense)"
    if strategy.pipeline_schedule not in ("1f1b", "gpipe", "interleaved", "zbv", "dualpipev"):
        return f"schedule={strategy.pipeline_schedule}: not supported by the planner torch runtime"
    for stage in range(strategy.pp):  # each stage applies its own placement
        place = strategy.for_stage(stage)
        if place.offload_ratio < 1.0:
            return (f"offload_ratio={place.offload_ratio:g}: FSDP2 offloads a module's optimizer states whole, "
                    "not a share")
        if place.regather == "host":
            return "regather=host: the planner torch runtime has no host-memory parameter cache (FCDP)"
        if place.offload != "none" and place.offload_device == "nvme":
            return "offload_device=nvme: not supported by the planner torch runtime (FSDP2 offloads to cpu only)"
    return None


def runtime_problem(plan: Plan) -> str | None:
    """Why `python -m planner.runtime.train` cannot run `plan`, or None."""
    entry = ZOO.get(plan.job.model)
    if entry is None or not isinstance(entry.config, TransformerConfig):
        return (f"model {plan.job.model}: the torch runtime builds zoo transformer models only "
                "(e.g. tiny-llama, llama3-8b)")
    if plan.job.precision not in TRAINED_PRECISIONS:
        return (f"precision {plan.job.precision}: the planner torch runtime trains in bf16 mixed precision "
                "(compile with --precision bf16)")
    return config_problem(entry.config) or strategy_problem(plan.strategy)
