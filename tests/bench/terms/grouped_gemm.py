"""The routed experts' grouped GEMMs against the kernels' published microbenchmarks, forward and backward.

    python tests/bench/terms/grouped_gemm.py [--quick]
    python tests/bench/terms/grouped_gemm.py --implied   # the relative efficiency per kernel and device the rows
                                                         # imply (hardware/data/grouped_gemm.yaml holds them)

Measurements (tests/data/terms/grouped_gemm.csv): torch._grouped_mm in bf16 on a B200, forward and backward of one
grouped GEMM of 128,000 tokens split over 1 to 8 experts, Llama 4 Scout (5,120 x 8,192) and DeepSeek-V3 (7,168 x
2,048) expert shapes, from torchao's MoE training README.  The timed region also runs an MSE loss over the M x N
bf16 output and its backward (benchmarks/utils.py bench_fwd_bwd_microseconds), compiled into one fused kernel that
reads the output and the labels and writes the gradient: 6 bytes per output element at the model's HBM rate
(hbm_bandwidth x hbm_efficiency) are added to the model's seconds so that both sides time the same work.

Model: the forward of one group's GEMM, 2 x (M / G) x N x K FLOPs, at `planner.cost.compute.gemm_rate` times
`grouped_gemm_efficiency` (the runtime's grouped-GEMM kernel on that device: torchtitan's torch._grouped_mm), all
G groups, and the backward at `backward_gemm_ratio` times the forward, as `backward_seconds` costs a layer's GEMMs.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, run_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_catalog, load_cluster  # noqa: E402
from models.transformer import build_transformer, llama  # noqa: E402
from planner.cost.compute import gemm_rate, grouped_gemm_efficiency  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402

KERNELS = {"torch._grouped_mm": ("torch_grouped_mm", "torchtitan")}  # grouped_gemm.yaml's name, a runtime running it
NODE = {"b200": "dgx-b200:1"}
LOSS_BYTES_PER_ELEMENT = 6.0  # the fused MSE loss and its backward: read the output and the labels, write the gradient
# the job only carries the precision and runtime to gemm_rate; its model is never costed
TINY = build_transformer(llama(name="grouped-gemm-bench", num_layers=1, hidden=256, heads=4, ffn=512, vocab=1024))


@dataclass(frozen=True)
class Modelled:
    """The cost model's seconds for one row: the grouped GEMM forward and backward, the benchmark's loss beside it,
    and the grouped-GEMM efficiency the GEMM was priced at."""

    gemm: float
    loss: float
    efficiency: float


def modelled(row: dict[str, str]) -> Modelled:
    """The row's grouped GEMM, forward and backward, as the cost model prices it, and the benchmark's loss."""
    kernel, runtime = KERNELS[row["kernel"]]
    cluster = load_cluster(NODE[row["device"]])
    job = Job(model=TINY, cluster=cluster, global_batch=1, seq_len=1024, precision=row["dtype"],
              runtime=load_runtime(runtime))
    assert job.runtime.kernels.grouped_gemm == kernel
    catalog = load_catalog()
    device = catalog.node_device(cluster.pools[0].node)
    m, k, n, groups = (int(row[c]) for c in ("tokens", "k", "n", "groups"))
    flops = 2.0 * m * n * k
    efficiency = grouped_gemm_efficiency(device, job)
    forward = flops / (gemm_rate(device, job, flops / groups, catalog) * efficiency)
    loss = LOSS_BYTES_PER_ELEMENT * m * n / (device.hbm_bandwidth * catalog.constant("hbm_efficiency"))
    return Modelled(gemm=forward * (1.0 + catalog.constant("backward_gemm_ratio")), loss=loss, efficiency=efficiency)


def model_seconds(row: dict[str, str]) -> float:
    """The cost model's seconds for the row's grouped GEMM forward and backward, plus the benchmark's loss."""
    model = modelled(row)
    return model.gemm + model.loss


def compare(row: dict[str, str]) -> Compared:
    measured_s = float(row["measured_us"]) * 1e-6
    model_s = model_seconds(row)
    m, k, n, groups = (int(row[c]) for c in ("tokens", "k", "n", "groups"))
    config = f"{row['kernel']} {row['device']} {row['dtype']} {row['direction']} M={m} K={k} N={n} G={groups}"
    return Compared(config=config, measured=f"{measured_s * 1e3:.1f} ms", modelled=f"{model_s * 1e3:.1f} ms",
                    ratio=model_s / measured_s, source=row["source_id"])


def implied(rows: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    """kernel -> device -> the relative efficiency that makes the model's median GEMM time match the rows' (the
    benchmark's loss, which the kernel does not run, held out of the ratio), to three digits."""
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        model = modelled(row)
        measured = float(row["measured_us"]) * 1e-6 - model.loss
        groups.setdefault((KERNELS[row["kernel"]][0], row["device"]), []).append(
            model.efficiency * model.gemm / measured)
    return {kernel: {device: round(statistics.median(values), 3)}
            for (kernel, device), values in sorted(groups.items())}


def print_implied(rows: list[dict[str, str]]) -> None:
    """The relative efficiency per kernel and device the rows imply (--implied)."""
    for kernel, devices in implied(rows).items():
        print(kernel, devices)


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "grouped_gemm", __doc__, argv, compare,
        "Grouped GEMMs: measured vs planner.cost.compute.gemm_rate x grouped_gemm_efficiency",
        by="kernel, device and expert shape",
        key=lambda r: " ".join(r.config.split()[:4]) + " " + r.config.split()[6],
        implied=print_implied)


if __name__ == "__main__":
    main()
