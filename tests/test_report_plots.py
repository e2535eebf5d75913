"""The figures beside report.md (memory.png, time.png): written by `compile -o`, valid, reproducible, linked."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from pathlib import Path

from planner.cli import cli
from planner.emit import DEFAULT_TARGETS
from planner.emit.check import check_target
from planner.plan.schema import Plan
from planner.emit.inputs import LaunchInputs, inputs_section
from planner.plan.report import render_report
from planner.recipes import nearest_recipe, recipe_section
from planner.simulate.plan_input import plan_job
from planner.plan.plots import MEMORY_PNG, RANKS_PNG, TIME_PNG, memory_png, report_plots, time_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = ["tiny-llama", "cpu:1", "--batch", "8", "--seq-len", "128", "--work-limit", "10"]


def run(*args) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def read_png(data: bytes):
    """Decode with matplotlib (a corrupt file raises); returns the pixel array (rows, columns, RGBA)."""
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(data), format="png")


@pytest.fixture(scope="module")
def tiny_outputs(tmp_path_factory):
    """Two independent `compile -o` runs of the same job: {name: bytes} of each output directory."""
    outputs = []
    for name in ("first", "second"):
        out = tmp_path_factory.mktemp(name) / "out"
        result = run("compile", *TINY, "--fix", "pp=2", "-o", out)
        assert result.exit_code == 0, result.output
        outputs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    return outputs


def test_compile_writes_valid_pngs_linked_from_the_report(tiny_outputs):
    files = tiny_outputs[0]
    for name in (MEMORY_PNG, TIME_PNG):
        assert files[name].startswith(PNG_SIGNATURE), name
        pixels = read_png(files[name])
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400 and pixels.shape[2] in (3, 4)
        assert pixels.min() < 0.5  # something is drawn on the white canvas
    report = files["report.md"].decode()
    assert report.count(f"![memory per stage]({MEMORY_PNG})") == 1
    assert report.count(f"![time per step]({TIME_PNG})") == 1
    # each figure sits after its table
    assert report.index("## Memory per GPU") < report.index(MEMORY_PNG) < report.index("## Time per step")
    assert report.index("## Time per step") < report.index(TIME_PNG) < report.index("## Solver certificate")


def test_two_compiles_give_byte_identical_pngs(tiny_outputs):
    first, second = tiny_outputs
    assert first[MEMORY_PNG] == second[MEMORY_PNG] and first[TIME_PNG] == second[TIME_PNG]
    assert b"Software" not in first[MEMORY_PNG] and b"matplotlib" not in first[TIME_PNG]


def test_render_report_without_plots_links_no_figure(tiny_outputs):
    plan = Plan.model_validate_json(tiny_outputs[0]["plan.json"])
    assert MEMORY_PNG not in render_report(plan) and TIME_PNG not in render_report(plan)
    written = tuple(sorted({name.split("/")[0] for name in tiny_outputs[0] if "/" in name}))
    job = plan_job(plan, Path("plan.json"))  # the job the plan records, under its runtime
    checks = tuple(check_target(plan, job, target) for target in DEFAULT_TARGETS)  # what compile tried
    launch = inputs_section(LaunchInputs(), written)  # compile was given no launch inputs
    recipe = recipe_section(nearest_recipe(job, plan.single_strategy), plan.time.step_time_s,
                            plan.time.tokens_per_s_per_gpu)
    assert "no published recipe for tiny-llama" in recipe  # the zoo's test model has none
    linked = render_report(plan, written, plots=True, checks=checks, launch_inputs=launch, recipe=recipe)
    assert linked == tiny_outputs[0]["report.md"].decode()
    # the figures are the only difference
    assert linked.replace(f"![memory per stage]({MEMORY_PNG})\n\n", "").replace(
        f"![time per step]({TIME_PNG})\n\n", "") == render_report(plan, written, checks=checks, launch_inputs=launch,
                                                        recipe=recipe)


def test_offloading_plan_gets_a_host_memory_panel(tiny_outputs):
    plan = Plan.model_validate_json(tiny_outputs[0]["plan.json"])
    stage = plan.stages[0]
    parked = stage.model_copy(update={"memory": stage.memory.model_copy(update={"host_dram_bytes": 3e9})})
    offloading = plan.model_copy(update={"stages": [parked, *plan.stages[1:]]})
    plain, with_host = read_png(memory_png(plan)), read_png(memory_png(offloading))
    assert with_host.shape[1] > 1.4 * plain.shape[1]  # a second panel beside the HBM bars
    assert memory_png(offloading) == memory_png(offloading)


def test_replica_group_plan_plots_and_links_once(mixed_job_files):
    spec, cluster = mixed_job_files
    result = run("compile", spec, cluster, "-b", "16", "-s", "4096", "--fix", "cp=1", "--json")
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate(json.loads(result.stdout)["plan"])
    assert [g.pool for g in plan.groups] == ["a100", "h100"]
    figures = report_plots(plan)
    assert sorted(figures) == [MEMORY_PNG, TIME_PNG]
    single_group = plan.model_copy(update={"groups": plan.groups[:1]})
    # one bar per group's stage: more groups, more bars, so a different picture
    assert memory_png(single_group) != figures[MEMORY_PNG] and time_png(single_group) != figures[TIME_PNG]
    for data in figures.values():
        assert data.startswith(PNG_SIGNATURE) and read_png(data).size > 0
    report = render_report(plan, plots=True)
    assert report.count(MEMORY_PNG) == 1 and report.count(TIME_PNG) == 1
    assert report.index("## Replica groups") < report.index(MEMORY_PNG) < report.index("## Group a100")


def test_recommendation_compile_writes_a_per_rank_chart(tmp_path):
    pngs = []
    for name in ("a", "b"):
        out = tmp_path / name
        result = run("compile", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "-o", out, "--time-limit", "5")
        assert result.exit_code == 0, result.output
        pngs.append((out / RANKS_PNG).read_bytes())
        assert f"]({RANKS_PNG})" in (out / "report.md").read_text()
    assert pngs[0].startswith(PNG_SIGNATURE) and read_png(pngs[0]).min() < 0.5
    assert pngs[0] == pngs[1]
