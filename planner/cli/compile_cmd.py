"""`planner compile` and `planner schema`: parse, call the library, print or write.

`compile` calls the library's `planner.compile` (planner/api.py: the search, the Plan,
each target's checked launch files) and prints a summary or the `--json` object, or
writes plan.json, report.md, its figures and launch folders into `-o DIR` atomically.
Search progress (incumbent and bound) goes to stderr when stderr is a
terminal, or with `--progress`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast, get_args

import click
from pydantic import TypeAdapter, ValidationError

from hardware.topology import ClusterFile
from models.graph import ModelGraph
from planner.routing.stats import RoutingStats
from planner import api
from planner.cli import render
from planner.cli.options import (MAX_STEP_TIME_S, Infeasible, data_profile_option, emit_json, finite_seconds,
                                 job_options, json_option, launch_options, memory_margin_option,
                                 note_default_runtime, output_dir_path, runtime_option, user_errors)
from planner.data.profile import DataProfile
from planner.embedding.compile import EmbeddingStrategyName
from planner.embedding.plan_doc import EmbeddingPlan
from planner.embedding.report import summary as embedding_summary
from planner.emit import DEFAULT_TARGETS, TARGETS
from planner.emit.inputs import LaunchInputs, checkpoints_inside
from planner.errors import InfeasibleError, PlannerInputError
from planner.fields import fields_with
from planner.job import MoeRouting, Precision
from planner.search.result import Objective, Prefer
from planner.search.space import OffloadSearch
from planner.plan.output import check_output_dir
from planner.plan.plots import MEMORY_PNG, RANKS_PNG, TIME_PNG
from planner.plan.schema import plan_json_schema
from planner.strategy import Dispatcher, Strategy, parse_int, spec_kind

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
        annotation = Strategy.model_fields[key].annotation
        if isinstance(fixed[key], str) and annotation is not None:  # a name the field takes (schedule, shard, ...)
            try:
                TypeAdapter(annotation).validate_python(raw)
            except ValidationError as err:
                raise click.BadParameter(f"{key}: {err.errors()[0]['msg']}, got {raw!r}", param_hint="--fix") from None
    return fixed


def _parse_dispatchers(ctx: click.Context, param: click.Parameter, value: str) -> tuple[Dispatcher, ...]:
    """--dispatchers alltoall,deepep: the MoE token dispatchers the search may use."""
    names = tuple(dict.fromkeys(filter(None, (part.strip() for part in value.split(",")))))
    known = get_args(Dispatcher)
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise click.BadParameter(f"{value!r}: expected a comma-separated list of {', '.join(known)}")
    return cast(tuple[Dispatcher, ...], names)


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
@click.option("--dispatchers", default="alltoall", show_default=True, metavar="LIST", callback=_parse_dispatchers,
              help="MoE token dispatchers the build has, tried where ep > 1 and the runtime runs them "
                   "(comma-separated): alltoall, deepep (Megatron's flex dispatcher on DeepEP: needs its library), "
                   "hybridep.  The certificate holds over the dispatchers given.")
@click.option("--prefer", type=click.Choice(["validated", "fastest"]), default="validated", show_default=True,
              help="validated: when the optimum's advantage lies inside its prediction interval and it leaves under "
                   "5% of HBM free or leans on more unvalidated terms, return the fastest runner-up inside that "
                   "interval without that risk (both are in report.md); fastest: the optimum.  The certificate is "
                   "the optimum's either way.")
@click.option("--progress/--no-progress", default=None,
              help="Print incumbent and bound lines on stderr (default: when stderr is a terminal).")
@data_profile_option
@launch_options
@json_option
@user_errors
def compile_(model: str, cluster: str, batch: int, seq_len: int, precision: Precision, flash_attention: bool,
             fp8_params: bool, moe_routing: MoeRouting, routing: str | None, objective: Objective,
             max_step_time: float | None, time_limit: float,
             work_limit: float | None, targets: tuple[str, ...],
             runtime: str | None, memory_margin: float | None, fixed: str, out_dir: Path | None, force: bool,
             embedding_planner: EmbeddingStrategyName,
             offload_search: OffloadSearch, dispatchers: tuple[Dispatcher, ...], prefer: Prefer,
             progress: bool | None, data_profile: Path | None, inputs: LaunchInputs, as_json: bool) -> None:
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
        planner compile llama3-8b dgx-h100:4 -b 64 -s 131072 --data-profile examples/data/long-context-sft-mix.yaml

    Recommendation models (DLRM) get an embedding plan instead: per table the
    sharding type, ranks and HBM cache fraction (plan.json, sharding_plan.json).
    """
    if out_dir is not None:
        check_output_dir(out_dir, force)  # before the search, not after it
        inside = checkpoints_inside(inputs, out_dir, targets or DEFAULT_TARGETS)
        if inside is not None:
            raise PlannerInputError(inside)
    profile = load_profile_for(data_profile, seq_len)
    job = api.load_job(model, cluster, batch=batch, seq_len=seq_len, precision=precision,
                       flash_attention=flash_attention, fp8_params=fp8_params, moe_routing=moe_routing,
                       routing=routing,
                       memory_margin=memory_margin,
                       runtime=runtime)
    if not targets:  # named targets choose the runtime in api.compile, which says so in its notes
        note_default_runtime(job, runtime)
    try:
        compiled = api.compile(job, targets=targets, runtime=runtime, fixed=_parse_fixed(fixed), objective=objective,
                               max_step_time=max_step_time, time_limit=time_limit, work_limit=work_limit,
                               offload_search=offload_search, embedding_planner=embedding_planner,
                               prefer=prefer, progress=_progress(progress), data_profile=profile,
                               dispatchers=dispatchers)
    except InfeasibleError as err:
        raise Infeasible(str(err)) from None  # keeps the explanation's lines
    for note in compiled.notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        emit_json(compiled.as_json(time_limit=time_limit, work_limit=work_limit))
    elif isinstance(compiled.plan, EmbeddingPlan):
        click.echo(embedding_summary(compiled.plan, compiled.wall_s))
    else:
        click.echo(render.compile_summary(compiled.plan, compiled.wall_s))
        if compiled.plan.data is not None:
            click.echo(render.data_summary(compiled.plan.data))
    if out_dir is None:
        return
    try:
        compiled.write(out_dir, inputs=inputs, force=force)
    except InfeasibleError as err:  # a named target would not run the plan as costed: nothing is written
        raise Infeasible(str(err)) from None
    for note in compiled.skipped:
        click.echo(f"note: {note}", err=True)
    listed = ("plan.json, sharding_plan.json, report.md, " + RANKS_PNG if isinstance(compiled.plan, EmbeddingPlan)
              else f"plan.json, report.md, {MEMORY_PNG}, {TIME_PNG}")
    folders = "".join(f", {t}/" for t in compiled.written)
    click.echo(f"wrote {out_dir}: {listed}{folders} (search {compiled.wall_s:.2f} s)", err=True)


def load_profile_for(path: Path | None, seq_len: int) -> DataProfile | None:
    """The --data-profile file, checked against --seq-len (one line naming the file and field on any problem)."""
    if path is None:
        return None
    from planner.data.profile import load_data_profile

    profile = load_data_profile(path)
    profile.check_fits(seq_len, str(path))
    return profile


_SCHEMAS = {
    "plan": plan_json_schema,
    "data-profile": DataProfile.model_json_schema,
    "model": ModelGraph.model_json_schema,
    "cluster": ClusterFile.model_json_schema,
    "routing": RoutingStats.model_json_schema,
}


@click.command()
@click.argument("what", type=click.Choice(sorted(_SCHEMAS)))
@user_errors
def schema(what: str) -> None:
    """Print the JSON Schema of plan.json, a model graph, a cluster file, a data profile or a routing file.

    \b
    Examples:
        planner schema plan > plan.schema.json
        planner schema data-profile
        planner schema model
        planner schema cluster
        planner schema routing
    """
    emit_json(_SCHEMAS[what]())
