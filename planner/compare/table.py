"""Baseline strategies scored against the compiler, for `planner compare`, each under its framework's runtime.

Each baseline is a named generator with its source:

* ddp: data parallel only, weights and optimizer replicated in HBM (PyTorch DDP: no offload);
  the best micro-batch and recompute the compiler finds under tp = pp = cp = 1, zero = 0.
* zero1, zero2, zero3: the same with DeepSpeed's ZeRO stage 1/2/3 over the whole
  data-parallel group (Rajbhandari et al. 2020).
* hsdp: ZeRO-3 sharded inside a node, replicated across nodes (FSDP HYBRID_SHARD).
* megatron: Megatron-LM's recipe (Narayanan et al. 2021, arXiv 2104.04473):
  per tp within a node the smallest pp whose layer split fits, the fastest
  of these, dp for the rest, ep over dp for experts, micro-batch 1, the distributed
  optimizer (ZeRO-1), selective then full recompute, interleaving (vpp) when it
  is faster; on a mixed cluster the fastest pool only.
* published recipes: every recipe of the job's model in hardware/data/recipes/
  (Megatron-Bridge / NeMo performance configs, torchtitan train_configs), each
  its own row named after its source (nemo:LLAMA3_70B_H100_BF16_V1), those
  written for the job's GPUs first and marked (`same_hardware`), data
  parallelism for the GPUs left (planner.compare.recipes); a family with no
  recipe for the model is one row saying so (nemo-recipe, torchtitan-recipe,
  which also name the family's preferred recipe in sweeps).
* uniform-pp: the best strategy whose pipeline stages hold equal numbers of
  blocks (the even split of Megatron-LM and DeepSpeed's PipelineModule
  `partition_method="uniform"`), every block recomputing alike.
* metis (clusters of more than one pool; left out on others): a greedy after
  Metis (Um et al., USENIX ATC 2024): stages on the pools in proportion to
  their GPUs, layers split by each stage's speed, moved off stages over their
  HBM, within the time limit.
* torchrec (recommendation models): TorchRec 1.8's own EmbeddingShardingPlanner on the job's tables and a
  TorchRec Topology of its cluster (planner.compare.torchrec_baseline; not applicable without torchrec).
* greedy-torchrec-style (recommendation models): this project's greedy in the style of TorchRec's planner
  (planner.embedding.greedy), not TorchRec's planner.
* planner: the compiler's certified plan over the whole space.

Runtimes (`planner.profile`): a baseline named after a framework is searched
and costed as that framework runs it (`FRAMEWORK_RUNTIMES`): megatron under
the megatron profile, zero1-3 under deepspeed, ddp and hsdp under torchtitan
(torch-native DDP and FSDP2).  A comparison that costed every row under one
idealized model would credit a framework with memory it does not have (Megatron
keeps fp32 gradients whole, DeepSpeed has no tensor parallelism).  The planner
row, and the baselines that name no framework (uniform-pp, metis: a split
rule and a paper's search), run under the job's runtime.  A baseline whose
framework cannot express it for this model (a mixture-of-experts model on a
dense-only runtime) is reported as not applicable with the reason
(`RuntimeProfile.cannot_express`), not costed.  Every row says its runtime;
the planner row is never slower than a fitting baseline of the same runtime.  Under routing statistics
(`--routing`) the framework baselines place experts in the frameworks' contiguous order without replicas; the
planner row, uniform-pp and metis use planner's placement, with the file's redundant slots or without.

The dense recipes (megatron, uniform-pp, metis) live in `planner.compare.baselines`
with their details.  Recommendation models use planner's embedding cost model (runtime `planner-model`,
planner/embedding/evaluate.py) for every row, and every row also carries its plan's step in TorchRec's own
estimators (`torchrec_model_s`, when torchrec is installed): two cost models, each number labelled with its own.
TorchRec's plan is not a candidate of planner's search: the planner row is not slower than the greedy
TorchRec-style row by construction (on jobs compile runs the greedy in, GREEDY_LIMIT), and than the torchrec
row only as measured (tests/bench/torchrec_side_by_side.py).
"""

