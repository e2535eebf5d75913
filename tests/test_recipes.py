"""The published recipes (hardware/data/recipes/, issue #27): every recipe round-trips recipe -> Strategy ->
`estimate` under its runtime on its own hardware and batch -> emit with its framework's target -> the framework's
own parser (Megatron-LM's parse_args/validate_args and megatron-core's layout; torchtitan's ConfigManager) -> the
parallel layout read back is the recipe's, compared with the recipe file's values, not with planner's strategy.
A recipe the cost model cannot run lists why in its file (`inexpressible`), and that is the refusal."""

from __future__ import annotations

import copy
import shutil

import pytest

from hardware.topology import load_cluster
from launch_plans import certified_plan
from models.zoo import ZOO
from planner.emit import emitter
from planner.recipes import load_recipes, on_own_hardware, refusal
from planner.recipes.apply import layout_split
from test_emit_torchtitan import GIVEN, _config, _launch, titan  # noqa: F401 (titan: the fixture)

RECIPES = {r.name: r for r in load_recipes()}
EXPRESSIBLE = sorted(name for name, r in RECIPES.items() if r.inexpressible is None)


def test_every_recipe_file_is_one_recipe_of_a_zoo_model_on_its_stated_gpus():
    from importlib.resources import files

    folder = files("hardware").joinpath("data/recipes")
    assert len(RECIPES) == len(load_recipes()) == len([f for f in folder.iterdir() if f.name.endswith(".yaml")])
    for r in load_recipes():
        assert r.model in ZOO, r.name
        assert load_cluster(r.hardware.cluster).num_gpus == r.hardware.gpus, r.name
        assert r.hardware.gpus % r.model_parallel == 0 and r.global_batch % (
            r.hardware.gpus // r.model_parallel * r.layout.mbs) == 0, r.name
    # what issue #27 asks for: NeMo's Llama 3, Mixtral, DeepSeek-V3 and Qwen3 MoE recipes, torchtitan's llama3
    assert {r.model for r in load_recipes() if r.family == "nemo"} == {
        "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b",
        "qwen3-235b-a22b"}
    assert {"llama3-8b", "llama3-70b", "llama3-405b"} <= {r.model for r in load_recipes() if r.family == "torchtitan"}


def test_a_bad_recipe_file_is_one_line_naming_the_file_and_the_field():
    from planner.errors import PlannerInputError
    from planner.recipes.schema import parse_recipe

    good = _recipe_text("nemo-llama3-8b-h100-bf16.yaml")
    assert parse_recipe("x.yaml", good).name == "nemo:LLAMA3_8B_H100_BF16_V1"
    for change, message in ((("  tp: 1\n", "  tp: 0\n"), "x.yaml: layout.tp: Input should be greater than 0"),
                            (("  mbs: 1\n", "  mbs: 1\n  zero: 1\n"), "x.yaml: layout.zero: Extra inputs are not "
                                                                     "permitted")):
        with pytest.raises(PlannerInputError) as err:
            parse_recipe("x.yaml", good.replace(*change, 1))
        assert str(err.value) == message


def _recipe_text(name: str) -> str:
    from importlib.resources import files

    return files("hardware").joinpath("data/recipes", name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_refusal_is_the_one_its_file_lists(name):
    recipe = RECIPES[name]
    assert refusal(recipe) == (recipe.inexpressible or "")
    run = on_own_hardware(recipe)
    if recipe.inexpressible is not None:
        assert (run.estimate, run.why) == (None, recipe.inexpressible)


def test_the_inexpressible_recipes_are_few():
    # NeMo's DeepSeek-V3 recomputes MLA's up-projections and the MLP (selective modules the cost model has no
    # term for); torchtitan's DeepSeek-V3 TOML is a mixture-of-experts run, which the torchtitan profile does not cost
    assert sorted(n for n, r in RECIPES.items() if r.inexpressible) == ["nemo:DEEPSEEK_V3_H100_BF16_V1",
                                                                         "torchtitan:deepseek_v3_671b.toml"]


@pytest.mark.parametrize("name", EXPRESSIBLE)
def test_every_expressible_recipe_scores_on_its_own_hardware(name):
    recipe = RECIPES[name]
    run = on_own_hardware(recipe)
    assert run.estimate is not None, run.why
    e = run.estimate
    assert (e.num_gpus, run.job.runtime.name, run.job.precision) == (recipe.hardware.gpus, recipe.runtime,
                                                                     recipe.precision)
    # tokens per second per GPU: the recipe's batch x sequence over the step, over its GPUs
    assert e.tokens_per_s_per_gpu == pytest.approx(
        recipe.global_batch * recipe.seq_len / e.step_time_s / recipe.hardware.gpus, rel=1e-9)


def test_megatron_core_reads_the_layout_strings_as_planner_splits_them():
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    for layout, pp in (("Et|(tt|)*30mL", 8), ("Et*4|(t*4|)*14tmL", 8), ("Et*1|" + "t*2|" * 62 + "t*1L", 8)):
        theirs = PipelineParallelLayerLayout(layout, pp).layout
        assert list(layout_split(layout, pp)) == [sum(chunk.count(LayerType.decoder) for chunk in stage)
                                                  for stage in theirs]


# ---------------------------------------------------------------- emit and read back


def _plan(recipe):
    run = on_own_hardware(recipe)
    assert run.strategy is not None and run.estimate is not None, run.why
    return certified_plan(run.job, run.strategy), run.job


@pytest.fixture(scope="module")
def mlm():
    """Megatron-LM's megatron.training.arguments (tests/megatron_lm.py)."""
    from megatron_lm import parser_module

    with parser_module() as module:
        yield module


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", [n for n in EXPRESSIBLE if RECIPES[n].target == "megatron"])
def test_megatron_lm_reads_back_the_recipe(mlm, tmp_path, monkeypatch, name):
    from test_megatron_lm_parser import megatron_split, read_launch

    # validate_args asks Transformer Engine's version under --delay-wgrad-compute (the all-to-all overlap); none
    # is installed here, the recipes' NeMo container ships TE >= 2.8
    monkeypatch.setattr(mlm, "is_te_min_version", lambda *_: True)
    recipe = RECIPES[name]
    layout = recipe.layout
    plan, job = _plan(recipe)
    _, args = read_launch(mlm, tmp_path, emitter("megatron")(plan, job), job)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size,
            args.expert_model_parallel_size, args.micro_batch_size) == \
        (layout.tp, layout.pp, layout.cp, layout.ep, layout.mbs)
    assert args.virtual_pipeline_model_parallel_size == (layout.vpp if layout.vpp > 1 else None)
    assert args.expert_tensor_parallel_size == (layout.etp or layout.tp)
    assert args.data_parallel_size == recipe.hardware.gpus // recipe.model_parallel
    assert (args.global_batch_size, args.seq_length) == (recipe.global_batch, recipe.seq_len)
    assert args.sequence_parallel == layout.sp
    assert (args.use_distributed_optimizer, bool(args.use_megatron_fsdp)) == (
        layout.sharding == "distributed-optimizer", layout.sharding == "megatron-fsdp")
    assert args.recompute_granularity == (None if layout.recompute == "none" else layout.recompute)
    assert (args.recompute_method, args.recompute_num_layers) == (layout.recompute_method, layout.recompute_num_layers)
    assert (args.tp_comm_overlap, args.overlap_moe_expert_parallel_comm) == (layout.tp_comm_overlap,
                                                                           layout.moe_a2a_overlap)
    assert (args.fp8 is not None) == (recipe.precision == "fp8")
    # The recipe row is costed under megatron-bridge: the Bridge recipe's own ddp.grad_reduce_in_fp32 = False (bf16
    # main gradients, 2 B per parameter).  The args.txt is Megatron-LM's pretrain_gpt.py, which with --bf16 keeps
    # fp32 main gradients (validate_args sets accumulate_allreduce_grads_in_fp32): the megatron target writes that
    # and re-checks it under the megatron profile (4 B), so on its own the written run differs from the recipe here
    assert (recipe.runtime, args.bf16, args.accumulate_allreduce_grads_in_fp32) == ("megatron-bridge", True, True)
    # the blocks on each stage, as megatron-core builds them from what was written, against megatron-core's own
    # split of the recipe's flags (the embedding and the loss counted as layers where the recipe says so)
    # (megatron-core's config asserts Transformer Engine >= 2.8 for delayed wgrad under the all-to-all overlap:
    # both off here on CPU, which places no layer differently)
    args = copy.copy(args)
    args.overlap_moe_expert_parallel_comm = args.delay_wgrad_compute = False
    published = copy.copy(args)
    published.pipeline_model_parallel_layout = None
    published.decoder_first_pipeline_num_layers = published.decoder_last_pipeline_num_layers = None
    published.account_for_embedding_in_pipeline_split = layout.account_for_embedding_and_loss
    published.account_for_loss_in_pipeline_split = layout.account_for_embedding_and_loss
    assert megatron_split(mlm, args) == megatron_split(mlm, published)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", [n for n in EXPRESSIBLE if RECIPES[n].target == "torchtitan"])
def test_torchtitan_reads_back_the_recipe(titan, tmp_path, monkeypatch, name):  # noqa: F811 (the fixture)
    recipe = RECIPES[name]
    layout = recipe.layout
    plan, job = _plan(recipe)
    plan_dir, _, train_args = _launch(tmp_path, emitter("torchtitan")(plan, job, GIVEN), {})
    config = _config(titan, plan_dir, train_args, monkeypatch)
    p, t, ac = config.parallelism, config.training, config.activation_checkpoint
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree,
            p.expert_parallel_degree) == (layout.tp, layout.pp, layout.cp, layout.ep)
    # FSDP over every data-parallel rank: the TOMLs' data_parallel_shard_degree = -1, resolved
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (
        1, recipe.hardware.gpus // recipe.model_parallel)
    assert (t.local_batch_size, t.seq_len, t.global_batch_size) == (layout.mbs, recipe.seq_len, recipe.global_batch)
    assert ac.mode == layout.recompute
    if layout.recompute == "selective":
        assert ac.selective_ac_option == layout.selective_ac_option
    assert p.enable_async_tensor_parallel == layout.tp_comm_overlap
    assert ("quantize.linear.float8" in config.model.converters) == (recipe.precision == "fp8")


# ---------------------------------------------------------------- the nearest recipe in report.md


def test_the_nearest_recipe_of_a_plan_is_one_that_runs_on_its_job():
    from conftest import make_job
    from planner.cost import evaluate
    from planner.recipes import nearest_recipe, recipe_section
    from planner.strategy import parse_strategy

    job = make_job("llama3-70b", "dgx-h100:1", 64, 8192)
    plan = parse_strategy("tp=8,zero=3,mbs=8,recompute=full").with_dp(8)
    mine = evaluate(job, plan)
    nearest = nearest_recipe(job, plan)
    # NeMo's two H100 presets are written for these GPUs but need tp x pp x cp = 4 x 4 x 2 and 4 x 8 x 1 = 32 GPUs
    # of the 8 here; torchtitan's TOML (96 GB H100s) runs: it is the nearest, and its layout is the plan's
    assert nearest.run is not None and nearest.run.recipe.name == "torchtitan:llama3_70b.toml"
    assert (nearest.same_hardware, nearest.distance) == (False, 0)
    theirs = nearest.run.estimate
    assert theirs is not None
    text = recipe_section(nearest, mine.step_time_s, mine.tokens_per_s_per_gpu)
    assert ("`torchtitan:llama3_70b.toml` (pytorch/torchtitan `torchtitan/models/llama3/train_configs/llama3_70b.toml`"
            in text)
    assert "written for other GPUs: 256 x h100-96g-8" in text
    assert f"{theirs.step_time_s / mine.step_time_s:.3f}x the recipe's throughput" in text


def test_a_model_without_recipes_says_none_applies():
    from conftest import make_job
    from planner.recipes import nearest_recipe, recipe_section
    from planner.strategy import Strategy

    nearest = nearest_recipe(make_job("llama2-7b", "dgx-h100:1", 8, 4096), Strategy(dp=8))
    assert nearest.run is None
    assert recipe_section(nearest, 1.0, 1.0) == ("## Nearest published recipe\n\nNone applies: no published recipe "
                                                 "for llama2-7b (hardware/data/recipes/).\n\n")


def test_compile_writes_the_nearest_recipe_into_report_md(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli

    out = tmp_path / "plan"
    result = CliRunner().invoke(cli, ["compile", "llama3-8b", "dgx-h100:1", "-b", "128", "-s", "8192", "--time-limit",
                                      "10", "--target", "megatron", "-o", str(out)])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    section = report.split("## Nearest published recipe")[1].split("\n## ")[0]
    # Llama 3 8B's recipes: NeMo's two H100 presets (this job's GPUs) and torchtitan's TOML; one is named with its
    # source and costed on this job
    assert any(f"`{name}`" in section for name in ("nemo:LLAMA3_8B_H100_BF16_V1", "nemo:LLAMA3_8B_H100_FP8_CS_V1",
                                                   "torchtitan:llama3_8b.toml"))
    assert "costed on this job under the" in section and "the recipe's throughput" in section
