"""`planner compile` and `planner schema`: parse, call the library, print or write.

`compile` searches the strategy space (`planner.search.compile.compile_job`), turns
the result into a Plan (`planner.plan.build_plan`) and prints a summary, the
`--json` object, or writes plan.json, report.md and its figures into `-o DIR` atomically.
Search progress (incumbent and bound) goes to stderr when stderr is a
terminal, or with `--progress`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hardware import load_cluster
from hardware.topology import ClusterFile
from models import load_model
from models.graph import ModelGraph
from planner.cli import render
from planner.cli.compile_embedding import run_embedding_compile
from planner.cli.options import (MAX_STEP_TIME_S, Infeasible, emit_json, finite_seconds, job_options, json_option,
                                 launch_options, margin_or_default, memory_margin_option, output_dir_path,
                                 runtime_option, user_errors)
from planner.errors import InfeasibleError, PlannerInputError
from planner.fields import fields_with
from planner.job import Job
from planner.plan.output import check_output_dir, write_outputs
from planner.plan.groups import build_plan
from planner.plan.schema import plan_json, plan_json_schema
from planner.plan.report import render_report
from planner.plan.plots import MEMORY_PNG, TIME_PNG, report_plots
from planner.emit import DEFAULT_TARGETS, TARGET_RUNTIMES, TARGETS, available_targets, primary_runtime
from planner.emit.check import emit_checked
from planner.emit.inputs import LaunchInputs, checkpoints_inside, inputs_section
from planner.profile import load_runtime
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions, narrow_to_runtime
from planner.strategy import parse_int, spec_kind

_FIXABLE = fields_with("fixable")  # the search's global keys (planner.fields)


def _parse_fixed(spec: str) -> dict[str, int | str]:
    """--fix 'tp=2,pp=2': global keys the search must use."""
    fixed: dict[str, int | str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or key not in _FIXABLE:
            raise click.BadParameter(f"{item!r}: expected key=value with key in {', '.join(_FIXABLE)}",
                                     param_hint="--fix")
        try:
            fixed[key] = parse_int(key, raw) if spec_kind(key) == "int" else raw
        except PlannerInputError:
            raise click.BadParameter(f"{key}: expected an integer, got {raw!r}", param_hint="--fix") from None
    return fixed


def _progress(enabled: bool | None):
    """A progress callback printing to stderr, or None."""
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    return lambda message: click.echo(message, err=True)


@click.command(name="compile")
@click.argument("model")
@click.argument("cluster")
@job_options
@click.option("--objective", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="Minimise step time, or cost (USD) per step.")
@click.option("--max-step-time", type=click.FloatRange(min=0, min_open=True, max=MAX_STEP_TIME_S), default=None,
              metavar="SEC", callback=finite_seconds,
              help="Only plans at most this many seconds per step (with --objective cost).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              metavar="SEC", callback=finite_seconds,
              help="Wall-clock budget of the search; past it the plan is FEASIBLE with a gap and marked "
                   "stopped (not reproducible).")
@click.option("--work-limit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SEC",
              callback=finite_seconds,
              help="Instead of --time-limit: CP-SAT deterministic seconds each program may spend (about a second "
                   "of solving each), with no wall-clock budget: the same plan on any machine under any load.")
@click.option("--target", "targets", type=click.Choice(TARGETS), multiple=True,
              help="Launch files to write into DIR (repeatable; default: deepspeed and torch).  Named targets "
                   "give one plan that every one of them can express: it is searched in the intersection of "
                   "their strategy spaces, costed under the first target's runtime (or --runtime), and the "
                   "certificate holds for that runtime; each target's files are re-costed under its own "
                   "runtime and refused (exit 1) when they would not fit or run more than 0.5% slower than "
                   "the plan's strategy does there.")
@runtime_option("Runtime profile the plan is searched and costed under; default: the first --target's framework "
                "(torch, slurm and k8s run planner's runtime), else planner's runtime")
@memory_margin_option(None)
@click.option("--fix", "fixed", default="", metavar="SPEC",
              help="Global choices the search must keep, e.g. 'tp=2,pp=2' "
                   "(keys: tp pp dp cp ep etp mbs vpp zero shard).")
@click.option("-o", "--output", "out_dir", type=click.UNPROCESSED, callback=output_dir_path, default=None,
              metavar="DIR", help="Write plan.json, report.md (+ memory.png, time.png) into DIR (atomically).")
@click.option("--force", is_flag=True, help="Replace DIR when it holds only an earlier planner output (the files its "
              "planner-manifest.json lists, unchanged).")
@click.option("--embedding-planner", "embedding_planner", type=click.Choice(["planner", "greedy-torchrec-style"]),
              default="planner", show_default=True,
              help="Recommendation models: the compiler's plan, or planner's greedy in TorchRec's style (not "
                   "TorchRec's planner: `compare` runs that). (--strategy is a SPEC in every command that takes it.)")
@click.option("--offload-search", type=click.Choice(["fallback", "always"]), default="always", show_default=True,
              help="When stages may offload: in every program, where it can buy fewer recomputed blocks or a better "
                   "split (the certificate covers every placement), or only where nothing fits without it (faster; "
                   "the certificate then holds over the strategies without offload).")
@click.option("--progress/--no-progress", default=None,
              help="Print incumbent and bound lines on stderr (default: when stderr is a terminal).")
@launch_options
@json_option
@user_errors
def compile_(model: str, cluster: str, batch: int, seq_len: int, precision: str, flash_attention: bool,
             moe_routing: str, objective: str, max_step_time: float | None, time_limit: float,
             work_limit: float | None, targets: tuple[str, ...],
             runtime: str | None, memory_margin: float | None, fixed: str, out_dir: Path | None, force: bool,
             embedding_planner: str,
             offload_search: str, progress: bool | None, inputs: LaunchInputs, as_json: bool) -> None:
    """Search every strategy for the fastest (or cheapest) plan that fits, with a certificate.

    Prints the plan's strategy, throughput, MFU, stages and the solver's
    certificate (OPTIMAL, or FEASIBLE with objective, bound and gap).  With
    -o DIR writes plan.json, report.md with its figures (memory.png,
    time.png) and launch folders.  Exits 1 with an explanation (what does
    not fit where, and the smallest change that would) when nothing fits.

    \b
    Examples:
        planner compile llama3-8b dgx-h100:1 --batch 8 --seq-len 8192 -o out/llama3-8b
        planner compile llama3-70b dgx-h100:8 -b 512 -s 4096 --time-limit 30 --json
        planner compile llama3-8b dgx-h100:4 -b 64 -s 4096 --objective cost --max-step-time 2
        planner compile tiny-llama cpu:1 -b 8 -s 128 --fix pp=2,dp=2 -o out/tiny --target torch
        planner compile dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 -o out/dlrm

    Recommendation models (DLRM) get an embedding plan instead: per table the
    sharding type, ranks and HBM cache fraction (plan.json, sharding_plan.json).
    """
    if out_dir is not None:
        check_output_dir(out_dir, force)  # before the search, not after it
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq_len,
              precision=precision, flash_attention=flash_attention, moe_routing=moe_routing,
              memory_margin=margin_or_default(memory_margin))
    if job.model.family == "recsys":
        chosen = targets or tuple(t for t in DEFAULT_TARGETS if t in available_targets())
        # the embedding search's budget is CP-SAT work already (planner.embedding.compile)
        run_embedding_compile(job, strategy=embedding_planner, time_limit=work_limit or time_limit, out_dir=out_dir,
                              force=force, progress=_progress(progress), as_json=as_json, targets=chosen,
                              inputs=inputs)
        return
    if embedding_planner != "planner":
        raise click.BadParameter(f"{embedding_planner} plans the tables of recommendation models; {job.model.name} "
                                 "has none", param_hint="--embedding-planner")
    if out_dir is not None:
        inside = checkpoints_inside(inputs, out_dir, targets or DEFAULT_TARGETS)
        if inside is not None:
            raise PlannerInputError(inside)
    explicit_targets = bool(targets)
    runtime_name, note = (runtime, None) if runtime else primary_runtime(targets, bool(job.model.num_experts))
    if note:
        click.echo(f"note: {note}", err=True)
    job = job.on(load_runtime(runtime_name))
    space = SpaceOptions(fixed=_parse_fixed(fixed), offload_search=offload_search)
    narrowed: list[str] = []
    if explicit_targets:
        # one plan every named target can express: the intersection of their spaces (a target whose runtime
        # cannot run the model at all is skipped at emit time instead)
        space = space.model_copy(update={"replica_groups": False})
        for target in targets:
            profile = load_runtime(TARGET_RUNTIMES[target])
            if profile.space.moe or not job.model.num_experts:
                space = narrow_to_runtime(space, profile, job)
                narrowed.append(profile.name)
    others = tuple(name for name in dict.fromkeys(narrowed) if name != job.runtime.name)
    options = CompileOptions(objective=objective, max_step_time=max_step_time, time_limit=time_limit,
                             work_limit=work_limit, space=space,
                             space_runtimes=others)
    targets = targets or tuple(t for t in DEFAULT_TARGETS if t in available_targets())
    missing = [t for t in targets if t not in available_targets()]
    if missing:
        raise click.BadParameter(f"no emitter for {', '.join(missing)} in this build", param_hint="--target")
    try:
        result = compile_job(job, options, progress=_progress(progress))
    except InfeasibleError as err:
        raise Infeasible(str(err)) from None  # keeps the explanation's lines
    plan = build_plan(job, result, options)
    wall = result.certificate.wall_s
    if as_json:
        data = (result.estimate or result.groups).model_dump(mode="json")
        cert = result.certificate
        data["solver"] = {"status": cert.status, "objective": cert.objective, "bound": cert.bound, "gap": cert.gap,
                          "wall_s": wall, "time_limit_s": None if work_limit else time_limit,
                          "work_limit_s": work_limit, "stopped": cert.stopped,
                          "reproducible": cert.stopped is None}
        data["plan"] = plan.model_dump(mode="json")
        emit_json(data)
    else:
        click.echo(render.compile_summary(plan, wall))
    if out_dir is not None:
        files = {"plan.json": plan_json(plan)}
        checks, refused = [], []
        for target in targets:  # each target's written strategy is costed under its runtime before its files
            check, target_files = emit_checked(plan, job, target, inputs)
            checks.append(check)
            if check.status == "written":
                files.update(target_files)
            elif check.status == "refused" and explicit_targets:
                refused.append(check.line)
            else:  # a target that cannot express the plan, or a default target that would not hold it
                click.echo(f"note: no {target}/ files: {check.why}", err=True)
        if refused:  # nothing is written: the named targets' files would not run the plan as costed
            raise Infeasible("\n".join(refused))
        targets = tuple(c.target for c in checks if c.status == "written")
        files["report.md"] = render_report(plan, targets, plots=True, checks=tuple(checks),
                                           launch_inputs=inputs_section(inputs, targets))
        files.update(report_plots(plan))
        write_outputs(out_dir, files, force=force)
        folders = "".join(f", {t}/" for t in targets)
        click.echo(f"wrote {out_dir}: plan.json, report.md, {MEMORY_PNG}, {TIME_PNG}{folders} "
                   f"(search {wall:.2f} s)", err=True)


_SCHEMAS = {
    "plan": plan_json_schema,
    "model": ModelGraph.model_json_schema,
    "cluster": ClusterFile.model_json_schema,
}


@click.command()
@click.argument("what", type=click.Choice(sorted(_SCHEMAS)))
@user_errors
def schema(what: str) -> None:
    """Print the JSON Schema of plan.json, of a raw model graph, or of a cluster file.

    \b
    Examples:
        planner schema plan > plan.schema.json
        planner schema model
        planner schema cluster
    """
    emit_json(_SCHEMAS[what]())
