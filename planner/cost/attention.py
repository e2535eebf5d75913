"""The flash-attention core's throughput per kernel and device (hardware/data/attention.yaml).

Each runtime names the attention kernel it runs (RuntimeProfile.kernels.attention_kernel: PyTorch's
scaled_dot_product_attention in its default order runs FlashAttention-2; Transformer Engine and torchtitan 0.2 run
cuDNN's fused attention).  The kernel matters most on Blackwell, where FlashAttention-2's sm80 kernels reach about a
fifth of the GEMM rate and cuDNN's about two thirds (tests/data/terms/attention.csv).
The core's throughput is the device's GEMM rate at the core's size times the kernel's efficiency relative to
it, measured on that device by the kernels' own benchmarks (tests/bench/terms/attention.py --implied derives
every value from tests/data/terms/attention.csv); a kernel the device has no measurement of falls back to
FlashAttention-2's there, then to constants.yaml's attention_relative_efficiency.
"""

from __future__ import annotations

from hardware import Catalog
from planner.cost.kernel_tables import KernelTable, load_kernel_table

FALLBACK_KERNEL = "flash2"


def load_attention_kernels() -> KernelTable:
    """hardware/data/attention.yaml."""
    return load_kernel_table("attention")


def attention_efficiency(device: str, kernel: str, catalog: Catalog, head_dim: int | None = None) -> float:
    """Relative efficiency of `kernel` on `device` (catalog device name), with the fallbacks above; for heads
    `head_dim` wide, a kernel that rounds the head dimension up to a power of two runs d / next_power_of_two(d) of
    it (None: the measured widths, powers of two)."""
    table = load_attention_kernels()
    value = table.lookup(device, (kernel, FALLBACK_KERNEL))
    value = catalog.constant("attention_relative_efficiency") if value is None else value
    if head_dim is not None and kernel in table.power_of_two_tiles:
        value *= head_dim / (1 << (head_dim - 1).bit_length())
    return value
