"""`planner compare`: every applicable baseline strategy and the compiler's plan, side by side."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click

from planner import api
from planner.cli import render
from planner.cli.options import (finite_seconds, job_options, json_option, memory_margin_option, note_default_runtime,
                                 runtime_option, user_errors)
from planner.compare.torchrec_baseline import TORCHREC_MODEL
from planner.compare.table import BREAKDOWN_TERMS, DENSE_BASELINES, EMBEDDING_BASELINES, EMBEDDING_RUNTIME, CompareRow
from planner.plan.output import check_file_target, write_file
from planner.profile import load_runtime

# the job's columns first, so a CSV of several compares concatenated still says what each row ran
_JOB_FIELDS = ("model", "cluster", "batch", "seq_len", "precision")
_FIELDS = (*_JOB_FIELDS, "strategy", "runtime", "gpus_used", "step_time_s", "torchrec_model_s", "tokens_per_s_per_gpu",
           "unit", "mfu",
           "peak_hbm_bytes", "host_bytes", "nvme_bytes", "applicable", "fits", *BREAKDOWN_TERMS, "solver_status", "gap",
           "extrapolated", "confidence", "why", "planning_s", "spec", "source")
_WHY_WIDTH = 160  # the terminal table shortens a long reason; CSV and JSON keep it whole


def _text(rows: list[CompareRow]) -> str:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    def why(text: str) -> str:
        return text if len(text) <= _WHY_WIDTH else text[:_WHY_WIDTH - 3] + "..."

    body = [[r.strategy, r.runtime, num(r.gpus_used, "d"), num(r.step_time_s, ".4g"),
             num(r.tokens_per_s_per_gpu, ",.0f"), num(r.mfu and 100 * r.mfu, ".1f"),
             num(r.peak_hbm_bytes and r.peak_hbm_bytes / 1e9, ".1f"),
             num(r.host_bytes and r.host_bytes / 1e9, ".1f"), "yes" if r.fits else ("no" if r.applicable else "n/a"),
             "extrap." if r.extrapolated else ("-" if r.extrapolated is None else "ok"),
             f"{r.planning_s:.2f}", r.spec if r.fits else why(r.why)] for r in rows]
    per_gpu = "samples/s/GPU" if rows and rows[0].unit == "samples" else "tok/s/GPU"
    heads = ["strategy", "runtime", "GPUs", "step s", per_gpu, "MFU %", "HBM GB", "host GB", "fits", "valid.",
             "plan s", "plan / why not"]
    if any(r.unit == "samples" for r in rows):  # recommendation models: the second cost model's number beside
        heads.insert(4, f"{TORCHREC_MODEL} s")
        for r, line in zip(rows, body):
            line.insert(4, num(r.torchrec_model_s, ".4g"))
        return render.table(heads, body, right=(2, 3, 4, 5, 6, 7, 8, 11))
    return render.table(heads, body, right=(2, 3, 4, 5, 6, 7, 10))


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
    planner = next((r for r in rows if r.strategy == "planner" and r.fits), None)
    others = sorted((r for r in rows if r.strategy != "planner" and r.fits and r.step_time_s),
                    key=lambda r: (r.step_time_s, r.strategy))
    if planner is None or not others:
        return "" if planner is None else "no baseline fits; the planner row does"
    best = others[0]
    ratio = best.step_time_s / planner.step_time_s
    side = "faster" if ratio >= 1 else "slower"
    line = (f"planner ({planner.runtime} runtime) is {max(ratio, 1 / ratio):.3f}x {side} than the best baseline, "
            f"{best.strategy} ({best.runtime} runtime)")
    theirs = sorted((r for r in rows if r.strategy != "planner" and r.fits and r.torchrec_model_s),
                    key=lambda r: (r.torchrec_model_s, r.strategy))
    if planner.torchrec_model_s and theirs:  # the same plans in TorchRec's own estimators
        ratio = theirs[0].torchrec_model_s / planner.torchrec_model_s
        side = "faster" if ratio >= 1 else "slower"
        line += (f"\nin {TORCHREC_MODEL}: planner is {max(ratio, 1 / ratio):.3f}x {side} than the best baseline, "
                 f"{theirs[0].strategy}")
    return line


def _legend(rows: list[CompareRow]) -> str:
    """Which cost model each runtime column names (in order of first use), so no number is read as another's."""
    lines = ["cost models (runtime column; hardware/data/runtimes/NAME.yaml):"]
    for name in dict.fromkeys(r.runtime for r in rows):
        if name == EMBEDDING_RUNTIME:
            lines.append(f"  {name}: planner's embedding cost model (planner/embedding/evaluate.py), no runtime "
                         "profile")
            if any(r.torchrec_model_s is not None for r in rows):
                lines.append(f"  {TORCHREC_MODEL} s column: TorchRec 1.8's own estimators on the same plan "
                             "(EmbeddingPerfEstimator; the slowest rank's embedding seconds, no dense part)")
        else:
            lines.append(f"  {name}: {load_runtime(name).description}")
    return "\n".join(lines)


@click.command(name="compare")
@click.argument("model")
@click.argument("cluster")
@job_options
@click.option("--only", "only", multiple=True, type=click.Choice(sorted(set(DENSE_BASELINES + EMBEDDING_BASELINES))),
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
@json_option
@user_errors
def compare_(model: str, cluster: str, batch: int, seq_len: int, precision: str, flash_attention: bool,
             moe_routing: str, routing: str | None,
             only: tuple[str, ...], strategies_file: Path | None, time_limit: float, csv_path: Path | None,
             plot_path: Path | None, runtime: str | None, memory_margin: float | None, as_json: bool) -> None:
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
    of the same runtime.

    \b
    Examples:
        planner compare llama3-8b dgx-h100:4 -b 256 -s 4096
        planner compare llama3-8b dgx-h100:4 -b 256 -s 4096 --runtime reference
        planner compare gpt3-175b dgx-a100-80g:16 -b 256 -s 2048 --csv out/compare.csv --plot out/compare.png
        planner compare llama3-8b examples/clusters/hetero-3pool.yaml -b 256 -s 4096 --only metis --only planner
        planner compare dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 --json
        planner compare llama3-8b dgx-h100:4 -b 256 -s 4096 --strategies examples/strategies/strategies.yaml
    """
    for path in (csv_path, plot_path):
        if path is not None:
            check_file_target(path)  # before minutes of solving, not after
    job = api.load_job(model, cluster, batch=batch, seq_len=seq_len, precision=precision,
                       flash_attention=flash_attention, moe_routing=moe_routing, routing=routing,
                       memory_margin=memory_margin,
                       runtime=runtime)
    note_default_runtime(job, runtime)
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
