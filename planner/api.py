"""The library's entry points: what `planner compile`, `estimate` and `compare` run, for a program to call.

    import planner

    job = planner.load_job("llama3-8b", "dgx-h100:1", batch=8, seq_len=8192)
    print(planner.estimate(job, "tp=2,sp=on,zero=3").step_time_s)
    compiled = planner.compile(job, targets=("torchtitan",))
    compiled.write("out/llama3-8b")            # plan.json, report.md, its figures, torchtitan/
    rows = planner.compare_baselines(job, only=("megatron", "planner"))

The command line parses its arguments, calls these and prints what they return, so the same inputs give the
same numbers here and there: the default runtime is planner's own (`DEFAULT_RUNTIME`; megatron for
mixture-of-experts models, which it cannot run), `compile` leaves constants.yaml's memory margin free
unless told otherwise, `estimate` none.  Errors are the library's typed ones (planner.errors, models and
hardware input errors, pydantic ValidationError).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hardware import Cluster, load_catalog, load_cluster
from models import ModelGraph, load_model
from planner.compare.plugins import UserStrategy, load_strategies
from planner.compare.table import NAMED, CompareRow, compare as compare_rows
from planner.cost import Estimate, evaluate, refusals
from planner.cost.evaluate import has_shared_experts
from planner.compare.data_candidates import data_plan_over_degrees
from planner.data.plan import plan_data
from planner.data.profile import DataProfile
from planner.data.result import DataPlan
from planner.embedding.compile import EmbeddingStrategyName, compile_embedding
from planner.embedding.plan_doc import EmbeddingCompileOptions, EmbeddingPlan, build_embedding_plan, to_json
from planner.embedding.report import render_embedding_report
from planner.emit import DEFAULT_TARGETS, TARGET_RUNTIMES, available_targets, primary_runtime
from planner.emit.check import NO_EXPERT_REPLICAS, TargetCheck, emit_checked
from planner.emit.dlrm import DLRM_EMITTERS, DLRM_INPUTS
from planner.emit.inputs import LaunchInputs, checkpoints_inside, input_lines, inputs_section
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job, MoeRouting, Precision
from planner.plan.build import inputs_digest
from planner.plan.assemble import build_plan
from planner.plan.moe import MoePlacementPlan, moe_placement_plan, without_replicas
from planner.plan.output import write_outputs
from planner.plan.prefer import prefer as prefer_plan
from planner.plan.plots import RANKS_PNG, report_plots, ranks_png
from planner.plan.report import LAUNCH_COMMANDS, render_report
from planner.plan.schema import Plan, plan_json
from planner.profile import CLI_RUNTIME, load_runtime
from planner.recipes import NearestRecipe, nearest_recipe, recipe_section
from planner.replan.candidates import ReplanOptions, ReplanResult, old_options, replan as replan_job
from planner.replan.layout import plan_layout
from planner.replan.output import replan_files
from planner.routing.stats import RoutingStats, load_routing
from planner.search.compile import compile_job
from planner.search.result import CompileOptions, CompileResult, Objective, Prefer
from planner.search.space import OffloadSearch, SpaceOptions, narrow_to_runtime
from planner.simulate.plan_input import PlanSimulation, plan_job, plan_runs, read_plan
from planner.simulate.plan_input import simulate_plan as simulate_runs
from planner.simulate.simulator import SimulationRun
from planner.strategy import Dispatcher, Strategy, parse_strategy
from planner.validation import check_strategy

__all__ = ["Compiled", "DEFAULT_RUNTIME", "compare_baselines", "compile", "estimate", "estimate_data", "load_job"]

DEFAULT_RUNTIME = CLI_RUNTIME  # the runtime the library's entry points and the command line cost a job under
Progress = Callable[[str], None]


def load_job(model: str | ModelGraph, cluster: str | Cluster, *, batch: int, seq_len: int,
             precision: Precision = "bf16", flash_attention: bool = True, moe_routing: MoeRouting = "learned",
             routing: str | Path | RoutingStats | None = None, memory_margin: float | None = None,
             runtime: str | None = None, fp8_params: bool = False) -> Job:
    """A job from a model (zoo name, spec file, HF config.json, or a graph) and a cluster (PRESET:NODES, a
    cluster file, or a Cluster).  memory_margin None: constants.yaml's default (what `compile` leaves free);
    runtime None: DEFAULT_RUNTIME, or megatron for a mixture-of-experts model; routing: a routing statistics
    file (`--routing`) or its model."""
    graph = load_model(model) if isinstance(model, str) else model
    stats = load_routing(routing, graph) if isinstance(routing, (str, Path)) else routing
    if stats is not None and moe_routing == "balanced":
        raise PlannerInputError(f"--routing {routing}: --moe-routing balanced forces even routing and would ignore "
                                "the statistics; give one or the other")
    topology = load_cluster(cluster) if isinstance(cluster, str) else cluster
    margin = load_catalog().constant("memory_margin_default") if memory_margin is None else memory_margin
    made = Job(model=graph, cluster=topology, global_batch=batch, seq_len=seq_len, precision=precision,
               fp8_params=fp8_params, flash_attention=flash_attention, moe_routing=moe_routing, routing=stats,
               memory_margin=margin)
    if graph.family == "recsys":
        return made  # recommendation models have the embedding cost model, no runtime profile
    return made.on(load_runtime(runtime or default_runtime(made)[0]))


def default_runtime(job: Job, targets: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """(the runtime a job is costed under when none is named, a note saying why when it is not DEFAULT_RUNTIME):
    the first named target's, else planner's own, else megatron's for a mixture-of-experts model."""
    return primary_runtime(targets, bool(job.model.num_experts), has_shared_experts(job))


