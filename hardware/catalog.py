"""Hardware catalog schema: devices, nodes, links and calibration constants.

The figures themselves live in `hardware/data/*.yaml`, each with its source;
this module only defines their shape and loads them.  Units are SI: FLOP/s,
bytes, bytes/s, seconds, USD per GPU-hour.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hardware.errors import HardwareInputError
from models.yamlio import DataLoader

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
# block-scaled formats: their GEMMs run at the fp8 peak; the scales are extra bytes (planner.cost)
ScaledFormat = Literal["mxfp8"]

_FIELD = ConfigDict(extra="forbid", frozen=True)


class EfficiencyStep(BaseModel):
    """One step of an achieved-efficiency curve (Calculon-style step function)."""

    model_config = _FIELD
    min_flops: float = Field(ge=0, description="Applies to matmuls of at least this many FLOPs.")
    efficiency: float = Field(gt=0, le=1, description="Fraction of dense peak achieved.")


class PowerStep(BaseModel):
    """Sustained tensor throughput of a device at one board power limit (a point of its power curve)."""

    model_config = _FIELD
    watts: float = Field(gt=0, description="Board power limit in watts.")
    throughput: float = Field(gt=0, le=1, description="Tensor-core throughput at that limit, as a fraction of the "
                              "device's peak_flops (which are quoted at its tdp_watts).")


class DeviceSpec(BaseModel):
    """One accelerator model."""

    model_config = _FIELD
    name: str = Field(description="Catalog key, e.g. 'h100-sxm'.")
    vendor: str = Field(description="Vendor name.")
    peak_flops: dict[Dtype, float] = Field(
        description="Dense (no sparsity) peak FLOP/s per datatype."
    )
    scaled_formats: tuple[ScaledFormat, ...] = Field(
        (), description="Block-scaled GEMM formats the tensor cores run natively at the fp8 peak (mxfp8: OCP MX FP8, "
        "32-element blocks with E8M0 scales; Blackwell and later).  Empty: none (Hopper, Ampere, MI300X).")
    hbm_bytes: float = Field(gt=0, description="HBM capacity in bytes, as the datasheet states it (decimal GB).")
    usable_hbm_bytes: float | None = Field(
        None, gt=0, description="Device memory the CUDA (or HIP) runtime reports, in bytes: "
        "torch.cuda.get_device_properties().total_memory, the 'total capacity' of PyTorch's out-of-memory message.  "
        "What a process can hold, CUDA context included.  None: no published figure, hbm_bytes is used.")
    hbm_bandwidth: float = Field(gt=0, description="HBM bandwidth in bytes/s.")
    matmul_efficiency: list[EfficiencyStep] = Field(
        min_length=1,
        description="Achieved matmul efficiency by matmul size, ascending min_flops; the last "
        "step whose min_flops <= the matmul's FLOPs applies.",
    )
    fp8_gemm_gain: float = Field(
        1.0, gt=0, description="How much more of its FP8 peak this device's FP8 GEMMs realise than H100's do, "
        "relative to BF16: the measured FP8/BF16 matmul ratio over H100 SXM's.  A runtime's fp8_gemm_speedup is "
        "an H100 measurement; gemm_rate multiplies it by this (1: as on H100).")
    fp8_gemm_any_layout: bool = Field(
        False, description="The device's FP8 GEMMs take their operands in any layout (Transformer Engine's "
        "nvte_is_non_tn_fp8_gemm_supported: compute capability 10.x and from 13.0), so a per-tensor-scaled FP8 "
        "tensor keeps no transposed copy for the backward's GEMMs; Hopper's need the TN layout and the transpose.")
    price_per_hour: float = Field(ge=0, description="Default on-demand price, USD per GPU-hour.")
    tdp_watts: float | None = Field(
        None, gt=0, description="Board power (W) at which peak_flops are quoted: the default power limit.")
    power_curve: list[PowerStep] = Field(
        default_factory=list,
        description="Tensor throughput under lower board power limits, ascending watts, ending at tdp_watts with "
        "throughput 1; linear between points.  Empty: no published derating, so a limit below tdp_watts is refused.")
    boost_clock_mhz: float | None = Field(
        None, gt=0, description="Tensor-core clock (MHz) peak_flops assume; a clock limit scales tensor throughput "
        "by limit / boost (work per clock is fixed).  None: a clock limit is refused.")
    throughput_scale: float = Field(
        1.0, gt=0, le=1, description="Fraction of peak_flops the device sustains under its node's power or clock "
        "limit (1: uncapped).  Set by Catalog.node_device from the node's limits, never in devices.yaml.")
    sources: list[str] = Field(min_length=1, description="Where each figure comes from.")

    @model_validator(mode="after")
    def _curve_ends_at_tdp(self) -> "DeviceSpec":
        if not self.power_curve:
            return self
        watts = [step.watts for step in self.power_curve]
        if watts != sorted(set(watts)):
            raise ValueError("power_curve: steps must be in ascending watts order")
        last = self.power_curve[-1]
        if self.tdp_watts is None or last.watts != self.tdp_watts or last.throughput != 1.0:
            raise ValueError("power_curve: the last step must be tdp_watts with throughput 1")
        return self

    @model_validator(mode="after")
    def _scaled_formats_need_fp8(self) -> "DeviceSpec":
        # a block-scaled format runs on the FP8 tensor cores: its GEMM rate is the fp8 peak
        if self.scaled_formats and "fp8" not in self.peak_flops:
            raise ValueError("scaled_formats: block-scaled formats run at the fp8 peak; give peak_flops.fp8")
        return self

    @field_validator("matmul_efficiency")
    @classmethod
    def _ascending(cls, steps: list[EfficiencyStep]) -> list[EfficiencyStep]:
        sizes = [step.min_flops for step in steps]
        if sizes != sorted(sizes):
            raise ValueError("steps must be in ascending min_flops order")
        return steps

    @property
    def capacity_bytes(self) -> float:
        """Device memory a training process can hold: the runtime's figure where published, else hbm_bytes."""
        return self.usable_hbm_bytes if self.usable_hbm_bytes is not None else self.hbm_bytes

    def peak(self, dtype: Dtype) -> float:
        """Dense peak FLOP/s for `dtype` (fp8 falls back to bf16 where absent)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype == "fp8" and "bf16" in self.peak_flops:
            return self.peak_flops["bf16"]
        if dtype in ("bf16", "fp16") and "fp16" in self.peak_flops:
            return self.peak_flops["fp16"]
        raise HardwareInputError(f"device {self.name} has no {dtype} peak")

    def sustained_peak(self, dtype: Dtype) -> float:
        """Peak FLOP/s for `dtype` under the device's power or clock limit (what compute time divides by;
        MFU stays against the nominal `peak`, the published convention)."""
        return self.peak(dtype) * self.throughput_scale

    def power_throughput(self, watts: float) -> float:
        """Fraction of peak tensor throughput sustained under a board power limit of `watts` (ValueError when
        the device publishes nothing for that limit)."""
        if self.tdp_watts is None:
            raise ValueError(f"device {self.name} has no tdp_watts, so no power limit applies to it")
        if watts >= self.tdp_watts:
            if watts > self.tdp_watts:
                raise ValueError(f"{watts:g} W is above the {self.name}'s board power of {self.tdp_watts:g} W")
            return 1.0
        curve = self.power_curve
        if not curve or watts < curve[0].watts:
            lowest = f"{curve[0].watts:g}" if curve else f"{self.tdp_watts:g}"
            raise ValueError(f"{watts:g} W is below the lowest power limit the {self.name} publishes a throughput "
                             f"for ({lowest} W)")
        for low, high in zip(curve, curve[1:]):
            if low.watts <= watts <= high.watts:
                share = (watts - low.watts) / (high.watts - low.watts)
                return low.throughput + share * (high.throughput - low.throughput)
        return 1.0  # unreachable: the curve ends at tdp_watts

    def clock_throughput(self, mhz: float) -> float:
        """Fraction of peak tensor throughput under an SM clock limit of `mhz` (a limit above the boost clock
        does not bind)."""
        if self.boost_clock_mhz is None:
            raise ValueError(f"device {self.name} has no boost_clock_mhz, so no clock limit applies to it")
        return min(1.0, mhz / self.boost_clock_mhz)

    def capped(self, power_watts: float | None = None, clock_mhz: float | None = None) -> "DeviceSpec":
        """This device under a board power limit and/or a clock limit (whichever binds harder)."""
        scale = 1.0
        if power_watts is not None:
            scale = min(scale, self.power_throughput(power_watts))
        if clock_mhz is not None:
            scale = min(scale, self.clock_throughput(clock_mhz))
        return self if scale == 1.0 else self.model_copy(update={"throughput_scale": scale})

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
    bandwidth: float = Field(gt=0, strict=True, allow_inf_nan=False, description="Bytes/s per GPU per direction.")
    latency: float = Field(ge=0, strict=True, allow_inf_nan=False, description="Per-message latency in seconds "
                           "(alpha).")


# the SM clock limits a node may set: the lowest application clock NVIDIA's data-center GPUs list is 210 MHz
# (nvidia-smi -q -d SUPPORTED_CLOCKS), and none runs its SMs near 3 GHz; a limit above the device's boost clock
# does not bind (clock_throughput)
MIN_CLOCK_MHZ = 200.0
MAX_CLOCK_MHZ = 3000.0


class NodeSpec(BaseModel):
    """One node type: GPUs, host memory, storage and links."""

    model_config = _FIELD
    name: str = Field(description="Preset key, e.g. 'dgx-h100'.")
    device: str = Field(description="Device catalog key of its GPUs.")
    gpus_per_node: int = Field(gt=0, strict=True, description="GPUs per node.")
    intra_link: LinkSpec = Field(description="GPU-to-GPU link inside the node.")
    nic_count: int = Field(gt=0, strict=True, description="Network adapters per node.")
    # numbers are numbers: `true` or "750" in a cluster file is a mistake, and infinity no size (issue #26)
    nic_bandwidth: float = Field(gt=0, strict=True, allow_inf_nan=False, description="Bytes/s per NIC per direction.")
    host_dram_bytes: float = Field(gt=0, strict=True, allow_inf_nan=False,
                                   description="Host DRAM per node, shared by its GPUs.")
    nvme_bytes: float = Field(ge=0, strict=True, allow_inf_nan=False, description="Local NVMe capacity per node.")
    nvme_bandwidth: float = Field(ge=0, strict=True, allow_inf_nan=False,
                                  description="Aggregate NVMe read bandwidth per node, bytes/s.")
    pcie_bandwidth: float = Field(gt=0, strict=True, allow_inf_nan=False,
                                  description="Host-to-GPU bandwidth per GPU per direction, bytes/s.")
    gpu_power_limit: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False,
        description="Board power limit (W) the node's GPUs run under (nvidia-smi --power-limit); "
        "None: the device's tdp_watts.  Lowers tensor throughput along the device's power_curve.")
    gpu_clock_limit: float | None = Field(
        None, ge=MIN_CLOCK_MHZ, le=MAX_CLOCK_MHZ, strict=True, allow_inf_nan=False,
        description="SM clock limit (MHz) the node's GPUs run under (nvidia-smi --lock-gpu-clocks); None: the boost "
        "clock.")
    host_link_bandwidth: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False,
        description="Host-side bytes/s per direction the node's GPUs share when they stream from host memory "
        "at once (PCIe switch uplinks / CPU root ports); default: no sharing (gpus x pcie_bandwidth).",
    )
    nvlink_domain_nodes: int = Field(
        1, ge=1, strict=True,
        description="Nodes whose GPUs share one NVLink domain (all-to-all NVLink through switch trays): 18 compute "
        "trays in a GB200 NVL72 rack, 1 where the node is the domain (DGX/HGX).  Collectives among GPUs of one "
        "domain run at intra_link rates even across nodes; only traffic between domains uses the NICs.")
    compute_hcas: tuple[str, ...] = Field(
        (), description="RDMA device names of the compute NICs (NCCL_IB_HCA in the launch files), where the node "
        "type's documentation gives them (its sources say where); empty: NCCL picks among the NICs it finds.")
    sources: list[str] = Field(min_length=1, description="Where each figure comes from.")

    @model_validator(mode="after")
    def _hcas_sourced(self) -> NodeSpec:
        if self.compute_hcas and not any(s.startswith("compute_hcas:") for s in self.sources):
            raise ValueError("compute_hcas needs a source: a 'compute_hcas: ...' line in sources")
        return self

    @property
    def compute_hcas_source(self) -> str:
        """Where compute_hcas come from ('' when there are none)."""
        return next((s.removeprefix("compute_hcas:").strip() for s in self.sources if s.startswith("compute_hcas:")),
                    "")

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


class DispatcherSpec(BaseModel):
    """How a MoE token dispatcher moves routed tokens (dispatchers.yaml)."""

    model_config = _FIELD
    fabric_copies: Literal["expert", "node"] = Field(
        description="What crosses the fabric: every (token, expert) pair (expert), or a token once per distinct "
        "destination node, forwarded there over NVLink once per destination rank (node).")
    dispatch_bytes_per_element: float = Field(gt=0, description="Bytes per hidden element of a dispatched token.")
    combine_bytes_per_element: float = Field(gt=0, description="Bytes per hidden element of a combined token.")
    fp8_dispatch_bytes_per_element: float | None = Field(
        description="Bytes per element of the dispatcher's own FP8 dispatch (values plus scales), where it has one.")
    nvlink_rate_limit: float | None = Field(
        description="Bytes/s a rank's kernels move over NVLink at most, below the link's achieved rate where the "
        "dispatcher's copy kernels (on a few SMs) and not the link set the pace; null: the link's rate.")
    megatron_args: str = Field(description="How Megatron-LM spells the choice on its command line.")
    description: str = Field(description="What the dispatcher does on the wire.")
    source: str = Field(description="Where the behaviour is read.")


class Catalog(BaseModel):
    """Everything in hardware/data: devices, node presets, constants and MoE token dispatchers."""

    model_config = _FIELD
    devices: dict[str, DeviceSpec]
    nodes: dict[str, NodeSpec]
    constants: dict[str, Constant]
    dispatchers: dict[str, DispatcherSpec]

    def constant(self, name: str) -> float:
        """Value of a named calibration constant."""
        return self.constants[name].value

    def dispatcher(self, name: str) -> DispatcherSpec:
        """A MoE token dispatcher by name (dispatchers.yaml)."""
        return _lookup(self.dispatchers, "dispatcher", name)

    def device(self, name: str) -> DeviceSpec:
        """Look up a device by key."""
        return _lookup(self.devices, "device", name)

    def node_device(self, node: NodeSpec) -> DeviceSpec:
        """The GPU of `node` as it runs there: the catalog device under the node's power or clock limit
        (ValueError naming the limit when the device publishes nothing for it)."""
        return self.device(node.device).capped(node.gpu_power_limit, node.gpu_clock_limit)

    def node(self, name: str) -> NodeSpec:
        """Look up a node preset by key."""
        return _lookup(self.nodes, "node preset", name)


_Entry = TypeVar("_Entry")


def _lookup(table: dict[str, _Entry], kind: str, name: str) -> _Entry:
    """table[name], or one line naming the kind and the known keys."""
    try:
        return table[name]
    except KeyError:
        raise HardwareInputError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}") from None


def _read_yaml(name: str) -> dict:
    text = resources.files("hardware").joinpath("data", name).read_text()
    return yaml.load(text, Loader=DataLoader)  # a repeated device or node key would hide the first


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The built-in catalog (devices.yaml, nodes.yaml, constants.yaml, dispatchers.yaml)."""
    devices = {k: DeviceSpec(name=k, **v) for k, v in _read_yaml("devices.yaml").items()}
    nodes = {k: NodeSpec(name=k, **v) for k, v in _read_yaml("nodes.yaml").items()}
    constants = {k: Constant(**v) for k, v in _read_yaml("constants.yaml").items()}
    for node in nodes.values():
        if node.device not in devices:
            raise HardwareInputError(f"nodes.yaml: {node.name}.device: unknown device {node.device!r}")
    dispatchers = {k: DispatcherSpec(**v) for k, v in _read_yaml("dispatchers.yaml").items()}
    catalog = Catalog(devices=devices, nodes=nodes, constants=constants, dispatchers=dispatchers)
    for node in nodes.values():
        try:
            catalog.node_device(node)
        except ValueError as exc:
            raise HardwareInputError(f"nodes.yaml: {node.name}: {exc}") from None
    return catalog
