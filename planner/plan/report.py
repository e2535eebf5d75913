"""report.md: a compiled plan explained for a person.

`render_report(plan, targets, plots, checks)` is a pure function of the Plan and
the targets' checks (planner.plan.targets), so the same inputs give a
byte-identical report (no wall time: the CLI prints that on stderr).
Units on the page: GB = 1e9 bytes, ms, s.
"""

from __future__ import annotations

from typing import Sequence

from planner.errors import GroupPlanError
from planner.plan.moe import moe_report_lines
from planner.plan.data_report import data_section
from planner.plan.schema import Plan, PlanStage, ReplicaGroupsStrategy
from planner.plan.plots import MEMORY_PNG, TIME_PNG
from planner.plan.targets import TargetCheck

GB = 1e9

_TIME_TERMS = [
    ("compute_s", "compute (fwd+bwd)"), ("recompute_s", "recompute"), ("tp_comm_s", "tensor-parallel comm"),
    ("cp_comm_s", "context-parallel comm"), ("ep_comm_s", "expert-parallel comm"), ("pp_comm_s", "pipeline p2p"),
    ("dp_comm_s", "data-parallel comm (exposed)"), ("bubble_s", "pipeline bubble"),
    ("optimizer_s", "optimizer step"), ("offload_s", "offload (exposed)"),
]


# figures drawn by planner.plan.plots into the same directory
_MEMORY_FIGURE = f"![memory per stage]({MEMORY_PNG})"
_TIME_FIGURE = f"![time per step]({TIME_PNG})"


def _gb(n: float) -> str:
    return f"{n / GB:.1f}"


