"""The search's configuration bounds are lower bounds of `evaluate`, checked against the certificate's oracle.

Branch and bound prunes a configuration (tp, pp, dp, cp, ep, micro-batch, vpp, ZeRO, scope, base recompute)
when its bound is not below the incumbent, so each bound must be at most the step time `evaluate` gives every
strategy of that configuration: any split, any per-stage recompute counts, any placement.  Here
`planner.search.oracle` (which shares nothing with the bounds) spells out every strategy a runtime can run on
small jobs (dense and mixture-of-experts, one and two nodes, margins 0 and 0.1, under the runtimes whose spaces
differ most: planner's, Megatron's, DeepSpeed's and torchtitan's), and every one that fits is scored by `evaluate`
and held against the cheap bound (`lower_bound`) and the memory-aware one (`refined_bound`, with the pipeline
position's micro-batches in flight) of its configuration.
"""

from __future__ import annotations


import pytest

from hardware import Cluster, Pool, load_catalog
from hardware.catalog import NodeSpec
from models import MoEConfig, build_transformer
from models.transformer import llama
from planner.cost import evaluate
from planner.job import Job
from planner.profile import load_runtime
from planner.search.ilp.tables import TableBuilder
from planner.search.oracle import runtime_strategies
from planner.search.space import (SpaceOptions, families_bounded_by_base, families_fit_only_where_base_fits,
                                  global_configs, narrow_to_runtime, placement_variants)
from planner.strategy import Strategy
from planner.validation import check_strategy


def _cluster(preset: str, gpus_per_node: int, nodes: int) -> Cluster:
    node = load_catalog().nodes[preset].model_dump()
    return Cluster(name=f"{preset}-{gpus_per_node}x{nodes}", pools=[
        Pool(name="pool", count=nodes, node=NodeSpec.model_validate({**node, "gpus_per_node": gpus_per_node}))])


def _config_key(strategy: Strategy) -> tuple:
    """What a configuration fixes; a strategy's full recompute of chosen blocks belongs to the base 'none', and one
    of every k-th block to its own family (space.every_kth_ks)."""
    every = strategy.recompute_every
    base = "none" if strategy.recompute == "full" and every is None else strategy.recompute
    return (strategy.tp, strategy.pp, strategy.data_parallel, strategy.cp, strategy.ep, strategy.expert_tp,
            strategy.mbs, strategy.vpp, strategy.pipeline_schedule, strategy.zero, strategy.shard,
            strategy.sequence_parallel, bool(strategy.ep_overlap), bool(strategy.tp_overlap), base, every)


def _job(runtime: str, preset: str, shape: tuple[int, int], moe: bool, seq: int, batch: int, margin: float,
         layers: int) -> Job:
    hidden = 2048
    model = build_transformer(llama(name="small", num_layers=layers, hidden=hidden, heads=4, kv_heads=2,
                                    ffn=3 * hidden, vocab=32000,
                                    moe=MoEConfig(num_experts=4, top_k=2, expert_ffn=hidden) if moe else None))
    return Job(model=model, cluster=_cluster(preset, *shape), global_batch=batch, seq_len=seq,
               runtime=load_runtime(runtime), memory_margin=margin)


def assert_bounds_hold(job: Job) -> int:
    """Every fitting strategy's step time is at least its configuration's bounds; the strategies checked."""
    catalog = load_catalog()
    space = narrow_to_runtime(SpaceOptions(), job.runtime, job)
    configs = {_config_key(c): c for c in global_configs(job, space)}
    builder = TableBuilder(job, catalog)
    bounds: dict[tuple, float] = {}
    checked = 0
    for strategy in runtime_strategies(job):
        key = _config_key(strategy)
        if key not in configs:
            continue  # outside the search's configurations (a dominated schedule or sp setting)
        estimate = evaluate(job, strategy, catalog=catalog)
        if not estimate.memory.fits:
            continue
        if key not in bounds:
            config = configs[key]
            m = job.global_batch // (config.data_parallel * config.mbs)
            pools = list(job.cluster.pools)
            variants = placement_variants(job, config, space, offload=True)
            bounds[key] = max(builder.lower_bound(config, pools, m),
                              builder.refined_bound(config, pools, m, variants=variants,
                                                                   split=space.split_shape))
        assert bounds[key] <= estimate.step_time_s * (1 + 1e-9), (
            f"{job.runtime.name}: bound {bounds[key]!r} s of its configuration above {strategy.spec()} "
            f"at {estimate.step_time_s!r} s")
        checked += 1
    return checked