from __future__ import annotations

import time
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.compare.baselines import megatron_plan, metis_greedy, uniform_pp
from planner.compare.plugins import UserStrategy, plugin_job, timed_strategy
from planner.compare.recipes import RECIPE_ALIASES, by_name, missing_family, preferred, recipe_rows, same_hardware
from planner.cost import evaluate
from planner.cost.estimate import Breakdown, Estimate
from planner.cost.evaluate import has_shared_experts
from planner.compare.torchrec_baseline import plan_with_torchrec, score_with_torchrec, why_not
from planner.embedding.compile import GREEDY_NAME, compile_embedding, placements_of
from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job
from planner.plan.moe import without_replicas
from planner.profile import RuntimeProfile, load_runtime
from planner.recipes import load_recipes, on_job
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions
from planner.strategy import Strategy

GB = 1e9
# The framework runtime (hardware/data/runtimes) each baseline named after a framework is searched and costed under.
# ddp is PyTorch DDP with bf16 autocast (fp32 weights and gradients) and hsdp FSDP2's hybrid sharding: torchtitan's
# profile runs both; ZeRO 1-3 are DeepSpeed's.  Names not here follow the job's runtime (the planner row's).
FRAMEWORK_RUNTIMES: dict[str, str] = {"ddp": "torchtitan", "zero1": "deepspeed", "zero2": "deepspeed",
                                      "zero3": "deepspeed", "hsdp": "torchtitan", "megatron": "megatron"}
# the runtime column of recommendation-model rows: planner's embedding cost model (planner/embedding/evaluate.py)
EMBEDDING_RUNTIME = "planner-model"
TORCHREC = "torchrec"  # TorchRec's own planner (planner.compare.torchrec_baseline)
# the step-time terms every costed dense row carries (CSV columns, in this order)
BREAKDOWN_TERMS = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s",
                   "bubble_s", "optimizer_s", "offload_s")