def md_table(headers: list[str], rows: list[list[str]], right: tuple[int, ...] = ()) -> str:
    """A GitHub-flavoured Markdown table; columns in `right` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _blocks(stage: PlanStage) -> str:
    return f"{stage.blocks[0]}-{stage.blocks[-1]}" if stage.blocks else "-"


def _ranks(stage: PlanStage) -> str:
    r = stage.ranks
    nodes = f"node {r.nodes[0]}" if r.nodes[0] == r.nodes[1] else f"nodes {r.nodes[0]}-{r.nodes[1]}"
    return f"{r.first_rank}-{r.last_rank} ({nodes})"


def _why(plan: Plan) -> str:
    """One paragraph: what binds the plan (memory of which stage, compute, or a communication term)."""
    t, br = plan.time, plan.time.breakdown
    step = t.step_time_s or 1.0
    binding = plan.stages[plan.memory.binding_stage]
    hbm = binding.memory.hbm
    use = hbm.peak_bytes / hbm.capacity_bytes
    sentences = []
    compute_share = (br.compute_s + br.recompute_s) / step
    others = [(getattr(br, key) / step, label) for key, label in _TIME_TERMS if key not in ("compute_s", "recompute_s")]
    share, label = max(others)
    if compute_share >= 0.7:
        sentences.append(f"The step is compute-bound: compute and recompute take {100 * compute_share:.0f}% of it "
                         f"(MFU {100 * t.mfu:.1f}%); the largest other term is {label} at {100 * share:.1f}%.")
    else:
        sentences.append(f"Compute takes {100 * compute_share:.0f}% of the step; the largest other term is {label} "
                         f"at {100 * share:.1f}%, and exposed communication is "
                         f"{100 * br.exposed_comm_s / step:.1f}% in all.")
    where = f"stage {binding.index}, the fullest," if len(plan.stages) > 1 else "each GPU"
    usage = (f"{where} uses {_gb(hbm.peak_bytes)} of {_gb(hbm.capacity_bytes)} GB HBM ({100 * use:.0f}%, "
             f"{_gb(hbm.capacity_bytes - hbm.peak_bytes)} GB to spare)")
    if use >= 0.9:
        sentences.append(f"Memory is the binding constraint: {usage}; strategies that keep more state or "
                         "activations per GPU do not fit.")
    else:
        sentences.append(f"Memory is not binding: {usage}.")
    s = plan.single_strategy
    recomputed = sum(st.recompute_blocks for st in plan.stages)
    if recomputed:
        sentences.append(f"{recomputed} block(s) recompute their activations in backward, {br.recompute_s:.3f} s per "
                         f"step ({100 * br.recompute_s / step:.1f}%) spent to save activation memory.")
    placed = [_placement(st) for st in plan.stages]
    if any(p != "in HBM" for p in placed):
        where = (placed[0] if len(set(placed)) == 1
                 else "; ".join(f"stage {st.index} {p}" for st, p in zip(plan.stages, placed)))
        sentences.append(f"State placement: {where}." + (" Nothing in the space fits without offload."
                                                         if s.offload != "none" or s.stage_offload else ""))
    if plan.preference is not None and not plan.preference.chose_optimum:
        sentences.append(f"The optimum, `{plan.preference.optimum_spec}`, is faster by less than the model's error "
                         "and was set aside (Preference, above).")
    elif plan.runners_up:
        r = plan.runners_up[0]
        if r.worse_pct < 0.005:
            sentences.append(f"The best runner-up ties with it (within 0.01%): `{r.strategy_spec}`.")
        else:
            sentences.append(f"The best runner-up, `{r.strategy_spec}`, is {r.worse_pct:.2f}% "
                             f"{'slower' if plan.solver.objective_kind == 'time' else 'costlier'}.")
    return " ".join(sentences)


def _placement(stage: PlanStage) -> str:
    """Where a stage keeps its state, in words."""
    p = stage.placement
    parts = []
    if p.offload != "none":
        share = f"{p.offload_ratio:.0%} of " if p.offload_ratio < 1.0 else ""
        what = {"optimizer": "optimizer states", "params": "parameters", "all": "optimizer states and parameters"}
        parts.append(f"{share}{what[p.offload]} offloaded to {'host DRAM' if p.offload_device == 'cpu' else 'NVMe'}")
    if p.regather == "host":
        parts.append("ZeRO-3 weights re-gathered from the node's host cache (FCDP)")
    return ", ".join(parts) or "in HBM"


def _stages_table(plan: Plan) -> str:
    rows = [
        [str(st.index), _blocks(st), str(st.layers), ", ".join(st.pools) + f" / {st.device}", _ranks(st),
         str(st.recompute_blocks), f"{_gb(st.memory.hbm.peak_bytes)} / {_gb(st.memory.hbm.capacity_bytes)}",
         f"{1e3 * st.microbatch_time_s:.2f}"]
        for st in plan.stages
    ]
    return md_table(["stage", "blocks", "layers", "pool / device", "ranks", "recompute blocks",
                     "HBM GB used / capacity", "micro-batch ms"], rows, right=(2, 5, 6, 7))


def _memory_table(plan: Plan) -> str:
    rows = []
    for st in plan.stages:
        h = st.memory.hbm
        rows.append([str(st.index), _gb(h.weights_bytes), _gb(h.grads_bytes), _gb(h.optimizer_bytes),
                     _gb(h.activations_bytes), _gb(h.buffers_bytes), _gb(h.reserve_bytes), _gb(h.peak_bytes),
                     _gb(h.capacity_bytes), _gb(st.memory.host_dram_bytes), _gb(st.memory.nvme_bytes)])
    return md_table(["stage", "weights", "grads", "optimizer", "activations", "buffers", "reserve", "total",
                      "capacity", "host DRAM", "NVMe"], rows, right=tuple(range(1, 11)))


def _time_table(plan: Plan) -> str:
    br, step = plan.time.breakdown, plan.time.step_time_s or 1.0
    rows = [[label, f"{getattr(br, key):.4f}", f"{100 * getattr(br, key) / step:.1f}%"] for key, label in _TIME_TERMS]
    rows.append(["**step**", f"**{plan.time.step_time_s:.4f}**", "100.0%"])
    rows.append(["exposed communication (total)", f"{br.exposed_comm_s:.4f}", f"{100 * br.exposed_comm_s / step:.1f}%"])
    rows.append(["data-parallel comm incl. hidden", f"{br.dp_comm_total_s:.4f}", ""])
    return md_table(["term", "seconds", "of step"], rows, right=(1, 2))


def _solver(plan: Plan) -> list[str]:
    s = plan.solver
    unit = "s per step" if s.objective_kind == "time" else "USD per step"
    lines = [
        f"- status: **{s.status}**",
        f"- objective ({s.objective_kind}): {s.objective:.6g} {unit}",
        f"- bound: {s.bound:.6g} {unit} (no plan in the space does better)",
        f"- gap: {100 * s.gap:.2f}%",
        f"- configurations: {s.configurations} in the space, {s.solved} solved, {s.pruned} pruned by their bound",
        f"- time limit: {s.time_limit_s:g} s" if s.time_limit_s is not None else
        f"- work limit: {s.work_limit_s:g} deterministic s per program, no wall-clock budget",
        ("- search: **stopped by the time limit**: the plan depends on this machine's speed and load, so it is "
         "not reproducible (another run may choose differently); a larger limit gives a reproducible plan"
         if s.stopped == "time_limit" else
         "- search: complete (reproducible: the same inputs give the same plan)"),
    ]
    if s.max_step_time_s is not None:
        lines.append(f"- step-time limit: {s.max_step_time_s:g} s")
    runtimes = [plan.job.runtime, *s.space_runtimes]
    over = (f"the strategies the {runtimes[0]} runtime can express" if len(runtimes) == 1 else
            f"the strategies the {', '.join(runtimes[:-1])} and {runtimes[-1]} runtimes can all express (one plan "
            "for every named target)")
    lines.append(f"- what the certificate covers: {over}, costed as the {plan.job.runtime} runtime runs them "
                 f"(hardware/data/runtimes/{plan.job.runtime}.yaml)")
    return lines


def _confidence(plan: Plan) -> list[str]:
    """Which terms lean on a regime no validated published run covers (planner.cost.confidence)."""
    if not plan.confidence.extrapolated:
        return ["Every term of this estimate lies in a regime published runs validate (within 30%: "
                "hardware/data/validated.yaml, docs/benchmarks.md)."]
    return ["Extrapolated: these terms lean on regimes no validated published run covers "
            "(hardware/data/validated.yaml, docs/benchmarks.md):", "",
            *(f"- {r}" + (f": {d}" if d else "") for r, d in zip(plan.confidence.reasons, _details(plan.confidence)))]


def _details(confidence) -> list[str]:
    """The details of each reason (a plan written before details were kept has none)."""
    return confidence.details or [""] * len(confidence.reasons)


def _interval(plan: Plan) -> list[str]:
    i = plan.time.interval
    if i is None:
        return []
    return [f"- how sure: {i.coverage:.0%} of the {i.runs} published runs nearest its regime ({i.regime.text()}) "
            f"fall within {i.low_s:.4g}-{i.high_s:.4g} s (planner.cost.interval, docs/benchmarks.md); two plans "
            f"closer than {i.comparison_error:.1%} cannot be ranked by the model"]


def _preference(plan: Plan) -> list[str]:
    """Both plans when --prefer validated set the optimum aside, or the optimum's risks beside the alternative."""
    p = plan.preference
    if p is None or p.alternative_spec is None:
        return []
    if not p.chose_optimum:
        head = (f"This plan is not the optimum of the objective: `{p.optimum_spec}` is, at "
                f"{p.optimum_step_time_s:.4f} s (the certificate below is its).  Its advantage is within the model's "
                "error, and (--prefer validated):")
    else:
        head = (f"The optimum risks more than the fastest runner-up that does not, `{p.alternative_spec}` at "
                f"{p.alternative_step_time_s:.4f} s, but wins by more than the model's error, so it stands:")
    return ["## Preference", "", head, "", *(f"- {r}" for r in p.reasons), ""]


