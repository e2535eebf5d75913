"""compile_job against the exhaustive oracle (docs/design.md principle 2), and the certificate's promises.

Every comparison runs real CP-SAT solves on instances small enough for
`planner.search.exhaustive.exhaustive_optimum` to score every candidate of the same
space with `evaluate`.  The property tests are derandomized so that a
failure is reproducible; defects found here stay as regression tests that name
the cause (they start passing, and so fail, once the cause is fixed).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware import Cluster, Pool, load_catalog, load_cluster
from hardware.catalog import NodeSpec
from models import MoEConfig, build_transformer, load_model
from models.transformer import llama
from conftest import make_job  # the shared job factory
from planner.cost import evaluate
from planner.errors import InfeasibleError
from planner.search.exhaustive import exhaustive_groups, _candidates, _count, _placements, exhaustive_optimum
from planner.job import Job
from planner.search.compile import compile_job
from planner.search.result import CompileOptions, CompileResult
from planner.search.space import SpaceOptions, global_configs, placement_variants
from planner.strategy import Strategy

# the compiler's own space with offload only where nothing fits: its per-stage placements stay few enough for the
# exhaustive enumeration (tests/test_certificate_oracle.py checks the default, offload in every program)
SMALL = dict(max_mbs=4, max_vpp=2, max_cp=2, offload_search="fallback")
# 12 drawn jobs per property in the default run; the `long` twins below draw 60 (README: -m long)
PROPERTY = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _model(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, **extra):
    return build_transformer(llama(name="tiny", num_layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                   ffn=ffn, vocab=vocab, **extra))


def _cluster(name: str, *pools: tuple[str, str, int]) -> Cluster:
    """A one-node-per-pool cluster: (pool name, node preset, GPUs per node)."""
    catalog = load_catalog()
    built = [Pool(name=pool, count=1, node=NodeSpec.model_validate(
        {**catalog.nodes[preset].model_dump(), "gpus_per_node": gpus})) for pool, preset, gpus in pools]
    return Cluster(name=name, pools=built)


CPU4 = load_cluster("cpu:1")  # 4 "GPUs" of 16 GB
CPU2 = _cluster("cpu-2", ("cpu", "cpu", 2))
SLOW_FAST = _cluster("slow-fast", ("slow", "pcie-l4", 2), ("fast", "dgx-a100-80g", 2))
FAST_SLOW = _cluster("fast-slow", ("fast", "dgx-a100-80g", 2), ("slow", "pcie-l4", 2))


_job = make_job  # the shared factory (tests/conftest.py)


def _check_pools(job: Job, strategy: Strategy) -> None:
    """stage_pools names every stage's pool, and no pool holds more stages than its GPUs allow."""
    assert strategy.stage_pools is not None and len(strategy.stage_pools) == strategy.pp
    ranks = strategy.tp * strategy.cp * strategy.dp
    for pool in job.cluster.pools:
        assert strategy.stage_pools.count(pool.name) * ranks <= pool.gpus
    assert set(strategy.stage_pools) <= {pool.name for pool in job.cluster.pools}


def assert_matches_oracle(job: Job, space: SpaceOptions) -> tuple[CompileResult, Strategy | None] | None:
    """compile_job certifies the exhaustive optimum (on a mixed cluster: the better of single-strategy
    plans and replica groups); returns (result, the oracle's single-strategy optimum), None if nothing fits."""
    groups = exhaustive_groups(job, space) if len(job.cluster.pools) > 1 and space.replica_groups else None
    # as the compiler: offload only where nothing fits without it, replica groups included
    oracle = exhaustive_optimum(job, space, offload_fallback=groups is None)
    found = [value for value in (oracle and oracle[1], groups and groups[1]) if value is not None]
    if not found:
        with pytest.raises(InfeasibleError):
            compile_job(job, CompileOptions(space=space))
        return None
    best_time = min(found)
    result = compile_job(job, CompileOptions(space=space))
    cert = result.certificate
    if result.groups is not None:
        step, fits, spec = result.groups.step_time_s, result.groups.fits, "replica groups"
    else:
        step, fits, spec = (result.estimate.step_time_s, evaluate(job, result.strategy).memory.fits,
                            result.strategy.spec())
    assert cert.status == "OPTIMAL"
    assert step == pytest.approx(best_time, rel=1e-6), f"compile {spec} ({step!r} s) != exhaustive ({best_time!r} s)"
    assert fits
    assert abs(cert.objective - step) / step <= 0.005
    assert 0.0 <= cert.gap <= 1e-9 and cert.bound <= cert.objective
    if len(job.cluster.pools) > 1 and result.groups is None:
        _check_pools(job, result.strategy)
    return result, oracle[0] if oracle else None


