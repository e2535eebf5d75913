"""`planner compare`: every applicable baseline strategy and the compiler's plan, side by side."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from pathlib import Path

import click

from planner import api
from planner.cli import render
from planner.cli.options import (data_profile_option, finite_seconds, job_options, json_option, memory_margin_option,
                                 note_default_runtime, runtime_option, user_errors)
from planner.compare.torchrec_baseline import TORCHREC_MODEL
from planner.compare.table import BREAKDOWN_TERMS, EMBEDDING_RUNTIME, NAMED, CompareRow
from planner.plan.output import check_file_target, write_file
from planner.plan.schema import Plan
from planner.job import MoeRouting, Precision
from planner.profile import load_runtime
from planner.strategy import short_spec

# the job's columns first, so a CSV of several compares concatenated still says what each row ran
_JOB_FIELDS = ("model", "cluster", "batch", "seq_len", "precision")
_FIELDS = (*_JOB_FIELDS, "strategy", "runtime", "gpus_used", "step_time_s", "torchrec_model_s", "tokens_per_s_per_gpu",
           "unit", "mfu",
           "peak_hbm_bytes", "host_bytes", "nvme_bytes", "applicable", "fits", *BREAKDOWN_TERMS, "solver_status", "gap",
           "extrapolated", "confidence", "why", "planning_s", "spec", "source", "same_hardware")
_WIDTH = 100  # text lines wrap here; CSV and JSON keep each reason on one line


def _text(rows: list[CompareRow]) -> str:
    """The rows' figures in a table, then each row's plan (the SPEC keys off their defaults) or why it has none,
    wrapped within _WIDTH columns."""
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    host = any(r.host_bytes for r in rows)  # the host column only where something is offloaded
    body = [[r.strategy + ("*" if r.same_hardware else ""), r.runtime, num(r.gpus_used, "d"), num(r.step_time_s, ".4g"),
             num(r.tokens_per_s_per_gpu, ",.0f"), num(r.mfu and 100 * r.mfu, ".1f"),
             num(r.peak_hbm_bytes and r.peak_hbm_bytes / 1e9, ".1f"),
             *([num(r.host_bytes and r.host_bytes / 1e9, ".1f")] if host else []),
             "yes" if r.fits else ("no" if r.applicable else "n/a"),
             "extrap." if r.extrapolated else ("-" if r.extrapolated is None else "ok"),
             f"{r.planning_s:.2f}"] for r in rows]
    per_gpu = "samples/s/GPU" if rows and rows[0].unit == "samples" else "tok/s/GPU"
    heads = ["strategy", "runtime", "GPUs", "step s", per_gpu, "MFU %", "HBM GB", *(["host GB"] if host else []),
             "fits", "valid.", "plan s"]
    right = (2, 3, 4, 5, 6, *((7,) if host else ()), len(heads) - 1)
    if any(r.unit == "samples" for r in rows):  # recommendation models: the second cost model's number beside
        heads.insert(4, f"{TORCHREC_MODEL} s")
        for r, line in zip(rows, body):
            line.insert(4, num(r.torchrec_model_s, ".4g"))
        right = tuple(i + (i >= 4) for i in right) + (4,)
    marked = "\n* a published recipe written for this job's GPUs" if any(r.same_hardware for r in rows) else ""
    return render.table(heads, body, right=right) + marked + "\n" + _plans(rows)


def _plans(rows: list[CompareRow]) -> str:
    """Each row's plan, or why it has none (whole: the table keeps the figures)."""
    width = max(len(r.strategy) for r in rows) + 2
    lines = ["plans (SPEC keys off their defaults; --json and --csv have them whole) and why not:"]
    for r in rows:
        if r.fits and r.spec:  # a recommendation model's row is an embedding plan's summary, not a SPEC
            text = r.spec if r.unit == "samples" else short_spec(r.spec)
        else:
            text = r.why
        lines += textwrap.wrap(text, _WIDTH, initial_indent=f"  {r.strategy:<{width}}",
                               subsequent_indent=" " * (width + 2), break_on_hyphens=False) or [f"  {r.strategy}"]
    return "\n".join(lines)


def _breakdown(rows: list[CompareRow]) -> str:
    """Where each costed row's step time goes, in seconds (the terms of planner.cost.estimate.Breakdown)."""
    costed = [r for r in rows if r.breakdown is not None]
    if not costed:
        return ""
    body = [[r.strategy, *(format(getattr(r.breakdown, t), ".3g") for t in BREAKDOWN_TERMS)] for r in costed]
    heads = [t.removesuffix("_s").replace("_comm", "") for t in BREAKDOWN_TERMS]
    return "step time by term (s):\n" + render.table(["strategy", *heads], body,
                                                      right=tuple(range(1, 1 + len(BREAKDOWN_TERMS))))


