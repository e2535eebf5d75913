"""Smoke tests of the benchmarks in tests/bench: they import, run and render (no timing assertions)."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from benches import load_bench


@pytest.fixture(scope="module")
def solve_time():
    return load_bench("solve_time")


@pytest.fixture(scope="module")
def published_runs():
    return load_bench("published_runs")


@pytest.fixture(scope="module")
def published_compile():
    return load_bench("published_compile")


def test_solve_time_scenarios_select_and_build(solve_time):
    assert [s.key for s in solve_time.SCENARIOS if s.matches("175b")] == ["b"]
    job = solve_time.SCENARIOS[2].build()
    assert job.model.num_blocks == 1000 and job.runtime.name == "planner"  # the command line's runtime
    assert next(s for s in solve_time.SCENARIOS if s.key == "e").build().runtime.name == "megatron"


def test_solve_time_row_renders(solve_time):
    # a small job of the bench's own kind (its scenarios take seconds each: test_solve_time_scenarios_select_and_build)
    scenario = solve_time.Scenario("x", "llama3-8b/dgx-h100:2", 5.0, solve_time._zoo_job("llama3-8b", "dgx-h100:2",
                                                                                          64, 4096))
    row = solve_time.run_scenario(scenario, repeat=1, time_limit=20)
    assert row.error is None, row.error
    assert row.gpus == 16 and len(row.walls) == 1
    cert = row.result.certificate
    assert cert.status in ("OPTIMAL", "FEASIBLE") and cert.configurations > 0
    assert row.result.estimate.memory.fits
    out = io.StringIO()
    solve_time.print_table([row], out=out)
    text = out.getvalue()
    assert "(x) llama3-8b/dgx-h100:2" in text and cert.status in text
    assert text.rstrip().splitlines()[-1].startswith("all within target: ")
    # a gap target is judged by the certificate's gap, whatever the wall time
    gap_target = solve_time.Row(dataclasses.replace(scenario, target_s=1e-9, max_gap=0.01), walls=row.walls,
                                result=row.result)
    assert gap_target.within_target == (cert.gap <= 0.01)


def test_solve_time_error_is_a_row(solve_time):
    def broken():
        raise ValueError("no such model\nsecond line")

    row = solve_time.run_scenario(solve_time.Scenario("x", "broken", 1.0, broken), repeat=1)
    assert row.error == "ValueError: no such model"
    assert "ERROR ValueError: no such model" in solve_time.format_row(row)
    assert not row.within_target


def test_compiled_plans_match_or_beat_published_strategies(published_runs, published_compile):
    # small rows whose published strategy lies inside the compiler's space
    cases = [c for c in published_runs.load_cases("A") if c.row["id"] in ("63", "11")]
    assert len(cases) == 2
    rows = published_compile.compile_rows(cases, time_limit=60)
    for row in rows:
        assert row.error is None, row.error
        assert row.compiled.memory.fits
        assert row.ratio >= 0.999, (row.case.row["id"], row.ratio, row.result.strategy.spec())
    out = io.StringIO()
    published_compile.print_compile_table(rows, out=out)
    assert out.getvalue().rstrip().splitlines()[-1].startswith("compiled >= published on every row: yes")


def test_compiled_plan_matches_published_mbs6_row(published_runs, published_compile):
    # row 72 publishes mbs=6 (batch 48 over dp 8): the space tries every micro-batch size dividing the batch
    cases = [c for c in published_runs.load_cases("A") if c.row["id"] == "72"]
    (row,) = published_compile.compile_rows(cases, time_limit=60)
    assert row.error is None and row.compiled.memory.fits
    assert row.ratio >= 0.999, (row.ratio, row.result.strategy.spec())


def test_published_runs_every_row_renders_with_runtime_summaries(published_runs):
    results = published_runs.run("all")
    assert {r.case.row["tier"] for r in results} >= {"A", "B"}
    assert all(r.case.job.runtime.name == published_runs.runtime_name(r.case.row) for r in results)
    out = io.StringIO()
    published_runs.print_table(results, out=out)
    text = out.getvalue()
    assert "tokens/s per GPU error by runtime" in text and "peak HBM per GPU error by runtime" in text
    # the interval line counts the rows whose published step time lies inside their estimate's interval
    scored = [r for r in results if r.case.published is not None]
    inside = sum(r.estimate.interval.low_s <= r.estimate.step_time_s * r.estimate.tokens_per_s_per_gpu
                 / r.case.published <= r.estimate.interval.high_s for r in scored)
    assert f"80% prediction interval holds {inside} of {len(scored)} published throughputs" in text
    assert 0 < inside < len(scored)
    summary = text[text.index("tokens/s per GPU error by runtime"):]
    for runtime in {r.case.runtime for r in results if r.error is not None}:
        assert f"\n{runtime} " in summary, runtime
    for label in ("< 200", "> 200"):
        assert f"all{' ' * 20}{label}" in summary, label
    peaks = [r for r in results if r.case.published_peak_gib is not None]
    assert peaks and all(r.memory_error is not None for r in peaks)


def test_published_runs_pipelined_fsdp_row(published_runs):
    # FSDP x TP x PP under torchtitan (Llama 3.1 405B: 126 blocks, not a multiple of pp * vpp = 16)
    base = next(row for row in published_runs.read_rows("all") if row["id"] == "212")
    row = dict(base, id="240", model="Llama 3.1 405B (torchtitan FSDP8 x TP8 x PP8)", layers="126",
               hidden="16384", heads="128", kv_heads="8", ffn="53248", vocab="128256", seq_len="8192",
               global_batch_seqs="64", micro_batch="1", gpu_type="H100 80GB", num_gpus="512", tp="8", pp="8", dp="8",
               seq_parallel="yes", pp_schedule="Interleaved 1F1B", vpp_chunks="2", act_recompute="full",
               runtime="torchtitan")
    case = published_runs.build_case(row)
    s = case.strategy
    assert (s.tp, s.pp, s.dp, s.vpp, s.zero) == (8, 8, 8, 2, 3)
    assert sum(s.split) == 126
    estimate = published_runs.evaluate(case.job, s)
    assert estimate.memory.fits and estimate.tokens_per_s_per_gpu > 0
    assert case.job.runtime.gathering.policy(s.zero, s.pipelined) == "step"


def test_unpublished_optimizer_sharding_takes_the_framework_default(published_runs):
    """A zero_fsdp that states nothing takes the default of the framework that ran the row: the distributed
    optimizer for NeMo / Megatron-Bridge recipes (their Adam factory sets use_distributed_optimizer=True), none
    for Megatron-LM's scripts (--use-distributed-optimizer is off unless passed) and everything else; a stated
    scheme is read as stated."""
    base = next(row for row in published_runs.read_rows("all") if row["id"] == "54")  # a NeMo dgxc H100 row
    nemo = dict(base, zero_fsdp="not stated in the README", model="Llama 3.1 70B (NeMo 24.09 dgxc benchmark)")
    assert published_runs._zero(nemo) == 1
    assert published_runs._zero(dict(nemo, zero_fsdp="")) == 1
    bridge = dict(nemo, model="Llama 3 70B", source="NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md")
    assert published_runs._zero(bridge) == 1
    # 'Nemotron' names a model, not the framework; Megatron-LM's own example keeps its default
    megatron_lm = dict(nemo, model="Nemotron-4 15B (Megatron-LM run)", source="NVIDIA/Megatron-LM examples/x.md")
    assert published_runs.framework(megatron_lm) == "megatron" and published_runs._zero(megatron_lm) == 0
    # stated schemes win, even beside a 'not stated' remark; a stated 'none' stays none under NeMo
    assert published_runs._zero(dict(nemo, zero_fsdp="FSDP (sharding strategy not stated)")) == 3
    assert published_runs._zero(dict(nemo, zero_fsdp="none (torch DDP)")) == 0
    # only Megatron-Core rows: a DeepSpeed row that names NeMo somewhere keeps DeepSpeed's stage-0 default
    deepspeed = dict(nemo, runtime="deepspeed-2021")
    assert published_runs._zero(deepspeed) == 0


def test_recompute_labels_normalise(published_runs, published_compile):
    from planner.strategy import Strategy

    case = next(c for c in published_runs.load_cases("A") if c.row["id"] == "63")  # 32 blocks, pp 1
    label = lambda **kw: published_compile._recompute_label(case.job, Strategy(tp=1, dp=8, **kw))  # noqa: E731
    assert label(recompute="none") == "none"
    assert label(recompute="full") == "full"
    assert label(recompute="full", recompute_layers=(32,)) == "full"
    assert label(recompute="full", recompute_layers=(0,)) == "none"
    assert label(recompute="full", recompute_layers=(16,)) == "full:16"


def test_fit_constants_leave_one_source_out_refits_without_the_source(published_runs):
    # two sources that pull elementwise_traffic_per_saved_byte apart (LambdaLabs' rows to 3.0, llm-foundry's to the
    # bound 4.0, the joint fit between them); one free constant on a 9-point lattice, so the test can brute-force
    # every fit it checks (a candidate: constants.yaml takes its value from Korthikanti's Table 4, not the fit)
    fit_constants = load_bench("fit_constants")
    sources = ["LambdaLabsML/examples", "mosaicml/llm-foundry"]
    cases = fit_constants.load_fit_cases(sources)
    assert {published_runs.source_key(c.row) for c in cases} == set(sources) and len(cases) == 7
    name = "elementwise_traffic_per_saved_byte"
    free = {name: fit_constants.CANDIDATES[name]}
    predictor = fit_constants.Predictor(cases, free, points=5, refine=1, jobs=1)
    v = fit_constants.validate(predictor, "clipped")

    lattice = [(k,) for k in range(predictor.lattice + 1)]
    ratios = dict(zip(lattice, predictor.log_ratios(lattice)))
    yaml_unit = predictor.unit({name: published_runs.load_catalog().constant(name)})[0]

    def brute_force(rows):  # the lattice's optimum on these rows, by the script's own key
        return min(lattice, key=lambda p: fit_constants.objective_key(ratios[p][rows], "clipped",
                                                                      abs(p[0] / predictor.lattice - yaml_unit)))

    everything = list(range(len(cases)))
    assert v.full.point == brute_force(everything)
    values = {}
    for source in sources:
        held = [i for i, s in enumerate(v.sources) if s == source]
        train = [i for i in everything if i not in held]
        fold = v.folds[source]
        assert sorted(fold.rows) == train and fold.point == brute_force(train), source
        # the held-out rows are predicted with the fold's constants, not with the fit on every row
        assert np.allclose(v.loso[held], ratios[fold.point][held])
        values[source] = fold.values[name]
    full = v.full.values[name]
    assert values["mosaicml/llm-foundry"] > full > values["LambdaLabsML/examples"], (values, full)
    assert not np.allclose(v.loso, v.in_sample)
    # constants.yaml's predictions are the ones the bench prints
    bench = [r.error for r in published_runs.evaluate_cases(cases)]
    assert np.allclose(np.expm1(v.current), bench)

    out = io.StringIO()
    for render in (fit_constants.print_grouping, fit_constants.print_rows, fit_constants.print_summary,
                   fit_constants.print_targets):
        render(v, out=out)
    fit_constants.print_constants(v, predictor, out=out)
    fit_constants.print_groups(v, "family", out=out)
    text = out.getvalue()
    assert "LOSO" in text and "mosaicml/llm-foundry" in text and "DP/FSDP" in text


def test_nvlink_domain_bench_prices_the_rack_below_the_trays():
    bench = load_bench("nvlink_domain")
    rows = bench.rows(tuple(s for s in bench.SCENARIOS if "tp8 fsdp" in s.name))
    racks, trays = rows[0], next(r for r in rows if "domain = tray" in r.cluster)
    assert racks.precision == trays.precision == "bf16"
    assert racks.dp_s < trays.dp_s and racks.tp_s < trays.tp_s  # tp=8 spans two trays: NVLink in the rack
    assert "tok/s/GPU" in bench.render(rows)


def test_nemo_rows_keep_the_gradient_buffers_their_script_sets(published_runs):
    """A NeMo or Megatron-Bridge row is costed under megatron-bridge (bf16 gradient buffers and reduction) where the
    script that ran it sets them, read in code: NeMo 2.x performance recipes and Bridge always, DeepSeek-V3's BF16
    runs before NeMo 2.4 not; NeMo 1.x as its yaml's grad_sync_dtype (bf16 in the dgxc yamls read, none in the
    dgxc Nemotron-4 15B yaml and in the 2023 launcher configs).  Other frameworks keep their own profile."""
    base = next(row for row in published_runs.read_rows("all") if row["id"] == "58")  # dgxc Nemotron-4 340B (1.x)
    assert published_runs.gradient_dtype(base) == "bf16" and published_runs.runtime_name(base) == "megatron-bridge"
    assert published_runs.build_case(base).job.runtime.name == "megatron-bridge"
    nemotron15 = dict(base, source="NVIDIA/dgxc-benchmarking nemotron/README_15b.md 'Expected Slurm Performance'")
    assert published_runs.runtime_name(nemotron15) == "megatron"
    deepseek = dict(base, model="DeepSeek-V3 671B (NeMo 25.04 dgxc benchmark, BF16)")
    assert published_runs.gradient_dtype(deepseek) == "fp32"
    assert published_runs.gradient_dtype(dict(deepseek, model="DeepSeek-V3 671B (NeMo 25.07.01 dgxc)")) == "bf16"
    launcher = dict(base, model="GPT-3 5B (NeMo Framework Launcher predefined config)",
                    source="NVIDIA/NeMo-Framework-Launcher README.md (commit f854ec2f)")
    assert published_runs.gradient_dtype(launcher) is None and published_runs.runtime_name(launcher) == "megatron"
    megatron_lm = dict(base, model="Nemotron-4 340B (Megatron-LM run)", source="NVIDIA/Megatron-LM examples/x.md")
    assert published_runs.runtime_name(megatron_lm) == "megatron"
    graphs = dict(base, runtime="megatron-cudagraphs")  # a profile of its own is kept
    assert published_runs.runtime_name(graphs) == "megatron-cudagraphs"


def test_nemo_rows_overlap_tensor_parallel_communication_as_their_recipe_does(published_runs):
    """A NeMo or Megatron-Bridge row with tp > 1 that says nothing of TP overlap takes its recipe's setting (on, but
    for Bridge's Qwen3-235B, NeMo's DeepSeek-V3 before 2.4, NeMo's Llama 3 8B and the launcher's fp8_performance
    yamls); a stated setting wins; other frameworks overlap only where the notes say so."""
    base = next(row for row in published_runs.read_rows("all") if row["id"] == "58")  # dgxc Nemotron-4 340B, tp 8
    assert published_runs.tp_overlap(base, 8) and not published_runs.tp_overlap(base, 1)
    assert published_runs.build_case(base).strategy.tp_overlap
    assert not published_runs.tp_overlap(dict(base, notes="... no TP comm overlap."), 8)
    qwen = dict(base, model="Qwen3-235B-A22B (Megatron-Bridge 26.04.01 perf summary)")
    assert not published_runs.tp_overlap(qwen, 2)
    launcher = dict(base, source="NVIDIA/NeMo docs (arch NeMo-Framework-Launcher gpt3/20b_fp8_performance.yaml)")
    assert not published_runs.tp_overlap(launcher, 4)
    megatron_lm = dict(base, model="Nemotron-4 340B (Megatron-LM run)", source="NVIDIA/Megatron-LM examples/x.md")
    assert not published_runs.tp_overlap(megatron_lm, 8)
    assert published_runs.tp_overlap(dict(megatron_lm, notes="TP comm overlap on"), 8)


def test_a_configuration_that_follows_nemos_performance_scripts_runs_nemos_defaults(published_runs):
    """Megatron-LM's examples/llama FP8 table says its configuration follows NeMo's performance scripts: the
    distributed optimizer, bf16 gradient buffers (megatron-bridge) and no recompute, as its example script sets."""
    data = published_runs.ROOT / "tests" / "data" / "holdout_runs.csv"
    row = next(row for row in published_runs.read_rows("all", data) if row["id"] == "1031")
    assert published_runs.framework(row) == "nemo" and published_runs.runtime_name(row) == "megatron-bridge"
    case = published_runs.build_case(row)
    assert case.strategy.zero == 1 and case.strategy.recompute == "none"
    plain = dict(row, notes="Table row 'LLAMA3-8B | 8 | GBS 128 | ...'")
    assert published_runs.framework(plain) == "megatron" and published_runs.runtime_name(plain) == "megatron"


def test_megatron_lm_rows_run_the_data_parallel_overlap_their_flags_ask_for(published_runs):
    """A Megatron-LM row whose notes quote its launch flags runs Megatron-LM's defaults for what they leave out:
    no --overlap-grad-reduce, dp_overlap off; that flag without --overlap-param-gather, grad.  NeMo rows and rows
    that quote no flags keep the profile's overlap."""
    base = next(row for row in published_runs.read_rows("all", published_runs.ROOT / "tests" / "data" /
                                                        "holdout4_runs.csv") if row["id"] == "4001")
    assert published_runs.dp_overlap(base) == "off" and published_runs.build_case(base).strategy.dp_overlap == "off"
    flags = base["notes"] + " --overlap-grad-reduce"
    assert published_runs.dp_overlap(dict(base, notes=flags)) == "grad"
    assert published_runs.dp_overlap(dict(base, notes=flags + " --overlap-param-gather")) == "on"
    assert published_runs.dp_overlap(dict(base, notes="pretrain_gpt.py with the README's settings")) == "on"
    nemo = dict(base, model="Llama 3 8B (NeMo 25.04 dgxc benchmark)")
    assert published_runs.dp_overlap(nemo) == "on"