class CompareRow(BaseModel):
    """One strategy's score, and the runtime profile its numbers come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategy: str = Field(description="Baseline name (or planner).")
    runtime: str = Field(description="Runtime profile it was searched and costed under (hardware/data/runtimes), "
                         "or 'planner-model' for planner's embedding cost model (recommendation models).")
    spec: str = Field(description="What it chose (SPEC string, or a summary of the table sharding); '-' if nothing.")
    applicable: bool = Field(True, description="False when the runtime's framework cannot express this baseline "
                             "for the model (then `why` says what it lacks and nothing is costed).")
    fits: bool = Field(description="It fits in memory (False when not applicable).")
    why: str = Field(description="Why it does not fit or does not apply, or ''.")
    step_time_s: float | None = Field(description="Seconds per step.")
    tokens_per_s_per_gpu: float | None = Field(description="Tokens (samples for recsys) per second per GPU.")
    mfu: float | None = Field(description="Model FLOPs utilisation.")
    peak_hbm_bytes: float | None = Field(description="Peak HBM per GPU.")
    hbm_capacity_bytes: float | None = Field(None, description="HBM a plan may use on that GPU (less the memory "
                                             "margin); None when nothing is costed.")
    host_bytes: float | None = Field(description="Host DRAM per node.")
    nvme_bytes: float | None = Field(description="NVMe per node.")
    planning_s: float = Field(description="Wall-clock seconds spent choosing it (varies run to run).")
    unit: Literal["tokens", "samples"] = Field("tokens", description="What tokens_per_s_per_gpu counts: tokens, "
                                               "or samples for recommendation models.")
    gpus_used: int | None = Field(None, description="GPUs the row's plan runs on (a plan may leave some of the "
                                  "cluster idle); None when nothing is costed.")
    breakdown: Breakdown | None = Field(None, description="Where its step time goes (dense models).")
    solver_status: str | None = Field(None, description="OPTIMAL or FEASIBLE for a row the compiler searched, "
                                      "'evaluated' for a fixed strategy or recipe, None when nothing is costed.")
    gap: float | None = Field(None, description="The search's relative gap (0 when proved optimal); None when not "
                              "searched.")
    extrapolated: bool | None = Field(None, description="Some term leans on a regime no validated published run "
                                      "covers (planner.cost.confidence); None when nothing is costed.")
    confidence: list[str] = Field(default_factory=list, description="The reasons when extrapolated.")
    source: str = Field("", description="Where a published recipe's layout comes from (file and revision).")
    same_hardware: bool | None = Field(None, description="A published recipe's row: whether the recipe was "
                                       "written for the job's GPUs; None for other rows.")
    torchrec_model_s: float | None = Field(None, description="Recommendation models: the plan's embedding seconds "
                                           "per step in TorchRec's own estimators (EmbeddingPerfEstimator; its "
                                           "NoopPerfModel rating, the slowest rank's shards, no dense part); None "
                                           "for dense models, or without torchrec.")

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return self.model_dump()

    def flat(self) -> dict:
        """CSV-ready fields: the breakdown as one column per term, the reasons joined by '; '."""
        out = self.model_dump(exclude={"breakdown", "confidence"})
        for term in BREAKDOWN_TERMS:
            out[term] = getattr(self.breakdown, term) if self.breakdown is not None else None
        out["confidence"] = "; ".join(self.confidence)
        return out


def _dense_fixed(name: str) -> dict[str, int | str]:
    plain: dict[str, int | str] = {"tp": 1, "pp": 1, "cp": 1}
    fixed: dict[str, dict[str, int | str]] = {
        "ddp": {**plain, "zero": 0}, "zero1": {**plain, "zero": 1}, "zero2": {**plain, "zero": 2},
        "zero3": {**plain, "zero": 3, "shard": "full", "regather": "network"},
        "hsdp": {**plain, "zero": 3, "shard": "node"}}
    return fixed[name]


def runtime_for(name: str, job: Job) -> RuntimeProfile:
    """The runtime baseline `name` runs under: its framework's, or the job's."""
    return load_runtime(FRAMEWORK_RUNTIMES[name]) if name in FRAMEWORK_RUNTIMES else job.runtime


def _row_from_estimate(name: str, estimate: Estimate, planning_s: float, status: str = "evaluated",
                       gap: float | None = None) -> CompareRow:
    host = estimate.memory.host
    fits = estimate.memory.fits
    return CompareRow(strategy=name, runtime=estimate.runtime, spec=estimate.strategy_spec, fits=fits,
                      why="" if fits else "; ".join(estimate.memory.reasons), step_time_s=estimate.step_time_s,
                      tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu, mfu=estimate.mfu,
                      peak_hbm_bytes=estimate.memory.peak_bytes, host_bytes=host.dram_bytes,
                      nvme_bytes=host.nvme_bytes, planning_s=planning_s, gpus_used=estimate.num_gpus,
                      hbm_capacity_bytes=estimate.memory.capacity_bytes,
                      breakdown=estimate.breakdown, solver_status=status, gap=gap,
                      extrapolated=estimate.confidence.extrapolated, confidence=estimate.confidence.reasons)


def _failed(name: str, runtime: str, why: str, planning_s: float, applicable: bool = True) -> CompareRow:
    """A row with nothing costed: the first line of `why` (an infeasibility explanation goes on for lines)."""
    return CompareRow(strategy=name, runtime=runtime, spec="-", applicable=applicable, fits=False,
                      why=why.splitlines()[0], step_time_s=None, tokens_per_s_per_gpu=None, mfu=None,
                      peak_hbm_bytes=None, host_bytes=None, nvme_bytes=None, planning_s=planning_s)


def _not_applicable(name: str, job: Job, probe: Strategy) -> CompareRow | None:
    """The not-applicable row when `job.runtime` cannot express `probe` (what the baseline fixes) for this model."""
    missing = job.runtime.cannot_express(probe, bool(job.model.num_experts), job.flash,
                                         shared_experts=has_shared_experts(job))
    if not missing:
        return None
    return _failed(name, job.runtime.name, f"{job.runtime.name} cannot run {'; '.join(missing)}", 0.0,
                   applicable=False)


def _framework_placement(job: Job) -> Job:
    """`job` as a baseline runs it under routing statistics: experts in the frameworks' contiguous order, no
    replicas (Megatron-Core, DeepSpeed-MoE and torchtitan place experts so); itself without statistics."""
    return job if job.routing is None else job.model_copy(update={"expert_placement_policy": "contiguous"})


def _planner_row(job: Job, time_limit: float) -> CompareRow:
    """The compiler's row: with routing statistics' redundant slots, the faster of the search with them and
    without them (each on the whole budget: the row then covers the placement-agnostic baselines, uniform-pp and
    metis, in both)."""
    if job.routing is None or not job.routing.redundant_slots:
        return _compiled("planner", job, SpaceOptions(), time_limit)
    rows = [_compiled("planner", candidate, SpaceOptions(), time_limit)
            for candidate in (job, without_replicas(job))]
    return min(rows, key=lambda r: (not r.fits, r.step_time_s if r.step_time_s is not None else float("inf")))


def _compiled(name: str, job: Job, space: SpaceOptions, time_limit: float) -> CompareRow:
    blocked = _not_applicable(name, job, Strategy.model_validate(space.fixed))
    if blocked is not None:
        return blocked
    start = time.perf_counter()
    try:
        result = compile_job(job, CompileOptions(time_limit=time_limit, space=space, runners_up=0))
    except InfeasibleError as err:
        return _failed(name, job.runtime.name, str(err), time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    if result.estimate is None:  # replica groups on a mixed cluster
        g = result.replica_groups
        spec = "; ".join(f"{r.group.pool}[batch={r.group.batch}]: {r.estimate.strategy_spec}" for r in g.groups)
        reasons = list(dict.fromkeys(x for r in g.groups for x in r.estimate.confidence.reasons))
        return CompareRow(strategy=name, runtime=job.runtime.name, spec=spec, fits=g.fits, why="",
                          step_time_s=g.step_time_s, tokens_per_s_per_gpu=g.tokens_per_s_per_gpu, mfu=g.mfu,
                          peak_hbm_bytes=max(r.estimate.memory.peak_bytes for r in g.groups), host_bytes=None,
                          nvme_bytes=None, planning_s=elapsed, gpus_used=g.num_gpus,
                          solver_status=result.certificate.status, gap=result.certificate.gap,
                          extrapolated=bool(reasons), confidence=reasons)
    return _row_from_estimate(name, result.estimate, elapsed, result.certificate.status, result.certificate.gap)


def _megatron(job: Job) -> CompareRow:
    blocked = _not_applicable("megatron", job, Strategy())
    if blocked is not None:
        return blocked
    start = time.perf_counter()
    plan = megatron_plan(job, job.runtime)
    if plan.estimate is None:
        return _failed("megatron", job.runtime.name, plan.why, time.perf_counter() - start)
    return _row_from_estimate("megatron", plan.estimate, time.perf_counter() - start)


def _uniform(job: Job, time_limit: float) -> CompareRow:
    blocked = _not_applicable("uniform-pp", job, Strategy())
    if blocked is not None:
        return blocked
    start = time.perf_counter()
    strategy = uniform_pp(job, time_limit)
    if strategy is None:
        return _failed("uniform-pp", job.runtime.name, "no strategy with an even layer split fits",
                       time.perf_counter() - start)
    return _row_from_estimate("uniform-pp", evaluate(job, strategy), time.perf_counter() - start)


def _metis(job: Job, time_limit: float) -> CompareRow:
    blocked = _not_applicable("metis", job, Strategy())
    if blocked is not None:
        return blocked
    start = time.perf_counter()
    strategy = metis_greedy(job, time_limit)
    if strategy is None:
        why = ("needs a cluster with more than one pool" if len(job.cluster.pools) < 2 else
               f"no pipeline over more than one pool fits (as the {job.runtime.name} runtime runs it)")
        return _failed("metis", job.runtime.name, why, time.perf_counter() - start)
    return _row_from_estimate("metis", evaluate(job, strategy), time.perf_counter() - start)


def _sharding_summary(placements: list[TablePlacement]) -> str:
    kinds: dict[str, int] = {}
    for p in placements:
        key = p.option.kind.value + ("" if p.option.cache >= 1.0 else f"@{p.option.cache:g}")
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def _embedding(name: str, job: Job, time_limit: float) -> CompareRow:
    """A recommendation model's row: TorchRec's planner, the greedy TorchRec-style plan or planner's compile, scored
    in planner's embedding cost model and, when torchrec is installed, in TorchRec's estimators."""
    model = EmbeddingCostModel(job)
    blocked = why_not(model)
    start = time.perf_counter()
    try:
        if name == TORCHREC:
            if blocked:
                return _failed(name, EMBEDDING_RUNTIME, blocked, 0.0, applicable=False)
            theirs = plan_with_torchrec(model, time_limit)
            own_s: float | None
            placements, planning_s, own_s = theirs.placements, theirs.planning_s, theirs.own_rating_s
            status, gap = "evaluated", None
            spec = _sharding_summary(placements) + (" (TorchRec's timeout)" if theirs.timed_out else "")
        else:
            result = compile_embedding(job, strategy=GREEDY_NAME if name == GREEDY_NAME else "planner",
                                       time_limit=time_limit)
            planning_s = time.perf_counter() - start
            placements, status, gap = placements_of(result), result.certificate.status, result.certificate.gap
            own_s = None if blocked else score_with_torchrec(model, placements).step_s
            spec = _sharding_summary(placements)
    except InfeasibleError as err:
        return _failed(name, EMBEDDING_RUNTIME, str(err), time.perf_counter() - start)
    e = model.evaluate(placements)
    return CompareRow(strategy=name, runtime=EMBEDDING_RUNTIME, spec=spec, fits=e.fits, why="; ".join(e.problems),
                      step_time_s=e.step_time_s, tokens_per_s_per_gpu=e.samples_per_s_per_gpu, mfu=None,
                      peak_hbm_bytes=e.peak_hbm_bytes, host_bytes=e.peak_host_bytes, nvme_bytes=0.0,
                      planning_s=planning_s, unit="samples", gpus_used=job.cluster.num_gpus,
                      solver_status=status, gap=gap, torchrec_model_s=own_s)


# the default rows put the model's published recipes (planner.compare.recipes.recipe_rows), one row each, where
# these aliases stand; named alone, an alias is its family's preferred recipe
DENSE_BASELINES = ("ddp", "zero1", "zero2", "zero3", "hsdp", "megatron", *RECIPE_ALIASES,
                   "uniform-pp", "metis", "planner")
MIXED_CLUSTER_ONLY = ("metis",)  # left out on one-pool clusters, where they have nothing to decide
EMBEDDING_BASELINES = (TORCHREC, GREEDY_NAME, "planner")
RECIPE_NAMES = tuple(r.name for r in load_recipes())  # every published recipe's row name
NAMED = tuple(dict.fromkeys(DENSE_BASELINES + RECIPE_NAMES + EMBEDDING_BASELINES))  # every name a row may take


def baselines_for(job: Job) -> tuple[str, ...]:
    """The strategies that apply to the job's model and cluster."""
    if job.model.family == "recsys":
        return EMBEDDING_BASELINES
    names = DENSE_BASELINES if len(job.cluster.pools) > 1 else tuple(
        name for name in DENSE_BASELINES if name not in MIXED_CLUSTER_ONLY)
    aliases = [name for name in names if name in RECIPE_ALIASES]
    at = names.index(aliases[0])
    return names[:at] + recipe_rows(job) + tuple(name for name in names[at:] if name not in RECIPE_ALIASES)


