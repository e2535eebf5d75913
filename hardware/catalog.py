"""Hardware catalog schema: devices, nodes, links and calibration constants.

The figures themselves live in `hardware/data/*.yaml`, each with its source;
this module only defines their shape and loads them.  Units are SI: FLOP/s,
bytes, bytes/s, seconds, USD per GPU-hour.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hardware.errors import HardwareInputError
from hardware.yamlio import UniqueKeyLoader

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]

_FIELD = ConfigDict(extra="forbid", frozen=True)


class EfficiencyStep(BaseModel):
    """One step of an achieved-efficiency curve (Calculon-style step function)."""

    model_config = _FIELD
    min_flops: float = Field(ge=0, description="Applies to matmuls of at least this many FLOPs.")
    efficiency: float = Field(gt=0, le=1, description="Fraction of dense peak achieved.")


class DeviceSpec(BaseModel):
    """One accelerator model."""

    model_config = _FIELD
    name: str = Field(description="Catalog key, e.g. 'h100-sxm'.")
    vendor: str = Field(description="Vendor name.")
    peak_flops: dict[Dtype, float] = Field(
        description="Dense (no sparsity) peak FLOP/s per datatype."
    )
    hbm_bytes: float = Field(gt=0, description="HBM capacity in bytes.")
    hbm_bandwidth: float = Field(gt=0, description="HBM bandwidth in bytes/s.")
    matmul_efficiency: list[EfficiencyStep] = Field(
        min_length=1,
        description="Achieved matmul efficiency by matmul size, ascending min_flops; the last "
        "step whose min_flops <= the matmul's FLOPs applies.",
    )
    price_per_hour: float = Field(ge=0, description="Default on-demand price, USD per GPU-hour.")
    sources: list[str] = Field(min_length=1, description="Where each figure comes from.")

    @field_validator("matmul_efficiency")
    @classmethod
    def _ascending(cls, steps: list[EfficiencyStep]) -> list[EfficiencyStep]:
        sizes = [step.min_flops for step in steps]
        if sizes != sorted(sizes):
            raise ValueError("steps must be in ascending min_flops order")
        return steps

    def peak(self, dtype: Dtype) -> float:
        """Dense peak FLOP/s for `dtype` (fp8 falls back to bf16 where absent)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype == "fp8" and "bf16" in self.peak_flops:
            return self.peak_flops["bf16"]
        if dtype in ("bf16", "fp16") and "fp16" in self.peak_flops:
            return self.peak_flops["fp16"]
        raise HardwareInputError(f"device {self.name} has no {dtype} peak")

    def efficiency(self, matmul_flops: float) -> float:
        """Achieved fraction of peak for one matmul of `matmul_flops` FLOPs."""
        chosen = self.matmul_efficiency[0].efficiency
        for step in self.matmul_efficiency:
            if matmul_flops >= step.min_flops:
                chosen = step.efficiency
        return chosen


class LinkSpec(BaseModel):
    """A link class: bandwidth per GPU per direction and latency."""

    model_config = _FIELD
    kind: str = Field(description="nvlink, nvswitch, xgmi, pcie, ethernet, infiniband, loopback.")
    bandwidth: float = Field(gt=0, description="Bytes/s per GPU per direction.")
    latency: float = Field(ge=0, description="Per-message latency in seconds (alpha).")


class NodeSpec(BaseModel):
    """One node type: GPUs, host memory, storage and links."""

    model_config = _FIELD
    name: str = Field(description="Preset key, e.g. 'dgx-h100'.")
    device: str = Field(description="Device catalog key of its GPUs.")
    gpus_per_node: int = Field(gt=0, description="GPUs per node.")
    intra_link: LinkSpec = Field(description="GPU-to-GPU link inside the node.")
    nic_count: int = Field(gt=0, description="Network adapters per node.")
    nic_bandwidth: float = Field(gt=0, description="Bytes/s per NIC per direction.")
    host_dram_bytes: float = Field(gt=0, description="Host DRAM per node, shared by its GPUs.")
    nvme_bytes: float = Field(ge=0, description="Local NVMe capacity per node.")
    nvme_bandwidth: float = Field(ge=0, description="Aggregate NVMe read bandwidth per node, bytes/s.")
    pcie_bandwidth: float = Field(gt=0, description="Host-to-GPU bandwidth per GPU per direction, bytes/s.")
    host_link_bandwidth: float | None = Field(
        None, gt=0,
        description="Host-side bytes/s per direction the node's GPUs share when they stream from host memory "
        "at once (PCIe switch uplinks / CPU root ports); default: no sharing (gpus x pcie_bandwidth).",
    )
    sources: list[str] = Field(min_length=1, description="Where each figure comes from.")

    @property
    def nic_bandwidth_per_gpu(self) -> float:
        """Inter-node bytes/s available to one GPU when all GPUs talk at once."""
        return self.nic_count * self.nic_bandwidth / self.gpus_per_node

    def host_bandwidth_per_gpu(self, streams: int) -> float:
        """Raw host-to-GPU bytes/s one GPU gets while `streams` GPUs of the node stream at once."""
        shared = self.host_link_bandwidth or self.gpus_per_node * self.pcie_bandwidth
        return min(self.pcie_bandwidth, shared / max(1, streams))


class Constant(BaseModel):
    """A calibration constant with its meaning and source."""

    model_config = _FIELD
    value: float = Field(description="The value (unit in `unit`).")
    unit: str = Field(description="Unit of the value, e.g. 'fraction', 's', 'bytes'.")
    description: str = Field(description="What it means physically.")
    source: str = Field(description="Where the value comes from.")


class Catalog(BaseModel):
    """Everything in hardware/data: devices, node presets and constants."""

    model_config = _FIELD
    devices: dict[str, DeviceSpec]
    nodes: dict[str, NodeSpec]
    constants: dict[str, Constant]

    def constant(self, name: str) -> float:
        """Value of a named calibration constant."""
        return self.constants[name].value

    def device(self, name: str) -> DeviceSpec:
        """Look up a device by key."""
        try:
            return self.devices[name]
        except KeyError:
            raise HardwareInputError(
                f"unknown device {name!r}; known: {', '.join(sorted(self.devices))}"
            ) from None

    def node(self, name: str) -> NodeSpec:
        """Look up a node preset by key."""
        try:
            return self.nodes[name]
        except KeyError:
            raise HardwareInputError(
                f"unknown node preset {name!r}; known: {', '.join(sorted(self.nodes))}"
            ) from None


def _read_yaml(name: str) -> dict:
    text = resources.files("hardware").joinpath("data", name).read_text()
    return yaml.load(text, Loader=UniqueKeyLoader)  # a repeated device or node key would hide the first


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The built-in catalog (devices.yaml, nodes.yaml, constants.yaml)."""
    devices = {k: DeviceSpec(name=k, **v) for k, v in _read_yaml("devices.yaml").items()}
    nodes = {k: NodeSpec(name=k, **v) for k, v in _read_yaml("nodes.yaml").items()}
    constants = {k: Constant(**v) for k, v in _read_yaml("constants.yaml").items()}
    for node in nodes.values():
        if node.device not in devices:
            raise HardwareInputError(f"nodes.yaml: {node.name}.device: unknown device {node.device!r}")
    return Catalog(devices=devices, nodes=nodes, constants=constants)
