"""GEMM throughput by shape and dtype per device against published matmul sweeps.

    python tests/bench/terms/gemm.py [--quick]

Measurements (tests/data/terms/gemm.csv): the Maximum Achievable Matmul FLOPS table of stas00/ml-engineering
(torch.matmul, i.e. cuBLAS / hipBLASLt, BF16 and FP8, the best shape of a brute-force search per device),
DeepGEMM's FP8 table on H800 (the H100 SXM's GPU) by shape, M from 64 to 4096 rows, and BF16 torch.mm at
training shapes: vLLM's GEMM benchmark on B200 and H100, torchao's square sweep on B200.  One M x K by K x N matmul
is 2*M*N*K FLOPs; the measured seconds are those over the published TFLOP/s.

Model: `planner.cost.compute.gemm_rate` (the device's `matmul_efficiency` step at the GEMM's FLOPs, x the dense
peak, x the FP8 speed-up capped at `fp8_gemm_speedup_cap` for FP8 jobs) for a job in the row's precision on one
node of the device, under the reference runtime.  The model sees only the FLOP count, not the shape: rows with
the same FLOPs and different M, N, K get one prediction.  Rows whose catalog value was set from that very
measurement (column fitted_from) only check the transcription.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, run_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_catalog, load_cluster  # noqa: E402
from models.transformer import build_transformer, llama  # noqa: E402
from planner.cost.compute import gemm_rate  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402

NODE = {"a100-80g": "dgx-a100-80g:1", "h100-sxm": "dgx-h100:1", "h200": "hgx-h200:1", "b200": "dgx-b200:1",
        "mi300x": "mi300x-8:1"}
# the job only carries the precision and runtime to gemm_rate; its model is never costed
TINY = build_transformer(llama(name="gemm-bench", num_layers=1, hidden=256, heads=4, ffn=512, vocab=1024))


def model_tflops(row: dict[str, str], flops: float) -> float:
    """The cost model's achieved TFLOP/s for one GEMM of `flops` in the row's precision on its device."""
    cluster = load_cluster(NODE[row["device"]])
    job = Job(model=TINY, cluster=cluster, global_batch=1, seq_len=1024, precision=row["dtype"],
              runtime=load_runtime("reference"))
    catalog = load_catalog()
    return gemm_rate(catalog.node_device(cluster.pools[0].node), job, flops, catalog) / 1e12


def compare(row: dict[str, str]) -> Compared:
    m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
    flops = 2.0 * m * n * k
    measured = float(row["measured_tflops"])
    modelled = model_tflops(row, flops)
    fitted = " (fitted)" if row["fitted_from"] else ""
    config = f"{row['device']} {row['dtype']} {m}x{n}x{k} ({flops / 1e9:.1f} GFLOP){fitted}"
    return Compared(config=config, measured=f"{measured:.0f} TF/s", modelled=f"{modelled:.0f} TF/s",
                    ratio=measured / modelled, source=row["source_id"])


def _gemm_group(row: Compared) -> str:
    """DeepGEMM rows by dtype and M, the others by source and dtype."""
    dtype, shape = row.config.split()[1], row.config.split()[2]
    return f"{row.source} {dtype} M={shape.split('x')[0]}" if row.source == "deepgemm" else f"{row.source} {dtype}"


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "gemm", __doc__, argv, compare,
        "GEMM: measured vs planner.cost.compute.gemm_rate (devices.yaml matmul_efficiency)",
        by="source, dtype and M",
        key=_gemm_group)


if __name__ == "__main__":
    main()
