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

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog

FALLBACK_KERNEL = "flash2"


class AttentionKernels(BaseModel):
    """hardware/data/attention.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    relative_efficiency: dict[str, dict[str, float]] = Field(
        description="kernel -> device -> the core's throughput over the device's GEMM rate at the same FLOPs.")
    same_chip: dict[str, str] = Field(description="device -> the measured device whose chip it runs (its values "
                                      "stand for it).")
    sources: dict[str, str] = Field(description="kernel -> the measurements behind its values.")


@lru_cache(maxsize=1)
def load_attention_kernels() -> AttentionKernels:
    text = resources.files("hardware").joinpath("data", "attention.yaml").read_text()
    return AttentionKernels.model_validate(yaml.safe_load(text))


def attention_efficiency(device: str, kernel: str, catalog: Catalog) -> float:
    """Relative efficiency of `kernel` on `device` (catalog device name), with the fallbacks above."""
    data = load_attention_kernels()
    table, device = data.relative_efficiency, data.same_chip.get(device, device)
    for name in (kernel, FALLBACK_KERNEL):
        if device in table.get(name, {}):
            return table[name][device]
    return catalog.constant("attention_relative_efficiency")
