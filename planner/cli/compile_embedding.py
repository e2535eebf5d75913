"""`planner compile` for recommendation models: the embedding sharding and caching plan.

Called by `compile` when the model's family is recsys; writes plan.json (the
embedding plan), sharding_plan.json (TorchRec ParameterSharding per table),
report.md with ranks.png and, for the torch, slurm and k8s targets, launches of the DLRM
runtime (planner/emit/dlrm.py); report.md ends with how to start them and the launch inputs they read.
"""

from __future__ import annotations

from pathlib import Path

import click

from planner.cli.options import Infeasible, emit_json
from planner.embedding.compile import EmbeddingStrategyName, compile_embedding
from planner.embedding.plan_doc import EmbeddingCompileOptions, build_embedding_plan, to_json
from planner.embedding.report import render_embedding_report, summary
from planner.emit.dlrm import DLRM_EMITTERS, DLRM_INPUTS
from planner.emit.inputs import LaunchInputs, input_lines
from planner.errors import InfeasibleError
from planner.job import Job
from planner.plan.output import write_outputs
from planner.plan.plots import RANKS_PNG, ranks_png
from planner.plan.report import LAUNCH_COMMANDS


def launch_section(targets: tuple[str, ...], inputs: LaunchInputs) -> str:
    """report.md's "Launch" section for the folders written (and the launch inputs they read)."""
    if not targets:
        return ""
    fields = tuple(dict.fromkeys(f for t in targets for f in DLRM_INPUTS[t]))
    lines = ["## Launch", "", "From this directory:", "", "```", *(LAUNCH_COMMANDS[t] for t in targets), "```", ""]
    if fields:
        lines += ["Launch inputs (a value not given to `planner compile` is read from its environment variable "
                  "when the files run):", "", *input_lines(inputs, fields), ""]
    return "\n".join(lines)


def run_embedding_compile(job: Job, *, strategy: EmbeddingStrategyName, time_limit: float, out_dir: Path | None,
                          force: bool, progress, as_json: bool, targets: tuple[str, ...],
                          inputs: LaunchInputs = LaunchInputs()) -> None:
    """Plan the tables of `job`, then print and write as `compile` does for dense models."""
    options = EmbeddingCompileOptions(strategy=strategy, time_limit=time_limit)
    try:
        result = compile_embedding(job, strategy=strategy, time_limit=time_limit, progress=progress)
    except InfeasibleError as err:
        raise Infeasible(str(err)) from None
    plan = build_embedding_plan(job, result, options)
    wall = result.certificate.wall_s
    if as_json:
        data = result.estimate.model_dump(mode="json")
        cert = result.certificate
        data["solver"] = {"status": cert.status, "objective": cert.objective, "bound": cert.bound, "gap": cert.gap,
                          "wall_s": wall}
        data["plan"] = plan.model_dump(mode="json", by_alias=True)
        emit_json(data)
    else:
        click.echo(summary(plan, wall))
    if out_dir is None:
        return
    files = {"plan.json": to_json(plan), "sharding_plan.json": to_json(plan.sharding), RANKS_PNG: ranks_png(plan)}
    written = []
    for target in targets:
        if target in DLRM_EMITTERS:
            files.update(DLRM_EMITTERS[target](plan, job, inputs))
            written.append(target)
        else:
            click.echo(f"note: no {target}/ files: the {target} target does not run embedding-sharded "
                       f"recommendation models ({', '.join(DLRM_EMITTERS)} do)", err=True)
    report = render_embedding_report(plan, plots=True)
    section = launch_section(tuple(written), inputs)
    files["report.md"] = report + ("\n" + section if section else "")
    write_outputs(out_dir, files, force=force)
    folders = "".join(f", {t}/" for t in written)
    click.echo(f"wrote {out_dir}: plan.json, sharding_plan.json, report.md, {RANKS_PNG}{folders} "
               f"(search {wall:.2f} s)", err=True)
