"""`planner sweep`: a grid of scenarios x strategies in parallel (local processes or Ray), to CSV and plots."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click

from planner.cli import render
from planner.cli.options import json_option, output_dir_path, user_errors
from planner.plan.output import check_output_dir, write_outputs
from planner.sweep.executors import EXECUTORS
from planner.sweep.results import SUMMARY_HEADERS, summary_table
from planner.sweep.run import plan_sweep, run_sweep
from planner.sweep.scenarios import MAX_SCENARIOS

_NAMED_ROWS = 10  # time-limited rows the warning names; the rest are counted


@click.command(name="sweep")
@click.argument("scenarios", type=click.Path(path_type=Path, dir_okay=False))
@click.option("-o", "--out", "out_dir", type=click.UNPROCESSED, callback=output_dir_path, required=True,
              metavar="DIR", help="Output directory: results.csv, timings.csv, summary.md, plots/.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="local: worker processes on this machine; ray: Ray tasks (pip install -e '.[ray]' in planner's "
                   "checkout).")
@click.option("--address", default=None, metavar="ADDR",
              help="Ray cluster to join (auto, HOST:PORT or ray://HOST:10001); default: start a local Ray.")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Worker processes (local) or CPUs of a local Ray; default: the CPU count.")
@click.option("--force", is_flag=True, help="Replace DIR when it holds only an earlier planner output (its "
              "planner-manifest.json's files).")
@click.option("--yes", is_flag=True,
              help=f"Run a sweep of more than {MAX_SCENARIOS:,} scenarios (refused without it, before any work).")
@json_option
@user_errors
def sweep_(scenarios: Path, out_dir: Path, executor: str, address: str | None, workers: int | None, force: bool,
           yes: bool, as_json: bool) -> None:
    """Score every strategy on a grid of models x clusters x batch sizes x sequence lengths.

    SCENARIOS is a YAML file (format: planner/sweep/scenarios.py and the
    docs/cli.md).  Every row comes from `planner compare`'s code path; rows are
    written in the file's order, so results.csv is byte-identical whatever
    the executor.  A progress bar goes to stderr.  A sweep of more scenarios
    than the limit (see --yes) is refused before any work; report.md and
    plots/ draw the figures of the first scenarios only and say how many
    they left out.

    \b
    Examples:
        planner sweep examples/sweeps/small.yaml -o out/sweep-small
        planner sweep examples/sweeps/scaling.yaml -o out/scaling --workers 8 --force
        planner sweep examples/sweeps/scaling.yaml -o out/scaling --executor ray --address auto
    """
    tasks = plan_sweep(scenarios, yes=yes)
    check_output_dir(out_dir, force)  # before hours of solving, not after
    start = time.perf_counter()
    result = run_sweep(scenarios, executor, workers or os.cpu_count() or 1, address, tasks=tasks)
    write_outputs(out_dir, result.files, force)
    if result.time_limited:
        named = "; ".join(result.time_limited[:_NAMED_ROWS])
        more = len(result.time_limited) - _NAMED_ROWS
        named += f"; and {more:,} more (timings.csv)" if more > 0 else ""
        click.echo(f"warning: {len(result.time_limited)} rows used their whole time limit, so they may differ "
                   f"between runs and machines (raise time_limit): {named}", err=True)
    if as_json:
        click.echo(json.dumps({"out_dir": str(out_dir), "files": sorted(result.files), "results": result.records},
                              indent=2, sort_keys=True))
        return
    click.echo(f"{len(tasks)} tasks, {result.scenarios} scenarios in {time.perf_counter() - start:.1f} s "
               f"({executor}); wrote {out_dir}/")
    click.echo(render.table(SUMMARY_HEADERS, summary_table(result.best), right=(2, 3, 4, 6, 7, 8)))