def estimate(job: Job, strategy: str | Strategy = "", *, runtime: str | None = None) -> Estimate:
    """Score one strategy (a SPEC string or a Strategy) on `job` under `runtime` (default: the job's)."""
    costed = job.on(load_runtime(runtime)) if runtime else job
    checked = check_strategy(costed, parse_strategy(strategy) if isinstance(strategy, str) else strategy)
    missing = refusals(costed, checked)
    if missing:
        name = costed.runtime.name
        raise PlannerInputError(f"runtime {name} cannot run {'; '.join(missing)} (hardware/data/runtimes/{name}.yaml, "
                                "space); the reference runtime costs any strategy")
    return evaluate(costed, checked)


def expert_placement(job: Job, strategy: str | Strategy = "") -> MoePlacementPlan | None:
    """The expert placement of a strategy under the job's routing statistics (None without): ratios and step
    times under planner's, EPLB's and the contiguous placement, as `compile --json` reports them."""
    if job.routing is None or not job.model.num_experts:
        return None
    checked = check_strategy(job, parse_strategy(strategy) if isinstance(strategy, str) else strategy)
    return moe_placement_plan(job, checked)
def estimate_data(job: Job, strategy: str | Strategy, profile: DataProfile) -> DataPlan:
    """Score one strategy on a data profile: its static layouts and its hybrid layout of the profile's step
    (planner.data), the same pricing `compile --data-profile` runs over every candidate."""
    profile.check_fits(job.seq_len, f"data profile {profile.name}")
    estimate(job, strategy)  # the strategy's own checks and its runtime's refusals, one line each
    checked = check_strategy(job, parse_strategy(strategy) if isinstance(strategy, str) else strategy)
    return plan_data(job, profile, [checked], load_catalog())[0]


