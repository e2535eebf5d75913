"""The Plan: what `planner compile` decided, as schema-versioned, deterministic JSON.

A plan records the inputs (and a digest of them), the chosen strategy, where
every pipeline stage runs (blocks, layers, pools, global ranks and the
(node, local GPU) they sit on), memory per tier, the predicted time
breakdown, the solver's certificate and the runners-up.  Emitters read it;
`plan_json` writes it; `planner.plan.build` makes it from a compile result.

Determinism (docs/design.md principle 5): the same inputs give a byte-identical
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

import json
from typing import Annotated, Final, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator,
                      model_serializer, model_validator)

from models.graph import ModelName as Name
from planner.cost.confidence import Confidence
from planner.cost.interval import Interval
from planner.cost.estimate import Breakdown, HbmBreakdown, HostMemory
from planner.plan.moe import MoePlacementPlan
from planner.routing.stats import RoutingStats
from planner.data.result import DataPlan
from planner.errors import GroupPlanError
from planner.strategy import Strategy

SCHEMA_VERSION: Final = "2"

_FIELD = ConfigDict(extra="forbid")


class PlanJob(BaseModel):
    """The job the plan is for."""

    model_config = _FIELD
    model: Name = Field(description="Model name.")
    model_params: int = Field(description="Parameters of the model.")
    model_active_params: int = Field(description="Parameters touched per token (differs from model_params for MoE).")
    cluster: Name = Field(description="Cluster name (the PRESET:NODES shorthand or the file's name).")
    cluster_description: str = Field(description="One line: nodes, GPUs and pools of the cluster.")
    cluster_gpus: int = Field(description="GPUs in the cluster.")
    num_gpus: int = Field(description="GPUs the plan uses (tp * cp * dp * pp).")
    global_batch: int = Field(description="Sequences (samples for recsys) per optimizer step.")
    seq_len: int = Field(description="Tokens per sequence.")
    tokens_per_step: int = Field(description="global_batch * seq_len.")
    precision: str = Field(description="Compute precision: bf16, fp16, fp8 or mxfp8 (block-scaled FP8, Blackwell).")
    flash_attention: bool = Field(description="Fused flash attention assumed.")
    fused_kernels: bool = Field(description="Fused element-wise kernels assumed.")
    memory_margin: float = Field(0.0, description="Share of each GPU's HBM the plan leaves free (stage capacities "
                                 "are the HBM less it).")
    moe_routing: Literal["learned", "balanced"] = Field(
        "learned", description="Mixture-of-experts routing the plan was costed with (Job.moe_routing).")
    fp8_params: bool = Field(False, description="FP8 primary weights (Job.fp8_params); absent when false.")
    runtime: str = Field("reference", description="Runtime profile the plan was searched and costed under "
                         "(hardware/data/runtimes/<runtime>.yaml).")
    routing: RoutingStats | None = Field(None, description="The routing statistics (`--routing FILE`) the plan was "
                                         "costed with; absent without.")

    @model_serializer(mode="wrap")
    def _routing_when_given(self, handler) -> dict:
        data = handler(self)
        if data.get("routing") is None:
            data.pop("routing", None)  # plans without routing statistics read as before
        if not data.get("fp8_params"):
            data.pop("fp8_params", None)  # nor plans of 16-bit weights
        return data


class RankSpan(BaseModel):
    """Consecutive ranks on consecutive GPUs of one pool.

    Rank r of the span sits at k = first_local_gpu + (r - first_rank):
    node first_node + k // gpus_per_node, local GPU k % gpus_per_node.
    """

    model_config = _FIELD
    pool: Name = Field(description="Pool the GPUs belong to.")
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
        "vpp = 1; with vpp > 1 chunk j of stage i is model chunk j * pp + i (Megatron's interleaved layout), "
        "under zbv and dualpipev model chunks i and 2 pp - 1 - i (a V)."
    )
    layers: int = Field(description="Layers on the stage (embedding, blocks' attention/MLP, norm, head).")
    first_layer: str = Field(description="Name of the stage's first layer.")
    last_layer: str = Field(description="Name of the stage's last layer.")
    pools: list[Name] = Field(description="Cluster pools the stage's GPUs belong to.")
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
    interval: Interval | None = Field(
        None, description="The step time's prediction interval (planner.cost.interval); None for replica groups "
        "(each group's plan has its own) and in plans written before intervals.")


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
    time_limit_s: float | None = Field(description="The search's wall-clock budget (None: a work limit instead).")
    work_limit_s: float | None = Field(
        None, description="CP-SAT deterministic seconds each program could spend, with no wall-clock budget "
        "(compile --work-limit): the search stops at the same point on any machine.")
    max_step_time_s: float | None = Field(description="Step-time limit with the cost objective, if any.")
    space_runtimes: list[str] = Field(
        default_factory=list, description="Runtimes besides the plan's own (job.runtime) whose strategy spaces "
        "the search was confined to: the certificate covers the strategies all of them can express.")
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
    within_error: bool = Field(
        False, description="Its predicted step time lies inside the plan's prediction interval: the two are "
        "indistinguishable within the model's error.")


class PlanPreference(BaseModel):
    """compile --prefer: the certified optimum, and why another plan within the model's error was chosen."""

    model_config = _FIELD
    rule: Literal["validated", "fastest"] = Field(
        description="validated: among plans whose step time lies inside the optimum's prediction interval, the "
        "fastest with more HBM headroom or fewer extrapolated terms when the optimum lacks them; fastest: the "
        "optimum of the objective.")
    optimum_spec: str = Field(description="The certified optimum of the objective (solver.objective).")
    optimum_step_time_s: float = Field(description="Its predicted step time, seconds.")
    chose_optimum: bool = Field(description="Whether the plan is the optimum.")
    reasons: list[str] = Field(description="What the optimum risks that the alternative does not, one short line "
                               "each (empty when no solved runner-up risks less).")
    alternative_spec: str | None = Field(
        None, description="The fastest solved runner-up that risks less than the optimum (the plan itself when "
        "chose_optimum is false); None when none does.")
    alternative_step_time_s: float | None = Field(None, description="Its predicted step time, seconds.")