SHAPES = [("dgx-a100-40g", (2, 2), False, 8192, 8, 0.1, 3), ("pcie-t4", (4, 1), True, 8192, 8, 0.0, 3),
          ("dgx-a100-40g", (4, 1), True, 16384, 4, 0.1, 4)]
# the default run checks each runtime on one job and each job under at least one runtime (the 2-node dense job,
# the MoE job on T4s and the long-sequence MoE job); `-m long` checks every runtime on every job
DEFAULT = {("planner", 2), ("megatron", 0), ("deepspeed", 1), ("torchtitan", 1)}
CASES = [pytest.param(runtime, case, marks=() if (runtime, index) in DEFAULT else pytest.mark.long,
                      id=f"{runtime}-{case[0]}-{'moe' if case[2] else 'dense'}-{case[3]}")
         for runtime in ["planner", "megatron", "deepspeed", "torchtitan"] for index, case in enumerate(SHAPES)]


@pytest.mark.parametrize(("runtime", "case"), CASES)
def test_configuration_bounds_never_exceed_evaluate(runtime, case):
    preset, shape, moe, seq, batch, margin, layers = case
    job = _job(runtime, preset, shape, moe and load_runtime(runtime).space.moe, seq, batch, margin, layers)
    assert assert_bounds_hold(job) > 0  # something fits: the check ran


def assert_family_bounds_hold(job: Job) -> tuple[int, int]:
    """Every fitting every-k-th-block strategy (recompute_every=k) whose configuration's bounds the search lets
    stand for its families' (space.families_bounded_by_base: one kind of block, one chunk per stage) is no
    faster than them; (the strategies checked, those where that bound is above the family's own lower bound)."""
    catalog = load_catalog()
    space = narrow_to_runtime(SpaceOptions(), job.runtime, job)
    configs = {_config_key(c): c for c in global_configs(job, space, families=False)}
    builder = TableBuilder(job, catalog)
    identical = len(builder.segments) == 1
    pools = list(job.cluster.pools)
    bounds: dict[tuple, float] = {}
    checked = tighter = 0
    for strategy in runtime_strategies(job):
        if strategy.recompute_every is None:
            continue
        key = _config_key(strategy.model_copy(update={"recompute": "none", "recompute_every": None}))
        config = configs.get(key)
        if config is None or not families_bounded_by_base(config, identical):
            continue
        estimate = evaluate(job, strategy, catalog=catalog)
        if not estimate.memory.fits:
            continue
        m = job.global_batch // (config.data_parallel * config.mbs)
        if key not in bounds:
            variants = placement_variants(job, config, space, offload=True)
            bounds[key] = max(builder.lower_bound(config, pools, m),
                              builder.refined_bound(config, pools, m, variants=variants, split=space.split_shape))
        assert bounds[key] <= estimate.step_time_s * (1 + 1e-9), (
            f"{job.runtime.name}: bound {bounds[key]!r} s of {config.spec()} above its family's "
            f"{strategy.spec()} at {estimate.step_time_s!r} s")
        family = config.model_copy(update={"recompute": "full", "recompute_every": strategy.recompute_every})
        tighter += bounds[key] > builder.lower_bound(family, pools, m) * (1 + 1e-9)
        checked += 1
    return checked, tighter


@pytest.mark.parametrize("runtime", ["torchtitan", "pytorch-fsdp"])
@pytest.mark.parametrize("case", [SHAPES[0], ("pcie-t4", (2, 1), False, 16384, 4, 0.1, 4)],
                         ids=["a100-2x2-8192", "t4-2-16384"])