@dataclass
class Compiled:
    """A compiled job: its plan and, on demand, the files `planner compile -o DIR` writes."""

    job: Job
    plan: Plan | EmbeddingPlan
    result: Any  # CompileResult, or the embedding search's result
    targets: tuple[str, ...]  # the launch targets asked for (the defaults when none was named)
    explicit_targets: bool  # named by the caller: one that cannot hold the plan stops the write
    notes: list[str] = field(default_factory=list)  # what the caller should be told of the search (runtime choice)
    checks: tuple[TargetCheck, ...] = ()  # each target's check, set by files()
    skipped: tuple[str, ...] = ()  # why each target without files has none, set by files()

    @property
    def wall_s(self) -> float:
        return self.result.certificate.wall_s

    def as_json(self, *, time_limit: float | None = None, work_limit: float | None = None) -> dict[str, Any]:
        """`planner compile --json`: the plan's estimate, the solver's certificate and the plan."""
        cert = self.result.certificate
        solver: dict[str, Any] = {"status": cert.status, "objective": cert.objective, "bound": cert.bound,
                                  "gap": cert.gap, "wall_s": cert.wall_s}
        if isinstance(self.plan, EmbeddingPlan):
            data = self.result.estimate.model_dump(mode="json")
            data["solver"] = solver
            data["plan"] = self.plan.model_dump(mode="json", by_alias=True)
            return data
        data = (self.result.estimate or self.result.groups).model_dump(mode="json")
        if self.plan.data is not None:  # the plan's step is the data plan's: the uniform estimate stays beside it
            planned = self.plan.data
            data["uniform_step_time_s"] = data["step_time_s"]
            data["step_time_s"] = planned.step_time_s
            data["tokens_per_s"] = planned.tokens / planned.step_time_s
            data["tokens_per_s_per_gpu"] = data["tokens_per_s"] / data["num_gpus"]
            data["data"] = self.plan.data.model_dump(mode="json")
        data["solver"] = {**solver, "time_limit_s": None if work_limit else time_limit, "work_limit_s": work_limit,
                          "stopped": cert.stopped, "reproducible": cert.stopped is None}
        data["plan"] = self.plan.model_dump(mode="json")
        if self.plan.moe is not None:  # the placement's summary beside the estimate; its per-layer map is in the plan
            data["moe"] = self.plan.moe.model_dump(mode="json", exclude={"layers"})
        return data

    def _recipe_section(self, plan: Plan) -> str:
        """report.md's nearest published recipe, against the plan's step (replica groups: none applies)."""
        t = plan.time
        if plan.groups:
            why = "the plan runs replica groups on different pools; a recipe has one layout for every rank"
            return recipe_section(NearestRecipe(why=why), t.step_time_s, t.tokens_per_s_per_gpu)
        return recipe_section(nearest_recipe(self.job, plan.single_strategy), t.step_time_s, t.tokens_per_s_per_gpu)

    def files(self, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str | bytes]:
        """Every file of the output folder by relative path: plan.json, report.md and its figures, and each
        target's launch folder whose written strategy, costed under the target's runtime, holds the plan.
        InfeasibleError when a named target would not run the plan as costed (nothing is written then)."""
        if isinstance(self.plan, EmbeddingPlan):
            return self._embedding_files(self.plan, inputs)
        files: dict[str, str | bytes] = {"plan.json": plan_json(self.plan)}
        checks, refused, skipped = [], [], []
        for target in self.targets:  # each target's written strategy is costed under its runtime first
            check, target_files = emit_checked(self.plan, self.job, target, inputs)
            checks.append(check)
            if check.status == "written":
                files.update(target_files)
            elif check.status == "refused" and self.explicit_targets:
                refused.append(check.line)
            else:  # a target that cannot express the plan, or a default target that would not hold it
                skipped.append(f"no {target}/ files: {check.why}")
        if refused:
            raise InfeasibleError("\n".join(refused))
        self.checks, self.skipped = tuple(checks), tuple(skipped)
        written = self.written
        files["report.md"] = render_report(self.plan, written, plots=True, checks=self.checks,
                                           launch_inputs=inputs_section(inputs, written),
                                           recipe=self._recipe_section(self.plan))
        files.update(report_plots(self.plan))
        return files

    @property
    def written(self) -> tuple[str, ...]:
        """The targets whose launch folders files() wrote."""
        if isinstance(self.plan, EmbeddingPlan):
            return tuple(t for t in self.targets if t in DLRM_EMITTERS)
        return tuple(c.target for c in self.checks if c.status == "written")

    def _embedding_files(self, plan: EmbeddingPlan, inputs: LaunchInputs) -> dict[str, str | bytes]:
        files: dict[str, str | bytes] = {"plan.json": to_json(plan), "sharding_plan.json": to_json(plan.sharding),
                                         RANKS_PNG: ranks_png(plan)}
        for target in self.written:
            files.update(DLRM_EMITTERS[target](plan, self.job, inputs))
        self.skipped = tuple(f"no {target}/ files: the {target} target does not run embedding-sharded recommendation "
                             f"models ({', '.join(DLRM_EMITTERS)} do)" for target in self.targets
                             if target not in DLRM_EMITTERS)
        section = _embedding_launch_section(self.written, inputs)
        files["report.md"] = render_embedding_report(plan, plots=True) + ("\n" + section if section else "")
        return files

    def write(self, out_dir: str | Path, *, inputs: LaunchInputs = LaunchInputs(), force: bool = False) -> None:
        """Write files() to `out_dir` atomically (planner/plan/output.py); force replaces an earlier planner
        output there (only the files its manifest lists)."""
        out = Path(out_dir)
        if not isinstance(self.plan, EmbeddingPlan):
            inside = checkpoints_inside(inputs, out, self.targets)
            if inside is not None:
                raise PlannerInputError(inside)
        write_outputs(out, self.files(inputs), force=force)