class GroupStrategy(Strategy):
    """One replica group's strategy: its pool and batch share, then every Strategy field, resolved
    (plan.json writes pool and batch first)."""

    pool: Name = Field(description="The cluster pool the group runs on.")
    batch: int = Field(gt=0, description="Sequences (samples) per step the group trains on.")

    @model_validator(mode="after")
    def _consistent(self) -> "GroupStrategy":
        """The Strategy checks, on the strategy without pool and batch (replaces Strategy._consistent, whose
        per-stage check re-validates a dump as a plain Strategy)."""
        try:
            Strategy.model_validate(self.model_dump(exclude={"pool", "batch"}))
        except ValidationError as err:
            raise ValueError(err.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self

    @model_serializer(mode="wrap")
    def _pool_and_batch_first(self, handler) -> dict:
        data = handler(self)
        head = {key: data.pop(key) for key in ("pool", "batch") if key in data}
        return {**head, **data}


class ReplicaGroupsStrategy(BaseModel):
    """The strategy of a replica-group plan: one strategy per pool and the gradient sync between them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    replica_groups: list[GroupStrategy] = Field(description="Each group's pool, batch share and strategy, "
                                                "pools in cluster order.")
    sync_s: float = Field(description="Cross-group gradient all-reduce after the groups' steps, seconds.")


def _strategy_kind(value) -> str:
    """Which strategy a plan holds: replica groups have a `replica_groups` key, a single strategy none."""
    if isinstance(value, dict):
        return "replica_groups" if "replica_groups" in value else "single"
    return "replica_groups" if isinstance(value, ReplicaGroupsStrategy) else "single"


PlanStrategy = Annotated[
    Union[Annotated[Strategy, Tag("single")], Annotated[ReplicaGroupsStrategy, Tag("replica_groups")]],
    Discriminator(_strategy_kind),
]
"""A plan's strategy: a Strategy, or replica groups (told apart by the `replica_groups` key; plan.json carries
no tag)."""


class PlanGroup(BaseModel):
    """A replica group: one pool's GPUs, its batch share and its own plan."""

    model_config = _FIELD
    pool: Name = Field(description="The cluster pool the group runs on.")
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
    strategy: PlanStrategy = Field(
        description="The chosen strategy, every field resolved (as `estimate --json`; dp, sp and schedule "
        "explicit), or for replica groups each group's pool, batch and strategy and the sync between them.")
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
        "share per pool; planner.cost.replica_groups); [] for a single-strategy plan.")
    preference: PlanPreference | None = Field(
        None, description="How the plan was chosen among those within the model's error of the optimum "
        "(compile --prefer); None in plans written before the rule.")
    confidence: Confidence = Field(
        default_factory=lambda: Confidence(extrapolated=False, reasons=[]),
        description="Terms of the estimate that lean on a regime no validated published run covers "
        "(planner.cost.confidence; each group's for replica groups).")
    data: DataPlan | None = Field(
        None, description="With --data-profile: the packing, per-bucket context parallelism and balancing of the "
        "profile's sequences, against the best static plan on the same data (planner.data); None: every sequence "
        "is seq_len long.")
    moe: MoePlacementPlan | None = Field(
        None, description="Expert placement under routing statistics (`--routing`): each MoE layer's experts and "
        "replicas per expert-parallel rank, and the baselines' ratios and step times; absent without.")

    @model_serializer(mode="wrap")
    def _moe_when_given(self, handler) -> dict:
        data = handler(self)
        if data.get("moe") is None:
            data.pop("moe", None)  # plans without routing statistics read as before
        return data

    @field_validator("strategy")
    @classmethod
    def _resolved(cls, strategy: Strategy | ReplicaGroupsStrategy) -> Strategy | ReplicaGroupsStrategy:
        """A single strategy with dp known and sp and schedule written out (what readers of plan.json see)."""
        if isinstance(strategy, ReplicaGroupsStrategy):
            return strategy
        if strategy.dp is None:
            raise ValueError("a plan's strategy has dp resolved")
        if strategy.sp is None or strategy.schedule is None:
            return strategy.model_copy(update={"sp": strategy.sequence_parallel,
                                               "schedule": strategy.pipeline_schedule})
        return strategy

    @property
    def single_strategy(self) -> Strategy:
        """The plan's one strategy: what a launch file, a simulation or a re-plan runs.  GroupPlanError for a
        replica-group plan (a strategy per pool: read each of `groups`' plans)."""
        if isinstance(self.strategy, ReplicaGroupsStrategy):
            raise GroupPlanError(f"a replica-group plan ({len(self.strategy.replica_groups)} groups, a strategy "
                                 "per pool) has no single strategy; each group's plan has its own")
        return self.strategy

    @property
    def rank_layout(self) -> RankLayout:
        """The rank layout of a single-strategy plan; GroupPlanError for a replica-group plan (each group's plan
        has its own)."""
        if self.layout is None:
            raise GroupPlanError("a replica-group plan has no single rank layout; each group's plan has its own")
        return self.layout


PlanGroup.model_rebuild()


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