def test_a_configuration_bounds_its_every_kth_families(runtime, case):
    """The search prunes a configuration's every-k-th-block families with it, and floors their bounds by its
    (planner.search.branch): so its bounds must be at most every fitting every-k-th strategy's step time, any
    split, any k.  On the T4s at 16,384 tokens memory binds, and the configuration's memory-aware bound is
    above some families' own cheap bounds: there the check bites."""
    preset, shape, moe, seq, batch, margin, layers = case
    job = _job(runtime, preset, shape, moe, seq, batch, margin, layers)
    checked, tighter = assert_family_bounds_hold(job)
    assert checked > 0
    if preset == "pcie-t4":
        assert tighter > 0


def assert_families_fit_only_where_base_fits(job: Job) -> tuple[int, int, int]:
    """Every fitting every-k-th-block strategy's configuration has a finite memory-aware bound (the search closes
    the families of one whose bound is inf, any vpp: space.families_fit_only_where_base_fits); (the strategies
    checked, those interleaved, the configurations with families whose bound is inf)."""
    catalog = load_catalog()
    space = narrow_to_runtime(SpaceOptions(), job.runtime, job)
    builder = TableBuilder(job, catalog)
    assert families_fit_only_where_base_fits(len(builder.segments) == 1)
    pools = list(job.cluster.pools)
    refined: dict[tuple, float] = {}
    for config in global_configs(job, space, families=False):
        if config.recompute == "none" and not config.ep_overlap:
            m = job.global_batch // (config.data_parallel * config.mbs)
            refined[_config_key(config)] = builder.refined_bound(
                config, pools, m, variants=placement_variants(job, config, space, offload=True),
                split=space.split_shape)
    checked = interleaved = 0
    for strategy in runtime_strategies(job):
        if strategy.recompute_every is None:
            continue
        key = _config_key(strategy.model_copy(update={"recompute": "none", "recompute_every": None}))
        if key not in refined or not evaluate(job, strategy, catalog=catalog).memory.fits:
            continue
        assert refined[key] < float("inf"), f"{strategy.spec()} fits, its configuration's bound is inf"
        checked += 1
        interleaved += strategy.vpp > 1
    return checked, interleaved, sum(bound == float("inf") for bound in refined.values())


def test_a_configuration_that_fits_nowhere_closes_its_every_kth_families():
    """Two T4s, 8 blocks of a 2,048-wide model at 16,384 tokens: interleaved every-k-th strategies fit, and
    some configurations fit nowhere (their memory-aware bound is inf): none of the fitting families is
    theirs."""
    job = _job("torchtitan", "pcie-t4", (2, 1), False, 16384, 4, 0.1, 8)
    checked, interleaved, nowhere = assert_families_fit_only_where_base_fits(job)
    assert interleaved > 0 and nowhere > 0


def test_an_interleaved_stage_shorter_than_its_chunks_does_not_close_the_configuration():
    """pp=2 with vpp=4 chunks over 8 blocks: a stage holds 4 blocks, a block a chunk.  The position profile of
    the memory-aware bound also costs stages of 1-3 blocks, which have a chunk of no block and so cannot
    recompute: at 16,384 tokens on a T4 they do not fit, and the profile used to stop there and bound the
    configuration at inf, though every block recomputed fits (found by the every-k-th check above)."""
    job = _job("torchtitan", "pcie-t4", (2, 1), False, 16384, 4, 0.1, 8)
    plan = check_strategy(job, Strategy(pp=2, vpp=4, mbs=1, zero=0, recompute="full"))
    estimate = evaluate(job, plan)
    assert estimate.memory.fits  # 9.2 and 10.4 GB of the T4's 14.3 GB usable, by evaluate
    config = plan.model_copy(update={"recompute": "none"})
    space = narrow_to_runtime(SpaceOptions(), job.runtime, job)
    bound = TableBuilder(job, load_catalog()).refined_bound(
        config, list(job.cluster.pools), 4, variants=placement_variants(job, config, space, offload=True))
    assert bound <= estimate.step_time_s * (1 + 1e-9)
    assert assert_bounds_hold(job) > 0