# ----------------------------------------------------------------------------- compile == exhaustive


@st.composite
def tiny_jobs(draw) -> tuple[Job, SpaceOptions]:
    heads = draw(st.sampled_from([2, 4]))
    hidden = heads * draw(st.sampled_from([16, 32]))
    model = _model(layers=draw(st.integers(2, 6)), hidden=hidden, heads=heads,
                   kv_heads=draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])),
                   ffn=hidden * draw(st.integers(2, 4)), vocab=draw(st.integers(64, 512)))
    job = _job(model, draw(st.sampled_from([CPU4, CPU2])), draw(st.sampled_from([4, 8, 16])),
               draw(st.sampled_from([64, 128, 256])))
    # one or two ZeRO stages per example keeps the oracle fast; the examples cover all four
    zero = draw(st.sampled_from([(0,), (1,), (2,), (3,), (0, 3)]))
    return job, SpaceOptions(**SMALL, zero_stages=zero)


@PROPERTY
@given(tiny_jobs())
def test_compile_matches_exhaustive_on_tiny_models(case):
    assert_matches_oracle(*case)


@pytest.mark.long
@settings(PROPERTY, max_examples=60)
@given(tiny_jobs())
def test_compile_matches_exhaustive_on_many_tiny_models(case):
    assert_matches_oracle(*case)


@st.composite
def pressured_jobs(draw) -> tuple[Job, SpaceOptions]:
    """Models of 0.1-2 B parameters and long sequences on 16 GB devices, pipelined: memory decides."""
    pp = draw(st.sampled_from([2, 4]))
    hidden = draw(st.sampled_from([1024, 2048, 4096]))
    model = _model(layers=draw(st.integers(pp, 6 if pp == 2 else 5)), hidden=hidden, heads=16,
                   kv_heads=draw(st.sampled_from([2, 16])), ffn=hidden * draw(st.integers(2, 4)),
                   vocab=draw(st.sampled_from([32000, 64000])))
    job = _job(model, CPU4, draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from([4096, 8192, 16384])))
    return job, SpaceOptions(**SMALL, zero_stages=(0, 1), fixed={"tp": 1, "cp": 1, "pp": pp})


@PROPERTY
@given(pressured_jobs())
def test_compile_matches_exhaustive_under_memory_pressure(case):
    assert_matches_oracle(*case)


@pytest.mark.long
@settings(PROPERTY, max_examples=60)
@given(pressured_jobs())
def test_compile_matches_exhaustive_under_memory_pressure_on_many_jobs(case):
    assert_matches_oracle(*case)


PRESSURE = SpaceOptions(**SMALL, zero_stages=(0, 1), fixed={"tp": 1, "cp": 1, "pp": 2})


def test_pressure_optimum_recomputes_some_blocks_on_an_uneven_split():
    # 1.6 B parameters, 16k tokens, two stages of 2 GPUs on 16 GB: stage 0 keeps two micro-batches in flight
    job = _job(_model(3, 4096, 16, 2, 12288, 64000), CPU4, batch=16, seq=16384)
    result, best = assert_matches_oracle(job, PRESSURE)
    for strategy in (best, result.strategy):
        assert strategy.recompute == "full" and strategy.recompute_layers is not None
        assert 0 < sum(strategy.recompute_layers) < sum(strategy.split)  # some blocks, not all
        assert len(set(strategy.split)) > 1


def test_pressure_optimum_interleaves_with_recompute():
    # 18,432 tokens: at 16,384 the measured 1.06 GB reserve (#28, 2 GB before) leaves room to keep every block
    job = _job(_model(4, 4096, 16, 2, 16384, 32000), CPU4, batch=4, seq=18432)
    result, best = assert_matches_oracle(job, PRESSURE)
    assert best.vpp == 2 and best.recompute_layers is not None and result.strategy.recompute_layers is not None


def test_uneven_split_balances_the_head():
    # a 128k vocabulary makes the last stage heavy: the optimum gives it fewer blocks
    job = _job(_model(4, 2048, 16, 2, 8192, 128000), CPU4, batch=8, seq=4096)
    result, best = assert_matches_oracle(job, PRESSURE)
    assert best.split[0] > best.split[-1] and result.strategy.split[0] > result.strategy.split[-1]


# ----------------------------------------------------------------------------- mixed clusters


