"""The table builder's caches never return a stale entry: change each Strategy field in turn, and
every cached quantity equals the same quantity computed by a fresh builder.

`TableBuilder` caches layer sums, communicator shapes, bounds, slot profiles and stage sums by keys
read off planner/fields.py (what each computation reads).  A field missing from a key would make two
configurations share an entry they should not; here one builder serves a base configuration and then
every variation (so each lookup may hit an entry of an earlier one), and a fresh builder recomputes
each variation from scratch.  Every field of Strategy is varied at least once, on a job where the
variation is legal (a dense model, an MoE model, a cluster of two pools for dp and stage_pools), under
the planner runtime (whose activations read the ZeRO stage) and the reference runtime.
"""

from __future__ import annotations

import pytest

from hardware import Cluster, Pool, load_catalog, load_cluster
from hardware.catalog import NodeSpec
from models import load_model
from planner.cost import micro_batches
from planner.job import Job
from planner.profile import load_runtime
from planner.search.ilp.build import build_tables, stage_pools_for
from planner.search.ilp.tables import TableBuilder
from planner.strategy import Strategy
from planner.validation import check_strategy

DENSE = {"tp": 2, "pp": 2, "mbs": 1, "zero": 1}
MOE = {"tp": 2, "pp": 2, "vpp": 2, "ep": 2, "zero": 1}
MIXED = {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "stage_pools": ("a100", "h100")}
ZERO3 = {"zero": 3}
# (job, base, the field varied, its value, what else the value needs to be legal)
CASES = [
    ("dense", DENSE, "tp", 1, {}), ("dense", DENSE, "tp", 4, {}), ("dense", DENSE, "pp", 1, {}),
    ("dense", DENSE, "pp", 4, {}), ("dense", DENSE, "cp", 2, {}), ("dense", DENSE, "mbs", 2, {}),
    ("dense", DENSE, "vpp", 2, {}), ("dense", DENSE, "sp", False, {}), ("dense", DENSE, "zero", 0, {}),
    ("dense", DENSE, "zero", 2, {}), ("dense", DENSE, "zero", 3, {}), ("dense", DENSE, "shard", "node", {}),
    ("dense", DENSE, "recompute", "selective", {}), ("dense", DENSE, "recompute", "full", {}),
    ("dense", DENSE, "recompute_layers", (1, 2), {"recompute": "full"}),
    ("dense", DENSE, "recompute_every", 2, {"recompute": "full"}),
    ("dense", DENSE, "regather", "host", ZERO3), ("dense", DENSE, "offload", "optimizer", {}),
    ("dense", DENSE, "offload", "all", ZERO3),
    ("dense", DENSE, "offload_device", "nvme", {"offload": "optimizer"}),
    ("dense", DENSE, "offload_ratio", 0.5, {**ZERO3, "offload": "optimizer"}),
    ("dense", DENSE, "schedule", "gpipe", {}), ("dense", DENSE, "schedule", "interleaved", {"vpp": 2}),
    ("dense", DENSE, "tp_overlap", True, {}), ("dense", DENSE, "split", (12, 20), {}),
    ("dense", DENSE, "dp_overlap", "off", {}), ("dense", DENSE, "dp_overlap", "grad", {}),
    ("dense", DENSE, "stage_offload", ("optimizer", "none"), {}),
    ("dense", DENSE, "stage_offload_device", ("nvme", "cpu"), {"offload": "optimizer"}),
    ("dense", DENSE, "stage_offload_ratio", (0.5, 1.0), {**ZERO3, "offload": "optimizer"}),
    ("dense", DENSE, "stage_regather", ("host", "network"), ZERO3),
    ("moe", MOE, "ep", 4, {}), ("moe", MOE, "etp", 1, {}), ("moe", MOE, "ep_overlap", True, {}),
    ("moe", MOE, "dispatcher", "deepep", {}),
    ("mixed", MIXED, "dp", 4, {}), ("mixed", MIXED, "stage_pools", ("h100", "a100"), {}),
]


def _mixed_cluster() -> Cluster:
    catalog = load_catalog()
    return Cluster(name="a100-h100", pools=[
        Pool(name=name, count=1, node=NodeSpec.model_validate(catalog.nodes[preset].model_dump()))
        for name, preset in (("a100", "dgx-a100-80g"), ("h100", "dgx-h100"))])