def _embedding_launch_section(targets: tuple[str, ...], inputs: LaunchInputs) -> str:
    """report.md's "Launch" section of a recommendation model's plan: the folders written and the launch inputs
    they read."""
    if not targets:
        return ""
    fields = tuple(dict.fromkeys(f for t in targets for f in DLRM_INPUTS[t]))
    lines = ["## Launch", "", "From this directory:", "", "```", *(LAUNCH_COMMANDS[t] for t in targets), "```", ""]
    if fields:
        lines += ["Launch inputs (a value not given to `planner compile` is read from its environment variable "
                  "when the files run):", "", *input_lines(inputs, fields), ""]
    return "\n".join(lines)


def compile(job: Job, *, targets: tuple[str, ...] = (), runtime: str | None = None,
            fixed: dict[str, int | str] | None = None, objective: Objective = "time",
            max_step_time: float | None = None, time_limit: float = 60.0, work_limit: float | None = None,
            offload_search: OffloadSearch = "always",
            embedding_planner: EmbeddingStrategyName = "planner", prefer: Prefer = "validated",
            progress: Progress | None = None, data_profile: DataProfile | None = None,
            dispatchers: tuple[Dispatcher, ...] = ("alltoall",)) -> Compiled:
    """Search every strategy for the fastest (objective "cost": cheapest) plan of `job` that fits.

    targets: launch targets the plan must be expressible in (their spaces intersect; none named: the default
    targets, written where they hold the plan).  runtime: the runtime the plan is costed under (default: the
    first named target's, else the job's).  fixed: strategy keys the search must use (`--fix`).  work_limit:
    CP-SAT's deterministic budget in seconds, instead of the wall-clock time_limit.  prefer: "validated" (a
    runner-up within the model's error of the optimum that risks less HBM headroom or extrapolation is returned
    instead, planner.plan.prefer) or "fastest" (the optimum).  InfeasibleError when
    nothing fits, with what does not fit where and the smallest change that would.  data_profile: plan the
    packing, per-bucket context parallelism and balancing of that data against the best static plan on it
    (planner.data; the plan's `data` section; the data plan chooses among strategies by its own step times, so
    `prefer` does not apply to it).  dispatchers: the MoE token dispatchers the build has (`--dispatchers`;
    DeepEP's need its library), searched where the runtime runs them; the certificate holds over them."""
    explicit = bool(targets)
    chosen = targets or tuple(t for t in DEFAULT_TARGETS if t in available_targets())
    missing = [t for t in chosen if t not in available_targets()]
    if missing:
        raise PlannerInputError(f"--target: no emitter for {', '.join(missing)} in this build")
    if data_profile is not None:
        if job.model.family == "recsys":
            raise PlannerInputError(f"--data-profile: {job.model.name} is a recommendation model; a data profile "
                                    "gives sequence lengths")
        data_profile.check_fits(job.seq_len, f"data profile {data_profile.name}")
    if job.model.family == "recsys":
        # the embedding search's budget is CP-SAT work already (planner.embedding.compile)
        budget = work_limit or time_limit
        found = compile_embedding(job, strategy=embedding_planner, time_limit=budget, progress=progress)
        sharding = build_embedding_plan(job, found, EmbeddingCompileOptions(strategy=embedding_planner,
                                                                            time_limit=budget))
        return Compiled(job=job, plan=sharding, result=found, targets=chosen, explicit_targets=explicit)
    if embedding_planner != "planner":
        raise PlannerInputError(f"--embedding-planner: {embedding_planner} plans the tables of recommendation "
                                f"models; {job.model.name} has none")
    notes: list[str] = []
    if runtime:
        job = job.on(load_runtime(runtime))
    elif explicit:
        name, note = default_runtime(job, targets)
        job = job.on(load_runtime(name))
        notes += [note] if note else []
    options = _options(job, targets, fixed or {}, objective, max_step_time, time_limit, work_limit, offload_search,
                       prefer, dispatchers)
    if job.routing is not None and job.model.num_experts:
        _place_experts(job)  # before the search's clock starts: its budget is for the search
    if job.routing is not None and job.routing.redundant_slots and job.model.num_experts:
        job, result, options, note = _compile_replica_choice(job, options, targets if explicit else (), progress)
        notes += [note] if note else []
    else:
        result = compile_job(job, options, progress=progress)
    if data_profile is None:
        result, preference = prefer_plan(job, result, options)
        plan = build_plan(job, result, options).model_copy(update={"preference": preference})
    else:
        if result.strategy is None:
            raise PlannerInputError("--data-profile: the plan is replica groups over pools of different GPUs; plan "
                                    "the data on one pool")
        data, result = data_plan_over_degrees(job, options, result, data_profile, progress)
        plan = build_plan(job, result, options)
        # the profile is an input of the plan: recorded with the options, so inputs_digest covers it
        record = {**(plan.options or {}), "data_profile": data_profile.model_dump(mode="json")}
        plan = plan.model_copy(update={"data": data, "options": record, "inputs_digest": inputs_digest(job, record)})
    return Compiled(job=job, plan=plan, result=result, targets=chosen, explicit_targets=explicit, notes=notes)


