"""Kernel throughput tables: a kernel's rate on a device relative to the device's GEMM curve, measured per kernel
and device by the kernels' own benchmarks (hardware/data/attention.yaml, hardware/data/grouped_gemm.yaml).

Both tables share one layout and one lookup: kernel -> device -> relative efficiency, devices that run a measured
device's chip, and the measurements behind each kernel.  planner.cost.attention and planner.cost.compute read them.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field


class KernelTable(BaseModel):
    """hardware/data/<table>.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    relative_efficiency: dict[str, dict[str, float]] = Field(
        description="kernel -> device -> the kernel's throughput over the device's GEMM rate at the same FLOPs.")
    same_chip: dict[str, str] = Field(description="device -> the measured device whose chip it runs (its values "
                                      "stand for it).")
    sources: dict[str, str] = Field(description="kernel -> the measurements behind its values.")
    power_of_two_tiles: tuple[str, ...] = Field(
        (), description="Kernels whose tiles round the head dimension up to a power of two, so a head of d runs "
        "the work of next_power_of_two(d); their measurements are at powers of two.")

    def lookup(self, device: str, kernels: tuple[str, ...]) -> float | None:
        """The first of `kernels` measured on `device` (or on the chip it runs), None if none is."""
        device = self.same_chip.get(device, device)
        for name in kernels:
            if device in self.relative_efficiency.get(name, {}):
                return self.relative_efficiency[name][device]
        return None


@lru_cache(maxsize=None)
def load_kernel_table(name: str) -> KernelTable:
    """hardware/data/<name>.yaml as a KernelTable."""
    text = resources.files("hardware").joinpath("data", f"{name}.yaml").read_text()
    return KernelTable.model_validate(yaml.safe_load(text))