def test_rows_run_the_attention_kernel_their_library_or_torchtitan_release_chose(published_runs):
    """A row naming FlashAttention-3 runs flash3 and FlashAttention-4 cuDNN's figures; a torchtitan row dated before
    October 2025 runs PyTorch's flash-first order off Blackwell, later ones and B200 rows cuDNN (the profile)."""
    data = published_runs.ROOT / "tests" / "data" / "published_runs.csv"
    rows = {row["id"]: row for row in published_runs.read_rows("all", data)}
    kernel = lambda row_id: published_runs.build_case(rows[row_id]).job.runtime.kernels.attention_kernel  # noqa: E731
    assert kernel("458") == "flash3" and kernel("459") == "cudnn"  # HF + FA3 on H200, + FA4 on B200
    assert kernel("456") == "flash2"  # torchtitan e7c0cae (June 2025) on H200
    assert kernel("451") == "cudnn"  # torchtitan of August 2025 on B200 (#1196)
    june = rows["456"]
    assert published_runs.attention_kernel(june, "b200", "cudnn") == "cudnn"
    assert published_runs.attention_kernel(june, "h200", "cudnn") == "flash2"
    undated = dict(june, notes="torchtitan v0.2.2, FSDP2", source="a 2026 blog post")
    assert published_runs.attention_kernel(undated, "h200", "cudnn") == "cudnn"
    paper = dict(undated, source="arXiv 2407.21783 Table 4")
    assert published_runs.attention_kernel(paper, "h100-sxm", "cudnn") == "flash2"
    megatron = dict(june, runtime="megatron")
    assert published_runs.attention_kernel(megatron, "h200", "cudnn") == "cudnn"
    flagperf = dict(megatron, notes="README optimizations 'flash attention 2', 'transformer-engine impl'")
    assert published_runs.attention_kernel(flagperf, "h100-sxm", "cudnn") == "flash2"
    triton = dict(megatron, runtime="deepspeed", notes="pretrain_gpt.py ... --use-flash-attn-triton ...")
    assert published_runs.attention_kernel(triton, "a100-40g", "flash2") == "flash_triton"