def _place_experts(job: Job) -> None:
    """Solve (and cache) the expert placements of every expert-parallel degree the search may try, with the
    routing file's redundant slots and without."""
    experts, gpus = job.model.num_experts, job.cluster.num_gpus
    for candidate in (job, without_replicas(job)):
        for ep in (d for d in range(2, min(experts, gpus) + 1) if experts % d == 0):
            candidate.expert_placement(ep)


def _compile_replica_choice(job: Job, options: CompileOptions, targets: tuple[str, ...],
                            progress: Progress | None) -> tuple[Job, CompileResult, CompileOptions, str | None]:
    """Search with the routing file's redundant expert slots and without them, each on half the budget, and keep
    the better plan: replicas cost memory and a gradient sync that balance does not always repay.  A named target
    that holds no replicas (Megatron) searches without them only.  Returns the options each search ran under."""
    bare, slots = without_replicas(job), job.routing.redundant_slots if job.routing is not None else 0
    holds_none = [t for t in targets if t in NO_EXPERT_REPLICAS]
    if holds_none:
        return bare, compile_job(bare, options, progress=progress), options, (
            f"{', '.join(holds_none)} holds no expert replicas: the plan places experts without the routing file's "
            f"{slots} redundant slots")
    half = options.model_copy(update={"time_limit": options.time_limit / 2,
                                      "work_limit": options.work_limit / 2 if options.work_limit else None})
    results: list[tuple[Job, CompileResult]] = []
    for candidate in (job, bare):
        try:
            results.append((candidate, compile_job(candidate, half, progress=progress)))
        except InfeasibleError:
            if candidate is bare and not results:
                raise
    chosen, result = min(results, key=lambda pair: pair[1].certificate.objective)
    if chosen is job:
        return job, result, half, None
    other = f" (with them: {results[0][1].certificate.objective:.4g})" if results[0][0] is job else ""
    return bare, result, half, (f"the routing file's {slots} redundant expert slots do not repay their memory "
                                f"and gradient sync on this job: the plan uses none{other}")


def _options(job: Job, targets: tuple[str, ...], fixed: dict[str, int | str], objective: Objective,
             max_step_time: float | None, time_limit: float, work_limit: float | None,
             offload_search: OffloadSearch, prefer: Prefer = "validated",
             dispatchers: tuple[Dispatcher, ...] = ("alltoall",)) -> CompileOptions:
    """The search's options: one plan every named target can express (the intersection of their spaces; a
    target whose runtime cannot run the model at all is skipped when the files are written instead)."""
    if "dispatcher" in fixed:  # --fix dispatcher=deepep: the build has what the plan must use
        dispatchers = tuple(dict.fromkeys((*dispatchers, cast(Dispatcher, fixed["dispatcher"]))))
    space = SpaceOptions(fixed=fixed, offload_search=offload_search, dispatchers=dispatchers)
    narrowed: list[str] = []
    if targets:
        space = space.model_copy(update={"replica_groups": False})
        for target in targets:
            profile = load_runtime(TARGET_RUNTIMES[target])
            if profile.model_refusal(job.model.num_experts, has_shared_experts(job)) is None:
                space = narrow_to_runtime(space, profile, job)
                narrowed.append(profile.name)
    others = tuple(name for name in dict.fromkeys(narrowed) if name != job.runtime.name)
    return CompileOptions(objective=objective, max_step_time=max_step_time, time_limit=time_limit,
                          work_limit=work_limit, space=space, space_runtimes=others, prefer=prefer)


