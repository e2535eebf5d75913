"""The Plan: what `planner compile` decided, as schema-versioned, deterministic JSON.

A plan records the inputs (and a digest of them), the chosen strategy, where
every pipeline stage runs (blocks, layers, pools, global ranks and the
(node, local GPU) they sit on), memory per tier, the predicted time
breakdown, the solver's certificate and the runners-up.  Emitters read it;
`plan_json` writes it.

Determinism (DESIGN.md principle 5): the same inputs give a byte-identical
plan.json, so nothing here depends on the clock: the solver's wall time is
left out (the CLI's `--json` output carries it).

Rank order is Megatron's (tp fastest, then cp, dp, pp):

    rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index

Ranks fill the cluster's GPUs in pool order (GPU g of the cluster is rank g),
or, with `stage_pools`, each stage takes the next free GPUs of its pool.  For
big jobs rank lists would be huge, so a stage stores rank ranges (`spans`: a
run of consecutive ranks on consecutive GPUs of one pool) and the explicit tp
and cp groups of its first data-parallel replica only; the other groups follow
from the strides in `layout`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware import Cluster
from planner import __version__
from planner.cost.estimate import Breakdown, Estimate, HbmBreakdown, HostMemory, StageReport
from planner.cost.evaluate import evaluate
from planner.cost.layout import stage_layers
from planner.job import Job
from planner.solve import Certificate, CompileOptions, CompileResult
from planner.strategy import Strategy, parse_strategy

SCHEMA_VERSION = "2"

_FIELD = ConfigDict(extra="forbid")


class PlanJob(BaseModel):
    """The job the plan is for."""

    model_config = _FIELD
    model: str = Field(description="Model name.")
    model_params: int = Field(description="Parameters of the model.")
    model_active_params: int = Field(description="Parameters touched per token (differs from model_params for MoE).")
    cluster: str = Field(description="Cluster name (the PRESET:NODES shorthand or the file's name).")
    cluster_description: str = Field(description="One line: nodes, GPUs and pools of the cluster.")
    cluster_gpus: int = Field(description="GPUs in the cluster.")
    num_gpus: int = Field(description="GPUs the plan uses (tp * cp * dp * pp).")
    global_batch: int = Field(description="Sequences (samples for recsys) per optimizer step.")
    seq_len: int = Field(description="Tokens per sequence.")
    tokens_per_step: int = Field(description="global_batch * seq_len.")
    precision: str = Field(description="Compute precision: bf16, fp16 or fp8.")
    flash_attention: bool = Field(description="Fused flash attention assumed.")
    fused_kernels: bool = Field(description="Fused element-wise kernels assumed.")


class RankSpan(BaseModel):
    """Consecutive ranks on consecutive GPUs of one pool.

    Rank r of the span sits at k = first_local_gpu + (r - first_rank):
    node first_node + k // gpus_per_node, local GPU k % gpus_per_node.
    """

    model_config = _FIELD
    pool: str = Field(description="Pool the GPUs belong to.")
    first_rank: int = Field(description="First global rank of the span.")
    last_rank: int = Field(description="Last global rank of the span (inclusive).")
    first_node: int = Field(description="Node of first_rank: nodes are numbered 0.. across pools in cluster order.")
    last_node: int = Field(description="Node of last_rank.")
    first_local_gpu: int = Field(description="GPU index of first_rank inside first_node.")
    gpus_per_node: int = Field(description="GPUs per node of the pool.")


class StageRanks(BaseModel):
    """The global ranks of one pipeline stage and where they sit."""

    model_config = _FIELD
    first_rank: int = Field(description="First global rank of the stage.")
    last_rank: int = Field(description="Last global rank of the stage (inclusive); tp * cp * dp ranks in all.")
    nodes: list[int] = Field(description="[first_node, last_node] the stage's ranks occupy (see spans).")
    spans: list[RankSpan] = Field(description="Rank ranges with their nodes and local GPUs, one per pool touched.")
    tp_groups: list[list[int]] = Field(
        description="Tensor-parallel groups of the first data-parallel replica (one per cp index); "
        "replica d adds d * tp * cp to every rank."
    )
    cp_groups: list[list[int]] = Field(
        description="Context-parallel groups of the first data-parallel replica (one per tp index); "
        "replica d adds d * tp * cp to every rank."
    )


class StageMemory(BaseModel):
    """Memory of one GPU of a stage, per tier."""

    model_config = _FIELD
    hbm: HbmBreakdown = Field(description="GPU memory breakdown.")
    host_dram_bytes: float = Field(description="Bytes this GPU's rank parks in host DRAM (offload).")
    nvme_bytes: float = Field(description="Bytes this GPU's rank parks on NVMe (offload).")


class StageStatePlacement(BaseModel):
    """Where one stage keeps its state (the stage's own offload, device, ratio and re-gather)."""

    model_config = _FIELD
    offload: str = Field("none", description="State offloaded from HBM: none, optimizer, params or all.")
    offload_device: str = Field("cpu", description="Offload target: cpu (host DRAM) or nvme.")
    offload_ratio: float = Field(1.0, description="Share of the optimizer states offloaded (ZeRO-Offload++).")
    regather: str = Field("network", description="ZeRO-3 re-gathers over the network, or from the node's host "
                          "cache (host: FCDP).")


class PlanStage(BaseModel):
    """One pipeline stage: what it runs, where, and what it costs."""

    model_config = _FIELD
    index: int = Field(description="Stage index, 0-based.")
    blocks: list[int] = Field(
        description="[first, last] transformer block (inclusive) the cost model charges to the stage; [] when it "
        "has none.  With vpp > 1 the stage holds the same number of blocks, as `chunks`."
    )
    chunks: list[list[int]] = Field(
        description="[first, last] block of each model chunk the stage runs, in schedule order: [blocks] when "
        "vpp = 1; with vpp > 1 chunk j of stage i is model chunk j * pp + i (Megatron's interleaved layout)."
    )
    layers: int = Field(description="Layers on the stage (embedding, blocks' attention/MLP, norm, head).")
    first_layer: str = Field(description="Name of the stage's first layer.")
    last_layer: str = Field(description="Name of the stage's last layer.")
    pools: list[str] = Field(description="Cluster pools the stage's GPUs belong to.")
    device: str = Field(description="Device type (the slowest, when the stage spans pools).")
    ranks: StageRanks = Field(description="Global ranks and their (node, local GPU).")
    recompute: str = Field(description="Recompute mode of the stage's blocks: none, selective or full.")
    recompute_blocks: int = Field(
        description="Blocks that recompute fully (the first ones of each chunk; Megatron's block method)."
    )
    params_per_gpu: float = Field(description="Parameters per GPU before ZeRO sharding.")
    memory: StageMemory = Field(description="Memory per tier.")
    microbatch_time_s: float = Field(description="One micro-batch forward + backward on this stage, seconds.")
    placement: StageStatePlacement = Field(default_factory=StageStatePlacement,
                                           description="Where the stage keeps its state (stages may differ).")


class RankLayout(BaseModel):
    """How global ranks map to parallel groups."""

    model_config = _FIELD
    order: str = Field(description="Rank order, fastest first.")
    rank_formula: str = Field(description="Global rank from the group indices.")
    tp: int = Field(description="Tensor-parallel degree.")
    cp: int = Field(description="Context-parallel degree.")
    dp: int = Field(description="Data-parallel degree.")
    pp: int = Field(description="Pipeline stages.")
    ep: int = Field(description="Expert-parallel degree (inside the data-parallel group).")
    strides: dict[str, int] = Field(
        description="Rank distance between neighbours of each group: tp 1, cp tp, dp tp*cp, pp tp*cp*dp."
    )
    groups: dict[str, str] = Field(description="Construction rule of each group kind.")


class PlanTime(BaseModel):
    """Predicted time of a training step."""

    model_config = _FIELD
    step_time_s: float = Field(description="Seconds per optimizer step.")
    tokens_per_s: float = Field(description="Tokens per second, whole job.")
    tokens_per_s_per_gpu: float = Field(description="tokens_per_s / num_gpus.")
    mfu: float = Field(description="Model FLOPs utilisation against the dense 16-bit peak.")
    hfu: float = Field(description="Hardware FLOPs utilisation (recompute included).")
    micro_batches: int = Field(description="Micro-batches per step per data-parallel replica (0 for replica "
                               "groups: see each group's plan).")
    breakdown: Breakdown = Field(description="Where the step's time goes.")


class PlanMemory(BaseModel):
    """Memory summary over stages and nodes."""

    model_config = _FIELD
    peak_bytes: float = Field(description="Largest per-GPU HBM peak over stages.")
    capacity_bytes: float = Field(description="HBM capacity of that stage's device.")
    binding_stage: int = Field(description="Stage closest to its HBM capacity.")
    headroom_bytes: float = Field(description="capacity_bytes - peak_bytes of the binding stage.")
    fits: bool = Field(description="Every stage fits its HBM and every node its host tiers.")
    host: HostMemory = Field(description="Host DRAM and NVMe of the busiest node.")


class PlanSolver(BaseModel):
    """The solver's certificate (no wall time: plan.json is deterministic)."""

    model_config = _FIELD
    objective_kind: Literal["time", "cost"] = Field(description="time: seconds per step; cost: USD per step.")
    status: Literal["OPTIMAL", "FEASIBLE"] = Field(description="OPTIMAL (proved) or FEASIBLE (see gap).")
    objective: float = Field(description="Objective of the plan.")
    bound: float = Field(description="No plan in the space does better than this.")
    gap: float = Field(description="(objective - bound) / objective.")
    configurations: int = Field(description="Global configurations in the space.")
    solved: int = Field(description="Configurations whose program was solved.")
    pruned: int = Field(description="Configurations pruned by their lower bound.")
    time_limit_s: float = Field(description="The search's wall-clock budget.")
    max_step_time_s: float | None = Field(description="Step-time limit with the cost objective, if any.")
    stopped: Literal["time_limit"] | None = Field(
        None, description="None: the search ran to its end, so the same inputs give this plan on any machine; "
        "time_limit: the wall-clock budget cut it short, so the plan depends on the machine's speed and load "
        "and another run may differ (a larger time_limit_s gives a reproducible plan).")


class PlanRunnerUp(BaseModel):
    """A next-best strategy the search solved."""

    model_config = _FIELD
    strategy_spec: str = Field(description="Its SPEC string.")
    objective: float = Field(description="Its objective (same unit as solver.objective).")
    worse_pct: float = Field(description="How much worse its objective is than the plan's, percent.")
    step_time_s: float = Field(description="Its predicted step time, seconds.")
    tokens_per_s: float = Field(description="Its predicted throughput, tokens per second.")


class PlanGroup(BaseModel):
    """A replica group: one pool's GPUs, its batch share and its own plan."""

    model_config = _FIELD
    pool: str = Field(description="The cluster pool the group runs on.")
    batch: int = Field(description="Sequences (samples) per step the group trains on.")
    first_rank: int = Field(description="Global rank of the group's rank 0 (pools in cluster order).")
    first_node: int = Field(description="Cluster node index of the group's first node.")
    plan: "Plan" = Field(description="The group's plan for its pool alone and its batch share; its ranks and "
                         "nodes count from first_rank and first_node.")


class Plan(BaseModel):
    """A compiled training plan (plan.json)."""

    model_config = _FIELD
    schema_version: Literal["2"] = Field(SCHEMA_VERSION, description="Version of this schema.")
    planner_version: str = Field(description="Version of the planner that wrote the plan.")
    inputs_digest: str = Field(
        description="sha256 (hex) of the canonical JSON of the model, cluster, job parameters and compile options."
    )
    options: dict | None = Field(
        None, description="The compile options (what `planner.search` was asked: objective, limits, space), part of "
        "inputs_digest; `planner simulate` recomputes the digest from them and the model and cluster it loads. "
        "None in plans written before it was recorded.")
    job: PlanJob = Field(description="The job.")
    strategy: dict = Field(description="The chosen strategy, every field resolved (as `estimate --json`).")
    strategy_spec: str = Field(description="The chosen strategy as a SPEC string.")
    layout: RankLayout | None = Field(description="Rank order and group construction rules (None for replica "
                                      "groups: each group's plan has its own).")
    stages: list[PlanStage] = Field(description="Pipeline stages in order ([] for replica groups).")
    time: PlanTime = Field(description="Predicted step time and its breakdown.")
    memory: PlanMemory = Field(description="Memory summary.")
    solver: PlanSolver = Field(description="The solver's certificate.")
    runners_up: list[PlanRunnerUp] = Field(description="Next-best strategies, best first.")
    groups: list[PlanGroup] = Field(
        default_factory=list, description="Replica groups (data parallelism across pools, a strategy and batch "
        "share per pool; planner.cost.groups); [] for a single-strategy plan.")


PlanGroup.model_rebuild()


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
        },
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
    per_stage = strategy.tp * strategy.cp * strategy.dp
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
    base = stage * tp * cp * strategy.dp
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
        tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep,
        strides={"tp": 1, "cp": s.tp, "dp": s.tp * s.cp, "pp": s.tp * s.cp * s.dp},
        groups={
            "tp": "tp consecutive ranks",
            "cp": "cp ranks with the same pp, dp and tp index (stride tp)",
            "dp": "dp ranks with the same pp, cp and tp index (stride tp * cp); gradients reduce over dp x cp",
            "pp": "pp ranks with the same dp, cp and tp index (stride tp * cp * dp)",
            "ep": "ep consecutive data-parallel indices with the same pp, cp and tp index",
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
    starts = [(j * strategy.pp + stage) * size for j in range(strategy.vpp)]
    return [[start, start + size - 1] for start in starts]


def _stage(strategy: Strategy, report: StageReport, layers: list, spans: list[RankSpan]) -> PlanStage:
    blocks = tuple(sorted({layer.block for layer in layers if layer.block is not None}))
    hbm = HbmBreakdown(**report.model_dump(include=set(HbmBreakdown.model_fields)))
    return PlanStage(
        index=report.stage, blocks=list(report.blocks), chunks=stage_chunks(strategy, report.stage, list(report.blocks)),
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


def runner_up(job: Job, spec: str, objective: float, best: float) -> PlanRunnerUp:
    estimate = evaluate(job, parse_strategy(spec))
    worse = 100.0 * (objective - best) / best if best > 0 else 0.0
    return PlanRunnerUp(strategy_spec=spec, objective=objective, worse_pct=worse,
                        step_time_s=estimate.step_time_s, tokens_per_s=estimate.tokens_per_s)


def _memory(estimate: Estimate) -> PlanMemory:
    reports = estimate.memory.per_stage
    binding = max(reports, key=lambda r: (r.peak_bytes / r.capacity_bytes, -r.stage))
    return PlanMemory(
        peak_bytes=estimate.memory.peak_bytes, capacity_bytes=estimate.memory.capacity_bytes,
        binding_stage=binding.stage, headroom_bytes=binding.capacity_bytes - binding.peak_bytes,
        fits=estimate.memory.fits, host=estimate.memory.host,
    )


def build_plan(job: Job, result: CompileResult, options: CompileOptions) -> Plan:
    """The Plan of a compile result: deterministic in (job, result, options)."""
    if result.groups is not None:
        from planner.plan_groups import build_group_plan  # it builds each group's Plan with this function

        return build_group_plan(job, result, options)
    estimate = result.estimate
    strategy = Strategy.model_validate(estimate.strategy)  # dp resolved
    spans = stage_spans(job.cluster, strategy)
    layers = stage_layers(job.model, strategy.pp, strategy.split)
    stages = [_stage(strategy, report, stage_layers_, stage_spans_)
              for report, stage_layers_, stage_spans_ in zip(estimate.memory.per_stage, layers, spans)]
    cert = result.certificate
    best = cert.objective
    return Plan(
        planner_version=__version__,
        inputs_digest=inputs_digest(job, options),
        options=options.model_dump(mode="json"),
        job=plan_job(job, estimate.num_gpus),
        strategy=estimate.strategy,
        strategy_spec=estimate.strategy_spec,
        layout=_layout(strategy),
        stages=stages,
        time=PlanTime(
            step_time_s=estimate.step_time_s, tokens_per_s=estimate.tokens_per_s,
            tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu, mfu=estimate.mfu, hfu=estimate.hfu,
            micro_batches=estimate.micro_batches, breakdown=estimate.breakdown,
        ),
        memory=_memory(estimate),
        solver=plan_solver(cert, options),
        runners_up=[runner_up(job, r.strategy, r.objective, best) for r in result.runners_up],
    )


def plan_job(job: Job, num_gpus: int) -> PlanJob:
    """The job section of a plan."""
    return PlanJob(
        model=job.model.name, model_params=job.model.params, model_active_params=job.model.active_params,
        cluster=job.cluster.name, cluster_description=job.cluster.describe(), cluster_gpus=job.cluster.num_gpus,
        num_gpus=num_gpus, global_batch=job.global_batch, seq_len=job.seq_len, tokens_per_step=job.tokens_per_step,
        precision=job.precision, flash_attention=job.flash_attention, fused_kernels=job.fused_kernels,
    )


def plan_solver(cert: Certificate, options: CompileOptions) -> PlanSolver:
    """The solver section of a plan (the certificate without wall time)."""
    return PlanSolver(
        objective_kind=options.objective, status=cert.status, objective=cert.objective, bound=cert.bound,
        gap=cert.gap, configurations=cert.configurations, solved=cert.solved, pruned=cert.pruned,
        time_limit_s=options.time_limit, max_step_time_s=options.max_step_time, stopped=cert.stopped,
    )


def plan_json(plan: Plan) -> str:
    """plan.json text: field order as declared, indent 2, floats as Python repr, trailing newline."""
    return json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=False, allow_nan=False) + "\n"


def plan_json_schema() -> dict:
    """JSON Schema of plan.json, its properties at the top (replica groups nest Plans: pydantic then
    puts Plan itself under $defs and refers to it)."""
    schema = Plan.model_json_schema()
    if "$ref" not in schema:
        return schema
    defs = schema["$defs"]
    return {**defs[schema["$ref"].rsplit("/", 1)[-1]], "$defs": defs}
