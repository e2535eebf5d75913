"""`planner estimate`: score one strategy on one job."""

from __future__ import annotations

from pathlib import Path

import click

from planner import api
from planner.cli import render
from planner.cli.options import (Infeasible, InputError, data_profile_option, emit_json, job_options, json_option,
                                 memory_margin_option, note_default_runtime, runtime_option, user_errors)
from planner.job import Job, MoeRouting, Precision


# ---------------------------------------------------------------- estimate


@click.command()
@click.argument("model")
@click.argument("cluster")
@job_options
@click.option("--strategy", "spec", default="", metavar="SPEC", show_default=False,
              help="Comma-separated key=value: tp, pp, dp, cp, ep, etp, mbs, vpp, sp, zero, shard, recompute, "
                   "recompute_layers, recompute_every, offload, offload_device, offload_ratio, regather, schedule, "
                   "tp_overlap, ep_overlap, dispatcher, split, "
                   "stage_pools (offload, offload_device, offload_ratio and regather also one value per stage: "
                   "a/b/...). Omitted keys take their defaults; dp is derived from the GPU count.")
@click.option("--sharding", "sharding_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE", help="Recommendation models: score this sharding_plan.json (or plan.json).")
@runtime_option("Score the strategy as this framework runs it (its memory layout, overlap, kernels); exit 2 when "
                "it cannot run the strategy at all; default: planner's runtime (megatron for mixture-of-experts "
                "models, which it cannot run)")
@memory_margin_option(0.0)
@data_profile_option
@json_option
@user_errors
def estimate(model: str, cluster: str, batch: int, seq_len: int, precision: Precision, flash_attention: bool,
             fp8_params: bool, moe_routing: MoeRouting, routing: str | None, spec: str, sharding_file: Path | None,
             runtime: str | None, memory_margin: float, data_profile: Path | None, as_json: bool) -> None:
    """Score one strategy: step time, throughput, MFU, memory per stage, time breakdown.

    Exits 1 (after printing the report) when the strategy does not fit in memory.

    \b
    Examples:
        planner estimate llama3-8b dgx-h100:1 --batch 8 --seq-len 8192 \\
            --strategy tp=2,zero=3,mbs=1,recompute=selective
        planner estimate llama3-70b dgx-h100:8 -b 512 -s 4096 --runtime megatron \\
            --strategy tp=8,pp=4,vpp=2,sp=on,recompute=selective --json
        planner estimate llama3-70b dgx-h100:32 -b 1024 -s 8192 --runtime megatron \\
            --strategy tp=8,sp=on,zero=1,recompute=full,recompute_layers=26
        planner estimate dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 \\
            --strategy sharding=row_wise,cache=0.2
        planner estimate dlrm-criteo-terabyte dgx-a100-40g:8 -b 65536 -s 1 --sharding out/dlrm/sharding_plan.json
        planner estimate llama3-8b dgx-h100:4 -b 64 -s 131072 --strategy cp=8,tp=2,zero=3,recompute=full \\
            --data-profile examples/data/code-corpus.yaml

    With --data-profile the strategy is also scored on that data: its static
    layouts (pad, pack-unmasked, pack) and its hybrid layout (planner.data).

    Recommendation models take sharding=TYPE[/K],cache=FRACTION (every table alike) or --sharding FILE.
    """
    job = api.load_job(model, cluster, batch=batch, seq_len=seq_len, precision=precision,
                       flash_attention=flash_attention, fp8_params=fp8_params, moe_routing=moe_routing,
                       routing=routing,
                       memory_margin=memory_margin,
                       runtime=runtime)
    if job.model.family == "recsys":
        _estimate_embedding(job, spec, sharding_file, as_json)
        return
    if sharding_file is not None:
        raise click.BadParameter(f"{job.model.name} has no embedding tables", param_hint="--sharding")
    note_default_runtime(job, runtime)
    result = api.estimate(job, spec)
    from planner.cli.compile_cmd import load_profile_for

    data = None
    profile = load_profile_for(data_profile, seq_len)
    if profile is not None:
        data = api.estimate_data(job, spec, profile)
    if as_json:
        out = result.model_dump(mode="json")
        if data is not None:
            out["uniform_step_time_s"], out["step_time_s"] = out["step_time_s"], data.step_time_s
            out["data"] = data.model_dump(mode="json")
        placed = api.expert_placement(job, spec)
        if placed is not None:  # routing statistics: the placement's ratios, as compile --json has them
            out["moe"] = placed.model_dump(mode="json", exclude={"layers"})
        emit_json(out)
    else:
        kernel = "" if flash_attention else ", no flash attention"
        title = (f"{job.model.name} on {job.cluster.describe()}\n"
                 f"batch {batch} x {seq_len} tokens, {precision}{kernel}, {job.runtime.name} runtime")
        click.echo(render.estimate_report(result, title))
        if data is not None:
            click.echo(render.data_summary(data))
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
        emit_json(result.model_dump(mode="json"))
    else:
        title = f"{job.model.name} on {job.cluster.describe()}\nbatch {job.global_batch} samples"
        click.echo(estimate_summary(result, title))
    if not result.fits:
        raise Infeasible(f"does not fit: {result.problems[0]}")