def compare_baselines(job: Job, *, only: tuple[str, ...] = (), strategies_file: str | Path | None = None,
            time_limit: float = 60.0) -> list[CompareRow]:
    """Every applicable baseline (or those named in `only`) and the compiler's plan on `job`, each costed as
    its framework runs it; strategies_file adds the named strategies of a YAML file (examples/strategies/)."""
    names: tuple[str, ...] = ()
    plugins: tuple[UserStrategy, ...] = ()
    if strategies_file is not None:
        names, plugins = load_strategies(Path(strategies_file),
                                         NAMED)
    return compare_rows(job, tuple(dict.fromkeys(only + names)) or None, time_limit, plugins=plugins)


def load_plan(path: str | Path, *, model: str | None = None, cluster: str | None = None) -> tuple[Plan, Job]:
    """A plan.json and the job it was compiled for, rebuilt from its model and cluster and checked against its
    inputs_digest (an edited plan is refused).  model, cluster: the files it was compiled from, where plan.json
    names a file rather than a zoo model or PRESET:NODES."""
    plan = read_plan(Path(path))
    return plan, plan_job(plan, Path(path), model, cluster)


@dataclass
class Simulated:
    """A plan's step simulated event by event, beside the analytic cost model."""

    summary: PlanSimulation
    runs: list[tuple[str | None, int, SimulationRun]]  # (pool, batch, run) per replica group (pool None: one)


def simulate_plan(plan: Plan, job: Job) -> Simulated:
    """Simulate one training step of `plan` (every forward, backward, transfer, gather and the optimizer)."""
    runs, sync = plan_runs(plan, job)
    return Simulated(summary=simulate_runs(plan, runs, sync), runs=runs)


DEFAULT_STEPS_LEFT = 1000


@dataclass
class Replanned:
    """A re-plan: the new plan, what moves where, and the files `planner replan -o DIR` writes."""

    plan: Plan
    result: ReplanResult
    files: dict[str, str | bytes]
    notes: list[str]  # the targets without files, and why

    def write(self, out_dir: str | Path, *, force: bool = False) -> None:
        write_outputs(Path(out_dir), self.files, force=force)


def replan_for(plan: Plan, job: Job, new_cluster: str | Cluster, *, targets: tuple[str, ...] = (),
           steps_left: int = DEFAULT_STEPS_LEFT, checkpoint_bandwidth: float | None = None,
           lost_nodes: tuple[int, ...] | None = None, time_limit: float | None = None,
           fixed: dict[str, int | str] | None = None, inputs: LaunchInputs = LaunchInputs()) -> Replanned:
    """Re-plan `plan` (and its `job`, from load_plan) for `new_cluster`: the plan minimising the migration time plus
    steps_left x step time, with the migration and the targets' launch files resuming the old checkpoint
    (targets: default, compile's defaults).  InfeasibleError when the new cluster is too small."""
    if plan.groups:
        raise PlannerInputError("strategy: a replica-group plan (a strategy per pool); replan re-plans "
                                "single-strategy plans")
    cluster = load_cluster(new_cluster) if isinstance(new_cluster, str) else new_cluster
    ask = ReplanOptions(steps_left=steps_left, checkpoint_bandwidth=checkpoint_bandwidth, lost_nodes=lost_nodes,
                        time_limit=time_limit, fixed=fixed or {})
    result = replan_job(plan_layout(plan, job.model), job, old_options(plan.options), cluster, ask)
    chosen = targets or tuple(t for t in DEFAULT_TARGETS if t in available_targets())
    new, files, notes = replan_files(plan, result, ask, chosen, inputs)
    return Replanned(plan=new, result=result, files=files, notes=notes)