def test_rows_whose_model_code_has_no_flash_attention_run_without_it(published_runs):
    """HuggingFace's eager GPT-2 (the notes say "eager attention, no flash attention") runs with the scores
    materialised and unfused kernels whatever the runtime profile's own model code has; other rows keep both."""
    data = published_runs.ROOT / "tests" / "data" / "holdout5_runs.csv"
    rows = {row["id"]: row for row in published_runs.read_rows("all", data)}
    assert published_runs.model_kernels(rows["5013"]) == (False, False)
    job = published_runs.build_case(rows["5013"]).job
    assert job.runtime.kernels.flash_attention and not job.flash and not job.fused
    assert published_runs.model_kernels(rows["5009"]) == (False, True)  # Megatron's GPT: fused, no flash
    assert published_runs.model_kernels(rows["5016"]) == (True, True)


def test_a_published_peak_is_compared_with_the_model_counted_as_it_is(published_runs):
    """nvidia-smi's figure is the device's whole use; PyTorch's reserved figure leaves out the CUDA context and NCCL
    (memory_reserve_bytes); an allocated one leaves out the caching allocator's fragmentation too."""
    from hardware import load_catalog

    data = published_runs.ROOT / "tests" / "data"
    rows = {row["id"]: row for path in (data / "published_runs.csv", data / "holdout4_runs.csv")
            for row in published_runs.read_rows("all", path)}
    fixed = load_catalog().constant("memory_reserve_bytes") / 2**30
    kinds = {}
    for row_id in ("201", "431", "4015"):
        (result,) = published_runs.evaluate_cases([published_runs.build_case(rows[row_id])])
        stage = max(result.estimate.memory.per_stage, key=lambda st: st.peak_bytes)
        kinds[result.case.published_peak_kind] = (result, stage)
    assert set(kinds) == set(published_runs.PEAK_KINDS)
    device, reserved, allocated = (kinds[k] for k in published_runs.PEAK_KINDS)
    assert device[0].compared_peak_gib == pytest.approx(device[0].peak_gib)
    assert reserved[0].compared_peak_gib == pytest.approx(reserved[0].peak_gib - fixed)
    assert allocated[0].compared_peak_gib == pytest.approx(allocated[0].peak_gib - allocated[1].reserve_bytes / 2**30)
    assert allocated[1].reserve_bytes / 2**30 > fixed  # the fragmentation share on top of the fixed part


