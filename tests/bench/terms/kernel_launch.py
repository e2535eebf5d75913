"""Fixed per-kernel overhead against published launch-bound timings, kernels launched one by one and replayed
from a CUDA graph.

    python tests/bench/terms/kernel_launch.py [--quick]

Measurements (tests/data/terms/kernel_launch.csv): CUDA.jl's documented RK4 integration (80 tiny broadcast
kernels: 260 us launched one by one, 70 us as one graph) and the host-side time of one empty-kernel launch
(cuTile.jl PR #214, a lower bound on what a host thread can issue back to back).  Per kernel: total / kernels.

Model: `planner.cost.launches.kernel_seconds` for a job under the reference runtime (kernels launched one by
one) and under megatron-cudagraphs (a captured CUDA graph); the layer overhead is that times the kernels
counted in hardware/data/kernels.yaml.  The graph row is the measurement graph_kernel_launch_seconds was set
from (fitted_from): a transcription check only.
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
from planner.cost.launches import kernel_seconds  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402

RUNTIME = {"eager": "reference", "graph": "megatron-cudagraphs"}
# the job only carries the runtime to kernel_seconds; its model is never costed
TINY = build_transformer(llama(name="launch-bench", num_layers=1, hidden=256, heads=4, ffn=512, vocab=1024))


def model_us(mode: str) -> float:
    """The model's fixed microseconds per kernel under the runtime that launches kernels `mode`."""
    job = Job(model=TINY, cluster=load_cluster("dgx-h100:1"), global_batch=1, seq_len=1024,
              runtime=load_runtime(RUNTIME[mode]))
    return kernel_seconds(job, load_catalog()) * 1e6


def compare(row: dict[str, str]) -> Compared:
    measured, modelled = float(row["measured_us_per_kernel"]), model_us(row["mode"])
    fitted = " (fitted)" if row["fitted_from"] else ""
    config = f"{row['mode']} {row['kernels']} kernel(s) ({RUNTIME[row['mode']]}){fitted}"
    return Compared(config=config, measured=f"{measured:.3f} us", modelled=f"{modelled:.3f} us",
                    ratio=modelled / measured, source=row["source_id"])


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "kernel_launch", __doc__, argv, compare,
        "Kernel launch overhead: measured vs planner.cost.launches.kernel_seconds")


if __name__ == "__main__":
    main()