def _runners_up(plan: Plan) -> list[str]:
    if not plan.runners_up:
        return ["No other configuration was solved (the others were pruned by their bounds)."]
    worse = "slower" if plan.solver.objective_kind == "time" else "costlier"
    rows = [[str(i + 1), f"`{r.strategy_spec}`", f"{r.step_time_s:.4f}", f"{r.tokens_per_s:,.0f}",
             f"{r.worse_pct:+.2f}%", "yes" if r.within_error else "no"] for i, r in enumerate(plan.runners_up)]
    return [md_table(["#", "strategy", "step s", "tokens/s", f"{worse} than the optimum", "within the model's error"],
                     rows, right=(0, 2, 3, 4))]


# How each target folder is launched, from the output directory (see its README.md for details)
LAUNCH_COMMANDS = {
    "deepspeed": "bash deepspeed/launch.sh            # DeepSpeed launcher over deepspeed/hostfile",
    "torch": "bash torch/launch.sh                # on every node: torchrun + planner.runtime.train",
    "torchtitan": "bash torchtitan/launch.sh           # on every node: torchrun -m torchtitan.train",
    "megatron": "bash megatron/launch.sh             # on every node: torchrun pretrain_gpt.py with megatron/args.txt",
    "slurm": "sbatch slurm/job.sbatch             # one torchrun per node (srun), c10d rendezvous on the first",
    "k8s": "bash k8s/apply.sh                   # kubectl: ConfigMap of plan.json, volumes, Kubeflow PyTorchJob",
}


