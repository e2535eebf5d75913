"""Runtime profiles in the search: every profile loads, the compiler searches only what the profile's framework
can express, and its restricted programs (Megatron's split and recompute count) still certify the optimum that
brute force finds under the same profile."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware import load_cluster
from models.transformer import build_transformer, llama
from planner.cost import evaluate
from planner.cost.layout import split_blocks
from planner.errors import InfeasibleError, PlannerInputError
from planner.profile import RuntimeProfile, _merge, load_runtime, runtime_names
from planner.search.compile import compile_job
from planner.search.exhaustive import exhaustive_optimum
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions, narrow_to_runtime
from planner.strategy import parse_strategy

from conftest import make_job

FRAMEWORKS = ("megatron", "deepspeed", "torchtitan", "planner")
CPU4 = load_cluster("cpu:1")  # 4 "GPUs" of 16 GB
PROPERTY = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _model(layers: int, hidden: int, heads: int = 4, kv_heads: int = 2, vocab: int = 256):
    return build_transformer(llama(name="tiny", num_layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                   ffn=3 * hidden, vocab=vocab))


def _blocks(job, strategy) -> tuple[int, ...]:
    return tuple(len(b) for b in split_blocks(job.model.num_blocks, strategy.pp, strategy.split))


def test_every_profile_loads_with_a_source_for_each_section():
    names = runtime_names()
    assert set(FRAMEWORKS) | {"reference"} <= set(names)
    for name in names:
        profile = load_runtime(name)
        assert isinstance(profile, RuntimeProfile) and profile.name == name
        for section in (profile.gathering, profile.overlap, profile.kernels, profile.space, *profile.states):
            assert section.source.strip(), f"{name}: {type(section).__name__} has no source"
        assert set(profile.overlap.grad_reduce_bytes) == {"bf16", "fp16", "fp8"}


def test_unknown_runtime_is_one_input_error_naming_the_known_ones():
    with pytest.raises(PlannerInputError, match="unknown runtime 'nemo'.*megatron"):
        load_runtime("nemo")


def test_extends_merges_mappings_and_replaces_lists():
    base = {"kernels": {"flash_attention": True, "fused_elementwise": True}, "states": [1, 2]}
    merged = _merge(base, {"kernels": {"flash_attention": False}, "states": [3]})
    assert merged == {"kernels": {"flash_attention": False, "fused_elementwise": True}, "states": [3]}


def test_model_states_per_parameter_follow_each_framework():
    # bytes per parameter of the model states at ZeRO 0 and ZeRO-1 over d = 8, from the frameworks' own
    # accounting: Megatron 18 and 6 + 12/d (theoretical_memory_usage.py), DeepSpeed 4 + 16/d for stage 1
    # (estimate_zero2_model_states_mem_needs), FSDP2 16/d (fp32 shards of weights, gradients, two moments)
    def per_param(name: str, zero: int, d: int = 8) -> float:
        profile = load_runtime(name)
        return sum(profile.state_bytes(kind, 1.0, zero, d) for kind in ("weights", "grads", "optimizer"))

    assert per_param("megatron", 0) == 18 and per_param("megatron", 1) == pytest.approx(6 + 12 / 8)
    assert per_param("deepspeed", 1) == pytest.approx(4 + 16 / 8)
    assert per_param("torchtitan", 1) == pytest.approx(16 / 8) and per_param("torchtitan", 0) == 16
    assert per_param("reference", 0) == 16 and per_param("reference", 3) == pytest.approx(16 / 8)


def test_megatron_profile_refuses_what_megatron_cannot_run():
    megatron = load_runtime("megatron")
    strategy = parse_strategy("tp=2,pp=4,zero=3,schedule=gpipe,recompute=full,recompute_layers=1/2/2/2,"
                              "split=4/2/3/7")
    reasons = megatron.cannot_express(strategy, split_blocks=(4, 2, 3, 7))
    assert any("zero=3" in r for r in reasons)
    assert any("schedule=gpipe" in r for r in reasons)
    assert any("only the first and last" in r for r in reasons)
    assert any("recompute_layers" in r for r in reasons)
    # the first and last stage may differ; middle stages equal
    assert megatron.cannot_express(parse_strategy("pp=4,zero=1,split=3/4/4/5"), split_blocks=(3, 4, 4, 5)) == []
    assert megatron.cannot_express(parse_strategy("cp=2"), flash_attention=False) == [
        "context parallelism without fused attention"]


def test_without_a_split_megatron_runs_its_own_layout():
    # issue #27: 61 blocks (DeepSeek-V3) over pp=8 do not divide; the even default (8,8,8,8,8,7,7,7) is one Megatron
    # cannot run, so a strategy without split= takes Megatron's: equal middle stages, first and last the rest
    from planner.validation import check_strategy

    model = build_transformer(llama(name="m61", num_layers=61, hidden=256, heads=8, kv_heads=8, ffn=512, vocab=1024))
    job = make_job(model, "dgx-h100:8", batch=64, seq=2048).on(load_runtime("megatron"))
    strategy = check_strategy(job, parse_strategy("tp=8,pp=8,zero=1"))
    assert strategy.split == (7, 8, 8, 8, 8, 8, 8, 6)
    assert evaluate(job, parse_strategy("tp=8,pp=8,zero=1")).step_time_s > 0  # costed, not refused
    from planner.cost import refusals

    assert refusals(job, strategy) == []
    # a runtime that runs any split keeps the even one; blocks that divide keep no split at all
    assert check_strategy(job.on(load_runtime("planner")), parse_strategy("tp=8,pp=8,zero=1")).split is None
    assert load_runtime("megatron").space.default_split(64, 8) is None
    # interleaved: the embedding and the loss count as a layer each (63 slots over 16 chunks), planner.chunks
    assert load_runtime("megatron").space.default_split(61, 8, vpp=2) == (7, 8, 8, 8, 8, 8, 8, 6)
    assert load_runtime("planner").space.default_split(61, 8, vpp=2) is None  # torch's looped schedules: refused


def test_deepspeed_profile_has_no_zero_2_or_3_under_its_pipeline_engine():
    deepspeed = load_runtime("deepspeed")
    assert deepspeed.cannot_express(parse_strategy("pp=2,zero=1")) == []
    assert deepspeed.cannot_express(parse_strategy("pp=2,zero=2")) == ["zero=2 with pipeline parallelism"]
    assert deepspeed.cannot_express(parse_strategy("zero=3")) == []


@st.composite
def jobs(draw):
    layers = draw(st.integers(3, 8))
    hidden = draw(st.sampled_from([64, 2048, 4096]))
    model = _model(layers, hidden, vocab=draw(st.sampled_from([256, 32000])))
    return make_job(model, CPU4, draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from([128, 1024, 4096])))


@pytest.mark.parametrize("runtime", FRAMEWORKS)
@PROPERTY
@given(job=jobs())
def test_compile_under_a_profile_returns_only_what_it_can_express(runtime, job):
    job = job.on(load_runtime(runtime))
    try:
        result = compile_job(job, CompileOptions(time_limit=20, space=SpaceOptions(max_mbs=4, max_vpp=2, max_cp=2)))
    except InfeasibleError:
        return  # nothing fits on 4 x 16 GB: nothing to check
    strategy = result.strategy
    assert job.runtime.cannot_express(strategy, flash_attention=job.flash, split_blocks=_blocks(job, strategy)) == []
    estimate = evaluate(job, strategy)
    assert estimate.runtime == runtime and estimate.memory.fits
    assert estimate.step_time_s == pytest.approx(result.estimate.step_time_s, rel=1e-9)


@pytest.mark.parametrize("layers, hidden, batch, seq", [(6, 4096, 8, 16384), (7, 4096, 8, 12288),
                                                       (8, 3072, 16, 16384), (8, 4096, 8, 16384)])
def test_megatron_programs_certify_the_brute_force_optimum(layers, hidden, batch, seq):
    # four-stage pipelines that must recompute (the last one also offloads): the program's "middle stages
    # equal" and "one recompute count" constraints against the oracle, which scores every split and recompute
    # vector and drops the ones Megatron cannot run
    job = make_job(_model(layers, hidden, vocab=32000), CPU4, batch, seq).on(load_runtime("megatron"))
    space = SpaceOptions(max_mbs=2, max_vpp=1, max_cp=1, fixed={"tp": 1, "pp": 4}, offload_search="fallback")
    oracle = exhaustive_optimum(job, space)
    assert oracle is not None and oracle[0].recompute == "full"
    result = compile_job(job, CompileOptions(space=space))
    assert result.certificate.status == "OPTIMAL"
    assert result.estimate.step_time_s == pytest.approx(oracle[1], rel=1e-6)
    blocks = _blocks(job, result.strategy)
    assert len(set(blocks[1:-1])) <= 1
    assert job.runtime.cannot_express(result.strategy, split_blocks=blocks) == []


def test_megatron_space_is_narrower_than_the_reference_one():
    job = make_job(_model(4, 64), CPU4, 8, 128)
    space = narrow_to_runtime(SpaceOptions(), load_runtime("megatron"), job)
    # ZeRO-2/3 as Megatron FSDP, without pipeline parallelism only
    assert space.zero_stages == (0, 1, 2, 3) and space.zero_stages_pipelined == (0, 1)
    assert space.split_shape == "ends" and space.recompute_counts == "uniform"
    assert space.offload_devices == ("cpu",) and space.offloads == ("optimizer",) and not space.stage_placement
    both = narrow_to_runtime(space, load_runtime("deepspeed"), job)  # the intersection of two targets
    assert both.max_tp == 1 and both.max_vpp == 1 and both.zero_stages_pipelined == (0, 1)


def test_torch_pipelining_runtimes_keep_at_least_pp_micro_batches_megatron_need_not():
    # torch.distributed.pipelining's Schedule1F1B raises on fewer micro-batches than stages (the planner and
    # torchtitan runtimes run it); Megatron's 1F1B runs them.  tiny-llama, batch 8 on 4 CPU ranks, pp=2 x dp=2:
    # mbs 4 would leave one micro-batch per replica.
    job = make_job("tiny-llama", "cpu:1", batch=8, seq=128)
    few = parse_strategy("pp=2,dp=2,mbs=4")
    for name, refused in (("planner", True), ("torchtitan", True), ("megatron", False)):
        runtime = load_runtime(name)
        missing = runtime.cannot_express(few, micro_batches=1)
        assert bool(missing) == refused, (name, missing)
        space = narrow_to_runtime(SpaceOptions(fixed={"pp": 2, "dp": 2}), runtime, job.on(runtime))
        result = compile_job(job.on(runtime), CompileOptions(time_limit=20, space=space, runners_up=0))
        micro = job.global_batch // (result.strategy.dp * result.strategy.mbs)
        assert micro >= 2 or not refused
    assert load_runtime("planner").cannot_express(few, micro_batches=1) == [
        "1F1B over 1 micro-batches on 2 stages (needs >= pp)"]


def test_megatron_bridge_is_megatron_with_bf16_gradients():
    # Megatron-Bridge runs megatron-core as Megatron-LM does (same kernels, space, loss, savings), except that its
    # recipes keep and reduce gradients in bf16: every section but the gradient bytes is megatron.yaml's, so
    # megatron-core's TransformerConfig checks of the megatron profile (test_profile_checks.py) cover it too
    bridge, megatron = load_runtime("megatron-bridge"), load_runtime("megatron")
    skip = {"name", "description", "version", "states", "gathering", "overlap"}
    assert bridge.model_dump(exclude=skip) == megatron.model_dump(exclude=skip)
    assert bridge.gathering.model_dump(exclude={"grad_bytes_per_param", "source"}) == \
        megatron.gathering.model_dump(exclude={"grad_bytes_per_param", "source"})
    assert bridge.overlap.model_dump(exclude={"grad_reduce_bytes", "source"}) == \
        megatron.overlap.model_dump(exclude={"grad_reduce_bytes", "source"})
    assert [(t.kind, t.bytes_per_param, t.sharded_from_zero) for t in bridge.states] == [
        ("weights", 2, 3), ("grads", 2, 2), ("optimizer", 4, 1), ("optimizer", 8, 1)]
    assert [(t.kind, t.bytes_per_param, t.sharded_from_zero) for t in megatron.states] == [
        ("weights", 2, 3), ("grads", 4, 2), ("optimizer", 4, 1), ("optimizer", 8, 1)]
    assert (bridge.gathering.grad_bytes_per_param, megatron.gathering.grad_bytes_per_param) == (2, 4)
