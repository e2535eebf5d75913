"""The time model's terms (issue #15 item 2): ZeRO-3/FSDP collectives counted per call with the runtime's
prefetch, the backward per kind of work, context-parallel ring steps, FP8 per runtime.  Expected values are
published measurements or inputs of the cluster, never read back from the cost model."""

from __future__ import annotations

import shutil

import pytest

from conftest import make_job
from hardware import load_catalog, load_cluster
from planner.cost import evaluate
from planner.cost.comm import data_parallel_comm
from planner.cost.layout import place_stages, stage_comms
from planner.cost.sums import StageSums
from planner.profile import load_runtime
from planner.strategy import Strategy
from planner.validation import check_strategy
from benches import load_bench





@pytest.fixture(scope="module")
def bench():
    return load_bench("published_runs")


@pytest.fixture(scope="module")
def results(bench):
    return {r.case.row["id"]: r for r in bench.run("all")}


def _with_calls(runtime: str, **update):
    """A runtime profile whose gather calls differ from the built-in one."""
    profile = load_runtime(runtime)
    calls = profile.gathering.calls.model_copy(update=update)
    return profile.model_copy(update={"gathering": profile.gathering.model_copy(update={"calls": calls})})


# ----------------------------------------------------------------------------- ZeRO-3 / FSDP collectives


def test_each_gather_call_pays_its_ring_latency():
    # 384 A100s: a ring all-gather over n ranks crossing nodes pays n - 1 steps of the fabric's latency and one
    # launch per call, so splitting the same bytes into k calls adds (k - 1)(n - 1) latencies, k - 1 launches
    # and nothing else
    cluster = load_cluster("dgx-a100-80g:48")
    job = make_job("gpt3-175b", cluster, batch=384, seq=2048, runtime=load_runtime("reference"))
    strategy = check_strategy(job, Strategy(tp=1, pp=1, dp=384, zero=3, recompute="full"))
    stage = place_stages(job, strategy, load_catalog())[0]
    groups = stage_comms(job, strategy, stage.site)
    params = 1e9
    one, many = (data_parallel_comm(params, params / 10, job, strategy, groups, 1, load_catalog(),
                                    sums=StageSums(params=params, gather_calls=k, reduce_calls=1.0))
                 for k in (1.0, 40.0))
    latency, launch = cluster.fabric.latency, load_catalog().constant("collective_launch_seconds")
    assert many.per_microbatch_forward - one.per_microbatch_forward == pytest.approx(39 * (383 * latency + launch),
                                                                                   rel=1e-9)


def test_a_runtime_without_prefetch_exposes_every_gather():
    job = make_job("llama3-8b", "dgx-h100:4", batch=32, seq=4096)
    strategy = Strategy(dp=32, zero=3, recompute="full")
    prefetched = evaluate(job, strategy, _with_calls("reference", prefetch=1))
    blocking = evaluate(job, strategy, _with_calls("reference", prefetch=0))
    assert prefetched.breakdown.dp_comm_s < 0.2 * prefetched.breakdown.dp_comm_total_s  # mostly hidden
    # every gather on the critical path; only the reduce-scatters still hide beside the backward
    assert blocking.breakdown.dp_comm_s > 0.5 * blocking.breakdown.dp_comm_total_s
    assert blocking.step_time_s > prefetched.step_time_s