def _body(plan: Plan, level: str, plots: bool = False) -> list[str]:
    """What binds the plan, its stages, memory and time, under `level` headings (plots: link the figures)."""
    lines = [
        _why(plan),
        "",
        f"{level} Stages",
        "",
        _stages_table(plan),
        "",
        f"Rank order {plan.rank_layout.order}: {plan.rank_layout.rank_formula}.",
        "",
        f"{level} Memory per GPU (GB)",
        "",
        _memory_table(plan),
        "",
    ]
    host = plan.memory.host
    if host.dram_bytes or host.nvme_bytes:
        lines += [f"Host per node: DRAM {_gb(host.dram_bytes)} of {_gb(host.dram_capacity_bytes)} GB, "
                  f"NVMe {_gb(host.nvme_bytes)} of {_gb(host.nvme_capacity_bytes)} GB.", ""]
    if plots:
        lines += [_MEMORY_FIGURE, ""]
    lines += [f"{level} Time per step (s, critical path of the slowest stage)", "", _time_table(plan), ""]
    if plots:
        lines += [_TIME_FIGURE, ""]
    return lines


def _step_detail(plan: Plan) -> str:
    """What the step time is made of, in a few words."""
    if plan.groups:
        return f"the slowest of {len(plan.groups)} replica groups plus their gradient sync"
    m = plan.time.micro_batches
    return f"{m} micro-batch{'' if m == 1 else 'es'} per data-parallel replica"


def _groups(plan: Plan, plots: bool = False) -> list[str]:
    """Replica groups: the split, then each group's own plan."""
    if not isinstance(plan.strategy, ReplicaGroupsStrategy):
        raise GroupPlanError("a single-strategy plan has no replica groups")
    rows = [[g.pool, str(g.batch), f"{g.first_rank}-{g.first_rank + g.plan.job.num_gpus - 1}",
             f"`{g.plan.strategy_spec}`", f"{g.plan.time.step_time_s:.4f}",
             f"{_gb(g.plan.memory.peak_bytes)} / {_gb(g.plan.memory.capacity_bytes)}"] for g in plan.groups]
    lines = [
        "## Replica groups",
        "",
        "Each pool trains the whole model under its own strategy on its share of the batch; the groups "
        f"all-reduce their gradients after each step ({plan.strategy.sync_s:.4f} s, not overlapped).",
        "",
        md_table(["pool", "batch", "ranks", "strategy", "step s", "HBM GB peak / capacity"], rows,
                  right=(1, 4)),
        "",
        *([_MEMORY_FIGURE, "", _TIME_FIGURE, ""] if plots else []),
    ]
    for g in plan.groups:
        lines += [f"## Group {g.pool}: batch {g.batch}, ranks from {g.first_rank}, nodes from {g.first_node}", "",
                  *_body(g.plan, "###")]
    return lines


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _targets(plan: Plan, checks: Sequence[TargetCheck]) -> list[str]:
    """The Targets section: each launch folder's strategy as its framework runs it, costed under its runtime."""
    if not checks:
        return []
    lines = [
        "## Targets",
        "",
        f"Each launch folder asks its framework for the strategy below (after the framework's own substitutions), "
        f"costed under that framework's runtime profile (hardware/data/runtimes). A folder is written only when "
        f"that strategy fits and runs at most {100 * checks[0].tolerance:.1f}% slower than the plan's strategy "
        f"does under the same runtime. The plan itself is costed under the {plan.job.runtime} runtime.",
        "",
    ]
    written = [c for c in checks if c.status == "written"]
    if written:
        rows = [[c.target, c.runtime, f"{c.step_time_s:.4f}", f"{c.tokens_per_s_per_gpu:,.0f}",
                 _pct(c.vs_plan or 0.0), _pct(c.slower or 0.0), "yes" if c.fits else "no"] for c in written]
        lines += [md_table(["target", "runtime", "step s", "tokens/s per GPU", "vs plan",
                            "vs plan's strategy on this runtime", "fits"], rows, right=(2, 3, 4, 5)), ""]
        for c in written:
            change = ("as planned" if not c.changed else
                      f"differs from the plan in {', '.join(c.changed)} (plan: {', '.join(c.planned)})")
            lines.append(f"- {c.target}: `{c.written_spec}`: {change}; under the {c.runtime} runtime it "
                         f"{'fits' if c.fits else 'does not fit'} on every stage.")
        lines.append("")
        stages = max(len(c.stages) for c in written)
        rows = [[c.target, *(f"{_gb(s.peak_bytes)} / {_gb(s.capacity_bytes)}" for s in c.stages),
                 *([""] * (stages - len(c.stages)))] for c in written]
        lines += ["Peak HBM per GPU under each target's runtime (GB used / capacity):", "",
                  md_table(["target", *(f"stage {i}" for i in range(stages))], rows,
                           right=tuple(range(1, stages + 1))), ""]
    skipped = [c for c in checks if c.status != "written"]
    if skipped:
        lines += ["Not written:", ""]
        lines += [f"- {c.target} ({c.runtime} runtime): {c.why}" for c in skipped]
        lines.append("")
    return lines


