"""The table builder's caches never return a stale entry: change each Strategy field in turn, and
every cached quantity equals the same quantity computed by a fresh builder.

`TableBuilder` caches layer sums, communicator shapes, bounds, slot profiles and stage sums by keys
built from the Strategy fields their cost code reads (`planner.cost.*.READS`).  A field missing from a
key would make two configurations share an entry they should not; here one builder serves a base
configuration and then every variation (so each lookup may hit an entry of an earlier one), and a fresh
builder recomputes each variation from scratch.
"""

from __future__ import annotations

import pytest

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cost import micro_batches
from planner.errors import PlannerInputError
from planner.job import Job
from planner.search.ilp.build import build_tables, stage_pools_for
from planner.search.ilp.tables import TableBuilder
from planner.strategy import Strategy
from planner.validation import check_strategy

BASE = {"tp": 2, "pp": 2, "cp": 1, "mbs": 1, "zero": 1}
# values each Strategy field takes besides the base's (illegal combinations are skipped)
VARIATIONS: dict[str, list] = {
    "tp": [1, 4], "pp": [1, 4], "dp": [2], "cp": [2], "ep": [2], "mbs": [2], "vpp": [2], "sp": [False],
    "zero": [0, 2, 3], "shard": ["node"], "recompute": ["selective", "full"], "recompute_layers": [(1, 1)],
    "regather": ["host"], "offload": ["optimizer", "all"], "offload_device": ["nvme"], "offload_ratio": [0.5],
    "schedule": ["gpipe", "interleaved"], "tp_overlap": [True], "split": [(6, 10)],
    "etp": [1], "ep_overlap": [True],  # MoE fields: refused (etp) or inert (ep_overlap) on this dense model
}


def test_every_strategy_field_is_varied():
    assert set(VARIATIONS) | {"stage_pools", "stage_offload", "stage_offload_device", "stage_offload_ratio",
                              "stage_regather"} >= set(Strategy.model_fields)


@pytest.fixture(scope="module")
def job():
    return Job(model=load_model("llama2-7b"), cluster=load_cluster("dgx-h100:2"), global_batch=64, seq_len=2048)


def _variants(job):
    base = check_strategy(job, Strategy(**BASE))
    yield "base", base
    for field, values in VARIATIONS.items():
        for value in values:
            update = {**BASE, field: value}
            if field == "zero" and value == 3 or field in ("offload", "regather", "offload_ratio"):
                update["zero"] = 3
            if field == "offload_ratio":
                update["offload"] = "optimizer"
            if field == "vpp" or field == "schedule" and value == "interleaved":
                update.update(vpp=2, pp=2)
            try:
                yield f"{field}={value}", check_strategy(job, Strategy(**update))
            except (PlannerInputError, ValueError):
                continue


def _quantities(builder: TableBuilder, job: Job, strategy: Strategy) -> dict:
    """Every cached quantity of the builder for `strategy`."""
    pools = stage_pools_for(job, strategy) if len(job.cluster.pools) > 1 else list(job.cluster.pools)
    m = micro_batches(job, strategy)
    site = builder.site(strategy.pp - 1, (pools[0],))
    out = {
        "groups": builder.groups(strategy, site),
        "block_sums": [builder.block_sums(0, mode, strategy, site) for mode in ("none", "selective", "full")],
        "fixed_sums": builder.fixed_sums(strategy.pp - 1, strategy, site),
        "lower_bound": builder.lower_bound(strategy, pools, m),
        "refined_bound": builder.refined_bound(strategy, pools, m),
        "sum_floor": builder.sum_floor(strategy, pools),
        "stage_sums": builder.stage_sums(0, (2,), 1, strategy, builder.site(0, (pools[0],))),
    }
    tables = build_tables(builder, strategy, m, float("inf"))
    out["tables"] = None if tables is None else [
        {counts: [(o.recompute, o.time, o.dp_end, o.update, o.cost) for o in placed] for counts, placed in per_pool[0].items()}
        for per_pool in tables.options]
    return out


def test_cached_quantities_equal_fresh_ones_for_every_field(job):
    shared = TableBuilder(job, load_catalog())
    checked = []
    for name, strategy in _variants(job):
        cached = _quantities(shared, job, strategy)
        fresh = _quantities(TableBuilder(job, load_catalog()), job, strategy)
        for key in fresh:
            assert cached[key] == fresh[key], f"{name}: {key} came stale from the cache"
        checked.append(name)
    # the variations that are legal on this job: at least one per field family
    assert len(checked) >= 20, checked
