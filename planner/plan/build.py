"""Build a Plan from a compile result: the inputs digest, where each stage's ranks sit, per-stage
contents, memory and time (the single-strategy plan; replica groups: `planner.plan.replica_groups`).

Rank order is Megatron's (tp fastest, then cp, dp, pp); see `planner.plan.schema`.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from hardware import Cluster
from planner.version import __version__
from planner.cost.estimate import Estimate, HbmBreakdown, StageReport
from planner.cost.evaluate import evaluate
from planner.cost.layout import stage_layers
from planner.job import Job
from planner.plan.moe import moe_placement_plan
from planner.plan.schema import (Plan, PlanJob, PlanMemory, PlanRunnerUp, PlanSolver, PlanStage, PlanTime,
                                 RankLayout, RankSpan, StageMemory, StageRanks, StageStatePlacement)
from planner.search.result import Certificate, CompileOptions, CompileResult
from planner.strategy import Strategy, parse_strategy


# ---------------------------------------------------------------- digest


def inputs_digest(job: Job, options: BaseModel | dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of everything the plan depends on (`options`: the
    compile options, dense or embedding, as a model or as the JSON object plan.json records)."""
    payload = {
        "model": job.model.model_dump(mode="json"),
        "cluster": job.cluster.model_dump(mode="json"),
        "job": {
            "global_batch": job.global_batch, "seq_len": job.seq_len, "precision": job.precision,
            "optimizer": job.optimizer, "flash_attention": job.flash_attention, "fused_kernels": job.fused_kernels,
            **({"memory_margin": job.memory_margin} if job.memory_margin else {}),
            **({"moe_routing": job.moe_routing} if job.moe_routing != "learned" else {}),
            **({"fp8_params": True} if job.fp8_params else {}),
            **({"routing": job.routing.model_dump(mode="json")} if job.routing is not None else {}),
        },
        "runtime": job.runtime.model_dump(mode="json"),
        "options": options.model_dump(mode="json") if isinstance(options, BaseModel) else options,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- ranks


def _pool_offsets(cluster: Cluster) -> dict[str, tuple[int, int]]:
    """Pool name -> (first global GPU, first global node)."""
    out, gpu, node = {}, 0, 0
    for pool in cluster.pools:
        out[pool.name] = (gpu, node)
        gpu += pool.gpus
        node += pool.count
    return out


def _span(cluster: Cluster, pool_name: str, first_rank: int, gpu_in_pool: int, count: int) -> RankSpan:
    pool = cluster.pool(pool_name)
    gpn = pool.node.gpus_per_node
    _, node0 = _pool_offsets(cluster)[pool_name]
    last = gpu_in_pool + count - 1
    return RankSpan(pool=pool_name, first_rank=first_rank, last_rank=first_rank + count - 1,
                    first_node=node0 + gpu_in_pool // gpn, last_node=node0 + last // gpn,
                    first_local_gpu=gpu_in_pool % gpn, gpus_per_node=gpn)


def stage_spans(cluster: Cluster, strategy: Strategy) -> list[list[RankSpan]]:
    """Rank spans of every stage of a resolved strategy.

    Without stage_pools rank g is GPU g of the cluster (pools in order); with
    it, each stage takes the next free GPUs of its pool.
    """
    per_stage = strategy.tp * strategy.cp * strategy.data_parallel
    offsets = _pool_offsets(cluster)
    out: list[list[RankSpan]] = []
    used: dict[str, int] = {}
    for stage in range(strategy.pp):
        first = stage * per_stage
        if strategy.stage_pools is not None:
            name = strategy.stage_pools[stage]
            start = used.get(name, 0)
            used[name] = start + per_stage
            out.append([_span(cluster, name, first, start, per_stage)])
            continue
        spans = []
        for pool in cluster.pools:
            gpu0, _ = offsets[pool.name]
            lo, hi = max(first, gpu0), min(first + per_stage, gpu0 + pool.gpus)
            if lo < hi:
                spans.append(_span(cluster, pool.name, lo, lo - gpu0, hi - lo))
        out.append(spans)
    return out


def rank_location(span: RankSpan, rank: int) -> tuple[int, int]:
    """(node, local GPU) of a rank inside `span`."""
    k = span.first_local_gpu + rank - span.first_rank
    return span.first_node + k // span.gpus_per_node, k % span.gpus_per_node


def _stage_ranks(strategy: Strategy, stage: int, spans: list[RankSpan]) -> StageRanks:
    tp, cp = strategy.tp, strategy.cp
    base = stage * tp * cp * strategy.data_parallel
    return StageRanks(
        first_rank=spans[0].first_rank, last_rank=spans[-1].last_rank,
        nodes=[spans[0].first_node, spans[-1].last_node], spans=spans,
        tp_groups=[[base + c * tp + t for t in range(tp)] for c in range(cp)],
        cp_groups=[[base + c * tp + t for c in range(cp)] for t in range(tp)],
    )


def _layout(strategy: Strategy) -> RankLayout:
    s = strategy
    return RankLayout(
        order="tp, cp, dp, pp (tp fastest)",
        rank_formula="rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index",
        tp=s.tp, cp=s.cp, dp=s.data_parallel, pp=s.pp, ep=s.ep,
        strides={"tp": 1, "cp": s.tp, "dp": s.tp * s.cp, "pp": s.tp * s.cp * s.data_parallel},
        groups={
            "tp": "tp consecutive ranks",
            "cp": "cp ranks with the same pp, dp and tp index (stride tp)",
            "dp": "dp ranks with the same pp, cp and tp index (stride tp * cp); gradients reduce over dp x cp",
            "pp": "pp ranks with the same dp, cp and tp index (stride tp * cp * dp)",
            "ep": "ep consecutive ranks with the same pp and tp index (stride tp) counted over dp x cp, cp fastest: "
                  "Megatron-Core folds cp into the expert groups; routed-expert state shards over the ranks "
                  "with the same ep index (expert data parallel, dp * cp / ep)",
            "zero": "ZeRO/FSDP shards over the dp group (shard=full) or its ranks inside one node (shard=node)",
        },
    )


# ---------------------------------------------------------------- stages


def _recompute_blocks(strategy: Strategy, stage: int, blocks: tuple[int, ...]) -> int:
    return sum(1 for b in blocks if strategy.layer_recompute(b, stage, blocks) == "full")


def stage_chunks(strategy: Strategy, stage: int, stage_blocks: list[int]) -> list[list[int]]:
    """[first, last] block of each chunk of `stage` (see PlanStage.chunks); stage_blocks is its [first, last]."""
    if strategy.vpp == 1 or not stage_blocks:
        return [list(stage_blocks)] if stage_blocks else []
    size = (stage_blocks[1] - stage_blocks[0] + 1) // strategy.vpp  # interleaved chunks are even
    if strategy.v_shape:  # zbv, dualpipev: model chunks i and 2 pp - 1 - i
        starts = [stage * size, (2 * strategy.pp - 1 - stage) * size]
    else:
        starts = [(j * strategy.pp + stage) * size for j in range(strategy.vpp)]
    return [[start, start + size - 1] for start in starts]


def _stage(strategy: Strategy, report: StageReport, layers: list, spans: list[RankSpan]) -> PlanStage:
    blocks = tuple(sorted({layer.block for layer in layers if layer.block is not None}))
    hbm = HbmBreakdown(**report.model_dump(include=set(HbmBreakdown.model_fields)))
    return PlanStage(
        index=report.stage, blocks=list(report.blocks),
        chunks=stage_chunks(strategy, report.stage, list(report.blocks)),
        layers=len(layers),
        first_layer=layers[0].name if layers else "", last_layer=layers[-1].name if layers else "",
        pools=[span.pool for span in spans], device=report.device,
        ranks=_stage_ranks(strategy, report.stage, spans),
        recompute=strategy.recompute, recompute_blocks=_recompute_blocks(strategy, report.stage, blocks),
        params_per_gpu=report.params,
        memory=StageMemory(hbm=hbm, host_dram_bytes=report.host_offload_bytes, nvme_bytes=report.nvme_offload_bytes),
        microbatch_time_s=report.microbatch_time_s,
        placement=StageStatePlacement(**strategy.stage_placement(report.stage)),
    )


def runner_up(job: Job, spec: str, objective: float, best: float, plan: Estimate | None = None) -> PlanRunnerUp:
    """A runner-up's entry; within_error: its step time is within the model's error of the `plan`'s."""
    estimate = evaluate(job, parse_strategy(spec))
    worse = 100.0 * (objective - best) / best if best > 0 else 0.0
    return PlanRunnerUp(strategy_spec=spec, objective=objective, worse_pct=worse,
                        step_time_s=estimate.step_time_s, tokens_per_s=estimate.tokens_per_s,
                        within_error=plan is not None and plan.interval.indistinguishable(
                            max(plan.step_time_s, estimate.step_time_s), min(plan.step_time_s, estimate.step_time_s)))


def _memory(estimate: Estimate) -> PlanMemory:
    reports = estimate.memory.per_stage
    binding = max(reports, key=lambda r: (r.peak_bytes / r.capacity_bytes, -r.stage))
    return PlanMemory(
        peak_bytes=estimate.memory.peak_bytes, capacity_bytes=estimate.memory.capacity_bytes,
        binding_stage=binding.stage, headroom_bytes=binding.capacity_bytes - binding.peak_bytes,
        fits=estimate.memory.fits, host=estimate.memory.host,
    )


def build_single_plan(job: Job, result: CompileResult, options: CompileOptions) -> Plan:
    """The Plan of a single-strategy compile result: deterministic in (job, result, options)."""
    estimate = result.single_estimate
    strategy = Strategy.model_validate(estimate.strategy)  # dp resolved
    spans = stage_spans(job.cluster, strategy)
    layers = stage_layers(job.model, strategy.pp, strategy.split, strategy.v_shape)
    stages = [_stage(strategy, report, stage_layers_, stage_spans_)
              for report, stage_layers_, stage_spans_ in zip(estimate.memory.per_stage, layers, spans)]
    cert = result.certificate
    best = cert.objective
    return Plan(
        planner_version=__version__,
        inputs_digest=inputs_digest(job, options),
        options=options.model_dump(mode="json"),
        job=plan_job(job, estimate.num_gpus),
        strategy=strategy,
        strategy_spec=estimate.strategy_spec,
        layout=_layout(strategy),
        stages=stages,
        time=PlanTime(
            step_time_s=estimate.step_time_s, tokens_per_s=estimate.tokens_per_s,
            tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu, mfu=estimate.mfu, hfu=estimate.hfu,
            micro_batches=estimate.micro_batches, breakdown=estimate.breakdown, interval=estimate.interval,
        ),
        memory=_memory(estimate),
        solver=plan_solver(cert, options),
        runners_up=[runner_up(job, r.strategy, r.objective, best, estimate) for r in result.runners_up],
        confidence=estimate.confidence,
        moe=moe_placement_plan(job, strategy),
    )


def plan_job(job: Job, num_gpus: int) -> PlanJob:
    """The job section of a plan."""
    return PlanJob(
        model=job.model.name, model_params=job.model.params, model_active_params=job.model.active_params,
        cluster=job.cluster.name, cluster_description=job.cluster.describe(), cluster_gpus=job.cluster.num_gpus,
        num_gpus=num_gpus, global_batch=job.global_batch, seq_len=job.seq_len, tokens_per_step=job.tokens_per_step,
        precision=job.precision, flash_attention=job.flash_attention, fused_kernels=job.fused_kernels,
        runtime=job.runtime.name, memory_margin=job.memory_margin, moe_routing=job.moe_routing,
        fp8_params=job.fp8_params, routing=job.routing,
    )


def plan_solver(cert: Certificate, options: CompileOptions) -> PlanSolver:
    """The solver section of a plan (the certificate without wall time)."""
    return PlanSolver(
        objective_kind=options.objective, status=cert.status, objective=cert.objective, bound=cert.bound,
        gap=cert.gap, configurations=cert.configurations, solved=cert.solved, pruned=cert.pruned,
        time_limit_s=options.time_limit if options.work_limit is None else None, work_limit_s=options.work_limit,
        max_step_time_s=options.max_step_time, stopped=cert.stopped,
        space_runtimes=list(options.space_runtimes),
    )