def render_report(plan: Plan, targets: tuple[str, ...] = (), plots: bool = False,
                  checks: Sequence[TargetCheck] = (), launch_inputs: str = "", recipe: str = "") -> str:
    """report.md for a compiled plan; `targets` are the launch folders written beside it; `plots`: link
    memory.png and time.png (planner.plan.plots), written beside it too; `checks`: every target's check
    (planner.emit.check), written or not, for the Targets section; `launch_inputs`: the Launch inputs section
    (planner.emit.inputs.inputs_section); `recipe`: the nearest published recipe's section
    (planner.recipes.recipe_section)."""
    job, t = plan.job, plan.time
    kernel = "" if job.flash_attention else ", no flash attention"
    lines = [
        f"# Training plan: {job.model} on {job.cluster}",
        "",
        f"{job.model} ({job.model_params:,} parameters) on {job.cluster_description}; "
        f"global batch {job.global_batch} x {job.seq_len} tokens, {job.precision}{kernel}; "
        f"uses {job.num_gpus} of {job.cluster_gpus} GPUs. Costed as the {job.runtime} runtime runs it "
        f"(hardware/data/runtimes/{job.runtime}.yaml)"
        + (f"; every stage leaves {100 * job.memory_margin:g}% of its HBM free (the memory margin: the cost "
           "model's measured memory error), so the capacities below are the HBM less it." if job.memory_margin
           else "."),
        "",
        "## Strategy",
        "",
        f"`{plan.strategy_spec}`",
        "",
        f"- step time: {t.step_time_s:.4f} s ({_step_detail(plan)})",
        f"- throughput: {t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f} per GPU)",
        f"- MFU: {100 * t.mfu:.1f}% (HFU {100 * t.hfu:.1f}%)",
        *_interval(plan),
        "",
        *_preference(plan),
        *(_groups(plan, plots) if plan.groups else _body(plan, "##", plots)),
        *data_section(plan, md_table),
        "## Confidence",
        "",
        *_confidence(plan),
        "",
        "## Solver certificate",
        "",
        *_solver(plan),
        "",
        "## Runners-up",
        "",
        *_runners_up(plan),
        "",
        *([recipe] if recipe else []),
        *moe_report_lines(plan),
        *_targets(plan, checks),
        "## Launch",
        "",
        *(["From this directory:", "", "```", *(LAUNCH_COMMANDS[t] for t in targets if t in LAUNCH_COMMANDS),
           "```"] if targets else
          ["No launch folders were written; `planner compile ... -o DIR --target T` writes them."]),
        "",
        *([launch_inputs] if launch_inputs else []),
        f"<!-- inputs sha256 {plan.inputs_digest}; schema {plan.schema_version}; planner {plan.planner_version} -->",
    ]
    return "\n".join(lines) + "\n"
