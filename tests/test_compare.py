"""`planner compare`: baselines under their frameworks' runtimes, and the planner row never slower on its own."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_cluster
from models import load_model
from planner.cli import cli
from planner.compare.baselines import (StageLine, balanced_split, megatron_plan, megatron_recipe, megatron_split,
                                       proportional_layout)
from planner.compare.table import DENSE_BASELINES, FRAMEWORK_RUNTIMES, baselines_for, compare
from planner.cost import evaluate
from planner.cost.layout import split_blocks
from planner.job import Job
from planner.profile import load_runtime
from planner.strategy import Strategy, parse_strategy

HETERO = str(Path(__file__).resolve().parents[1] / "examples" / "clusters" / "hetero-3pool.yaml")


@pytest.fixture(scope="module")
def dense_rows():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:2"), global_batch=64, seq_len=4096)
    return job, compare(job, time_limit=5)


def test_every_dense_baseline_is_scored_and_planner_is_never_slower(dense_rows):
    job, rows = dense_rows
    # metis has nothing to decide on a one-pool cluster: left out, not shown as failing; Llama 3 8B's published
    # recipes stand where the family aliases are, NeMo's two H100 presets (this job's GPUs) then torchtitan's TOML
    recipes = ["nemo:LLAMA3_8B_H100_BF16_V1", "nemo:LLAMA3_8B_H100_FP8_CS_V1", "torchtitan:llama3_8b.toml"]
    assert [r.strategy for r in rows] == ["ddp", "zero1", "zero2", "zero3", "hsdp", "megatron", *recipes,
                                          "uniform-pp", "planner"]
    assert [name for name in DENSE_BASELINES if name not in ("metis", "nemo-recipe", "torchtitan-recipe")] == \
        [r.strategy for r in rows if r.strategy not in recipes]
    planner = rows[-1]
    assert planner.fits and planner.runtime == job.runtime.name == "reference"
    # the planner's space holds every strategy of a baseline costed under the same runtime; rows of other
    # runtimes are other cost models (Megatron overlaps its parameter all-gather, for one) and may be faster
    for row in rows[:-1]:
        if row.fits and row.runtime == planner.runtime:
            assert planner.step_time_s <= row.step_time_s * (1 + 1e-9), row.strategy
    by_name = {r.strategy: r for r in rows}
    assert "zero=3" in by_name["zero3"].spec and "shard=node" in by_name["hsdp"].spec
    assert by_name["uniform-pp"].runtime == "reference"
    # PyTorch DDP holds fp32 weights, gradients and Adam whole (16 bytes per parameter: 128 GB for 8B) and
    # cannot offload the optimizer without sharding, so it no longer "fits" as the reference model's
    # optimizer offload said
    assert not by_name["ddp"].fits and by_name["ddp"].applicable and by_name["ddp"].runtime == "torchtitan"


def test_baselines_named_after_a_framework_report_its_runtime(dense_rows):
    job, rows = dense_rows
    runtimes = {r.strategy: r.runtime for r in rows}
    assert runtimes["zero1"] == runtimes["zero2"] == runtimes["zero3"] == "deepspeed"
    assert runtimes["hsdp"] == runtimes["ddp"] == "torchtitan" and runtimes["megatron"] == "megatron"
    assert {name: runtimes[name] for name in FRAMEWORK_RUNTIMES} == FRAMEWORK_RUNTIMES
    for row in rows:
        if row.fits and row.strategy in ("zero1", "zero2", "zero3"):
            strategy = parse_strategy(row.spec)
            assert strategy.tp == 1 and not load_runtime("deepspeed").cannot_express(strategy)
            estimate = evaluate(job, strategy, load_runtime("deepspeed"))
            assert estimate.step_time_s == pytest.approx(row.step_time_s, rel=1e-9)


def test_megatron_row_is_costed_as_megatron_runs_it(dense_rows):
    job, rows = dense_rows
    [row] = [r for r in rows if r.strategy == "megatron"]
    assert row.runtime == "megatron" and row.fits
    # the recipe by hand: 8B fits one stage at every tensor-parallel width of a node, so each width is one
    # stage with dp for the rest, the distributed optimizer, micro-batch 1, sequence parallel with tp, and
    # selective recompute where it fits (else full); the row is the fastest width
    costed = []
    for tp in (1, 2, 4, 8):
        for recompute in ("selective", "full"):
            candidate = Strategy(tp=tp, pp=1, dp=16 // tp, mbs=1, zero=1, recompute=recompute, sp=tp > 1)
            estimate = evaluate(job, candidate, load_runtime("megatron"))
            if estimate.memory.fits:
                costed.append((estimate.step_time_s, tp, candidate))
                break
    assert len(costed) == 4
    strategy = min(costed, key=lambda c: c[:2])[2]
    assert row.spec == strategy.spec()
    megatron = evaluate(job, strategy, load_runtime("megatron"))
    assert megatron.runtime == "megatron"
    assert row.peak_hbm_bytes == pytest.approx(megatron.memory.peak_bytes, rel=1e-12)
    assert row.step_time_s == pytest.approx(megatron.step_time_s, rel=1e-12)
    # and not the reference model's numbers: Megatron's fp32 main gradients (4 bytes per parameter, whole)
    # against the reference's 2-byte ones
    reference = evaluate(job, strategy, load_runtime("reference"))
    mine, ideal = megatron.memory.per_stage[0], reference.memory.per_stage[0]
    assert mine.grads_bytes == pytest.approx(4 * mine.params) and ideal.grads_bytes == pytest.approx(2 * ideal.params)
    assert row.peak_hbm_bytes > reference.memory.peak_bytes


def test_megatron_recipe_uses_tensor_parallelism_within_a_node_and_an_even_split():
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=512, seq_len=4096)
    megatron = load_runtime("megatron")
    strategy = megatron_recipe(job)
    assert strategy.tp in (1, 2, 4, 8) and strategy.split is None and strategy.mbs == 1 and strategy.zero in (0, 1)
    assert strategy.sp == (strategy.tp > 1)
    assert job.model.num_blocks % strategy.pp == 0
    blocks = tuple(len(b) for b in split_blocks(job.model.num_blocks, strategy.pp, strategy.split))
    assert megatron.cannot_express(strategy, False, job.flash_attention, blocks) == []
    assert evaluate(job, strategy, megatron).memory.fits
    # the smallest depth that fits as Megatron runs it: one stage less does not
    shallower = [p for p in range(1, strategy.pp) if job.model.num_blocks % p == 0]
    for pp in shallower:
        dp = 64 // (strategy.tp * pp)
        assert not evaluate(job, strategy.model_copy(update={"pp": pp, "dp": dp, "vpp": 1, "zero": int(dp > 1),
                                                             "recompute": "full"}), megatron).memory.fits


def test_megatron_keeps_fp32_gradients_whole_so_a_job_the_reference_model_fits_does_not(tmp_path):
    # llama3-8b on two H100s at 8k tokens: tp=2 on one stage or two stages of tp=1, so no data parallelism
    # shards anything.  The reference model's 16 bytes per parameter (2 weights, 2 gradients, 12 optimizer)
    # fit with full recompute in the 76.4 GB compile's default margin (10%) leaves of the 84.9 GB an H100
    # reports to CUDA; Megatron's 18 (fp32 main gradients) do not.
    cluster = tmp_path / "h100x2.yaml"
    cluster.write_text("name: h100x2\npools:\n  - {name: h100, preset: dgx-h100, nodes: 1, "
                       "overrides: {gpus_per_node: 2}}\n")
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster(str(cluster)), global_batch=16, seq_len=8192,
              memory_margin=0.1)
    reference = megatron_plan(job, load_runtime("reference"))
    assert reference.strategy is not None and reference.estimate.memory.fits
    assert (reference.strategy.tp * reference.strategy.pp, reference.strategy.dp) == (2, 1)
    assert reference.strategy.recompute == "full"
    # the same strategy as Megatron holds it: 18 bytes per parameter, over 76.4 GB
    megatron = evaluate(job, reference.strategy, load_runtime("megatron"))
    stage = megatron.memory.per_stage[0]
    states = stage.weights_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert states == pytest.approx(18 * stage.params) and not megatron.memory.fits
    # so the compare row says it does not fit, and why, instead of the reference model's "fits"
    [row] = compare(job, ("megatron",), time_limit=5)
    assert row.runtime == "megatron" and row.applicable and not row.fits and row.step_time_s is None
    assert "grads 16.1" in row.why and "76.4 GB" in row.why, row.why


def test_a_framework_that_cannot_run_the_model_is_not_applicable():
    # torchtitan's profile runs dense models only: its baselines are not costed on Mixtral
    job = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100:4"), global_batch=64, seq_len=4096)
    rows = compare(job, ("ddp", "hsdp"), time_limit=5)
    for row in rows:
        assert not row.applicable and not row.fits and row.step_time_s is None and row.spec == "-"
        assert row.runtime == FRAMEWORK_RUNTIMES[row.strategy]
        assert row.why == f"{row.runtime} cannot run mixture-of-experts models"
    # DeepSpeed runs Mixtral through its own MoE layer, but not under ZeRO-3 (runtime/engine.py refuses it)
    zero1, zero3 = compare(job, ("zero1", "zero3"), time_limit=5)
    assert zero1.applicable and zero1.runtime == "deepspeed" and parse_strategy(zero1.spec).ep > 1
    assert not zero3.applicable and zero3.step_time_s is None
    assert zero3.why == "deepspeed cannot run zero=3 with mixture-of-experts layers"
    # the planner row under a runtime without experts says so too, rather than failing to compile
    [planner] = compare(job.on(load_runtime("planner")), ("planner",), time_limit=5)
    assert not planner.applicable and planner.runtime == "planner" and "mixture-of-experts" in planner.why


def test_recsys_compare_rows():
    job = Job(model=load_model("tiny-dlrm"), cluster=load_cluster("cpu:1"), global_batch=64, seq_len=1)
    rows = compare(job, time_limit=5)
    assert [r.strategy for r in rows] == ["torchrec", "greedy-torchrec-style", "planner"]
    assert all(rows[2].step_time_s <= r.step_time_s for r in rows if r.fits)


def test_compare_cli_text_json_csv(tmp_path):
    out = tmp_path / "rows.csv"
    args = ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "128", "--only", "zero3", "--only", "planner",
            "--time-limit", "10"]
    # --runtime deepspeed: the planner row searched under DeepSpeed's runtime, as the zero3 row is
    result = CliRunner().invoke(cli, args + ["--runtime", "deepspeed", "--csv", str(out)])
    assert result.exit_code == 0, result.output
    assert "zero3" in result.output and "planner" in result.output
    lines = result.output.splitlines()
    assert lines[1].split()[:2] == ["strategy", "runtime"]
    assert "cost models (runtime column" in result.output
    assert any(line.strip().startswith("deepspeed: DeepSpeed ZeRO") for line in lines)
    with out.open() as handle:
        table = list(csv.DictReader(handle))
    assert [(r["strategy"], r["runtime"]) for r in table] == [("zero3", "deepspeed"), ("planner", "deepspeed")]
    assert float(table[1]["step_time_s"]) <= float(table[0]["step_time_s"]) * (1 + 1e-9)
    png = tmp_path / "rows.png"
    assert CliRunner().invoke(cli, args + ["--plot", str(png)]).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    # the default runtime of the planner row is the command line's: planner's own
    data = json.loads(CliRunner().invoke(cli, args + ["--json"]).output)
    assert [(r["strategy"], r["runtime"]) for r in data] == [("zero3", "deepspeed"), ("planner", "planner")]
    assert all(r["applicable"] for r in data)


# ---------------------------------------------------------------- metis (mixed clusters)


def test_metis_only_applies_to_mixed_clusters_and_says_why_when_asked_on_one_pool():
    one_pool = Job(model=load_model("tiny-llama"), cluster=load_cluster("cpu:1"), global_batch=8, seq_len=128)
    mixed = Job(model=load_model("llama3-8b"), cluster=load_cluster(HETERO), global_batch=256, seq_len=4096)
    assert "metis" not in baselines_for(one_pool) and "metis" in baselines_for(mixed)
    [row] = compare(one_pool, ("metis",), time_limit=5)
    assert not row.fits and "more than one pool" in row.why


def test_proportional_layout_gives_pools_stages_by_their_gpus_in_pool_order():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster(HETERO), global_batch=256, seq_len=4096)
    # a100 has 128 GPUs, h100 and l4 64 each
    assert proportional_layout(job, 4, 16) == ("a100", "a100", "h100", "l4")
    # shares 1.5 / 0.75 / 0.75: the larger remainders (h100, l4) take the two stages left over
    assert proportional_layout(job, 3, 16) == ("a100", "h100", "l4")
    # 128 GPUs per stage: only a100 holds one, so two stages do not fit
    assert proportional_layout(job, 2, 128) is None


def test_balanced_split_follows_speed_and_memory():
    fast, slow = StageLine(1.0, 1.0, 100), StageLine(2.0, 2.0, 100)
    # 9 blocks: 6 on the stage twice as fast, 3 on the other (6 s each)
    assert balanced_split([fast, slow], 9) == (6, 3)
    # the fast stage holds at most 4 blocks: the rest go to the slow one
    assert balanced_split([StageLine(1.0, 1.0, 4), slow], 9) == (4, 5)
    assert balanced_split([StageLine(1.0, 1.0, 4), StageLine(2.0, 2.0, 4)], 9) is None
    assert balanced_split([StageLine(1.0, 1.0, 0), slow], 9) is None


@pytest.fixture(scope="module")
def mixed_rows(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixed")
    cluster = folder / "a100-h100.yaml"
    cluster.write_text("name: a100-h100\npools:\n  - {name: a100, preset: dgx-a100-80g, nodes: 1}\n"
                       "  - {name: h100, preset: dgx-h100, nodes: 1}\n")
    model = folder / "small.yaml"
    model.write_text("builder: llama\nname: small\nnum_layers: 16\nhidden: 4096\nheads: 32\nkv_heads: 8\n"
                     "ffn: 14336\nvocab: 128256\n")
    job = Job(model=load_model(str(model)), cluster=load_cluster(str(cluster)), global_batch=32, seq_len=4096)
    return job, compare(job, ("metis", "planner"), time_limit=20)


def test_metis_pipelines_over_both_pools_with_more_blocks_on_the_faster_gpus(mixed_rows):
    job, (metis, planner) = mixed_rows
    assert metis.fits, metis.why
    # a paper's search, not a framework: costed under the planner row's runtime
    assert metis.runtime == planner.runtime == job.runtime.name
    strategy = parse_strategy(metis.spec)
    assert strategy.stage_pools is not None and set(strategy.stage_pools) == {"a100", "h100"}
    # H100 computes faster than A100, so its stages carry more blocks than the A100 stages
    per_pool = {pool: 0 for pool in strategy.stage_pools}
    for pool, count in zip(strategy.stage_pools, strategy.split):
        per_pool[pool] += count
    assert per_pool["h100"] > per_pool["a100"] and sum(strategy.split) == 16
    estimate = evaluate(job, strategy)
    assert estimate.memory.fits and estimate.step_time_s == pytest.approx(metis.step_time_s)


def test_planner_is_never_slower_than_metis(mixed_rows):
    _, (metis, planner) = mixed_rows
    assert planner.fits and planner.step_time_s <= metis.step_time_s * (1 + 1e-9)


def test_megatron_split_shortens_the_first_and_last_stages():
    # Llama 3 405B (Dubey et al. 2024): 126 layers on 16 stages, one layer fewer on the first and the last
    assert megatron_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert megatron_split(80, 8) == (10,) * 8
    assert megatron_split(7, 3) == (2, 3, 2)
    assert megatron_split(10, 3) == (3, 4, 3)
    assert megatron_split(5, 2) is None  # two stages: nothing in the middle to hold the extra layers


def test_megatron_spreads_experts_and_keeps_to_the_fastest_pool():
    moe = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100:4"), global_batch=64, seq_len=4096)
    strategy = megatron_recipe(moe)
    assert strategy.ep > 1 and moe.model.num_experts % strategy.ep == 0 and strategy.dp % strategy.ep == 0
    mixed = Job(model=load_model("llama3-8b"), cluster=load_cluster(HETERO), global_batch=256, seq_len=4096)
    strategy = megatron_recipe(mixed)
    fastest = max(mixed.cluster.pools, key=lambda p: p.device_spec().peak_flops["bf16"])
    assert strategy.stage_pools == (fastest.name,) * strategy.pp
    assert strategy.tp * strategy.pp * strategy.dp == fastest.gpus


def test_published_recipes_keep_their_layout_and_name_their_source():
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=256, seq_len=8192)
    nemo, titan = compare(job, ("nemo-recipe", "torchtitan-recipe"), time_limit=5)
    # Megatron-Bridge's H100 BF16 preset for Llama 3 70B: tp 4, pp 4, vp 5, cp 2 (dp 2 on 64 GPUs), costed as
    # Bridge runs it (bf16 gradient buffers: the megatron-bridge profile)
    assert nemo.runtime == "megatron-bridge" and "Megatron-Bridge" in nemo.source and "LLAMA3_70B" in nemo.source
    assert nemo.step_time_s is not None and nemo.gpus_used == 64
    s = parse_strategy(nemo.spec)  # costed whether or not it fits the memory margin
    assert (s.tp, s.pp, s.vpp, s.cp, s.dp, s.mbs, s.zero, s.recompute) == (4, 4, 5, 2, 2, 1, 1, "none")
    # torchtitan's llama3_70b.toml: 8-way TP inside the node, FSDP over the rest, full activation checkpointing
    assert titan.runtime == "torchtitan" and titan.fits and "llama3_70b.toml" in titan.source
    s = parse_strategy(titan.spec)
    assert (s.tp, s.pp, s.dp, s.zero, s.mbs, s.recompute) == (8, 1, 8, 3, 8, "full")


def test_a_recipe_that_does_not_apply_says_why():
    dense = Job(model=load_model("llama2-7b"), cluster=load_cluster("dgx-h100:4"), global_batch=64, seq_len=4096)
    (row,) = compare(dense, ("nemo-recipe",), time_limit=5)
    assert not row.applicable and "no published nemo recipe for llama2-7b" in row.why
    big = Job(model=load_model("llama3-405b"), cluster=load_cluster("dgx-h100:4"), global_batch=64, seq_len=8192)
    (row,) = compare(big, ("nemo-recipe",), time_limit=5)
    assert not row.applicable and "8 x 8 x 2 = 128 does not divide 32 GPUs" in row.why
    # torchtitan's llama3_8b.toml checkpoints per op: costed now (the torchtitan profile's `selective` section)
    small = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:1"), global_batch=64, seq_len=8192)
    (row,) = compare(small, ("torchtitan-recipe",), time_limit=5)
    assert row.applicable and row.step_time_s is not None and parse_strategy(row.spec).recompute == "selective"


def test_compare_lists_every_published_recipe_of_the_model_those_for_its_gpus_first():
    from planner.compare.table import baselines_for
    from planner.recipes import recipes_for

    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=512, seq_len=8192)
    names = [n for n in baselines_for(job) if ":" in n]
    # the command: NeMo's two H100 presets (BF16, FP8) first (this job's GPUs), then torchtitan's TOML
    assert names == ["nemo:LLAMA3_70B_H100_BF16_V1", "nemo:LLAMA3_70B_H100_FP8_CS_V1", "torchtitan:llama3_70b.toml"]
    assert len(names) == len(recipes_for("llama3-70b"))
    rows = compare(job, tuple(names), time_limit=5)
    assert [r.same_hardware for r in rows] == [True, True, False]
    # every row keeps its recipe's model parallelism; dp takes the 64 GPUs left: 64 / (4 x 4 x 2), 64 / (4 x 8)
    assert [(parse_strategy(r.spec).dp, r.runtime) for r in rows] == [(2, "megatron-bridge"),
                                                                     (2, "megatron-bridge"), (8, "torchtitan")]
    assert all("written for 64 x dgx-h100" in r.source for r in rows[:2])