def test_unpublished_recompute_takes_the_framework_default(published_runs):
    """An act_recompute that states nothing takes the framework's default where it has one: NeMo 2.x (a 25.xx
    container, or notes naming a NeMo 2.0 recipe or performance script) and Megatron-Bridge recipes recompute
    nothing (Megatron-Core recompute_granularity None; NeMo's H100 performance configs recompute_layers 0), NeMo
    1.x launcher yamls recompute selectively; the default is kept even where the model says it does not fit, as
    a stated setting is; other frameworks keep the cheapest setting that fits."""
    base = next(row for row in published_runs.read_rows("all") if row["id"] == "58")  # NeMo dgxc Nemotron-4 340B
    assert base["act_recompute"].strip() == "" and published_runs.framework(base) == "nemo"
    assert published_runs._recompute_options(base, 2) == [dict(recompute="selective")]
    assert published_runs.build_case(base).strategy.recompute == "selective"
    nemo2 = dict(base, model="Nemotron-4 340B (NeMo 25.04.00 dgxc benchmark, BF16)")
    assert published_runs._recompute_options(nemo2, 2) == [dict(recompute="none")]
    bridge = dict(base, model="Nemotron-4 340B", source="NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md")
    assert published_runs.unpublished_recompute(bridge) == "none"
    # NeMo 2.x's recipe API ran in a 24.xx container: its recipes set no recompute either (NeMo v2.1.0)
    sft = dict(base, model="Llama 3 8B full SFT (NeMo 24.12 dgxc fine-tuning benchmark)",
               notes="NeMo 2.0 performance fine-tuning script (llama3_finetune.py)")
    assert published_runs.unpublished_recompute(sft) == "none"
    assert published_runs.unpublished_recompute(dict(sft, notes="launcher yaml of NeMo 1.x")) == "selective"
    # 'Nemotron' is a model: the same row run by Megatron-LM's own scripts tries none, selective, full of 1
    # block, full (the first that fits wins)
    megatron_lm = dict(base, model="Nemotron-4 340B (Megatron-LM run)", source="NVIDIA/Megatron-LM examples/x.md")
    assert published_runs.unpublished_recompute(megatron_lm) is None
    options = published_runs._recompute_options(megatron_lm, 2)
    assert [o["recompute"] for o in options] == ["none", "selective", "full", "full"]
    assert options[2]["recompute_layers"] == (1,)
    # a stated setting wins under NeMo 2.0
    assert published_runs._recompute_options(dict(nemo2, act_recompute="full"), 2) == [dict(recompute="full")]


