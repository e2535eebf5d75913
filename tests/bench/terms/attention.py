"""The attention core (QK^T, softmax, AV) against the flash kernels' published benchmarks, by sequence length,
head dimension and causality, forward and forward+backward.

    python tests/bench/terms/attention.py [--quick]
    python tests/bench/terms/attention.py --implied   # the relative efficiency per kernel and device the rows
                                                      # imply (hardware/data/attention.yaml holds them)

Measurements (tests/data/terms/attention.csv): FlashAttention-2 forward+backward on A100 80GB SXM4 and H100
SXM5 (the flash-attention README plots), and FlashAttention-2, FlashAttention-3 and cuDNN forward on H100 SXM5
(FlashAttention-3 paper, Fig. 5): hidden 2048 (32, 16 or 8 heads of 64, 128 or 256), batch x seqlen = 16k
tokens, fp16; FlashAttention-2 forward on an A100 with 32 heads of 128, MHA and GQA (8 KV heads), from a
third party's table; and cuDNN and FlashAttention-2 (PyTorch's SDPA backends, flash-attn 2.7.4) forward and
backward on a B200 (NVIDIA/cudnn-frontend's SDPA training benchmark: 128 query heads, 8 KV heads of 128, causal,
bf16, one sequence of 512 to 131072 tokens; forward+backward rows are its forward and backward times added).
Every source counts FLOPs as 4*batch*seqlen^2*heads*head_dim forward, HALVED when causal
(the kernels skip the masked blocks), backward 2.5x forward; the measured seconds are those FLOPs over the
published TFLOP/s.

Model: `planner.cost.compute.layer_time` of the attention layer a one-block Llama of hidden 2048 with that head
shape builds (models.transformer), one micro-batch of `batch` sequences of `seqlen` on one GPU (no tensor or
context parallelism), under the reference runtime (flash attention on) running the row's kernel.  It has no
separate function for the core, but `LayerTime` reports the core's forward (`attention_forward`) and backward
(`attention_backward`) seconds apart from the layer's GEMMs, element-wise kernels and launches: those are
compared.  The model's TFLOP/s column is the SOURCE's FLOP count over the model's seconds, so it reads against
the bar directly.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, run_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_catalog, load_cluster  # noqa: E402
from models.graph import LayerKind  # noqa: E402
from models.transformer import build_transformer, llama  # noqa: E402
from planner.cost.attention import attention_efficiency  # noqa: E402
from planner.cost.compute import layer_time  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import Strategy  # noqa: E402

KERNELS = {"FlashAttention-2": "flash2", "FlashAttention-3": "flash3", "cuDNN": "cudnn",
           "FlashAttention-Triton": "flash_triton"}  # attention.yaml's names
# one node of the measured GPU (the single-GPU kernels do not use the rest)
NODE = {"a100-80g": "dgx-a100-80g:1", "h100-sxm": "dgx-h100:1", "b200": "dgx-b200:1"}
HIDDEN = 2048  # every source's setting
BACKWARD_FLOPS = 2.5  # the sources' convention: backward FLOPs over forward FLOPs


def source_flops(row: dict[str, str]) -> float:
    """The FLOPs the source divides by its time, for the row's pass."""
    s, batch = int(row["seq_len"]), int(row["batch"])
    forward = 4.0 * batch * s * s * int(row["heads"]) * int(row["head_dim"])
    if row["causal"] == "true":
        forward /= 2
    return forward * (1.0 + BACKWARD_FLOPS if row["direction"] == "fwd_bwd" else 1.0)


def model_seconds(row: dict[str, str]) -> float:
    """The cost model's seconds for the row's pass of the attention core."""
    heads, head_dim = int(row["heads"]), int(row["head_dim"])
    graph = build_transformer(llama(name="attention-bench", num_layers=1, hidden=HIDDEN, heads=heads,
                                    kv_heads=int(row["kv_heads"]), head_dim=head_dim, ffn=4 * HIDDEN, vocab=32000,
                                    causal=row["causal"] == "true"))
    layer = next(layer for layer in graph.layers if layer.kind == LayerKind.ATTENTION)
    batch, seq = int(row["batch"]), int(row["seq_len"])
    cluster = load_cluster(NODE[row["device"]])
    reference = load_runtime("reference")
    runtime = reference.model_copy(update={"kernels": reference.kernels.model_copy(
        update={"attention_kernel": KERNELS[row["kernel"]]})})
    job = Job(model=graph, cluster=cluster, global_batch=batch, seq_len=seq, precision="bf16", runtime=runtime)
    catalog = load_catalog()
    device = catalog.node_device(cluster.pools[0].node)
    time = layer_time(layer, job, Strategy(mbs=batch, dp=1), device, catalog, recompute="none")
    if row["direction"] == "fwd_bwd":
        return time.attention_forward + time.attention_backward
    return time.attention_forward


def compare(row: dict[str, str]) -> Compared:
    flops = source_flops(row)
    measured_s = flops / (float(row["measured_tflops"]) * 1e12)
    model_s = model_seconds(row)
    mask = "causal" if row["causal"] == "true" else "full"
    gqa = f" kv={row['kv_heads']}" if row["kv_heads"] != row["heads"] else ""
    config = (f"{row['kernel']} {row['device']} {row['direction']} {mask} d={row['head_dim']}{gqa} "
              f"s={row['seq_len']} b={row['batch']}")
    return Compared(config=config, measured=f"{float(row['measured_tflops']):.0f} TF/s",
                    modelled=f"{flops / model_s / 1e12:.0f} TF/s", ratio=model_s / measured_s,
                    source=row["source_id"])


def implied(rows: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    """kernel -> device -> the relative efficiency that makes the model's median time match the rows' (the
    forward+backward rows where a kernel has them on that device: training runs both), to three digits."""
    catalog = load_catalog()
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for row in rows:
        key = (KERNELS[row["kernel"]], row["device"])
        ratio = compare(row).ratio
        groups.setdefault(key, {}).setdefault(row["direction"], []).append(ratio)
    out: dict[str, dict[str, float]] = {}
    for (kernel, device), by_pass in sorted(groups.items()):
        ratios = by_pass.get("fwd_bwd") or by_pass["fwd"]
        used = attention_efficiency(device, kernel, catalog)
        out.setdefault(kernel, {})[device] = round(used * statistics.median(ratios), 3)
    return out


def print_implied(rows: list[dict[str, str]]) -> None:
    """The relative efficiency per kernel and device the rows imply (--implied)."""
    for kernel, devices in implied(rows).items():
        print(kernel, devices)


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "attention", __doc__, argv, compare,
        "Attention core: measured vs planner.cost.compute.layer_time (attention_forward/_backward)",
        by="kernel, device, pass and mask",
        key=lambda r: " ".join(r.config.split()[:4]),
        implied=print_implied)


if __name__ == "__main__":
    main()
