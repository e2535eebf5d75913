"""Check a strategy against a job: divisibility and structural rules.

Each rule mirrors what the engines enforce (Megatron-LM's argument checks,
torchtitan's ParallelDims, DeepSpeed's batch assertions), so a strategy that
passes here can be launched.
"""

from __future__ import annotations

from models.graph import LayerKind
from planner.errors import PlannerInputError
from planner.job import Job
from planner.strategy import Strategy


def check_strategy(job: Job, strategy: Strategy) -> Strategy:
    """Resolve dp and validate; returns the resolved strategy or raises PlannerInputError."""
    s = _resolve_world(job, strategy)
    model = job.model
    problems: list[str] = []
    if s.tp > 1 and model.family == "recsys":
        problems.append("tp > 1 is not supported for recsys models (shard tables instead)")
    elif s.tp > 1:
        if model.heads % s.tp:
            problems.append(f"heads({model.heads}) % tp({s.tp}) != 0")
        if model.kv_heads % s.tp and s.tp % model.kv_heads:
            problems.append(f"kv_heads({model.kv_heads}) and tp({s.tp}): neither divides the other")
    blocks = model.num_blocks
    if s.pp > 1 and s.split is None and blocks % (s.pp * s.vpp):
        own = job.runtime.space.default_split(blocks, s.pp, s.vpp)  # the framework's own layout, not ours
        if own is not None:
            s = s.model_copy(update={"split": own})
    if s.pp > 1:
        if blocks < s.pp * s.vpp:
            problems.append(f"blocks({blocks}) < pp({s.pp}) * vpp({s.vpp})")
        if s.split is not None:
            if sum(s.split) != blocks:
                problems.append(f"split sums to {sum(s.split)} blocks, model has {blocks}")
            if min(s.split) < s.vpp:
                problems.append(f"every stage needs at least vpp({s.vpp}) blocks; split={s.split}")
        elif s.vpp > 1 and blocks % (s.pp * s.vpp):
            problems.append(f"blocks({blocks}) % (pp({s.pp}) * vpp({s.vpp})) != 0 for an even interleaved split")
    replicas_batch = s.data_parallel * s.mbs
    if job.global_batch % replicas_batch:
        problems.append(f"global batch({job.global_batch}) % (dp({s.dp}) * mbs({s.mbs})) != 0")
    if s.cp > 1:
        if job.seq_len % (2 * s.cp):
            problems.append(f"seq_len({job.seq_len}) % (2 * cp({s.cp})) != 0 (load-balanced causal split)")
        if model.family == "recsys":
            problems.append("cp > 1 needs a sequence model")
    if s.ep > 1:
        if not model.num_experts:
            problems.append(f"ep({s.ep}) > 1 but the model has no experts")
        elif model.num_experts % s.ep:
            problems.append(f"experts({model.num_experts}) % ep({s.ep}) != 0")
    if s.ep > 1 or s.etp is not None:
        if not model.num_experts:
            if s.ep == 1:
                problems.append(f"etp({s.etp}) set but the model has no experts")
        elif s.tp * s.cp * s.data_parallel % (s.expert_tp * s.ep):
            problems.append(f"tp({s.tp}) * cp({s.cp}) * dp({s.dp}) % (etp({s.expert_tp}) * ep({s.ep})) != 0 "
                            "(expert groups fold over a stage's ranks)")
    if s.pipeline_schedule == "interleaved":
        micro = job.global_batch // max(1, replicas_batch)
        if micro % s.pp:
            problems.append(f"interleaved schedule needs micro-batches({micro}) % pp({s.pp}) == 0")
    if s.v_shape:
        # torch's ScheduleDualPipeV raises below one micro-batch per model chunk; ScheduleZBVZeroBubble pads its
        # order to 2 pp - 1 with idle slots, which the cost model's closed form (planner.cost.pipeline) does not
        # price, so both need as many
        micro = job.global_batch // max(1, replicas_batch)
        if micro < 2 * s.pp:
            problems.append(f"{s.pipeline_schedule} needs micro-batches({micro}) >= 2 * pp({s.pp}) (one per model "
                            "chunk)")
    if any(layer.kind == LayerKind.EMBEDDING_BAG for layer in model.layers) and s.pp > 1:
        problems.append("pp > 1 is not supported for recsys models")
    if problems:
        raise PlannerInputError("invalid strategy: " + "; ".join(problems))
    return s


def _resolve_world(job: Job, strategy: Strategy) -> Strategy:
    """Resolve dp: from the GPU count, or, with explicit stage pools, check each pool's capacity."""
    if strategy.stage_pools is None:
        return strategy.with_dp(job.cluster.num_gpus)
    if strategy.dp is None:
        raise PlannerInputError("strategy: dp: required with stage_pools")
    known = {pool.name: pool for pool in job.cluster.pools}
    ranks = strategy.tp * strategy.cp * strategy.dp
    for name in sorted(set(strategy.stage_pools)):
        if name not in known:
            raise PlannerInputError(f"strategy: stage_pools: unknown pool {name!r}; known: {', '.join(known)}")
        used = strategy.stage_pools.count(name) * ranks
        if used > known[name].gpus:
            raise PlannerInputError(
                f"strategy: stage_pools: pool {name} has {known[name].gpus} GPUs, its "
                f"{strategy.stage_pools.count(name)} stages need {used} (tp*cp*dp = {ranks} each)"
            )
    return strategy
