"""The per-term checks of tests/bench/terms (issue #28 item 1): every script runs on its first rows against the
real cost model, every measurement row names its source and quotes its figure, and the conversions from a
published rate to seconds agree with the sources' own numbers."""

from __future__ import annotations

import importlib.util
import io
import math
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path
from types import ModuleType

import pytest

TERMS = Path(__file__).resolve().parent / "bench" / "terms"
DATA = Path(__file__).resolve().parent / "data" / "terms"
SCRIPTS = sorted(p.stem for p in TERMS.glob("*.py") if p.stem != "terms_common")
# a source must let a reader find the text: a repository file at a commit, a URL, or a paper's arXiv id
LOCATOR = re.compile(r"@ [0-9a-f]{40}|https?://|\b[\w-]+(\.[\w-]+)+/\S|arXiv \d{4}\.\d{4,5}")


def load_script(name: str) -> ModuleType:
    """tests/bench/terms/NAME.py as module terms_NAME (once per process)."""
    module_name = f"terms_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, TERMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def common() -> ModuleType:
    return load_script("terms_common")


def test_every_data_file_has_its_script_and_back():
    assert SCRIPTS, "no terms scripts found"
    assert sorted(p.stem for p in DATA.glob("*.csv")) == SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_on_its_first_rows(name, common):
    out = io.StringIO()
    with redirect_stdout(out):
        compared = load_script(name).main(["--quick"])
    assert compared, f"{name}: no rows compared"
    assert len({c.config for c in compared}) == len(compared), f"{name}: two rows print the same configuration"
    for row in compared:
        assert math.isfinite(row.ratio) and row.ratio > 0, (name, row)
    text = out.getvalue()
    assert any(line.startswith("summary: ") for line in text.splitlines()), text
    assert all(row.config in text for row in compared)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_row_names_its_source_and_quotes_its_figure(name, common):
    rows = common.load_rows(name)  # raises on an empty source or notes cell
    assert rows
    for number, row in enumerate(rows, start=1):
        assert LOCATOR.search(row["source"]), f"{name}.csv data row {number}: source has no commit, URL or arXiv id"
        assert row["source_id"].strip(), f"{name}.csv data row {number}: no source_id"


def test_a_row_without_a_source_is_refused_naming_file_row_and_column(common, tmp_path):
    (tmp_path / "bad.csv").write_text("# a comment\nvalue,source,notes\n1,somewhere @ " + "0" * 40 + ",'1'\n"
                                      "2,,'2'\n")
    with pytest.raises(ValueError, match=r"bad\.csv: data row 2: column 'source' is empty"):
        common.load_rows("bad", data=tmp_path)


def test_attention_flops_follow_the_flash_attention_benchmark_convention():
    attention = load_script("attention")
    # flash-attention benchmarks/benchmark_flash_attention.py flops(): 4*batch*seqlen^2*nheads*headdim, halved when
    # causal, x3.5 for fwd+bwd; batch 8, seqlen 2048, 16 heads of 128: 4*8*2048^2*16*128 = 2^38, /2, x3.5
    row = {"seq_len": "2048", "batch": "8", "heads": "16", "head_dim": "128", "causal": "true",
           "direction": "fwd_bwd"}
    assert attention.source_flops(row) == 2**37 * 3.5
    assert attention.source_flops({**row, "causal": "false", "direction": "fwd"}) == 2**38


def test_bus_bandwidth_converts_to_the_time_nccl_tests_printed():
    collectives = load_script("collectives")
    # the A100 nccl-tests run prints both columns for its 16 GiB row: time 127997 us, busbw 234.89 GB/s (8 ranks)
    row = {"unit": "busbw_GBps", "measured": "234.89", "payload_bytes": str(16 * 2**30), "collective": "all_reduce"}
    assert collectives.measured_seconds(row, ranks=8) == pytest.approx(127997e-6, rel=1e-3)
    as_time = {**row, "unit": "us", "measured": "127997"}
    assert collectives.measured_seconds(as_time, ranks=8) == pytest.approx(0.127997)


