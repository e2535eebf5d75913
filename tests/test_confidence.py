"""The extrapolation flag: estimates say which terms lean on a regime no validated published run covers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from conftest import make_job
from planner.cli import cli
from planner.cost import evaluate
from planner.cost.confidence import Coverage, assess, load_coverage
from planner.profile import load_runtime
from planner.strategy import parse_strategy

BENCH = Path(__file__).resolve().parent / "bench"


def test_validated_yaml_is_what_the_bench_gives():
    # hardware/data/validated.yaml is generated from the published runs, never edited by hand
    sys.path.insert(0, str(BENCH))
    import coverage

    assert coverage.render(coverage.coverage(coverage.bench.run("A"))) == coverage.PATH.read_text(), \
        "hardware/data/validated.yaml is stale: run python tests/bench/coverage.py"


def test_a_published_regime_is_validated_and_each_step_outside_it_is_named():
    c = load_coverage()
    # GPT 70B on 768 H100s under Megatron-Core (row 24 of the published runs): inside
    job = make_job("llama3-70b", "dgx-h100:96", batch=1536, seq=2048).on(load_runtime("megatron"))
    inside = evaluate(job, parse_strategy("tp=8,pp=2,zero=1"))
    assert inside.confidence.extrapolated is False and inside.confidence.reasons == []
    # context parallelism beyond the validated degree, a runtime and a device nothing validates
    wide = evaluate(job, parse_strategy(f"tp=8,pp=2,cp={2 * c.max_cp},zero=1"))
    assert wide.confidence.extrapolated and len(wide.confidence.reasons) == 1
    assert wide.confidence.reasons[0].startswith(f"context parallelism cp={2 * c.max_cp}: validated runs reach "
                                                 f"cp={c.max_cp}")
    tiny = evaluate(make_job("tiny-llama", "cpu:1", batch=8, seq=128).on(load_runtime("planner")), parse_strategy(""))
    # the planner runtime's measured gap (the live peak's transients), that nothing validates it, and the device
    gaps = load_runtime("planner").known_gaps
    assert [r.split(":")[0] for r in tiny.confidence.reasons] == ["runtime planner"] * (len(gaps) + 1) + ["device cpu"]
    assert tiny.confidence.reasons[:len(gaps)] == [f"runtime planner: {gap.summary}" for gap in gaps]
    assert tiny.confidence.details[:len(gaps)] == [gap.detail for gap in gaps]
    assert any("the live peak is not a sum of parts" in d for d in tiny.confidence.details)
    # the short lines stay short (issue #28 item 5): the measurement behind each is in its detail
    assert all(len(r) <= 100 for r in tiny.confidence.reasons + wide.confidence.reasons)


def test_zero3_beyond_the_validated_sharding_group_and_moe_are_flagged():
    coverage = Coverage(tolerance=0.3, rows=[1], runtimes={"reference": [1]}, devices={"h100-sxm": [1]},
                        precisions={"bf16": [1]}, max_gpus=1024, max_cp=2, min_cp_tokens=2048, max_ep=1, moe=False,
                        max_zero3_group=64)
    job = make_job("llama3-8b", "dgx-h100:16", batch=256, seq=4096)
    assert assess(job, parse_strategy("zero=3,dp=64,pp=2"), ["h100-sxm"], coverage).reasons == []
    big = assess(job, parse_strategy("zero=3,dp=128"), ["h100-sxm"], coverage)
    assert big.extrapolated and big.reasons[0].startswith("ZeRO-3/FSDP over 128 ranks")
    moe = make_job("mixtral-8x7b", "dgx-h100:16", batch=256, seq=4096)
    assert any(r.startswith("mixture of experts (ep=8)") for r in
               assess(moe, parse_strategy("ep=8,dp=128,zero=1"), ["h100-sxm"], coverage).reasons)


def test_context_parallelism_on_chunks_shorter_than_any_validated_run_is_flagged():
    # GPT-3 175B at 2,048 tokens on cp=4 (the 512-token chunks): cp=4 is within the validated degrees, but
    # every validated context-parallel run holds thousands of tokens per rank
    c = load_coverage()
    assert c.max_cp >= 4 and c.min_cp_tokens > 512
    job = make_job("gpt3-175b", "dgx-a100-80g:16", batch=1536, seq=2048).on(load_runtime("megatron"))
    short = evaluate(job, parse_strategy("tp=2,pp=16,cp=4,zero=1"))
    assert short.confidence.reasons == [f"context parallelism cp=4 at 512 tokens per rank: validated runs hold "
                                        f">= {c.min_cp_tokens}"]
    assert short.confidence.details == ["ring-step latency and small-chunk attention are unvalidated there"]
    long = make_job("llama3-70b", "dgx-h100:8", batch=64, seq=4 * c.min_cp_tokens).on(load_runtime("megatron"))
    assert evaluate(long, parse_strategy("tp=2,pp=8,cp=4,zero=1")).confidence.reasons == []


def test_estimate_json_and_compile_report_carry_the_flag(tmp_path):
    runner = CliRunner()
    args = ["tiny-llama", "cpu:1", "--batch", "8", "--seq-len", "128"]
    data = json.loads(runner.invoke(cli, ["estimate", *args, "--json"]).output)
    assert data["confidence"]["extrapolated"] is True and data["confidence"]["reasons"][0].startswith("runtime planner")
    assert any("no published run validates it" in r for r in data["confidence"]["reasons"])
    out = tmp_path / "out"
    result = runner.invoke(cli, ["compile", *args, "--work-limit", "10", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "confidence   extrapolated (details: report.md, --json):\n             - runtime planner" in result.output
    assert max(len(line) for line in result.output.splitlines() if line.startswith("             - ")) <= 100
    plan = json.loads((out / "plan.json").read_text())
    assert plan["confidence"]["reasons"] == data["confidence"]["reasons"]
    report = (out / "report.md").read_text()
    assert "## Confidence" in report and load_runtime("planner").known_gaps[0].detail in report