def _published(name: str, job: Job) -> CompareRow:
    """A published recipe's row (planner.compare.recipes), costed under its framework's runtime; `name` is the
    recipe's row name or a family alias (nemo-recipe), which keeps its own name."""
    start = time.perf_counter()
    recipe = preferred(name, job) if name in RECIPE_ALIASES else by_name(name)
    if recipe is None:
        runtime = "megatron" if RECIPE_ALIASES.get(name) == "nemo" else "torchtitan"
        return _failed(name, runtime, missing_family(name, job), 0.0, applicable=False)
    source = (f"{recipe.source.repository} {recipe.source.path} {recipe.source.config} ({recipe.source.revision}); "
              f"written for {recipe.hardware.gpus} x {recipe.hardware.cluster.split(':')[0]}, global batch "
              f"{recipe.global_batch} x {recipe.seq_len}")
    marks = {"source": source, "same_hardware": same_hardware(recipe, job)}
    run = on_job(recipe, job)
    elapsed = time.perf_counter() - start
    if run.estimate is None:
        return _failed(name, run.job.runtime.name, run.why, elapsed, applicable=run.applicable).model_copy(
            update=marks)
    return _row_from_estimate(name, run.estimate, elapsed).model_copy(update=marks)


def _plugin(plugin: UserStrategy, job: Job) -> CompareRow:
    """A user strategy's row: its strategy costed by `evaluate` under its runtime (planner.compare.plugins)."""
    if job.model.family == "recsys":
        return _failed(plugin.name, EMBEDDING_RUNTIME, "user strategies are dense-model strategies (SPEC); "
                       "recommendation models have table shardings", 0.0, applicable=False)
    on = plugin_job(plugin, job)
    strategy, why, elapsed = timed_strategy(plugin, on)
    if strategy is None:
        return _failed(plugin.name, on.runtime.name, why, elapsed, applicable=False)
    missing = on.runtime.cannot_express(strategy, bool(on.model.num_experts), on.flash,
                                        shared_experts=has_shared_experts(on))
    if missing:
        return _failed(plugin.name, on.runtime.name, f"{on.runtime.name} cannot run {'; '.join(missing)}", elapsed,
                       applicable=False)
    try:
        estimate = evaluate(on, strategy)
    except (InfeasibleError, PlannerInputError) as err:  # a strategy that breaks a rule of this job
        return _failed(plugin.name, on.runtime.name, str(err), elapsed)
    return _row_from_estimate(plugin.name, estimate, elapsed)


