"""`planner compare`: baselines on the same cost model, and the planner row never slower."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from hardware import load_cluster
from models import load_model
from planner.cli import cli
from planner.compare import DENSE_BASELINES, compare, megatron_recipe
from planner.cost import evaluate
from planner.job import Job


@pytest.fixture(scope="module")
def dense_rows():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:2"), global_batch=64, seq_len=4096)
    return job, compare(job, time_limit=5)


def test_every_dense_baseline_is_scored_and_planner_is_never_slower(dense_rows):
    job, rows = dense_rows
    assert [r.strategy for r in rows] == list(DENSE_BASELINES)
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