def test_list_based_collectives_cost_a_copy_per_rank():
    # ProcessGroupNCCL's list all_gather / reduce_scatter copy one chunk per rank: the host term grows with the
    # group, at collective_per_rank_copy_seconds per rank and call (2 gathers and 1 reduce per layer here)
    per_rank = load_catalog().constant("collective_per_rank_copy_seconds")
    hosts = {}
    for nodes in (16, 64):
        job = make_job("gpt3-175b", f"dgx-a100-80g:{nodes}", batch=8 * nodes, seq=2048,
                       runtime=_with_calls("reference", per_rank_copies=True))
        strategy = check_strategy(job, Strategy(dp=8 * nodes, zero=3, recompute="full"))
        stage = place_stages(job, strategy, load_catalog())[0]
        sums = StageSums(params=1e9, gather_calls=10.0, reduce_calls=10.0)
        dp = data_parallel_comm(1e9, 1e8, job, strategy, stage_comms(job, strategy, stage.site), 1, load_catalog(),
                                sums=sums)
        hosts[nodes] = dp.host
        assert dp.host == pytest.approx((2 * 10 + 10) * 8 * nodes * per_rank)
    assert hosts[64] == pytest.approx(4 * hosts[16])


@pytest.mark.parametrize("row", ["217", "218"])
def test_sc21_zero3_rows_within_30_percent(results, row):
    # arXiv 2104.04473 Table 2: GPT 175B under DeepSpeed ZeRO-3 on 384 and 1,536 A100s, 100.4 and 30.7 tok/s/GPU
    # (predicted 145 for both before the gathers were counted per parameter and left unhidden)
    r = results[row]
    assert abs(r.error) <= 0.30, f"row {row}: {r.error:+.1%}"
    b = r.estimate.breakdown
    assert b.dp_comm_s > 0.5 * b.dp_comm_total_s  # DeepSpeed 0.3.x hides no gather


def test_zero3_scale_slows_the_step(results):
    # the same global batch on 4x the GPUs: published step 81.6 s -> 66.8 s, not 1/4 of it
    small, large = results["217"].estimate, results["218"].estimate
    assert large.step_time_s > 0.5 * small.step_time_s


# ----------------------------------------------------------------------------- backward per kind of work


# Korthikanti et al. 2022 (arXiv 2205.05198) Table 4: one 22B layer (tp 8, micro-batch 4, seq 2048) on A100,
# ms including the tensor-parallel communication: forward / backward without recompute
TABLE4 = {"11": (7.2, 11.8), "12": (7.7, 11.9)}  # row 11: sequence parallel; row 12: without


def _layer_ms(case):
    from planner.cost.comm import layer_comm
    from planner.cost.compute import layer_time

    catalog = load_catalog()
    strategy = check_strategy(case.job, case.strategy)
    stage = place_stages(case.job, strategy, catalog)[0]
    groups = stage_comms(case.job, strategy, stage.site)
    forward = backward = 0.0
    for layer in (layer for layer in stage.layers if layer.block == 0):
        time = layer_time(layer, case.job, strategy, stage.device, catalog, "none")
        tp = layer_comm(layer, case.job, strategy, groups, time, catalog, "none").tp / 2  # one way each
        forward += time.forward + tp
        backward += time.backward + tp
    return forward * 1e3, backward * 1e3


@pytest.mark.parametrize("row", sorted(TABLE4))
def test_korthikanti_layer_times(bench, row):
    case = bench.build_case(next(r for r in bench.read_rows("all") if r["id"] == row))
    forward, backward = _layer_ms(case)
    published_forward, published_backward = TABLE4[row]
    assert forward == pytest.approx(published_forward, rel=0.10)
    # the backward is still over-predicted (the end-to-end rows hold the GEMM ratio at the top of its bounds,
    # docs/benchmarks.md); this pins how far, so a change that widens the gap shows
    assert published_backward < backward < 1.30 * published_backward


def test_backward_is_priced_per_kind_of_work():
    # a GEMM-only layer's backward is backward_gemm_ratio of its forward, the flash core's 2.5x (FlashAttention-2
    # backward FLOPs), so a long sequence (attention-heavy) raises the whole layer's ratio
    from planner.cost.compute import layer_time

    catalog = load_catalog()
    ratios = {}
    for seq in (2048, 32768):
        job = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=seq)
        strategy = check_strategy(job, Strategy(dp=8, recompute="none"))
        stage = place_stages(job, strategy, catalog)[0]
        layer = next(layer for layer in stage.layers if layer.attention is not None)
        time = layer_time(layer, job, strategy, stage.device, catalog, "none")
        ratios[seq] = time.backward / time.forward
        assert time.attention_backward == pytest.approx(2.5 * time.attention_forward)
    assert ratios[32768] > ratios[2048]


