"""What Transformer Engine keeps in FP8 runs (docs/benchmarks.md "What Transformer Engine keeps in FP8"): the FP8
weight copies beside 16-bit parameters, none with FP8 parameters (Job.fp8_params), and the GEMM inputs saved as FP8.

Expected values are worked by hand from the byte counts that section quotes from Transformer Engine v2.11: a cached
FP8 copy of each weight holds data and transpose, 2 bytes per parameter (the data only, 1 byte, where the FP8 GEMMs
take any layout: Blackwell); the QKV and fc1 inputs (the norms' outputs) and the fc2 input are kept at 1 byte instead
of 2; the attention projection keeps an FP8 copy of its input beside the core's 16-bit output.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from conftest import make_job
from hardware import load_catalog
from planner.cli import cli
from planner.cost import evaluate
from planner.emit.megatron_check import check_megatron_args
from planner.profile import load_runtime
from planner.strategy import parse_strategy

BENCH = Path(__file__).resolve().parent / "bench"
DATA = Path(__file__).resolve().parent / "data"


def _job(**fields):
    return make_job("llama3-8b", "dgx-h100:1", batch=8, seq=4096, **fields).on(load_runtime("megatron"))


def _stage(job, spec="tp=2,zero=1"):
    return evaluate(job, parse_strategy(spec)).memory.per_stage[0]


def test_fp8_runs_of_16_bit_weights_keep_two_bytes_of_fp8_copies_per_parameter():
    bf16, fp8 = _stage(_job()), _stage(_job(precision="fp8"))
    assert fp8.buffers_bytes - bf16.buffers_bytes == pytest.approx(2.0 * fp8.params, rel=1e-9)
    # FP8 parameters are those copies: no buffers beside them (the distributed optimizer takes them, zero >= 1)
    assert _stage(_job(precision="fp8", fp8_params=True)).buffers_bytes == pytest.approx(bf16.buffers_bytes)
    # Megatron's --fp8-param-gather needs the distributed optimizer: a zero-0 plan keeps 16-bit weights and copies
    zero0 = _stage(_job(precision="fp8", fp8_params=True), "tp=2,zero=0")
    assert zero0.buffers_bytes - _stage(_job(), "tp=2,zero=0").buffers_bytes == pytest.approx(2.0 * zero0.params)


def test_blackwell_keeps_no_transpose_of_per_tensor_fp8_copies():
    # B200's FP8 GEMMs take any operand layout: per-tensor FP8 copies hold the data only (1 byte per parameter);
    # MXFP8 keeps row- and column-wise copies (each scaled along its own blocks): 2 bytes and the block scales
    def stage(precision):
        job = make_job("llama3-8b", "dgx-b200:1", batch=8, seq=4096, precision=precision)
        return _stage(job.on(load_runtime("megatron")))
    bf16, fp8, mxfp8 = stage("bf16"), stage("fp8"), stage("mxfp8")
    assert fp8.buffers_bytes - bf16.buffers_bytes == pytest.approx(1.0 * fp8.params, rel=1e-9)
    scales = load_catalog().constant("mxfp8_scale_bytes_per_param")
    assert mxfp8.buffers_bytes - bf16.buffers_bytes == pytest.approx((2.0 + scales) * mxfp8.params, rel=1e-9)


def test_fp8_runs_keep_the_gemm_inputs_as_fp8():
    # per token and block of llama3-8b at tp 2 with sequence parallelism: the QKV and fc1 inputs lose a byte per
    # element of hidden (2 x 4096, split by SP: / 2), the fc2 input a byte of ffn (14336 / 2), the projection keeps
    # an FP8 copy of the attention output (4096 / 2)
    tokens, blocks = 4096, 32
    per_token = 2 * 4096 / 2 + 14336 / 2 - 4096 / 2
    spec = "tp=2,sp=on,zero=1"
    bf16, fp8 = _stage(_job(), spec), _stage(_job(precision="fp8", fp8_params=True), spec)
    assert bf16.activations_bytes - fp8.activations_bytes == pytest.approx(tokens * blocks * per_token, rel=1e-9)
    # a runtime that keeps 16-bit inputs (torchtitan's torchao float8) saves as in bf16 and caches no copies
    titan = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=4096, precision="fp8").on(load_runtime("torchtitan"))
    plain = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=4096).on(load_runtime("torchtitan"))
    assert _stage(titan, "zero=3").activations_bytes == pytest.approx(_stage(plain, "zero=3").activations_bytes)


def test_fp8_parameters_need_fp8():
    with pytest.raises(ValidationError, match="fp8_params"):
        make_job("llama3-8b", "dgx-h100:1", fp8_params=True)
    result = CliRunner().invoke(cli, ["estimate", "llama3-8b", "dgx-h100:1", "-b", "8", "-s", "4096", "--fp8-params"])
    assert result.exit_code == 2 and "--fp8-params" in result.output and "Traceback" not in result.output


def test_megatron_writes_fp8_param_gather_only_with_its_distributed_optimizer():
    assert check_megatron_args({"fp8-param-gather": True, "use-distributed-optimizer": True}, 8) == []
    assert check_megatron_args({"fp8-param-gather": True}, 8) == [
        "--fp8-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp"]


def test_the_bench_reads_fp8_parameters_where_the_recipe_sets_them():
    sys.path.insert(0, str(BENCH))
    import published_runs as bench
    rows = {r["id"]: r for f in ("holdout6_runs.csv", "holdout7_runs.csv", "holdout_runs.csv")
            for r in csv.DictReader((DATA / f).open())}
    assert bench.fp8_params(rows["6008"])  # MLPerf: FP8_PARAMS=True in config_common.sh
    assert bench.fp8_params(rows["1034"])  # NeMo 2.x's FP8 recipes set fp8_params / fp8_param_gather
    assert not bench.fp8_params(rows["6017"])  # NeMo 1.x's megatron_gpt_pretraining.py on a yaml without it
    assert not bench.fp8_params(rows["1023"])  # a NeMo 1.x row that does not say so