def _margin(rows: list[CompareRow]) -> str:
    """The planner row against the fastest fitting baseline, as a ratio of step times, with both runtimes."""
    planner = next(((r, r.step_time_s) for r in rows if r.strategy == "planner" and r.fits and r.step_time_s), None)
    others = sorted(((r.step_time_s, r.strategy, r) for r in rows
                     if r.strategy != "planner" and r.fits and r.step_time_s), key=lambda item: item[:2])
    if planner is None or not others:
        return "" if planner is None else "no baseline fits; the planner row does"
    best_time, _, best = others[0]
    planned, planner_time = planner
    ratio = best_time / planner_time
    side = "faster" if ratio >= 1 else "slower"
    line = textwrap.fill(f"planner ({planned.runtime} runtime) is {max(ratio, 1 / ratio):.3f}x {side} than the best "
                         f"baseline, {best.strategy} ({best.runtime} runtime)", _WIDTH, break_on_hyphens=False)
    theirs = sorted(((r.torchrec_model_s, r.strategy) for r in rows
                     if r.strategy != "planner" and r.fits and r.torchrec_model_s))
    if planned.torchrec_model_s and theirs:  # the same plans in TorchRec's own estimators
        ratio = theirs[0][0] / planned.torchrec_model_s
        side = "faster" if ratio >= 1 else "slower"
        line += (f"\nin {TORCHREC_MODEL}: planner is {max(ratio, 1 / ratio):.3f}x {side} than the best baseline, "
                 f"{theirs[0][1]}")
    return line


def _legend(rows: list[CompareRow]) -> str:
    """Which cost model each runtime column names (in order of first use), so no number is read as another's."""
    lines = ["cost models (runtime column; hardware/data/runtimes/NAME.yaml):"]
    for name in dict.fromkeys(r.runtime for r in rows):
        if name == EMBEDDING_RUNTIME:
            lines += textwrap.wrap(f"{name}: planner's embedding cost model (planner/embedding/evaluate.py), no "
                                   "runtime profile", _WIDTH, initial_indent="  ", subsequent_indent="    ")
            if any(r.torchrec_model_s is not None for r in rows):
                lines += textwrap.wrap(f"{TORCHREC_MODEL} s column: TorchRec 1.8's own estimators on the same plan "
                                       "(EmbeddingPerfEstimator; the slowest rank's embedding seconds, no dense part)",
                                       _WIDTH, initial_indent="  ", subsequent_indent="    ")
        else:
            lines += textwrap.wrap(f"{name}: {load_runtime(name).description}", _WIDTH, initial_indent="  ",
                                   subsequent_indent="    ")
    return "\n".join(lines)


@click.command(name="compare")
@click.argument("model")
@click.argument("cluster")
@job_options
@click.option("--only", "only", multiple=True, type=click.Choice(sorted(NAMED)),
              help="Score only these strategies (repeatable).")
@click.option("--strategies", "strategies_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE", help="A YAML file whose `strategies:` list names built-in strategies and adds your own: "
              "{name, spec: SPEC} or {name, module: 'pkg.mod:function'} (a callable taking the Job, returning a "
              "Strategy), each costed like the built-ins.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              callback=finite_seconds,
              metavar="SEC", help="Search budget of each compiled row.")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="FILE",
              help="Also write the rows as CSV.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE.png", help="Also draw the rows as bars (step time and peak HBM per GPU).")
@runtime_option("Runtime profile of the planner row and of the baselines that name no framework (uniform-pp, "
                "metis); default: planner's runtime (megatron for mixture-of-experts models, which it cannot run)")