def _jobs(runtime: str) -> dict[str, Job]:
    profile = load_runtime(runtime)
    return {"dense": Job(model=load_model("llama2-7b"), cluster=load_cluster("dgx-h100:2"), global_batch=64,
                         seq_len=2048, runtime=profile),
            "moe": Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100:2"), global_batch=64,
                       seq_len=2048, runtime=profile),
            "mixed": Job(model=load_model("llama2-7b"), cluster=_mixed_cluster(), global_batch=64, seq_len=2048,
                         runtime=profile)}


def _quantities(builder: TableBuilder, job: Job, strategy: Strategy) -> dict:
    """Every cached quantity of the builder for `strategy`."""
    pools = stage_pools_for(job, strategy) if len(job.cluster.pools) > 1 else list(job.cluster.pools)
    m = micro_batches(job, strategy)
    site = builder.site(strategy.pp - 1, (pools[0],))
    out = {
        "groups": builder.comms(strategy, site),
        "block_sums": [builder.block_sums(0, mode, strategy, site) for mode in ("none", "selective", "full")],
        "fixed_sums": builder.fixed_sums(strategy.pp == 1, True, strategy, site),
        "lower_bound": builder.lower_bound(strategy, pools, m),
        "refined_bound": builder.refined_bound(strategy, pools, m),
        "sum_floor": builder.sum_floor(strategy, pools),
        "stage_sums": builder.stage_sums(0, (2,), 1, strategy, builder.site(0, (pools[0],))),
    }
    tables = build_tables(builder, strategy, m, float("inf"))
    out["tables"] = None if tables is None else [
        {counts: [(o.recompute, o.time, o.dp_end, o.update, o.cost) for o in placed]
         for counts, placed in per_pool[0].items()}
        for per_pool in tables.options]
    return out


def test_every_strategy_field_is_varied():
    # a case per Strategy field, each setting a value its base (with what the variation needs) does not have:
    # a case that re-states a default would vary nothing and serve a stale table unnoticed
    assert {field for _, _, field, _, _ in CASES} == set(Strategy.model_fields)
    jobs = _jobs("reference")
    for name, base, field, value, needs in CASES:
        unvaried = check_strategy(jobs[name], Strategy(**{**base, **needs}))
        assert getattr(unvaried, field) != value, (field, value)


@pytest.mark.parametrize("runtime", ["planner", "reference"])
def test_cached_quantities_equal_fresh_ones_for_every_field(runtime):
    jobs = _jobs(runtime)
    shared = {name: TableBuilder(job, load_catalog()) for name, job in jobs.items()}
    for name, base, field, value, needs in CASES:
        job = jobs[name]
        # every variation is legal on its job: an illegal one fails here instead of being skipped
        varied = check_strategy(job, Strategy(**{**base, **needs, field: value}))
        assert getattr(varied, field) == value, f"{field}={value}: folded into another spelling"
        for strategy in (check_strategy(job, Strategy(**base)), varied):
            cached = _quantities(shared[name], job, strategy)
            fresh = _quantities(TableBuilder(job, load_catalog()), job, strategy)
            for key in fresh:
                assert cached[key] == fresh[key], f"{field}={value} ({runtime}): {key} came stale from the cache"


def test_every_recompute_count_is_what_the_cost_model_composes():
    """Tables that tie the stages' recompute counts (Megatron's --recompute-num-layers) hold every count; their
    times are interpolated from two compositions (a stage's time is affine in its recomputed blocks): each must
    be the composed cost's, to the nanosecond, and fit."""
    from planner.search.ilp.tables import NS
    from planner.search.space import SpaceOptions, global_configs, narrow_to_runtime, placement_variants

    job = Job(model=load_model("llama2-7b"), cluster=load_cluster("dgx-h100:2"), global_batch=64, seq_len=8192,
              runtime=load_runtime("megatron"), memory_margin=0.1)
    space = narrow_to_runtime(SpaceOptions(), job.runtime, job)
    builder = TableBuilder(job, load_catalog())
    checked = 0
    for config in [c for c in global_configs(job, space) if c.pp in (2, 4) and c.mbs == 1 and c.tp <= 2][:6]:
        tables = build_tables(builder, config, micro_batches(job, config), float("inf"),
                              placement_variants(job, config, space, offload=True), every_recompute=True)
        for per_pool in tables.options:
            for placed in per_pool[0].values():
                for option in placed:
                    assert option.time == round(option.cost.microbatch * NS) and option.cost.memory.fits
                    checked += 1
    assert checked > 500  # interpolated counts among them: many per content