def test_families_bench_groups_rows_by_the_issue_families():
    """tests/bench/families.py: expert groups of ep x etp ranks beyond a node's 8 GPUs are 'across nodes'
    (DeepSeek-V3 row 402: ep 64, ETP=1 -> 64 ranks; Grok-1 row 403: ep 8, ETP=1 -> 8 ranks, one node), and the
    table prints every family with the pooled and per-file columns."""
    families = load_bench("families")
    published = families.RUNS[0]
    results = {r.case.row["id"]: r for r in families.run("all", path=published)}
    assert families._ep_span_nodes(results["402"]) and not families._ep_span_nodes(results["403"])
    named = dict(families.families())
    assert named["EP across nodes"](results["402"]) is not None and named["EP within a node"](results["402"]) is None
    assert named["EP within a node"](results["403"]) is not None
    # a dense BF16 Megatron row is in no EP or FP8 family; its sequence range is its row's seq_len (4096: <=4K)
    assert results["58"].case.row["seq_len"] == "4096"
    assert named["attention seq <=4K"](results["58"]) is not None and named["Megatron FP8"](results["58"]) is None
    out = io.StringIO()
    over = families.print_families({published: list(results.values())}, out=out)
    text = out.getvalue()
    for name, _ in families.families():
        assert name in text
    runtimes = {f"runtime {r.case.runtime}" for r in results.values()}
    assert set(over) <= {name for name, _ in families.families()} | runtimes


