"""The cost model: accuracy against published runs, memory, validation, structure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware import load_catalog, load_cluster
from models import build_transformer, load_model
from models.transformer import llama
from conftest import make_job  # the shared job factory
from planner.cost import evaluate
from planner.cost.memory import in_flight_microbatches
from planner.errors import PlannerInputError
from planner.job import Job
from planner.profile import runtime_names
from planner.strategy import Strategy, parse_strategy
from benches import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load_bench("published_runs")


@pytest.fixture(scope="module")
def published_results():
    bench = _bench()
    return bench, bench.run("A")


job = make_job  # the shared factory (tests/conftest.py): zoo model and preset names, batch 8 x 4096 by default


# ----------------------------------------------------------------------------- accuracy


def test_published_runs_median_error_within_target(published_results):
    # the in-sample rows (ids < 200), each costed under its runtime profile (the CSV's runtime column); the
    # rows above 200 (added with the profiles, and the context-parallel runs 301-308) are out of sample: the bench
    # prints their errors per runtime
    bench, results = published_results
    in_sample = [r for r in results if not r.case.new]
    median, worst = bench.summary(in_sample)
    assert len(in_sample) >= 25
    assert median <= 0.10, f"median |error| {median:.1%} > 10%"
    assert worst <= 0.25, f"max |error| {worst:.1%} > 25%"


def test_published_peak_memory_median_error_within_target(published_results):
    # issue 15's memory target: predicted vs published peak HBM per GPU, median |error| at most 10%, on every
    # tier-A row that publishes it (63, 66, 201-207, 301-308, and 431-438 and 456-457 added as held-out rows); nothing
    # is fitted to them.  The predicted peak is counted as the published figure is (published_runs.PEAK_KINDS: the
    # reserved figures of torchtitan leave out the ~1 GiB of CUDA context and NCCL outside PyTorch), which moves the
    # under-predicted rows further under.  The worst today: 308 (-18.4%, Llama 3.1 405B at cp=8, whose published
    # peak grows with cp where no modelled term does), 437 (-16.0%) and 436 (-14.3%)
    bench, results = published_results
    rows = [r for r in results if r.memory_error is not None]
    median, worst = bench.memory_summary(rows)
    assert len(rows) >= 25
    assert median <= 0.10, f"peak memory median |error| {median:.1%} > 10%"
    assert worst <= 0.20, f"peak memory max |error| {worst:.1%} > 20%"


def test_every_published_row_names_a_runtime_profile(published_results):
    bench, results = published_results
    rows = bench.read_rows("all")
    assert all(row["runtime"] in runtime_names() for row in rows), sorted({row["runtime"] for row in rows})
    assert {r.case.job.runtime.name for r in results} >= {"megatron", "megatron-2021", "torchtitan",
                                                          "torchtitan-eager", "pytorch-fsdp"}


# Published runs the cost model says do not fit, each with why; the test fails when a row joins or leaves
# the list, so a fix (or a regression) has to update it.
# Row 58 (Nemotron-4 340B, NeMo 1.x dgxc benchmark, tp8 pp8 dp2 vpp12): its act_recompute is unpublished, so the
# bench runs the framework's default (published_runs.unpublished_recompute: the dgxc yaml
# nemotron/nemotron4-340b-synth.yaml sets activations_checkpoint_granularity selective), which the model puts at
# 96.5 GiB of 74.5 on stage 0 (weights 10.8, grads 21.5, optimizer 32.3, activations 25.6, reserve 6.4).  The same
# yaml runs NeMo's distributed_fused_adam with grad_sync_dtype bf16 and dtype bf16 (16-bit gradient buffer and
# optimizer state), which the megatron profile does not model (fp32 gradients, 12 B of Adam state per parameter):
# with them the stage would need about 27 GiB less.  Until a runtime profile models that optimizer, the row is a
# known misfit.  (It fitted before only because the bench fell back to full recompute, 23% slower than published.)
KNOWN_MISFITS: set[str] = {"58"}


def test_every_published_configuration_fits(published_results):
    _, results = published_results
    misfits = {r.case.row["id"]: f"{r.case.runtime}: {r.estimate.memory.peak_bytes / 2**30:.1f} GiB of "
               f"{r.estimate.memory.capacity_bytes / 2**30:.1f}" for r in results if not r.estimate.memory.fits}
    assert set(misfits) == KNOWN_MISFITS, misfits


def test_pure_data_parallel_gpt3_does_not_fit_and_says_why():
    est = evaluate(job("gpt3-175b", "dgx-a100-80g:16", batch=1536, seq=2048), parse_strategy("tp=1,pp=1,zero=0"))
    assert not est.memory.fits
    assert est.memory.peak_bytes > 16 * 175e9  # 16 bytes per parameter of model states alone
    assert "stage 0 (a100-80g) needs" in est.memory.reasons[0]
    assert "over by" in est.memory.reasons[0]


# ----------------------------------------------------------------------------- memory


def test_zero_stages_shrink_model_states_monotonically():
    j = job("llama3-8b", "dgx-h100:2", batch=16, seq=4096)
    states = []
    for zero in range(4):
        stage = evaluate(j, Strategy(zero=zero)).memory.per_stage[0]
        states.append(stage.weights_bytes + stage.grads_bytes + stage.optimizer_bytes)
    assert states == sorted(states, reverse=True) and len(set(states)) == 4
    params = load_model("llama3-8b").params
    dp = 16
    # ZeRO-3: every state sharded over the 16 ranks
    assert states[3] == pytest.approx(params * 16 / dp, rel=1e-9)


def test_fit_checks_use_the_runtime_capacity():
    # an H100 80GB holds 79.11 GiB as CUDA reports it (PyTorch's out-of-memory message), not 80e9 bytes = 74.5 GiB
    j = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:1"), global_batch=8, seq_len=2048,
            memory_margin=0.0)
    stage = evaluate(j, Strategy(tp=8)).memory.per_stage[0]
    assert stage.capacity_bytes == pytest.approx(79.11 * 2**30, rel=1e-4)


def test_full_recompute_trades_memory_for_time():
    j = job("llama3-8b", "dgx-h100:1", batch=8, seq=8192)
    none = evaluate(j, Strategy(zero=3))
    full = evaluate(j, Strategy(zero=3, recompute="full"))
    assert full.memory.per_stage[0].activations_bytes < 0.2 * none.memory.per_stage[0].activations_bytes
    assert full.step_time_s > none.step_time_s
    assert full.breakdown.recompute_s > 0 and none.breakdown.recompute_s == 0


def test_partial_recompute_is_between_none_and_full():
    j = job("llama3-8b", "dgx-h100:1", batch=8, seq=8192)
    acts = [evaluate(j, s).memory.per_stage[0].activations_bytes for s in (
        Strategy(zero=3), Strategy(zero=3, recompute="full", recompute_layers=(16,)),
        Strategy(zero=3, recompute="full"))]
    assert acts[0] > acts[1] > acts[2]


def test_one_f_one_b_in_flight_counts():
    s = Strategy(pp=4, dp=1)
    assert [in_flight_microbatches(s, i, 8) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(Strategy(pp=4, dp=1, schedule="gpipe"), 0, 8) == 8
    inter = Strategy(pp=4, dp=1, vpp=2)
    assert in_flight_microbatches(inter, 0, 8) == pytest.approx(4 + 3 / 2)  # p + (p-1)/v


def test_context_parallel_halves_activations_per_rank():
    j = job("llama3-8b", "dgx-h100:1", batch=8, seq=8192)
    one = evaluate(j, Strategy(tp=2, cp=1, zero=1)).memory.per_stage[0].activations_bytes
    two = evaluate(j, Strategy(tp=2, cp=2, zero=1)).memory.per_stage[0].activations_bytes
    assert two == pytest.approx(one / 2, rel=1e-9)


def test_optimizer_offload_moves_states_to_host():
    j = job("llama3-8b", "dgx-h100:1", batch=8, seq=4096)
    base = evaluate(j, Strategy(zero=2))
    cpu = evaluate(j, Strategy(zero=2, offload="optimizer"))
    nvme = evaluate(j, Strategy(zero=2, offload="optimizer", offload_device="nvme"))
    assert cpu.memory.per_stage[0].optimizer_bytes == 0
    assert cpu.memory.host.dram_bytes > 0 and cpu.breakdown.offload_s > 0
    assert nvme.memory.host.nvme_bytes > 0
    assert cpu.memory.per_stage[0].peak_bytes < base.memory.per_stage[0].peak_bytes


# ----------------------------------------------------------------------------- time


def test_interleaving_shrinks_the_bubble():
    j = job("llama3-70b", "dgx-h100:8", batch=64, seq=4096)
    plain = evaluate(j, Strategy(tp=8, pp=8, zero=1))
    inter = evaluate(j, Strategy(tp=8, pp=8, vpp=5, zero=1))
    assert inter.breakdown.bubble_s == pytest.approx(plain.breakdown.bubble_s / 5, rel=0.05)
    assert inter.breakdown.pp_comm_s > plain.breakdown.pp_comm_s


def test_heterogeneous_cluster_slowest_pool_bounds_the_pipeline():
    j = job("llama3-70b", str(ROOT / "examples/clusters/hetero-3pool.yaml"), batch=256, seq=4096)
    est = evaluate(j, Strategy(tp=8, pp=32, dp=1, zero=1))
    devices = {s.device for s in est.memory.per_stage}
    assert devices == {"a100-80g", "h100-sxm", "l4"}
    slowest = max(est.memory.per_stage, key=lambda s: s.microbatch_time_s)
    assert slowest.device == "l4"


def test_tp_overlap_hides_tensor_parallel_time():
    j = job("llama3-70b", "dgx-h100:4", batch=64, seq=4096)
    off = evaluate(j, Strategy(tp=8, pp=4, zero=1))
    on = evaluate(j, Strategy(tp=8, pp=4, zero=1, tp_overlap=True))
    hidden = load_catalog().constant("tp_overlap_hidden_fraction")
    assert on.breakdown.tp_comm_s == pytest.approx(off.breakdown.tp_comm_s * (1 - hidden), rel=1e-9)


def test_estimate_is_deterministic_and_serialisable():
    j = job("mixtral-8x7b", "dgx-h100:4", batch=64, seq=4096)
    s = parse_strategy("tp=2,pp=2,ep=8,zero=1,recompute=selective")
    a = json.dumps(evaluate(j, s).model_dump(mode="json"), sort_keys=True)
    b = json.dumps(evaluate(j, s).model_dump(mode="json"), sort_keys=True)
    assert a == b
    assert json.loads(a)["breakdown"]["ep_comm_s"] > 0


def test_recsys_model_is_scored_data_parallel():
    est = evaluate(job("dlrm-criteo-kaggle", "dgx-a100-40g:1", batch=65536, seq=1), Strategy())
    assert est.tokens_per_s > 0 and est.memory.fits


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "model, cluster, batch, spec, message",
    [
        ("llama3-8b", "dgx-h100:1", 8, "tp=3,dp=1", "tp(3) * pp(1) * cp(1) * dp(1) = 3 != world_size(8)"),
        ("llama3-8b", "dgx-h100:3", 24, "tp=3", "heads(32) % tp(3) != 0"),
        ("tiny-llama", "dgx-h100:1", 8, "pp=8", "blocks("),
        ("llama3-8b", "dgx-h100:1", 12, "mbs=1", "global batch(12) % (dp(8) * mbs(1)) != 0"),
        ("mixtral-8x7b", "dgx-h100:2", 16, "ep=3,dp=16", "experts(8) % ep(3) != 0"),
        ("llama3-8b", "dgx-h100:1", 8, "ep=2", "the model has no experts"),
        ("llama3-8b", "dgx-h100:1", 8, "tp=2,pp=2,vpp=3", "blocks(32) % (pp(2) * vpp(3))"),
    ],
)
def test_invalid_strategies_name_every_factor(model, cluster, batch, spec, message):
    with pytest.raises(PlannerInputError) as err:
        evaluate(job(model, cluster, batch=batch, seq=2048), parse_strategy(spec))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("foo=1", "unknown key 'foo'"),
        ("tp=two", "tp: expected an integer"),
        ("tp=0", "tp: Input should be greater than 0"),
        ("tp", "expected key=value"),
        ("sp=maybe", "sp: expected on|off"),
        ("recompute=some", "recompute"),
        ("tp=2,tp=4", "given twice"),
        ("offload=params,zero=1", "needs zero=3"),
        ("vpp=2", "vpp > 1 needs pp > 1"),
    ],
)
def test_bad_spec_strings(spec, message):
    with pytest.raises(PlannerInputError) as err:
        parse_strategy(spec)
    assert message in str(err.value)


def test_spec_round_trip():
    s = parse_strategy("tp=4,pp=2,dp=8,mbs=2,vpp=2,zero=1,recompute=full,recompute_layers=2,tp_overlap=on")
    assert parse_strategy(s.spec()) == s.model_copy(update={"sp": True, "schedule": "interleaved"})
    per_stage = parse_strategy("pp=2,recompute=full,recompute_layers=3/0,split=10/6,stage_pools=a/b,dp=2")
    assert per_stage.recompute_layers == (3, 0) and per_stage.split == (10, 6) and per_stage.stage_pools == ("a", "b")
    assert parse_strategy(per_stage.spec()) == per_stage.model_copy(update={"sp": False, "schedule": "1f1b"})


# ----------------------------------------------------------------------------- properties


@settings(max_examples=25, deadline=None)
@given(
    blocks=st.integers(2, 8), heads=st.sampled_from([2, 4, 8]), width=st.sampled_from([32, 64]),
    tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]),
    zero=st.integers(0, 3), recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_random_small_models_give_consistent_estimates(blocks, heads, width, tp, pp, mbs, zero, recompute):
    model = build_transformer(llama(name="rand", num_layers=blocks, hidden=heads * width, heads=heads,
                                    kv_heads=heads, ffn=4 * heads * width, vocab=512))
    j = Job(model=model, cluster=load_cluster("dgx-a100-80g:1"), global_batch=16, seq_len=256)
    est = evaluate(j, Strategy(tp=tp, pp=pp, mbs=mbs, zero=zero, recompute=recompute))
    b = est.breakdown
    assert est.step_time_s >= b.compute_s + b.recompute_s > 0
    assert est.tokens_per_s_per_gpu * est.num_gpus == pytest.approx(est.tokens_per_s)
    assert 0 < est.mfu < 1
    stage_params = sum(s.params for s in est.memory.per_stage) * tp
    assert stage_params >= model.params  # tied heads may be counted twice across stages


# ----------------------------------------------------------------------------- pipeline boundaries


def _boundary_send(hidden: int, seq: int, inter: bool) -> float:
    """One bf16 boundary activation (b=1, no SP) over NVLink or the fabric, priced by the collectives module."""
    from hardware import collectives as coll
    from hardware.collectives import CommGroup

    cluster = load_cluster("dgx-h100:2")
    node = cluster.pools[0].node
    pair = CommGroup(size=2, ranks_per_node=1 if inter else 2, intra=node.intra_link,
                     inter_bandwidth=cluster.inter_node_bandwidth_per_gpu(cluster.pools[0]),
                     inter_latency=cluster.fabric.latency)
    catalog = load_catalog()
    return coll.point_to_point(seq * hidden * 2.0, pair, catalog) * catalog.constant("pp_p2p_exposed_fraction")


def test_stage_boundaries_that_leave_the_node_pay_the_fabric():
    # tp=4 x pp=4 on two 8-GPU nodes: stages 0-1 share node 0, stages 2-3 node 1, so the 1|2 boundary (and the
    # 3|0 wrap a first or last stage is charged for) crosses InfiniBand while 0|1 and 2|3 stay on NVLink: every
    # stage sends once each way
    from planner.cost import stage_cost
    from planner.cost.layout import place_stages
    from planner.validation import check_strategy

    job = make_job("llama3-8b", "dgx-h100:2", batch=16, seq=4096)
    strategy = check_strategy(job, parse_strategy("tp=4,pp=4,sp=off"))
    catalog = load_catalog()
    stages = place_stages(job, strategy, catalog)
    sends = [stage_cost(job, strategy, stage, catalog).pp for stage in stages]
    hidden = job.model.hidden
    mixed = _boundary_send(hidden, 4096, False) + _boundary_send(hidden, 4096, True)
    assert sends == pytest.approx([mixed] * 4, rel=1e-9)
    # on one node (tp=2 x pp=4 = 8 GPUs) no boundary leaves it
    one = make_job("llama3-8b", "dgx-h100:1", batch=16, seq=4096)
    inside = check_strategy(one, parse_strategy("tp=2,pp=4,sp=off"))
    sends = [stage_cost(one, inside, stage, catalog).pp for stage in place_stages(one, inside, catalog)]
    assert sends == pytest.approx([2 * _boundary_send(hidden, 4096, False)] * 4, rel=1e-9)
