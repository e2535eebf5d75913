"""TorchRec's own planner as the recommendation-model baseline, and TorchRec's estimators as a second cost model
(planner/compare/torchrec_baseline.py), on CPU with the real torchrec 1.8.

Only the last tests run without torchrec; the others skip, saying why, when it cannot be imported."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_cluster
from models import load_model
from planner.cli.app import cli
from planner.compare.table import EMBEDDING_RUNTIME, compare
from planner.compare.torchrec_baseline import TORCHREC_MODEL, why_not
from planner.embedding.compile import compile_embedding, placements_of
from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement
from planner.embedding.options import ShardingType, TableOption
from planner.job import Job
from benches import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _job(model: str = "tiny-dlrm", cluster: str = "dgx-a100-40g:1", per_rank: int = 8192) -> Job:
    c = load_cluster(cluster)
    return Job(model=load_model(model), cluster=c, global_batch=per_rank * c.num_gpus, seq_len=1)


def _torchrec_missing() -> str | None:
    return why_not(EmbeddingCostModel(_job()))


needs_torchrec = pytest.mark.skipif(_torchrec_missing() is not None, reason=f"{_torchrec_missing()}")


@needs_torchrec
def test_torchrec_plans_tiny_dlrm_and_its_plan_converts():
    from planner.compare.torchrec_baseline import plan_with_torchrec, score_with_torchrec

    model = EmbeddingCostModel(_job())
    theirs = plan_with_torchrec(model)
    assert [p.table for p in theirs.placements] == list(range(8)) and theirs.proposals > 0
    # the converted plan is TorchRec's own: same sharding type and ranks per table as its ShardingPlan
    [module_plan] = theirs.sharding_plan.plan.values()
    for p in theirs.placements:
        sharding = module_plan[f"t_cat_{p.table}"]
        assert sharding.sharding_type == p.option.kind.value and tuple(sharding.ranks) == p.ranks
        if p.option.kind == ShardingType.DATA_PARALLEL:
            assert p.ranks == tuple(range(8))
    # rebuilt from our placements, TorchRec's estimators rate it exactly as its planner rated its best plan
    score = score_with_torchrec(model, theirs.placements)
    assert score.step_s == pytest.approx(theirs.own_rating_s, rel=1e-12) and score.fits
    # and planner's cost model scores the same plan
    estimate = model.evaluate(theirs.placements)
    assert estimate.fits and estimate.step_time_s > score.step_s  # planner's step adds the dense part


@needs_torchrec
def test_planner_plan_is_scored_by_torchrec_estimators():
    from planner.compare.torchrec_baseline import score_with_torchrec

    job = _job()
    model = EmbeddingCostModel(job)
    ours = placements_of(compile_embedding(job, time_limit=5))
    score = score_with_torchrec(model, ours)
    assert len(score.rank_s) == 8 and max(score.rank_s) == score.step_s > 0.0 and score.fits
    # the same tables all on rank 0: TorchRec charges rank 0 for every one and nothing elsewhere
    piled = [TablePlacement(t, TableOption(ShardingType.TABLE_WISE), (0,)) for t in range(8)]
    on_zero = score_with_torchrec(model, piled)
    assert on_zero.rank_s[1:] == [0.0] * 7 and on_zero.step_s > score.step_s
    # each table alone on rank 0 adds up to the pile (shard estimates do not depend on the placement)
    alone = [score_with_torchrec(model, [TablePlacement(t, TableOption(ShardingType.TABLE_WISE), (0,))]
                                 + [TablePlacement(u, TableOption(ShardingType.TABLE_WISE), (1,))
                                    for u in range(8) if u != t]).rank_s[0] for t in range(8)]
    assert sum(alone) == pytest.approx(on_zero.step_s, rel=1e-9)


@needs_torchrec
def test_torchrec_storage_model_refuses_what_does_not_fit():
    from planner.compare.torchrec_baseline import score_with_torchrec

    # the 91 GB of Criteo Terabyte tables on one 40 GB GPU: neither cost model lets it fit
    model = EmbeddingCostModel(_job("dlrm-criteo-terabyte"))
    piled = [TablePlacement(t, TableOption(ShardingType.TABLE_WISE), (0,)) for t in range(26)]
    score = score_with_torchrec(model, piled)
    assert not score.fits and score.problems[0].startswith("rank 0 needs") and "HBM" in score.problems[0]
    assert not model.evaluate(piled).fits
    # column shards and UVM caching reach TorchRec's estimators as such: narrower shards, a slower kernel
    cached = [TablePlacement(t, TableOption(ShardingType.COLUMN_WISE, 4, 0.2), (0, 1, 2, 3)) for t in range(26)]
    fused = [TablePlacement(t, TableOption(ShardingType.COLUMN_WISE, 4, 1.0), (0, 1, 2, 3)) for t in range(26)]
    assert score_with_torchrec(model, cached).step_s > score_with_torchrec(model, fused).step_s


@needs_torchrec
def test_compare_rows_name_both_cost_models():
    job = _job(per_rank=64)
    rows = compare(job, time_limit=5)
    assert [r.strategy for r in rows] == ["torchrec", "greedy-torchrec-style", "planner"]
    assert all(r.runtime == EMBEDDING_RUNTIME and r.fits and r.torchrec_model_s > 0.0 for r in rows)
    assert all(rows[2].step_time_s <= r.step_time_s * (1 + 1e-12) for r in rows)
    out = CliRunner().invoke(cli, ["compare", "tiny-dlrm", "dgx-a100-40g:1", "-b", "512", "-s", "1",
                                   "--time-limit", "5"])
    assert out.exit_code == 0, out.output
    assert f"{TORCHREC_MODEL} s" in out.output and f"in {TORCHREC_MODEL}: planner is" in out.output
    assert f"  {EMBEDDING_RUNTIME}: planner's embedding cost model" in out.output
    assert "TorchRec 1.8's own estimators" in out.output


@needs_torchrec
def test_side_by_side_bench_renders_a_scenario():
    bench = load_bench("torchrec_side_by_side")
    rows = bench.scenario_rows(bench.Scenario("tiny/8", "tiny-dlrm", "dgx-a100-40g:1"), timeout_s=60.0, time_limit=5,
                               isolate=False)
    assert [r.planner for r in rows] == ["torchrec", "planner", "greedy-torchrec-style"]
    text = bench.render(rows)
    heads, _, *lines = text.splitlines()
    cells = [re.split(r"\s{2,}", line) for line in lines[:3]]
    assert re.split(r"\s{2,}", heads)[4:8] == ["planner-model ms", "x", "torchrec-model ms", "x"]
    assert cells[0][5] == cells[0][7] == "1.00"  # TorchRec's plan against itself, in both models
    assert float(cells[1][5]) >= 1.0  # planner's plan is not slower in planner's model


def test_without_torchrec_the_row_says_why(monkeypatch):
    for name in [m for m in sys.modules if m == "torchrec" or m.startswith("torchrec.")] + ["torchrec"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import torchrec...` raises ImportError
    job = _job(per_rank=64)
    assert "torchrec is not importable" in why_not(EmbeddingCostModel(job))
    rows = compare(job, ("torchrec", "planner"), time_limit=5)
    assert not rows[0].applicable and "pip install" in rows[0].why and rows[0].step_time_s is None
    assert rows[1].fits and rows[1].torchrec_model_s is None


def test_a_cluster_of_several_pools_is_not_applicable():
    job = Job(model=load_model("tiny-dlrm"), cluster=load_cluster(str(ROOT / "examples/clusters/hetero-3pool.yaml")),
              global_batch=4096, seq_len=1)
    assert "one kind of device" in why_not(EmbeddingCostModel(job))