def compare(job: Job, strategies: tuple[str, ...] | None = None, time_limit: float = 60.0,
            progress: Callable[[str], None] | None = None,
            plugins: tuple[UserStrategy, ...] = ()) -> list[CompareRow]:
    """Score every applicable strategy (or `strategies`) on `job`: the planner row and the baselines that name no
    framework under `job.runtime`, the others under their framework's runtime (`FRAMEWORK_RUNTIMES`); then the
    user's `plugins` (those named in `strategies`, or all of them when it is None)."""
    rows = []
    named = {p.name: p for p in plugins}
    default = baselines_for(job) + tuple(named)
    for name in strategies or default:
        if progress:
            progress(f"compare: {name}")
        if name in named:
            rows.append(_plugin(named[name], job))
            continue
        if job.model.family == "recsys":
            rows.append(_embedding(name, job, time_limit))
            continue
        on = job.on(runtime_for(name, job))
        if name in FRAMEWORK_RUNTIMES:  # a framework's baseline places experts as the framework does
            on = _framework_placement(on)
        if name == "megatron":
            rows.append(_megatron(on))
        elif name == "uniform-pp":
            rows.append(_uniform(on, time_limit))
        elif name in RECIPE_ALIASES or by_name(name) is not None:
            rows.append(_published(name, _framework_placement(job)))
        elif name == "metis":
            rows.append(_metis(on, time_limit))
        elif name == "planner":
            rows.append(_planner_row(on, time_limit))
        elif name == "ddp":  # plain DDP keeps everything in HBM: it has no optimizer or parameter offload
            rows.append(_compiled(name, on, SpaceOptions(fixed=_dense_fixed(name), offloads=(), offload_devices=()),
                                  time_limit))
        else:
            rows.append(_compiled(name, on, SpaceOptions(fixed=_dense_fixed(name)), time_limit))
    return rows