# ----------------------------------------------------------------------------- context parallelism


def test_context_parallel_degree_changes_the_step():
    # the case: llama3-70b on 64 H100s gave one step time for cp=4/dp=16 and cp=16/dp=4; a ring of 16
    # spans two nodes and runs 512-token blocks whose sends outlast their attention
    job = make_job("llama3-70b", "dgx-h100:8", batch=128, seq=8192, runtime=load_runtime("megatron"))
    four = evaluate(job, Strategy(tp=1, cp=4, dp=16, zero=1, recompute="full"))
    sixteen = evaluate(job, Strategy(tp=1, cp=16, dp=4, zero=1, recompute="full"))
    assert sixteen.step_time_s > 1.1 * four.step_time_s
    assert sixteen.breakdown.cp_comm_s > four.breakdown.cp_comm_s


def test_short_chunks_expose_the_ring():
    # GPT-3 175B at seq 2048 with cp=4: 512-token chunks, each ring step's K/V send waits behind a short block
    job = make_job("gpt3-175b", "dgx-a100-80g:16", batch=1536, seq=2048, runtime=load_runtime("megatron"))
    estimate = evaluate(job, Strategy(tp=8, pp=4, cp=4, dp=1, zero=1, recompute="full"))
    assert estimate.breakdown.cp_comm_s > 0.0


@pytest.mark.parametrize("row", ["301", "302", "303", "304", "305", "306", "307", "308"])
def test_torchtitan_context_parallel_rows_within_30_percent(results, row):
    # pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Tables 2 and 6: cp 1-8, 8B and 405B
    assert abs(results[row].error) <= 0.30, f"row {row}: {results[row].error:+.1%}"


# ----------------------------------------------------------------------------- FP8 per runtime


def test_fp8_speedup_is_the_runtimes():
    # Transformer Engine (megatron) realises more of FP8's 2x than the constants' default (torchao recipes)
    megatron, torchtitan = load_runtime("megatron"), load_runtime("torchtitan")
    assert megatron.kernels.fp8_gemm_speedup > load_catalog().constant("fp8_gemm_speedup_cap")
    assert torchtitan.kernels.fp8_gemm_speedup is None
    job = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=4096, precision="fp8")
    strategy = Strategy(dp=8, zero=1, recompute="none")
    assert evaluate(job, strategy, megatron).step_time_s < evaluate(job, strategy, torchtitan).step_time_s


@pytest.mark.parametrize("row", ["229", "230"])
def test_nemo_fp8_gpt_rows_within_10_percent(results, row):
    # NVIDIA/NeMo performance summary 24.07, FP8 GPT3-5B / 20B on 64 H100s: 22,521 and 5,851 tok/s/GPU
    assert abs(results[row].error) <= 0.10, f"row {row}: {results[row].error:+.1%}"


# ----------------------------------------------------------------------------- the fit writes constants.yaml


def test_fit_constants_writes_only_value_lines(tmp_path):
    fit_constants = load_bench("fit_constants")
    copy = tmp_path / "constants.yaml"
    shutil.copy(fit_constants.CONSTANTS_YAML, copy)
    before = copy.read_text().splitlines()
    changed = fit_constants.write_constants({"backward_gemm_ratio": 2.1234567, "hbm_efficiency": 0.8}, copy)
    after = copy.read_text().splitlines()
    assert changed == [f"backward_gemm_ratio: {load_catalog().constant('backward_gemm_ratio'):g} -> 2.123"]
    differing = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and differing == [(differing[0][0], "  value: 2.123")]
