"""`planner compare`: baselines on the same cost model, and the planner row never slower."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_cluster
from models import load_model
from planner.cli import cli
from planner.compare.baselines import StageLine, balanced_split, megatron_recipe, proportional_layout, megatron_split
from planner.compare.table import DENSE_BASELINES, baselines_for, compare
from planner.cost import evaluate
from planner.job import Job
from planner.strategy import parse_strategy

HETERO = str(Path(__file__).resolve().parents[1] / "examples" / "clusters" / "hetero-3pool.yaml")


@pytest.fixture(scope="module")
def dense_rows():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:2"), global_batch=64, seq_len=4096)
    return job, compare(job, time_limit=5)


def test_every_dense_baseline_is_scored_and_planner_is_never_slower(dense_rows):
    job, rows = dense_rows
    # metis has nothing to decide on a one-pool cluster: left out, not shown as failing
    assert [r.strategy for r in rows] == [name for name in DENSE_BASELINES if name != "metis"]
    planner = rows[-1]
    assert planner.fits
    for row in rows[:-1]:
        if row.fits:
            assert planner.step_time_s <= row.step_time_s * (1 + 1e-9), row.strategy
    by_name = {r.strategy: r for r in rows}
    assert "zero=3" in by_name["zero3"].spec and "shard=node" in by_name["hsdp"].spec
    assert "zero=0" in by_name["ddp"].spec and "tp=1" in by_name["ddp"].spec


def test_megatron_recipe_uses_a_node_of_tensor_parallelism_and_an_even_split():
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=512, seq_len=4096)
    strategy = megatron_recipe(job)
    assert strategy.tp == 8 and strategy.split is None and strategy.mbs == 1
    assert job.model.num_blocks % strategy.pp == 0
    assert evaluate(job, strategy).memory.fits
    # the smallest depth that fits: one stage less does not
    shallower = [p for p in range(1, strategy.pp) if job.model.num_blocks % p == 0]
    for pp in shallower:
        dp = 64 // (8 * pp)
        assert not evaluate(job, strategy.model_copy(update={"pp": pp, "dp": dp, "vpp": 1,
                                                             "recompute": "full"})).memory.fits


def test_recsys_compare_rows():
    job = Job(model=load_model("tiny-dlrm"), cluster=load_cluster("cpu:1"), global_batch=64, seq_len=1)
    rows = compare(job, time_limit=5)
    assert [r.strategy for r in rows] == ["torchrec-greedy", "planner"]
    assert rows[1].step_time_s <= rows[0].step_time_s


def test_compare_cli_text_json_csv(tmp_path):
    out = tmp_path / "rows.csv"
    args = ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "128", "--only", "zero3", "--only", "planner",
            "--time-limit", "10"]
    result = CliRunner().invoke(cli, args + ["--csv", str(out)])
    assert result.exit_code == 0, result.output
    assert "zero3" in result.output and "planner" in result.output
    with out.open() as handle:
        table = list(csv.DictReader(handle))
    assert [r["strategy"] for r in table] == ["zero3", "planner"]
    png = tmp_path / "rows.png"
    assert CliRunner().invoke(cli, args + ["--plot", str(png)]).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    data = json.loads(CliRunner().invoke(cli, args + ["--json"]).output)
    assert data[1]["step_time_s"] <= data[0]["step_time_s"]


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
