"""`planner list` and `planner show`: the zoo, the catalog, one model or cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from hardware import Cluster, load_catalog, load_cluster
from models import ZOO, ModelGraph, ModelInputError, list_models, load_model
from models.spec import read_mapping
from models.zoo import close_matches
from planner.cli import render
from planner.cli.options import InputError, emit_json, json_option, user_errors


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


@click.command(name="list")
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
            emit_json(rows)
        else:
            click.echo(render.models_table(rows))
        return
    catalog = load_catalog()
    if as_json:
        emit_json({
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


@click.command()
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
            emit_json(node.model_dump(mode="json"))
        else:
            click.echo(render.node_summary(node, catalog.node_device(node)))
    elif isinstance(resolved, Cluster):
        if as_json:
            emit_json({**resolved.model_dump(mode="json"), "total_nodes": resolved.num_nodes,
                        "total_gpus": resolved.num_gpus})
        else:
            click.echo(render.cluster_summary(resolved, catalog))
    elif as_json:
        emit_json({**resolved.model_dump(mode="json"), "params": resolved.params,
                    "active_params": resolved.active_params})
    else:
        click.echo(render.model_summary(resolved, seq_len))
