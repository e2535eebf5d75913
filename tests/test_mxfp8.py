"""MXFP8 (OCP MX FP8: E4M3 data, one E8M0 scale per 32 elements) on Blackwell: admitted, priced, refused elsewhere.

Expected values come from the sources constants.yaml cites, worked by hand: the GEMM speedup 1.38 from torchao's
B200 Llama3-8b table (bf16 8,307.5, float8 tensorwise 10,417.0, mxfp8_cublas 9,969.0 tokens/s), the scales from the
MX spec (1 byte per 32 elements, for the rowwise and the columnwise copy: 2/32 byte per weight).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from hardware import load_catalog
from planner.cli import cli
from planner.cost import evaluate
from planner.cost.compute import gemm_rate
from planner.strategy import parse_strategy
from tests.conftest import make_job

ROOT = Path(__file__).resolve().parents[1]


def test_the_speedup_follows_from_torchaos_b200_table():
    # the tensorwise fp8 recipe's GEMMs at 1.5x (fp8_gemm_speedup_cap) put GEMMs at share f of the bf16 step
    bf16, tensorwise, mx = 8307.5, 10417.0, 9969.0
    share = (1 - bf16 / tensorwise) / (1 - 1 / 1.5)
    speedup = share / (bf16 / mx - 1 + share)
    assert speedup == pytest.approx(load_catalog().constant("mxfp8_gemm_speedup"), abs=0.005)


@pytest.mark.parametrize(("cluster", "gpu"), [("gb200-nvl72:2", "gb200"), ("dgx-b200:1", "b200")])
def test_mxfp8_gemms_run_at_the_measured_share_of_the_fp8_peak(cluster, gpu):
    catalog = load_catalog()
    device = catalog.device(gpu)
    flops = 1e12  # a large GEMM: the top of the efficiency curve
    bf16 = gemm_rate(device, make_job("llama3-8b", cluster), flops, catalog)
    mx = gemm_rate(device, make_job("llama3-8b", cluster, precision="mxfp8"), flops, catalog)
    assert bf16 == pytest.approx(device.peak("bf16") * 0.64)  # the B200 curve's top step (torch.mm measured)
    assert mx / bf16 == pytest.approx(1.38)  # below the 2x of the fp8/bf16 peaks


def test_scales_add_two_thirty_seconds_of_a_byte_per_weight():
    strategy = parse_strategy("tp=2,pp=4,sp=on,zero=1")
    fp8, mx = (evaluate(make_job("llama3-70b", "gb200-nvl72:18", batch=576, seq=8192, precision=p), strategy)
               for p in ("fp8", "mxfp8"))
    for a, b in zip(fp8.memory.per_stage, mx.memory.per_stage):
        assert b.buffers_bytes - a.buffers_bytes == pytest.approx(a.params * 2 / 32, rel=1e-9)
        assert (b.weights_bytes, b.activations_bytes) == (a.weights_bytes, a.activations_bytes)
    # a stage holds ~70.6e9 / 8 weights: about half a gigabyte of scales
    assert 0.5e9 < mx.memory.per_stage[1].buffers_bytes - fp8.memory.per_stage[1].buffers_bytes < 0.6e9
    assert mx.step_time_s < evaluate(make_job("llama3-70b", "gb200-nvl72:18", batch=576, seq=8192),
                                     strategy).step_time_s


def test_hopper_is_refused_with_one_line_naming_the_devices_that_run_it():
    result = CliRunner().invoke(cli, ["estimate", "llama3-70b", "dgx-h100:8", "-b", "512", "-s", "8192",
                                      "--precision", "mxfp8", "--strategy", "tp=8,pp=4"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "h100-sxm" in lines[0] and "devices that run it: b200, gb200" in lines[0]
    with pytest.raises(ValidationError, match="block-scaled"):
        make_job("llama3-8b", "dgx-a100-80g:1", precision="mxfp8")


def test_the_acceptance_command_scores_and_compile_writes_the_flags(tmp_path):
    runner = CliRunner()
    estimate = runner.invoke(cli, ["estimate", "llama3-70b", "gb200-nvl72:18", "-b", "576", "-s", "8192",
                                   "--precision", "mxfp8", "--runtime", "megatron", "--strategy",
                                   "tp=2,pp=4,sp=on,zero=1,recompute=selective"])
    assert estimate.exit_code == 0, estimate.output
    out = tmp_path / "plan"
    compiled = runner.invoke(cli, ["compile", "llama3-8b", "gb200-nvl72:2", "-b", "64", "-s", "4096",
                                   "--precision", "mxfp8", "--target", "megatron", "--time-limit", "60",
                                   "-o", str(out)])
    assert compiled.exit_code == 0, compiled.output
    args = (out / "megatron" / "args.txt").read_text()
    assert "--fp8-format e4m3" in args and "--fp8-recipe mxfp8" in args


def _mamf(device: str, dtype: str) -> float:
    with (ROOT / "tests" / "data" / "terms" / "gemm.csv").open() as handle:
        rows = csv.DictReader(line for line in handle if not line.startswith("#"))
        return next(float(r["measured_tflops"]) for r in rows
                    if (r["device"], r["dtype"], r["source_id"]) == (device, dtype, "mamf"))


def test_blackwells_fp8_gain_is_its_measured_fp8_over_bf16_ratio_against_h100s():
    gain = (_mamf("b200", "fp8") / _mamf("b200", "bf16")) / (_mamf("h100-sxm", "fp8") / _mamf("h100-sxm", "bf16"))
    assert load_catalog().device("b200").fp8_gemm_gain == pytest.approx(gain, abs=0.005)


@pytest.mark.parametrize(("cluster", "gpu"), [("dgx-h100:1", "h100-sxm"), ("dgx-b200:1", "b200")])
def test_an_h100_measured_fp8_speedup_scales_by_the_devices_gain(cluster, gpu):
    catalog = load_catalog()
    device = catalog.device(gpu)
    bf16 = gemm_rate(device, make_job("llama3-8b", cluster), 1e12, catalog)
    fp8 = gemm_rate(device, make_job("llama3-8b", cluster, precision="fp8"), 1e12, catalog)
    expected = catalog.constant("fp8_gemm_speedup_cap") * (1.11 if gpu == "b200" else 1.0)
    assert fp8 / bf16 == pytest.approx(expected)
