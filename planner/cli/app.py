"""The `planner` command group: parse arguments, call the library, print.

Exit codes (docs/design.md): 0 success, 1 infeasible (does not fit, no legal
strategy), 2 bad usage or input.  Every error is one `Error: ...` line on
stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from hardware import Cluster, load_catalog, load_cluster
from models import ZOO, ModelGraph, ModelInputError, list_models, load_model
from models.spec import read_mapping
from models.zoo import close_matches
from planner import __version__
from planner.cli import compare_cmd, compile_cmd, render, simulate_cmd
from planner.cli import sweep_cmd
from planner.cli import replan_cmd
from planner.cli.signals import interrupted_by_sigint
from planner.cli.options import (Infeasible, InputError, job_options, json_option, memory_margin_option, one_line,
                                 printable, runtime_option, user_errors)
from planner.cost import evaluate, refusals
from planner.job import Job
from planner.profile import CLI_RUNTIME, load_runtime
from planner.strategy import parse_strategy
from planner.validation import check_strategy


class PlannerGroup(click.Group):
    """A click group whose usage errors are one `Error: ...` line, like the library's."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            err.show()  # bare `planner`: the help text
            sys.exit(err.exit_code)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            click.echo(f"Error: {one_line(err.format_message())}{hint}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            err.message = printable(err.message)  # an Infeasible explanation keeps its lines
            err.show()
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # click would turn it into Abort after printing an empty line; the entry point prints one line
            raise interrupted_by_sigint() from None


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group(cls=PlannerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
def cli() -> None:
    """Plan distributed training: score strategies for a model on a cluster.

    MODEL is a zoo name (see `planner list models`), a model spec file
    (YAML/JSON, examples/models/) or a Hugging Face config.json.  CLUSTER is
    PRESET:NODES (see `planner list hardware`) or a cluster YAML file
    (examples/clusters/).  Exit codes: 0 ok, 1 infeasible, 2 bad input.

    \b
    Example:
        planner estimate llama3-8b dgx-h100:1 --batch 8 --seq-len 8192 \\
            --strategy zero=3,recompute=selective
    """


# ---------------------------------------------------------------- list


def _model_rows() -> list[dict[str, Any]]:
    rows = []
    for entry in list_models():
        graph = entry.builder()
        rows.append({
            "name": entry.name, "params": graph.params, "active_params": graph.active_params,
            "published_params": entry.published_params, "published_active_params": entry.published_active_params,
            "family": render.family(graph), "source": entry.source,
        })
    return rows


@cli.command(name="list")
@click.argument("what", type=click.Choice(["models", "hardware"]))
@json_option
@user_errors
def list_(what: str, as_json: bool) -> None:
    """List the model zoo or the hardware catalog (devices and node presets).

    \b
    Examples:
        planner list models
        planner list hardware --json
    """
    if what == "models":
        rows = _model_rows()
        if as_json:
            _emit_json(rows)
        else:
            click.echo(render.models_table(rows))
        return
    catalog = load_catalog()
    if as_json:
        _emit_json({
            "devices": [d.model_dump(mode="json") for d in catalog.devices.values()],
            "nodes": [n.model_dump(mode="json") for n in catalog.nodes.values()],
        })
    else:
        click.echo(render.hardware_tables(catalog))


# ---------------------------------------------------------------- show


_MODEL_KEYS = {"builder", "zoo", "layers", "model_type"}  # the top-level keys a model file is recognised by
_CLUSTER_KEYS = {"pools", "fabric", "nodes", "preset", "node"}  # a cluster file's, or a pool's written at the top


def _file_kind(path: Path) -> str | None:
    """'cluster' for a mapping with `pools` or cluster keys and no model keys, 'model' for a model file or one
    that does not parse (the model loader reports where), None when the keys say neither."""
    try:
        keys = set(read_mapping(path))
    except ModelInputError:
        return "model"
    if "pools" in keys or (keys & _CLUSTER_KEYS and not keys & _MODEL_KEYS):
        return "cluster"
    return "model" if keys & _MODEL_KEYS else None


def _resolve(arg: str) -> ModelGraph | Cluster | str:
    """A model graph, a cluster, or the name of a bare node preset."""
    path = Path(arg)
    if arg in ZOO:
        return load_model(arg)
    if path.is_dir():
        return load_model(arg)  # a Hugging Face model folder, or one line saying it is a directory
    if path.is_file():
        kind = _file_kind(path)
        if kind is None:
            raise InputError(f"{arg}: neither a model file (expected 'builder', 'zoo', 'layers' or 'model_type') "
                             "nor a cluster file (expected 'pools')")
        return load_cluster(arg) if kind == "cluster" else load_model(arg)
    if path.exists():  # reading a FIFO or device would block or never end
        raise InputError(f"{arg}: is not a regular file (a FIFO, socket or device); give a model or cluster file")
    catalog = load_catalog()
    if arg in catalog.nodes:
        return arg
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        raise InputError(f"unknown model or cluster '{arg}': no such file")
    if ":" in arg:
        return load_cluster(arg)
    raise InputError(
        f"unknown model or cluster '{arg}'{close_matches(arg, [*ZOO, *catalog.nodes])}: not a zoo model, "
        "node preset, PRESET:NODES or existing file (see `planner list models` and `planner list hardware`)"
    )


@cli.command()
@click.argument("target", metavar="MODEL|CLUSTER")
@click.option("--seq-len", "-s", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Sequence length for the FLOPs-per-token figure of a model.")
@json_option
@user_errors
def show(target: str, seq_len: int, as_json: bool) -> None:
    """Summarise a model (zoo name or file) or a cluster (PRESET:NODES, preset, or file).

    \b
    Examples:
        planner show llama3-70b
        planner show examples/models/tiny-llama.yaml --seq-len 256
        planner show dgx-h100:4
        planner show dgx-h100
        planner show examples/clusters/hetero-3pool.yaml --json
    """
    resolved = _resolve(target)
    catalog = load_catalog()
    if isinstance(resolved, str):
        node = catalog.node(resolved)
        if as_json:
            _emit_json(node.model_dump(mode="json"))
        else:
            click.echo(render.node_summary(node, catalog.node_device(node)))
    elif isinstance(resolved, Cluster):
        if as_json:
            _emit_json({**resolved.model_dump(mode="json"), "total_nodes": resolved.num_nodes,
                        "total_gpus": resolved.num_gpus})
        else:
            click.echo(render.cluster_summary(resolved, catalog))
    elif as_json:
        _emit_json({**resolved.model_dump(mode="json"), "params": resolved.params,
                    "active_params": resolved.active_params})
    else:
        click.echo(render.model_summary(resolved, seq_len))


# ---------------------------------------------------------------- estimate


@cli.command()
@click.argument("model")
@click.argument("cluster")
@job_options
@click.option("--strategy", "spec", default="", metavar="SPEC", show_default=False,
              help="Comma-separated key=value: tp, pp, dp, cp, ep, etp, mbs, vpp, sp, zero, shard, recompute, "
                   "recompute_layers, offload, offload_device, offload_ratio, regather, schedule, tp_overlap, "
                   "ep_overlap, split, "
                   "stage_pools (offload, offload_device, offload_ratio and regather also one value per stage: a/b/...). "
                   "Omitted keys take their defaults; dp is derived from the GPU count.")
@click.option("--sharding", "sharding_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE", help="Recommendation models: score this sharding_plan.json (or plan.json).")
@runtime_option("Score the strategy as this framework runs it (its memory layout, overlap, kernels); exit 2 when "
                "it cannot run the strategy at all; default: planner's runtime")
@memory_margin_option(0.0)
@json_option
@user_errors
def estimate(model: str, cluster: str, batch: int, seq_len: int, precision: str, flash_attention: bool,
             moe_routing: str,
             spec: str, sharding_file: Path | None, runtime: str | None, memory_margin: float, as_json: bool) -> None:
    """Score one strategy: step time, throughput, MFU, memory per stage, time breakdown.

    Exits 1 (after printing the report) when the strategy does not fit in memory.

    \b
    Examples:
        planner estimate llama3-8b dgx-h100:1 --batch 8 --seq-len 8192 \\
            --strategy tp=1,zero=3,mbs=1,recompute=selective
        planner estimate llama3-70b dgx-h100:8 -b 512 -s 4096 \\
            --strategy tp=8,pp=4,mbs=1,recompute=selective --json
        planner estimate llama3-70b dgx-h100:32 -b 1024 -s 8192 --runtime megatron \\
            --strategy tp=2,zero=1,recompute=full,recompute_layers=26
        planner estimate dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 \\
            --strategy sharding=row_wise,cache=0.2
        planner estimate dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 --sharding out/dlrm/sharding_plan.json

    Recommendation models take sharding=TYPE[/K],cache=FRACTION (every table alike) or --sharding FILE.
    """
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq_len,
              precision=precision, flash_attention=flash_attention, moe_routing=moe_routing,
              memory_margin=memory_margin)
    if job.model.family == "recsys":
        _estimate_embedding(job, spec, sharding_file, as_json)
        return
    if sharding_file is not None:
        raise click.BadParameter(f"{job.model.name} has no embedding tables", param_hint="--sharding")
    job = job.on(load_runtime(runtime or CLI_RUNTIME))
    strategy = check_strategy(job, parse_strategy(spec))
    missing = refusals(job, strategy)
    if missing:
        raise InputError(f"--runtime {job.runtime.name}: {job.runtime.name} cannot run {'; '.join(missing)} "
                         f"(hardware/data/runtimes/{job.runtime.name}.yaml, space); --runtime reference costs "
                         "any strategy")
    result = evaluate(job, strategy)
    if as_json:
        _emit_json(result.model_dump(mode="json"))
    else:
        kernel = "" if flash_attention else ", no flash attention"
        title = (f"{job.model.name} on {job.cluster.describe()}\n"
                 f"batch {batch} x {seq_len} tokens, {precision}{kernel}, {job.runtime.name} runtime")
        click.echo(render.estimate_report(result, title))
    if not result.memory.fits:
        raise Infeasible(f"does not fit: {'; '.join(result.memory.reasons) or 'memory exceeds capacity'}")


def _estimate_embedding(job: Job, spec: str, sharding_file: Path | None, as_json: bool) -> None:
    """estimate for a recommendation model: the embedding cost model on a uniform SPEC or a plan file."""
    from planner.embedding.evaluate import EmbeddingCostModel
    from planner.embedding.report import estimate_summary
    from planner.embedding.spec import file_placements, parse_embedding_spec, uniform_placements

    if sharding_file is not None and spec.strip():
        raise InputError(f"--strategy {spec!r} and --sharding {sharding_file}: give one (the file holds every "
                         "table's sharding)")
    model = EmbeddingCostModel(job)
    if sharding_file is not None:
        placements = file_placements(model, sharding_file)
    else:
        placements = uniform_placements(model, parse_embedding_spec(spec))
    result = model.evaluate(placements)
    if as_json:
        _emit_json(result.model_dump(mode="json"))
    else:
        title = f"{job.model.name} on {job.cluster.describe()}\nbatch {job.global_batch} samples"
        click.echo(estimate_summary(result, title))
    if not result.fits:
        raise Infeasible(f"does not fit: {result.problems[0]}")


# ---------------------------------------------------------------- compile, schema (planner/cli/compile_cmd.py)

cli.add_command(compile_cmd.compile_)
cli.add_command(compare_cmd.compare_)
cli.add_command(simulate_cmd.simulate_)
cli.add_command(sweep_cmd.sweep_)
cli.add_command(replan_cmd.replan_)
cli.add_command(compile_cmd.schema)