def test_mixed_cluster_tiny_model_matches_exhaustive(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(
        "pools:\n"
        "  - {name: fast, preset: dgx-a100-80g, nodes: 1, overrides: {gpus_per_node: 2}}\n"
        "  - {name: slow, preset: pcie-l4, nodes: 1, overrides: {gpus_per_node: 2}}\n")
    job = _job(_model(3, 64, 4, 2, 192, 256), load_cluster(str(path)), batch=8, seq=128)
    result, best = assert_matches_oracle(job, SpaceOptions(**SMALL, zero_stages=(0, 1)))
    assert result.estimate.memory.fits


MIXED_PRESSURE = SpaceOptions(**SMALL, zero_stages=(0, 1), fixed={"tp": 1, "cp": 1, "pp": 2})


def test_mixed_cluster_puts_stages_on_both_pools():
    job = _job(_model(4, 2048, 16, 2, 8192, 32000), SLOW_FAST, batch=16, seq=8192)
    result, best = assert_matches_oracle(job, MIXED_PRESSURE)
    assert set(best.stage_pools) == {"slow", "fast"} and set(result.strategy.stage_pools) == {"slow", "fast"}


def test_mixed_cluster_optimum_does_not_depend_on_pool_order_in_the_file():
    # the optimum puts the embedding stage on the slow pool and the head stage on the fast one; a
    # pool-order constraint that follows the file order would cut it off here (fast is listed first)
    job = _job(_model(4, 2048, 16, 2, 8192, 32000), FAST_SLOW, batch=16, seq=8192)
    result, best = assert_matches_oracle(job, MIXED_PRESSURE)
    assert best.stage_pools == ("slow", "fast")


# stage 0 holds the most micro-batches in flight and the last stage the head, so both ends want the
# big fast GPUs: fast/slow/slow/fast beats every placement that keeps each pool's stages together
def test_mixed_cluster_optimum_may_put_one_pool_at_both_ends():
    job = _job(_model(4, 2048, 16, 2, 4096, 64000), FAST_SLOW, batch=16, seq=2048)
    assert_matches_oracle(job, SpaceOptions(**SMALL, zero_stages=(0,), fixed={"tp": 1, "cp": 1, "pp": 4, "dp": 1}))


def test_mixed_cluster_where_only_one_pool_can_hold_a_stage():
    # tp*cp*dp = 4 GPUs fit only `fast`: the plan must still name its pool (4 of the 6 GPUs are used)
    cluster = _cluster("small-first", ("slow", "pcie-t4", 2), ("fast", "dgx-a100-80g", 4))
    job = _job(_model(3, 256, 4, 2, 768, 512), cluster, batch=8, seq=256)
    assert_matches_oracle(job, SpaceOptions(**SMALL, zero_stages=(0, 1)))


# ----------------------------------------------------------------------------- other objectives and tiers


def test_cost_objective_matches_exhaustive():
    job = _job(_model(4, 64, 4, 2, 192, 256), CPU4, batch=8, seq=128)
    space = SpaceOptions(**SMALL)
    best, best_cost = exhaustive_optimum(job, space, objective="cost")
    result = compile_job(job, CompileOptions(space=space, objective="cost"))
    assert result.certificate.objective == pytest.approx(best_cost, rel=1e-6), best.spec()


def test_offloaded_plan_fits_host_memory():
    # offloading the optimizer to host DRAM needs 94.5 GB per node (54.4 GB usable): the optimum uses NVMe
    job = _job(_model(6, 4096, 16, 16, 11008, 32000), CPU4, batch=4, seq=1024)
    result, best = assert_matches_oracle(job, SpaceOptions(max_mbs=1, max_vpp=1, max_cp=1, zero_stages=(0,),
                                                           fixed={"tp": 1, "cp": 1, "pp": 1}))
    assert best.offload_device == "nvme" and result.estimate.memory.host.fits


def test_objective_agrees_with_evaluation_for_segmented_models_with_interleaving():
    # dense blocks then MoE blocks, vpp=2: the recomputed blocks are the first of each chunk
    model = _model(8, 2048, 16, 16, 8192, 32000,
                   moe=MoEConfig(num_experts=4, top_k=2, expert_ffn=2048, first_dense_layers=2))
    # without offload, which would otherwise spare the recomputation this test is about
    space = SpaceOptions(max_mbs=1, max_vpp=2, max_cp=1, zero_stages=(1,), offload_search="fallback",
                         fixed={"tp": 1, "cp": 1, "pp": 2, "vpp": 2, "ep": 1})
    result, best = assert_matches_oracle(_job(model, CPU4, batch=8, seq=16384), space)
    assert best.recompute_layers is not None


# ----------------------------------------------------------------------------- certificate, determinism, errors


def test_compile_is_deterministic():
    job = _job(_model(4, 2048, 16, 2, 8192, 32000), SLOW_FAST, batch=16, seq=8192)
    options = CompileOptions(space=MIXED_PRESSURE)
    runs = [compile_job(job, options) for _ in range(3)]
    # wall_s is the search's measured wall time: everything else must be identical
    dumps = {r.model_dump_json(exclude={"certificate": {"wall_s"}}) for r in runs}
    assert len(dumps) == 1
    assert len({r.strategy.spec() for r in runs}) == 1


def test_time_limit_returns_a_certified_plan():
    job = _job(load_model("llama3-70b"), load_cluster("dgx-h100:16"), batch=512, seq=4096)
    result = compile_job(job, CompileOptions(time_limit=0.5))
    cert = result.certificate
    assert cert.status in ("OPTIMAL", "FEASIBLE")
    assert 0.0 <= cert.gap <= 1.0 and cert.bound <= cert.objective
    assert cert.gap == pytest.approx((cert.objective - cert.bound) / cert.objective)
    assert (cert.status == "OPTIMAL") == (cert.gap <= 1e-9)
    assert cert.stopped == "time_limit" or cert.wall_s <= 0.5  # no timed assertion: it ended, or says it stopped
    assert result.estimate.memory.fits
    assert abs(cert.objective - result.estimate.step_time_s) / result.estimate.step_time_s <= 0.005


def test_infeasible_job_names_what_does_not_fit():
    job = _job(load_model("gpt3-175b"), CPU4, batch=8, seq=2048)
    with pytest.raises(InfeasibleError) as err:
        compile_job(job)
    message = str(err.value)
    assert "gpt3-175b" in message and "cpu:1" in message
    assert "HBM" in message and "GB" in message


# ----------------------------------------------------------------------------- the oracle itself


def test_oracle_counts_what_it_enumerates():
    # the counting guards the oracle's limit before anything is scored: it must equal the listing, on one and two
    # pools, with and without offload, per stage and uniform; one configuration of each shape up to two stages
    # (deeper ones repeat the same product over more stages, at hundreds of thousands of candidates each)
    tiny = _model(5, 64, 4, 2, 192, 256)
    space = SpaceOptions(**SMALL)
    for job in (_job(tiny, CPU4, 8, 128), _job(tiny, SLOW_FAST, 8, 128)):
        shapes = {(c.pp, c.vpp, c.zero, c.recompute, c.dp, c.tp): c for c in global_configs(job, space) if c.pp <= 2}
        for config in shapes.values():
            for offload, uniform in ((False, False), (True, False), (True, True)):
                variants = placement_variants(job, config, space.model_copy(update={"offload_ratios": (0.5,)}),
                                              offload)
                placements = _placements(config, variants, uniform)
                candidates = list(_candidates(job, config, placements))
                assert len(candidates) == _count(job, config, len(placements))
                assert len({c.spec() for c in candidates}) == len(candidates)


def test_placement_variants_of_the_offload_pass():
    job = _job(_model(4, 64, 4, 2, 192, 256), CPU4, 8, 128)
    space = SpaceOptions(**SMALL)
    for config in global_configs(job, space):
        plain = placement_variants(job, config, space, offload=False)
        assert plain == ({},)  # one node: no FCDP, and no offload outside the offload pass
        variants = placement_variants(job, config, space.model_copy(update={"offload_ratios": (0.5,)}), True)
        offloads = {(v.get("offload"), v.get("offload_device"), v.get("offload_ratio")) for v in variants}
        expected = {(None, None, None), ("optimizer", "cpu", None), ("optimizer", "nvme", None)}
        if config.zero == 3:
            expected |= {("all", "cpu", None), ("all", "nvme", None), ("optimizer", "cpu", 0.5)}
        assert offloads == expected and len(variants) == len(expected)


def test_oracle_refuses_spaces_over_its_limit():
    job = _job(_model(4, 64, 4, 2, 192, 256), CPU4, 8, 128)
    with pytest.raises(ValueError, match="limit=10"):
        exhaustive_optimum(job, SpaceOptions(**SMALL), limit=10)
    big = _job(load_model("llama3-70b"), load_cluster("dgx-h100:16"), 512, 4096)
    with pytest.raises(ValueError, match="candidates"):
        exhaustive_optimum(big)


# ----------------------------------------------------------------------------- FCDP (regather=host)

CPU_2NODES = load_cluster("cpu:2")  # 2 nodes x 4 processes behind a 10 GbE NIC: a slow fabric


@st.composite
def two_node_zero3_jobs(draw) -> tuple[Job, SpaceOptions]:
    heads = draw(st.sampled_from([2, 4]))
    hidden = heads * draw(st.sampled_from([32, 64]))
    model = _model(layers=draw(st.integers(2, 4)), hidden=hidden, heads=heads, kv_heads=heads,
                   ffn=hidden * 4, vocab=draw(st.sampled_from([256, 4096])))
    job = _job(model, CPU_2NODES, draw(st.sampled_from([16, 32])), draw(st.sampled_from([64, 256])))
    return job, SpaceOptions(**SMALL, zero_stages=(3,), fixed={"tp": 1, "cp": 1, "pp": 1})


@settings(PROPERTY, max_examples=10)
@given(two_node_zero3_jobs())
def test_compile_matches_exhaustive_with_the_host_parameter_cache(case):
    job, space = case
    # FCDP is in the space, as a per-stage choice
    assert any({"regather": "host"} in placement_variants(job, c, space, False) for c in global_configs(job, space))
    assert_matches_oracle(job, space)


def test_host_cache_wins_with_many_micro_batches_on_a_slow_fabric():
    model = _model(layers=4, hidden=256, heads=4, kv_heads=4, ffn=1024, vocab=4096)
    job = _job(model, CPU_2NODES, 64, 256)
    # sharding over both nodes (HSDP, which keeps gathers inside a node, is left out here)
    space = SpaceOptions(**SMALL, zero_stages=(3,), shard_scopes=("full",), fixed={"tp": 1, "cp": 1, "pp": 1, "mbs": 1})
    result, oracle = assert_matches_oracle(job, space)
    assert result.strategy.regather == "host" and oracle.regather == "host"


# ----------------------------------------------------------------------------- per-stage placement

OFFLOAD_FIXED = {"tp": 1, "cp": 1, "pp": 2, "mbs": 1, "vpp": 1, "zero": 3}


@st.composite
def offload_jobs(draw) -> tuple[Job, SpaceOptions]:
    """Two-stage ZeRO-3 jobs on 4 x 16 GB that need offload on some stage (the offload pass)."""
    hidden = draw(st.sampled_from([6144, 8192]))
    model = _model(layers=4, hidden=hidden, heads=32, kv_heads=8, ffn=3 * hidden,
                   vocab=draw(st.sampled_from([32000, 128000])))
    job = _job(model, CPU4, draw(st.sampled_from([8, 32])), draw(st.sampled_from([1024, 4096])))
    space = SpaceOptions(**SMALL, offload_ratios=draw(st.sampled_from([(), (0.5,)])),
                         stage_placement=draw(st.booleans()), fixed=OFFLOAD_FIXED)
    return job, space


@settings(PROPERTY, max_examples=6)
@given(offload_jobs())
def test_compile_matches_exhaustive_with_per_stage_placement(case):
    job, space = case
    found = assert_matches_oracle(job, space)
    assert found is not None
    result, _ = found
    if not space.stage_placement:
        assert not result.strategy.per_stage_placement  # one placement for every stage


def test_stages_take_different_placements_where_they_hold_different_state():
    # stage 0 holds the embedding and two micro-batches in flight: it needs its weights off the GPU too,
    # stage 1 only its optimizer states
    model = _model(layers=4, hidden=6144, heads=32, kv_heads=8, ffn=3 * 6144, vocab=128000)
    job = _job(model, CPU4, 32, 4096)
    space = SpaceOptions(**SMALL, offload_ratios=(), fixed=OFFLOAD_FIXED)
    result, oracle = assert_matches_oracle(job, space)
    placements = [result.strategy.stage_placement(s) for s in range(2)]
    assert placements[0]["offload"] == "all" and placements[1]["offload"] in ("none", "optimizer")
    uniform = compile_job(job, CompileOptions(space=space.model_copy(update={"stage_placement": False})))
    assert not uniform.strategy.per_stage_placement
    assert result.certificate.objective <= uniform.certificate.objective * (1 + 1e-9)


@pytest.mark.parametrize("layers, batch", [(4, 8), (6, 16)])
def test_compile_matches_exhaustive_on_even_splits(layers, batch):
    # the uniform-pp baseline's space: pp divides the blocks and every stage holds blocks / pp
    job = _job(_model(layers, 64, 4, 2, 192, 256), CPU4, batch, 128)
    space = SpaceOptions(**SMALL, split_shape="even")
    result, _ = assert_matches_oracle(job, space)
    s = result.strategy
    assert layers % s.pp == 0 and (s.split is None or set(s.split) == {layers // s.pp})