def test_grouped_gemm_table_is_what_the_benchmarks_imply(common):
    # hardware/data/grouped_gemm.yaml is the bench's --implied output; the cost model applies it to the routed
    # experts of the runtime whose kernel was measured, on that chip, in bf16 only
    from hardware import load_catalog, load_cluster
    from planner.cost.compute import grouped_gemm_efficiency
    from planner.cost.kernel_tables import load_kernel_table
    from planner.job import Job
    from planner.profile import load_runtime

    bench = load_script("grouped_gemm")
    table = load_kernel_table("grouped_gemm").relative_efficiency
    assert bench.implied(common.load_rows("grouped_gemm")) == {k: d for k, d in table.items() if d}
    catalog = load_catalog()

    def efficiency(node: str, runtime: str, precision: str = "bf16") -> float:
        cluster = load_cluster(node)
        job = Job(model=bench.TINY, cluster=cluster, global_batch=1, seq_len=1024, precision=precision,
                  runtime=load_runtime(runtime))
        return grouped_gemm_efficiency(catalog.node_device(cluster.pools[0].node), job)

    measured = table["torch_grouped_mm"]["b200"]
    assert 0.0 < measured < 1.0
    assert efficiency("dgx-b200:1", "torchtitan") == measured
    assert efficiency("gb200-nvl72:1", "torchtitan") == measured  # the B200's chip
    assert efficiency("dgx-h100:1", "torchtitan") == 1.0  # unmeasured there: the GEMM curve
    assert efficiency("dgx-b200:1", "megatron") == 1.0  # another kernel
    assert efficiency("dgx-b200:1", "torchtitan", "mxfp8") == 1.0  # the scaled grouped GEMMs, unmeasured


def test_attention_kernels_table_is_what_the_benchmarks_imply(common):
    # hardware/data/attention.yaml is the bench's --implied output: each measured kernel and device's relative
    # efficiency, at which the model's median time over that kernel's rows is the measured one
    from planner.cost.attention import load_attention_kernels

    attention = load_script("attention")
    implied = attention.implied(common.load_rows("attention"))
    table = load_attention_kernels().relative_efficiency
    assert implied == {kernel: devices for kernel, devices in table.items() if devices}
    # a kernel with power-of-two tiles runs a 96-wide head as a 128-wide one; the others run it as it is
    from hardware import load_catalog as _catalog
    from planner.cost.attention import attention_efficiency
    triton = table["flash_triton"]["a100-80g"]
    assert attention_efficiency("a100-80g", "flash_triton", _catalog(), 96) == pytest.approx(0.75 * triton)
    assert attention_efficiency("a100-80g", "flash_triton", _catalog(), 64) == triton
    assert attention_efficiency("a100-80g", "flash2", _catalog(), 96) == table["flash2"]["a100-80g"]
    # causal attention costs about half the unmasked core at length (the kernels skip the masked blocks)
    from hardware import load_catalog
    from planner.cost.compute import causal_time_ratio
    assert 0.5 < causal_time_ratio(131072, load_catalog()) < 0.56 < causal_time_ratio(512, load_catalog()) < 0.9


def test_asynctp_share_is_what_torchtitans_benchmark_implies(common):
    # torchtitan.yaml's overlap.tp_hidden is the bench's --implied median over the vanilla/async pairs; the solved
    # share reproduces each pair's measured speed-up (the async step is linear in it)
    from planner.profile import load_runtime
    bench = load_script("async_tp")
    rows = common.load_rows("async_tp")
    assert load_runtime("torchtitan").overlap.tp_hidden == bench.implied(rows)
    row = rows[0]
    pair = bench.pair(row)
    hidden = bench.implied_hidden(row)
    modelled = bench.step_seconds(pair.vanilla) / bench.step_seconds(pair.asynchronous, hidden)
    assert modelled == pytest.approx(bench.measured_speedup(row), rel=1e-6)