@memory_margin_option(None)
@data_profile_option
@json_option
@user_errors
def compare_(model: str, cluster: str, batch: int, seq_len: int, precision: Precision, flash_attention: bool,
             fp8_params: bool, moe_routing: MoeRouting, routing: str | None,
             only: tuple[str, ...], strategies_file: Path | None, time_limit: float, csv_path: Path | None,
             plot_path: Path | None, runtime: str | None, memory_margin: float | None, data_profile: Path | None,
             as_json: bool) -> None:
    """Score every applicable strategy on one job: step time, tokens/s per GPU, MFU, memory, fit, planning time.

    Dense models: ddp, zero1, zero2, zero3, hsdp, megatron, uniform-pp,
    metis (clusters of more than one pool) and planner (the compiler);
    recommendation models: torchrec (TorchRec's own planner, with torchrec
    installed), greedy-torchrec-style (planner's greedy in TorchRec's style)
    and planner, each also scored in TorchRec's estimators.  A baseline named
    after a framework is searched and costed as that framework runs it
    (megatron: the megatron runtime; zero1-3: deepspeed; ddp, hsdp:
    torchtitan), or shown n/a with what the framework lacks; the planner row,
    uniform-pp and metis run under --runtime.  The runtime column names each
    row's cost model; the planner row is never slower than a fitting baseline
    of the same runtime.  With --data-profile: the data plan against every
    static layout of the same data instead (pad, pack-unmasked, pack at each
    fixed context-parallel degree).

    \b
    Examples:
        planner compare llama3-8b dgx-h100:4 -b 256 -s 4096
        planner compare llama3-8b dgx-h100:4 -b 256 -s 4096 --runtime reference
        planner compare gpt3-175b dgx-a100-80g:16 -b 256 -s 2048 --csv out/compare.csv --plot out/compare.png
        planner compare llama3-8b examples/clusters/hetero-3pool.yaml -b 256 -s 4096 --only metis --only planner
        planner compare dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 --json
        planner compare llama3-8b dgx-h100:4 -b 256 -s 4096 --strategies examples/strategies/strategies.yaml
        planner compare llama3-8b dgx-h100:4 -b 64 -s 131072 --data-profile examples/data/code-corpus.yaml
    """
    for path in (csv_path, plot_path):
        if path is not None:
            check_file_target(path)  # before minutes of solving, not after
    job = api.load_job(model, cluster, batch=batch, seq_len=seq_len, precision=precision,
                       flash_attention=flash_attention, fp8_params=fp8_params, moe_routing=moe_routing,
                       routing=routing,
                       memory_margin=memory_margin,
                       runtime=runtime)
    note_default_runtime(job, runtime)
    if data_profile is not None:
        from planner.cli.compile_cmd import load_profile_for

        compare_data(job, load_profile_for(data_profile, seq_len), time_limit, csv_path, plot_path, as_json)
        return
    rows = api.compare_baselines(job, only=only, strategies_file=strategies_file, time_limit=time_limit)
    labels = {"model": job.model.name, "cluster": cluster, "batch": batch, "seq_len": seq_len, "precision": precision}
    if as_json:
        click.echo(json.dumps([{**labels, **r.as_dict()} for r in rows], indent=2))
    else:
        click.echo(f"{job.model.name} on {job.cluster.describe()}, batch {batch} x {seq_len}")
        click.echo(_text(rows))
        for extra in (_breakdown(rows), _margin(rows)):
            if extra:
                click.echo(extra)
        click.echo(_legend(rows))
    if csv_path is not None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=_FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            flat = {**labels, **row.flat()}
            writer.writerow({key: "" if flat[key] is None else flat[key] for key in _FIELDS})
        write_file(csv_path, buffer.getvalue())
    if plot_path is not None:
        from planner.compare.plots import plot_compare

        plot_compare(rows, f"{job.model.name} on {job.cluster.name}, batch {batch} x {seq_len}", plot_path)


def compare_data(job, profile, time_limit: float, csv_path: Path | None, plot_path: Path | None,
                 as_json: bool) -> None:
    """compare --data-profile: the data plan and every static layout on the profile's data."""
    from planner.compare.data_layouts import layout_rows, plot_layouts

    plan = api.compile(job, time_limit=time_limit, data_profile=profile).plan
    data = plan.data if isinstance(plan, Plan) else None
    if data is None:
        raise click.BadParameter(f"{job.model.name}: a data profile plans sequence models", param_hint="--data-profile")
    rows = layout_rows(data)
    title = f"{job.model.name} on {job.cluster.name}, batch {job.global_batch} x {job.seq_len}, {data.profile}"
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
    else:
        click.echo(f"{title} ({data.sequences} sequences, {data.tokens:,} tokens; cost-model predictions)")
        body = [[r.layout, r.cp, f"{r.step_time_s:.4g}", f"{r.plan_speedup:.3f}x", "yes" if r.fits else "no",
                 r.strategy] for r in rows]
        click.echo(render.table(["layout", "cp", "step s", "vs plan", "fits", "strategy"], body, right=(2, 3)))
    if csv_path is not None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0].model_dump()), lineterminator="\n")
        writer.writeheader()
        writer.writerows(r.model_dump() for r in rows)
        write_file(csv_path, buffer.getvalue())
    if plot_path is not None:
        plot_layouts(rows, title, plot_path)