def test_size_grouping_places_models_by_decade_of_parameters(published_runs):
    """--groups' 'size' grouping: the decade of a model's total parameters, lower bound inclusive (a 125M GPT in
    '<1B', exactly 1e9 and Llama 3 8B in '1B-10B', Llama 3 70B in '10B-100B', Llama 3.1 405B in '>=100B')."""
    size = published_runs.size_range
    assert [size(p) for p in (125e6, 1e9, 8.03e9, 70.6e9, 1e11, 405e9)] == [
        "<1B", "1B-10B", "1B-10B", "10B-100B", ">=100B", ">=100B"]
    case = published_runs.build_case(published_runs.read_rows("all")[0])  # row 1: GPT 1.7B (SC21 Table 1)
    assert published_runs.GROUPINGS["size"](case) == "1B-10B"


def test_moe_memory_counts_what_torchtitans_moe_saves():
    # torchtitan 0.2.2 models/moe/moe.py, read: per routed token (top_k per token) the experts keep their input
    # (bf16, for w1 and w3), the SiLU input, the SiLU output and w3's output (for their product) and the product
    # (for w2), four expert-width bf16 tensors; the router-score bmm keeps the routed outputs in fp32
    import importlib.metadata

    try:  # the installed distribution: other tests may hold a stand-in `torchtitan` module in this process
        importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchtitan is not installed")
    bench = load_bench("moe_memory")
    layer = bench.moe_layer("tiny-mixtral")
    hidden, ffn, top_k = layer.hidden, layer.moe_shape.expert_ffn, layer.moe_shape.top_k  # 64, 128, 2
    groups = bench.measure_apart("tiny-mixtral", tokens=64, score_before=False)
    assert groups["routed hidden bfloat16"] == top_k * hidden * 2
    assert groups["routed expert ffn bfloat16"] == 4 * top_k * ffn * 2
    assert groups["routed hidden float32"] == top_k * hidden * 4
